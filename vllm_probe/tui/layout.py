"""The dashboard for a terminal of ``width`` × ``height`` cells: which panels of
:mod:`vllm_probe.tui.dashboard` fit, and how many rows each gets.

Panels in priority order when the terminal is short: header, current step, rolling
chart, preemptions, prefills in flight, findings, requests (and the command's output
while no event has arrived). From :data:`WIDE_WIDTH` columns the middle has two columns:
[current step + chart] | [preemptions + prefills in flight]. Once the run is finished
(``View.finished``) the whole-run overview takes the rolling chart's place, and the
notable moments that of the prefills in flight, across the whole width
(:mod:`vllm_probe.tui.story`). Below
:data:`~vllm_probe.tui.dashboard.MIN_FULL_WIDTH` ×
:data:`~vllm_probe.tui.dashboard.MIN_FULL_HEIGHT` the compact view is shown. Pure: no
I/O, no clock; the caller (:mod:`vllm_probe.tui.watch`) owns the loop and passes ``now``.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table

from ..analysis.engine_state import EngineState
from ..analysis.requests import PREFILL
from ..analysis.state import RunState
from ..runs.reader import ReadStats
from .charts import WARN_STYLE, line
from .dashboard import (
    CHART_MIN_ROWS, CHART_ROWS, MIN_FULL_HEIGHT, MIN_FULL_WIDTH, PREEMPT_ROWS, View, chart_panel, compact_view,
    current_multi_panel, current_panel, header_panel, log_panel, preemptions_panel, prefills_panel, requests_panel,
)
from .doctor_view import findings_panel
from .story import moments_panel, overview_panel

#: Rows of the findings panel at most (borders included).
FINDINGS_ROWS = 6
#: Rows of the whole-run overview when there is room (and its minimum).
OVERVIEW_ROWS, OVERVIEW_MIN_ROWS = 14, 10
#: Notable moments listed on a finished run's dashboard (at most).
MOMENT_ROWS = 6

#: From this many columns on, the middle of the dashboard has two columns.
WIDE_WIDTH = 140


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
        return compact_view(state, engines, stats, view, width, height)

    budget_h = height if height is not None else 10_000
    header, h_header = header_panel(state, meta, stats, view, now, compact=height is not None and height < 30)
    parts: list[RenderableType] = [header]
    left = budget_h - h_header
    if view.notice:
        parts.append(line((view.notice, WARN_STYLE)))
        left -= 1
    if not engines:
        rows = min(left, 14)
        if view.log_tail and rows >= 3:
            panel, _ = log_panel(view.log_tail, rows, "command output (command.log)")
            parts.append(panel)
        return Group(*parts)

    wide = width >= WIDE_WIDTH
    if multi:
        current, h_current = current_multi_panel(engines, width)
    else:
        current, h_current = current_panel(engines[0], (width - _right_width(width)) if wide else width)
    mid = _Middle.of(engines, view, current, h_current)
    log_rows = min(len(view.log_tail), 8) + 2 if view.log_tail else 0
    left -= log_rows
    find_rows = 0
    if view.findings is not None:
        shown = [f for f in view.findings if getattr(f, "id", "") != "not-checked"]
        find_rows = min(max(len(shown), 1) + 2, FINDINGS_ROWS)
        left -= find_rows
    moment_rows = mid.moment_rows
    if moment_rows and left - moment_rows >= OVERVIEW_MIN_ROWS + h_current:
        left -= moment_rows
    else:
        moment_rows = 0
    middle, used = mid.two_columns(width, left) if wide and not multi else mid.one_column(width, left)
    parts += middle
    left -= used
    if moment_rows:
        panel, _ = moments_panel(list(view.moments), width, moment_rows, view.run_dir)
        parts.append(_fixed(panel, moment_rows))
    if find_rows:
        panel, _ = findings_panel(list(view.findings or ()), width, find_rows, live=not view.finished)
        parts.append(_fixed(panel, find_rows))
    if left >= 4:
        req_rows = left if height is not None else min(3 + 30, left)
        reqs, used = requests_panel(engines, now, width, req_rows, multi)
        parts.append(reqs)
        left -= used
    if log_rows:
        panel, _ = log_panel(view.log_tail, log_rows, "command output (last lines of command.log)")
        parts.append(panel)
    return Group(*parts)


@dataclass
class _Middle:
    """The dashboard's middle: the current step, the chart (the whole-run overview once
    the run is finished), the preemptions and the prefills in flight (the notable moments
    once finished): the rows each wants and the least the chart takes."""

    engines: list[EngineState]
    view: View
    current: RenderableType
    h_current: int
    want_pre: int
    want_fill: int
    want_chart: int
    min_chart: int
    n_inflight: int
    moment_rows: int = 0

    @classmethod
    def of(cls, engines: list[EngineState], view: View, current: RenderableType, h_current: int) -> _Middle:
        """The rows each middle panel wants for these engine cores."""
        n_recent = sum(len(e.recent_preempts) for e in engines)
        want_pre = 4 + (1 + min(n_recent, PREEMPT_ROWS) if n_recent else 0)
        if view.finished:  # the whole run instead of the last steps; the moments instead of the prefills in flight
            return cls(engines, view, current, h_current, want_pre, 0, OVERVIEW_ROWS + (len(engines) - 1) * 8,
                       OVERVIEW_MIN_ROWS, 0, min(len(view.moments), MOMENT_ROWS) + 3)
        n_inflight = sum(1 for e in engines for r in e.requests.values() if r.phase == PREFILL)
        per_engine = 2 if len(engines) == 1 else 3
        want_chart = 3 + len(engines) * (max(CHART_ROWS // len(engines), CHART_MIN_ROWS) + per_engine)
        return cls(engines, view, current, h_current, want_pre, 3 + min(n_inflight, 8) if n_inflight else 3,
                   want_chart, 3 + per_engine + CHART_MIN_ROWS, n_inflight)

    @property
    def multi(self) -> bool:
        return len(self.engines) > 1

    def chart(self, w: int, h: int) -> Panel:
        if self.view.finished:
            return overview_panel(self.engines, w, h)[0]
        return chart_panel(self.engines, w, h, self.view.chart_steps)[0]

    def fill(self, w: int, h: int) -> Panel:
        return prefills_panel(self.engines, w, h, self.multi)[0]

    def two_columns(self, width: int, left: int) -> tuple[list[RenderableType], int]:
        """[current step + chart] | [preemptions + prefills in flight] in ``left`` rows at
        most; returns the panels and the rows they take."""
        right_w = _right_width(width)
        left_w = width - right_w
        mid_min = max(self.h_current + self.min_chart, 4 + 3)
        mid_want = max(self.h_current + self.want_chart, self.want_pre + self.want_fill)
        req_min = 4
        mid = min(mid_want, max(left - req_min, mid_min), left)
        chart_h = max(mid - self.h_current, 0)
        fill_h = min(self.want_fill, max(mid - 4 - 1, 3)) if not self.view.finished else 0
        pre_h = mid - fill_h
        left_items: list[RenderableType] = [self.current]
        if chart_h >= self.min_chart:
            left_items.append(_fixed(self.chart(left_w, chart_h), chart_h))
        pre, _ = preemptions_panel(self.engines, right_w, pre_h, self.multi, max_rows=pre_h)
        right_items: list[RenderableType] = [_fixed(pre, pre_h)]
        if fill_h >= 3:
            right_items.append(_fixed(self.fill(right_w, fill_h), fill_h))
        row = Table.grid()  # fixed widths: rich need not measure the nested panels
        row.add_column(width=left_w)
        row.add_column(width=right_w)
        row.add_row(Group(*left_items), Group(*right_items))
        return [row], mid

    def one_column(self, width: int, left: int) -> tuple[list[RenderableType], int]:
        """The middle panels one below the other, in ``left`` rows at most, leaving room for
        the requests table where it can; returns the panels and the rows they take."""
        parts: list[RenderableType] = []
        start = left
        if left >= self.h_current:
            parts.append(self.current)
            left -= self.h_current
        pre_min, req_min = 4, 5  # preemption summary; requests table with 2 rows
        if left - pre_min - req_min >= self.min_chart:
            chart_h = min(self.want_chart, left - pre_min - req_min)
        elif left - pre_min >= self.min_chart:
            chart_h = self.min_chart  # no room for the request table
        else:
            chart_h = 0
        if chart_h:
            parts.append(_fixed(self.chart(width, chart_h), chart_h))
            left -= chart_h
        if left >= pre_min:
            pre_h = min(self.want_pre, max(left - req_min, pre_min))
            pre, _ = preemptions_panel(self.engines, width, pre_h, self.multi)
            parts.append(_fixed(pre, pre_h))
            left -= pre_h
        if self.n_inflight and left >= 4 + req_min:
            fill_h = min(self.want_fill, left - req_min)
            parts.append(_fixed(self.fill(width, fill_h), fill_h))
            left -= fill_h
        return parts, start - left


def _right_width(width: int) -> int:
    """Width of the right column (preemptions, prefills) in the two-column layout."""
    return min(max(width * 2 // 5, 68), width // 2)


def _fixed(panel: Panel, height: int) -> Panel:
    """The same panel forced to ``height`` rows (cropped or padded by rich)."""
    panel.height = height
    return panel
