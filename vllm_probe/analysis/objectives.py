"""The figures goals, SLOs and objectives are written in, measured on a run.

The catalogue's figures marked ``objective`` (:mod:`vllm_probe.analysis.catalogue`: one
name per figure), shared by the doctor's goals (:class:`vllm_probe.analysis.doctor.rule.Goal`),
``vllm-probe tune --slo FIGURE<=VALUE`` and ``--maximize/--minimize FIGURE``. Each says its
unit, which way is better, and where the analysis already has it: a path into the run's
:class:`~vllm_probe.analysis.summary.Summary`, or a per-request field of
:class:`~vllm_probe.analysis.requests.RequestState` (queue time, TTFT, mean inter-token
time, end-to-end latency) when the figure is a quantile the
summary does not keep (p99) or is asked over a subset of the requests. Nothing here
computes a figure the analysis has: quantiles of per-request rows use
:func:`vllm_probe.analysis.figures.quantile`, the summary's own method (linear
interpolation between order statistics).

:func:`measure` reads a recorded or replayed run directory (or takes its summary and
rows) through the command's one pass over it (:mod:`vllm_probe.analysis.reading`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .catalogue import CATALOGUE, Figure
from .figures import quantile
from .requests import RequestState
from .reading import read
from .summary_types import Summary


#: A figure goals, SLOs and objectives are written in: an entry of the catalogue.
Objective = Figure
#: The catalogue's figures marked ``objective``, by name.
OBJECTIVES: dict[str, Objective] = {f.name: f for f in CATALOGUE if f.objective}


class ObjectiveError(ValueError):
    """An unknown figure name; the message is one line with the known names."""


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
    """Every finished request's :class:`RequestState` of the run, in finishing order, from
    the command's one pass over its events (:func:`vllm_probe.analysis.reading.read`: the
    rows are shared, to be read, not changed).

    Raises:
        NoEventsError: no event file, or no readable event in them.
    """
    rows = read(run_dir, "rows").rows
    assert rows is not None  # asked for
    return list(rows)


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
            requests: Iterable[str] | None = None, rows: Sequence[RequestState] | None = None,
            ) -> dict[str, float | None]:
    """The figures ``names`` of a run: from ``summary`` (default: the run's, from the
    command's one pass over ``run_dir``), and from the per-request rows (``rows``, default
    :func:`request_rows` of ``run_dir``) for the figures the summary lacks or when
    ``requests`` names a subset.

    Raises:
        ObjectiveError: an unknown name, or a run-wide figure asked over a subset.
        NoEventsError: ``run_dir`` holds no events (when it has to be read).
    """
    names = list(names)
    subset = tuple(requests or ())
    out: dict[str, float | None] = {}
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
            per_request = rows is None and any(subset or (objective(n).summary_path is None
                                                          and objective(n).request_field is not None) for n in names)
            parts = ("summary", "rows") if per_request else ("summary",)  # the rows too if a name needs them
            summary = read(run_dir, *parts).summary()
        out[name] = from_summary(summary, name)
    return out


def better(name: str, a: float | None, b: float | None) -> bool:
    """Whether value ``a`` of figure ``name`` is strictly better than ``b`` (None is worst)."""
    if a is None:
        return False
    if b is None:
        return True
    return a < b if objective(name).better == "lower" else a > b


__all__ = ["OBJECTIVES", "Objective", "ObjectiveError", "better", "from_rows", "from_summary",
           "measure", "objective", "request_rows"]
