"""``step.head_blocked_by`` on the reading side: the state's counts per engine core and
per timeline span, the summary's shares, the ``--plain`` line and the step panel."""

from __future__ import annotations

from tests._events import Stream, records
from tests.tui.test_dashboard import render, squash
from vllm_probe.analysis.state import RunState
from vllm_probe.analysis.summary import summarize_events
from vllm_probe.schema.records import from_dict
from vllm_probe.tui.plain import PlainFormatter

#: head_blocked_by of steps 0..9 (None: nothing waited). One value a newer probe may write.
REASONS = ["token_budget", "token_budget", "kv_cache", "kv_cache", "kv_cache", None, "preemption", "deferred",
           "a_newer_reason", None]


def stream(engine: int = 0) -> Stream:
    s = Stream(engine=engine, pid=10 + engine)
    s.config(100.0, budget=64, max_num_seqs=4)
    for i, reason in enumerate(REASONS):
        ev = s.step(101.0 + i, i, 64, prefill=64 if i < 2 else 0, decode=1, running=1,
                    waiting=0 if reason is None else 2, preempted=["X"] if reason == "preemption" else ())
        if reason is not None:
            ev["head_blocked_by"] = reason
    return s


def test_counts_per_engine_and_per_span():
    state = RunState().apply_all(records(stream(0).events + stream(1).events))
    for eng in state.engines.values():
        # steps without the field are not counted; an unknown value counts as "other"
        assert eng.head_blocked_counts == {"token_budget": 2, "kv_cache": 3, "preemption": 1, "deferred": 1,
                                           "other": 1}
        assert [sp.head_blocked for sp in eng.timeline][:3] == [{"token_budget": 1}, {"token_budget": 1},
                                                                {"kv_cache": 1}]
        assert [sp.head_blocked for sp in eng.timeline][5] == {}
        assert [r.head_blocked for r in eng.window] == [r if r != "a_newer_reason" else "other" for r in REASONS]


def test_spans_merge_their_counts():
    s = Stream(pid=10)
    s.config(100.0, budget=8, max_num_seqs=4)
    for i, reason in enumerate(("kv_cache", "kv_cache", "token_budget")):
        s.step(101.0 + i, i, 8, prefill=4, running=1, waiting=1)["head_blocked_by"] = reason
    tl = RunState(timeline_spans=2).apply_all(records(s.events)).engines[0].timeline
    assert tl.width == 2 and [sp.head_blocked for sp in tl] == [{"kv_cache": 2}, {"token_budget": 1}]


def test_summary_shares_over_the_steps_that_carried_it():
    s = summarize_events(records(stream(0).events))
    assert s.head_blocked_steps == 8
    assert s.head_blocked_by == {"kv_cache": 3 / 8, "token_budget": 2 / 8, "preemption": 1 / 8, "deferred": 1 / 8,
                                 "other": 1 / 8}
    assert next(iter(s.head_blocked_by)) == "kv_cache"  # most frequent first
    assert s.to_dict()["head_blocked_by"]["kv_cache"] == 0.375


def test_plain_line_names_the_reason_and_never_prints_an_unknown_one():
    state = RunState()
    fmt = PlainFormatter(state)
    lines = []
    for ev in map(from_dict, stream(0).events):
        state.apply(ev)
        if (line := fmt.format(ev)) is not None:
            lines.append(line)
    assert "run 1 wait 2 (head: kv_cache) | kv 50% free 10 blk |" in lines[2]
    assert "run 1 wait 0 | kv 50% free 10 blk |" in lines[5]
    assert "(head: other)" in lines[8] and "a_newer_reason" not in lines[8]


def test_step_panel_shows_it():
    state = RunState().apply_all(records(stream(0).events[:5]))  # config + steps 0..3: the latest is kv_cache
    assert "10 free blocks = 1,280 tok · head waits on KV cache · held back" in squash(render(state, now=105.0))
