"""Runs side by side (``vllm-probe compare``, seed notes §4.4): what differs between their
effective configs and command lines, and each figure of :data:`FIGURES` with its delta
against the first run (the baseline), judged better or worse where one direction is.

Pure: :class:`~vllm_probe.analysis.summary.Summary` objects in, plain data out; the
table is drawn by :mod:`vllm_probe.tui.compare_view`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .summary import CONFIG_KEYS, Summary


@dataclass(frozen=True)
class Figure:
    """One number of a summary: where it lives, how to show it, which way is better."""

    section: str
    label: str
    path: str  # dotted attribute path into Summary, e.g. "latency.ttft_s.median"
    unit: str = ""
    better: str | None = None  # "lower", "higher" or None (neither)

    def get(self, s: Summary) -> Any:
        obj: Any = s
        for part in self.path.split("."):
            obj = obj.get(part) if isinstance(obj, dict) else getattr(obj, part, None)
            if obj is None:
                return None
        return obj


#: The figures ``compare`` lines up, in display order.
FIGURES: tuple[Figure, ...] = (
    Figure("run", "steps", "steps", "steps", "lower"),
    Figure("run", "duration", "duration_s", "s", "lower"),
    Figure("run", "requests finished", "requests_finished", "requests"),
    Figure("run", "output tokens/s", "output_tokens_per_s", "tok/s", "higher"),
    Figure("steps", "tokens/step median", "tokens_per_step.median", "tokens", "higher"),
    Figure("steps", "tokens/step p90", "tokens_per_step.p90", "tokens", "higher"),
    Figure("steps", "budget use median", "budget_use.median", "%", "higher"),
    Figure("steps", "budget use p90", "budget_use.p90", "%", "higher"),
    Figure("steps", "prefill share", "prefill_share", "%"),
    Figure("steps", "schedule() mean", "schedule_us.mean", "µs", "lower"),
    Figure("preemptions", "preemptions", "preemptions.count", "", "lower"),
    Figure("preemptions", "requests preempted", "preemptions.requests", "requests", "lower"),
    Figure("preemptions", "discarded tokens", "preemptions.discarded_tokens", "tokens", "lower"),
    Figure("preemptions", "recomputed tokens", "preemptions.recomputed_tokens", "tokens", "lower"),
    Figure("chunking", "prompts chunked", "chunking.chunked_prompts", "prompts"),
    Figure("chunking", "chunks/prompt mean", "chunking.chunks_per_prompt.mean", "chunks", "lower"),
    Figure("chunking", "chunks/prompt max", "chunking.chunks_per_prompt.max", "chunks", "lower"),
    Figure("chunking", "KV tokens re-read", "chunking.reread_kv_tokens", "tokens", "lower"),
    Figure("latency", "queue time median", "latency.queue_s.median", "s", "lower"),
    Figure("latency", "queue time p90", "latency.queue_s.p90", "s", "lower"),
    Figure("latency", "TTFT median", "latency.ttft_s.median", "s", "lower"),
    Figure("latency", "TTFT p90", "latency.ttft_s.p90", "s", "lower"),
    Figure("latency", "TTFT max", "latency.ttft_s.max", "s", "lower"),
    Figure("latency", "TTFT median (steps)", "latency.ttft_steps.median", "steps", "lower"),
    Figure("latency", "TTFT p90 (steps)", "latency.ttft_steps.p90", "steps", "lower"),
    Figure("latency", "decode time median", "latency.decode_s.median", "s", "lower"),
    Figure("latency", "inter-token median", "latency.itl_s.median", "s", "lower"),
    Figure("bound", "bound by", "bound_most", ""),
)


#: The figures by label (``FIGURE["TTFT p90"]``).
FIGURE: dict[str, Figure] = {f.label: f for f in FIGURES}


def relative_errors(reference: Summary, other: Summary, tolerances: dict[str, float]) -> dict[str, Any]:
    """How far ``other`` is from ``reference`` on the figures named in ``tolerances``
    (label → largest relative error accepted, e.g. ``{"steps": 0.02}``).

    Returns ``{"figures": {label: {"reference", "value", "error", "tolerance",
    "within"}}, "within": all within}``; ``error`` is :func:`delta`'s relative delta
    (None when the reference is 0 or either value is unknown). A figure is within when
    ``|value - reference| <= tolerance × |reference|`` (so a reference of 0 needs an equal
    value); an unknown value on one side only is not within.
    """
    rows = {}
    for label, tol in tolerances.items():
        f = FIGURE[label]
        ref, val = f.get(reference), f.get(other)
        d, rel, _ = delta(f, ref, val)
        if d is None:
            within = ref is None and val is None
        else:
            within = abs(d) <= tol * abs(ref)
        rows[label] = {"reference": ref, "value": val, "error": rel, "tolerance": tol, "within": within}
    return {"figures": rows, "within": all(r["within"] for r in rows.values())}


def config_differences(summaries: list[Summary]) -> dict[str, list[Any]]:
    """``engine_config`` keys whose values differ between runs → value per run."""
    out: dict[str, list[Any]] = {}
    for key in CONFIG_KEYS:
        values = [s.config.get(key) for s in summaries]
        if any(v != values[0] for v in values[1:]):
            out[key] = values
    return out


def command_differences(summaries: list[Summary]) -> list[str] | None:
    """Per run, the command-line arguments that differ from the other runs (None: same).

    Same-length commands are compared position by position and each differing value is
    shown with the option before it (``--max-num-batched-tokens 512``); otherwise the
    whole command lines are returned.
    """
    cmds = [list(s.command or []) for s in summaries]
    if all(c == cmds[0] for c in cmds[1:]):
        return None
    if len({len(c) for c in cmds}) == 1:
        diff_pos = [i for i in range(len(cmds[0])) if any(c[i] != cmds[0][i] for c in cmds[1:])]
        out = []
        for c in cmds:
            parts = []
            for i in diff_pos:
                if i > 0 and c[i - 1].startswith("-") and (i - 1) not in diff_pos:
                    parts.append(f"{c[i - 1]} {c[i]}")
                else:
                    parts.append(c[i])
            out.append(" ".join(parts))
        return out
    return [" ".join(c) for c in cmds]


def delta(figure: Figure, base: Any, value: Any) -> tuple[float | None, float | None, str | None]:
    """(absolute delta, relative delta, verdict) of ``value`` against ``base``.

    The verdict is ``better``/``worse`` for figures with a better direction, ``same``
    when equal, None when not comparable.
    """
    if not isinstance(base, (int, float)) or not isinstance(value, (int, float)) or isinstance(base, bool):
        return None, None, None
    d = value - base
    rel = d / base if base else None
    if d == 0:
        return 0, 0.0 if base else None, "same"
    if figure.better is None:
        return d, rel, None
    good = d < 0 if figure.better == "lower" else d > 0
    return d, rel, "better" if good else "worse"


def comparison(summaries: list[Summary]) -> dict[str, Any]:
    """JSON-ready comparison: config and command differences, figures with deltas."""
    base = summaries[0]
    figures = []
    for f in FIGURES:
        values = [f.get(s) for s in summaries]
        row = {"section": f.section, "figure": f.label, "path": f.path, "unit": f.unit, "values": values,
               "deltas": []}
        for v in values[1:]:
            d, rel, verdict = delta(f, values[0], v)
            row["deltas"].append({"abs": d, "rel": rel, "verdict": verdict})
        figures.append(row)
    return {
        "runs": [s.run_dir for s in summaries],
        "baseline": base.run_dir,
        "config_differences": config_differences(summaries),
        "command_differences": command_differences(summaries),
        "figures": figures,
        "summaries": [s.to_dict() for s in summaries],
    }
