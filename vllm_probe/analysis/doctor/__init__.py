"""``vllm-probe doctor``: what went wrong in a run, the evidence, and what to change.

:func:`examine` reads a run (recorded or simulated) once through the shared state with
:class:`~vllm_probe.analysis.episodes.Episodes` attached, and applies the catalogue of
:mod:`.rules`; :func:`diagnose` applies it to any state (the dashboard's findings panel
calls it on the live state). Each rule is one :class:`~.rule.Rule` in a file of its own
(``RULES[id]``: mechanism, thresholds, typed evidence, goal, knobs, arithmetic, view).
Findings are :class:`~.findings.Finding` (worst first); their remedies and the run's one
plan are searched by the replay in :mod:`vllm_probe.advice` (:mod:`vllm_probe.advice.prescribe`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable

from ...runs.reader import ReadStats
from ...runs.rundir import read_meta
from ..episodes import Episodes
from ..expected import check_expected
from ..state import RunState
from .findings import CRITICAL, INFO, SEVERITIES, WARNING, Finding, Remedy, has_critical, worst_first
from .context import Context
from ..text import fmt_count
from .plan import Plan
from .rules import CATALOGUE, EXPLAINS_WAITS, FINDING_IDS, HELD_BACK, RULES
from .rules.unexplained_wait import ADMIT_WITHIN_STEPS, longest_wait_steps

__all__ = ["CRITICAL", "INFO", "SEVERITIES", "WARNING", "Expectation", "Finding", "LiveDiagnosis", "Remedy", "Report",
           "all_clear", "diagnose", "examine", "has_critical", "FINDING_IDS", "RULES", "expected_of_meta"]


@dataclass(frozen=True)
class Expectation:
    """What the user expected the engine to run with: ``engine`` maps vLLM engine
    arguments to values, ``source`` names the file (the shape of
    :class:`vllm_probe.settings.Expected`, which ``--expect FILE`` passes in as it is)."""

    source: str
    engine: dict[str, Any]


@dataclass
class Report:
    """A run's findings and what they came from (the view and ``--whatif`` read it)."""

    run_dir: str
    findings: list[Finding]
    state: RunState
    episodes: Episodes
    stats: ReadStats
    meta: dict[str, Any]
    expected_source: str | None = None
    #: the line a report shows when no finding is above info, earned (:func:`all_clear`:
    #: every request admitted within ADMIT_WITHIN_STEPS steps, else what held them); None
    #: when a finding is above info
    all_clear: str | None = None
    #: when the remedies were chosen by the replay: which step-time model its replays used
    #: (``{"source": "profile" | "cache" | "recording", "profile", "forced"}``,
    #: :meth:`vllm_probe.sim.whatif.StepTimeChoice.to_dict`); None without a replay
    step_time_model: dict[str, Any] | None = None
    #: the one plan for the run (:class:`~.plan.Plan`: replayed by :mod:`vllm_probe.advice.plan`,
    #: or the rules' arithmetic unchecked); None until the doctor made it
    plan: Plan | None = None
    #: the data-parallel rank examined alone (``doctor --rank N``: its own events); None:
    #: every rank of the run together, each finding naming its rank (``engine``)
    rank: int | None = None
    #: the run's data-parallel ranks (the events' ``engine`` values), sorted
    ranks: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """``doctor --json``: ``{"run_dir", "plan", "findings": [...]}``, and
        ``"step_time_model"`` when the remedies were replayed; on a run of several
        data-parallel ranks ``"ranks"`` (the ranks) and ``"rank"`` (the one examined, or
        null for all of them together)."""
        out: dict[str, Any] = {"run_dir": self.run_dir,
                               "plan": self.plan.to_dict() if self.plan is not None else None,
                               "findings": [f.to_dict() for f in self.findings]}
        if self.step_time_model is not None:
            out["step_time_model"] = self.step_time_model
        if len(self.ranks) > 1:
            out["ranks"] = list(self.ranks)
            out["rank"] = self.rank
        return out

    @property
    def critical(self) -> bool:
        return has_critical(self.findings)


def diagnose(state: RunState, episodes: Episodes, expected: Any = None, live: bool = False) -> list[Finding]:
    """The catalogue's findings on ``state`` (followed by ``episodes``), worst first.

    ``expected``: what the user expected the engine to run with, an :class:`Expectation`
    or a :class:`vllm_probe.settings.Expected` (``--expect FILE``, or
    ``meta.json["expected"]``); ``live``: the run goes on (a stall at the end of the log
    is not "never drained" yet).
    """
    checks = check_expected(expected.engine, state.config) if expected is not None and expected.engine else None
    ctx = Context(state, episodes, checks, expected.source if expected is not None else None, live)
    found: list[Finding] = []
    for rule in CATALOGUE:
        for f in rule.evaluate(ctx):
            f.remedy = rule.arithmetic(ctx, f)
            found.append(f)
            if rule.wait == "explains":
                ctx.explained.add(f.engine)  # unexplained-wait, later in the catalogue, reads it
    # "the scheduler is not the bottleneck" cannot stand beside a finding that it held requests back
    held_back = {f.engine for f in found if f.id in HELD_BACK and f.severity in (CRITICAL, WARNING)}
    found = [f for f in found if not (f.id == "underloaded" and (f.engine in held_back or None in held_back))]
    return worst_first(found, FINDING_IDS)


def all_clear(ctx: Context, findings: list[Finding]) -> str | None:
    """The report's line when no finding is above info, earned: said only when every
    request was admitted within :data:`ADMIT_WITHIN_STEPS` steps (else what held them);
    None when a finding is above info."""
    if any(f.severity in (CRITICAL, WARNING) for f in findings):
        return None
    longest = longest_wait_steps(ctx)
    if longest is None:
        return ("No finding above info; how long requests waited is not known (chunk or request events are off), so "
                "whether anything held them back is not checked.")
    if longest <= ADMIT_WITHIN_STEPS:
        return (f"No finding above info: every request was admitted within {ADMIT_WITHIN_STEPS} steps "
                f"(the longest waited {fmt_count(longest)}); nothing held this run back.")
    named = [f.id for f in findings if f.id in EXPLAINS_WAITS]
    return (f"No finding above info, but requests waited up to {fmt_count(longest)} steps for their first chunk"
            + (f": {', '.join(named)} (info) names what held them." if named else "."))


def expected_of_meta(meta: dict[str, Any]) -> Expectation | None:
    """What ``vllm-probe run --settings`` recorded as expected in ``meta.json`` (None:
    nothing, or not readable)."""
    raw = meta.get("expected") if isinstance(meta, dict) else None
    if not isinstance(raw, dict) or not isinstance(raw.get("engine"), dict) or not raw["engine"]:
        return None
    return Expectation(str(raw.get("source") or "meta.json"), dict(raw["engine"]))


def examine(run_dir: str | Path, expected: Any = None, stats: ReadStats | None = None,
            rank: int | None = None) -> Report:
    """Read the run in ``run_dir`` and diagnose it; ``rank``: data-parallel rank ``rank``
    alone (its own events, :func:`vllm_probe.analysis.ranks.analyze_rank`), None: every
    rank together (each finding names its rank), read by the command's one pass
    (:func:`vllm_probe.analysis.reading.read`: the report's state and episodes are shared
    with the command's other readers, to be read, not changed).

    ``expected``: ``--expect FILE`` (:func:`vllm_probe.settings.load_expected`); without
    it, what ``meta.json`` recorded. Raises ``NoEventsError`` like ``summary``, and
    ``RankError`` for a rank the run does not hold.
    """
    from ...runs.ranks import layout
    from ..ranks import analyze_rank
    from ..reading import read

    if rank is None:  # the command's one pass over the run, shared with its other readers
        reading = read(run_dir)
        state, episodes, lay, meta = reading.state, reading.episodes, reading.layout, dict(reading.meta)
        stats = reading.counted(stats)
    else:
        episodes = Episodes()
        stats = stats if stats is not None else ReadStats()
        lay = layout(run_dir)
        state, _ = analyze_rank(run_dir, rank, stats, listener=episodes, with_summary=False, lay=lay)
        meta = read_meta(Path(run_dir))
    if expected is None:
        expected = expected_of_meta(meta)
    findings = diagnose(state, episodes, expected)
    return Report(str(run_dir), findings, state, episodes, stats, meta if isinstance(meta, dict) else {},
                  expected.source if expected is not None else None, all_clear(Context(state, episodes), findings),
                  rank=rank, ranks=lay.ids)


class LiveDiagnosis:
    """The doctor's findings on a state that grows while a run goes on (the dashboard's
    findings panel, the metrics' ``vllm_probe_finding``).

    Attach :attr:`episodes` as the state's listener when the state is made
    (``RunState(listener=live.episodes)``); :meth:`findings` then diagnoses it, again
    only when events arrived and at most every ``every_s`` seconds while the run goes on
    (a finished run's findings are computed once more, then kept).
    """

    def __init__(self, every_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.episodes = Episodes()
        self.every_s = every_s
        self._clock = clock
        self._findings: list[Finding] | None = None
        self._key: tuple[int, bool] | None = None
        self._at = 0.0

    def findings(self, state: RunState, meta: dict[str, Any], finished: bool) -> list[Finding]:
        """The findings on ``state`` (followed by :attr:`episodes`); ``meta``: the run's
        ``meta.json`` (what ``run --settings`` expected); ``finished``: the run is over."""
        key = (state.events, finished)
        now = self._clock()
        if self._findings is None or (key != self._key and (finished or now - self._at >= self.every_s)):
            self._findings = diagnose(state, self.episodes, expected_of_meta(meta), live=not finished)
            self._key, self._at = key, now
        return self._findings
