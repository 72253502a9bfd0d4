"""EventSink: JSON lines with the common fields, probe_stats last, counted drops."""

from __future__ import annotations

import json
import os
import stat

from vllm_probe.schema.events import CHUNK, SCHEMA_VERSION, STEP
from vllm_probe.engine.sink import EventSink


def step_values(i):
    return STEP.pack(step=i, scheduled_tokens=10, token_budget=64, prefill_reqs=1, prefill_tokens=9,
                     decode_reqs=1, decode_tokens=1, new_reqs=1, running=2, waiting=0, kv_usage=0.5,
                     free_blocks=7, schedule_us=12.5, preempted=[], finished=[])


def read_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_lines_carry_common_fields_and_close_with_stats(tmp_path):
    path = tmp_path / "events-1.jsonl"
    sink = EventSink(path, stats_extra=lambda: ({"step": 0}, []))
    sink.emit(STEP, 100.25, 3, step_values(0))
    sink.emit(CHUNK, 100.5, 3, CHUNK.pack(step=0, req_id="r1", chunk_index=0, start=0, end=64, prompt_len=100,
                                          prefill_len=100, last=False, resumed=False, prefix_hit_tokens=0))
    sink.emit(CHUNK, 100.75, 3, CHUNK.pack(step=1, req_id="r1", chunk_index=1, start=64, end=100, prompt_len=100,
                                           prefill_len=100, last=True, resumed=False))
    sink.close()
    lines = read_lines(path)
    assert [e["event"] for e in lines] == ["step", "chunk", "chunk", "probe_stats"]
    assert list(lines[0])[:5] == ["event", "ts", "pid", "engine", "schema"]
    assert lines[0]["ts"] == 100.25 and lines[0]["engine"] == 3
    assert lines[0]["pid"] == os.getpid() and lines[0]["schema"] == SCHEMA_VERSION
    assert lines[0]["scheduled_tokens"] == 10 and lines[0]["schedule_us"] == 12.5
    assert lines[1]["prefix_hit_tokens"] == 0
    assert "prefix_hit_tokens" not in lines[2]  # optional and absent on later chunks
    assert lines[-1]["events_written"] == 3 and lines[-1]["events_dropped"] == 0
    assert lines[-1]["hook_errors"] == {"step": 0}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_full_queue_drops_and_counts(tmp_path):
    path = tmp_path / "events-2.jsonl"
    sink = EventSink(path, capacity=5, flush_interval_s=60)  # the writer never wakes before close
    for i in range(12):
        sink.emit(STEP, 1.0 + i, 0, step_values(i))
    sink.close()
    lines = read_lines(path)
    assert [e["step"] for e in lines[:-1]] == [0, 1, 2, 3, 4]
    assert lines[-1]["events_written"] == 5 and lines[-1]["events_dropped"] == 7


def test_close_is_idempotent_and_writer_flushes_periodically(tmp_path):
    import time

    path = tmp_path / "events-3.jsonl"
    sink = EventSink(path, flush_interval_s=0.05)
    sink.emit(STEP, 1.0, 0, step_values(0))
    deadline = time.time() + 5
    while time.time() < deadline and not path.read_text():
        time.sleep(0.02)
    assert len(read_lines(path)) == 1  # on disk before close
    sink.close()
    sink.close()
    assert [e["event"] for e in read_lines(path)] == ["step", "probe_stats"]


def test_after_a_checkpoint_every_write_ends_with_probe_stats(tmp_path):
    """A stop signal's checkpoint, then the engine core goes on (vLLM's shutdown): each
    later write carries its own probe_stats; no checkpoint or close repeats an unchanged one."""
    path = tmp_path / "events-4.jsonl"
    sink = EventSink(path, flush_interval_s=60)  # before the checkpoint only the calls below write
    sink.emit(STEP, 1.0, 0, step_values(0))
    sink.checkpoint()
    sink.checkpoint()  # SIGTERM after SIGINT: nothing new, nothing written
    assert [(e["event"], e.get("events_written")) for e in read_lines(path)] == [("step", None), ("probe_stats", 1)]
    for i in (1, 2, 3):  # the writer (now every 10 ms) or flush(): whichever writes, stats end it
        sink.emit(STEP, 1.0 + i, 0, step_values(i))
        sink.flush()
        assert read_lines(path)[-1] == {**read_lines(path)[-1], "event": "probe_stats", "events_written": i + 1}
    sink.checkpoint()
    sink.close()
    lines = read_lines(path)
    assert [e["step"] for e in lines if e["event"] == "step"] == [0, 1, 2, 3]
    assert lines[-1]["event"] == "probe_stats" and lines[-1]["events_written"] == 4
    for before, line in zip(lines, lines[1:]):
        assert (before["event"], line["event"]) != ("probe_stats", "probe_stats")
    for i, line in enumerate(lines):
        if line["event"] == "probe_stats":
            assert line["events_written"] == sum(e["event"] == "step" for e in lines[:i])


def test_a_backlog_is_written_in_slices_of_write_batch(tmp_path, monkeypatch):
    """A writer that fell behind drains in WRITE_BATCH slices (its transient memory is
    that of one slice, not of the backlog), every event once and in order."""
    from vllm_probe.engine import sink as sink_module

    path = tmp_path / "events-7.jsonl"
    sink = EventSink(path, flush_interval_s=3600)  # the writer thread never wakes on its own
    rendered = []
    render = sink._render
    monkeypatch.setattr(sink, "_render", lambda items: (rendered.append(len(items)), render(items)))
    n = 2 * sink_module.WRITE_BATCH + 17
    for i in range(n):
        sink.emit(STEP, 1.0 + i, 0, step_values(i))
    sink.flush()
    assert rendered == [sink_module.WRITE_BATCH, sink_module.WRITE_BATCH, 17]
    sink.close()
    lines = read_lines(path)
    assert [e["step"] for e in lines[:-1]] == list(range(n))
    assert lines[-1]["events_written"] == n and lines[-1]["events_dropped"] == 0
