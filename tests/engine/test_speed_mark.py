"""The machine-speed mark: a fixed computation timed when the probe starts and at its end,
written as ``engine_config.speed_mark_us`` and ``probe_stats.speed_mark_us``, and read back
per engine core into the summary."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from tests.conftest import requires_vllm
from vllm_probe.engine import speed
from vllm_probe.engine.sink import EventSink
from vllm_probe.schema.events import STEP


def test_the_mark_is_the_median_pass_of_a_fixed_computation_and_never_raises():
    # the reference is the same work everywhere: its result is fixed
    assert speed.reference_work() == 38_717_241 and speed.REFERENCE_LOOPS == 10_000
    # five passes of 5, 1, 3, 2 and 4 µs (each pass: a start and an end reading)
    readings = iter([0.0, 5e-6, 1.0, 1.0 + 1e-6, 2.0, 2.0 + 3e-6, 3.0, 3.0 + 2e-6, 4.0, 4.0 + 4e-6])
    assert speed.measure(5, timer=lambda: next(readings)) == 3.0

    def broken() -> float:
        raise OSError("no clock")

    assert speed.measure(timer=broken) is None
    real = speed.measure()
    assert real is not None and real > 0


def _marks(values):
    """A speed_mark callable returning ``values`` one after the other (µs)."""
    it = iter(values)
    return lambda: next(it)


def test_a_stop_signal_writes_the_events_first_then_a_probe_stats_line_with_the_end_mark(tmp_path):
    """The checkpoint writes what is queued and its probe_stats line before the few ms of
    the mark (a SIGKILL may follow the signal), then one more probe_stats line with the
    mark and the same counts; close() adds nothing after that."""
    sink = EventSink(tmp_path / "events-1.jsonl", speed_mark=_marks([812.5]))
    for i in range(3):
        sink.emit(STEP, 100.0 + i, 0, STEP.pack(step=i, scheduled_tokens=1, token_budget=8, new_reqs=0, running=1,
                                                waiting=0, kv_usage=0.1, free_blocks=7, schedule_us=1.0,
                                                preempted=[], finished=[]))
    sink.checkpoint()
    sink.close()
    lines = [json.loads(x) for x in (tmp_path / "events-1.jsonl").read_text().splitlines()]
    assert [e["event"] for e in lines] == ["step"] * 3 + ["probe_stats"] * 2
    first, last = lines[-2], lines[-1]
    assert "speed_mark_us" not in first and last["speed_mark_us"] == 812.5
    assert first["events_written"] == last["events_written"] == 3
    assert sink.end_speed_mark_us == 812.5


def test_without_a_mark_the_probe_stats_line_is_as_before(tmp_path):
    sink = EventSink(tmp_path / "events-1.jsonl")
    sink.close()
    (line,) = (tmp_path / "events-1.jsonl").read_text().splitlines()
    assert json.loads(line) == {"event": "probe_stats", "ts": json.loads(line)["ts"], "pid": sink.pid, "engine": 0,
                                "schema": 1, "events_written": 0, "events_dropped": 0, "hook_errors": {},
                                "hooks_disabled": []}


def _probed_run(run_dir, speed_mark):
    """The preempting workload on vLLM's real Scheduler, the probe writing ``run_dir``
    through file_sink_factory with ``speed_mark``."""
    from vllm.v1.core.sched.scheduler import Scheduler

    from tests._workload import SPEC, trace, workload
    from vllm_probe import engine as probe
    from vllm_probe.engine.hooks import file_sink_factory
    from vllm_probe.settings import ProbeFlags
    from vllm_probe.sim import harness as testing

    kw = {} if speed_mark == "default" else {"speed_mark": speed_mark}
    rt = probe.Runtime(ProbeFlags(), file_sink_factory(run_dir), **kw)
    assert probe.install(Scheduler, rt, "0.32.0")
    try:
        trace(testing.make_scheduler(testing.SchedulerSpec(**SPEC)), workload())
    finally:
        probe.uninstall(Scheduler)
    rt.sink.close()
    (path,) = run_dir.glob("events-*.jsonl")
    return [json.loads(x) for x in path.read_text().splitlines()]


@requires_vllm
def test_the_engine_writes_a_mark_when_the_probe_starts_and_at_its_end(tmp_path):
    """The first mark goes on engine_config (taken as the scheduler is built, before its
    first step), the second on the final probe_stats (taken at close); the summary keeps
    both, their geometric mean as the run's mark and how the host's speed moved."""
    from vllm_probe.analysis.summary import summarize
    from vllm_probe.analysis.summary_types import SpeedMark

    events = _probed_run(tmp_path / "run", _marks([1000.0, 1210.0]))
    config, stats = events[0], events[-1]
    assert config["event"] == "engine_config" and config["speed_mark_us"] == 1000.0
    # the newest optional fields, last (the KV-cache groups and vLLM's concurrency came after the mark)
    assert list(config)[-3:] == ["speed_mark_us", "kv_cache_group_specs", "kv_max_concurrency"]
    kinds = [e["event"] for e in events]
    assert kinds.index("engine_config") == 0 < kinds.index("step")  # taken before the first step
    assert stats["event"] == "probe_stats" and stats["speed_mark_us"] == 1210.0
    mark = summarize(tmp_path / "run").speed_mark
    # the engine's own decode periods are wall-clock (timed below); the fixed mark is exact
    assert dataclasses.replace(mark, decode_steps=[]) == SpeedMark(
        start_us=1000.0, end_us=1210.0, mark_us=math.sqrt(1000.0 * 1210.0), change=1210.0 / 1000.0 - 1.0, engines=1)
    assert mark.mark_us == pytest.approx(1100.0, abs=1e-9)
    # the workload's decode-only stretches: 51 periods at one decode, 45 at two
    assert [(d.batch, d.steps) for d in mark.decode_steps] == [(1, 51), (2, 45)]
    assert all(d.median_us > 0 for d in mark.decode_steps)


@requires_vllm
def test_the_default_mark_is_measured_and_a_replay_writes_none(tmp_path):
    from vllm_probe.analysis.summary import summarize
    from vllm_probe.analysis.summary_types import SpeedMark

    events = _probed_run(tmp_path / "real", "default")
    assert events[0]["speed_mark_us"] > 0 and events[-1]["speed_mark_us"] > 0
    nomark = _probed_run(tmp_path / "none", None)
    assert all("speed_mark_us" not in e for e in nomark)
    assert dataclasses.replace(summarize(tmp_path / "none").speed_mark, decode_steps=[]) == SpeedMark()

    from tests.sim._hand import nonlinear_cost, poisson, record, workload

    run = record(tmp_path / "replayed", workload(poisson(n=6)), nonlinear_cost)
    assert "speed_mark_us" not in (run / "events-1.jsonl").read_text()
    assert summarize(run).speed_mark == SpeedMark()
