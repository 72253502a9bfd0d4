"""Speculative decoding: draft tokens are never counted as prefill (engine/hooks.py).

vLLM 0.32 pads a request that reaches its first decode step in the step its last prompt
token is computed (here: a prefix-cache hit of all but one token) with placeholder
drafts, so it enters the worker with the 1 + ``num_speculative_tokens`` shape of the
other speculative decodes (vLLM's ``tests/v1/core/test_scheduler.py
::test_spec_decode_padding_first_decode_step``, which ``python -m tests.peer`` runs with
the probe on). The probe counted the 3 placeholders as prefill: a chunk [32, 36) of a
33-token prompt. The chunk is [32, 33) and the drafts are decode tokens.
"""

from __future__ import annotations

import pytest

from tests.conftest import requires_vllm

pytestmark = requires_vllm


@pytest.fixture
def spec_scheduler():
    """A real Scheduler with ngram speculative decoding (3 tokens), prefix caching and
    16-token blocks, the probe on it (all flags) writing into a MemorySink."""
    import dataclasses

    import torch
    import vllm
    from vllm.config import SpeculativeConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from vllm_probe import engine as probe
    from vllm_probe.settings import ProbeFlags
    from vllm_probe.sim import harness

    spec = harness.SchedulerSpec(max_num_batched_tokens=256, num_blocks=64, block_size=16,
                                 enable_prefix_caching=True)
    base = harness.make_vllm_config(spec)
    vllm_config = dataclasses.replace(base, speculative_config=SpeculativeConfig(
        model="ngram", num_speculative_tokens=3))
    sink = harness.MemorySink()
    rt = probe.Runtime(ProbeFlags(), lambda _rt: sink)
    assert "Scheduler.schedule" in probe.install(Scheduler, rt, vllm.__version__)
    try:
        kv = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
            ["layer"], FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.float32))])
        sched = Scheduler(vllm_config=vllm_config, kv_cache_config=kv,
                          structured_output_manager=StructuredOutputManager(vllm_config), log_stats=True,
                          block_size=16, hash_block_size=16)
        yield sched, sink
    finally:
        probe.uninstall(Scheduler)


def test_placeholder_drafts_of_a_first_decode_step_are_not_prefill(spec_scheduler):
    from vllm.v1.outputs import DraftTokenIds

    from vllm_probe.sim import harness

    sched, sink = spec_scheduler
    prompt = [3 + i for i in range(33)]
    r1 = harness.make_request(33, 16, req_id="r1", prefix=prompt)
    r2 = harness.make_request(33, 16, req_id="r2", prefix=prompt)
    sched.add_request(r1)
    out = sched.schedule()
    assert out.num_scheduled_tokens["r1"] == 33
    sched.update_from_output(out, harness.model_runner_output(["r1"], [[100]]))
    sched.update_draft_token_ids(DraftTokenIds(["r1"], [[1, 2, 3]]))
    sched.add_request(r2)
    out = sched.schedule()
    # vLLM: r1 verifies its 3 drafts, r2 (32 tokens hit in the prefix cache) computes its
    # last prompt token padded with 3 placeholder drafts
    assert out.num_scheduled_tokens == {"r1": 4, "r2": 4}
    assert out.scheduled_spec_decode_tokens["r2"] == [-1, -1, -1]
    chunks = [(c["req_id"], c["step"], c["chunk_index"], c["start"], c["end"], c["prefill_len"], c["last"])
              for c in sink.of("chunk")]
    assert chunks == [("r1", 0, 0, 0, 33, 33, True), ("r2", 1, 0, 32, 33, 33, True)]
    steps = [(s["scheduled_tokens"], s["prefill_reqs"], s["prefill_tokens"], s["decode_reqs"], s["decode_tokens"])
             for s in sink.of("step")]
    assert steps == [(33, 1, 33, 0, 0), (8, 1, 1, 1, 7)]
