"""``vllm-probe export`` (JSONL): merge order, verbatim lines, filters, gzip, bad input,
streaming memory; and the reader's fast path classifying lines exactly as before."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import tracemalloc

import pytest

from tests._events import Stream, scenario_chunked, scenario_preempt
from tests.conftest import ROOT
from vllm_probe.exporters.jsonl import ExportError, Filters, export_jsonl
from vllm_probe.runs.reader import ReadStats, iter_file, iter_run, iter_run_lines, parse_line
from tests._events import as_dict


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_probe", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


@pytest.fixture
def two_engines(tmp_path):
    """Two engine cores' files whose timestamps interleave (engine 1 starts 50 ms later)."""
    run = tmp_path / "run"
    a = scenario_chunked(engine=0, pid=11, t=100.0, req="a")
    b = scenario_chunked(engine=1, pid=22, t=100.05, req="b")
    a.write(run)
    b.write(run)
    return run, a, b


def read_lines(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return f.read().splitlines()


def test_merges_engine_cores_by_time_and_keeps_lines_verbatim(two_engines, tmp_path):
    run, a, b = two_engines
    out = tmp_path / "all.jsonl"
    stats = ReadStats()
    n = export_jsonl(run, out, stats=stats).written
    lines = read_lines(out)
    assert n == len(lines) == len(a.events) + len(b.events) == stats.events
    ts = [json.loads(line)["ts"] for line in lines]
    assert ts == sorted(ts)
    assert {json.loads(line)["engine"] for line in lines[:4]} == {0, 1}  # interleaved, not file after file
    assert sorted(lines) == sorted(x.rstrip("\n") for x in a.lines() + b.lines())  # byte for byte


def test_gzip_output(two_engines, tmp_path):
    run, a, b = two_engines
    out = tmp_path / "all.jsonl.gz"
    n = export_jsonl(run, out).written
    with open(out, "rb") as f:
        assert f.read(2) == b"\x1f\x8b"
    assert len(read_lines(out)) == n == len(a.events) + len(b.events)


def test_filters(tmp_path):
    run = tmp_path / "run"
    scenario_preempt().write(run)

    def kept(**kw):
        out = tmp_path / "f.jsonl"
        export_jsonl(run, out, Filters.make(**kw))
        return [json.loads(line) for line in read_lines(out)]

    evs = kept(kinds="preempt,chunk")
    assert {e["event"] for e in evs} == {"preempt", "chunk"} and len(evs) == 2 + 7
    evs = kept(request="B")
    assert [e["event"] for e in evs] == ["engine_config", "request_added", "chunk", "chunk", "preempt", "chunk",
                                         "preempt", "chunk", "request_finished"]
    evs = kept(request="B", kinds=["preempt"])
    assert [(e["event"], e["step"]) for e in evs] == [("preempt", 3), ("preempt", 5)]
    # steps 3..4: events of those steps; request_finished A (step 3) too; engine_config as context
    evs = kept(from_step=3, to_step=4)
    assert [(e["event"], e.get("step"), e.get("req_id")) for e in evs] == [
        ("engine_config", None, None),
        ("preempt", 3, "B"), ("chunk", 3, "C"), ("step", 3, None), ("request_finished", 3, "A"),
        ("chunk", 4, "B"), ("step", 4, None),
    ]
    # events without a step (request_added: before step 0) belong to the next step
    evs = kept(to_step=0, kinds="request_added,step")
    assert [(e["event"], e.get("req_id")) for e in evs] == [
        ("request_added", "A"), ("request_added", "B"), ("request_added", "C"), ("step", None)]
    # the final probe_stats comes after step 8: it belongs to step 9
    assert [e["event"] for e in kept(from_step=9)] == ["engine_config", "probe_stats"]
    assert kept(request="nobody") == [json.loads(scenario_preempt().lines()[0])]


def test_filter_validation():
    with pytest.raises(ExportError, match="unknown event kind"):
        Filters.make(kinds="step,bogus")
    with pytest.raises(ExportError, match="after --to-step"):
        Filters.make(from_step=5, to_step=2)
    with pytest.raises(ExportError, match=">= 0"):
        Filters.make(from_step=-1)


def test_bad_input_is_skipped_and_counted(tmp_path):
    run = tmp_path / "run"
    s = scenario_chunked()
    newer = json.dumps({"event": "step", "ts": 101.95, "pid": 4242, "engine": 0, "schema": 2, "step": 7,
                        "scheduled_tokens": 0, "token_budget": 2048})
    s.write(run, extra_lines=["{broken\n", '"a string"\n', '{"event": "mystery", "ts": 101.3}\n',
                              '{"event": "step", "ts": "yesterday"}\n', newer + "\n"],
            tail='{"event": "step", "ts": 102.0')
    r = cli("export", str(run), "-o", str(tmp_path / "o.jsonl"))
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert "5 lines skipped (3 malformed, 1 partial, 1 unknown kind)" in r.stderr
    assert "1 with a newer schema" in r.stderr
    lines = read_lines(tmp_path / "o.jsonl")
    assert len(lines) == len(s.events) + 1  # the newer-schema line is kept
    assert json.loads(lines[-1])["schema"] == 2


def test_cli_errors_and_stdout(tmp_path, two_engines):
    run, a, b = two_engines
    r = cli("export", str(run), "-o", "-", "--events", "request_finished")
    assert r.returncode == 0
    assert [json.loads(line)["req_id"] for line in r.stdout.splitlines()] == ["a", "b"]
    assert "2 events written to stdout" in r.stderr
    r = cli("export", str(run), "-o", "-", "--events", "nope")
    assert r.returncode == 2 and "unknown event kind(s): nope" in r.stderr and r.stdout == ""
    r = cli("export", str(run), "-o", "-", "--from-step", "4", "--to-step", "1")
    assert r.returncode == 2 and "after --to-step" in r.stderr
    r = cli("export", str(run), "-o", "-", "--request", "a", "--events", "preempt")
    assert r.returncode == 1 and "no event matched" in r.stderr
    r = cli("export", str(run), "-o", "-", "--request", "a", "--from-step", "50")  # only the context: no match
    assert r.returncode == 1 and "only the engine_config context was written" in r.stderr
    assert [json.loads(line)["event"] for line in r.stdout.splitlines()] == ["engine_config"] * 2
    r = cli("export", str(run), "-o", "-", "--request", "nobody")  # an id the run does not have: bad input
    assert r.returncode == 2 and "no request id starts with 'nobody' (2 requests in the run)" in r.stderr
    assert r.stdout == ""
    r = cli("export", str(run), "-o", "-", "--events", "engine_config")  # asked for: a match
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2
    r = cli("export", str(tmp_path / "missing"))
    assert r.returncode == 2 and "run directory not found" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "empty").mkdir()
    r = cli("export", str(tmp_path / "empty"), "-o", "-")
    assert r.returncode == 1 and "no event files" in r.stderr
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "events-1.jsonl").write_text("nope\n")
    r = cli("export", str(tmp_path / "junk"), "-o", "-")
    assert r.returncode == 1 and "1 malformed" in r.stderr and "no readable events" in r.stderr
    r = cli("export", str(run), "-o", str(tmp_path / "no-such-dir" / "x.jsonl"))
    assert r.returncode == 2 and "cannot write" in r.stderr and "Traceback" not in r.stderr
    r = cli("export", str(run))  # default: RUN_DIR/events.jsonl
    assert r.returncode == 0 and len(read_lines(run / "events.jsonl")) == len(a.events) + len(b.events)


def _big_run(path, steps: int) -> None:
    s = Stream()
    s.config(0.0, budget=512, max_num_seqs=8)
    for i in range(steps):
        s.step(1.0 + i * 0.01, i, 512, decode=8, running=8, waiting=0)
    path.mkdir()
    with open(path / "events-4242.jsonl", "w") as f:
        f.writelines(s.lines())


def test_export_memory_does_not_grow_with_the_run(tmp_path):
    peaks = []
    for n in (2_000, 20_000):
        run = tmp_path / f"run{n}"
        _big_run(run, n)
        tracemalloc.start()
        export_jsonl(run, tmp_path / "out.jsonl.gz")
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] < peaks[0] * 1.5 + 64 * 1024, peaks  # 10x the events, about the same peak


# -- every reader classifies lines exactly like parse_line -------------------------------------


TRICKY = [
    b'{"event": "step", "ts": 1.0, "engine": 0, "schema": 1, "step": 0}\n',
    b'{"event": "step", "ts": 2, "schema": 1}\n',  # int ts, no engine
    b'{"event": "chunk", "ts": true, "req_id": "r"}\n',  # bool ts
    b'{"event": "chunk", "ts": 3.0, "engine": 1, "schema": 7, "req_id": "r", "start": 0, "end": 8}\n',  # newer
    b'{"event": "chunk", "ts": 3.1, "engine": 1, "schema": 7}\n',  # no req_id
    b'{"event": "step", "ts": 3.2, "engine": null}\n',  # null engine: 0
    b'{"event": "chunk", "ts": 3.5, "engine": 1, "schema": true, "req_id": "r"}\n',
    b'{"event": "chunk", "ts": 3.6, "engine": 1, "schema": "1", "req_id": "r"}\n',
    b'{"event": "chunk", "ts": 3.7, "req_id": "r", "start": "0"}\n',  # a string for a position
    b'{"event": "step", "ts": 3.8, "scheduled_tokens": true}\n',  # a bool for a count
    b'{"event": "step", "ts": 3.9, "scheduled_tokens": 3.0}\n',  # a float for a count
    b'{"event": "chunk", "ts": NaN, "engine": 0, "req_id": "r"}\n',  # not JSON
    b'{"event": "step", "ts": 4.0, "engine": 0, "kv_usage": Infinity}\n',  # not JSON
    b'{"event": "step", "ts": 1e400}\n',  # out of range
    b'{"event": ["step"], "ts": 5.0}\n',
    b'{"event": "nope", "ts": 5.0}\n',
    b'[{"event": "step", "ts": 5.0}]\n',
    b'{"event": "step", "ts": 6.0, "engine": 0, "x": 123456789012345678901234567890}\n',  # unknown field
    b'{"event": "step", "ts": 6.5, "x": ' + b"[" * 5000 + b"]" * 5000 + b"}\n",  # deeper than msgspec goes
    b'\xff\xfe\n',
    b'   \n',
    b'{"event": "step", "ts": 7.0, "engine": 0, "event": "chunk"}\n',  # the last key wins: a chunk, no req_id
    b'{"event": "step", "ts": 8.0, "engine": 2}',  # partial
]


def test_every_reader_classifies_lines_exactly_like_parse_line(tmp_path):
    path = tmp_path / "events-1.jsonl"
    path.write_bytes(b"".join(TRICKY))

    ref_stats, ref = ReadStats(), []
    for raw in TRICKY:
        if not raw.endswith(b"\n"):
            ref_stats.partial += 1
        elif raw.strip():
            ev = parse_line(raw, ref_stats)
            if ev is not None:
                ref.append(as_dict(ev))
    # by hand: 5 events (int ts, newer schema, null engine, an unknown field), 1 newer, 1 unknown
    # kind, 1 partial, and 15 malformed: wrong types, no req_id, not JSON, out of range, too deep
    assert [(e["event"], e["ts"], e["engine"]) for e in ref] == [
        ("step", 1.0, 0), ("step", 2.0, 0), ("chunk", 3.0, 1), ("step", 3.2, 0), ("step", 6.0, 0)]
    assert (ref_stats.events, ref_stats.malformed, ref_stats.unknown_kind, ref_stats.newer_schema) == (5, 15, 1, 1)

    readers = {
        "file": lambda s: [as_dict(e) for e in iter_file(path, s)],
        "lines": lambda s: [as_dict(e) for e, _ in iter_run_lines(tmp_path, s)],
        "run": lambda s: [as_dict(e) for e in iter_run(tmp_path, s)],
    }
    for name, read in readers.items():
        stats = ReadStats()
        assert read(stats) == ref, name
        assert (stats.events, stats.malformed, stats.partial, stats.unknown_kind, stats.newer_schema) == \
            (ref_stats.events, ref_stats.malformed, ref_stats.partial, ref_stats.unknown_kind,
             ref_stats.newer_schema), name
