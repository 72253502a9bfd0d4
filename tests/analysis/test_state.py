"""vllm_probe.analysis.state on a small hand-made event stream with exact expected numbers.

The stream (budget 8 tokens, one engine core):

====  =====  ==============================================================
step  ts     what happens
====  =====  ==============================================================
 -    100.0  A arrives (prompt 10, max_tokens 3, arrival_ts 99.9); B arrives
             (prompt 4, max_tokens 5, arrival_ts 100.0)
 0    100.1  A chunk 0 [0, 8)                       prefill 8
 1    100.2  A chunk 1 [8, 10) last, B chunk 0 [0, 4) last    prefill 6
 2    100.3  decode A, B                            decode 2
 3    100.4  B preempted (5 computed tokens discarded, 2 output), decode A
 -    100.45 A finishes (length, 3 output tokens)
 4    100.5  B resumed: chunk 0 [0, 6) last (prefill_len 6 = 4 + 2)
 5    100.6  decode B
 6    100.7  decode B
 -    100.75 B finishes (length, 5 output tokens, 1 preemption)
 7    100.8  empty step
====  =====  ==============================================================

Chunk and preempt events carry a ts 1 ms before their step's (as the probe writes
them: inside ``schedule()``, before the step event).
"""

from __future__ import annotations

import pytest

from tests._events import records
from vllm_probe.analysis.state import DECODE, FINISHED, PREEMPTED, PREFILL, RunState

BUDGET = 8


def _step(step, ts, sched, prefill=0, prefill_reqs=0, decode=0, decode_reqs=0, running=0, waiting=0,
          kv=0.0, preempted=(), finished=(), engine=0):
    return {"event": "step", "ts": ts, "pid": 1, "engine": engine, "schema": 1, "step": step,
            "scheduled_tokens": sched, "token_budget": BUDGET, "prefill_reqs": prefill_reqs,
            "prefill_tokens": prefill, "decode_reqs": decode_reqs, "decode_tokens": decode, "new_reqs": 0,
            "running": running, "waiting": waiting, "kv_usage": kv, "free_blocks": 10,
            "schedule_us": 100.0 + step, "preempted": list(preempted), "finished": list(finished)}


def _chunk(step, ts, req, idx, start, end, prompt, prefill_len, last, resumed=False, engine=0):
    ev = {"event": "chunk", "ts": ts, "pid": 1, "engine": engine, "schema": 1, "step": step, "req_id": req,
          "chunk_index": idx, "start": start, "end": end, "prompt_len": prompt, "prefill_len": prefill_len,
          "last": last, "resumed": resumed}
    if idx == 0:
        ev["prefix_hit_tokens"] = start
    return ev


def hand_stream(engine: int = 0) -> list[dict]:
    """The stream of the module docstring (every event of the run, in file order)."""
    e = engine
    return [
        {"event": "engine_config", "ts": 99.0, "pid": 1, "engine": e, "schema": 1, "vllm_version": "0.32.0",
         "scheduler_class": "Scheduler", "max_num_batched_tokens": BUDGET, "max_num_seqs": 4,
         "enable_chunked_prefill": True, "long_prefill_token_threshold": 0, "num_kv_blocks": 11,
         "block_size": 4, "kv_capacity_tokens": 40, "max_model_len": 64, "scheduling_policy": "fcfs",
         "async_scheduling": False, "prefix_caching": False, "data_parallel_size": 1},
        {"event": "request_added", "ts": 100.0, "pid": 1, "engine": e, "schema": 1, "req_id": "A",
         "prompt_len": 10, "max_tokens": 3, "temperature": 0.0, "top_p": 1.0, "priority": 0, "arrival_ts": 99.9},
        {"event": "request_added", "ts": 100.0, "pid": 1, "engine": e, "schema": 1, "req_id": "B",
         "prompt_len": 4, "max_tokens": 5, "temperature": 0.0, "top_p": 1.0, "priority": 0, "arrival_ts": 100.0},
        _chunk(0, 100.099, "A", 0, 0, 8, 10, 10, False, engine=e),
        _step(0, 100.1, 8, prefill=8, prefill_reqs=1, running=1, waiting=1, kv=0.2, engine=e),
        _chunk(1, 100.199, "A", 1, 8, 10, 10, 10, True, engine=e),
        _chunk(1, 100.199, "B", 0, 0, 4, 4, 4, True, engine=e),
        _step(1, 100.2, 6, prefill=6, prefill_reqs=2, running=2, waiting=0, kv=0.4, engine=e),
        _step(2, 100.3, 2, decode=2, decode_reqs=2, running=2, waiting=0, kv=0.5, engine=e),
        {"event": "preempt", "ts": 100.399, "pid": 1, "engine": e, "schema": 1, "step": 3, "req_id": "B",
         "discarded_tokens": 5, "prompt_len": 4, "output_tokens": 2, "num_preemptions": 1, "kv_usage": 1.0,
         "running": 1, "waiting": 1, "reason": "kv_cache"},
        _step(3, 100.4, 1, decode=1, decode_reqs=1, running=1, waiting=1, kv=0.6, preempted=["B"], engine=e),
        {"event": "request_finished", "ts": 100.45, "pid": 1, "engine": e, "schema": 1, "step": 3, "req_id": "A",
         "reason": "length", "prompt_len": 10, "output_tokens": 3, "num_preemptions": 0},
        _chunk(4, 100.499, "B", 0, 0, 6, 4, 6, True, resumed=True, engine=e),
        _step(4, 100.5, 6, prefill=6, prefill_reqs=1, running=1, waiting=0, kv=0.3, finished=["A"], engine=e),
        _step(5, 100.6, 1, decode=1, decode_reqs=1, running=1, waiting=0, kv=0.3, engine=e),
        _step(6, 100.7, 1, decode=1, decode_reqs=1, running=1, waiting=0, kv=0.3, engine=e),
        {"event": "request_finished", "ts": 100.75, "pid": 1, "engine": e, "schema": 1, "step": 6, "req_id": "B",
         "reason": "length", "prompt_len": 4, "output_tokens": 5, "num_preemptions": 1},
        _step(7, 100.8, 0, running=0, waiting=0, kv=0.0, finished=["B"], engine=e),
    ]


def upto(stream: list[dict], kind: str, step: int) -> list[dict]:
    """The stream cut right after the event of ``kind`` at ``step``."""
    for i, ev in enumerate(stream):
        if ev["event"] == kind and ev.get("step") == step:
            return stream[: i + 1]
    raise AssertionError(f"no {kind} at step {step}")


def finished_by_id(state: RunState) -> dict:
    return {r.req_id: r for r in state.engines[0].finished}


def test_queue_time_and_ttft_in_seconds_and_steps():
    state = RunState().apply_all(records(hand_stream()))
    reqs = finished_by_id(state)
    a, b = reqs["A"], reqs["B"]
    # queue: arrival -> first chunk; A arrived at 99.9 (front end), B at 100.0
    assert a.queue_time_s == pytest.approx(100.099 - 99.9)
    assert b.queue_time_s == pytest.approx(100.199 - 100.0)
    # first token: sampled by the step of the last chunk (1), seen at the next step (ts 100.3)
    assert a.first_token_step == 1 and b.first_token_step == 1
    assert a.ttft_s == pytest.approx(100.3 - 99.9)
    assert b.ttft_s == pytest.approx(100.3 - 100.0)
    assert a.ttft_steps == 2 and b.ttft_steps == 2
    # decode: first token -> finished
    assert b.decode_time_s == pytest.approx(100.75 - 100.3)
    assert b.mean_itl_s == pytest.approx((100.75 - 100.3) / 4)


def test_chunks_preemption_and_recompute_per_request():
    reqs = finished_by_id(RunState().apply_all(records(hand_stream())))
    a, b = reqs["A"], reqs["B"]
    assert (a.chunks, a.first_pass_chunks, a.passes, a.preemptions) == (2, 2, 1, 0)
    assert (b.chunks, b.first_pass_chunks, b.passes, b.preemptions) == (2, 1, 2, 1)
    assert b.discarded_tokens == 5
    assert b.recomputed_tokens == 6  # the resumed pass [0, 6)
    assert a.recomputed_tokens == 0
    assert (a.output_tokens, b.output_tokens) == (3, 5)
    assert (a.finish_reason, b.finish_reason) == ("length", "length")
    assert a.phase == b.phase == FINISHED


def test_engine_totals():
    state = RunState().apply_all(records(hand_stream()))
    eng = state.engines[0]
    assert eng.steps == 8 and eng.last_step == 7
    assert eng.scheduled_tokens == 8 + 6 + 2 + 1 + 6 + 1 + 1 + 0
    assert (eng.prefill_tokens, eng.decode_tokens) == (20, 5)
    assert (eng.preemptions, eng.discarded_tokens, eng.recomputed_tokens) == (1, 5, 6)
    assert eng.chunks == 4
    assert (eng.requests_added, eng.requests_finished) == (2, 2)
    assert eng.requests == {}  # both finished
    assert eng.bound_counts["token_budget"] == 1  # step 0 used all 8 tokens
    assert eng.config.max_num_batched_tokens == BUDGET
    assert state.total("steps") == 8 and state.engine_ids() == [0]


def test_mid_run_prefill_in_flight():
    state = RunState().apply_all(records(upto(hand_stream(), "step", 0)))
    eng = state.engines[0]
    (a,) = eng.prefills_in_flight()
    assert a.req_id == "A" and a.phase == PREFILL
    assert (a.chunk_index, a.last_chunk, a.computed, a.prefill_len) == (0, (0, 8), 8, 10)
    assert eng.requests["B"].phase == "waiting"
    assert eng.phase_counts() == {"waiting": 1, "prefill": 1, "decode": 0, "preempted": 0}


def test_preempted_request_between_preemption_and_resume():
    state = RunState().apply_all(records(upto(hand_stream(), "step", 3)))
    b = state.engines[0].requests["B"]
    assert b.phase == PREEMPTED and b.computed == 0
    assert b.waiting_since_ts == pytest.approx(100.399) and b.last_preempt_step == 3
    assert b.estimated_output_tokens(3) == 2  # exact: from the preempt event
    assert b.estimated_computed_tokens(3) == 0
    assert state.engines[0].recent_preempts[-1].discarded_tokens == 5


def test_decode_estimates_after_the_recompute_pass():
    state = RunState().apply_all(records(upto(hand_stream(), "step", 5)))
    b = state.engines[0].requests["B"]
    assert b.phase == DECODE and b.pass_end_step == 4
    # the pass [0, 6) re-prefilled prompt (4) + 2 outputs and sampled the 3rd; step 5 the 4th
    assert b.estimated_output_tokens(5) == 4
    assert b.estimated_computed_tokens(5) == 7
    assert b.estimated_output_tokens(50) == 5  # capped at max_tokens
    # A, before it finished: 1 token after step 1, +1 per step
    a_state = RunState().apply_all(records(upto(hand_stream(), "step", 2))).engines[0].requests["A"]
    assert a_state.estimated_output_tokens(2) == 2 and a_state.estimated_computed_tokens(2) == 11


def test_window_stats():
    eng = RunState().apply_all(records(hand_stream())).engines[0]
    ws = eng.window_stats()
    assert ws.steps == 8 and (ws.first_step, ws.last_step) == (0, 7)
    assert ws.span_s == pytest.approx(0.7)
    assert ws.step_rate == pytest.approx(7 / 0.7)
    assert ws.preemptions == 1 and ws.preempt_rate == pytest.approx(1 / 0.7)
    assert ws.budget_use == pytest.approx(25 / 64)
    assert ws.schedule_us_mean == pytest.approx(103.5) and ws.schedule_us_max == 107.0
    last3 = eng.window_stats(last_n=3)
    assert last3.steps == 3 and last3.first_step == 5 and last3.preemptions == 0
    assert last3.step_rate == pytest.approx(2 / 0.2)


def test_memory_is_bounded_by_the_windows():
    state = RunState(step_window=3, finished_keep=1)
    seen = []
    state.on_request_finished = seen.append
    state.apply_all(records(hand_stream()))
    eng = state.engines[0]
    assert [r.step for r in eng.window] == [5, 6, 7]
    assert [r.req_id for r in eng.finished] == ["B"]
    assert [r.req_id for r in seen] == ["A", "B"]  # the callback still sees every request


def test_engines_are_kept_apart_and_unknown_kinds_ignored():
    stream = hand_stream(0) + hand_stream(1) + [{"event": "mystery", "ts": 101.0, "engine": 0}]
    state = RunState().apply_all(records(sorted(stream, key=lambda ev: ev["ts"])))
    assert state.engine_ids() == [0, 1]
    assert state.engines[0].preemptions == state.engines[1].preemptions == 1
    assert state.total("preemptions") == 2 and state.total("recomputed_tokens") == 12
    assert state.events == 2 * len(hand_stream())


def test_probe_stats_count_the_last_line_per_file():
    stats = [{"event": "probe_stats", "ts": 101.0 + i, "pid": pid, "engine": 0, "events_written": 10,
              "events_dropped": dropped, "hook_errors": {}, "hooks_disabled": disabled}
             for i, (pid, dropped, disabled) in enumerate([(1, 3, []), (1, 5, ["chunk"]), (2, 7, [])])]
    eng = RunState().apply_all(records(hand_stream() + stats)).engines[0]
    assert eng.events_dropped == 5 + 7  # pid 1: its last (cumulative) line; pid 2: 7
    assert eng.hooks_disabled == ["chunk"]


def test_requests_finish_from_step_ids_when_request_events_are_off():
    """With log_request_events off, a step's `finished` ids close the request (bounded memory)."""
    from vllm_probe.analysis.state import RunState

    st = RunState()
    common = {"pid": 1, "engine": 0, "schema": 1}
    st.apply(*records([{"event": "chunk", "ts": 1.0, "step": 0, "req_id": "a", "chunk_index": 0, "start": 0,
              "end": 10, "prompt_len": 10, "prefill_len": 10, "last": True, "resumed": False,
              "prefix_hit_tokens": 0, **common}]))
    st.apply(*records([{"event": "step", "ts": 1.0, "step": 0, "scheduled_tokens": 10, "token_budget": 64,
              "running": 1, "waiting": 0, "preempted": [], "finished": [], **common}]))
    assert "a" in st.engines[0].requests
    st.apply(*records([{"event": "step", "ts": 2.0, "step": 1, "scheduled_tokens": 0, "token_budget": 64,
              "running": 0, "waiting": 0, "preempted": [], "finished": ["a"], **common}]))
    eng = st.engines[0]
    assert eng.requests == {} and eng.requests_finished == 1
    (req,) = eng.finished
    # first token: sampled at the end of step 0, seen at the next step (ts 2.0)
    assert (req.req_id, req.phase, req.finished_ts, req.first_token_ts) == ("a", "finished", 2.0, 2.0)


def test_bucketed_timings_and_preemptions_by_reason():
    """The state's bounded distributions (figures.Buckets) on the stream above, by hand.

    schedule(): 100 + step µs: step 0's 100 µs in the bucket up to 100 µs, steps 1..7
    (101..107 µs) in (100 µs, 250 µs]; queue: A 0.199 s, B 0.199 s; TTFT: A 0.4 s, B 0.3 s.
    """
    from vllm_probe.analysis.figures import LATENCY_S_BOUNDS, SCHEDULE_S_BOUNDS

    eng = RunState().apply_all(records(hand_stream())).engines[0]
    sched = dict(zip(SCHEDULE_S_BOUNDS + (float("inf"),), eng.schedule_s.counts))
    assert sched[1e-4] == 1 and sched[2.5e-4] == 7 and eng.schedule_s.count == 8  # 100 µs <= 1e-4 s
    assert eng.schedule_s.sum == pytest.approx(sum(100 + s for s in range(8)) * 1e-6)
    queue = dict(zip(LATENCY_S_BOUNDS + (float("inf"),), eng.queue_s.counts))
    assert queue[0.25] == 2 and eng.queue_s.count == 2  # 0.199 s each
    assert eng.queue_s.sum == pytest.approx(0.199 + 0.199)
    ttft = dict(zip(LATENCY_S_BOUNDS + (float("inf"),), eng.ttft_s.counts))
    assert ttft[0.5] == 2 and eng.ttft_s.count == 2  # 0.4 s and 0.3 s: both in (0.25, 0.5]
    assert eng.ttft_s.cumulative()[LATENCY_S_BOUNDS.index(0.25)] == (0.25, 0)
    assert eng.ttft_s.sum == pytest.approx(0.7)
    assert eng.preemptions_by_reason == {"kv_cache": 1, "reset": 0}
    assert eng.discarded_by_reason == {"kv_cache": 5, "reset": 0}


def test_unknown_preemption_reasons_are_counted_as_other():
    stream = hand_stream()
    odd = [dict(ev, reason=reason, req_id=f"X{i}", discarded_tokens=10 * (i + 1))
           for i, reason in enumerate(["drained-by-operator", None, "reset"])
           for ev in stream if ev["event"] == "preempt"]
    for ev in odd:
        if ev["reason"] is None:
            del ev["reason"]
    eng = RunState().apply_all(records(stream + odd)).engines[0]
    assert eng.preemptions_by_reason == {"kv_cache": 1, "reset": 1, "other": 2}
    assert eng.discarded_by_reason == {"kv_cache": 5, "reset": 30, "other": 10 + 20}
