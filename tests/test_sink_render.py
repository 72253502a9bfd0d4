"""The sink's batched rendering writes exactly what one structlog JSONRenderer call per
event wrote before it (field order, optional fields left out, escapes, floats, fallbacks)."""

from __future__ import annotations

import json
import math

import structlog

from vllm_probe.schema.events import (CHUNK, ENGINE_CONFIG, PREEMPT, PROBE_STATS, REQUEST_ADDED,
                               REQUEST_FINISHED, SCHEMA_VERSION, STEP)
from vllm_probe.engine.sink import EventSink


class Opaque:
    def __repr__(self) -> str:
        return "<opaque é>"


EVENTS = [
    (STEP, 1.5, 0, (1, 256, 2048, None, None, None, None, 0, 256, 0, 0.5, 1000, 1234.5, [], [])),
    (STEP, 1795990833.7081244, 2, (7, 256, 2048, 3, 2000, 253, 253, 3, 256, 4, 0.123456789, 1000,
                                   1e-7, ['a"b'], ["s1", "s2\n", "é"])),
    (CHUNK, 2.0, 0, (1, "req-1", 0, 0, 700, 700, 700, True, False, None)),
    (CHUNK, 2.0, 0, (1, "ré\\q", 1, 64, 700, 700, 700, False, True, 64)),
    (REQUEST_ADDED, 3.0, 0, ("x", 10, None, 0.0, math.nan, 0, 1e20)),
    (REQUEST_FINISHED, 3.0, 0, (5, "x", "length", 700, 2, None)),
    (PREEMPT, 4.0, 0, (5, "x", 7, 40, 3, 1, 0.9, 2, 1, "kv_cache")),
    (ENGINE_CONFIG, 5.0, 0, ("0.32.0", "0.1", "Scheduler", ["a"], 1, 2, True, 0, 3, 4, 5, 6,
                             "fcfs", False, False, 1, {"f": True, "o": Opaque(), "inf": math.inf})),
    (PROBE_STATS, 6.0, 0, (1, 0, {"step": 0}, [])),
]


def reference_line(kind, ts, engine, values, pid):
    """One event as the per-event pipeline rendered it: structlog's JSONRenderer on an
    ordered dict, optional fields that are None left out."""
    d = {"event": kind.name, "ts": ts, "pid": pid, "engine": engine, "schema": SCHEMA_VERSION}
    for f, v in zip(kind.fields, values):
        if not (v is None and f.optional):
            d[f.name] = v
    return structlog.processors.JSONRenderer()(None, "msg", d)


def test_batched_rendering_is_byte_identical_to_one_renderer_call_per_event(tmp_path):
    path = tmp_path / "events.jsonl"
    sink = EventSink(path, flush_interval_s=3600)
    try:
        for _ in range(3):  # several batches reuse the cached encoder
            for e in EVENTS:
                sink.emit(*e)
            sink.flush()
    finally:
        sink.close()
    lines = path.read_text().splitlines()
    expected = [reference_line(*e, pid=sink.pid) for e in EVENTS] * 3
    assert lines[:-1] == expected
    assert json.loads(lines[-1])["event"] == "probe_stats"
    assert '"ts": 1795990833.7081244' in lines[1] and '"prefill_reqs"' not in lines[0]
