"""The sink's segments (issue 19 item 1): rotation between lines, the ``engine_config``
copy heading each segment, gzip of closed segments off the writer's path, retention, and
the sink's guarantees across rotation (never raises, every event written or counted)."""

from __future__ import annotations

import errno
import gzip
import json
import logging
import os
import stat
import time

import pytest

from tests._workload import SPEC, probe_warnings, trace, workload
from tests.conftest import requires_vllm
from vllm_probe.engine.sink import EventSink, SegmentKeeper, compress_segment, segment_path
from vllm_probe.schema.events import ENGINE_CONFIG, STEP


def config_values(**kw):
    fields = dict(vllm_version="0.32.0", probe_version="t", scheduler_class="Scheduler", patched=[],
                  max_num_batched_tokens=64, max_num_seqs=4, enable_chunked_prefill=True,
                  long_prefill_token_threshold=0, num_kv_blocks=12, block_size=16, kv_capacity_tokens=176,
                  max_model_len=1024, scheduling_policy="fcfs", async_scheduling=False, prefix_caching=False,
                  data_parallel_size=1, flags={})
    fields.update(kw)
    return ENGINE_CONFIG.pack(**fields)


def step_values(i):
    return STEP.pack(step=i, scheduled_tokens=10, token_budget=64, prefill_reqs=1, prefill_tokens=9,
                     decode_reqs=1, decode_tokens=1, new_reqs=1, running=2, waiting=0, kv_usage=0.5,
                     free_blocks=7, schedule_us=12.5, preempted=[], finished=[])


def segments_of(first, start=1):
    """The segment files of the stream whose first segment is ``first``, in order (plain or
    gzipped), by number from ``start`` until the first missing one after the lowest present."""
    out, n, missing = [], start, 0
    while missing < 1000:
        p = segment_path(first, n)
        gz = p.with_name(p.name + ".gz")
        if p.exists() or gz.exists():
            out.append(p if p.exists() else gz)
            missing = 0
        elif out:
            break
        else:
            missing += 1
        n += 1
    return out


def lines_of(path):
    data = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
    return [json.loads(line) for line in data.decode().splitlines()]


def wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_rotation_at_a_tiny_size_keeps_every_event_once_and_heads_segments_with_the_config(tmp_path):
    first = tmp_path / "events-7.jsonl"
    limit = 1500
    sink = EventSink(first, flush_interval_s=3600, max_segment_bytes=limit)
    sink.emit(ENGINE_CONFIG, 100.0, 0, config_values())
    for i in range(60):
        sink.emit(STEP, 101.0 + i, 0, step_values(i))
        if i % 7 == 0:
            sink.flush()  # batches of different sizes: rotation happens inside a batch too
    sink.close()
    files = segments_of(first)
    assert files[0].name == "events-7.jsonl" and files[1].name == "events-7.2.jsonl"
    assert [f.name for f in files] == ["events-7.jsonl"] + [f"events-7.{n}.jsonl" for n in range(2, len(files) + 1)]
    assert len(files) == sink.segment > 5
    steps, config_line = [], None
    for n, f in enumerate(files, 1):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
        lines = lines_of(f)
        if n == 1:
            assert lines[0]["event"] == "engine_config" and "segment" not in lines[0]
            config_line = lines[0]
            body = lines[1:]
        else:  # a copy of engine_config, marked, with the original's time
            head, body = lines[0], lines[1:]
            assert head["event"] == "engine_config" and head["segment"] == n and head["ts"] == 100.0
            assert {k: v for k, v in head.items() if k != "segment"} == config_line
        # closed between lines: at most the limit (its header included), or one line when
        # not even one fits
        size = f.stat().st_size
        assert size <= limit or len(body) == 1
        if n < len(files):  # a closed segment was full: the next line would not have fit
            next_line = len(json.dumps(lines_of(files[n])[1])) + 1
            assert size + next_line > limit
        steps += [e["step"] for e in body if e["event"] == "step"]
    assert steps == list(range(60))  # every event once, in order
    last = lines_of(files[-1])[-1]
    assert last["event"] == "probe_stats"
    assert (last["events_written"], last["events_dropped"]) == (61, 0)  # copies are not events


def test_a_segment_holds_at_least_one_line_whatever_the_limit(tmp_path):
    first = tmp_path / "events-1.jsonl"
    sink = EventSink(first, flush_interval_s=3600, max_segment_bytes=1)
    sink.emit(ENGINE_CONFIG, 1.0, 0, config_values())
    for i in range(5):
        sink.emit(STEP, 2.0 + i, 0, step_values(i))
    sink.close()
    files = segments_of(first)
    # config | step 0 | ... | step 4 | probe_stats: one line (after the copy) per segment
    assert [[e["event"] for e in lines_of(f)] for f in files] == (
        [["engine_config"]] + [["engine_config", "step"]] * 5 + [["engine_config", "probe_stats"]])


def test_rotate_every_s_closes_segments_by_age(tmp_path):
    first = tmp_path / "events-1.jsonl"
    sink = EventSink(first, flush_interval_s=3600, rotate_every_s=0.2)
    for i in range(3):
        sink.emit(STEP, 1.0 + i, 0, step_values(i))
        sink.emit(STEP, 1.5 + i, 0, step_values(i))
        sink.flush()
        time.sleep(0.25)
    sink.close()
    files = segments_of(first)
    # no engine_config was seen: no copy; each segment holds one flush (two steps), the
    # last also the final probe_stats
    assert [[e["event"] for e in lines_of(f)] for f in files] == [["step", "step"]] * 3 + [["probe_stats"]]


def test_closed_segments_are_gzipped_off_the_writer_and_read_back_equal(tmp_path):
    first = tmp_path / "events-1.jsonl"
    sink = EventSink(first, flush_interval_s=3600, max_segment_bytes=4000, compress_segments=True)
    sink.emit(ENGINE_CONFIG, 1.0, 0, config_values())
    for i in range(100):
        sink.emit(STEP, 2.0 + i, 0, step_values(i))
    sink.flush()
    closed = sink.segment - 1
    assert closed >= 5
    wait_for(lambda: sink.keeper.compressed == closed)  # on its own, while the sink is open
    sink.close()
    assert sink.keeper.wait_idle(30)
    files = segments_of(first)
    assert len(files) == sink.segment in (closed + 1, closed + 2)  # the close's probe_stats may open one more
    assert [f.name.endswith(".jsonl.gz") for f in files] == [True] * (sink.segment - 1) + [False]
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    assert not list(tmp_path.glob("*.tmp"))
    steps = [e["step"] for f in files for e in lines_of(f) if e["event"] == "step"]
    assert steps == list(range(100))


def test_a_crash_between_closing_and_compressing_leaves_a_readable_segment(tmp_path):
    """compress_segment's three crash points: before it (plain only), during (plain and a
    partial ``.gz.tmp``, which it removes when it fails), after the rename (plain and a
    whole ``.gz``): the plain file is whole every time and the ``.gz`` equal to it."""
    seg = tmp_path / "events-1.2.jsonl"
    text = b"".join(b'{"event": "step", "ts": %d.0, "step": %d}\n' % (i, i) for i in range(1000))
    seg.write_bytes(text)
    (tmp_path / "events-1.2.jsonl.gz.tmp").mkdir()  # the temporary file cannot be written
    with pytest.raises(OSError):
        compress_segment(seg)
    assert seg.read_bytes() == text and not (tmp_path / "events-1.2.jsonl.gz").exists()
    (tmp_path / "events-1.2.jsonl.gz.tmp").rmdir()
    real_unlink = os.unlink

    def crash_at_unlink(path, *a, **kw):  # the process dies between the rename and the removal
        if str(path) == str(seg):
            raise KeyboardInterrupt
        return real_unlink(path, *a, **kw)

    os.unlink = crash_at_unlink
    try:
        with pytest.raises(KeyboardInterrupt):
            compress_segment(seg)
    finally:
        os.unlink = real_unlink
    assert seg.read_bytes() == text
    assert gzip.decompress((tmp_path / "events-1.2.jsonl.gz").read_bytes()) == text
    assert not (tmp_path / "events-1.2.jsonl.gz.tmp").exists()


def test_a_segment_that_cannot_be_compressed_stays_as_it_is(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="vllm_probe")
    seg = tmp_path / "events-1.jsonl"
    seg.write_bytes(b'{"event": "step", "ts": 1.0}\n')
    (tmp_path / "events-1.jsonl.gz.tmp").mkdir()
    keeper = SegmentKeeper(compress=True)
    keeper._pending.append((seg, time.time()))
    keeper.work()
    assert (keeper.compressed, keeper.errors) == (0, 1)
    assert [k[0] for k in keeper.kept] == [seg] and seg.exists()
    (warning,) = probe_warnings(caplog)
    assert "cannot compress" in warning and "kept uncompressed" in warning


def test_retention_removes_the_oldest_closed_segments(tmp_path):
    keeper = SegmentKeeper(compress=False, keep_bytes=250)
    paths = []
    for n in range(1, 6):
        p = tmp_path / f"events-1.{n}.jsonl"
        p.write_bytes(b"x" * 100)
        paths.append(p)
        keeper._pending.append((p, 1000.0 + n))
    keeper.work()  # 500 bytes closed, 250 allowed: the three oldest go
    assert [p.exists() for p in paths] == [False, False, False, True, True]
    assert keeper.removed == 3
    keeper.keep_s = 3600
    keeper.prune(now=1000.0 + 4 + 3600.5)  # segment 4 closed more than an hour ago
    assert [p.exists() for p in paths] == [False] * 4 + [True]
    keeper.prune(now=1000.0 + 5 + 3600.5)
    assert not any(p.exists() for p in paths) and keeper.removed == 5


def test_retention_bounds_the_disk_while_the_sink_writes(tmp_path):
    first = tmp_path / "events-1.jsonl"
    sink = EventSink(first, flush_interval_s=3600, max_segment_bytes=3000, compress_segments=True,
                     keep_bytes=2000)
    sink.emit(ENGINE_CONFIG, 1.0, 0, config_values())
    for i in range(400):
        sink.emit(STEP, 2.0 + i, 0, step_values(i))
        if i % 10 == 0:
            sink.flush()
    sink.flush()
    sink.close()
    assert sink.keeper.wait_idle(30)
    kept = sum(k[1] for k in sink.keeper.kept)
    on_disk = sorted(tmp_path.iterdir())
    assert kept <= 2000 and sink.keeper.removed > 10
    assert sum(p.stat().st_size for p in on_disk) <= 2000 + 3000 + 1000  # + the open segment (+ its last line)
    # what is left is the newest segments, unbroken, ending with the open one
    files = segments_of(first, sink.segment - len(on_disk) + 1)
    assert len(files) == len(on_disk) and files[-1] == segment_path(first, sink.segment)
    steps = [e["step"] for f in files for e in lines_of(f) if e["event"] == "step"]
    assert steps == list(range(400 - len(steps), 400))
    assert lines_of(files[0])[0]["segment"] == sink.segment - len(on_disk) + 1


class _FullAfter:
    """An opener whose disk is full from the ``n``-th open on (ENOSPC), as at a rotation."""

    def __init__(self, n):
        self.n, self.opened = n, []

    def __call__(self, path):
        self.opened.append(path.name)
        if len(self.opened) >= self.n:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        return os.fdopen(fd, "ab", buffering=0)


def test_disk_full_at_rotation_is_counted_and_never_raises(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="vllm_probe")
    first = tmp_path / "events-1.jsonl"
    opener = _FullAfter(3)
    sink = EventSink(first, flush_interval_s=3600, max_segment_bytes=2000, opener=opener)
    sink.emit(ENGINE_CONFIG, 1.0, 0, config_values())
    for i in range(50):
        sink.emit(STEP, 2.0 + i, 0, step_values(i))
        sink.flush()
    sink.close()
    assert opener.opened == ["events-1.jsonl", "events-1.2.jsonl", "events-1.3.jsonl"]  # no retry
    on_disk = [e for f in segments_of(first) for e in lines_of(f)]
    written = [e for e in on_disk if e["event"] != "engine_config" or "segment" not in e]
    assert len(written) == sink.written and sink.written + sink.dropped == 51
    assert sink.dropped_io == sink.dropped > 0
    warnings = probe_warnings(caplog)
    assert len(warnings) == 2, warnings
    assert "cannot open" in warnings[0] and "events-1.3.jsonl" in warnings[0]
    assert warnings[0].endswith("No space left on device; events are dropped and counted from now on")
    assert warnings[1].startswith(f"vllm-probe: {sink.written} events written, {sink.dropped} dropped (cannot open")


# -- on vLLM's real Scheduler ------------------------------------------------------------------


def _events_without_copies(files):
    return [e for f in files for e in lines_of(f) if not (e["event"] == "engine_config" and "segment" in e)]


def _comparable(events):
    varying = ("ts", "pid", "arrival_ts", "schedule_us", "flags", "block_digests",  # flags: the segment settings
               "speed_mark_us")
    return [{k: v for k, v in e.items() if k not in varying} for e in events]


def _probed_run(run_dir, flags, baseline):
    """The test workload on vLLM's real Scheduler with the probe writing ``run_dir``
    through file_sink_factory; returns the sink (closed, its keeper done)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_probe import engine as probe
    from vllm_probe.engine.hooks import file_sink_factory
    from vllm_probe.sim import harness as testing

    rt = probe.Runtime(flags, file_sink_factory(run_dir))
    assert probe.install(Scheduler, rt, "0.32.0")
    try:
        assert trace(testing.make_scheduler(testing.SchedulerSpec(**SPEC)), workload()) == baseline
    finally:
        probe.uninstall(Scheduler)
    rt.sink.close()
    if rt.sink.keeper is not None:
        assert rt.sink.keeper.wait_idle(30)
    return rt.sink


@requires_vllm
@pytest.mark.parametrize("segment_mb", [1e-6, 0.002])  # one line per segment; ~2 KB segments
def test_every_event_once_across_segments_on_the_real_scheduler(tmp_path, segment_mb):
    """The settings reach the sink through file_sink_factory; split into segments of one
    line, or of ~2 KB, the events are those of a one-file run, in the same order, and
    vLLM decided exactly as without the probe."""
    from vllm_probe.settings import ProbeFlags
    from vllm_probe.sim import harness as testing

    baseline = trace(testing.make_scheduler(testing.SchedulerSpec(**SPEC)), workload())
    one_sink = _probed_run(tmp_path / "one", ProbeFlags(max_segment_mb=0), baseline)
    seg_sink = _probed_run(tmp_path / "seg", ProbeFlags(max_segment_mb=segment_mb), baseline)
    (one_file,) = (tmp_path / "one").iterdir()
    files = segments_of(seg_sink.path)
    assert len(files) == len(list((tmp_path / "seg").iterdir())) == seg_sink.segment > 10
    # compress_segments: on by default
    assert [f.name.endswith(".gz") for f in files] == [True] * (len(files) - 1) + [False]
    one, segmented = _events_without_copies([one_file]), _events_without_copies(files)
    assert len(one) > 100 and any(e["event"] == "preempt" for e in one)
    assert _comparable(segmented[:-1]) == _comparable(one[:-1])  # all but probe_stats
    assert one_sink.written == seg_sink.written == len(one) - 1
    assert segmented[-1]["events_written"] == seg_sink.written and segmented[-1]["events_dropped"] == 0
