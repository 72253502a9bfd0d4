"""Small rich pieces of the dashboard: colours, one-line texts, the budget bar, the
stacked token chart, sparklines and the step bucketing that fits a window of steps into
a chart's columns. rich has no chart widget, so the charts are block characters
(eighths of a cell).
"""

from __future__ import annotations

from typing import Any
from collections.abc import Iterable, Sequence

from rich.table import Table
from rich.text import Text

from ..analysis.engine_state import StepRecord
from ..analysis.requests import DECODE, FINISHED, PREEMPTED, PREFILL, WAITING
from .format import count

#: Colours: the same figure has the same colour in every panel and chart.
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
#: How each limit of :func:`vllm_probe.analysis.figures.bound_by` reads.
LIMIT_LABEL = {"token_budget": "token budget", "max_num_seqs": "max_num_seqs",
               "kv_cache": "KV cache", "none": "nothing (queue empty)"}
#: How each ``step.head_blocked_by`` reason reads (why the head of the waiting queue waits).
REASON_LABEL = {"token_budget": "token budget", "max_num_seqs": "max_num_seqs", "kv_cache": "KV cache",
                "preemption": "a preemption in this step", "prefill_limit": "prefill limit",
                "deferred": "deferred (outside the scheduler)", "other": "other"}
_EIGHTHS = " ▁▂▃▄▅▆▇█"


def line(*parts: Any) -> Text:
    """One line that never wraps (cut with an ellipsis): keeps section heights exact."""
    t = Text.assemble(*parts, no_wrap=True, overflow="ellipsis")
    t.no_wrap = True
    t.overflow = "ellipsis"
    return t


def sep() -> tuple[str, str]:
    """The dim `` · `` between the figures of a line."""
    return (" · ", "dim")


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


#: Width of a chart's label column (characters).
CHART_LABEL_W = 9


def chart_grid() -> Table:
    """An empty chart: a right-aligned label column of :data:`CHART_LABEL_W`, then the
    columns of steps (cropped, never wrapped)."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(width=CHART_LABEL_W, justify="right", no_wrap=True)
    grid.add_column(no_wrap=True, overflow="crop")
    return grid


def add_token_chart(grid: Table, recs: Sequence[StepRecord], rows: int) -> None:
    """:func:`token_chart` of ``recs`` in ``rows`` rows of ``grid``, labelled with the
    token budget at the top and ``0 tok`` at the bottom."""
    budget = max((r.budget for r in recs), default=0)
    chart = token_chart(recs, rows)
    for i, row in enumerate(chart):
        label = count(budget) if i == 0 else ("0 tok" if i == len(chart) - 1 else "")
        grid.add_row(Text(label, style="dim"), row)


def spark(values: Iterable[float], top: float, style: str) -> Text:
    """One row, one glyph per value, scaled to ``top`` (blank for 0)."""
    t = Text(no_wrap=True)
    top = top or 1.0
    t.append("".join(" " if v <= 0 else _EIGHTHS[max(1, min(8, round(8 * v / top)))] for v in values), style)
    return t


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
            round(sum(r.prefill_tokens or 0 for r in group) / k) if split else None,
            round(sum(r.decode_tokens or 0 for r in group) / k) if split else None,
            round(sum(r.running for r in group) / k), round(sum(r.waiting for r in group) / k),
            sum(r.kv_usage for r in group) / k, sum(r.schedule_us for r in group) / k,
            sum(r.preempted for r in group), group[-1].bound))
    return out


