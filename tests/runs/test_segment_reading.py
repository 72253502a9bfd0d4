"""Readers across segments (issue 19 item 2): every reader takes an engine core's
segments in order, ``.gz`` included, as one stream, and the figures do not depend on
where the boundaries fall; the live Follower follows rotation, compression and
retention."""

from __future__ import annotations

import gzip
import json
import shutil
import threading
import time

import pytest

from tests._workload import SPEC, trace, workload
from tests.conftest import requires_vllm
from vllm_probe.engine.sink import EventSink
from vllm_probe.runs.reader import Follower, ReadStats, iter_run, iter_run_lines
from vllm_probe.runs.rundir import event_files, event_streams
from vllm_probe.schema.events import ENGINE_CONFIG, STEP


def _record(run_dir, max_segment_mb):
    """The test workload on vLLM's real Scheduler (preemptions; a request's chunks and
    its preemption land in different segments when they are small) into ``run_dir``."""
    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_probe import engine as probe
    from vllm_probe.engine.hooks import file_sink_factory
    from vllm_probe.settings import ProbeFlags
    from vllm_probe.sim import harness as testing

    rt = probe.Runtime(ProbeFlags(max_segment_mb=max_segment_mb), file_sink_factory(run_dir))
    assert probe.install(Scheduler, rt, "0.32.0")
    try:
        spec = testing.SchedulerSpec(**SPEC)
        trace(testing.make_scheduler(spec), workload())
        # a second workload with chunked prefill: a request's chunks span segments
        s = testing.make_scheduler(testing.SchedulerSpec(max_num_batched_tokens=64, num_blocks=64))
        trace(s, [testing.make_request(300, 5, req_id="c0", seed=10),
                  testing.make_request(20, 3, req_id="c1", seed=11)])
    finally:
        probe.uninstall(Scheduler)
    rt.sink.close()
    if rt.sink.keeper is not None:
        assert rt.sink.keeper.wait_idle(30)
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One unsegmented run, and the same workload in one-line and in ~2 KB segments."""
    pytest.importorskip("vllm")
    base = tmp_path_factory.mktemp("seg")
    return {name: _record(base / name, mb) for name, mb in (("one", 0), ("line", 1e-6), ("small", 0.002))}


def _same(records):
    """Records without what differs between two runs of the same workload."""
    out = []
    for r in records:
        d = {k: v for k, v in (r.__struct_config__ and __import__("msgspec").structs.asdict(r)).items()
             if k not in ("ts", "pid", "arrival_ts", "schedule_us", "flags", "block_digests", "speed_mark_us")}
        out.append((type(r).__name__, d))
    return out


def _summary(run):
    from vllm_probe.analysis.summary import summarize

    d = summarize(run).to_dict()
    for key in ("run_dir", "read", "duration_s", "output_tokens_per_s", "busy_s", "output_tokens_per_busy_s",
                "schedule_us", "latency",
                "latency_classes", "latency_by_priority", "moments", "speed_mark"):
        d.pop(key, None)
    return d


@requires_vllm
def test_a_segmented_run_reads_as_the_unsegmented_one(runs):
    one = list(iter_run(runs["one"], ReadStats()))
    assert any(type(r).__name__ == "PreemptEvent" for r in one)
    assert any(getattr(r, "chunk_index", 0) == 4 for r in one)  # c0: 300 tokens in 64-token chunks
    for name in ("line", "small"):
        streams = event_streams(runs[name])
        assert len(streams) == 1 and len(streams[0].segments) > 10
        assert streams[0].segments[0].path.name == f"{streams[0].name}.jsonl.gz"  # segment 1 keeps its name
        assert all(seg.gz for seg in streams[0].segments[:-1])
        stats = ReadStats()
        got = list(iter_run(runs[name], stats))
        assert _same(got) == _same(one)
        assert stats.events == len(one) and stats.segment_headers == len(streams[0].segments) - 1
        assert stats.skipped == 0
        assert _summary(runs[name]) == _summary(runs["one"])  # every count, every boundary


@requires_vllm
def test_the_state_at_every_boundary_equals_the_unsegmented_state(runs):
    """A request whose chunks span segments, a preemption at a boundary: with one line
    per segment every event is at a boundary; the state's figures are the same."""
    from vllm_probe.analysis.summary import analyze

    a, _ = analyze(runs["one"], with_summary=False)
    b, _ = analyze(runs["line"], with_summary=False)
    for attr in ("steps", "preemptions", "recomputed_tokens", "discarded_tokens", "chunks", "chunk_tokens",
                 "requests_added", "requests_finished", "scheduled_tokens", "resumed_passes"):
        assert a.total(attr) == b.total(attr), attr
    assert a.total("preemptions") > 0 and a.total("recomputed_tokens") > 0
    assert b.engines[0].events_written == a.engines[0].events_written  # probe_stats true across segments


@requires_vllm
def test_export_and_the_other_readers_read_every_segment(runs, tmp_path):
    from vllm_probe.analysis.workload import load_workload
    from vllm_probe.runs.ids import request_ids
    from vllm_probe.runs.launcher import count_events

    one_lines = [json.loads(line) for _, line in iter_run_lines(runs["one"], ReadStats())]
    seg_lines = [json.loads(line) for _, line in iter_run_lines(runs["small"], ReadStats())]
    assert [e["event"] for e in seg_lines] == [e["event"] for e in one_lines]
    assert request_ids(runs["small"]) == request_ids(runs["one"]) == {"r0", "r1", "r2", "c0", "c1"}
    a, b = count_events(runs["one"]), count_events(runs["small"])
    assert a.kinds == b.kinds and (a.files, b.files) == (1, 1)
    wa, wb = load_workload(runs["one"]), load_workload(runs["small"])
    assert [(r.req_id, r.prompt_len) for r in wa.requests] == [(r.req_id, r.prompt_len) for r in wb.requests]


@requires_vllm
def test_a_crash_between_closing_and_compressing_reads_every_event_once(runs, tmp_path):
    """Segments left as .jsonl beside their whole .gz (stopped between the rename and the
    removal), or beside a partial .gz.tmp (stopped during compression): read once."""
    run = tmp_path / "crash"
    shutil.copytree(runs["small"], run)
    segs = event_streams(run)[0].segments
    for seg in segs[1:4]:  # whole .gz and the .jsonl it came from
        (run / seg.path.name[:-3]).write_bytes(gzip.decompress(seg.path.read_bytes()))
    for seg in segs[5:7]:  # the .jsonl and a partial .gz.tmp
        plain = run / seg.path.name[:-3]
        plain.write_bytes(gzip.decompress(seg.path.read_bytes()))
        (run / (plain.name + ".gz.tmp")).write_bytes(seg.path.read_bytes()[:40])
        seg.path.unlink()
    stats = ReadStats()
    assert _same(iter_run(run, stats)) == _same(iter_run(runs["one"], ReadStats()))
    assert stats.skipped == 0 and stats.damaged_gz == 0
    assert len(event_files(run)) == len(segs)
    assert _summary(run) == _summary(runs["one"])
    follower_stats = ReadStats()
    assert _same(Follower(run, follower_stats).poll()) == _same(iter_run(runs["one"], ReadStats()))


@requires_vllm
def test_the_follower_reads_a_segmented_run_in_small_bites_as_one_stream(runs):
    one = _same(iter_run(runs["one"], ReadStats()))
    stats = ReadStats()
    f = Follower(runs["small"], stats, chunk_bytes=300)
    got = []
    for _ in range(10000):
        batch = f.poll(max_bytes=500)
        if not batch and f.pending_partial() == 0 and len(got) == len(one):
            break
        got += batch
    assert _same(got) == one and stats.events == len(one) and stats.segments_missed == 0


def test_a_damaged_gz_segment_is_read_up_to_the_damage(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lines = [json.dumps({"event": "step", "ts": float(i), "step": i, "scheduled_tokens": 1, "token_budget": 8})
             for i in range(200)]
    (run / "events-1.jsonl").write_text("\n".join(lines[:100]) + "\n")
    data = gzip.compress(("\n".join(lines[100:]) + "\n").encode())
    (run / "events-1.2.jsonl.gz").write_bytes(data[: len(data) // 2])
    stats = ReadStats()
    steps = [r.step for r in iter_run(run, stats)]
    assert steps[:100] == list(range(100)) and steps == list(range(len(steps))) and len(steps) < 200
    assert stats.damaged_gz == 1 and "1 damaged .gz segment read up to the damage" in stats.describe()


# -- following while the probe rotates, compresses and removes ------------------------------


def _config():
    return ENGINE_CONFIG.pack(vllm_version="0.32.0", probe_version="t", scheduler_class="Scheduler", patched=[],
                              max_num_batched_tokens=64, max_num_seqs=4, enable_chunked_prefill=True,
                              long_prefill_token_threshold=0, num_kv_blocks=12, block_size=16,
                              kv_capacity_tokens=176, max_model_len=1024, scheduling_policy="fcfs",
                              async_scheduling=False, prefix_caching=False, data_parallel_size=1, flags={})


def _step(i):
    return STEP.pack(step=i, scheduled_tokens=10, token_budget=64, prefill_reqs=0, prefill_tokens=0,
                     decode_reqs=1, decode_tokens=10, new_reqs=0, running=1, waiting=0, kv_usage=0.5,
                     free_blocks=7, schedule_us=12.5, preempted=[], finished=[])


def _write_live(run, n, keep_bytes, stop_at):
    """A writer thread: engine_config then ``n`` steps, flushed every 20, into ~3 KB
    segments compressed and kept to ``keep_bytes``."""
    sink = EventSink(run / "events-1.jsonl", flush_interval_s=3600, max_segment_bytes=3000,
                     compress_segments=True, keep_bytes=keep_bytes)
    sink.emit(ENGINE_CONFIG, 1.0, 0, _config())

    def go():
        for i in range(n):
            sink.emit(STEP, 2.0 + i, 0, _step(i))
            if i % 20 == 19:
                sink.flush()
                time.sleep(0.002)
        sink.close()
        sink.keeper.wait_idle(30)
        stop_at.set()

    t = threading.Thread(target=go)
    t.start()
    return sink, t


@pytest.mark.parametrize("keep_bytes", [None, 1500])
def test_the_follower_follows_rotation_compression_and_retention_live(tmp_path, keep_bytes):
    run = tmp_path / "run"
    run.mkdir()
    done = threading.Event()
    sink, t = _write_live(run, 3000, keep_bytes, done)
    stats = ReadStats()
    f = Follower(run, stats, chunk_bytes=4096)
    got = []
    while True:
        finished = done.is_set()
        got += f.poll(max_bytes=None if keep_bytes is None else 1 << 16)
        if finished:
            got += f.poll()
            break
        time.sleep(0.001 if keep_bytes else 0.005)
    t.join()
    steps = [r.step for r in got if type(r).__name__ == "StepEvent"]
    assert [type(r).__name__ for r in got[:1]] == ["EngineConfigEvent"]
    assert steps == sorted(set(steps)) and steps[-1] == 2999  # in order, never twice
    assert sink.segment > 50
    if keep_bytes is None:
        assert steps == list(range(3000)) and stats.segments_missed == 0
        assert stats.events == 3002 and stats.segment_headers == sink.segment - 1
    else:
        assert sink.keeper.removed > 0
        # what it did not read, it counted: whole segments removed before it got there
        assert len(steps) < 3000 or stats.segments_missed == 0
        assert stats.segments_missed >= (3000 - len(steps)) // 20 and stats.skipped == 0
        gaps = [b - a for a, b in zip(steps, steps[1:]) if b - a > 1]
        assert len(gaps) <= stats.segments_missed


def test_a_follower_started_late_begins_at_the_oldest_segment_kept(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    done = threading.Event()
    _sink, t = _write_live(run, 600, 2000, done)
    t.join()
    streams = event_streams(run)
    first = streams[0].segments[0]
    assert first.n > 1 and streams[0].removed == first.n - 1
    stats = ReadStats()
    got = Follower(run, stats).poll()
    assert type(got[0]).__name__ == "EngineConfigEvent" and got[0].segment == first.n  # the window's config
    steps = [r.step for r in got if type(r).__name__ == "StepEvent"]
    assert steps == list(range(steps[0], 600)) and stats.segments_missed == 0
    assert _same(got) == _same(iter_run(run, ReadStats()))


def test_retention_while_tail_and_metrics_follow(tmp_path):
    """``tail``'s Watcher and the metrics server follow a run whose segments are rotated,
    gzipped and removed under them: each reads every step it can in order, never twice,
    counts the segments it missed, and the metrics count what the state read."""
    import io

    from tests.exporters.test_metrics import Series, scrape_text
    from vllm_probe.exporters.prometheus import MetricsServer, RunStateCollector
    from vllm_probe.tui.watch import Watcher

    run = tmp_path / "run"
    run.mkdir()
    done = threading.Event()
    sink, t = _write_live(run, 3000, 1500, done)
    watcher = Watcher(run, plain_out=io.StringIO())
    server = MetricsServer("127.0.0.1", 0, diagnose=False)
    try:
        server.follow(run, background=False)
        while True:
            finished = done.is_set()
            watcher.pump()
            server.pump()
            if finished:
                while watcher.pump() or server.pump():
                    pass
                break
            time.sleep(0.003)
        t.join()
        assert sink.keeper.removed > 0
        for state, stats in ((watcher.state, watcher.stats), (server.state, server.stats)):
            eng = state.engines[0]
            assert eng.last_step == 2999 and stats.skipped == 0
            # whole segments of ~8 steps were removed unread, each counted; the rest was read once
            assert eng.steps <= 3000 and (eng.steps == 3000) == (stats.segments_missed == 0)
            assert 3000 - eng.steps <= 20 * stats.segments_missed
        m = Series(scrape_text(RunStateCollector(server.state)))
        assert m("vllm_probe_steps_total", engine="0") == server.state.engines[0].steps
    finally:
        server.close()
