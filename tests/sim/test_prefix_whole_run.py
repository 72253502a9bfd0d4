"""Prefix caching over a whole run: a recording whose later prompts repeat earlier answers
(a conversation's next turn, after an idle gap) replays at its recorded settings with the
recorded prefix hits, preemptions and steps, request for request.

The recording is vLLM's real scheduler driven on a virtual clock whose step times a known
linear cost sets, with real token ids: the second turn's prompt is the first turn's
prompt, the answer the fake model gave (:data:`~vllm_probe.sim.replay.SAMPLE_TOKEN` each
token) and new tokens, so the engine hits the blocks of that answer it still holds. The
replay rebuilds prompts from the digests alone (``request_added.block_digests`` and
``request_finished.output_block_digests``). Also: a stretch cut before such a prompt, the
availability of requests drained with the one that woke an idle engine, and the note on a
recording without the answers' digests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import requires_vllm
from vllm_probe.analysis.workload import Workload, WorkloadRequest

#: Block size and the scheduler of the recording: 49 usable blocks of 16 tokens, fewer than
#: the six first turns need at full length (3 shared + 6 x 9: 88 + 96 tokens each), so
#: both turns preempt, and the second turn's allocations evict cached answers.
BLOCK = 16
SPEC: dict[str, Any] = dict(max_num_batched_tokens=256, max_num_seqs=16, num_blocks=50, block_size=BLOCK,
                            max_model_len=512, enable_prefix_caching=True)
SHARED = 48  # system prefix: 3 blocks
FIRST, ANSWER, FOLLOW_UP = 88, 96, 8  # first prompt, answer and new tokens of the second turn
CONVERSATIONS = 6
GAP_S = 3.0


def linear_cost(features) -> float:
    """A known step time (s): the fit recovers it exactly, so the replay's clock is the
    recording's and any difference is the replay's."""
    from vllm_probe.sim.stepmodel import _INDEX

    cost = {"prefill_tokens": 1e-5, "attn_prefill": 2e-8, "decode_reqs": 4e-4, "attn_decode": 1e-7,
            "new_shape": 0.003, "first_step": 0.02}
    return 0.002 + sum(c * features[_INDEX[name]] for name, c in cost.items())


def conversations() -> tuple[Workload, dict[str, list[int]]]:
    """Two turns of :data:`CONVERSATIONS` conversations, :data:`GAP_S` apart, and every
    request's token ids."""
    from vllm_probe.sim.replay import SAMPLE_TOKEN

    shared = [5 + i for i in range(SHARED)]
    tokens: dict[str, list[int]] = {}
    reqs: list[WorkloadRequest] = []
    t0 = 1000.0
    for turn in range(2):
        for k in range(CONVERSATIONS):
            rid = f"c{k}t{turn}"
            own = [1000 + 100 * k + 10 * turn + j for j in range(FIRST - SHARED if turn == 0 else FOLLOW_UP)]
            if turn == 0:
                tokens[rid] = shared + own
            else:  # the first turn, its answer (the fake model's tokens), new tokens
                tokens[rid] = tokens[f"c{k}t0"] + [SAMPLE_TOKEN] * ANSWER + own
            t = t0 + turn * GAP_S + 0.01 * k
            reqs.append(WorkloadRequest(order=len(reqs), req_id=rid, prompt_len=len(tokens[rid]), max_tokens=ANSWER,
                                        output_tokens=ANSWER, arrival_ts=t, added_ts=t, finish_reason="length"))
    return Workload("hand-made", {"scheduler_class": "Scheduler", "hash_block_size": BLOCK}, reqs), tokens


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    from vllm_probe.engine.sink import EventSink
    from vllm_probe.runs.rundir import write_meta
    from vllm_probe.sim.harness import SchedulerSpec
    from vllm_probe.sim.replay import replay

    run = tmp_path_factory.mktemp("conv") / "run"
    run.mkdir()
    w, tokens = conversations()
    sink = EventSink(run / "events-1.jsonl")
    try:
        replay(w, SchedulerSpec(**SPEC), linear_cost, sink, lag_s=0.0, prompts=lambda r: tokens[r.req_id])
    finally:
        sink.close()
    write_meta(run, {"command": ["hand-made"], "start_time": 1.0})
    return run


def _passes(run: Path) -> dict[str, list[tuple[int, int, bool]]]:
    """Each request's prefill passes: ``(step, prefix_hit_tokens, resumed)``."""
    from vllm_probe.runs.reader import ReadStats, iter_run_lines

    out: dict[str, list[tuple[int, int, bool]]] = {}
    for ev, _ in iter_run_lines(run, ReadStats()):
        if ev.kind == "chunk" and ev.chunk_index == 0:
            out.setdefault(ev.req_id, []).append((ev.step, ev.prefix_hit_tokens or 0, bool(ev.resumed)))
    return out


@requires_vllm
def test_the_probe_writes_the_digests_of_an_answers_blocks(recorded):
    """``request_finished.output_block_digests``: the blocks past the first turn's 5 full
    prompt blocks (88 + 96 tokens: blocks 5-10), the same digests the second turn's prompt
    has there; the second turn's, past its 11 full prompt blocks (192 + 96 tokens)."""
    from vllm_probe.analysis.workload import load_workload

    w = load_workload(recorded)
    by_id = {r.req_id: r for r in w.requests}
    for k in range(CONVERSATIONS):
        first, second = by_id[f"c{k}t0"], by_id[f"c{k}t1"]
        assert first.block_digests is not None and second.block_digests is not None
        assert len(first.block_digests) == FIRST // BLOCK == 5
        assert first.output_digests is not None and len(first.output_digests) == 6  # 184 // 16 - 5
        assert second.block_digests[:11] == first.block_digests + first.output_digests
        assert len(second.block_digests) == (FIRST + ANSWER + FOLLOW_UP) // BLOCK == 12
        assert second.output_digests is not None and len(second.output_digests) == 6  # 288 // 16 - 12
    assert len({d for r in w.requests for d in r.block_digests or ()}) == 3 + 6 * 2 + 6 * 7


@requires_vllm
def test_a_whole_run_with_an_idle_gap_replays_its_prefix_hits_exactly(recorded, tmp_path):
    """At the recorded settings every prefill pass hits what it hit in the recording: the
    second turns hit their answers' blocks as far as the cache still held them (the later
    conversations' answers were evicted by then: 48, the system prefix, is all they hit),
    the resumed passes hit their own blocks; steps, preemptions and hit tokens are the
    recording's. Rebuilt from the prompts' digests alone, the second turns hit 80 tokens
    at most (the first prompt's 5 full blocks) and the replay preempted 2 times, not 3."""
    from vllm_probe.sim.whatif import predict

    rec = _passes(recorded)
    # the recording has what the test is about: hits on answers, evictions, preemptions
    assert rec == {"c0t0": [(0, 0, False)], "c1t0": [(1, 48, False)], "c2t0": [(1, 48, False)],
                   "c3t0": [(2, 48, False)], "c4t0": [(4, 48, False)], "c5t0": [(5, 48, False), (96, 64, True)],
                   "c0t1": [(121, 96, False)], "c1t1": [(124, 112, False)], "c2t1": [(127, 80, False)],
                   "c3t1": [(129, 48, False), (217, 64, True)], "c4t1": [(220, 48, False)],
                   "c5t1": [(220, 48, False), (223, 192, True)]}
    r = predict(recorded, [], out=tmp_path / "w")
    base, want = r.baseline.summary, r.recorded
    assert _passes(r.baseline.run_dir) == rec
    assert (base.steps, base.preemptions.count, base.chunking.prefix_hit_tokens) == (
        want.steps, want.preemptions.count, want.chunking.prefix_hit_tokens) == (319, 3, 672)


def test_a_plan_shares_the_blocks_of_equal_ids_prompt_and_answer():
    """A second prompt that repeats a first request's prompt and answer gets the first's
    planned output tokens there; tails past the ids are each request's own; a stop token
    at the end of a full answer block goes into every prompt repeating that block."""
    from vllm_probe.sim.replay import SAMPLE_TOKEN, STOP_TOKEN
    from vllm_probe.sim.tokens import PromptBuilder

    b = PromptBuilder(4)
    first = b.plan(0, 6, ["a"], ["x", "y"], output_len=6)  # 12 tokens: blocks a, x, y
    assert len(first.prompt()) == 6 and first.covered == 12
    answer = [first.output_token(i, SAMPLE_TOKEN) for i in range(6)]
    assert first.prompt()[4:] + answer == [first.token(i) for i in range(4, 12)]
    second = b.plan(1, 14, ["a", "x", "y"], output_len=2)
    assert second.prompt()[:12] == first.prompt() + answer
    assert second.prompt()[12:] != [first.token(12), first.token(13)]  # past the ids: its own
    assert first.output_token(6, SAMPLE_TOKEN) == SAMPLE_TOKEN  # past the plan: the default
    stopped = b.plan(2, 6, ["a"], ["x", "z"], output_len=6, stop_token=STOP_TOKEN)
    assert stopped.output_token(5, SAMPLE_TOKEN) == STOP_TOKEN
    assert b.plan(3, 12, ["a", "x", "z"]).prompt()[11] == STOP_TOKEN
    # a partial prompt without ids: the old rule, unique tails
    assert b.tokens(4, 5, None) != b.tokens(5, 5, None)


def test_a_stretch_whose_requests_repeat_an_earlier_answer_starts_earlier():
    """Prefix caching on: the second request (after an idle moment) shares no prompt
    block with the first, but its prompt's block is the first's answer block: the stretch
    of its steps starts where the first began."""
    from vllm_probe.analysis.workload import StepRow
    from vllm_probe.sim.cut import stretch_for

    def req(order, add, finish, digests, out_digests=None):
        return WorkloadRequest(order=order, req_id=f"r{order}", prompt_len=16, max_tokens=4, output_tokens=4,
                               arrival_ts=float(add), added_ts=float(add), add_before_step=add,
                               finish_step=finish, finish_reason="length", block_digests=digests,
                               output_digests=out_digests)

    steps = [StepRow(s, 0.0, 0.0, 0.0, 16, 0) for s in range(11)]
    reqs = [req(0, 0, 3, None, ["ans"]), req(1, 4, 6, ["u"]), req(2, 7, 10, ["ans"])]
    w = Workload("hand-made", {"prefix_caching": True}, reqs, steps=steps, last_step=10)
    st = stretch_for(w, 8, 8, max_share=1.0)
    assert st is not None and st.first_step == 0
    reqs[0].output_digests = ["other"]
    st = stretch_for(w, 8, 8)
    assert st is not None and st.first_step == 7


def test_requests_drained_with_the_one_that_woke_the_engine_are_available_when_it_started():
    """r0 runs steps 0-1, step 2 reports it, the engine idles until r1 wakes it for step 3
    (at 13.0 s); r2 and r3 were drained with r1, so they too became available at 13.0 s,
    not somewhere after step 2 (10.1 s: a replay would start step 3 with one of them
    alone); r4, added while step 3 ran, somewhere in (13.0, 13.05]."""
    from vllm_probe.analysis.workload import StepRow, availability_windows

    starts = [10.0, 10.05, 10.1, 13.0, 13.05]
    steps = [StepRow(k, t, t, 0.0, 16, 0) for k, t in enumerate(starts)]

    def req(order: int, add: int, stamp: float, finish: int) -> WorkloadRequest:
        return WorkloadRequest(order=order, req_id=f"r{order}", prompt_len=16, max_tokens=4, output_tokens=4,
                               arrival_ts=stamp, added_ts=stamp, add_before_step=add, finish_step=finish,
                               finish_reason="length")

    reqs = [req(0, 0, 10.0, 1), req(1, 3, 12.990, 4), req(2, 3, 12.992, 4), req(3, 3, 12.995, 4),
            req(4, 4, 13.01, 4)]
    w = Workload("hand-made", {}, reqs, steps=steps, last_step=4)
    availability_windows(w)
    assert [(r.idle_add, r.avail_lo, r.avail_hi) for r in reqs] == [
        (True, 10.0, 10.0), (True, 13.0, 13.0), (False, 13.0, 13.0), (False, 13.0, 13.0),
        (False, 13.0 + 1e-6, 13.05)]


def test_a_recording_without_the_answers_digests_says_what_the_replay_misses():
    """Prefix caching on, prompts digested, an answer that filled a block and no
    ``output_block_digests`` (an older probe): a note; with them, or with answers that
    filled no block, none."""
    from vllm_probe.sim.plan import notes_of

    def workload(out_tokens: int, out_digests: list[str] | None) -> Workload:
        r = WorkloadRequest(order=0, req_id="r0", prompt_len=40, max_tokens=out_tokens, output_tokens=out_tokens,
                            arrival_ts=1.0, added_ts=1.0, finish_step=3, finish_reason="length",
                            block_digests=["a", "b"], output_digests=out_digests)
        return Workload("hand-made", {"prefix_caching": True, "hash_block_size": 16}, [r])

    def missing(w: Workload) -> list[str]:
        return [n for n in notes_of(w) if "output_block_digests" in n]

    assert missing(workload(30, None)) == [
        "request_finished has no output_block_digests (an older probe): a prompt that repeats an earlier answer "
        "hits the prefix cache only up to that answer in the replay"]
    assert missing(workload(30, ["c", "d"])) == []
    assert missing(workload(7, None)) == []  # 47 tokens: the answer filled no block (2 full, as the prompt)
