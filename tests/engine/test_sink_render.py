"""The sink's batched rendering writes exactly what one structlog JSONRenderer call per
event wrote before it (field order, optional fields left out, escapes, floats, fallbacks)."""

from __future__ import annotations

import json
import math

import pytest
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


# -- the serializer: msgspec where it writes json.dumps's text, json.dumps elsewhere ----------

def _reference(obj):
    """What the sink wrote before msgspec: structlog's JSONRenderer default, json.dumps
    with structlog's fallback (repr) for objects JSON has no type for."""
    return structlog.processors.JSONRenderer()(None, "msg", obj)


class _Color(__import__("enum").Enum):
    RED = 1


class _Level(__import__("enum").IntEnum):
    HIGH = 2


VALUES = [
    # what the hooks emit: msgspec's own path
    0, -1, 2**63, 2**64 + 1, 2**100, True, False, None, "req-1", "", 0.0, -0.0, 0.5, 1e-4, 9.99e15,
    1795990833.7081244, 0.6842105263157895, [], {}, [[]], [{}], ["a", "b"], {"step": 0, "chunk": 3},
    'quote " backslash \\ tab \t newline \n nul \x00 unit \x1f slash /',
    # where msgspec's text differs: json.dumps writes them
    "ré", "\u2028", "😀", "\x7f", "\ud800", 1e-5, 1e-7, 1e16, 1e20, -1e300, 5e-324, math.nan,
    math.inf, -math.inf, {"é": 1}, {1: 2}, {1.5: 2}, {1e-5: 2}, {True: 1}, {None: 1},
    _Level.HIGH, _Color.RED, {1, 2}, frozenset(), b"bytes", bytearray(b"x"), Opaque(),
    __import__("datetime").datetime(2026, 1, 2, 3, 4, 5), __import__("uuid").UUID(int=7),
    __import__("decimal").Decimal("1.5"), ("t", 1), [("t", [1e-9])],
    {("a", 1): 2},  # JSON cannot hold it: both raise
]


def _ours(obj):
    from vllm_probe.engine.encoding import dumps

    return structlog.processors.JSONRenderer(serializer=dumps)(None, "msg", obj)


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__ + ":" + ascii(v)[:20])
def test_the_serializer_writes_json_dumps_text(value):
    """Byte for byte what json.dumps (ensure_ascii, structlog's repr fallback) wrote, or
    the same exception: a value inside an event, as a list item and as a nested dict value."""
    for obj in ({"event": "x", "v": value}, {"event": "x", "l": [1, value]}, {"event": "x", "d": {"k": value}}):
        try:
            want = _reference(obj).encode()
        except Exception as e:
            with pytest.raises(type(e)):
                _ours(obj)
        else:
            assert _ours(obj) == want


def test_the_serializer_on_random_floats():
    """Every float (random bit patterns, and spread over the magnitudes events carry)
    is written as Python's repr writes it."""
    import random
    import struct

    rnd = random.Random(7)
    floats = [struct.unpack("d", rnd.getrandbits(64).to_bytes(8, "little"))[0] for _ in range(20_000)]
    floats += [rnd.choice((1, -1)) * 10 ** rnd.uniform(-8, 20) for _ in range(20_000)]
    for x in floats:
        assert _ours({"f": x}) == _reference({"f": x}).encode(), x


def test_the_probes_own_events_take_msgspecs_path(monkeypatch):
    """The events of a real run are written without json.dumps (the fallback is for values
    the hooks do not emit, bar the rare null or exotic float)."""
    from pathlib import Path

    from vllm_probe.engine import encoding as sink_module

    def refuse(*args, **kwargs):
        raise AssertionError("json.dumps was used")

    lines = (Path(__file__).parents[1] / "data" / "real_run_lines.jsonl").read_bytes().splitlines()
    events = [json.loads(raw) for raw in lines]
    monkeypatch.setattr(sink_module.json, "dumps", refuse)
    assert [_ours(e) for e in events] == lines
