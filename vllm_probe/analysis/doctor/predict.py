"""``doctor --whatif``: each remedy's predicted effect, from the what-if replay.

The replay (part 9, ``vllm_probe.sim.whatif.predict(run_dir, grid, out=None, jobs=1)``)
replays a recorded run through vLLM's own scheduler at other settings. :func:`grid`
turns the findings' remedies (:attr:`~.findings.Remedy.whatif`, in ``whatif --set``
names) into its grid; :func:`attach` puts, into each finding's ``predicted``, the
figures the finding is about, recorded against predicted, and the baseline replay's
error against the recorded run (how far to trust the prediction).

The replay's result is read by name, as attributes or keys alike, in the shape of
``vllm-probe whatif --json``: ``{"error", "baseline": {"summary"}, "configs":
[{"settings", "run_dir", "summary"}]}``, one config per grid entry in grid order;
``summary`` a :class:`~vllm_probe.analysis.summary.Summary` or its ``to_dict()``;
``error`` the baseline's :func:`~vllm_probe.analysis.compare.relative_errors` against the
recorded run (``{"figures": {label: {"error", "within", …}}, "within"}``).
This module only calls the function it is given (the command passes the replay's), so
the analysis stays free of the simulation.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from collections.abc import Callable

from .findings import Finding

#: Per finding id, the figures compared: (name, path in the summary, unit of tui.format.figure).
FIGURES: dict[str, tuple[tuple[str, str, str], ...]] = {
    "preemption-storm": (("preemptions", "preemptions.count", ""),
                         ("discarded tokens", "preemptions.discarded_tokens", ""),
                         ("TTFT p90", "latency.ttft_s.p90", "s")),
    "preemption-thrash": (("preemptions", "preemptions.count", ""),
                          ("worst request preempted", "preemptions.worst_preemptions", ""),
                          ("TTFT p90", "latency.ttft_s.p90", "s")),
    "head-of-line-blocking": (("queue time p90", "latency.queue_s.p90", "s"),
                              ("TTFT median", "latency.ttft_s.median", "s"),
                              ("TTFT p90", "latency.ttft_s.p90", "s")),
    "kv-bound": (("output tok/s", "output_tokens_per_s", ""), ("queue time p90", "latency.queue_s.p90", "s"),
                 ("TTFT p90", "latency.ttft_s.p90", "s")),
    "seqs-bound": (("output tok/s", "output_tokens_per_s", ""), ("queue time p90", "latency.queue_s.p90", "s"),
                   ("TTFT p90", "latency.ttft_s.p90", "s")),
    "budget-bound": (("output tok/s", "output_tokens_per_s", ""), ("TTFT p90", "latency.ttft_s.p90", "s"),
                     ("inter-token median", "latency.itl_s.median", "s")),
    "stall": (("steps", "steps", ""), ("duration", "duration_s", "s")),
    "chunking-without-benefit": (("steps", "steps", ""), ("chunks per prompt", "chunking.chunks_per_prompt.mean", ""),
                                 ("KV re-read tokens", "chunking.reread_kv_tokens", "")),
    "config-not-applied": (("output tok/s", "output_tokens_per_s", ""), ("preemptions", "preemptions.count", ""),
                           ("TTFT p90", "latency.ttft_s.p90", "s")),
}

#: What each finding's remedy should do to one of its :data:`FIGURES`: bring it to at
#: most a value (a number), or make it lower than recorded (``"lower"``). The replay's
#: answer is ``predicted["resolved"]``.
GOALS: dict[str, tuple[str, float | str]] = {
    "preemption-storm": ("preemptions", 0),
    "preemption-thrash": ("worst request preempted", 1),
    "head-of-line-blocking": ("queue time p90", "lower"),
    "kv-bound": ("queue time p90", "lower"),
    "seqs-bound": ("queue time p90", "lower"),
    "budget-bound": ("TTFT p90", "lower"),
    "stall": ("duration", "lower"),
    "chunking-without-benefit": ("KV re-read tokens", "lower"),
}


#: The replay's function: ``predict(run_dir, grid, out=None, jobs=1)``.
Predict = Callable[..., Any]


def _get(obj: Any, name: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def figure_of(summary: Any, path: str) -> Any:
    """``summary``'s figure at a dotted ``path`` (``"latency.ttft_s.p90"``); None if absent."""
    v = summary
    for part in path.split("."):
        v = _get(v, part)
    return v


def grid(findings: list[Finding]) -> list[dict[str, Any]]:
    """The distinct remedy settings to replay, in finding order."""
    out: list[dict[str, Any]] = []
    for f in findings:
        w = f.remedy.whatif if f.remedy is not None else None
        if w and w not in out:
            out.append(dict(w))
    return out


def attach(findings: list[Finding], recorded: Any, settings: list[dict[str, Any]], result: Any) -> None:
    """Fill each finding's ``predicted`` from ``result`` (the replay of ``settings``).

    ``recorded``: the run's own :class:`~vllm_probe.analysis.summary.Summary`.
    ``predicted`` is ``{"settings", "run_dir", "figures": {name: {"recorded",
    "predicted", "unit"}}, "goal", "resolved", "baseline_error"}``: ``goal`` is the
    finding's :data:`GOALS` entry as ``{"figure", "target"}`` (a number: at most it;
    ``"lower"``: below the recorded value), ``resolved`` whether the replay meets it
    (None: no goal, or the figure unknown);
    ``baseline_error`` is :func:`baseline_error` of the replay. A finding whose remedy the
    replay could not run gets ``{"settings", "error"}``.
    """
    configs = list(_get(result, "configs") or [])
    errors = baseline_error(result)
    for f in findings:
        w = f.remedy.whatif if f.remedy is not None else None
        if not w:
            continue
        config = None
        if w in settings and len(configs) == len(settings):
            config = configs[settings.index(w)]
        else:  # match by the settings each config reports
            config = next((c for c in configs if all((_get(c, "settings") or {}).get(k) == v for k, v in w.items())),
                          None)
        if config is None:
            f.predicted = {"settings": dict(w), "error": "the replay returned no result for these settings"}
            continue
        predicted = _get(config, "summary")
        figures = {name: {"recorded": figure_of(recorded, path), "predicted": figure_of(predicted, path), "unit": unit}
                   for name, path, unit in FIGURES.get(f.id, ())}
        f.predicted = {"settings": dict(w), "run_dir": str(_get(config, "run_dir") or ""), "figures": figures,
                       "goal": _goal(f.id), "resolved": _resolved(f.id, figures), "baseline_error": errors}


def attach_error(findings: list[Finding], error: str) -> None:
    """Put ``{"settings", "error"}`` into the ``predicted`` of every finding with a remedy
    to replay (the replay could not run: ``error`` says why, in one line)."""
    for f in findings:
        w = f.remedy.whatif if f.remedy is not None else None
        if w:
            f.predicted = {"settings": dict(w), "error": error}


def _goal(finding_id: str) -> dict[str, Any] | None:
    goal = GOALS.get(finding_id)
    return None if goal is None else {"figure": goal[0], "target": goal[1]}


def _resolved(finding_id: str, figures: dict[str, dict[str, Any]]) -> bool | None:
    """Whether the predicted figure meets the finding's :data:`GOALS` (None: no goal, or
    a figure unknown on either side)."""
    goal = GOALS.get(finding_id)
    if goal is None:
        return None
    name, target = goal
    recorded, predicted = figures.get(name, {}).get("recorded"), figures.get(name, {}).get("predicted")
    if predicted is None or (target == "lower" and recorded is None):
        return None
    return bool(predicted < recorded) if target == "lower" else bool(predicted <= target)


def baseline_error(result: Any) -> dict[str, Any] | None:
    """How far the replay at the recorded settings is from the recorded run:
    ``{"within": bool, "figures": {label: relative error or None}, "off": [labels past
    their tolerance]}``; None when the result carries no such comparison."""
    error = _get(result, "error")
    if error is None:
        error = _get(_get(result, "baseline"), "error")
    if not isinstance(error, dict) or "figures" not in error:
        plain: dict[str, Any] | None = _jsonable(error)
        return plain
    rows = error["figures"]
    return {"within": bool(error.get("within")),
            "figures": {label: _jsonable(_get(row, "error")) for label, row in rows.items()},
            "off": [label for label, row in rows.items() if not _get(row, "within")]}


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return _jsonable(dataclasses.asdict(v))
    d = getattr(v, "__dict__", None)
    return _jsonable(d) if d is not None else str(v)
