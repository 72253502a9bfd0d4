"""Speculative decoding through vLLM's real scheduler: what the probe records of each step's
drafts (``step.draft_tokens``, ``verified_tokens``, ``accepted_tokens``; each request's
``request_finished.draft_verifications``), how draft tokens take token-budget slots, and the
replay of a recording at its recorded settings, step for step.

The recording is vLLM 0.32's ``Scheduler`` with an n-gram ``SpeculativeConfig`` (3 draft
tokens), driven without a model by a loop of its own (not the replay's): after each step a
stand-in drafter proposes 3 drafts to every request that decoded, none when the request's
output index is 3 mod 7, and a stand-in model accepts ``(index + request number) % 4`` of them
(capped at the drafts), as ``EngineCore.step`` / ``post_step`` call ``update_from_output`` and
``update_draft_token_ids``. 30 blocks of 16 tokens for 6 requests of 100 + 40 tokens: one
request is preempted with its drafts in hand (``-1``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import requires_vllm

pytestmark = requires_vllm

K = 3
SPEC = dict(max_num_batched_tokens=64, num_blocks=30, block_size=16, max_model_len=256, num_speculative_tokens=K)


def _accept(rid: str, index: int, drafts: int) -> int:
    return min((index + int(rid[1:])) % 4, drafts)


def _proposes(index: int) -> int:
    return 0 if index % 7 == 3 else K


def record(run: Path, requests: int = 6, prompt: int = 100, output: int = 40) -> int:
    """The recording described in the module docstring, into ``run`` (events and meta.json);
    returns its steps."""
    import vllm
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.outputs import DraftTokenIds

    from vllm_probe.engine import patches
    from vllm_probe.engine.hooks import Runtime
    from vllm_probe.engine.sink import EventSink
    from vllm_probe.runs.rundir import write_meta
    from vllm_probe.settings import ProbeFlags
    from vllm_probe.sim import harness
    from vllm_probe.sim.replay import VirtualClock

    run.mkdir(parents=True)
    clock = VirtualClock(1000.0)
    sink = EventSink(run / "events-1.jsonl")
    rt = Runtime(ProbeFlags(), lambda _rt: sink, clock=clock.time, timer=clock.time, speed_mark=None)
    patches.install(Scheduler, rt, vllm.__version__)
    steps = 0
    try:
        s = harness.make_scheduler(harness.SchedulerSpec(**SPEC))
        for i in range(requests):
            r = harness.make_request(prompt, output, req_id=f"r{i}", seed=i)
            r.arrival_time = clock.now
            s.add_request(r)
        while s.has_requests():
            out = s.schedule()
            clock.now += 0.002 + 1e-5 * out.total_num_scheduled_tokens  # a known linear step cost
            ids, sampled = list(out.num_scheduled_tokens), []
            for rid in ids:
                req = s.requests[rid]
                real = len([t for t in out.scheduled_spec_decode_tokens.get(rid, []) if t >= 0])
                n = 0 if req.is_prefill_chunk else 1 + (_accept(rid, req.num_output_tokens, real) if real else 0)
                sampled.append([7] * n)
            s.update_from_output(out, harness.model_runner_output(ids, sampled))
            decoding = [rid for rid in ids if rid in s.requests and not s.requests[rid].is_finished()
                        and not s.requests[rid].is_prefill_chunk]
            if decoding and out.total_num_scheduled_tokens:
                s.update_draft_token_ids(DraftTokenIds(
                    decoding, [[8] * _proposes(s.requests[rid].num_output_tokens) for rid in decoding]))
            steps += 1
        sink.close()
    finally:
        patches.uninstall(Scheduler)
    write_meta(run, {"command": ["hand-made"], "start_time": 1.0})
    return steps


def _events(run: Path) -> list[dict]:
    return [json.loads(line) for p in sorted(run.glob("events-*.jsonl")) for line in p.read_text().splitlines()]


def _figures(run: Path) -> dict:
    evs = _events(run)
    steps = [e for e in evs if e["event"] == "step"]
    return {"steps": len(steps), "preemptions": sum(e["event"] == "preempt" for e in evs),
            "draft_tokens": sum(e.get("draft_tokens") or 0 for e in steps),
            "verified_tokens": sum(e.get("verified_tokens") or 0 for e in steps),
            "accepted_tokens": sum(e.get("accepted_tokens") or 0 for e in steps),
            "scheduled": [e["scheduled_tokens"] for e in steps],
            "verifications": {e["req_id"]: e.get("draft_verifications") for e in evs
                              if e["event"] == "request_finished"}}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("spec") / "run"
    record(run)
    return run


def test_the_probe_records_each_steps_drafts_and_each_requests_acceptance(recorded):
    """r0 (request 0): drafts at output 1 (1 accepted: 1 % 4), 4 (0), 5 (1), 7 (3), then 3 at a
    time and all accepted (index 3 mod 4) up to 27; at 3 and 31 (3 mod 7) it proposed nothing
    and decoded one token; 0 accepted at 32, 1 at 33, 3 at 35 and 39 (its 40th token ends it).
    r3 was preempted (step 8) holding the 3 drafts it had at output 2 (``2:3:-1``); its re-prefill
    sampled output 3, where it proposed nothing. Per step, the accepted tokens arrive on the
    next step's line."""
    f = _figures(recorded)
    assert (f["steps"], f["preemptions"], f["draft_tokens"], f["verified_tokens"], f["accepted_tokens"]) == (
        37, 1, 216, 216, 157)
    assert f["verifications"]["r0"] == ["1:3:1", "4:3:0", "5:3:1", "7:3:3", "11:3:3", "15:3:3", "19:3:3", "23:3:3",
                                        "27:3:3", "32:3:0", "33:3:1", "35:3:3", "39:3:3"]
    assert f["verifications"]["r3"][:3] == ["1:3:0", "2:3:-1", "4:3:3"]
    accepted = sum(max(int(v.split(":")[2]), 0) for vs in f["verifications"].values() for v in vs)
    assert accepted == f["accepted_tokens"] == 157
    cfg = _events(recorded)[0]
    assert (cfg["num_speculative_tokens"], cfg["speculative_method"]) == (3, "ngram")


def test_a_replay_at_the_recorded_settings_proposes_and_accepts_as_recorded(recorded, tmp_path):
    """Steps, preemptions, every step's scheduled tokens, the draft slots and accepted tokens,
    and every request's verifications are the recording's (before: one token per step and
    request, so 240 output tokens took far more steps than 37)."""
    from vllm_probe.sim.whatif import predict

    r = predict(recorded, [], out=tmp_path / "w")
    want, got = _figures(recorded), _figures(r.baseline.run_dir)
    assert got == want
    assert r.baseline.summary.steps == r.recorded.steps == 37
    assert any("accepts as many as recorded (157 accepted tokens over 6 requests)" in n for n in r.notes)


def test_draft_tokens_take_token_budget_slots():
    """Budget 16, 5 requests of 3 prompt tokens (15 tokens, one step), then every request
    proposes 3 drafts: a decode with drafts takes 1 + 3 tokens of max_num_scheduled_tokens, so
    the next step schedules 4 of the 5 (16 tokens, 12 of them draft slots) and the fifth
    decodes in the step after."""
    from vllm.v1.outputs import DraftTokenIds

    from tests.sim._spec import probed_scheduler

    with probed_scheduler(dict(max_num_batched_tokens=16, max_num_seqs=8, num_blocks=16, block_size=16,
                               max_model_len=64, num_speculative_tokens=K)) as (s, sink):
        from vllm_probe.sim import harness

        for i in range(5):
            s.add_request(harness.make_request(3, 4, req_id=f"q{i}", seed=i))
        harness.step(s)
        s.update_draft_token_ids(DraftTokenIds([f"q{i}" for i in range(5)], [[8] * K] * 5))
        out = harness.step(s)
        assert out.num_scheduled_tokens == {"q0": 4, "q1": 4, "q2": 4, "q3": 4}
        steps = sink.of("step")
        assert [(e["scheduled_tokens"], e["decode_reqs"], e["decode_tokens"], e["draft_tokens"]) for e in steps] == [
            (15, 0, 0, 0), (16, 4, 16, 12)]
