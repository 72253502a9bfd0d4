"""``vllm-probe report``'s page: one HTML file, every script inside it.

:func:`render` lays out what :mod:`vllm_probe.analysis.report` computed — each run's
header (command, vLLM release, effective settings, expected against effective, totals),
the doctor's findings (each with a link that zooms the step timelines to the stretch it
cites, which is also shaded there), the timelines over steps and over time, the
longest prompts' chunks, the latency distributions by class, and each ``whatif`` /
``tune`` result figure by figure — and embeds Bokeh's own JavaScript
(``bokeh.resources.INLINE``: only the bundles the charts need, about 1.3 MB), so the
page opens without a network. Bokeh was chosen over plotly (whose inline bundle is
about 4.8 MB, a page of its own beside the 5 MB a long run's report may take) and over
Altair/Vega (whose offline embedding needs another package, and whose data goes in as
JSON text where Bokeh writes typed arrays in binary).

Two small scripts of the page's own: one collects script errors into the page (an error
box, and ``data-count`` for a test to read), one writes how many charts Bokeh drew into
``#page-status`` (``data-roots``, ``data-canvases``) once it has, and ``vpZoom`` sets
the timelines' shared x range by name.

:func:`write` writes the page whole (a temporary renamed when complete, mode 0600:
:func:`vllm_probe.exporters.base.output_stream`).
"""

from __future__ import annotations

import html
import json
import time
from pathlib import Path
from typing import Any

import bokeh
from bokeh.embed import file_html
from bokeh.layouts import gridplot
from bokeh.resources import INLINE
from jinja2 import Template

from .. import __version__
from ..analysis.catalogue import BY_NAME
from ..analysis.text import fmt_duration, fmt_figure
from ..analysis.objectives import OBJECTIVES
from ..analysis.report import RunPage, Sweep
from ..analysis.summary_types import CONFIG_KEYS
from ..exporters.base import output_stream
from .charts import STEPS_RANGE, TIME_RANGE, chunks_chart, latency_charts, lines_of, sweep_charts, timelines

#: The totals the page shows, by catalogue name (a test compares them with ``summary --json``).
TOTALS = ("steps", "duration_s", "requests_added", "requests_finished", "prompt_tokens", "output_tokens",
          "scheduled_tokens", "prefill_tokens", "decode_tokens", "chunks", "preemptions", "requests_preempted",
          "discarded_tokens", "recomputed_tokens", "output_tokens_per_s")

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1500px;
       padding: 0 18px 40px; color: #222; }
h1 { font-size: 1.5em; margin: 18px 0 4px; } h2 { font-size: 1.2em; margin: 28px 0 6px;
     border-bottom: 1px solid #ddd; padding-bottom: 3px; } h3 { font-size: 1.02em; margin: 16px 0 4px; }
.sub { color: #666; font-size: 0.9em; } code, .mono { font-family: ui-monospace, Menlo, monospace; font-size: 0.92em; }
table { border-collapse: collapse; font-size: 0.9em; margin: 4px 0 10px; }
td, th { padding: 2px 10px 2px 0; text-align: left; vertical-align: top; } th { color: #555; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; } tr.differs td { background: #fff3e0; }
.grid { display: flex; flex-wrap: wrap; gap: 6px 40px; }
.finding { border-left: 4px solid #9e9e9e; padding: 4px 10px; margin: 6px 0; background: #fafafa; }
.finding.critical { border-color: #d62728; } .finding.warning { border-color: #ff9800; }
.sev { font-weight: 700; text-transform: uppercase; font-size: 0.8em; margin-right: 6px; }
.critical .sev { color: #d62728; } .warning .sev { color: #e68a00; } .info .sev { color: #777; }
.remedy { color: #333; font-size: 0.92em; margin-top: 2px; }
#page-errors { background: #fde0dc; color: #8a1c12; padding: 6px 10px; border: 1px solid #d62728; }
.note { color: #8a5a00; }
"""

#: Runs first in <head>: every script error on the page is collected and shown.
_ERRORS_JS = """
(function () {
  var errors = [];
  function show() {
    var box = document.getElementById("page-errors");
    if (!box || !errors.length) return;
    box.hidden = false;
    box.dataset.count = String(errors.length);
    box.textContent = "A script of this page failed (" + errors.length + "): " + errors.join(" | ");
  }
  function add(msg) { errors.push(String(msg)); show(); }
  window.addEventListener("error", function (e) { add(e.message || e); });
  window.addEventListener("unhandledrejection", function (e) { add(e.reason); });
  var original = console.error;
  console.error = function () {
    add(Array.prototype.join.call(arguments, " "));
    return original.apply(console, arguments);
  };
  document.addEventListener("DOMContentLoaded", show);
})();
function vpZoom(name, start, end, anchor) {
  var B = window.Bokeh;
  if (B && B.documents) {
    B.documents.forEach(function (doc) {
      var r = doc.get_model_by_name(name);
      if (r) { r.setv({start: start, end: end}); }
    });
  }
  var el = document.getElementById(anchor);
  if (el) { el.scrollIntoView(); }
  return false;
}
"""

#: Runs last: says in #page-status how many of the page's charts Bokeh has drawn (its root
#: views named ``chart-N`` that finished rendering) and how many canvases they hold, once
#: every chart is drawn (or after 10 s).
_STATUS_JS = """
(function () {
  var want = %d, tries = 0;
  function canvases(root) {
    var n = 0;
    root.querySelectorAll("*").forEach(function (el) {
      if (el.tagName === "CANVAS" && el.width > 0 && el.height > 0) n++;
      if (el.shadowRoot) n += canvases(el.shadowRoot);
    });
    return n;
  }
  function roots() {
    var B = window.Bokeh;
    if (!B || !B.index || !B.index.roots) return 0;
    return Array.from(B.index.roots).filter(function (v) {
      var name = v.model && v.model.name;
      return name && name.indexOf("chart-") === 0 && (!v.has_finished || v.has_finished());
    }).length;
  }
  var timer = setInterval(function () {
    tries++;
    var r = roots(), c = canvases(document);
    if ((r >= want && c >= want) || tries > 200) {
      clearInterval(timer);
      var s = document.getElementById("page-status");
      s.dataset.roots = String(r); s.dataset.canvases = String(c); s.dataset.done = "1";
      s.dataset.ms = String(Math.round(performance.now()));
      s.textContent = r + " of " + want + " charts drawn";
    }
  }, 50);
})();
"""

_TEMPLATE = Template("""{% from macros import embed %}<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{ title | e }}</title>
<script>{{ errors_js }}</script>
<style>{{ css }}</style>
{{ bokeh_css if bokeh_css }}
{{ bokeh_js if bokeh_js }}
</head>
<body>
<div id="page-errors" hidden></div>
{% for kind, value in blocks %}{% if kind == "html" %}{{ value }}{% else %}
<div class="chart">{{ embed(roots[value]) }}</div>
{% endif %}{% endfor %}
{{ plot_script }}
<script>{{ status_js }}</script>
</body>
</html>
""")


def _e(v: Any) -> str:
    return html.escape(str(v), quote=True)


def _path(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part, None) if not isinstance(obj, dict) else obj.get(part)
    return obj


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if unit == "s":
        return fmt_duration(v)
    if unit == "tokens/s":
        return f"{v:,.1f}"
    if isinstance(v, (bool, str)):
        return fmt_figure(v)
    if isinstance(v, float) and not v.is_integer():
        return f"{v:,.3g}"
    if isinstance(v, (int, float)):
        return f"{int(v):,}"
    return _e(v)


class _Page:
    """The page's blocks in order: HTML text, or the name of a Bokeh root."""

    def __init__(self) -> None:
        self.blocks: list[tuple[str, str]] = []
        self.models: list[Any] = []

    def html(self, text: str) -> None:
        self.blocks.append(("html", text))

    def chart(self, model: Any) -> None:
        model.name = f"chart-{len(self.models)}"
        self.models.append(model)
        self.blocks.append(("chart", model.name))


def render(runs: list[RunPage], sweeps: list[Sweep] | None = None, command: list[str] | None = None) -> str:
    """The report's HTML for ``runs`` (the first is the recorded run ``sweeps`` replayed;
    several runs are drawn side by side on the same axes)."""
    sweeps = sweeps or []
    page = _Page()
    labels = ", ".join(r.label for r in runs)
    page.html(f"<h1>vllm-probe report: {_e(labels)}</h1><div class='sub'>written "
              f"{_e(time.strftime('%Y-%m-%d %H:%M:%S'))} by vllm-probe {_e(__version__)}"
              + (f" · <span class='mono'>{_e(' '.join(command))}</span>" if command else "")
              + " · charts: Bokeh " + _e(bokeh.__version__) + ", inline (no network needed)</div>"
              + "<div id='page-status' class='sub'>charts not drawn yet (scripts off?)</div>")
    page.html(_header(runs))
    page.html("<h2 id='doctor'>Doctor</h2>" + "".join(_doctor(run, i, len(runs) > 1) for i, run in enumerate(runs)))
    page.html("<h2 id='timeline-steps'>Timeline over steps</h2><div class='sub'>Drag to zoom (box zoom), shift to "
              "pan, reset to go back; the legends hide a series on click. Each point is a bucket of consecutive steps"
              + _widths(runs) + ": the line is its mean, the band its least and largest step; every preempting step "
              "is marked (▼).</div>")
    lines = [ln for ln in lines_of(runs) if len(ln.series)]
    if lines:
        step_figs = timelines(runs, "step", lines)
        for fig in step_figs:
            page.chart(fig)
        chunks = chunks_chart(runs, step_figs[0].x_range)
        if chunks is not None:
            page.chart(chunks)
        page.html("<h2 id='timeline-time'>Timeline over time</h2>")
        for fig in timelines(runs, "time", lines):
            page.chart(fig)
    else:
        page.html("<p>No step events in the run (the probe's log_schedule_each_step was off): no timeline.</p>")
    page.html("<h2 id='latency'>Latency distributions</h2><div class='sub'>Per finished request; a curve at (x, y): "
              "a share y of the class took at most x seconds. Classes by prompt length: "
              + _e("; ".join(dict.fromkeys(_classes(r) for r in runs))) + ".</div>")
    page.html(_latency_table(runs))
    figs = latency_charts(runs)
    if figs:
        page.chart(gridplot(figs, ncols=2, sizing_mode="stretch_width", toolbar_location="right"))
    for sweep in sweeps:
        page.html(_sweep_header(sweep))
        figs = sweep_charts(sweep)
        if figs:
            page.chart(gridplot(figs, ncols=2, sizing_mode="stretch_width", toolbar_location="right"))
    return file_html(page.models, resources=INLINE, title=f"vllm-probe report: {labels}", template=_TEMPLATE,
                     template_variables={"blocks": page.blocks, "css": _CSS, "errors_js": _ERRORS_JS,
                                         "status_js": _STATUS_JS % len(page.models)})


def write(out: str | Path, text: str) -> None:
    """Write the page to ``out`` whole (0600; ``-``: stdout).

    Raises:
        OSError: it cannot be written (nothing is left under its name).
    """
    with output_stream(out) as f:
        f.write(text.encode("utf-8"))


def _widths(runs: list[RunPage]) -> str:
    widths = sorted({s.width for r in runs for s in r.series.engines.values()})
    if widths == [1]:
        return " (here one step each: the run is short enough to draw every step)"
    return " (" + " / ".join(f"{w:,}" for w in widths) + " steps each here)"


def _classes(run: RunPage) -> str:
    c = run.summary.latency_classes
    parts = []
    for cls in c.classes:
        lo, hi = cls.low, cls.high
        parts.append(f"{cls.name} " + (f"≤{hi:,}" if (lo or 1) <= 1 and hi is not None else
                                       f">{(lo or 1) - 1:,}" if hi is None else f"{lo:,}–{hi:,}") + " tok")
    return ", ".join(parts) + f" (from the {c.basis})"


def _cols(runs: list[RunPage]) -> str:
    if len(runs) == 1:
        return f"<th>{_e(runs[0].label)}</th>"
    return "".join(f"<th>run {i + 1}: {_e(r.label)}</th>" for i, r in enumerate(runs))


def _header(runs: list[RunPage]) -> str:
    out = ["<h2 id='runs'>Run" + ("s" if len(runs) > 1 else "") + "</h2><div class='grid'>"]
    rows = []
    for name, get in (
        ("command", lambda r: " ".join(r.meta.get("command") or []) or "-"),
        ("vLLM release", lambda r: r.summary.config.get("vllm_version", "-")),
        ("platform", lambda r: _engine_field(r, "platform")),
        ("host", lambda r: r.meta.get("host") or "-"),
        ("started", lambda r: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.meta["start_time"]))
         if r.meta.get("start_time") else "-"),
        ("exit code", lambda r: r.meta.get("exit_code", "-")),
        ("engine cores", lambda r: r.summary.engines),
        ("simulated (a whatif replay)", lambda r: "yes" if r.meta.get("simulated") else "no"),
        ("events read", lambda r: r.summary.read.get("text", "-")),
    ):
        rows.append(f"<tr><th>{_e(name)}</th>" + "".join(f"<td class='mono'>{_e(get(r))}</td>" for r in runs)
                    + "</tr>")
    notes = [f"<div class='note'>{_e(r.label)}: {_e(r.summary.retention)}</div>" for r in runs if r.summary.retention]
    out.append("<div><h3>Run</h3><table><tr><th></th>" + _cols(runs) + "</tr>" + "".join(rows) + "</table>"
               + "".join(notes) + "</div>")
    # effective settings, side by side; a row differs when the runs do
    rows = []
    for key in CONFIG_KEYS:
        values = [r.summary.config.get(key) for r in runs]
        if all(v is None for v in values):
            continue
        cls = " class='differs'" if len({json.dumps(v) for v in values}) > 1 else ""
        rows.append(f"<tr{cls}><th>{_e(key)}</th>" + "".join(f"<td class='num'>{_fmt(v)}</td>" for v in values)
                    + "</tr>")
    out.append("<div><h3>Effective settings (engine_config)</h3><table><tr><th></th>" + _cols(runs) + "</tr>"
               + "".join(rows) + "</table></div>")
    rows = []
    for key in TOTALS:
        figure = BY_NAME[key]
        label, unit = figure.label, figure.unit
        cells = []
        for i, r in enumerate(runs):
            v = _path(r.summary, figure.summary_path or key)
            raw = "" if v is None else repr(v) if isinstance(v, float) else str(v)
            cells.append(f"<td class='num' data-total='{key}' data-run='{i}' data-value='{_e(raw)}'>"
                         f"{_fmt(v, unit)}</td>")
        rows.append(f"<tr><th>{_e(label)}</th>" + "".join(cells) + "</tr>")
    out.append("<div><h3>Totals</h3><table><tr><th></th>" + _cols(runs) + "</tr>" + "".join(rows) + "</table></div>")
    out.append("</div>")
    for r in runs:
        exp = r.summary.expected
        if not exp:
            continue
        rows = [f"<tr{' class=differs' if c.get('status') == 'differs' else ''}><td class='mono'>{_e(c.get('setting'))}"
                f"</td><td>{_fmt(c.get('expected'))}</td><td>{_fmt(c.get('effective'))}</td><td>{_e(c.get('status'))}"
                f"</td><td>{_e(c.get('note') or '')}</td></tr>" for c in exp.get("checks") or []]
        out.append(f"<h3>{_e(r.label)}: expected ({_e(exp.get('source') or 'settings file')}) against effective</h3>"
                   "<table><tr><th>setting</th><th>expected</th><th>effective</th><th></th><th></th></tr>"
                   + "".join(rows) + "</table>")
    return "".join(out)


def _engine_field(run: RunPage, name: str) -> Any:
    cfg = run.state.config
    return getattr(cfg, name, None) or "-" if cfg is not None else "-"


def _doctor(run: RunPage, index: int, multi: bool) -> str:
    out = [f"<h3>{_e(run.label)}</h3>" if multi else ""]
    if run.doctor.all_clear:
        out.append(f"<p>{_e(run.doctor.all_clear)}</p>")
    if not run.findings:
        out.append("<p>No finding.</p>")
    for fs in run.findings:
        f = fs.finding
        link = ""
        if fs.first_step is not None and fs.last_step is not None:
            margin = max((fs.last_step - fs.first_step) // 10, 5)
            where = f"steps {fs.first_step:,}–{fs.last_step:,}" + (f" (dp{fs.engine})" if fs.engine is not None else "")
            link = (f" <a href='#timeline-steps' data-first='{fs.first_step}' data-last='{fs.last_step}' "
                    f"onclick=\"return vpZoom('{STEPS_RANGE}', {fs.first_step - margin}, {fs.last_step + margin}, "
                    f"'timeline-steps')\">show {where} on the timeline</a>")
        remedy = ""
        if f.remedy is not None:
            r = f.remedy
            remedy = (f"<div class='remedy'>change <span class='mono'>{_e(r.setting)} = {_e(r.value)}</span>: "
                      f"{_e(r.arithmetic)}" + (f"; trade-off: {_e(r.tradeoff)}" if r.tradeoff else "") + "</div>")
        out.append(f"<div class='finding {_e(f.severity)}' data-finding='{_e(f.id)}' data-run='{index}'>"
                   "<span class='sev'>"
                   f"{_e(f.severity)}</span><b class='mono'>{_e(f.id)}</b> {_e(f.message)}{link}{remedy}</div>")
    plan = run.doctor.to_dict().get("plan")
    if plan:
        out.append(_plan(plan))
    return "".join(out)


def _plan(plan: Any) -> str:
    """The doctor's plan (``doctor --json``'s ``plan``): the settings as ``vllm serve`` flags
    and ``LLM(...)`` arguments, replayed or arithmetic, what it clears and leaves and why,
    each figure against the replay at the recorded settings with its direction and interval,
    its cost and the rerun that checks it."""
    if not isinstance(plan, dict):
        return f"<h3>Plan</h3><pre>{_e(json.dumps(plan, indent=1, default=str))}</pre>"
    how = "replayed" if plan.get("checked") else "the rules' arithmetic, not checked by the replay"
    parts = [f"<h3>Plan <span class='sub'>({_e(how)})</span></h3>"]
    settings = plan.get("settings")
    if isinstance(settings, dict) and settings:
        parts.append("<div>apply <span class='mono'>" + _e(", ".join(f"{k} = {v}" for k, v in settings.items()))
                     + "</span></div>")
    flags = plan.get("flags")
    if isinstance(flags, list) and flags:
        parts.append("<div>vllm serve <span class='mono'>" + _e(" ".join(map(str, flags))) + "</span></div>")
    args = plan.get("engine_args")
    if isinstance(args, dict) and args:
        parts.append("<div><span class='mono'>LLM(..., " + _e(", ".join(f"{k}={v!r}" for k, v in args.items()))
                     + ")</span></div>")
    if plan.get("conflict"):
        parts.append(f"<div class='warn'>{_e(plan['conflict'])}</div>")
    clears = plan.get("clears")
    if isinstance(clears, list) and clears:
        parts.append(f"<div>clears: <span class='mono'>{_e(', '.join(map(str, clears)))}</span></div>")
    left = plan.get("left_because")
    why: dict[str, Any] = left if isinstance(left, dict) else {}
    for fid in plan.get("leaves") or []:
        parts.append(f"<div>leaves <span class='mono'>{_e(fid)}</span>: {_e(why.get(fid, ''))}</div>")
    predicted = plan.get("predicted")
    if isinstance(predicted, dict) and predicted:
        rows = []
        for name, v in predicted.items():
            v = v if isinstance(v, dict) else {"predicted": v}
            unit = v.get("unit") or (OBJECTIVES[name].unit if name in OBJECTIVES else "")
            iv = v.get("interval") if isinstance(v.get("interval"), dict) else None
            cells = "".join(f"<td class='num'>{_fmt(v.get(k), unit)}</td>"
                            for k in ("recorded", "baseline", "predicted"))
            cells += ("<td class='num'>" + (f"{_fmt(iv.get('lo'), unit)}–{_fmt(iv.get('hi'), unit)}" if iv else "")
                      + f"</td><td>{_e(v.get('direction') or '')}</td>")
            rows.append(f"<tr><th class='mono'>{_e(name)}</th>{cells}</tr>")
        parts.append("<table><tr><th></th><th>recorded</th><th>baseline (replay)</th><th>predicted</th>"
                     "<th>interval</th><th>against the baseline</th></tr>" + "".join(rows) + "</table>")
    for key, label in (("cost", "cost"), ("rerun", "check")):
        for line in plan.get(key) or []:
            parts.append(f"<div>{label}: <span class='mono'>{_e(line)}</span></div>")
    return "".join(parts)


def _latency_table(runs: list[RunPage]) -> str:
    """One row per run and class: finished requests, then per figure median · p90 · max."""
    from ..analysis.report import LATENCY_FIGURES
    from .charts import LATENCY_TITLES

    head = "".join(f"<th>{_e(LATENCY_TITLES[f])}<br><span class='sub'>median · p90 · max</span></th>"
                   for f in LATENCY_FIGURES)
    rows = []
    for i, r in enumerate(runs):
        by = {(c.cls, c.figure): c for c in r.latency}
        for cls in dict.fromkeys(c.cls for c in r.latency):
            n = by[(cls, LATENCY_FIGURES[0])].n if (cls, LATENCY_FIGURES[0]) in by else 0
            if not n:
                continue
            cells = []
            for f in LATENCY_FIGURES:
                c = by.get((cls, f))
                d = c.dist if c is not None else None
                cells.append("<td class='num'>" + (" · ".join(fmt_duration(v) for v in (d.median, d.p90, d.max))
                                                   if d is not None and d.n else "-") + "</td>")
            who = _e(r.label) if len(runs) == 1 else f"run {i + 1}"
            rows.append(f"<tr><td>{who}</td><td>{_e(cls)}</td><td class='num' data-latency='{_e(cls)}' "
                        f"data-run='{i}' data-n='{n}'>{n:,}</td>" + "".join(cells) + "</tr>")
    return ("<table><tr><th>run</th><th>class</th><th>requests</th>" + head + "</tr>" + "".join(rows)
            + "</table>")


def _sweep_header(sweep: Sweep) -> str:
    title = f"{sweep.tool}: " + (", ".join(sweep.keys) or "no setting changed")
    kinds = {p.kind for p in sweep.points}
    with_iv = any(p.intervals for p in sweep.points)
    lines = [f"<h2 id='{_e(sweep.tool)}'>{_e(title)}</h2><div class='sub'>{_e(sweep.path)}"
             + (f" · replays of {_e(sweep.source)}" if sweep.source else "") + "</div><div class='sub'>"
             + "; ".join(s for s in (
                 "predicted: one replay through vLLM's scheduler per setting",
                 "baseline (◆): the replay at the recorded settings" if "baseline" in kinds else "",
                 "recorded (■): the recorded run" if "recorded" in kinds else "",
                 "real (▲): a run of this report recorded at that setting" if "real" in kinds else "",
                 "whiskers: each prediction's interval" if with_iv else "no interval in this result",
             ) if s) + ".</div>"]
    if sweep.slos:
        lines.append("<div>SLOs: <span class='mono'>" + _e(", ".join(f"{s['figure']} {s.get('op', '')} {s.get('value')}"
                                                                    for s in sweep.slos)) + "</span></div>")
    rec = [p for p in sweep.points if p.recommended]
    if rec:
        lines.append("<div>recommended: <span class='mono'>" + _e(rec[0].label) + "</span></div>")
    for note in sweep.notes[:6]:
        lines.append(f"<div class='note'>{_e(note)}</div>")
    return "".join(lines)


__all__ = ["TIME_RANGE", "TOTALS", "render", "write"]
