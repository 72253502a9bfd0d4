"""A finished run's story on the dashboard: the whole-run overview chart and the notable
moments.

The overview draws every step of the run from the state's timeline
(:class:`~vllm_probe.analysis.timeline.Timeline`: at most 512 spans per engine core,
squeezed into the chart's columns): tokens per step against the budget (prefill under
decode), KV-cache use, the running and waiting queues, and a mark under every column
that holds a preemption. The moments come from
:func:`vllm_probe.analysis.episodes.notable_moments`, the analysis the doctor's findings
share; each names the step to jump to with ``tail --replay --from-step``.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group
from rich.panel import Panel
from rich.text import Text

from ..analysis.moments import Moment
from ..analysis.engine_state import EngineState, StepRecord
from ..analysis.timeline import Timeline
from .charts import (
    CHART_LABEL_W, DECODE_STYLE, KV_STYLE, PREEMPT_STYLE, PREFILL_STYLE, WAITING_STYLE, add_token_chart,
    bucket_steps, chart_grid, line, spark,
)
from .format import count

#: Marks of each kind of moment.
MOMENT_MARK = {"preemptions": ("▼", PREEMPT_STYLE), "wait": ("⧗", WAITING_STYLE), "prefill_block": ("█", PREFILL_STYLE),
               "stall": ("■", "bold yellow")}


def span_records(timeline: Timeline) -> list[StepRecord]:
    """One record per span: per-step means of its tokens, queues and KV use; its
    preemptions summed (``step`` is the span's last step)."""
    out = []
    for sp in timeline:
        n = sp.steps or 1
        bound = max(sp.bound, key=sp.bound.__getitem__) if sp.bound else "none"
        out.append(StepRecord(sp.last_step, sp.last_ts, round(sp.scheduled / n), round(sp.budget / n),
                              round(sp.prefill / n), round(sp.decode / n), round(sp.running_mean),
                              round(sp.waiting_mean), sp.kv_mean, 0.0, sp.preemptions, bound))
    return out


def overview_panel(engines: list[EngineState], width: int, rows: int) -> tuple[Panel, int]:
    """The whole run, every step, in a panel of ``rows`` lines (borders included)."""
    cols = max(width - 4 - CHART_LABEL_W - 1, 5)
    per_engine = 5 if len(engines) == 1 else 6  # KV, running, waiting, preemptions, axis (+ label)
    body = rows - 3
    tok_rows = max((body - per_engine * len(engines)) // max(len(engines), 1), 2)
    grid = chart_grid()
    used = 0
    steps_total = 0
    for eng in engines:
        if used + tok_rows + per_engine > body + 1:
            break
        recs = bucket_steps(span_records(eng.timeline), cols)
        if not recs:
            continue
        steps_total = max(steps_total, eng.steps)
        if len(engines) > 1:
            grid.add_row(Text(f"dp {eng.engine}", style="bold"), Text(""))
            used += 1
        add_token_chart(grid, recs, tok_rows)
        top_run = max((r.running for r in recs), default=0)
        top_wait = max((r.waiting for r in recs), default=0)
        grid.add_row(Text("KV", style=KV_STYLE), spark([r.kv_usage for r in recs], 1.0, KV_STYLE))
        grid.add_row(Text(f"run ≤{top_run}", style=DECODE_STYLE),
                     spark([r.running for r in recs], top_run, DECODE_STYLE))
        grid.add_row(Text(f"wait ≤{top_wait}", style=WAITING_STYLE),
                     spark([r.waiting for r in recs], top_wait, WAITING_STYLE))
        marks = Text(no_wrap=True)
        for r in recs:
            marks.append("▼" if r.preempted else " ", PREEMPT_STYLE)
        grid.add_row(Text(f"▼ {count(eng.preemptions)}", style=PREEMPT_STYLE), marks)
        grid.add_row(Text("step", style="dim"), _axis(recs, eng))
        used += tok_rows + per_engine - (1 if len(engines) > 1 else 0)
    legend = line(("█ prefill", PREFILL_STYLE), "  ", ("█ decode", DECODE_STYLE),
                  ("  tokens per step (mean per column), top = token budget", "dim"), "  ",
                  ("▼ preemptions (total; marked in their column)", PREEMPT_STYLE))
    title = f"the whole run: {count(steps_total)} steps" + (
        f" (~{steps_total / cols:.1f} per column)" if steps_total > cols else "")
    return Panel(Group(grid, legend), title=title, title_align="left", padding=(0, 1)), used + 3


def _axis(recs: Sequence[StepRecord], eng: EngineState) -> Text:
    """Step numbers under the first, middle and last columns."""
    n = len(recs)
    spans = eng.timeline.spans
    first = spans[0].first_step if spans else 0
    cells = [" "] * n
    for pos, value in ((0, first), (n // 2, recs[n // 2].step), (n - 1, recs[-1].step)):
        label = str(value)
        start = min(max(pos - (len(label) // 2 if pos else 0), 0), max(n - len(label), 0))
        if all(c == " " for c in cells[max(start - 1, 0):start + len(label) + 1]):
            cells[start:start + len(label)] = list(label)
    return Text("".join(cells), style="dim", no_wrap=True)


def moments_panel(moments: list[Moment], width: int, rows: int, run_dir: str) -> tuple[Panel, int]:
    """Notable moments, one line each, in step order (``rows``: the panel's height)."""
    room = max(rows - 3, 1)
    shown = moments[:room]
    multi = len({m.engine for m in moments}) > 1
    lines: list[Text] = []
    for m in shown:
        mark, style = MOMENT_MARK.get(m.kind, ("·", ""))
        steps = f"{m.first_step}" if m.first_step == m.last_step else f"{m.first_step}–{m.last_step}"
        lines.append(line((mark + " ", style), (f"dp{m.engine} " if multi else "", "bold"),
                          (f"step {steps}", "bold"), ("  ", ""), (m.text, "")))
    if not lines:
        lines.append(line(("nothing stood out", "dim")))
    first = min((m.first_step for m in moments), default=None)
    lines.append(line(("jump to a step: ", "dim"),
                      (f"vllm-probe tail {run_dir or 'RUN_DIR'} --replay "
                       f"--from-step {first if first is not None else 'N'}", "dim")))
    return Panel(Group(*lines), title="notable moments", title_align="left", padding=(0, 1)), len(lines) + 2
