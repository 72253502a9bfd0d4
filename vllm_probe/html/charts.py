"""The report's charts, drawn with Bokeh from the analysis objects (no figure computed here).

Every chart takes what :mod:`vllm_probe.analysis.report` computed and lays it out:
the step series' buckets (:class:`~vllm_probe.analysis.series.EngineSeries`: a band from
each bucket's least to its largest value, a line through its mean), the preemption marks
(every preempting step, its victims in the tooltip), the longest prompts' chunks, the
latency curves and the ``whatif`` / ``tune`` sweeps. Data goes into the page as typed
arrays (Bokeh encodes numpy arrays in binary), which keeps a long run's page small.

Colours: prefill cyan and decode green as on the dashboard, preemptions red, KV amber,
waiting magenta; several runs or engine cores get one colour each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from bokeh.models import (
    BoxZoomTool, ColumnDataSource, FactorRange, HoverTool, PanTool, Range1d, ResetTool, SaveTool, WheelZoomTool,
)
from bokeh.models.annotations import BoxAnnotation, Label, Legend, Span, Whisker
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

from ..analysis.text import fmt_duration
from ..analysis.objectives import OBJECTIVES
from ..analysis.report import LATENCY_FIGURES, RunPage, Sweep
from ..analysis.series import EngineSeries, PreemptionMark, PromptTrack

PREFILL = "#17becf"
DECODE = "#2ca02c"
PREEMPT = "#d62728"
KV = "#e6a100"
RUNNING = "#1f77b4"
WAITING = "#c2185b"
BUDGET = "#555555"
#: Severity colours of the finding stretches.
SEVERITY = {"critical": "#d62728", "warning": "#ff9800", "info": "#9e9e9e"}
#: Chart heights (pixels).
TIMELINE_H = 210
CHUNKS_ROW_H = 26
LATENCY_H = 300
SWEEP_H = 280
#: Names of the shared x ranges the finding links set (the page's script finds them by name).
STEPS_RANGE = "steps-x"
TIME_RANGE = "time-x"
#: What each latency figure is called on the page.
LATENCY_TITLES = {"ttft_s": "time to first token", "itl_s": "mean inter-token time", "queue_s": "queue time",
                  "e2e_s": "end-to-end latency"}


@dataclass
class Line:
    """One engine core of one run, as the timelines draw it: its label and colour."""

    run: RunPage
    series: EngineSeries
    label: str
    color: str
    #: its data on the page, made once (:func:`bucket_source`, :func:`marks_source`)
    buckets: Any = None
    marks: Any = None


def lines_of(runs: list[RunPage]) -> list[Line]:
    """Every engine core of every run, one colour each (one run with one engine core:
    the figures' own colours)."""
    out: list[Line] = []
    multi = len(runs) > 1
    for run in runs:
        engines = sorted(run.series.engines.items())
        for idx, series in engines:
            parts = [run.label] if multi else []
            if len(engines) > 1:
                parts.append(f"dp{idx}")
            out.append(Line(run, series, " ".join(parts), Category10_10[len(out) % 10]))
    return out


def _tools(x_only: bool = True) -> list[Any]:
    """Box zoom (active), pan and wheel zoom along x only on the timelines (their y axes
    keep the whole range), reset and save."""
    if x_only:
        return [BoxZoomTool(dimensions="width"), PanTool(dimensions="width"), WheelZoomTool(dimensions="width"),
                ResetTool(), SaveTool()]
    return [BoxZoomTool(), PanTool(), WheelZoomTool(), ResetTool(), SaveTool()]


def _active_drag(p: Any) -> None:
    toolbar: Any = p.toolbar
    toolbar.active_drag = p.tools[0]
    toolbar.logo = None


#: Room left of the step timelines' plots (pixels): the chunks chart's request labels need
#: it, and the same on every timeline keeps their x axes aligned.
LEFT_BORDER = 190


def _figure(title: str, height: int, x_range: Any, x_label: str, y_label: str, **kw: Any) -> Any:
    p = figure(title=title, height=height, sizing_mode="stretch_width", x_range=x_range, tools=_tools(),
               toolbar_location="right", min_border_left=LEFT_BORDER, **kw)
    p.xaxis.axis_label = x_label
    p.yaxis.axis_label = y_label
    _active_drag(p)
    return p


def _f32(values: list[Any]) -> Any:
    return np.asarray(values, dtype=np.float32)


def bucket_source(line: Line) -> ColumnDataSource:
    """One engine core's buckets as columns, shared by its timelines over steps and over
    time: ``x_step`` (the bucket's middle step), ``x_time`` (seconds since the run's first
    step), per figure its least (``*_lo``), mean and largest (``*_hi``) value, the
    bucket's steps and preemptions (for the tooltips). Made once per engine core."""
    if line.buckets is not None:
        return line.buckets
    s = line.series
    t0 = line.run.t0
    data: dict[str, Any] = {"x_step": np.asarray([(a + b) / 2 for a, b in zip(s.first_step, s.last_step)],
                                                 dtype=np.float64),
                            "x_time": np.asarray([(a + b) / 2 - t0 for a, b in zip(s.first_ts, s.last_ts)],
                                                 dtype=np.float64),
                            "first": np.asarray(s.first_step, dtype=np.int64),
                            "last": np.asarray(s.last_step, dtype=np.int64),
                            "preempted": np.asarray(s.preemptions, dtype=np.int32)}
    for name in ("scheduled", "running", "waiting", "kv"):
        data[f"{name}_lo"], data[f"{name}_hi"] = _f32(s.lo[name]), _f32(s.hi[name])
        data[name] = _f32(s.mean(name))
    data["budget"] = _f32(s.hi["budget"])
    data["prefill"], data["decode"] = _f32(s.mean("prefill")), _f32(s.mean("decode"))
    line.buckets = ColumnDataSource(data)
    return line.buckets


def _victims_text(m: PreemptionMark) -> str:
    parts = []
    for v in m.victims[:6]:
        detail = []
        if v.discarded_tokens is not None:
            detail.append(f"{v.discarded_tokens:,} tok discarded")
        if v.num_preemptions is not None:
            detail.append(f"×{v.num_preemptions}")
        parts.append(v.req_id + (f" ({', '.join(detail)})" if detail else ""))
    if len(m.victims) > 6:
        parts.append(f"+{len(m.victims) - 6} more")
    return "; ".join(parts)


def marks_source(line: Line) -> ColumnDataSource:
    """The engine core's preempting steps, shared by all its timelines: ``x_step``,
    ``x_time``, a height per chart (``y_tokens``, ``y_kv``, ``y_queues``), the step, how
    many were preempted and the victims' text. Made once per engine core."""
    if line.marks is not None:
        return line.marks
    marks = [m for m in line.run.series.marks if m.engine == line.series.engine]
    n = len(marks)
    line.marks = ColumnDataSource({
        "x_step": np.asarray([m.step for m in marks], dtype=np.float64),
        "x_time": np.asarray([m.ts - line.run.t0 for m in marks], dtype=np.float64),
        "y_tokens": np.full(n, _top_of(line.series), dtype=np.float32), "y_kv": np.full(n, 1.04, dtype=np.float32),
        "y_queues": np.full(n, _queue_top(line.series), dtype=np.float32),
        "step": np.asarray([m.step for m in marks], dtype=np.int64),
        "n": np.asarray([len(m.victims) for m in marks], dtype=np.int32),
        "victims": [_victims_text(m) for m in marks]})
    return line.marks


def _x_range(lines: list[Line], axis: str) -> Range1d:
    lo, hi = 0.0, 1.0
    for ln in lines:
        s = ln.series
        if not len(s):
            continue
        if axis == "step":
            lo, hi = min(lo, s.first_step[0]), max(hi, s.last_step[-1])
        else:
            hi = max(hi, s.last_ts[-1] - ln.run.t0)
    pad = 0.5 if axis == "step" else 0.0
    return Range1d(start=lo - pad, end=hi + pad, name=STEPS_RANGE if axis == "step" else TIME_RANGE)


def timelines(runs: list[RunPage], axis: str, lines: list[Line] | None = None) -> list[Any]:
    """The step timelines over ``axis`` (``step``: step index; ``time``: seconds since
    each run's first step), sharing one x range: tokens per step against the budget,
    KV-cache use, running and waiting queues; preemptions marked (▼) with their victims,
    and over steps each finding's stretch shaded. ``lines``: :func:`lines_of` the runs,
    shared by both axes' calls so each engine core's data is on the page once."""
    lines = lines if lines is not None else lines_of(runs)
    x = f"x_{axis}"
    xr = _x_range(lines, axis)
    x_label = "step" if axis == "step" else "seconds since the first step"
    single = len(lines) == 1
    tokens = _figure("tokens per step against the token budget (band: least–largest step of each point)",
                     TIMELINE_H + 40, xr, x_label, "tokens")
    kv = _figure("KV-cache use", TIMELINE_H, xr, x_label, "share of the KV cache", y_range=Range1d(start=0, end=1.08))
    queues = _figure("requests running and waiting after each step", TIMELINE_H, xr, x_label, "requests")
    hover_lines = []
    for ln in lines:
        src = bucket_source(ln)
        name = ln.label
        if single:
            tokens.varea_stack(["prefill", "decode"], x=x, source=src, color=[PREFILL, DECODE], alpha=0.55,
                               legend_label=["prefill (mean)", "decode (mean)"])
            tokens.varea(x=x, y1="scheduled_lo", y2="scheduled_hi", source=src, color=PREFILL, alpha=0.15)
            top = tokens.line(x, "scheduled_hi", source=src, color=PREFILL, line_width=1, alpha=0.7,
                              legend_label="most in one step")
            tokens.line(x, "budget", source=src, color=BUDGET, line_dash="dashed", line_width=1.5,
                        legend_label="token budget")
        else:
            tokens.varea(x=x, y1="scheduled_lo", y2="scheduled_hi", source=src, color=ln.color, alpha=0.15)
            top = tokens.line(x, "scheduled", source=src, color=ln.color, line_width=1.5, legend_label=name)
            tokens.line(x, "budget", source=src, color=ln.color, line_dash="dashed", line_width=1,
                        legend_label=f"{name} budget")
        hover_lines.append(top)
        kv_color = KV if single else ln.color
        kv.varea(x=x, y1="kv_lo", y2="kv_hi", source=src, color=kv_color, alpha=0.25)
        kv_line = kv.line(x, "kv", source=src, color=kv_color, line_width=1.5,
                          legend_label="KV use (mean)" if single else name)
        run_color, wait_color = (RUNNING, WAITING) if single else (ln.color, ln.color)
        queues.varea(x=x, y1="running_lo", y2="running_hi", source=src, color=run_color, alpha=0.15)
        queues.varea(x=x, y1="waiting_lo", y2="waiting_hi", source=src, color=wait_color, alpha=0.15)
        q_run = queues.line(x, "running", source=src, color=run_color, line_width=1.5,
                            legend_label="running" if single else f"{name} running")
        queues.line(x, "waiting", source=src, color=wait_color, line_width=1.5, line_dash="solid" if single
                    else "dotted", legend_label="waiting" if single else f"{name} waiting")
        tips = [("steps", "@first–@last"), ("tokens least / mean / most", "@scheduled_lo / @scheduled{0} / "
                                                                           "@scheduled_hi"),
                ("budget", "@budget"), ("KV least / mean / most", "@kv_lo{0%} / @kv{0%} / @kv_hi{0%}"),
                ("running mean / most", "@running{0.0} / @running_hi"),
                ("waiting mean / most", "@waiting{0.0} / @waiting_hi"), ("preempted", "@preempted")]
        if name:
            tips.insert(0, ("", name))
        for p, r in ((tokens, top), (kv, kv_line), (queues, q_run)):
            p.add_tools(HoverTool(renderers=[r], tooltips=tips, mode="vline"))
        marks = ln.run.series.marks
        if any(m.engine == ln.series.engine for m in marks):
            msrc = marks_source(ln)
            for p, y in ((tokens, "y_tokens"), (kv, "y_kv"), (queues, "y_queues")):
                r = p.scatter(x, y, source=msrc, marker="inverted_triangle", size=9, color=PREEMPT,
                              legend_label="preemption (▼, victims on hover)")
                p.add_tools(HoverTool(renderers=[r], tooltips=[("step", "@step"), ("preempted", "@n"),
                                                               ("victims", "@victims")]))
    if axis == "step":
        shown = 0
        for run in runs:
            for fs in run.findings:
                if fs.first_step is None or fs.last_step is None:
                    continue
                color = SEVERITY.get(fs.finding.severity, "#9e9e9e")
                for p in (tokens, kv, queues):
                    p.add_layout(BoxAnnotation(left=fs.first_step - 0.5, right=fs.last_step + 0.5,
                                               fill_color=color, fill_alpha=0.08, line_color=color, line_alpha=0.4))
                # one label per stretch, stacked from the bottom so that stretches starting together stay readable
                tokens.add_layout(Label(x=fs.first_step, y=0, y_units="data", text=fs.finding.id,
                                        text_font_size="8pt", text_color=color, y_offset=2 + 11 * (shown % 6),
                                        background_fill_color="white", background_fill_alpha=0.7))
                shown += 1
    for p in (tokens, kv, queues):
        _legend(p)
    kv.yaxis.formatter.update(use_scientific=False)
    return [tokens, kv, queues]


def _top_of(s: EngineSeries) -> float:
    top = max([*s.hi["budget"], *s.hi["scheduled"], 1.0])
    return float(top) * 1.04


def _queue_top(s: EngineSeries) -> float:
    return float(max([*s.hi["running"], *s.hi["waiting"], 1.0])) * 1.04


def _legend(p: Any, place: str = "above") -> None:
    """The figure's legend outside its plot (``above``: one line over it, so every
    timeline's plot area keeps the same width), a click hiding its series."""
    if not p.legend:
        return
    legend = p.legend[0]
    legend.click_policy = "hide"
    legend.label_text_font_size = "8pt"
    legend.spacing = 6 if place == "above" else 0
    legend.padding = 2
    legend.margin = 2
    legend.border_line_alpha = 0
    legend.glyph_height = legend.glyph_width = 14
    if place == "above":
        legend.orientation = "horizontal"
        legend.location = "top_left"
    p.center = [r for r in p.center if r is not legend]
    p.add_layout(legend, place)


def chunks_chart(runs: list[RunPage], x_range: Any) -> Any | None:
    """The longest prompts, one row each: the wait from arrival to the first chunk, each
    prefill chunk in its step (recompute chunks after a preemption darker), preemptions
    (✕), decoding to the finish; over steps, sharing the step timelines' x range."""
    rows: list[tuple[RunPage, PromptTrack]] = [(run, t) for run in runs for t in run.series.longest()]
    if not rows:
        return None
    multi = len(runs) > 1
    order = {id(run): i + 1 for i, run in enumerate(runs)}
    engines = {id(run): len(run.series.engines) > 1 for run in runs}
    factors = [(f"run {order[id(run)]} · " if multi else "") + (f"dp{t.engine} " if engines[id(run)] else "")
               + f"{t.req_id} ({t.prompt_len:,} tok)" for run, t in rows]
    factors = [f if f not in factors[:i] else f"{f} #{i}" for i, f in enumerate(factors)]  # a factor appears once
    p = figure(title="prefill chunks of the longest prompts (bar: a chunk in its step; hover for [start, end))",
               height=60 + CHUNKS_ROW_H * len(rows), sizing_mode="stretch_width", x_range=x_range,
               y_range=FactorRange(factors=list(reversed(factors))), tools=_tools(), toolbar_location="right",
               min_border_left=LEFT_BORDER)
    _active_drag(p)
    p.xaxis.axis_label = "step"
    chunk: dict[str, list[Any]] = {k: [] for k in ("x", "y", "start", "end", "tokens", "kind", "color")}
    wait: dict[str, list[Any]] = {k: [] for k in ("x0", "x1", "y")}
    decode: dict[str, list[Any]] = {k: [] for k in ("x0", "x1", "y")}
    pre: dict[str, list[Any]] = {k: [] for k in ("x", "y", "step")}
    for (_, t), y in zip(rows, factors):
        for step, _ts, start, end, resumed in t.chunks:
            chunk["x"].append(step)
            chunk["y"].append(y)
            chunk["start"].append(start)
            chunk["end"].append(end)
            chunk["tokens"].append(end - start)
            chunk["kind"].append("recompute" if resumed else "prefill")
            chunk["color"].append("#0b6e78" if resumed else PREFILL)
        if t.arrival_step is not None and t.chunks:
            wait["x0"].append(t.arrival_step - 0.5)
            wait["x1"].append(t.chunks[0][0] - 0.5)
            wait["y"].append(y)
        if t.chunks:
            end_step = t.finished_step if t.finished_step is not None else None
            if end_step is not None:
                decode["x0"].append(t.chunks[-1][0] + 0.5)
                decode["x1"].append(end_step + 0.5)
                decode["y"].append(y)
        for step, _ts in t.preemptions:
            pre["x"].append(step)
            pre["y"].append(y)
            pre["step"].append(step)
    p.segment("x0", "y", "x1", "y", source=ColumnDataSource(wait), color=WAITING, line_width=2, alpha=0.6,
              legend_label="waiting")
    p.segment("x0", "y", "x1", "y", source=ColumnDataSource(decode), color=DECODE, line_width=2, alpha=0.6,
              legend_label="decoding")
    bars = p.rect("x", "y", width=0.9, height=0.6, source=ColumnDataSource(chunk), color="color",
                  legend_label="prefill chunk")
    p.add_tools(HoverTool(renderers=[bars], tooltips=[("step", "@x"), ("chunk", "@kind [@start, @end)"),
                                                      ("tokens", "@tokens")]))
    if pre["x"]:
        p.scatter("x", "y", source=ColumnDataSource(pre), marker="x", size=12, line_width=2, color=PREEMPT,
                  legend_label="preempted")
    _legend(p)
    return p


def latency_charts(runs: list[RunPage]) -> list[Any]:
    """Per latency figure, the share of finished requests (y) that took at most x seconds,
    one curve per prompt-length class (and all requests), every run on the same axes;
    the median and p90 of each curve in its legend."""
    out = []
    dashes = ["solid", "dashed", "dotted", "dotdash"]
    for figure_name in LATENCY_FIGURES:
        p = figure(title=f"{LATENCY_TITLES[figure_name]}, by prompt-length class", height=LATENCY_H,
                   sizing_mode="stretch_width", tools=_tools(x_only=False), toolbar_location="right",
                   y_range=Range1d(start=0, end=1.02))
        p.toolbar.logo = None
        p.xaxis.axis_label = "seconds"
        p.yaxis.axis_label = "share of finished requests"
        items: list[Any] = []
        for run_i, run in enumerate(runs):
            curves = [c for c in run.latency if c.figure == figure_name and c.n]
            classes = [c for c in curves if c.cls != "all"]
            if len(classes) == 1:  # one class holds every request: its curve is the run's
                curves = classes
            for class_i, curve in enumerate(curves):
                # one run: a colour per class; several: a colour per run, a dash per class
                if len(runs) == 1:
                    color = "#333333" if curve.cls == "all" else Category10_10[class_i % 10]
                    dash = "solid"
                else:
                    color, dash = Category10_10[run_i % 10], dashes[class_i % len(dashes)]
                label = ((f"run {run_i + 1}: " if len(runs) > 1 else "") + f"{curve.cls} (n={curve.n:,}) "
                         f"p50 {fmt_duration(curve.dist.median)} · p90 {fmt_duration(curve.dist.p90)}")
                src = ColumnDataSource({"x": np.asarray(curve.values, dtype=np.float64),
                                        "y": np.asarray(curve.shares, dtype=np.float32)})
                r = p.step("x", "y", source=src, mode="after", color=color, line_width=2 if curve.cls == "all" else 1.5,
                           line_dash=dash)
                items.append((label, [r]))
                p.add_tools(HoverTool(renderers=[r], tooltips=[("", label), ("seconds", "@x{0.000}"),
                                                               ("share", "@y{0%}")]))
        if not items:
            continue
        # inside, bottom right: a distribution's curves rise from the bottom left to the top right
        legend = Legend(items=items, click_policy="hide", label_text_font_size="8pt", spacing=0,
                        location="bottom_right", background_fill_alpha=0.7)
        p.add_layout(legend)
        out.append(p)
    return out


#: A numeric setting's axis is logarithmic when its largest value is at least this many
#: times its least (positive) one.
LOG_SPAN = 8
#: A numeric setting's axis labels each value replayed when there are at most this many.
MAX_TICKS = 16
#: How each kind of sweep point is drawn: marker, size, label.
POINT_STYLE = {"recorded": ("square", 11, "recorded run"),
               "baseline": ("diamond", 13, "replay at the recorded settings"),
               "predicted": ("circle", 9, "predicted"), "real": ("triangle", 12, "real run at that setting")}


def _axis_value(v: Any) -> Any:
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def sweep_charts(sweep: Sweep) -> list[Any]:
    """Each figure of a ``whatif`` / ``tune`` result against its first changed setting: a
    line per value of the other settings through the predicted points, the replay at
    the recorded settings, the recorded run, real runs at a changed setting, each
    prediction's interval as a whisker where the result has one, ``tune``'s SLO as a
    line and its recommendation ringed."""
    if not sweep.keys:
        return []
    key = sweep.keys[0]
    others = sweep.keys[1:]
    values: list[Any] = [p.settings.get(key) for p in sweep.points if p.settings.get(key) is not None]
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    factors: list[str] = []
    if not numeric:
        for v in values:
            if str(v) not in factors:
                factors.append(str(v))
    out = []
    for name in sweep.figures:
        obj = OBJECTIVES.get(name)
        unit = obj.unit if obj is not None else ""
        kw: dict[str, Any] = {} if numeric else {"x_range": FactorRange(factors=factors)}
        if numeric and values and min(values) > 0 and max(values) >= LOG_SPAN * min(values):
            kw["x_axis_type"] = "log"  # 4, 8 … 64 sequences: each value gets room
        p = figure(title=f"{name} ({unit}) against {key}" + (f", by {', '.join(others)}" if others else ""),
                   height=SWEEP_H, sizing_mode="stretch_width", tools=_tools(x_only=False),
                   toolbar_location="right", **kw)
        p.toolbar.logo = None
        p.xaxis.axis_label = key
        p.yaxis.axis_label = f"{name} ({unit})" if unit else name
        ticks = sorted(set(values)) if numeric else []
        if 0 < len(ticks) <= MAX_TICKS:
            p.xaxis.ticker = ticks  # the values replayed, each labelled (a log axis labels only decades)
        _predicted_lines(p, sweep, name, key, others)
        _marked_points(p, sweep, name, key)
        _recommended_and_slos(p, sweep, name, key, values)
        _legend(p)
        out.append(p)
    return out


def _predicted_lines(p: Any, sweep: Sweep, name: str, key: str, others: list[str]) -> None:
    """A line per value of the other settings through the predicted points (the replay at
    the recorded settings on its group's line), hover and whiskers."""
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for pt in sweep.points:
        if pt.kind == "predicted":
            groups.setdefault(tuple(pt.settings.get(k) for k in others), []).append(pt)
    for pt in sweep.points:  # the replay at the recorded settings belongs on its group's line
        group = tuple(pt.settings.get(k) for k in others)
        if pt.kind == "baseline" and group in groups and all(q.settings.get(key) != pt.settings.get(key)
                                                             for q in groups[group]):
            groups[group].append(pt)
    for gi, (group, pts) in enumerate(sorted(groups.items(), key=lambda kv: str(kv[0]))):
        pts = sorted((pt for pt in pts if pt.settings.get(key) is not None and pt.figures.get(name) is not None),
                     key=lambda pt: (str(type(pt.settings[key])), pt.settings[key]))
        if not pts:
            continue
        color = Category10_10[gi % 10]
        glabel = ", ".join(f"{k}={v}" for k, v in zip(others, group)) or "predicted"
        src = ColumnDataSource({"x": [_axis_value(pt.settings[key]) for pt in pts],
                                "y": [pt.figures[name] for pt in pts],
                                "label": [pt.label for pt in pts],
                                "meets": ["yes" if pt.meets else "no" if pt.meets is False else "" for pt in pts]})
        p.line("x", "y", source=src, color=color, line_width=1.5, legend_label=glabel)
        r = p.scatter("x", "y", source=src, color=color, size=9, legend_label=glabel)
        p.add_tools(HoverTool(renderers=[r], tooltips=[("", "@label"), (name, "@y"), ("meets the SLOs", "@meets")]))
        _whiskers(p, pts, name, key, color)


def _marked_points(p: Any, sweep: Sweep, name: str, key: str) -> None:
    """The replay at the recorded settings, the recorded run and real runs, each in its
    :data:`POINT_STYLE`, with hover and whiskers."""
    for kind in ("baseline", "recorded", "real"):
        pts = [pt for pt in sweep.points if pt.kind == kind and pt.settings.get(key) is not None
               and pt.figures.get(name) is not None]
        if not pts:
            continue
        marker, size, label = POINT_STYLE[kind]
        color = {"baseline": "#555555", "recorded": "#000000", "real": PREEMPT}[kind]
        src = ColumnDataSource({"x": [_axis_value(pt.settings[key]) for pt in pts],
                                "y": [pt.figures[name] for pt in pts], "label": [pt.label for pt in pts]})
        r = p.scatter("x", "y", source=src, marker=marker, size=size, color=color, fill_alpha=0.6,
                      legend_label=label)
        p.add_tools(HoverTool(renderers=[r], tooltips=[("", "@label"), (name, "@y")]))
        _whiskers(p, pts, name, key, color)


def _whiskers(p: Any, pts: list[Any], name: str, key: str, color: str) -> None:
    """Each point's interval of ``name`` as a whisker, where the point has one."""
    with_iv = [pt for pt in pts if name in pt.intervals]
    if with_iv:
        wsrc = ColumnDataSource({"x": [_axis_value(pt.settings[key]) for pt in with_iv],
                                 "lo": [pt.intervals[name].lo for pt in with_iv],
                                 "hi": [pt.intervals[name].hi for pt in with_iv]})
        p.add_layout(Whisker(source=wsrc, base="x", lower="lo", upper="hi", line_color=color))
        for end in ("lo", "hi"):  # invisible: the y axis's automatic range takes in whole whiskers
            p.scatter("x", end, source=wsrc, alpha=0)


def _recommended_and_slos(p: Any, sweep: Sweep, name: str, key: str, values: list[Any]) -> None:
    """``tune``'s recommendation ringed and its SLOs on ``name`` as dashed lines."""
    rec = [pt for pt in sweep.points if pt.recommended and pt.figures.get(name) is not None
           and pt.settings.get(key) is not None]
    if rec:
        best: Any = rec[0].figures[name]
        p.scatter([_axis_value(rec[0].settings[key])], [best], marker="circle", size=22,
                  fill_alpha=0, line_color="#000000", line_width=2, legend_label="recommended")
    for slo in sweep.slos:
        if slo.get("figure") == name and isinstance(slo.get("value"), (int, float)):
            p.add_layout(Span(location=float(slo["value"]), dimension="width", line_color=PREEMPT,
                              line_dash="dashed", line_width=1.5))
            if values:  # an invisible point at the SLO: the y axis's automatic range takes it in
                p.scatter([_axis_value(values[0])], [float(slo["value"])], alpha=0)
            p.add_layout(Label(x=0, y=float(slo["value"]), x_units="screen", text=f"SLO {slo.get('op', '')} "
                               f"{slo['value']}", text_font_size="8pt", text_color=PREEMPT, y_offset=2))
