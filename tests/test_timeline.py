"""analysis/timeline.py: a whole run in bounded spans, with exact sums and maxima."""

from __future__ import annotations

import pytest

from tests.test_state import hand_stream
from vllm_probe.analysis.state import RunState
from vllm_probe.analysis.timeline import Timeline


def add(tl: Timeline, step: int, scheduled: int = 4, waiting: int = 0, kv: float = 0.5, preempted: int = 0,
        bound: str = "none") -> None:
    tl.add(step, 100.0 + step, scheduled, 8, scheduled, 0, 1, waiting, kv, preempted, bound)


def test_spans_double_in_width_and_keep_every_step():
    tl = Timeline(max_spans=4)
    for step in range(4):
        add(tl, step)
    assert (len(tl), tl.width) == (4, 1)
    add(tl, 4)  # a fifth span would not fit: pairs merge, width 2
    assert tl.width == 2
    assert [(s.first_step, s.last_step, s.steps) for s in tl] == [(0, 1, 2), (2, 3, 2), (4, 4, 1)]
    for step in range(5, 11):
        add(tl, step, scheduled=0 if step == 9 else 4, waiting=3 if step >= 8 else 0,
            kv=0.9 if step == 10 else 0.5, preempted=2 if step == 10 else 0)
    # 11 steps, at most 4 spans: width 4
    assert tl.width == 4
    assert [(s.first_step, s.last_step, s.steps) for s in tl] == [(0, 3, 4), (4, 7, 4), (8, 10, 3)]
    last = tl.spans[-1]
    assert (last.scheduled, last.budget, last.waiting_max, last.waiting_sum) == (8, 24, 3, 9)
    assert (last.kv_max, last.preemptions, last.idle_waiting) == (0.9, 2, 1)
    assert last.kv_mean == pytest.approx((0.5 + 0.5 + 0.9) / 3)
    assert sum(s.steps for s in tl) == 11 and sum(s.scheduled for s in tl) == 40


def test_the_state_keeps_a_timeline_of_every_step():
    eng = RunState(step_window=3).apply_all(hand_stream()).engines[0]
    assert len(eng.window) == 3  # the rolling window forgets; the timeline does not
    spans = list(eng.timeline)
    assert [(s.first_step, s.last_step) for s in spans] == [(i, i) for i in range(8)]
    assert sum(s.scheduled for s in spans) == 25 and sum(s.preemptions for s in spans) == 1
    assert spans[0].bound == {"token_budget": 1} and spans[3].preemptions == 1
