"""The figures goals, SLOs and objectives are written in, measured on a run.

One name per figure, shared by the doctor's goals (:class:`vllm_probe.analysis.doctor.rule.Goal`),
``vllm-probe tune --slo FIGURE<=VALUE`` and ``--maximize/--minimize FIGURE``. Each
:class:`Objective` says its unit, which way is better, and where the analysis already
has it: a path into the run's :class:`~vllm_probe.analysis.summary.Summary`, or a
per-request field of :class:`~vllm_probe.analysis.requests.RequestState` (queue time,
TTFT, mean inter-token time, end-to-end latency) when the figure is a quantile the
summary does not keep (p99) or is asked over a subset of the requests. Nothing here
computes a figure the analysis has: quantiles of per-request rows use
:func:`vllm_probe.analysis.figures.quantile`, the summary's own method (linear
interpolation between order statistics).

:func:`measure` reads a recorded or replayed run directory (or takes its summary); it
reads the events a second time only for per-request figures.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..runs.reader import ReadStats, iter_file
from ..runs.rundir import event_files
from .figures import quantile
from .requests import RequestState
from .state import RunState
from .summary import Summary, summarize


@dataclass(frozen=True)
class Objective:
    """One figure.

    Attributes:
        name: the public name (``ttft_p90``).
        unit: ``s``, ``tokens/s``, ``steps``, ``blocks``, ``tokens``, ``preemptions``.
        better: ``lower`` or ``higher``.
        summary_path: dotted path in :class:`Summary` (None: per-request only).
        request_field: :class:`RequestState` property for a subset (None: run-wide only).
        q: the quantile of ``request_field`` (0.5, 0.9, 0.99); None with ``total``.
        doc: one line.
        total: over some requests, the sum of ``request_field`` (a count), not a quantile.
    """

    name: str
    unit: str
    better: str
    summary_path: str | None
    request_field: str | None = None
    q: float | None = None
    doc: str = ""
    total: bool = False


OBJECTIVES: dict[str, Objective] = {o.name: o for o in (
    Objective("preemptions", "preemptions", "lower", "preemptions.count", doc="preempt events of the run"),
    Objective("worst_request_preemptions", "preemptions", "lower", "preemptions.worst_preemptions",
              doc="preemptions of the most preempted request"),
    Objective("ttft_p50", "s", "lower", "latency.ttft_s.median", "ttft_s", 0.5, "time to first token, median"),
    Objective("ttft_max", "s", "lower", "latency.ttft_s.max", doc="time to first token, the longest"),
    Objective("ttft_p90", "s", "lower", "latency.ttft_s.p90", "ttft_s", 0.9, "time to first token, p90"),
    Objective("ttft_p99", "s", "lower", None, "ttft_s", 0.99, "time to first token, p99 (per-request rows)"),
    Objective("queue_p50", "s", "lower", "latency.queue_s.median", "queue_time_s", 0.5,
              "arrival to first scheduled chunk, median"),
    Objective("queue_p90", "s", "lower", "latency.queue_s.p90", "queue_time_s", 0.9,
              "arrival to first scheduled chunk, p90"),
    Objective("itl_p50", "s", "lower", "latency.itl_s.median", "mean_itl_s", 0.5,
              "per-request mean inter-token time, median"),
    Objective("itl_p90", "s", "lower", "latency.itl_s.p90", "mean_itl_s", 0.9,
              "per-request mean inter-token time, p90"),
    Objective("e2e_p50", "s", "lower", "latency.e2e_s.median", "e2e_s", 0.5, "arrival to finish, median"),
    Objective("e2e_p90", "s", "lower", "latency.e2e_s.p90", "e2e_s", 0.9, "arrival to finish, p90"),
    Objective("held_slot_steps", "steps", "lower", None,
              doc="steps whose waiting head was held back as `deferred` (head_blocked_by): under "
                  "AsyncScheduler, slots held by requests that produced their last token"),
    Objective("reread_kv_tokens", "tokens", "lower", "chunking.reread_kv_tokens", "reread_tokens",
              doc="KV tokens re-read because prompts were chunked", total=True),
    Objective("output_tokens_per_s", "tokens/s", "higher", "output_tokens_per_s",
              doc="output tokens of finished requests / duration"),
    Objective("duration_s", "s", "lower", "duration_s", doc="first step's start to last step"),
    Objective("steps", "steps", "lower", "steps", doc="scheduler steps"),
    Objective("num_kv_blocks", "blocks", "lower", "config.num_kv_blocks", doc="KV-cache blocks of the engine"),
)}


class ObjectiveError(ValueError):
    """An unknown figure name; the message is one line with the known names."""


#: Objective names by the summary path they read (``"latency.ttft_s.p90"`` → ``ttft_p90``):
#: how a row of ``compare``'s table finds its figure's name.
BY_SUMMARY_PATH: dict[str, str] = {o.summary_path: n for n, o in OBJECTIVES.items() if o.summary_path}


def objective(name: str) -> Objective:
    """The :class:`Objective` called ``name``. Raises :class:`ObjectiveError`."""
    try:
        return OBJECTIVES[name]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(name, OBJECTIVES, n=1)
        hint = f"did you mean {close[0]}?" if close else "known: " + ", ".join(OBJECTIVES)
        raise ObjectiveError(f"unknown figure {name!r} ({hint})") from None


def _path(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if obj is None:
            return None
        obj = obj.get(part) if isinstance(obj, dict) else getattr(obj, part, None)
    return obj


def from_summary(summary: Summary | dict[str, Any], name: str) -> float | None:
    """The figure ``name`` as the summary has it (None: not in the summary, or unknown)."""
    o = objective(name)
    if name == "held_slot_steps":
        blocked = _path(summary, "head_blocked_by") or {}
        steps = _path(summary, "head_blocked_steps") or 0
        return float(round(blocked.get("deferred", 0.0) * steps))
    if o.summary_path is None:
        return None
    v = _path(summary, o.summary_path)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def request_rows(run_dir: str | Path) -> list[RequestState]:
    """Every finished request's :class:`RequestState` of the run (one pass over its events)."""
    rows: list[RequestState] = []
    state = RunState(step_window=0, on_request_finished=rows.append)
    stats = ReadStats()
    for ev in itertools.chain.from_iterable(iter_file(p, stats) for p in event_files(Path(run_dir))):
        state.apply(ev)
    return rows


def from_rows(rows: Iterable[RequestState], name: str, requests: Iterable[str] | None = None) -> float | None:
    """A per-request figure over ``rows`` (only the ids in ``requests`` when given)."""
    o = objective(name)
    if o.request_field is None or (o.q is None and not o.total):
        raise ObjectiveError(f"{name} is a run-wide figure; it cannot be measured over some requests")
    keep = set(requests) if requests else None
    vals = sorted(v for r in rows if keep is None or r.req_id in keep
                  for v in (getattr(r, o.request_field),) if v is not None)
    if o.total or o.q is None:
        return float(sum(vals))
    return quantile(vals, o.q)


def measure(run_dir: str | Path | None, names: Iterable[str], summary: Summary | dict[str, Any] | None = None,
            requests: Iterable[str] | None = None) -> dict[str, float | None]:
    """The figures ``names`` of a run: from ``summary`` (default: summarized from
    ``run_dir``), and from the per-request rows (read from ``run_dir``) for the figures the
    summary lacks or when ``requests`` names a subset.

    Raises:
        ObjectiveError: an unknown name, or a run-wide figure asked over a subset.
        NoEventsError: ``run_dir`` holds no events (when it has to be read).
    """
    names = list(names)
    subset = tuple(requests or ())
    out: dict[str, float | None] = {}
    rows: list[RequestState] | None = None
    for name in names:
        o = objective(name)
        if subset or (o.summary_path is None and o.request_field is not None):
            if o.request_field is None:
                raise ObjectiveError(f"{name} is a run-wide figure; it cannot be measured over some requests")
            if rows is None:
                if run_dir is None:
                    raise ObjectiveError(f"{name} needs the run's events (per-request rows)")
                rows = request_rows(run_dir)
            out[name] = from_rows(rows, name, subset or None)
            continue
        if summary is None:
            if run_dir is None:
                raise ObjectiveError(f"{name} needs the run's summary")
            summary = summarize(run_dir)
        out[name] = from_summary(summary, name)
    return out


def better(name: str, a: float | None, b: float | None) -> bool:
    """Whether value ``a`` of figure ``name`` is strictly better than ``b`` (None is worst)."""
    if a is None:
        return False
    if b is None:
        return True
    return a < b if objective(name).better == "lower" else a > b


__all__ = ["BY_SUMMARY_PATH", "OBJECTIVES", "Objective", "ObjectiveError", "better", "from_rows", "from_summary",
           "measure", "objective", "request_rows"]
