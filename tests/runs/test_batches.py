"""``reader.iter_file_batches`` (summary's and doctor's hot path) reads exactly what
``iter_file`` reads: the same records in the same order, the same lines skipped and
counted, whatever batch size cuts the file."""

from __future__ import annotations

import json

import msgspec
import pytest

from vllm_probe.runs.reader import ReadStats, iter_file, iter_file_batches

GOOD = [
    {"event": "engine_config", "ts": 1.0, "pid": 7, "engine": 0, "schema": 1, "max_num_seqs": 4},
    {"event": "request_added", "ts": 1.1, "pid": 7, "engine": 0, "schema": 1, "req_id": "a", "prompt_len": 10},
    {"event": "step", "ts": 1.2, "pid": 7, "engine": 0, "schema": 1, "step": 0, "scheduled_tokens": 10,
     "token_budget": 64, "running": 1, "waiting": 0, "preempted": [], "finished": []},
    {"event": "chunk", "ts": 1.3, "pid": 7, "engine": 0, "schema": 1, "step": 0, "req_id": "a",
     "chunk_index": 0, "start": 0, "end": 10, "last": True},
]


def _lines() -> list[bytes]:
    good = [json.dumps(ev).encode() + b"\n" for ev in GOOD]
    newer = json.dumps({**GOOD[2], "schema": 2, "step": 1}).encode() + b"\n"
    null_engine = json.dumps({**GOOD[2], "engine": None, "step": 2}).encode() + b"\n"
    return [
        *good,
        b"\n",  # blank: skipped, not counted
        b"not json\n",  # malformed
        b'{"event": "step", "ts": 2.0, "step": "three"}\n',  # wrong type: malformed
        b'{"event": "teleport", "ts": 2.1}\n',  # unknown kind
        b'{"event": "step", "ts": 2.2, "running": -1}\n',  # out of range: malformed
        newer,  # read, counted as newer
        null_engine,  # read through the slow path, engine 0
        *good,
        b'{"event": "step", "ts": 3.0, "step": 9}',  # no newline: partial, not read
    ]


def _counts(stats: ReadStats) -> tuple:
    return stats.events, stats.malformed, stats.partial, stats.unknown_kind, stats.newer_schema


@pytest.mark.parametrize("batch_bytes", [1, 7, 64, 200, 1 << 14])
def test_batches_read_what_iter_file_reads(tmp_path, batch_bytes):
    path = tmp_path / "events-7.jsonl"
    path.write_bytes(b"".join(_lines()))
    one = ReadStats()
    expected = list(iter_file(path, one))
    many = ReadStats()
    batches = list(iter_file_batches(path, many, batch_bytes))
    got = [rec for batch in batches for rec in batch]
    assert [msgspec.json.encode(r) for r in got] == [msgspec.json.encode(r) for r in expected]
    assert all(batches)  # no empty batch
    # 4 good + newer + null engine + 4 good; 3 malformed, 1 unknown, 1 partial, 1 newer
    assert _counts(many) == _counts(one) == (10, 3, 1, 1, 1)
    assert [r.engine for r in got] == [0] * 10
    assert [r.kind for r in got[:4]] == ["engine_config", "request_added", "step", "chunk"]
    assert many.files == one.files == {str(path)}


def test_batches_of_a_clean_file_and_a_missing_one(tmp_path):
    path = tmp_path / "events-7.jsonl"
    path.write_bytes(b"".join(json.dumps(ev).encode() + b"\n" for ev in GOOD * 50))
    stats = ReadStats()
    batches = list(iter_file_batches(path, stats, 256))
    assert len(batches) > 1
    assert sum(map(len, batches)) == stats.events == 200
    assert _counts(stats) == (200, 0, 0, 0, 0)
    stats = ReadStats()
    assert list(iter_file_batches(tmp_path / "events-8.jsonl", stats)) == []
    assert stats.events == 0
