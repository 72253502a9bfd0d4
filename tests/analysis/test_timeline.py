"""analysis/timeline.py: a whole run in bounded spans, with exact sums and maxima."""

from __future__ import annotations

import pytest

from tests._events import Stream, records
from tests.analysis.test_state import hand_stream
from vllm_probe.analysis.state import RunState
from vllm_probe.analysis.timeline import Timeline


def timeline_of(steps: list[dict], max_spans: int = 4) -> Timeline:
    """The timeline the state builds from step events (budget 8, 1 running): each item's
    ``scheduled`` (all prefill), ``waiting``, ``kv`` and ``preempted`` count."""
    s = Stream(pid=7)
    s.config(99.0, budget=8, max_num_seqs=4)
    for step, st in enumerate(steps):
        s.step(100.0 + step, step, 8, prefill=st.get("scheduled", 4), running=1, waiting=st.get("waiting", 0),
               kv=st.get("kv", 0.5), preempted=[f"p{i}" for i in range(st.get("preempted", 0))])
    return RunState(timeline_spans=max_spans).apply_all(records(s.events)).engines[0].timeline


def test_spans_double_in_width_and_keep_every_step():
    tl = timeline_of([{}] * 4)
    assert (len(tl), tl.width) == (4, 1)
    tl = timeline_of([{}] * 5)  # a fifth span would not fit: pairs merge, width 2
    assert tl.width == 2
    assert [(s.first_step, s.last_step, s.steps) for s in tl] == [(0, 1, 2), (2, 3, 2), (4, 4, 1)]
    steps = [{}] * 5 + [dict(scheduled=0 if step == 9 else 4, waiting=3 if step >= 8 else 0,
                             kv=0.9 if step == 10 else 0.5, preempted=2 if step == 10 else 0) for step in range(5, 11)]
    tl = timeline_of(steps)
    # 11 steps, at most 4 spans: width 4
    assert tl.width == 4
    assert [(s.first_step, s.last_step, s.steps) for s in tl] == [(0, 3, 4), (4, 7, 4), (8, 10, 3)]
    assert [(s.first_ts, s.last_ts) for s in tl] == [(100.0, 103.0), (104.0, 107.0), (108.0, 110.0)]
    last = tl.spans[-1]
    assert (last.scheduled, last.budget, last.waiting_max, last.waiting_sum) == (8, 24, 3, 9)
    assert (last.kv_max, last.preemptions, last.idle_waiting) == (0.9, 2, 1)
    assert last.kv_mean == pytest.approx((0.5 + 0.5 + 0.9) / 3)
    assert last.bound == {"kv_cache": 3}  # waiting, or preempted
    assert sum(s.steps for s in tl) == 11 and sum(s.scheduled for s in tl) == 40
    assert tl.spans[0].running_max == 1 and tl.spans[0].running_sum == 4


def test_the_state_keeps_a_timeline_of_every_step():
    eng = RunState(step_window=3).apply_all(records(hand_stream())).engines[0]
    assert len(eng.window) == 3  # the rolling window forgets; the timeline does not
    spans = list(eng.timeline)
    assert [(s.first_step, s.last_step) for s in spans] == [(i, i) for i in range(8)]
    assert sum(s.scheduled for s in spans) == 25 and sum(s.preemptions for s in spans) == 1
    assert spans[0].bound == {"token_budget": 1} and spans[3].preemptions == 1
