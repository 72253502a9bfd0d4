"""The live scheduling dashboard: a rich view over :class:`vllm_probe.analysis.state.RunState`.

Pure: :func:`render_dashboard` turns a state (plus the run's ``meta.json`` and the
reader's :class:`~vllm_probe.runs.reader.ReadStats`) into one rich renderable sized for a
terminal of ``width`` × ``height`` cells. No I/O, no clock, no event handling: the
caller (``vllm-probe tail``, ``vllm-probe run --live``) owns the loop, reads events,
updates the state and passes ``now``.

Sections, in priority order when the terminal is short:

* header — command, run status, vLLM version, the effective scheduler config
  (``engine_config``), elapsed time, step rate, time inside ``schedule()``, events read
  and lines skipped;
* current step — scheduled tokens against the token budget, split into prefill and
  decode; running and waiting queues; KV-cache use; which limit held the step back
  (one row per engine core when there are several data-parallel ranks);
* rolling chart of the last steps — prefill and decode tokens per step stacked
  against the token budget (the chart's top), KV-cache use and the waiting queue;
* preemptions — total, rate, discarded and recomputed tokens, latest preemptions;
* prefills in flight — per request a progress bar of the pass, chunk i, ``[start, end)``;
* requests — most interesting first: preempted, prefilling, longest waiting, decoding
  (preempted ones first), then recently finished.

Below :data:`MIN_FULL_WIDTH` × :data:`MIN_FULL_HEIGHT` cells a compact view shows the
key figures and says how large the terminal should be.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from ..runs.reader import ReadStats
from ..analysis.state import (
    DECODE, FINISHED, PREEMPTED, PREFILL, WAITING,
    EngineState, RequestState, RunState, StepRecord, WindowStats,
)

#: Below this many columns or rows the compact view is shown.
MIN_FULL_WIDTH = 70
MIN_FULL_HEIGHT = 20
#: From this many columns on, the middle of the dashboard has two columns.
WIDE_WIDTH = 140
#: Rows of the token chart when the terminal is tall enough (and its minimum).
CHART_ROWS, CHART_MIN_ROWS = 8, 2
#: Latest preemptions listed (at most).
PREEMPT_ROWS = 5
#: Seconds without a new event after which the header says "last event … ago" (s).
STALE_AFTER_S = 2.0

PREFILL_STYLE = "cyan"
DECODE_STYLE = "green"
PREEMPT_STYLE = "bold red"
KV_STYLE = "yellow"
WAITING_STYLE = "magenta"
WARN_STYLE = "bold yellow"
PHASE_STYLE = {
    PREEMPTED: "bold red", PREFILL: PREFILL_STYLE, WAITING: WAITING_STYLE,
    DECODE: DECODE_STYLE, FINISHED: "dim",
}
LIMIT_LABEL = {"token_budget": "token budget", "max_num_seqs": "max_num_seqs",
               "kv_cache": "KV cache", "none": "nothing (queue empty)"}
_EIGHTHS = " ▁▂▃▄▅▆▇█"


@dataclass
class View:
    """What the caller knows besides the state (all optional).

    Attributes:
        status: one-line run status, e.g. ``"running (pid 123)"``, ``"finished, exit 0"``.
        status_style: rich style of the status.
        run_dir: where the events are read from.
        truncated: lines cut off at the end of a finished file (writer stopped mid-line).
        log_tail: last lines of the command's output (``run --live``), shown while no
            event has arrived yet and when the command failed.
        notice: a message shown prominently (e.g. "no events yet in …").
        engine: show only this data-parallel rank (None: all).
        chart_steps: steps shown by the rolling chart (None: one step per column; more
            than the chart's columns: several steps per column, averaged).
    """

    status: str = ""
    status_style: str = "bold"
    run_dir: str = ""
    truncated: int = 0
    log_tail: Sequence[str] = ()
    notice: str | None = None
    engine: int | None = None
    chart_steps: int | None = None


# -- formatting -------------------------------------------------------------------------


def _n(v: int | float | None) -> str:
    """Integer with thousands separators; '-' when unknown."""
    return "-" if v is None else f"{int(v):,}"


def _pct(v: float | None) -> str:
    """A share 0..1 as a percentage (one decimal below 10%)."""
    if v is None:
        return "-"
    return f"{100 * v:.1f}%" if 0 < v < 0.1 else f"{100 * v:.0f}%"


def fmt_duration(s: float | None) -> str:
    """Seconds as ``850 ms``, ``2.31 s``, ``1m 05s``, ``2h 03m``; '-' when unknown."""
    if s is None:
        return "-"
    if s < 1.0:
        return f"{s * 1000:.0f} ms"
    if s < 60:
        return f"{s:.2f} s"
    if s < 3600:
        return f"{int(s // 60)}m {int(s % 60):02d}s"
    return f"{int(s // 3600)}h {int(s % 3600 // 60):02d}m"


def _us(v: float | None) -> str:
    """Microseconds as ``310 µs`` or ``1.20 ms``."""
    if v is None:
        return "-"
    return f"{v:.0f} µs" if v < 1000 else f"{v / 1000:.2f} ms"


def _line(*parts: Any) -> Text:
    """One line that never wraps (cut with an ellipsis): keeps section heights exact."""
    t = Text.assemble(*parts, no_wrap=True, overflow="ellipsis")
    t.no_wrap = True
    t.overflow = "ellipsis"
    return t


def _sep() -> tuple[str, str]:
    return (" · ", "dim")


def _table(columns: Sequence[tuple[str, str, str]], rows: Sequence[Sequence[Any]], max_width: int,
           flex: int = 0) -> Table:
    """A borderless rich Table with fixed column widths taken from the cells' lengths.

    ``columns``: (header, justify, style). Cells are ``str`` (no markup), ``Text`` or
    other renderables of a known width (given as ``(renderable, width)``). Fixed widths
    spare rich from measuring every cell on every frame; when the columns are wider
    than ``max_width``, column ``flex`` (the request id) is cut with an ellipsis.
    """
    cells = [[c if isinstance(c, (Text, tuple)) else Text(str(c)) for c in row] for row in rows]
    widths = [len(h) for h, _, _ in columns]
    for row in cells:
        for i, c in enumerate(row):
            w = c[1] if isinstance(c, tuple) else c.cell_len
            if w > widths[i]:
                widths[i] = w
    over = sum(widths) + 2 * len(widths) - max_width
    if over > 0:
        widths[flex] = max(widths[flex] - over, 4)
    t = Table(box=None, padding=(0, 1), header_style="bold dim", expand=False, show_edge=False)
    for (header, justify, style), w in zip(columns, widths):
        t.add_column(header, justify=justify, style=style, width=w, no_wrap=True, overflow="ellipsis")
    for row in cells:
        t.add_row(*(c[0] if isinstance(c, tuple) else c for c in row))
    return t


# -- small rich pieces --------------------------------------------------------------------


def budget_bar(prefill: int | None, decode: int | None, scheduled: int, budget: int, width: int) -> Text:
    """A bar ``width`` cells wide: prefill cells, then decode cells, then the unused budget."""
    width = max(width, 1)
    if budget <= 0:
        return Text("?" * width, style="dim")
    if prefill is None or decode is None:  # split not logged: show the total only
        prefill, decode = 0, scheduled
    p_cells = round(width * min(prefill, budget) / budget)
    d_cells = round(width * min(prefill + decode, budget) / budget) - p_cells
    if decode and d_cells == 0 and p_cells + d_cells < width:
        d_cells = 1  # a few decode tokens stay visible next to a large prefill
    if prefill and p_cells == 0:
        p_cells = 1
    p_cells = min(p_cells, width)
    d_cells = max(min(d_cells, width - p_cells), 0)
    t = Text(no_wrap=True)
    t.append("█" * p_cells, PREFILL_STYLE)
    t.append("█" * d_cells, DECODE_STYLE)
    t.append("░" * (width - p_cells - d_cells), "dim")
    return t


def _level_cell(level: float) -> str:
    """Glyph for a fill level of one cell (0..1)."""
    return _EIGHTHS[max(0, min(8, round(level * 8)))]


def token_chart(recs: Sequence[StepRecord], rows: int) -> list[Text]:
    """Stacked columns, one per step: prefill (bottom) and decode (on top) tokens.

    The chart's height is the step's token budget. A non-zero part is drawn at least
    one eighth of a row high so that a handful of decode tokens next to a large prefill
    stays visible.
    """
    rows = max(rows, 1)
    full = rows * 8
    cols: list[tuple[int, int]] = []
    for r in recs:
        budget = r.budget or max(r.scheduled, 1)
        if r.prefill_tokens is None or r.decode_tokens is None:
            p, d = 0, r.scheduled
        else:
            p, d = r.prefill_tokens, r.decode_tokens
        pe = round(full * min(p, budget) / budget)
        te = round(full * min(p + d, budget) / budget)
        if p and pe == 0:
            pe = 1
        if d and te <= pe:
            te = min(pe + 1, full)
        cols.append((pe, max(te, pe)))
    lines = []
    for row in range(rows - 1, -1, -1):
        base = row * 8
        t = Text(no_wrap=True)
        for pe, te in cols:
            pf = min(max(pe - base, 0), 8)
            tf = min(max(te - base, 0), 8)
            if tf == 0:
                t.append(" ")
            elif pf == 8:
                t.append("█", PREFILL_STYLE)
            elif pf == 0:
                t.append(_EIGHTHS[tf], DECODE_STYLE)
            elif tf - pf >= 4 or tf == 8:
                t.append(_EIGHTHS[pf], f"{PREFILL_STYLE} on {DECODE_STYLE}")
            else:
                t.append(_EIGHTHS[pf], PREFILL_STYLE)
        lines.append(t)
    return lines


def spark(values: Iterable[float], top: float, style: str) -> Text:
    """One row, one glyph per value, scaled to ``top`` (blank for 0)."""
    t = Text(no_wrap=True)
    top = top or 1.0
    t.append("".join(" " if v <= 0 else _EIGHTHS[max(1, min(8, round(8 * v / top)))] for v in values), style)
    return t


# -- sections -----------------------------------------------------------------------------


def _header(state: RunState, meta: dict, stats: ReadStats | None, view: View, now: float,
            compact: bool = False) -> tuple[Panel, int]:
    cmd = " ".join(str(c) for c in meta.get("command") or []) or view.run_dir or "?"
    cfg = state.config or {}
    lines: list[Text] = []
    status = Text(view.status or "", style=view.status_style)
    lines.append(_line(status, ("  " if view.status else ""), (view.run_dir, "dim")))
    if cfg:
        kv_tok = cfg.get("kv_capacity_tokens")
        cfg_a = [
            ("vLLM ", "dim"), (str(cfg.get("vllm_version", "?")), "bold"), _sep(),
            str(cfg.get("scheduler_class", "?")), _sep(),
            ("token budget ", "dim"), (_n(cfg.get("max_num_batched_tokens")), "bold"), (" tok", "dim"), _sep(),
            ("max_num_seqs ", "dim"), _n(cfg.get("max_num_seqs")), _sep(),
            ("max_model_len ", "dim"), _n(cfg.get("max_model_len")),
            *((_sep(), ("data-parallel ranks ", "dim"), str(cfg.get("data_parallel_size")))
              if (cfg.get("data_parallel_size") or 1) > 1 else ()),
        ]
        cfg_b = [
            ("chunked prefill ", "dim"), "on" if cfg.get("enable_chunked_prefill") else "off",
            (f" (cap {_n(cfg.get('long_prefill_token_threshold'))} tok)"
             if cfg.get("long_prefill_token_threshold") else ""), _sep(),
            ("KV cache ", "dim"), (f"{_n(kv_tok)} tok", "bold"),
            (f" ({_n(cfg.get('num_kv_blocks'))} blocks × {_n(cfg.get('block_size'))}, 1 reserved)", "dim"), _sep(),
            ("policy ", "dim"), str(cfg.get("scheduling_policy", "?")), _sep(),
            ("prefix caching ", "dim"), "on" if cfg.get("prefix_caching") else "off", _sep(),
            ("async scheduling ", "dim"), "on" if cfg.get("async_scheduling") else "off",
        ]
        if compact:
            lines.append(_line(*cfg_a, _sep(), *cfg_b))
        else:
            lines += [_line(*cfg_a), _line(*cfg_b)]
    else:
        lines.append(_line(("no engine_config yet (engine core starting, or the run has no events)", "dim")))
    start = meta.get("start_time") or state.first_ts
    end = meta.get("end_time")
    elapsed = ((end if end else now) - start) if start else None
    steps = state.total("steps") if state.engines else 0
    rates = [e.window_stats() for e in state.engines.values()]
    step_rate = sum(r.step_rate or 0 for r in rates) if rates else None
    sched = [r for r in rates if r.schedule_us_mean is not None]
    sched_mean = sum(r.schedule_us_mean for r in sched) / len(sched) if sched else None
    sched_max = max((r.schedule_us_max for r in sched), default=None)
    stepping = state.stepping_s()  # the command's elapsed time also holds the engine's start
    parts: list[Any] = [("elapsed ", "dim"), fmt_duration(elapsed), _sep(),
                        (_n(steps), "bold"), (" steps", "dim"),
                        *([(" in ", "dim"), fmt_duration(stepping)] if stepping is not None else []), _sep(),
                        f"{step_rate:.1f}" if step_rate else "-", (" steps/s recent", "dim"), _sep(),
                        ("schedule() ", "dim"), _us(sched_mean), (" mean, ", "dim"), _us(sched_max), (" max", "dim")]
    warnings: list[Any] = []
    if stats is not None:
        parts += [_sep(), (_n(stats.events), ""), (" events", "dim")]
        skipped = stats.skipped + view.truncated
        if skipped:
            what = [f"{n} {w}" for n, w in ((stats.malformed, "malformed"), (stats.partial + view.truncated, "truncated"),
                                           (stats.unknown_kind, "unknown kind")) if n]
            warnings.append((f"{skipped} lines skipped ({', '.join(what)})", WARN_STYLE))
        if stats.newer_schema:
            warnings.append((f"{stats.newer_schema} events with a newer schema", WARN_STYLE))
    dropped = sum(e.events_dropped for e in state.engines.values())
    if dropped:
        warnings.append((f"the probe dropped {dropped:,} events", WARN_STYLE))
    disabled = sorted({h for e in state.engines.values() for h in e.hooks_disabled})
    if disabled:
        warnings.append((f"hooks switched off after errors: {', '.join(disabled)}", WARN_STYLE))
    if state.last_ts is not None and not end and now - state.last_ts > STALE_AFTER_S:
        parts += [_sep(), (f"last event {fmt_duration(now - state.last_ts)} ago", "dim italic")]
    lines.append(_line(*parts))
    if warnings:
        joined: list[Any] = [("warning: ", WARN_STYLE)]
        for i, w in enumerate(warnings):
            joined += ([_sep()] if i else []) + [w]
        lines.append(_line(*joined))
    title = Text.assemble(("vllm-probe ", "bold"), (cmd, ""), no_wrap=True, overflow="ellipsis")
    return Panel(Group(*lines), title=title, title_align="left", box=box.ROUNDED, padding=(0, 1)), len(lines) + 2


def _limit_shares(ws: WindowStats) -> str:
    if not ws.steps:
        return ""
    parts = [f"{LIMIT_LABEL[k].split(' (')[0]} {100 * v / ws.steps:.0f}%"
             for k, v in sorted(ws.bound_counts.items(), key=lambda kv: -kv[1]) if v]
    return f"last {ws.steps} steps: " + ", ".join(parts)


def _current_single(eng: EngineState, width: int) -> tuple[Panel, int]:
    ev = eng.latest or {}
    cfg = eng.config or {}
    scheduled = ev.get("scheduled_tokens", 0)
    budget = ev.get("token_budget") or cfg.get("max_num_batched_tokens") or 0
    pt, dt = ev.get("prefill_tokens"), ev.get("decode_tokens")
    inner = max(width - 4, 10)
    split = (f"{_n(pt)} prefill + {_n(dt)} decode = " if pt is not None and dt is not None else "")
    figures = Text.assemble((split, ""), (f"{scheduled:,}", "bold"), f" / {_n(budget)} tok ",
                            (f"({_pct(scheduled / budget) if budget else '-'})", "bold"))
    bar_w = max(min(inner - figures.cell_len - 1, 60), 8)  # the figures matter more than the bar
    l1 = _line(budget_bar(pt, dt, scheduled, budget, bar_w), " ", figures)
    l2 = _line(("prefill ", PREFILL_STYLE), f"{_n(pt)} tok in {_n(ev.get('prefill_reqs'))} req", _sep(),
               ("decode ", DECODE_STYLE), f"{_n(dt)} tok in {_n(ev.get('decode_reqs'))} req", _sep(),
               ("admitted ", "dim"), _n(ev.get("new_reqs")), _sep(),
               ("running ", "dim"), (_n(ev.get("running")), "bold"), _sep(),
               ("waiting ", WAITING_STYLE), (_n(ev.get("waiting")), "bold"),
               *((_sep(), (f"preempted {len(ev.get('preempted') or [])}", PREEMPT_STYLE)) if ev.get("preempted") else ()))
    kv = ev.get("kv_usage")
    free = ev.get("free_blocks")
    bs = cfg.get("block_size")
    kv_bar = ProgressBar(total=1.0, completed=kv or 0.0, width=12, complete_style=KV_STYLE, finished_style="bold red")
    ws = eng.window_stats()
    bound = eng.window[-1].bound if eng.window else None
    kv_row = Table.grid(padding=(0, 1))
    kv_row.add_column(no_wrap=True)
    kv_row.add_column(no_wrap=True, overflow="ellipsis")
    kv_row.add_row(kv_bar, _line(
        ("KV cache ", KV_STYLE), (_pct(kv), "bold"), _sep(),
        f"{_n(free)} free blocks" + (f" = {_n(free * bs)} tok" if free is not None and bs else ""), _sep(),
        ("held back by ", "dim"), (LIMIT_LABEL.get(bound, "-") if bound else "-", "bold"),
        ("  (" + _limit_shares(ws) + ")" if ws.steps else "", "dim")))
    title = Text.assemble(("step ", ""), (_n(ev.get("step")) if ev else "-", "bold"),
                          (f"  engine core {eng.engine}" if eng.engine else "", "dim"))
    return Panel(Group(l1, l2, kv_row), title=title, title_align="left", padding=(0, 1)), 5


def _current_multi(engines: list[EngineState], width: int) -> tuple[Panel, int]:
    t = Table(box=None, padding=(0, 1), expand=False, header_style="bold dim")
    for name, kw in (("dp", {"justify": "right"}), ("step", {"justify": "right"}), ("tokens / budget", {}),
                     ("prefill", {"justify": "right", "style": PREFILL_STYLE}),
                     ("decode", {"justify": "right", "style": DECODE_STYLE}),
                     ("run", {"justify": "right"}), ("wait", {"justify": "right", "style": WAITING_STYLE}),
                     ("KV", {"justify": "right", "style": KV_STYLE}), ("preempt", {"justify": "right", "style": "red"}),
                     ("steps/s", {"justify": "right"}), ("held back by", {})):
        t.add_column(name, no_wrap=True, overflow="ellipsis", **kw)
    bar_w = max(min(width - 90, 30), 6)
    for eng in engines:
        ev = eng.latest or {}
        ws = eng.window_stats()
        sched, budget = ev.get("scheduled_tokens", 0), ev.get("token_budget") or 0
        bound = eng.window[-1].bound if eng.window else None
        t.add_row(str(eng.engine), _n(ev.get("step")),
                  Text.assemble(budget_bar(ev.get("prefill_tokens"), ev.get("decode_tokens"), sched, budget, bar_w),
                                f" {sched:,}/{_n(budget)}"),
                  _n(ev.get("prefill_tokens")), _n(ev.get("decode_tokens")), _n(ev.get("running")),
                  _n(ev.get("waiting")), _pct(ev.get("kv_usage")), _n(eng.preemptions),
                  f"{ws.step_rate:.1f}" if ws.step_rate else "-", LIMIT_LABEL.get(bound, "-") if bound else "-")
    return Panel(t, title=f"current step · {len(engines)} engine cores (data-parallel ranks)",
                 title_align="left", padding=(0, 1)), len(engines) + 3


def bucket_steps(recs: Sequence[StepRecord], columns: int) -> list[StepRecord]:
    """``recs`` squeezed into at most ``columns`` records (means of consecutive steps).

    Tokens, queues and KV use are averaged per column; preemptions are summed.
    """
    if len(recs) <= columns or columns <= 0:
        return list(recs)
    out = []
    n = len(recs)
    for c in range(columns):
        group = recs[c * n // columns:(c + 1) * n // columns]
        if not group:
            continue
        k = len(group)
        split = all(r.prefill_tokens is not None and r.decode_tokens is not None for r in group)
        out.append(StepRecord(
            group[-1].step, group[-1].ts, round(sum(r.scheduled for r in group) / k), max(r.budget for r in group),
            round(sum(r.prefill_tokens for r in group) / k) if split else None,
            round(sum(r.decode_tokens for r in group) / k) if split else None,
            round(sum(r.running for r in group) / k), round(sum(r.waiting for r in group) / k),
            sum(r.kv_usage for r in group) / k, sum(r.schedule_us for r in group) / k,
            sum(r.preempted for r in group), group[-1].bound))
    return out


def _chart(engines: list[EngineState], width: int, rows: int, chart_steps: int | None = None) -> tuple[Panel, int]:
    """Rolling chart panel; ``rows`` is the panel's height (borders included)."""
    label_w = 9
    steps_w = max(width - 4 - label_w - 1, 5)
    per_engine = 2 if len(engines) == 1 else 3  # kv + waiting (+ engine label)
    body = rows - 3  # borders + legend
    tok_rows = max((body - per_engine * len(engines)) // len(engines), CHART_MIN_ROWS)
    grid = Table.grid(padding=(0, 1))
    grid.add_column(width=label_w, justify="right", no_wrap=True)
    grid.add_column(no_wrap=True, overflow="crop")
    shown = 0
    used = 0
    for eng in engines:
        if used + tok_rows + per_engine - 1 > body:
            break
        recs = bucket_steps(list(eng.window)[-(chart_steps or steps_w):], steps_w)
        budget = max((r.budget for r in recs), default=0)
        if len(engines) > 1:
            grid.add_row(Text(f"dp {eng.engine}", style="bold"), Text(""))
            used += 1
        chart = token_chart(recs, tok_rows)
        for i, line in enumerate(chart):
            label = f"{budget:,}" if i == 0 else ("0 tok" if i == len(chart) - 1 else "")
            grid.add_row(Text(label, style="dim"), line)
        kv_line = spark([r.kv_usage for r in recs], 1.0, KV_STYLE)
        max_wait = max((r.waiting for r in recs), default=0)
        wait_line = spark([r.waiting for r in recs], max_wait, WAITING_STYLE)
        grid.add_row(Text("KV", style=KV_STYLE), kv_line)
        grid.add_row(Text(f"wait ≤{max_wait}", style=WAITING_STYLE), wait_line)
        used += tok_rows + 2
        shown += 1
    n_steps = min(max((len(e.window) for e in engines), default=0), chart_steps or steps_w)
    legend = _line(("█ prefill", PREFILL_STYLE), "  ", ("█ decode", DECODE_STYLE),
                   ("  tokens per step; top = token budget", "dim"), "  ", ("▆ KV-cache use (0–100%)", KV_STYLE),
                   "  ", ("▆ waiting requests", WAITING_STYLE))
    if shown < len(engines):
        legend.append(f"  (+{len(engines) - shown} engine cores: use --engine N)", style=WARN_STYLE)
    title = f"last {n_steps} steps" if n_steps else "steps"
    if n_steps > steps_w:
        title += f" (~{n_steps / steps_w:.1f} per column)"
    return Panel(Group(grid, legend), title=title, title_align="left", padding=(0, 1)), used + 3


def _preemptions(engines: list[EngineState], width: int, rows: int, multi: bool,
                 max_rows: int = PREEMPT_ROWS) -> tuple[Panel, int]:
    """Preemption panel of at most ``rows`` lines (borders included)."""
    total = sum(e.preemptions for e in engines)
    discarded = sum(e.discarded_tokens for e in engines)
    recomputed = sum(e.recomputed_tokens for e in engines)
    ws = [e.window_stats() for e in engines]
    in_window = sum(w.preemptions for w in ws)
    wsteps = sum(w.steps for w in ws)
    rate = sum(w.preempt_rate or 0 for w in ws)
    summary = _line(("total ", "dim"), (_n(total), PREEMPT_STYLE if total else "bold"), _sep(),
                    (f"{in_window} in the last {wsteps} steps", ""), (f" ({rate:.2f}/s)", "dim"))
    work = _line(("discarded ", "dim"), (f"{discarded:,} tok", "bold"), _sep(),
                 ("recomputed so far ", "dim"), (f"{recomputed:,} tok", "bold"))
    items: list[RenderableType] = [summary, work]
    height = 4
    room = rows - 5  # borders, summary lines, table header
    recent = heapq.nlargest(max(min(room, max_rows), 0),
                            (ev for e in engines for ev in e.recent_preempts), key=lambda ev: ev["ts"])
    if recent:
        cols = [("step", "right", ""), ("request", "left", ""), ("discarded", "right", "red"),
                ("output", "right", ""), ("times", "right", "bold"), ("KV", "right", KV_STYLE),
                ("run/wait", "right", "")]
        rows = [[_n(ev.get("step")), str(ev.get("req_id")), f"{_n(ev.get('discarded_tokens'))} tok",
                 _n(ev.get("output_tokens")), f"×{_n(ev.get('num_preemptions'))}", _pct(ev.get("kv_usage")),
                 f"{_n(ev.get('running'))}/{_n(ev.get('waiting'))}"] for ev in recent]
        if width < 68:  # narrow: the request id matters more than KV use and queue lengths
            cols, rows = cols[:5], [row[:5] for row in rows]
        if multi:
            cols.insert(0, ("dp", "right", ""))
            for row, ev in zip(rows, recent):
                row.insert(0, str(ev.get("engine", 0)))
        t = _table(cols, rows, width - 4, flex=2 if multi else 1)
        items.append(t)
        height += 1 + len(recent)
    title = Text.assemble(("preemptions", PREEMPT_STYLE if total else ""),
                          (" (recompute)", "dim"))
    return Panel(Group(*items), title=title, title_align="left", padding=(0, 1)), height


def _prefills(engines: list[EngineState], width: int, rows: int, multi: bool) -> tuple[Panel | None, int]:
    inflight = [r for e in engines for r in e.prefills_in_flight()]
    if not inflight:
        return Panel(_line(("no prefill in flight", "dim")), title="prefills in flight",
                     title_align="left", padding=(0, 1)), 3
    room = max(rows - 3, 1)
    shown = inflight[:room]
    narrow = width < 80  # no "pass" column: recompute passes still show as red bars
    cols = [("request", "left", ""), ("pass", "left", ""), ("chunk [start, end)", "right", ""),
            ("done/prefill", "right", "")]
    if narrow:
        del cols[1]
    if multi:
        cols.insert(0, ("dp", "right", ""))
    rows, bars = [], []
    for r in shown:
        total = r.prefill_len or r.prompt_len or max(r.computed, 1)
        start, end = r.last_chunk or (0, 0)
        row = [r.req_id, Text("recompute", style="red") if r.passes > 1 else Text("first"),
               f"{r.chunk_index} [{start:,}, {end:,})", f"{r.computed:,}/{total:,}"]
        if narrow:
            del row[1]
        if multi:
            row.insert(0, str(r.engine))
        rows.append(row)
        bars.append((total, min(r.computed, total), "red" if r.passes > 1 else PREFILL_STYLE))
    # the progress bar takes what the other columns leave (6..30 cells)
    others = sum(max(len(c[0]), max(Text(str(row[i])).cell_len if not isinstance(row[i], Text) else row[i].cell_len
                                      for row in rows)) + 2 for i, c in enumerate(cols))
    bar_w = max(min(width - 4 - others - 2, 30), 6)
    cols.insert(-1, ("progress", "left", ""))
    for row, (total, done, style) in zip(rows, bars):
        row.insert(-1, (ProgressBar(total=total, completed=done, width=bar_w, complete_style=style), bar_w))
    t = _table(cols, rows, width - 4, flex=1 if multi else 0)
    title = f"prefills in flight: {len(inflight)}" + (f" (showing {len(shown)})" if len(shown) < len(inflight) else "")
    return Panel(t, title=title, title_align="left", padding=(0, 1)), len(shown) + 3


def _interest_key(r: RequestState, now: float) -> tuple:
    """Sort key: preempted, prefilling, longest waiting, decoding (preempted first), finished."""
    if r.phase == PREEMPTED:
        return (0, -r.preemptions, r.waiting_since_ts or now)
    if r.phase == PREFILL:
        return (1, -r.passes, r.first_scheduled_step if r.first_scheduled_step is not None else 0)
    if r.phase == WAITING:
        return (2, r.waiting_since_ts or now, 0)
    if r.phase == DECODE:
        return (3, -r.preemptions, r.arrival_ts or now)
    return (4, -(r.finished_ts or 0), 0)


def requests_by_interest(engines: Iterable[EngineState], now: float, limit: int) -> tuple[list[RequestState], int]:
    """The ``limit`` most interesting requests (see :func:`_interest_key`) and how many exist."""
    pool: list[RequestState] = []
    for e in engines:
        pool.extend(e.requests.values())
        pool.extend(e.finished)
    return heapq.nsmallest(max(limit, 0), pool, key=lambda r: _interest_key(r, now)), len(pool)


def _requests(engines: list[EngineState], now: float, width: int, rows: int, multi: bool) -> tuple[Panel, int]:
    room = max(rows - 3, 0)
    shown, total = requests_by_interest(engines, now, room)
    counts = {WAITING: 0, PREFILL: 0, DECODE: 0, PREEMPTED: 0}
    for e in engines:
        for k, v in e.phase_counts().items():
            counts[k] = counts.get(k, 0) + v
    finished = sum(e.requests_finished for e in engines)
    full = width >= 100  # narrower: drop computed, chunks and TTFT in steps
    cols = [("request", "left", ""), ("state", "left", ""), ("prompt", "right", ""), ("computed", "right", ""),
            ("output", "right", ""), ("chunks", "right", ""), ("preempt", "right", ""), ("queue", "right", ""),
            ("TTFT", "right", ""), ("TTFT steps", "right", "")]
    if not full:
        cols = [c for c in cols if c[0] not in ("computed", "chunks", "TTFT steps")]
    if multi:
        cols.insert(0, ("dp", "right", ""))
    rows = []
    for r in shown:
        eng = next((e for e in engines if e.engine == r.engine), None)
        step = eng.last_step if eng else 0
        out = r.estimated_output_tokens(step)
        out_s = ("~" if r.phase == DECODE else "") + _n(out) if out is not None else "-"
        computed = r.estimated_computed_tokens(step)
        comp_s = ("~" if r.phase == DECODE else "") + _n(computed) if computed is not None else "-"
        if r.queue_time_s is not None:
            queue = Text(fmt_duration(r.queue_time_s))
        elif r.waiting_since_ts is not None and r.phase in (WAITING, PREEMPTED):
            queue = Text("≥" + fmt_duration(max(now - r.waiting_since_ts, 0.0)), style=WAITING_STYLE)
        else:
            queue = Text("-")
        phase = r.phase + (f" ×{r.preemptions}" if r.phase == PREEMPTED else "")
        if r.phase == FINISHED:
            phase = f"done ({r.finish_reason})" if r.finish_reason and full else "done"
        cells = {"dp": str(r.engine), "request": r.req_id, "state": Text(phase, style=PHASE_STYLE.get(r.phase, "")),
                 "prompt": _n(r.prompt_len), "computed": comp_s, "output": out_s, "chunks": _n(r.chunks),
                 "preempt": Text(_n(r.preemptions), style="red" if r.preemptions else "dim"),
                 "queue": queue, "TTFT": fmt_duration(r.ttft_s), "TTFT steps": _n(r.ttft_steps)}
        rows.append([cells[name] for name, _, _ in cols])
    t = _table(cols, rows, width - 4, flex=1 if multi else 0)
    title = Text.assemble(
        ("requests ", "bold"), (f"{counts[PREEMPTED]} preempted", "red" if counts[PREEMPTED] else "dim"), _sep(),
        (f"{counts[PREFILL]} prefill", PREFILL_STYLE), _sep(), (f"{counts[WAITING]} waiting", WAITING_STYLE), _sep(),
        (f"{counts[DECODE]} decode", DECODE_STYLE), _sep(), (f"{finished} finished", "dim"),
        (f"  (top {len(shown)} of {total} known)" if len(shown) < total else "", "dim"))
    if not shown:
        return Panel(_line(("no requests yet" if not total else "", "dim")), title=title, title_align="left"), 3
    return Panel(t, title=title, title_align="left", padding=(0, 1)), len(shown) + 3


def _log_panel(lines: Sequence[str], rows: int, title: str) -> tuple[Panel, int]:
    shown = list(lines)[-max(rows - 2, 1):]
    body = Group(*(_line((ln, "")) for ln in shown)) if shown else _line(("(no output yet)", "dim"))
    return Panel(body, title=title, title_align="left", border_style="dim"), max(len(shown), 1) + 2


# -- the whole screen ---------------------------------------------------------------------


def _compact(state: RunState, engines: list[EngineState], stats: ReadStats | None, view: View,
             width: int, height: int | None) -> RenderableType:
    """A few lines of key figures for terminals below the full dashboard's size."""
    lines: list[Text] = [_line(("vllm-probe ", "bold"), (view.status, view.status_style))]
    for eng in engines:
        ev = eng.latest or {}
        sched, budget = ev.get("scheduled_tokens", 0), ev.get("token_budget") or 0
        prefix = f"dp{eng.engine} " if len(engines) > 1 else ""
        lines.append(_line((prefix, "bold"), ("step ", "dim"), (_n(ev.get("step")), "bold"), " ",
                           (f"{sched:,}/{_n(budget)} tok", "bold"),
                           (f" (prefill {_n(ev.get('prefill_tokens'))}", PREFILL_STYLE),
                           (f" decode {_n(ev.get('decode_tokens'))})", DECODE_STYLE)))
        bar_w = max(min(width - 2, 40), 4)
        lines.append(_line(budget_bar(ev.get("prefill_tokens"), ev.get("decode_tokens"), sched, budget, bar_w)))
        lines.append(_line(("run ", "dim"), _n(ev.get("running")), (" wait ", WAITING_STYLE), _n(ev.get("waiting")),
                           (" KV ", KV_STYLE), _pct(ev.get("kv_usage")),
                           (" preempt ", "red"), _n(eng.preemptions),
                           (f" ({eng.discarded_tokens:,} tok discarded)", "dim")))
        inflight = eng.prefills_in_flight()
        if inflight:
            r = inflight[0]
            s, e = r.last_chunk or (0, 0)
            lines.append(_line((f"prefill {r.req_id} chunk {r.chunk_index} [{s:,}, {e:,})", PREFILL_STYLE),
                               (f" +{len(inflight) - 1} more" if len(inflight) > 1 else "", "dim")))
    counts = {WAITING: 0, PREFILL: 0, DECODE: 0, PREEMPTED: 0}
    for e in engines:
        for k, v in e.phase_counts().items():
            counts[k] += v
    if engines:
        lines.append(_line(("req ", "dim"), (f"{counts[PREEMPTED]} preempted", "red"), _sep(),
                           (f"{counts[PREFILL]} prefill", PREFILL_STYLE), _sep(),
                           (f"{counts[WAITING]} waiting", WAITING_STYLE), _sep(),
                           (f"{counts[DECODE]} decode", DECODE_STYLE), _sep(),
                           (f"{sum(e.requests_finished for e in engines)} done", "dim")))
    latest = max((ev for e in engines for ev in e.recent_preempts), key=lambda ev: ev["ts"], default=None)
    if latest is not None:
        lines.append(_line(("last preemption ", "red"), f"step {_n(latest.get('step'))} {latest.get('req_id')} ",
                           (f"{_n(latest.get('discarded_tokens'))} tok discarded", "bold"),
                           f" ×{_n(latest.get('num_preemptions'))}"))
    if not engines:
        lines.append(_line(("no events yet", "dim")))
    if view.notice:
        lines.append(_line((view.notice, WARN_STYLE)))
    if stats is not None and (stats.skipped or view.truncated):
        lines.append(_line((f"{stats.skipped + view.truncated} lines skipped", WARN_STYLE)))
    lines.append(_line((f"terminal {width}×{height or '?'}: {MIN_FULL_WIDTH}×{MIN_FULL_HEIGHT} or more "
                        "shows the full dashboard", "dim italic")))
    if height is not None and len(lines) > height:
        lines = lines[: max(height - 1, 1)] + [lines[-1]] if height > 1 else lines[:1]
    return Group(*lines)


def render_dashboard(state: RunState, meta: dict | None = None, stats: ReadStats | None = None, *,
                     width: int = 120, height: int | None = None, now: float | None = None,
                     view: View | None = None) -> RenderableType:
    """The dashboard for a terminal of ``width`` × ``height`` cells (height None: natural).

    Args:
        state: the run's state (events applied).
        meta: the run's ``meta.json`` (command line, start/end time, exit code).
        stats: the reader's counts of events read and lines skipped.
        width, height: terminal size in cells; the result never exceeds it.
        now: current time in epoch seconds (wall clock live, event time in a replay);
            default: the last event's time.
        view: status line and other caller-side facts (:class:`View`).
    """
    meta = meta or {}
    view = view or View()
    now = now if now is not None else (state.last_ts or meta.get("end_time") or meta.get("start_time") or 0.0)
    width = max(int(width), 10)
    engines = [state.engines[i] for i in state.engine_ids()
               if view.engine is None or i == view.engine]
    multi = len(engines) > 1
    if width < MIN_FULL_WIDTH or (height is not None and height < MIN_FULL_HEIGHT):
        return _compact(state, engines, stats, view, width, height)

    budget_h = height if height is not None else 10_000
    header, h_header = _header(state, meta, stats, view, now, compact=height is not None and height < 30)
    parts: list[RenderableType] = [header]
    left = budget_h - h_header
    if view.notice:
        parts.append(_line((view.notice, WARN_STYLE)))
        left -= 1
    if not engines:
        rows = min(left, 14)
        if view.log_tail and rows >= 3:
            panel, _ = _log_panel(view.log_tail, rows, "command output (command.log)")
            parts.append(panel)
        return Group(*parts)

    wide = width >= WIDE_WIDTH
    if multi:
        current, h_current = _current_multi(engines, width)
    else:
        current, h_current = _current_single(engines[0], (width - _right_width(width)) if wide else width)
    n_recent = sum(len(e.recent_preempts) for e in engines)
    want_pre = 4 + (1 + min(n_recent, PREEMPT_ROWS) if n_recent else 0)
    n_inflight = sum(1 for e in engines for r in e.requests.values() if r.phase == PREFILL)
    want_fill = 3 + min(n_inflight, 8) if n_inflight else 3
    per_engine = 2 if not multi else 3
    want_chart = 3 + len(engines) * (max(CHART_ROWS // len(engines), CHART_MIN_ROWS) + per_engine)
    min_chart = 3 + per_engine + CHART_MIN_ROWS
    log_rows = min(len(view.log_tail), 8) + 2 if view.log_tail else 0
    left -= log_rows

    if wide and not multi:
        # middle: [current step + chart] | [preemptions + prefills in flight]
        right_w = _right_width(width)
        left_w = width - right_w
        mid_min = max(h_current + min_chart, 4 + 3)
        mid_want = max(h_current + want_chart, want_pre + want_fill)
        req_min = 4
        mid = min(mid_want, max(left - req_min, mid_min))
        if mid > left:
            mid = left
        chart_h = max(mid - h_current, 0)
        fill_h = min(want_fill, max(mid - 4 - 1, 3))
        pre_h = mid - fill_h
        left_items: list[RenderableType] = [current]
        if chart_h >= min_chart:
            chart, _ = _chart(engines, left_w, chart_h, view.chart_steps)
            left_items.append(_fixed(chart, chart_h))
        pre, _ = _preemptions(engines, right_w, pre_h, multi, max_rows=pre_h)
        right_items: list[RenderableType] = [_fixed(pre, pre_h)]
        if fill_h >= 3:
            fill, _ = _prefills(engines, right_w, fill_h, multi)
            right_items.append(_fixed(fill, fill_h))
        row = Table.grid()  # fixed widths: rich need not measure the nested panels
        row.add_column(width=left_w)
        row.add_column(width=right_w)
        row.add_row(Group(*left_items), Group(*right_items))
        parts.append(row)
        left -= mid
    else:
        if left >= h_current:
            parts.append(current)
            left -= h_current
        pre_min, req_min = 4, 5  # preemption summary; requests table with 2 rows
        if left - pre_min - req_min >= min_chart:
            chart_h = min(want_chart, left - pre_min - req_min)
        elif left - pre_min >= min_chart:
            chart_h = min_chart  # no room for the request table
        else:
            chart_h = 0
        if chart_h:
            chart, _ = _chart(engines, width, chart_h, view.chart_steps)
            parts.append(_fixed(chart, chart_h))
            left -= chart_h
        if left >= pre_min:
            pre_h = min(want_pre, max(left - req_min, pre_min))
            pre, _ = _preemptions(engines, width, pre_h, multi)
            parts.append(_fixed(pre, pre_h))
            left -= pre_h
        if n_inflight and left >= 4 + req_min:
            fill_h = min(want_fill, left - req_min)
            fill, _ = _prefills(engines, width, fill_h, multi)
            parts.append(_fixed(fill, fill_h))
            left -= fill_h
    if left >= 4:
        req_rows = left if height is not None else min(3 + 30, left)
        reqs, used = _requests(engines, now, width, req_rows, multi)
        parts.append(reqs)
        left -= used
    if log_rows:
        panel, _ = _log_panel(view.log_tail, log_rows, "command output (last lines of command.log)")
        parts.append(panel)
    return Group(*parts)


def _right_width(width: int) -> int:
    """Width of the right column (preemptions, prefills) in the two-column layout."""
    return min(max(width * 2 // 5, 68), width // 2)


def _fixed(panel: Panel, height: int) -> Panel:
    """The same panel forced to ``height`` rows (cropped or padded by rich)."""
    panel.height = height
    return panel
