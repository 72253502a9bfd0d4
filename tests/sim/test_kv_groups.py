"""Hybrid KV caches through vLLM's real scheduler: the probe records each KV-cache group
(``engine_config.kv_cache_group_specs``) and vLLM's "Maximum concurrency" figure, the harness
builds the recorded groups on one pool of blocks, and a recording replays at its recorded
settings step for step (before, the replay built one full-attention group: every request then
took a third of the blocks it takes with three windows beside it, and the preemptions and
queues were another run's).

The groups are those vLLM 0.32's hybrid allocator gives the tiny hybrid model
(``python -m vllm_probe.sim.tiny_model --hybrid``: 3 sliding-window layers, 1 full-attention
layer, one layer per group), with the window 64 tokens where the blocks are 16.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import requires_vllm

pytestmark = requires_vllm

WINDOW = 64
GROUPS = [{"kind": "SlidingWindowSpec", "sliding_window": WINDOW, "layers": 1}] * 3 + [
    {"kind": "FullAttentionSpec", "layers": 1}]
#: 47 usable blocks of 16 tokens, budget 128: 8 requests of 64 prompt and 200 output tokens
#: (17 blocks in the full-attention group at the end, up to ⌈(63 + 128) / 16⌉ + 1 = 13 in each
#: window group as vLLM reserves them) run 1 or 2 at a time and preempt.
SPEC = dict(max_num_batched_tokens=128, num_blocks=48, block_size=16, max_model_len=512, kv_groups=GROUPS)


def test_the_harness_builds_the_groups_and_the_probe_records_them():
    """The real engine's configuration of the hybrid model (40 blocks of 128 tokens,
    max_model_len 1,024, budget 256): 4 groups, vLLM's figure 40 / (3 × 5 + 8) = 1.74 as its
    start-up log printed (tests/e2e/test_hybrid_engine.py reads the log)."""
    from tests.sim._spec import probed_scheduler

    groups = [{"kind": "SlidingWindowSpec", "sliding_window": 256, "layers": 1}] * 3 + [
        {"kind": "FullAttentionSpec", "layers": 1}]
    with probed_scheduler(dict(max_num_batched_tokens=256, num_blocks=40, block_size=128, max_model_len=1024,
                               kv_groups=groups)) as (s, sink):
        managers = s.kv_cache_manager.coordinator.single_type_managers
        assert [type(m).__name__ for m in managers] == ["SlidingWindowManager"] * 3 + ["FullAttentionManager"]
        (cfg,) = sink.of("engine_config")
    assert cfg["kv_cache_groups"] == ["SlidingWindowSpec"] * 3 + ["FullAttentionSpec"]
    assert cfg["kv_cache_group_specs"] == [
        {"kind": "SlidingWindowSpec", "block_size": 128, "sliding_window": 256, "layers": 1, "blocks_per_request": 5},
    ] * 3 + [{"kind": "FullAttentionSpec", "block_size": 128, "sliding_window": None, "layers": 1,
              "blocks_per_request": 8}]
    assert cfg["kv_max_concurrency"] == 40 / 23


def record(run: Path) -> None:
    """8 requests of 64 + 200 tokens through the harness's hybrid scheduler, the probe writing
    into ``run`` on a virtual clock (a known linear step cost)."""
    import vllm
    from vllm.v1.core.sched.scheduler import Scheduler

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
    try:
        s = harness.make_scheduler(harness.SchedulerSpec(**SPEC))
        for i in range(8):
            r = harness.make_request(64, 200, req_id=f"r{i}", seed=i)
            r.arrival_time = clock.now
            s.add_request(r)
        while s.has_requests():
            out = harness.step(s)
            clock.now += 0.002 + 1e-5 * out.total_num_scheduled_tokens
        sink.close()
    finally:
        patches.uninstall(Scheduler)
    write_meta(run, {"command": ["hand-made"], "start_time": 1.0})


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("hybrid") / "run"
    record(run)
    return run


def _schedule(run: Path) -> tuple[list[tuple[int, int, int, int]], list[tuple[int, str, int]]]:
    """Every step's ``(scheduled tokens, running, waiting, free blocks)`` and every preemption's
    ``(step, request, discarded tokens)``."""
    evs = [json.loads(line) for p in sorted(run.glob("events-*.jsonl")) for line in p.read_text().splitlines()]
    steps = [(e["scheduled_tokens"], e["running"], e["waiting"], e["free_blocks"]) for e in evs if e["event"] == "step"]
    return steps, [(e["step"], e["req_id"], e["discarded_tokens"]) for e in evs if e["event"] == "preempt"]


def test_a_hybrid_recording_replays_step_for_step(recorded, tmp_path):
    """1,263 steps, 7 preemptions, every step's tokens, queues and free blocks as recorded."""
    from vllm_probe.sim.whatif import predict

    steps, preempts = _schedule(recorded)
    assert (len(steps), len(preempts)) == (1263, 7)
    r = predict(recorded, [], out=tmp_path / "w")
    assert _schedule(r.baseline.run_dir) == (steps, preempts)
    assert any("4 groups (3 × sliding window 64 tokens, 1 layer; 1 × full attention, 1 layer)" in n for n in r.notes)
