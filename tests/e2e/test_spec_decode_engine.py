"""Speculative decoding on vLLM 0.32's CPU engine (the tiny model, dummy weights): the n-gram
proposer runs for real, the probe records every step's drafts and each request's acceptance,
and ``whatif`` replays the recording at its recorded settings step for step — the same steps,
preemptions, draft slots and accepted tokens (measured: 274 steps, 6 preemptions, 1,843 draft
tokens, 1,783 accepted; before, the replay sampled one token per step: docs/whatif.md,
Coverage). The random model answers in short cycles, which the n-gram proposer predicts well."""

from __future__ import annotations

import json

import pytest

from tests.conftest import requires_vllm

pytestmark = [requires_vllm, pytest.mark.engine]

#: QUICK_WORKLOAD's burst (8 prompts of 600 tokens, 20 blocks: it preempts) with 3 n-gram drafts.
SPEC_WORKLOAD = ["--num-prompts", "8", "--prompt-tokens", "600", "--max-tokens", "300", "--num-kv-blocks", "20",
                 "--max-num-batched-tokens", "256", "--max-model-len", "1024", "--speculative-config",
                 json.dumps({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                             "prompt_lookup_min": 1})]


def _figures(run_dir) -> dict:
    evs = [json.loads(line) for p in sorted(run_dir.glob("events-*.jsonl")) for line in p.read_text().splitlines()]
    steps = [e for e in evs if e["event"] == "step"]
    finished = [e for e in evs if e["event"] == "request_finished"]
    return {"steps": [(e["scheduled_tokens"], e["running"], e["waiting"], e["preempted"], e.get("draft_tokens"),
                       e.get("accepted_tokens")) for e in steps],
            "preemptions": [(e["step"], e["req_id"], e["discarded_tokens"]) for e in evs if e["event"] == "preempt"],
            "verifications": {e["req_id"]: e.get("draft_verifications") for e in finished},
            "output_tokens": sum(e["output_tokens"] for e in finished)}


def test_a_real_ngram_run_is_recorded_and_replays_step_for_step(probe_run, tmp_path):
    from vllm_probe.sim.whatif import predict

    run = probe_run(*SPEC_WORKLOAD)
    cfg = json.loads(next(run.glob("events-*.jsonl")).open().readline())
    assert (cfg["num_speculative_tokens"], cfg["speculative_method"]) == (3, "ngram")
    rec = _figures(run)
    drafts = sum(s[4] for s in rec["steps"])
    accepted_steps = sum(s[5] for s in rec["steps"])
    accepted = sum(max(int(v.split(":")[2]), 0) for vs in rec["verifications"].values() for v in vs or ())
    # what the test is about: drafts verified and accepted, and preemptions
    assert drafts > 0 and accepted > 0 and rec["preemptions"] and rec["output_tokens"] == 8 * 300
    # the step lines carry each output's acceptance on the next line: the last output's on none
    # when the engine core stops stepping at the last finish
    assert 0 < accepted_steps <= accepted
    r = predict(run, [], out=tmp_path / "w")
    assert _figures(r.baseline.run_dir) == rec
