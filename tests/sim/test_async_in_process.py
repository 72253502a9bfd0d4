"""AsyncScheduler runs replayed at their recorded settings: steps and held slots exact.

The recording drives vLLM's real ``AsyncScheduler`` as ``LLM`` does with its engine core in
its own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, how the CPU engine runs the real
``AsyncScheduler`` here, examples/long_prompts.py): ``LLMEngine.step`` while the front end
has unfinished requests, each call ``EngineCore.step_with_batch_queue`` with a batch queue
of two (vllm/v1/engine/core.py, 0.32), on a virtual clock whose step times a known linear
cost sets. Such an engine core stops at its last finish, where a server's busy loop runs
one more step to report the finished requests: a replay that ran that step after each
wave had one step more per wave (measured on real async runs: 27 steps for 26)."""

from __future__ import annotations

import json
import time
from collections import deque
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import requires_vllm

pytestmark = requires_vllm

#: max_num_seqs 4 and one-token requests: a finished request holds its slot one more step
SPEC: dict[str, Any] = dict(max_num_batched_tokens=256, max_num_seqs=4, num_blocks=64, block_size=16, max_model_len=256)
#: (arrival s, requests (id, prompt tokens, output tokens)): two waves 2 s apart, the
#: engine idle in between; the second mixes longer outputs in
WAVES = [(1000.0, [(f"a{i}", 8, 1) for i in range(10)]),
         (1002.0, [(f"b{i}", 24, 1 if i % 2 else 12) for i in range(10)])]


def linear_cost(features) -> float:
    """A known step time (s): the fit recovers it exactly."""
    from vllm_probe.sim.stepmodel import _INDEX

    cost = {"prefill_tokens": 1e-5, "decode_reqs": 4e-4, "new_shape": 0.003, "first_step": 0.02}
    return 0.002 + sum(c * features[_INDEX[name]] for name, c in cost.items())


def record_in_process(run_dir: Path) -> Path:
    """:data:`WAVES` through a probed ``AsyncScheduler`` driven as an in-process ``LLM``."""
    import vllm
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_probe.engine import hooks, patches
    from vllm_probe.settings import ProbeFlags
    from vllm_probe.sim import harness
    from vllm_probe.sim.replay import SAMPLE_TOKEN, VirtualClock
    from vllm_probe.sim.stepmodel import ShapeTracker, output_features

    run_dir.mkdir(parents=True, exist_ok=True)
    clock = VirtualClock(WAVES[0][0])
    rt = hooks.Runtime(ProbeFlags(), hooks.file_sink_factory(run_dir), clock=clock.time, timer=clock.time,
                       speed_mark=None)
    patches.install(Scheduler, rt, vllm.__version__)
    try:
        s = harness.make_scheduler(harness.SchedulerSpec(**SPEC, async_scheduling=True), AsyncScheduler)
        shapes = ShapeTracker()
        batch_queue: deque = deque()
        for at, reqs in WAVES:
            clock.now = max(clock.now, at)
            for rid, prompt, out in reqs:
                req = harness.make_request(prompt, out, req_id=rid)
                req.arrival_time = clock.now
                s.add_request(req)
            while s.has_unfinished_requests():  # LLM._run_engine: the front end has unfinished requests
                # EngineCore.step_with_batch_queue
                if s.has_requests():
                    out = s.schedule()
                    sampled = [r for r in out.num_scheduled_tokens if not s.requests[r].is_prefill_chunk]
                    clock.now += linear_cost(output_features(s, out, shapes))
                    batch_queue.appendleft((out, sampled))
                    if len(batch_queue) < 2 and (out.total_num_scheduled_tokens > 0 or s.has_requests()):
                        continue
                out, sampled = batch_queue.pop()
                req_ids = list(out.num_scheduled_tokens)
                s.update_from_output(out, harness.model_runner_output(
                    req_ids, [[SAMPLE_TOKEN] if r in sampled else [] for r in req_ids]))
        rt.sink.close()
    finally:
        patches.uninstall(Scheduler)
    (run_dir / "meta.json").write_text(json.dumps({"command": ["in-process LLM"], "start_time": time.time(),
                                                   "exit_code": 0}))
    return run_dir


@pytest.fixture(scope="module")
def in_process(tmp_path_factory) -> Path:
    return record_in_process(tmp_path_factory.mktemp("async") / "run")


def _steps(run: Path) -> list[tuple]:
    from vllm_probe.runs.reader import ReadStats, iter_run_lines

    return [(ev.step, ev.scheduled_tokens, ev.new_reqs, ev.running, ev.waiting, ev.head_blocked_by)
            for ev, _ in iter_run_lines(run, ReadStats()) if ev.kind == "step"]


def test_an_in_process_async_run_replays_step_for_step(in_process, tmp_path):
    """Every step as recorded, the held slots (steps whose head waited ``deferred``) too;
    no step after a wave's last finish, in the recording or the replay."""
    from vllm_probe.analysis.objectives import from_summary
    from vllm_probe.analysis.workload import load_workload
    from vllm_probe.sim.replay import flushes_when_idle
    from vllm_probe.sim.whatif import predict

    w = load_workload(in_process)
    assert not flushes_when_idle(w)
    first_wave_end = max(r.finish_step or 0 for r in w.requests if r.req_id.startswith("a"))
    assert min(r.add_before_step for r in w.requests if r.req_id.startswith("b")) == first_wave_end + 1
    r = predict(in_process, [], out=tmp_path / "w")
    base, rec = r.baseline.summary, r.recorded
    assert base.config["scheduler_class"] == rec.config["scheduler_class"] == "AsyncScheduler"
    assert _steps(r.baseline.run_dir) == _steps(in_process)
    assert (base.steps, from_summary(base, "held_slot_steps")) == (rec.steps, from_summary(rec, "held_slot_steps"))
    assert (rec.steps, from_summary(rec, "held_slot_steps")) == (32, 6.0)


def test_a_busy_loop_run_keeps_its_reporting_steps(tmp_path):
    """A server's engine core (the busy loop) steps once more after its last finish: the
    recording says so and the replay does it too."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from tests._simrun import record
    from vllm_probe.analysis.workload import load_workload
    from vllm_probe.sim.replay import flushes_when_idle
    from vllm_probe.sim.whatif import predict

    run = record(tmp_path / "run", dict(SPEC, async_scheduling=True), [(f"R{i}", 8, 1 + i % 8) for i in range(40)],
                 scheduler_cls=AsyncScheduler, async_drive=True)
    w = load_workload(run)
    assert flushes_when_idle(w) and w.last_step == max(r.finish_step or 0 for r in w.requests) + 1
    r = predict(run, [], out=tmp_path / "w")
    assert _steps(r.baseline.run_dir) == _steps(run)
