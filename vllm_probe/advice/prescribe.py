"""``vllm-probe doctor``'s answer: each finding's remedy searched by the replay, then the one
plan for the run, within one time budget.

:func:`prescribe` runs both on a report of :func:`vllm_probe.analysis.doctor.examine`: the
per-finding searches (:func:`vllm_probe.advice.remedies.search`, the evidence) may use up to
:data:`SEARCH_SHARE` of the budget, and the plan (:func:`vllm_probe.advice.plan.build`) the
rest; the budget counts from before the replay is prepared (loading the run, fitting the
step-time model), so the doctor returns within about the budget on any recording.

A report of one data-parallel rank (``doctor --rank N``) is searched on that rank alone: a
run directory of its own events (:func:`vllm_probe.runs.ranks.rank_view`, links to its
files) is what the replays read, its own requests as the front end sent them. A report of
every rank of a data-parallel run together is not replayed (the replay runs one engine
core): its remedies are the arithmetic, and a note names ``--rank N``.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..analysis.doctor import Report
from . import plan as plans
from . import remedies
from .evaluate import EvaluateError, Evaluator
from .verdict import unchecked

#: The share of the budget the per-finding searches may use; the plan gets what is left.
SEARCH_SHARE = 0.5


def prescribe(report: Report, budget_s: float = remedies.DEFAULT_BUDGET_S, *, jobs: int = 1,
              ray_address: str | None = None, out: str | None = None, profile: Any = None, force: bool = False,
              whole_run: bool = False, progress: Callable[[str], None] | None = None) -> list[str]:
    """Fill ``report``'s remedies (checked by the replay where it could), its ``plan`` and its
    ``step_time_model``; returns notes for the user, one line each.

    Raises:
        ProfileRefused: the profile given cannot be used (a usage error).
    """
    start = time.monotonic()
    deadline = start + budget_s
    if report.rank is None and len(report.ranks) > 1:
        why = (f"the run has data-parallel ranks {', '.join(str(r) for r in report.ranks)} and the replay runs one "
               "engine core: doctor --rank N replays rank N with its own requests")
        unchecked(report.findings)
        report.plan = plans.unchecked_plan(report.findings, why)
        return [f"doctor: {why}; remedies are the arithmetic, unchecked"]
    with tempfile.TemporaryDirectory(prefix="vllm-probe-rank-") as tmp:
        run_dir = report.run_dir
        if report.rank is not None and len(report.ranks) > 1:
            from ..runs.ranks import rank_view

            run_dir = str(rank_view(report.run_dir, report.rank, Path(tmp) / f"rank{report.rank}"))
        return _prescribe(report, run_dir, budget_s, deadline, jobs=jobs, ray_address=ray_address, out=out,
                                  profile=profile, force=force, whole_run=whole_run, progress=progress)


def _prescribe(report: Report, run_dir: str, budget_s: float, deadline: float, *, jobs: int,
               ray_address: str | None, out: str | None, profile: Any, force: bool, whole_run: bool,
               progress: Callable[[str], None] | None) -> list[str]:
    """:func:`prescribe` on the recording in ``run_dir`` (the report's run, or its rank's view)."""
    notes: list[str] = []
    try:
        evaluator = Evaluator(run_dir, jobs=jobs, ray_address=ray_address, out=out, profile=profile,
                              force=force, lazy=True)
    except EvaluateError as e:
        if type(e).__name__ == "ProfileRefused":
            raise
        unchecked(report.findings)
        report.plan = plans.unchecked_plan(report.findings, f"the replay cannot run ({e})")
        return [f"doctor: the replay cannot run ({e}); remedies are the arithmetic, unchecked"]
    report.step_time_model = evaluator.step_time_model.to_dict()
    notes += [n for n in evaluator.step_time_model.notes if n.startswith(("profile: using", "FORCED"))]
    try:
        left = max(deadline - time.monotonic(), 0.0)
        searches = remedies.search(report.findings, evaluator, SEARCH_SHARE * left, progress=progress,
                                   whole_run=whole_run)
        unchecked(report.findings)
        report.plan = plans.build(report.findings, searches, evaluator, deadline, whole_run, progress)
    finally:
        evaluator.close()
    if any(not s.complete for s in searches) or not report.plan.complete:
        notes.append(f"the search stopped at its budget of {budget_s:g} s ({evaluator.all_replays} replays); "
                     "--budget S searches longer")
    return notes


__all__ = ["SEARCH_SHARE", "prescribe"]
