"""Property-based tests of the readers across segments (issue 19 items 2 and 4).

A valid stream (``tests/data/real_run_lines.jsonl``, the preemption scenario) is cut
into segments where hypothesis chooses, written as the sink writes them
(``events-<pid>.jsonl``, ``events-<pid>.<n>.jsonl`` headed by ``engine_config`` copies
carrying ``segment: n``, closed segments gzipped or not), then:

* ``iter_run`` reads the same records as the uncut stream, and the figures (summary as
  ``--json``, the workload's requests) are the same wherever the cuts fall;
* a live :class:`~vllm_probe.runs.reader.Follower` polled between every write, rotation,
  compression (``.gz.tmp`` then rename, then the ``.jsonl`` removed) reads the same
  records, whatever the order of those moments;
* retention removing the first segments, or a damaged ``.gz``, never raises: the window
  is read, the removed count is said, a damaged segment is counted.

These need the readers across segments (``runs.rundir.event_streams``, branch
``segments``); without them the file is skipped.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests._events import scenario_preempt
from vllm_probe.runs import rundir
from vllm_probe.runs.reader import Follower, ReadStats, _decode_lines, iter_run

pytestmark = pytest.mark.skipif(not hasattr(rundir, "event_streams"),
                                reason="needs the readers across segments (branch segments)")

DATA = Path(__file__).resolve().parents[1] / "data"
REAL = (DATA / "real_run_lines.jsonl").read_bytes()
PREEMPT = "".join(scenario_preempt().lines()).encode()
STREAMS = {"real": REAL, "preempt": PREEMPT}
FUZZ = settings(deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def name_of(n: int, gz: bool = False) -> str:
    return f"events-7.jsonl{'.gz' if gz else ''}" if n == 1 else f"events-7.{n}.jsonl{'.gz' if gz else ''}"


def segments_of(data: bytes, cuts: list[int]) -> list[list[bytes]]:
    """The stream's lines cut before the given line indices, each segment from 2 on
    headed by a copy of every engine_config line before it (marked ``segment: n``)."""
    lines = data.splitlines(keepends=True)
    bounds = sorted({c for c in cuts if 0 < c < len(lines)})
    parts, prev = [], 0
    for b in [*bounds, len(lines)]:
        parts.append(lines[prev:b])
        prev = b
    out, configs = [], []
    for n, part in enumerate(parts, 1):
        head = [(json.dumps({**json.loads(c), "segment": n}) + "\n").encode() for c in configs] if n > 1 else []
        out.append(head + part)
        configs += [line for line in part if b'"event": "engine_config"' in line]
    return out


def write_segments(run: Path, segs: list[list[bytes]], gz: list[bool]) -> None:
    run.mkdir(parents=True, exist_ok=True)
    for n, (lines, zipped) in enumerate(zip(segs, gz), 1):
        data = b"".join(lines)
        if zipped and n < len(segs):  # the open (last) segment is never gzipped
            (run / name_of(n, True)).write_bytes(gzip.compress(data, 1))
        else:
            (run / name_of(n)).write_bytes(data)


def whole(data: bytes) -> list:
    return list(_decode_lines(io.BytesIO(data), ReadStats(), False))


def figures(run: Path) -> tuple:
    from vllm_probe.analysis.summary import summarize
    from vllm_probe.analysis.workload import load_workload

    d = summarize(run).to_dict()
    d.pop("run_dir", None)
    d["read"].pop("files")  # how many files it read: the one thing the cuts change
    w = load_workload(run)
    return d, [(r.req_id, r.prompt_len, r.output_tokens, r.add_before_step) for r in w.requests], w.chunks


@settings(FUZZ, max_examples=30)
@given(st.data())
def test_segments_read_as_the_uncut_stream(tmp_path_factory, data):
    name = data.draw(st.sampled_from(sorted(STREAMS)))
    payload = STREAMS[name]
    n_lines = payload.count(b"\n")
    segs = segments_of(payload, data.draw(st.lists(st.integers(1, n_lines - 1), max_size=8)))
    gz = data.draw(st.lists(st.booleans(), min_size=len(segs), max_size=len(segs)))
    run = tmp_path_factory.mktemp("segs")
    write_segments(run, segs, gz)
    stats = ReadStats()
    assert list(iter_run(run, stats)) == whole(payload)
    assert stats.skipped == 0 and stats.events == n_lines
    ref = tmp_path_factory.mktemp("whole")
    (ref / "events-7.jsonl").write_bytes(payload)
    assert figures(run) == figures(ref)


@settings(FUZZ, max_examples=30)
@given(st.data())
def test_the_follower_reads_across_rotation_and_compression_whenever_it_polls(tmp_path_factory, data):
    payload = STREAMS[data.draw(st.sampled_from(sorted(STREAMS)))]
    n_lines = payload.count(b"\n")
    segs = segments_of(payload, data.draw(st.lists(st.integers(1, n_lines - 1), max_size=6)))
    run = tmp_path_factory.mktemp("live")
    f = Follower(run, ReadStats())
    got: list = []
    poll = lambda: got.extend(f.poll(data.draw(st.one_of(st.none(), st.integers(50, 5000)))))  # noqa: E731
    for n, lines in enumerate(segs, 1):
        path = run / name_of(n)
        blob = b"".join(lines)
        cuts = sorted(data.draw(st.lists(st.integers(0, len(blob)), max_size=4)))
        prev = 0
        for cut in [*cuts, len(blob)]:  # the writer appends (a line may be cut mid-way)
            with open(path, "ab") as out:
                out.write(blob[prev:cut])
            prev = max(prev, cut)
            if data.draw(st.booleans()):
                poll()
        if n > 1 and data.draw(st.booleans()):  # the keeper compresses the closed segment before
            closed = run / name_of(n - 1)
            if closed.exists():
                tmp = closed.with_name(closed.name + ".gz.tmp")
                tmp.write_bytes(gzip.compress(closed.read_bytes(), 1))
                if data.draw(st.booleans()):
                    poll()  # a .gz.tmp beside its .jsonl
                os.replace(tmp, closed.with_name(closed.name + ".gz"))
                if data.draw(st.booleans()):
                    poll()  # both the .jsonl and its .gz
                closed.unlink()
        if data.draw(st.booleans()):
            poll()
    for _ in range(len(payload) // 50 + 3):
        got.extend(f.poll())
    assert got == whole(payload)
    assert f.stats.skipped == 0 and f.pending_partial() == 0


@settings(FUZZ, max_examples=25)
@given(st.data())
def test_retention_and_damaged_gz_never_raise(tmp_path_factory, data):
    from vllm_probe.analysis.summary import summarize

    payload = REAL
    n_lines = payload.count(b"\n")
    segs = segments_of(payload, data.draw(st.lists(st.integers(1, n_lines - 1), min_size=2, max_size=8)))
    run = tmp_path_factory.mktemp("kept")
    write_segments(run, segs, [True] * len(segs))
    removed = data.draw(st.integers(0, len(segs) - 1))
    for n in range(1, removed + 1):
        (run / name_of(n, n < len(segs))).unlink()
    damaged = None
    gzs = sorted(run.glob("*.gz"))
    if gzs and data.draw(st.booleans()):
        damaged = data.draw(st.sampled_from(gzs))
        blob = damaged.read_bytes()
        damaged.write_bytes(blob[:data.draw(st.integers(0, len(blob) - 1))])
    (stream,) = rundir.event_streams(run)
    assert stream.removed == removed
    stats = ReadStats()
    recs = list(iter_run(run, stats))
    kept = sum(len(s) for s in segs[removed:]) - sum(1 for s in segs[removed + 1:] for line in s
                                                     if b'"segment"' in line)
    if damaged is None:
        assert len(recs) == kept and stats.skipped == 0
    else:
        assert len(recs) <= kept
    summarize(run)  # the window is summarized, never a traceback
