"""Guarantees 2, 6 (SIGKILL) and 7: the sink's faults never reach vLLM and lose nothing
uncounted.

2. an unwritable run directory, a run directory removed mid-run, a full disk: vLLM's
   scheduler decides exactly as without the probe, the probe says so in one warning
   line, every event is either written or counted as dropped, and the final
   statistics (the last ``probe_stats`` line, or a warning when the file is gone)
   give the counts;
6. SIGKILL: every line on disk is complete JSON, nothing is missing in the middle,
   and at most the last FLUSH_INTERVAL_S of events is lost; after a stop signal (vLLM's
   abort-mode shutdown kills the engine core milliseconds later) the file still ends
   with a ``probe_stats`` line that counts it, and at most STOPPING_FLUSH_INTERVAL_S is
   lost;
7. a flood faster than the writer: memory stays bounded by the queue cap, the
   emitting thread never waits, drops are counted exactly.

The oracle for "which events" is the same workload probed into a MemorySink.
"""

from __future__ import annotations

import errno
import json
import logging
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tests._workload import SPEC, probe_warnings, trace, workload
from tests.conftest import ROOT, requires_vllm
from vllm_probe.schema.events import STEP
from vllm_probe.engine.sink import FLUSH_INTERVAL_S, STOPPING_FLUSH_INTERVAL_S, EventSink

VARYING = {"arrival_ts", "schedule_us", "speed_mark_us"}  # differ between two runs of the same workload


def step_event(i, finished=()):
    """A step event built by name, as the probe's step hook builds it."""
    return STEP.pack(step=i, scheduled_tokens=10, token_budget=64, prefill_reqs=1, prefill_tokens=9,
                     decode_reqs=1, decode_tokens=1, new_reqs=1, running=2, waiting=0, kv_usage=0.5,
                     free_blocks=7, schedule_us=12.5, preempted=[], finished=list(finished))


def comparable(kind: str, fields: dict) -> tuple:
    return kind, tuple(sorted((k, json.dumps(v)) for k, v in fields.items()
                              if v is not None and k not in VARYING))


@pytest.fixture(scope="module")
def scheduler_cls():
    from vllm.v1.core.sched.scheduler import Scheduler

    return Scheduler


@pytest.fixture(scope="module")
def reference(scheduler_cls):
    """(trace without the probe, events of the probed run in a MemorySink)."""
    from vllm_probe import engine as probe
    from vllm_probe.sim import harness as testing
    from vllm_probe.settings import ProbeFlags

    baseline = trace(testing.make_scheduler(testing.SchedulerSpec(**SPEC)), workload())
    sink = testing.MemorySink()
    probe.install(scheduler_cls, probe.Runtime(ProbeFlags(), lambda _rt: sink), "0.32.0")
    try:
        assert trace(testing.make_scheduler(testing.SchedulerSpec(**SPEC)), workload()) == baseline
    finally:
        probe.uninstall(scheduler_cls)
    assert sink.of("preempt") and len(sink.events) > 100
    return baseline, [comparable(k, f) for k, f in sink.events]


@pytest.fixture
def probed(scheduler_cls):
    """install() with a sink factory of the test's choosing; uninstalled afterwards."""
    from vllm_probe import engine as probe
    from vllm_probe.settings import ProbeFlags

    made = []

    def make(factory, flags=None):
        def keep(rt):
            made.append(factory(rt))
            return made[-1]

        rt = probe.Runtime(flags or ProbeFlags(), keep)
        assert probe.install(scheduler_cls, rt, "0.32.0")
        return rt

    yield make
    probe.uninstall(scheduler_cls)
    for sink in made:
        sink.close()


def file_events(path):
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines]


def as_comparable(events):
    common = ("event", "ts", "pid", "engine", "schema")
    return [comparable(e["event"], {k: v for k, v in e.items() if k not in common}) for e in events]


# -- everything written when nothing goes wrong ---------------------------------------------


@requires_vllm
def test_nothing_lost_on_a_healthy_disk(probed, reference, tmp_path):
    from vllm_probe.sim import harness as testing
    from vllm_probe.engine.hooks import file_sink_factory

    baseline, expected = reference
    rt = probed(file_sink_factory(tmp_path / "run"))
    assert trace(testing.make_scheduler(testing.SchedulerSpec(**SPEC)), workload()) == baseline
    rt.sink.close()
    (path,) = (tmp_path / "run").iterdir()
    assert stat.S_IMODE((tmp_path / "run").stat().st_mode) == 0o700  # owner only
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    events = file_events(path)
    assert as_comparable(events[:-1]) == expected  # every event, in order, once
    assert events[-1]["event"] == "probe_stats"
    assert (events[-1]["events_written"], events[-1]["events_dropped"]) == (len(expected), 0)


# -- 2. sink faults ---------------------------------------------------------------------------


def _denied(path):
    raise PermissionError(errno.EACCES, "Permission denied", str(path))


@requires_vllm
@pytest.mark.parametrize("how", ["parent is a file", "permission denied"])
def test_unwritable_run_dir(how, probed, reference, tmp_path, caplog):
    from vllm_probe.sim import harness as testing
    from vllm_probe.engine.hooks import file_sink_factory

    baseline, expected = reference
    caplog.set_level(logging.WARNING, logger="vllm_probe")
    if how == "parent is a file":
        (tmp_path / "afile").write_text("")
        factory = file_sink_factory(tmp_path / "afile" / "run")
    else:
        def factory(rt):
            return EventSink(tmp_path / "events.jsonl", stats_extra=rt.health.snapshot, opener=_denied)
    rt = probed(factory)
    assert trace(testing.make_scheduler(testing.SchedulerSpec(**SPEC)), workload()) == baseline
    (warning,) = probe_warnings(caplog)  # one line while serving, not one per event
    assert "cannot open" in warning and "events are dropped and counted from now on" in warning
    rt.sink.close()
    assert (rt.sink.written, rt.sink.dropped) == (0, len(expected))
    final = probe_warnings(caplog)[1:]
    assert len(final) == 1
    assert final[0].startswith(f"vllm-probe: 0 events written, {len(expected)} dropped (cannot open")
    assert sorted(p.name for p in tmp_path.iterdir()) == (["afile"] if how == "parent is a file" else [])


@requires_vllm
def test_run_dir_removed_mid_run(probed, reference, tmp_path, caplog):
    from vllm_probe.sim import harness as testing
    from vllm_probe.engine.hooks import file_sink_factory

    baseline, expected = reference
    caplog.set_level(logging.WARNING, logger="vllm_probe")
    run_dir = tmp_path / "run"
    rt = probed(file_sink_factory(run_dir))
    sched = testing.make_scheduler(testing.SchedulerSpec(**SPEC))
    first = trace(sched, workload(), steps=len(baseline) // 2)
    rt.sink.flush()
    written_before = len(next(run_dir.iterdir()).read_text().splitlines())
    assert written_before > 0
    shutil.rmtree(run_dir)
    rest = trace(sched, [])
    assert first + rest == baseline
    rt.sink.close()
    warnings = probe_warnings(caplog)
    assert len(warnings) == 2, warnings
    assert "was deleted; events are dropped and counted from now on" in warnings[0]
    assert rt.sink.written == written_before and rt.sink.written + rt.sink.dropped == len(expected)
    assert warnings[1].startswith(f"vllm-probe: {written_before} events written, "
                                  f"{len(expected) - written_before} dropped (cannot write")
    assert not run_dir.exists()  # the probe does not bring a removed directory back


class _DiskFull:
    """A file whose disk fills up after ``room`` bytes: later writes raise ENOSPC."""

    def __init__(self, path, room):
        self._f = open(path, "ab", buffering=0)  # noqa: SIM115 - a file stand-in, closed by close()
        self.room = room

    def write(self, data):
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self._f.write(data)

    def fileno(self):
        return self._f.fileno()

    def close(self):
        self._f.close()


@requires_vllm
def test_disk_full(probed, reference, tmp_path, caplog):
    from vllm_probe.sim import harness as testing

    baseline, expected = reference
    caplog.set_level(logging.WARNING, logger="vllm_probe")
    path = tmp_path / "events.jsonl"
    rt = probed(lambda rt: EventSink(path, stats_extra=rt.health.snapshot,
                                     opener=lambda p: _DiskFull(p, room=20_000)))
    sched = testing.make_scheduler(testing.SchedulerSpec(**SPEC))
    first = trace(sched, workload(), steps=5)
    rt.sink.flush()  # a first small batch fits
    assert trace(sched, []) == baseline[len(first):]
    rt.sink.close()
    warnings = probe_warnings(caplog)
    assert len(warnings) == 2, warnings
    assert warnings[0].endswith("No space left on device; events are dropped and counted from now on")
    on_disk = file_events(path)  # whole lines only
    assert 0 < len(on_disk) == rt.sink.written < len(expected)
    assert as_comparable(on_disk) == expected[:len(on_disk)]
    assert rt.sink.written + rt.sink.dropped == len(expected)
    assert warnings[1].startswith(f"vllm-probe: {len(on_disk)} events written, "
                                  f"{len(expected) - len(on_disk)} dropped (cannot write")


def test_an_event_that_cannot_be_encoded_is_dropped_and_counted(tmp_path, caplog):
    """One bad value (here a dict with tuple keys, which JSON cannot hold) costs that
    event only: counted as dropped, one warning, the events around it are written."""
    caplog.set_level(logging.WARNING, logger="vllm_probe")
    path = tmp_path / "events.jsonl"
    sink = EventSink(path, flush_interval_s=3600)

    sink.emit(STEP, 1.0, 0, step_event(0))
    sink.emit(STEP, 2.0, 0, step_event(1, finished=[{("a", 1): 2}]))
    sink.emit(STEP, 3.0, 0, step_event(2))
    sink.flush()
    sink.emit(STEP, 4.0, 0, step_event(3, finished=[{("a", 1): 2}]))
    sink.emit(STEP, 5.0, 0, step_event(4))
    sink.close()
    events = file_events(path)
    assert [e.get("step") for e in events] == [0, 2, 4, None]
    assert (events[-1]["events_written"], events[-1]["events_dropped"]) == (3, 2)
    (warning,) = probe_warnings(caplog)
    assert "cannot encode" in warning and "dropped and counted" in warning


def test_a_hung_disk_does_not_hang_a_stop_signal_or_the_exit(tmp_path, caplog):
    """The writer thread is stuck in write() for good: the stop-signal checkpoint and
    close() give up after a bounded wait (close: the 5 s join plus STALL_WAIT_S) and
    say what was lost, instead of holding vLLM's shutdown forever."""
    from vllm_probe.engine.sink import STALL_WAIT_S

    caplog.set_level(logging.WARNING, logger="vllm_probe")
    stalled = []

    def opener(p):
        stalled.append(_StalledFile(p))
        return stalled[0]

    sink = EventSink(tmp_path / "events.jsonl", opener=opener, flush_interval_s=0.01)
    values = step_event(0)
    sink.emit(STEP, 0.0, 0, values)
    assert stalled[0].entered.wait(10)
    for i in range(1, 11):
        sink.emit(STEP, float(i), 0, values)
    def returns_within(call, seconds):  # in a thread: a regression fails, not hangs
        t = threading.Thread(target=call, daemon=True)
        t.start()
        t.join(seconds)
        return not t.is_alive()

    try:
        assert returns_within(sink.checkpoint, STALL_WAIT_S + 1)
        assert returns_within(sink.close, 5 + STALL_WAIT_S + 2)
        assert probe_warnings(caplog) == [
            "vllm-probe: 0 events written, 10 dropped (the disk stopped responding)"]
    finally:
        stalled[0].release.set()


# -- 7. bursts ---------------------------------------------------------------------------------


class _StalledFile:
    """A file whose write() blocks until ``release`` is set (a hung disk)."""

    def __init__(self, path):
        self._f = open(path, "ab", buffering=0)  # noqa: SIM115 - a file stand-in, closed by close()
        self.release = threading.Event()
        self.entered = threading.Event()

    def write(self, data):
        self.entered.set()
        self.release.wait(60)
        return self._f.write(data)

    def fileno(self):
        return self._f.fileno()

    def close(self):
        self._f.close()


def test_flood_against_a_stalled_writer_is_bounded_and_counted(tmp_path):
    import tracemalloc

    cap, n = 1_000, 200_000
    stalled = []

    def opener(p):
        stalled.append(_StalledFile(p))
        return stalled[0]

    sink = EventSink(tmp_path / "events.jsonl", capacity=cap, opener=opener, flush_interval_s=0.01)
    values = step_event(0)
    sink.emit(STEP, 0.0, 0, values)
    assert stalled[0].entered.wait(10)  # the writer is now stuck inside write()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    done = threading.Event()

    def flood():
        for i in range(n - 1):
            sink.emit(STEP, float(i), 0, values)
        done.set()

    t = threading.Thread(target=flood)
    t.start()
    t.join(60)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    assert done.is_set(), "emit() waited for the stalled writer"
    # unbounded, 200k queued tuples would take ~20 MB; the cap holds 1,000
    assert peak < 1_000_000, peak
    stalled[0].release.set()
    sink.close()
    events = file_events(tmp_path / "events.jsonl")
    stats = events[-1]
    assert stats["event"] == "probe_stats"
    assert stats["events_written"] == len(events) - 1 <= 1 + cap  # in-flight batch + queue
    assert stats["events_written"] + stats["events_dropped"] == n
    assert stats["events_dropped"] >= n - 1 - cap


@requires_vllm
def test_small_queue_on_the_real_scheduler_counts_every_drop(probed, reference, tmp_path):
    from vllm_probe.sim import harness as testing
    from vllm_probe.settings import ProbeFlags

    baseline, expected = reference
    path = tmp_path / "events.jsonl"
    rt = probed(lambda rt: EventSink(path, capacity=rt.flags.queue_capacity, stats_extra=rt.health.snapshot,
                                     flush_interval_s=3600),  # the writer never catches up
                flags=ProbeFlags(queue_capacity=5))
    assert trace(testing.make_scheduler(testing.SchedulerSpec(**SPEC)), workload()) == baseline
    rt.sink.close()
    events = file_events(path)
    # the first five, then drops (engine_config differs only in its flags)
    assert [e["event"] for e in events[:-1]] == [k for k, _ in expected[:5]]
    assert as_comparable(events[1:-1]) == expected[1:5]
    assert (events[-1]["events_written"], events[-1]["events_dropped"]) == (5, len(expected) - 5)


# -- 6. SIGKILL -----------------------------------------------------------------------------------

#: Emits one step event every millisecond; records in a 16-byte shared file how many it
#: emitted and the ts of the last one, so the parent knows what was produced but lost.
#: SIGTERM runs the sink's checkpoint, then a handler that keeps going, as vLLM's engine
#: core does (it goes on stepping and aborting until its parent SIGKILLs it).
_CHILD = textwrap.dedent("""
    import mmap, signal, struct, sys, time
    from vllm_probe.schema.events import STEP
    from vllm_probe.engine.signals import on_stop_signals
    from vllm_probe.engine.sink import EventSink
    sink = EventSink(sys.argv[1])
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    on_stop_signals(sink.checkpoint)
    with open(sys.argv[2], "r+b") as f:
        shared = mmap.mmap(f.fileno(), 16)
    i = 0
    while True:
        ts = time.time()
        sink.emit(STEP, ts, 0, STEP.pack(step=i, scheduled_tokens=1, token_budget=64, prefill_reqs=0,
                                         prefill_tokens=0, decode_reqs=1, decode_tokens=1, new_reqs=0,
                                         running=1, waiting=0, kv_usage=0.5, free_blocks=7,
                                         schedule_us=1.0, preempted=[], finished=[]))
        i += 1
        shared[:16] = struct.pack("qd", i, ts)
        time.sleep(0.001)
""")


def test_flush_interval_is_the_documented_bound():
    assert 0 < FLUSH_INTERVAL_S <= 0.5


def _kill_child(tmp_path, min_size: int, before_kill) -> tuple[list[dict], int, float]:
    """Run :data:`_CHILD` until its file holds ``min_size`` bytes, call ``before_kill(child)``,
    freeze it, read what it emitted, SIGKILL it. Returns (lines on disk, events emitted,
    ts of the last one emitted); fails on a partial last line."""
    import struct

    path, shared = tmp_path / "events.jsonl", tmp_path / "shared"
    shared.write_bytes(bytes(16))
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(path), str(shared)], cwd=ROOT)
    try:
        deadline = time.time() + 60
        while (not path.exists() or path.stat().st_size < min_size) and time.time() < deadline:
            assert child.poll() is None
            time.sleep(0.05)
        before_kill(child)
        child.send_signal(signal.SIGSTOP)  # freeze, read what it emitted, then kill
        emitted, last_ts = struct.unpack("qd", shared.read_bytes())
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
    data = path.read_bytes()
    assert data.endswith(b"\n")  # no partial last line
    return [json.loads(line) for line in data.splitlines()], emitted, last_ts


def test_sigkill_leaves_whole_lines_and_loses_at_most_one_flush_interval(tmp_path):
    path = tmp_path / "events.jsonl"

    def after_a_flush(child):
        size, deadline = path.stat().st_size, time.time() + 60
        while path.stat().st_size == size and time.time() < deadline:  # a flush happens now
            time.sleep(0.002)
        time.sleep(4 * FLUSH_INTERVAL_S + 0.037)  # several intervals later, at some phase

    events, emitted, last_ts = _kill_child(tmp_path, 50_000, after_a_flush)
    assert [e["step"] for e in events] == list(range(len(events)))  # no hole, no repeat
    assert all(e["event"] == "step" for e in events)  # killed: no probe_stats
    lost_s = last_ts - events[-1]["ts"]
    print(f"SIGKILL: {emitted - len(events)} events = {lost_s * 1000:.0f} ms lost")
    # bound: one interval, plus the writer thread's wait for the GIL and its write()
    assert lost_s <= FLUSH_INTERVAL_S + 0.15, (lost_s, emitted - len(events))
    assert emitted >= len(events)


@pytest.mark.parametrize("kill_after_s", [0.002, 0.013, 0.25])
def test_sigkill_after_a_stop_signal_leaves_a_final_probe_stats_line(kill_after_s, tmp_path):
    """vLLM's abort-mode shutdown: SIGTERM, events go on, SIGKILL milliseconds later.
    Wherever the kill lands, the file ends with a ``probe_stats`` line whose count is
    the number of lines before it, and only the last STOPPING_FLUSH_INTERVAL_S is lost."""

    def stop_signal(child):
        child.send_signal(signal.SIGTERM)
        time.sleep(kill_after_s)

    events, emitted, last_ts = _kill_child(tmp_path, 20_000, stop_signal)
    steps = [e["step"] for e in events if e["event"] == "step"]
    assert steps == list(range(len(steps)))  # no hole, no repeat
    assert events[-1]["event"] == "probe_stats", events[-1]
    assert (events[-1]["events_written"], events[-1]["events_dropped"]) == (len(steps), 0)
    # every probe_stats line counts exactly the events before it
    for i, e in enumerate(events):
        if e["event"] == "probe_stats":
            assert e["events_written"] == sum(x["event"] == "step" for x in events[:i])
    lost_s = last_ts - events[-2]["ts"]
    print(f"SIGKILL {kill_after_s * 1000:.0f} ms after SIGTERM: {emitted - len(steps)} events = "
          f"{lost_s * 1000:.0f} ms lost")
    assert lost_s <= STOPPING_FLUSH_INTERVAL_S + 0.15, (lost_s, emitted - len(steps))
