"""The panels of the live scheduling dashboard, each a rich view over
:class:`vllm_probe.analysis.state.RunState`; :mod:`vllm_probe.tui.layout` sizes and
stacks them for a terminal.

Pure: no I/O, no clock, no event handling; every figure comes from the state and its
figures (:mod:`vllm_probe.analysis.figures`), every number reads as in the other views
(:mod:`vllm_probe.tui.format`). Each panel function returns ``(panel, rows it takes)``.
Panels:

* header — command, run status, vLLM version, the effective scheduler config
  (``engine_config``; with prefix caching on, its hits so far), elapsed time, the
  longest running and waiting queues so far, step rate, time inside ``schedule()``, events read
  and lines skipped;
* current step — scheduled tokens against the token budget, split into prefill and
  decode; running and waiting queues, and why the head of the waiting queue was not
  admitted (``step.head_blocked_by``); KV-cache use; which limit held the step back
  (one row per engine core when there are several data-parallel ranks);
* rolling chart of the last steps — prefill and decode tokens per step stacked
  against the token budget (the chart's top), KV-cache use and the waiting queue;
* preemptions — total, rate, discarded and recomputed tokens (with prefix caching on,
  what the prefix cache served to re-admissions), latest preemptions;
* prefills in flight — per request a progress bar of the pass, chunk i, ``[start, end)``;
* requests — most interesting first: preempted, prefilling, longest waiting, decoding
  (preempted ones first), then recently finished; a ``prio`` column when the requests'
  priorities differ or the policy is ``priority``. Request ids too long for the column
  end in ``…``: what is shown is a prefix every command taking an id accepts;
* compact — a few lines of key figures for terminals below the full dashboard's size.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any
from collections.abc import Iterable, Sequence

from rich import box
from rich.console import Group, JustifyMethod, RenderableType
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from ..analysis.figures import budget_use, per_second, share
from ..analysis.engine_state import EngineState, WindowStats
from ..analysis.requests import DECODE, FINISHED, PREEMPTED, PREFILL, WAITING, RequestState
from ..analysis.state import RunState
from ..runs.reader import ReadStats
from ..schema.records import EngineConfigEvent, StepEvent
from .charts import (
    DECODE_STYLE, KV_STYLE, LIMIT_LABEL, PHASE_STYLE, PREEMPT_STYLE, PREFILL_STYLE, REASON_LABEL, WAITING_STYLE,
    WARN_STYLE, CHART_LABEL_W,
    add_token_chart, bucket_steps, budget_bar, chart_grid, line, sep, spark,
)
from .format import UNKNOWN, count, duration, kv_capacity, micros, pct

#: Below this many columns or rows the compact view is shown.
MIN_FULL_WIDTH = 70
MIN_FULL_HEIGHT = 20
#: Rows of the token chart when the terminal is tall enough (and its minimum).
CHART_ROWS, CHART_MIN_ROWS = 8, 2
#: Latest preemptions listed (at most).
PREEMPT_ROWS = 5
#: Seconds without a new event after which the header says "last event … ago" (s).
STALE_AFTER_S = 2.0

#: Stand-ins before the first ``step`` / ``engine_config`` record: every field unknown.
_NO_STEP = StepEvent(ts=0.0)
_NO_CONFIG = EngineConfigEvent(ts=0.0)


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
        findings: the doctor's findings on the state so far (None: no findings panel).
        moments: a finished run's notable moments (shown when ``finished``).
        finished: the run is over: the whole-run overview replaces the rolling chart and
            the notable moments the prefills in flight.
    """

    status: str = ""
    status_style: str = "bold"
    run_dir: str = ""
    truncated: int = 0
    log_tail: Sequence[str] = ()
    notice: str | None = None
    engine: int | None = None
    chart_steps: int | None = None
    findings: Sequence[Any] | None = None
    moments: Sequence[Any] = ()
    finished: bool = False


#: A table column: header, justification, style.
_Col = tuple[str, JustifyMethod, str]


def _table(columns: Sequence[_Col], rows: Sequence[Sequence[Any]], max_width: int,
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


# -- sections -----------------------------------------------------------------------------


def _prefix_hits(state: RunState, cfg: Any) -> list[Any]:
    """`` (37% of prompt tok hit)`` with prefix caching on (re-admissions: preemption panel)."""
    hit_share = state.prefix_hit_share()
    if not cfg.prefix_caching or hit_share is None:
        return []
    return [(" (", "dim"), (pct(hit_share), "bold"), (" of prompt tok hit)", "dim")]


def header_panel(state: RunState, meta: dict, stats: ReadStats | None, view: View, now: float,
            compact: bool = False) -> tuple[Panel, int]:
    """The header: status, the engine configuration, elapsed time, steps and step rate,
    ``schedule()`` time (µs), the longest queues, events read and warnings; returns the
    panel and its rows (``compact``: the configuration on one line)."""
    cmd = " ".join(str(c) for c in meta.get("command") or []) or view.run_dir or "?"
    cfg = state.config
    lines: list[Text] = []
    status = Text(view.status or "", style=view.status_style)
    lines.append(line(status, ("  " if view.status else ""), (view.run_dir, "dim")))
    lines += _config_lines(state, cfg, compact)
    start = meta.get("start_time") or state.first_ts
    end = meta.get("end_time")
    elapsed = ((end if end else now) - start) if start else None
    steps = state.total("steps") if state.engines else 0
    rates = [e.window_stats() for e in state.engines.values()]
    step_rate = sum(r.step_rate or 0 for r in rates) if rates else None
    sched = [r for r in rates if r.schedule_us_mean is not None]
    # (mean and max are set together: 0.0 never stands in for a missing one)
    sched_mean = sum(r.schedule_us_mean or 0.0 for r in sched) / len(sched) if sched else None
    sched_max = max((r.schedule_us_max or 0.0 for r in sched), default=None)
    stepping = state.stepping_s()  # the command's elapsed time also holds the engine's start
    busy = state.busy_s()  # stepping without the idle gaps between bursts
    parts: list[Any] = [("elapsed ", "dim"), duration(elapsed), sep(),
                        (count(steps), "bold"), (" steps", "dim"),
                        *([(" in ", "dim"), duration(stepping)] if stepping is not None else []),
                        *([(", busy ", "dim"), duration(busy)] if busy is not None else []), sep(),
                        *_step_rate(step_rate, per_second(steps, stepping), finished=bool(end)), sep(),
                        ("schedule() ", "dim"), micros(sched_mean), (" mean, ", "dim"), micros(sched_max),
                        (" max", "dim")]
    if state.engines:  # the longest queues of the whole run (the chart shows recent steps only)
        parts += [sep(), ("most running ", "dim"), count(max((e.running_max or 0) for e in state.engines.values())),
                  (" waiting ", "dim"), count(max((e.waiting_max or 0) for e in state.engines.values()))]
    warnings = _warnings(state, stats, view)
    if stats is not None:
        parts += [sep(), (count(stats.events), ""), (" events", "dim")]
    if state.last_ts is not None and not end and now - state.last_ts > STALE_AFTER_S:
        parts += [sep(), (f"last event {duration(now - state.last_ts)} ago", "dim italic")]
    lines.append(line(*parts))
    if warnings:
        joined: list[Any] = [("warning: ", WARN_STYLE)]
        for i, w in enumerate(warnings):
            joined += ([sep()] if i else []) + [w]
        lines.append(line(*joined))
    title = Text.assemble(("vllm-probe ", "bold"), (cmd, ""), no_wrap=True, overflow="ellipsis")
    return Panel(Group(*lines), title=title, title_align="left", box=box.ROUNDED, padding=(0, 1)), len(lines) + 2


def _config_lines(state: RunState, cfg: Any, compact: bool) -> list[Text]:
    """The header's engine-configuration lines (one when ``compact``)."""
    if cfg is None:
        return [line(("no engine_config yet (engine core starting, or the run has no events)", "dim"))]
    kv_main, kv_detail = kv_capacity(cfg.kv_capacity_tokens, cfg.num_kv_blocks, cfg.block_size)
    cfg_a = [
        ("vLLM ", "dim"), (cfg.vllm_version or "?", "bold"), sep(),
        cfg.scheduler_class or "?", sep(),
        ("token budget ", "dim"), (count(cfg.max_num_batched_tokens), "bold"), (" tok", "dim"), sep(),
        ("max_num_seqs ", "dim"), count(cfg.max_num_seqs), sep(),
        ("max_model_len ", "dim"), count(cfg.max_model_len),
        *((sep(), ("data-parallel ranks ", "dim"), str(cfg.data_parallel_size))
          if (cfg.data_parallel_size or 1) > 1 else ()),
    ]
    cfg_b = [
        ("chunked prefill ", "dim"), "on" if cfg.enable_chunked_prefill else "off",
        (f" (cap {count(cfg.long_prefill_token_threshold)} tok)"
         if cfg.long_prefill_token_threshold else ""), sep(),
        ("KV cache ", "dim"), (kv_main, "bold"), (" " + kv_detail, "dim"), sep(),
        ("policy ", "dim"), cfg.scheduling_policy or "?", sep(),
        ("prefix caching ", "dim"), "on" if cfg.prefix_caching else "off", *_prefix_hits(state, cfg), sep(),
        ("async scheduling ", "dim"), "on" if cfg.async_scheduling else "off",
    ]
    if compact:
        return [line(*cfg_a, sep(), *cfg_b)]
    return [line(*cfg_a), line(*cfg_b)]


def _warnings(state: RunState, stats: ReadStats | None, view: View) -> list[Any]:
    """The header's warnings: lines skipped, newer schema, events dropped, hooks off."""
    warnings: list[Any] = []
    if stats is not None:
        skipped = stats.skipped + view.truncated
        if skipped:
            what = [f"{n} {w}" for n, w in ((stats.malformed, "malformed"),
                                           (stats.partial + view.truncated, "truncated"),
                                           (stats.unknown_kind, "unknown kind")) if n]
            warnings.append((f"{skipped} lines skipped ({', '.join(what)})", WARN_STYLE))
        if stats.newer_schema:
            warnings.append((f"{stats.newer_schema} events with a newer schema", WARN_STYLE))
    dropped = sum(e.events_dropped for e in state.engines.values())
    if dropped:
        warnings.append((f"the probe dropped {count(dropped)} events", WARN_STYLE))
    disabled = sorted({h for e in state.engines.values() for h in e.hooks_disabled})
    if disabled:
        warnings.append((f"hooks switched off after errors: {', '.join(disabled)}", WARN_STYLE))
    return warnings


def _limit_shares(ws: WindowStats) -> str:
    if not ws.steps:
        return ""
    parts = [f"{LIMIT_LABEL[k].split(' (')[0]} {pct(v / ws.steps)}"
             for k, v in sorted(ws.bound_counts.items(), key=lambda kv: -kv[1]) if v]
    return f"last {ws.steps} steps: " + ", ".join(parts)


def current_panel(eng: EngineState, width: int) -> tuple[Panel, int]:
    ev = eng.latest or _NO_STEP
    cfg = eng.config or _NO_CONFIG
    scheduled = ev.scheduled_tokens or 0
    budget = eng.step_budget or 0
    pt, dt = ev.prefill_tokens, ev.decode_tokens
    inner = max(width - 4, 10)
    split = (f"{count(pt)} prefill + {count(dt)} decode = " if pt is not None and dt is not None else "")
    figures = Text.assemble((split, ""), (count(scheduled), "bold"), f" / {count(budget)} tok ",
                            (f"({pct(budget_use(scheduled, budget))})", "bold"))
    bar_w = max(min(inner - figures.cell_len - 1, 60), 8)  # the figures matter more than the bar
    l1 = line(budget_bar(pt, dt, scheduled, budget, bar_w), " ", figures)
    l2 = line(("prefill ", PREFILL_STYLE), f"{count(pt)} tok in {count(ev.prefill_reqs)} req", sep(),
               ("decode ", DECODE_STYLE), f"{count(dt)} tok in {count(ev.decode_reqs)} req", sep(),
               ("admitted ", "dim"), count(ev.new_reqs), sep(),
               ("running ", "dim"), (count(ev.running), "bold"), sep(),
               ("waiting ", WAITING_STYLE), (count(ev.waiting), "bold"),
               *((sep(), (f"preempted {len(ev.preempted or [])}", PREEMPT_STYLE)) if ev.preempted else ()))
    kv = ev.kv_usage
    free = ev.free_blocks
    bs = cfg.block_size
    kv_bar = ProgressBar(total=1.0, completed=kv or 0.0, width=12, complete_style=KV_STYLE, finished_style="bold red")
    ws = eng.window_stats()
    bound = eng.window[-1].bound if eng.window else None
    kv_row = Table.grid(padding=(0, 1))
    kv_row.add_column(no_wrap=True)
    kv_row.add_column(no_wrap=True, overflow="ellipsis")
    kv_row.add_row(kv_bar, line(
        ("KV cache ", KV_STYLE), (pct(kv), "bold"), sep(),
        f"{count(free)} free blocks" + (f" = {count(free * bs)} tok" if free is not None and bs else ""), sep(),
        *((("head waits on ", "dim"), (REASON_LABEL.get(ev.head_blocked_by, "other"), WAITING_STYLE), sep())
          if ev.head_blocked_by else ()),
        ("held back by ", "dim"), (LIMIT_LABEL.get(bound, UNKNOWN) if bound else UNKNOWN, "bold"),
        ("  (" + _limit_shares(ws) + ")" if ws.steps else "", "dim")))
    title = Text.assemble(("step ", ""), (count(ev.step), "bold"),
                          (f"  engine core {eng.engine}" if eng.engine else "", "dim"))
    return Panel(Group(l1, l2, kv_row), title=title, title_align="left", padding=(0, 1)), 5


def current_multi_panel(engines: list[EngineState], width: int) -> tuple[Panel, int]:
    t = Table(box=None, padding=(0, 1), expand=False, header_style="bold dim")
    for name, kw in (("dp", {"justify": "right"}), ("step", {"justify": "right"}), ("tokens / budget", {}),
                     ("prefill", {"justify": "right", "style": PREFILL_STYLE}),
                     ("decode", {"justify": "right", "style": DECODE_STYLE}),
                     ("run", {"justify": "right"}), ("wait", {"justify": "right", "style": WAITING_STYLE}),
                     ("KV", {"justify": "right", "style": KV_STYLE}), ("preempt", {"justify": "right", "style": "red"}),
                     ("steps/s", {"justify": "right"}), ("held back by", {})):
        opts: dict[str, Any] = kw  # rich checks justify's value at run time
        t.add_column(name, no_wrap=True, overflow="ellipsis", **opts)
    bar_w = max(min(width - 90, 30), 6)
    for eng in engines:
        ev = eng.latest or _NO_STEP
        ws = eng.window_stats()
        sched, budget = ev.scheduled_tokens or 0, eng.step_budget or 0
        bound = eng.window[-1].bound if eng.window else None
        t.add_row(str(eng.engine), count(ev.step),
                  Text.assemble(budget_bar(ev.prefill_tokens, ev.decode_tokens, sched, budget, bar_w),
                                f" {count(sched)}/{count(budget)}"),
                  count(ev.prefill_tokens), count(ev.decode_tokens), count(ev.running),
                  count(ev.waiting), pct(ev.kv_usage), count(eng.preemptions_total),
                  f"{ws.step_rate:.1f}" if ws.step_rate else UNKNOWN,
                  LIMIT_LABEL.get(bound, UNKNOWN) if bound else UNKNOWN)
    return Panel(t, title=f"current step · {len(engines)} engine cores (data-parallel ranks)",
                 title_align="left", padding=(0, 1)), len(engines) + 3


def _step_rate(recent: float | None, whole_run: float | None, finished: bool) -> list[Any]:
    """Steps per second: of the recent window while the run goes on, of the whole run
    once it has finished (a finished run has no "recent")."""
    rate = whole_run if finished else recent
    return [f"{rate:.1f}" if rate else UNKNOWN, (" steps/s over the run" if finished else " steps/s recent", "dim")]


def chart_panel(engines: list[EngineState], width: int, rows: int, chart_steps: int | None = None) -> tuple[Panel, int]:
    """Rolling chart panel; ``rows`` is the panel's height (borders included)."""
    steps_w = max(width - 4 - CHART_LABEL_W - 1, 5)
    per_engine = 2 if len(engines) == 1 else 3  # kv + waiting (+ engine label)
    body = rows - 3  # borders + legend
    tok_rows = max((body - per_engine * len(engines)) // len(engines), CHART_MIN_ROWS)
    grid = chart_grid()
    shown = 0
    used = 0
    for eng in engines:
        if used + tok_rows + per_engine - 1 > body:
            break
        recs = bucket_steps(list(eng.window)[-(chart_steps or steps_w):], steps_w)
        if len(engines) > 1:
            grid.add_row(Text(f"dp {eng.engine}", style="bold"), Text(""))
            used += 1
        add_token_chart(grid, recs, tok_rows)
        kv_line = spark([r.kv_usage for r in recs], 1.0, KV_STYLE)
        max_wait = max((r.waiting for r in recs), default=0)
        wait_line = spark([r.waiting for r in recs], max_wait, WAITING_STYLE)
        grid.add_row(Text("KV", style=KV_STYLE), kv_line)
        grid.add_row(Text(f"wait ≤{max_wait}", style=WAITING_STYLE), wait_line)
        used += tok_rows + 2
        shown += 1
    n_steps = min(max((len(e.window) for e in engines), default=0), chart_steps or steps_w)
    legend = line(("█ prefill", PREFILL_STYLE), "  ", ("█ decode", DECODE_STYLE),
                   ("  tokens per step; top = token budget", "dim"), "  ", ("▆ KV-cache use (0–100%)", KV_STYLE),
                   "  ", ("▆ waiting requests", WAITING_STYLE))
    if shown < len(engines):
        legend.append(f"  (+{len(engines) - shown} engine cores: use --engine N)", style=WARN_STYLE)
    title = f"last {n_steps} steps" if n_steps else "steps"
    if n_steps > steps_w:
        title += f" (~{n_steps / steps_w:.1f} per column)"
    return Panel(Group(grid, legend), title=title, title_align="left", padding=(0, 1)), used + 3


def preemptions_panel(engines: list[EngineState], width: int, rows: int, multi: bool,
                 max_rows: int = PREEMPT_ROWS) -> tuple[Panel, int]:
    """Preemption panel of at most ``rows`` lines (borders included)."""
    total = sum(e.preemptions_total for e in engines)
    discarded = sum(e.discarded_tokens for e in engines)
    recomputed = sum(e.recomputed_tokens for e in engines)
    ws = [e.window_stats() for e in engines]
    in_window = sum(w.preemptions for w in ws)
    wsteps = sum(w.steps for w in ws)
    rate = sum(w.preempt_rate or 0 for w in ws)
    summary = line(("total ", "dim"), (count(total), PREEMPT_STYLE if total else "bold"), sep(),
                    (f"{in_window} in the last {wsteps} steps", ""), (f" ({rate:.2f}/s)", "dim"))
    work = line(("discarded ", "dim"), (f"{count(discarded)} tok", "bold"), sep(),
                 ("recomputed ", "dim"), (f"{count(recomputed)} tok", "bold"))
    items: list[RenderableType] = [summary, work]
    height = 4
    readmitted = sum(e.resumed_passes for e in engines)
    if readmitted and any(e.config is not None and e.config.prefix_caching for e in engines):
        hits, redo = sum(e.resumed_prefix_hit_tokens for e in engines), sum(e.resumed_prefill_tokens for e in engines)
        items.append(line(("re-admitted ", "dim"), count(readmitted), sep(), ("prefix-cache hits ", "dim"),
                          (f"{count(hits)} of {count(redo)} tok", "bold"), (f" ({pct(share(hits, redo))})", "dim")))
        height += 1
    room = rows - height - 1  # borders, summary lines, table header
    recent = heapq.nlargest(max(min(room, max_rows), 0),
                            (ev for e in engines for ev in e.recent_preempts), key=lambda ev: ev.ts)
    if recent:
        cols: list[_Col] = [("step", "right", ""), ("request", "left", ""), ("discarded", "right", "red"),
                ("output", "right", ""), ("times", "right", "bold"), ("KV", "right", KV_STYLE),
                ("run/wait", "right", "")]
        table_rows = [[count(ev.step), str(ev.req_id), f"{count(ev.discarded_tokens)} tok",
                 count(ev.output_tokens), f"×{count(ev.num_preemptions)}", pct(ev.kv_usage),
                 f"{count(ev.running)}/{count(ev.waiting)}"] for ev in recent]
        if width < 68:  # narrow: the request id matters more than KV use and queue lengths
            cols, table_rows = cols[:5], [row[:5] for row in table_rows]
        if multi:
            cols.insert(0, ("dp", "right", ""))
            for row, ev in zip(table_rows, recent):
                row.insert(0, str(ev.engine))
        t = _table(cols, table_rows, width - 4, flex=2 if multi else 1)
        items.append(t)
        height += 1 + len(recent)
    title = Text.assemble(("preemptions", PREEMPT_STYLE if total else ""),
                          (" (recompute)", "dim"))
    return Panel(Group(*items), title=title, title_align="left", padding=(0, 1)), height


def prefills_panel(engines: list[EngineState], width: int, rows: int, multi: bool) -> tuple[Panel, int]:
    inflight = [r for e in engines for r in e.prefills_in_flight()]
    if not inflight:
        return Panel(line(("no prefill in flight", "dim")), title="prefills in flight",
                     title_align="left", padding=(0, 1)), 3
    room = max(rows - 3, 1)
    shown = inflight[:room]
    narrow = width < 80  # no "pass" column: recompute passes still show as red bars
    cols: list[_Col] = [("request", "left", ""), ("pass", "left", ""), ("chunk [start, end)", "right", ""),
            ("done/prefill", "right", "")]
    if narrow:
        del cols[1]
    if multi:
        cols.insert(0, ("dp", "right", ""))
    table_rows: list[list[Any]] = []
    bars: list[tuple[int, int, str]] = []
    for r in shown:
        total = r.prefill_len or r.prompt_len or max(r.computed, 1)
        start, end = r.last_chunk or (0, 0)
        row = [r.req_id, Text("recompute", style="red") if r.passes > 1 else Text("first"),
               f"{r.chunk_index} [{count(start)}, {count(end)})", f"{count(r.computed)}/{count(total)}"]
        if narrow:
            del row[1]
        if multi:
            row.insert(0, str(r.engine))
        table_rows.append(row)
        bars.append((total, min(r.computed, total), "red" if r.passes > 1 else PREFILL_STYLE))
    # the progress bar takes what the other columns leave (6..30 cells)
    others = sum(max(len(c[0]), *(Text(str(row[i])).cell_len if not isinstance(row[i], Text) else row[i].cell_len
                                     for row in table_rows)) + 2 for i, c in enumerate(cols))
    bar_w = max(min(width - 4 - others - 2, 30), 6)
    cols.insert(-1, ("progress", "left", ""))
    for row, (total, done, style) in zip(table_rows, bars):
        row.insert(-1, (ProgressBar(total=total, completed=done, width=bar_w, complete_style=style), bar_w))
    t = _table(cols, table_rows, width - 4, flex=1 if multi else 0)
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


def requests_panel(engines: list[EngineState], now: float, width: int, rows: int, multi: bool) -> tuple[Panel, int]:
    room = max(rows - 3, 0)
    shown, total = requests_by_interest(engines, now, room)
    counts = {WAITING: 0, PREFILL: 0, DECODE: 0, PREEMPTED: 0}
    for e in engines:
        for k, v in e.phase_counts().items():
            counts[k] = counts.get(k, 0) + v
    finished = sum(e.requests_finished for e in engines)
    full = width >= 100  # narrower: drop computed, chunks and TTFT in steps
    priority = any(e.priorities_vary for e in engines) or any(
        e.config is not None and e.config.scheduling_policy == "priority" for e in engines)
    cols: list[_Col] = [("request", "left", ""), ("state", "left", ""), *((("prio", "right", ""),) if priority else ()),
            ("prompt", "right", ""), ("computed", "right", ""),
            ("output", "right", ""), ("chunks", "right", ""), ("preempt", "right", ""), ("queue", "right", ""),
            ("TTFT", "right", ""), ("TTFT steps", "right", "")]
    if not full:
        cols = [c for c in cols if c[0] not in ("computed", "chunks", "TTFT steps")]
    if multi:
        cols.insert(0, ("dp", "right", ""))
    table_rows = []
    for r in shown:
        eng = next((e for e in engines if e.engine == r.engine), None)
        step = eng.last_step if eng else 0
        out = r.estimated_output_tokens(step)
        out_s = ("~" if r.phase == DECODE else "") + count(out) if out is not None else UNKNOWN
        computed = r.estimated_computed_tokens(step)
        comp_s = ("~" if r.phase == DECODE else "") + count(computed) if computed is not None else UNKNOWN
        if r.queue_time_s is not None:
            queue = Text(duration(r.queue_time_s))
        elif r.waiting_since_ts is not None and r.phase in (WAITING, PREEMPTED):
            queue = Text("≥" + duration(max(now - r.waiting_since_ts, 0.0)), style=WAITING_STYLE)
        else:
            queue = Text(UNKNOWN)
        phase = r.phase + (f" ×{r.preemptions}" if r.phase == PREEMPTED else "")
        if r.phase == FINISHED:
            phase = f"done ({r.finish_reason})" if r.finish_reason and full else "done"
        cells = {"dp": str(r.engine), "request": r.req_id, "state": Text(phase, style=PHASE_STYLE.get(r.phase, "")),
                 "prio": count(r.priority),
                 "prompt": count(r.prompt_len), "computed": comp_s, "output": out_s, "chunks": count(r.chunks),
                 "preempt": Text(count(r.preemptions), style="red" if r.preemptions else "dim"),
                 "queue": queue, "TTFT": duration(r.ttft_s), "TTFT steps": count(r.ttft_steps)}
        table_rows.append([cells[name] for name, _, _ in cols])
    t = _table(cols, table_rows, width - 4, flex=1 if multi else 0)
    title = Text.assemble(
        ("requests ", "bold"), (f"{counts[PREEMPTED]} preempted", "red" if counts[PREEMPTED] else "dim"), sep(),
        (f"{counts[PREFILL]} prefill", PREFILL_STYLE), sep(), (f"{counts[WAITING]} waiting", WAITING_STYLE), sep(),
        (f"{counts[DECODE]} decode", DECODE_STYLE), sep(), (f"{finished} finished", "dim"),
        (f"  (top {len(shown)} of {total} known)" if len(shown) < total else "", "dim"))
    if not shown:
        return Panel(line(("no requests yet" if not total else "", "dim")), title=title, title_align="left"), 3
    return Panel(t, title=title, title_align="left", padding=(0, 1)), len(shown) + 3


def log_panel(lines: Sequence[str], rows: int, title: str) -> tuple[Panel, int]:
    shown = list(lines)[-max(rows - 2, 1):]
    body = Group(*(line((ln, "")) for ln in shown)) if shown else line(("(no output yet)", "dim"))
    return Panel(body, title=title, title_align="left", border_style="dim"), max(len(shown), 1) + 2


# -- the whole screen ---------------------------------------------------------------------


def compact_view(state: RunState, engines: list[EngineState], stats: ReadStats | None, view: View,
             width: int, height: int | None) -> RenderableType:
    """A few lines of key figures for terminals below the full dashboard's size."""
    lines: list[Text] = [line(("vllm-probe ", "bold"), (view.status, view.status_style))]
    for eng in engines:
        ev = eng.latest or _NO_STEP
        sched, budget = ev.scheduled_tokens or 0, eng.step_budget or 0
        prefix = f"dp{eng.engine} " if len(engines) > 1 else ""
        lines.append(line((prefix, "bold"), ("step ", "dim"), (count(ev.step), "bold"), " ",
                           (f"{count(sched)}/{count(budget)} tok", "bold"),
                           (f" (prefill {count(ev.prefill_tokens)}", PREFILL_STYLE),
                           (f" decode {count(ev.decode_tokens)})", DECODE_STYLE)))
        bar_w = max(min(width - 2, 40), 4)
        lines.append(line(budget_bar(ev.prefill_tokens, ev.decode_tokens, sched, budget, bar_w)))
        lines.append(line(("run ", "dim"), count(ev.running), (" wait ", WAITING_STYLE), count(ev.waiting),
                           (" KV ", KV_STYLE), pct(ev.kv_usage),
                           (" preempt ", "red"), count(eng.preemptions),
                           (f" ({count(eng.discarded_tokens)} tok discarded)", "dim")))
        inflight = eng.prefills_in_flight()
        if inflight:
            r = inflight[0]
            start, end = r.last_chunk or (0, 0)
            lines.append(line((f"prefill {r.req_id} chunk {r.chunk_index} [{count(start)}, {count(end)})",
                                PREFILL_STYLE),
                               (f" +{len(inflight) - 1} more" if len(inflight) > 1 else "", "dim")))
    counts = {WAITING: 0, PREFILL: 0, DECODE: 0, PREEMPTED: 0}
    for e in engines:
        for k, v in e.phase_counts().items():
            counts[k] += v
    if engines:
        lines.append(line(("req ", "dim"), (f"{counts[PREEMPTED]} preempted", "red"), sep(),
                           (f"{counts[PREFILL]} prefill", PREFILL_STYLE), sep(),
                           (f"{counts[WAITING]} waiting", WAITING_STYLE), sep(),
                           (f"{counts[DECODE]} decode", DECODE_STYLE), sep(),
                           (f"{sum(e.requests_finished for e in engines)} done", "dim")))
    latest = max((ev for e in engines for ev in e.recent_preempts), key=lambda ev: ev.ts, default=None)
    if latest is not None:
        lines.append(line(("last preemption ", "red"), f"step {count(latest.step)} {latest.req_id} ",
                           (f"{count(latest.discarded_tokens)} tok discarded", "bold"),
                           f" ×{count(latest.num_preemptions)}"))
    if not engines:
        lines.append(line(("no events yet", "dim")))
    if view.notice:
        lines.append(line((view.notice, WARN_STYLE)))
    if stats is not None and (stats.skipped or view.truncated):
        lines.append(line((f"{stats.skipped + view.truncated} lines skipped", WARN_STYLE)))
    lines.append(line((f"terminal {width}×{height or '?'}: {MIN_FULL_WIDTH}×{MIN_FULL_HEIGHT} or more "
                        "shows the full dashboard", "dim italic")))
    if height is not None and len(lines) > height:
        lines = lines[: max(height - 1, 1)] + [lines[-1]] if height > 1 else lines[:1]
    return Group(*lines)
