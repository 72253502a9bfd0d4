"""``async_scheduling`` as a whatif setting: an AsyncScheduler run replayed with it off
loses its held slots; a synchronous run replayed with it on gains them."""

from __future__ import annotations

import pytest

from tests.conftest import requires_vllm

pytestmark = requires_vllm


@pytest.fixture(scope="module")
def async_run(tmp_path_factory):
    """AsyncScheduler, max_num_seqs 4, 120 prompts of 8 tokens with max_tokens 1 (vLLM #45257
    scaled down): the 4 finished requests keep their slots one more step."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from tests._simrun import record

    return record(tmp_path_factory.mktemp("async") / "run",
                  dict(max_num_batched_tokens=256, max_num_seqs=4, num_blocks=64, max_model_len=256,
                       async_scheduling=True),
                  [(f"R{i}", 8, 1) for i in range(120)], scheduler_cls=AsyncScheduler, async_drive=True)


def test_the_setting_resolves_from_the_recorded_scheduler_class():
    from vllm_probe.sim import engine_args

    cfg = {"max_num_batched_tokens": 256, "max_num_seqs": 4, "num_kv_blocks": 64, "block_size": 16,
           "max_model_len": 256, "enable_chunked_prefill": True, "scheduler_class": "AsyncScheduler",
           "async_scheduling": False}
    settings, spec = engine_args.resolve(cfg, {})
    assert settings["async_scheduling"] is True and spec.async_scheduling is True
    settings, spec = engine_args.resolve(cfg, {"async_scheduling": False})
    assert settings["async_scheduling"] is False and spec.async_scheduling is False
    assert engine_args.parse_sets(["async_scheduling=false,true"]) == [{"async_scheduling": False},
                                                                        {"async_scheduling": True}]


def test_replayed_with_async_off_the_held_slots_go(async_run, tmp_path):
    from vllm_probe.analysis.objectives import from_summary
    from vllm_probe.sim.whatif import predict

    r = predict(async_run, [{"async_scheduling": False}], out=tmp_path / "w")
    base, off = r.baseline.summary, r.configs[0].summary
    assert base.config["scheduler_class"] == "AsyncScheduler" and off.config["scheduler_class"] == "Scheduler"
    assert r.configs[0].settings["async_scheduling"] is False
    assert from_summary(base, "held_slot_steps") == from_summary(r.recorded, "held_slot_steps") == 29
    assert from_summary(off, "held_slot_steps") == 0
    assert (base.steps, off.steps) == (r.recorded.steps, 31) == (61, 31)
