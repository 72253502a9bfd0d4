"""The ``vllm-probe whatif`` report: the step-time model, the baseline's error against the
recorded run (before any prediction), then the recorded run, the baseline and each
setting side by side with deltas against the baseline, in the style of ``compare``.

Every figure and delta comes from :mod:`vllm_probe.analysis.compare` (its
:data:`~vllm_probe.analysis.compare.FIGURES` and :func:`~vllm_probe.analysis.compare.delta`);
the result is :class:`vllm_probe.sim.whatif.WhatifResult` (read by attribute: the views
do not import the simulation).
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..analysis.catalogue import BY_NAME
from ..analysis.compare import FIGURE
from .compare_view import fmt_delta
from .format import figure, with_range

#: The rows of the side-by-side table, by compare's figure labels.
ROWS = ("steps", "duration", "output tokens/s", "preemptions", "discarded tokens", "chunks/prompt mean",
        "queue time median", "queue time p90", "TTFT median", "TTFT p90", "TTFT median (steps)", "TTFT p90 (steps)",
        "inter-token median", "bound by")
#: Columns a setting takes in the table (its value and its delta), and the first three
#: (labels, recorded, baseline): settings beyond the width go to further tables (pages)
#: rather than cutting cells.
SETTING_COLUMNS = 42
FIXED_COLUMNS = 56


def _model_line(model: Any) -> Text:
    parts = [f"{figure(v)} {unit}" + ("" if term == "intercept" else f" × {term}")
             for term, v, unit in model.describe() if v or term == "intercept"]
    q = model.quality
    line = Text.assemble(("step-time model ", "bold"), "period = " + " + ".join(parts))
    level = getattr(model, "level", 1.0)
    if level != 1.0 or getattr(model, "profile", None):
        line.append(f", × level {level:.3g}" + (f" (shape: profile {model.profile})" if model.profile else ""))
    if q is not None:
        r2 = "-" if q.r2 is None else f"{q.r2:.2f}"
        r2t = "-" if q.r2_trimmed is None else f"{q.r2_trimmed:.2f}"
        line.append(f"\n  fitted on {q.steps:,} steps: R² {r2} ({r2t} without the {q.steps - q.kept} worst), "
                    f"per-step error median {q.median_abs_ms:.2f} ms, p90 {q.p90_abs_ms:.2f} ms, "
                    f"speed drift ±{q.drift * 100:.0f} % over the run", style="dim")
    return line


def _baseline(error: dict[str, Any], trace: bool) -> list[Any]:
    title = ("Baseline: the recorded run replayed at its own settings" if not trace
             else "Baseline: the --like run replayed at its own settings (the model's credibility)")
    t = Table(title=title, title_justify="left", title_style="bold underline", box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("", style="dim", no_wrap=True)
    for col in ("recorded", "replayed", "error", "threshold", ""):
        t.add_column(col, justify="right", no_wrap=True)
    off = []
    for name, row in error["figures"].items():
        unit, label = BY_NAME[name].unit, BY_NAME[name].label
        err = row["error"]
        err_text = "-" if err is None else f"{err * 100:+.1f}%".replace("-", "−")
        if row["value"] == row["reference"]:
            err_text = "="
        mark = Text("ok", style="green") if row["within"] else Text("off", style="red")
        if not row["within"]:
            off.append(f"{label} ({err_text})")
        t.add_row(label, figure(row["reference"], unit), figure(row["value"], unit), err_text,
                  f"±{row['tolerance'] * 100:.0f}%", mark)
    out: list[Any] = [t]
    if off:
        out.append(Text("the baseline is off by more than its threshold on " + ", ".join(off)
                        + ": predictions below carry errors of that size (docs/whatif.md says why)", style="yellow"))
    return out


#: Above this share of a replay's steps outside the model's fitted region the line is
#: a warning (yellow) and says those steps extrapolate.
OUTSIDE_WARN = 0.05


def step_time_model_line(d: dict[str, Any] | None) -> Text | None:
    """Which step-time model the replays used, from a ``step_time_model`` object
    (:meth:`vllm_probe.sim.whatif.StepTimeChoice.to_dict`): ``step-time model: profile
    P.json (from the cache)``, ``… fitted on the recording only``, ``FORCED`` marked."""
    if not d:
        return None
    if d.get("source") == "recording":
        return Text("step-time model: fitted on the recording only (vllm-probe calibrate measures a profile)",
                    style="dim")
    text = f"step-time model: profile {d.get('profile')}" + (" (from the cache)" if d.get("source") == "cache"
                                                             else "") + ", level fitted on the recording"
    if d.get("forced"):
        return Text(text + " — FORCED: another engine's profile", style="bold red")
    return Text(text, style="dim")


def outside_line(shares: list[tuple[str, float | None]]) -> Text | None:
    """``steps outside the model's fitted region: baseline 0 %, [1] 12 %`` (shares 0..1
    by replay; None when no share is known)."""
    known = [(name, v) for name, v in shares if v is not None]
    if not known:
        return None
    worst = max(v for _, v in known)
    return Text("steps outside the model's fitted region: " + ", ".join(f"{n} {v * 100:.0f} %" for n, v in known)
                + ("; those steps extrapolate (vllm-probe calibrate measures the whole space)"
                   if worst > OUTSIDE_WARN else ""),
                style="yellow" if worst > OUTSIDE_WARN else "dim")


def _outside(result: Any) -> Text | None:
    """The share of each replay's steps outside the region the model was fitted on."""
    runs = [("baseline", result.baseline)] + [(f"[{i + 1}]", c) for i, c in enumerate(result.configs)]
    return outside_line([(name, c.replay.get("outside_region")) for name, c in runs])


def render(result: Any, width: int | None = None) -> Group:
    """The report of a :class:`~vllm_probe.sim.whatif.WhatifResult` (``width``: columns
    of the console; settings beyond it go to further tables)."""
    trace = result.like is not None
    head = Text.assemble(("vllm-probe whatif ", "bold"), (result.source, "cyan"))
    if trace:
        head.append(f"  with the settings of {result.like}", style="dim")
    if getattr(result, "forced", None):
        head.append("  FORCED PROFILE (another engine's)", style="bold red")
    parts: list[Any] = [head, _model_line(result.model)]
    parts += _baseline(result.error, trace)
    for note in result.notes:
        parts.append(Text("note: " + note, style="yellow" if note.startswith("FORCED") else "dim"))
    outside = _outside(result)
    if outside is not None:
        parts.append(outside)

    runs = [("recorded" if not trace else "like run", result.recorded), ("baseline", result.baseline.summary)]
    runs += [(f"[{i + 1}]", c.summary) for i, c in enumerate(result.configs)]
    for i, c in enumerate(result.configs):
        changes = ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in c.overrides.items())
        parts.append(Text(f"  [{i + 1}] {changes}: {c.run_dir}", style="dim"))
    parts.append(Text(f"  baseline: {result.baseline.run_dir}", style="dim"))

    per_page = max(1, ((width or 10_000) - FIXED_COLUMNS) // SETTING_COLUMNS)
    n = len(result.configs)
    for first in range(0, max(n, 1), per_page):
        title = "Predicted" if n <= per_page else f"Predicted ([{first + 1}]–[{min(first + per_page, n)}] of {n})"
        parts.append(_table(result, runs, list(range(first, min(first + per_page, n))), title, trace))
    return Group(*parts)


def _table(result: Any, runs: list[tuple[str, Any]], page: list[int], title: str, trace: bool) -> Table:
    """The side-by-side table of the settings ``page`` (indexes into ``result.configs``)."""
    t = Table(title=title, title_justify="left", title_style="bold underline", box=box.SIMPLE_HEAD,
              pad_edge=False)
    t.add_column("", style="dim", no_wrap=True)
    t.add_column(runs[0][0], justify="right", no_wrap=True)
    t.add_column("baseline", justify="right", no_wrap=True)
    for k in page:
        name = runs[2 + k][0]
        t.add_column(name, justify="right", no_wrap=True)
        t.add_column(f"Δ {name}−base", justify="right", no_wrap=True)
    from_memory = any("gpu_memory_utilization" in c.overrides for c in result.configs)
    changed = [k for k in result.baseline.settings if any(k in c.overrides for c in result.configs)
               or (k == "num_kv_blocks" and from_memory)]
    for key in changed:
        derived = key == "num_kv_blocks" and from_memory
        cells: list[str | Text]
        cells = [figure(result.baseline.settings.get(key)) if not trace else figure(result.recorded.config.get(key)),
                 figure(result.baseline.settings.get(key))]
        for c in (result.configs[k] for k in page):
            cells += [Text(figure(c.settings.get(key)), style="bold" if key in c.overrides else ""), Text("")]
        t.add_row(key + (" (from memory)" if derived else ""), *cells)
    if changed:
        t.add_section()
    for label in ROWS:
        f = FIGURE[label]
        figure_name = f.name
        base = f.get(result.baseline.summary)
        base_iv = result.baseline.intervals.get(figure_name)
        cells = [figure(f.get(runs[0][1]), f.unit), with_interval(base, base_iv, f.unit)]
        for k in page:
            c = result.configs[k]
            v = f.get(c.summary)
            iv = c.intervals.get(figure_name)
            unclear = base_iv is not None and iv is not None and v != base and not base_iv.separates(iv)
            cells += [with_interval(v, iv, f.unit),
                      Text("unclear", style="dim") if unclear else fmt_delta(f, base, v)]
        t.add_row(label, *cells)
    if any(c.intervals for c in (result.baseline, *result.configs)):
        t.caption = ("(lo–hi): where a run at that setting may land, from the recording's own speed spread; a Δ "
                     "reads 'unclear' where the two ranges overlap")
    return t


def with_interval(value: Any, iv: Any, unit: str) -> str:
    """``1.23 s (1.05–1.41)`` (the value alone without an interval)."""
    return with_range(value, iv.lo if iv is not None else None, iv.hi if iv is not None else None, unit)
