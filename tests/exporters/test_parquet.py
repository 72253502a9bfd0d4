"""``vllm-probe export --format parquet``: one table per record type with the run's keys,
the schema version in the metadata, segments and ``.gz`` read as one run, written whole
and private; a fleet's question answered by one DuckDB query equal to ``summary`` run by
run, over the Parquet and over the JSONL (docs/fleet.md's queries)."""

from __future__ import annotations

import gzip
import json
import os
import stat
import subprocess
import sys

import pytest

from tests._events import scenario_chunked, scenario_preempt
from tests.conftest import ROOT
from vllm_probe.analysis.summary import summarize
from vllm_probe.exporters.base import ExportError
from vllm_probe.exporters.parquet import PARQUET_VERSION, TABLES, export_parquet
from vllm_probe.schema.events import SCHEMA_VERSION

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def table(out, name):
    return pq.read_table(out / f"{name}.parquet").to_pylist()


def kinds(stream):
    n: dict[str, int] = {}
    for ev in stream.events:
        n[ev["event"]] = n.get(ev["event"], 0) + 1
    return n


@pytest.fixture
def two_engines(tmp_path):
    run = tmp_path / "20261201-000000-two"
    a = scenario_chunked(engine=0, pid=11, t=100.0, req="a")
    b = scenario_preempt(t=100.05)
    for ev in b.events:
        ev["engine"], ev["pid"] = 1, 22
    b.engine, b.pid = 1, 22
    a.write(run)
    b.write(run)
    (run / "meta.json").write_text(json.dumps({"command": ["python", "serve.py"], "host": "gpu-07",
                                               "start_time": 99.0, "end_time": 102.0, "exit_code": 0}))
    return run, a, b


def test_one_table_per_record_type_with_the_keys_and_the_schema_version(two_engines, tmp_path):
    run, a, b = two_engines
    out = tmp_path / "pq"
    result = export_parquet(run, out)
    assert sorted(os.listdir(out)) == sorted(f"{t}.parquet" for t in TABLES)
    steps = table(out, "steps")
    assert len(steps) == kinds(a)["step"] + kinds(b)["step"] == 7 + 9
    assert [(r["run_id"], r["host"], r["engine"]) for r in steps[:1]] == [("20261201-000000-two", "gpu-07", 0)]
    assert [r["step"] for r in steps if r["engine"] == 1] == list(range(9))
    assert [r["scheduled_tokens"] for r in steps if r["engine"] == 0] == [2048, 2048, 904, 1, 1, 1, 0]
    assert [r["preempted"] for r in steps if r["engine"] == 1 and r["preempted"]] == [["B"], ["B"]]
    chunks = table(out, "chunks")
    assert len(chunks) == 3 + 7
    assert [(r["req_id"], r["start"], r["end"], r["last"]) for r in chunks if r["engine"] == 0] == [
        ("a", 0, 2048, False), ("a", 2048, 4096, False), ("a", 4096, 5000, True)]
    pre = table(out, "preemptions")
    assert [(r["engine"], r["step"], r["req_id"], r["discarded_tokens"], r["num_preemptions"]) for r in pre] == [
        (1, 3, "B", 80, 1), (1, 5, "B", 81, 2)]
    assert list(pq.read_schema(out / "steps.parquet").names[:4]) == ["run_id", "host", "engine", "step"]
    for name in TABLES:
        md = pq.read_schema(out / f"{name}.parquet").metadata
        assert md[b"vllm_probe.schema_version"] == str(SCHEMA_VERSION).encode()
        assert md[b"vllm_probe.parquet_version"] == str(PARQUET_VERSION).encode()
        assert md[b"vllm_probe.table"] == name.encode()
        assert stat.S_IMODE((out / f"{name}.parquet").stat().st_mode) == 0o600
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    assert result.matched == len(a.events) + len(b.events) and result.written == 16 + 10 + 2 + 4 + 2


def test_requests_carry_their_latencies_and_runs_their_settings(two_engines, tmp_path):
    run, _, _ = two_engines
    out = tmp_path / "pq"
    export_parquet(run, out)
    reqs = {r["req_id"]: r for r in table(out, "requests")}
    a = reqs["a"]  # scenario_chunked's figures by hand
    assert a["finished"] and a["engine"] == 0 and a["step"] == 0 and a["prompt_len"] == 5000
    assert a["queue_s"] == pytest.approx(0.2) and a["ttft_s"] == pytest.approx(0.501) and a["ttft_steps"] == 3
    assert a["decode_s"] == pytest.approx(0.249) and a["itl_s"] == pytest.approx(0.083) and a["output_tokens"] == 4
    assert reqs["B"]["preemptions"] == 2 and reqs["B"]["discarded_tokens"] == 161 and reqs["B"]["chunks"] == 4
    runs = table(out, "runs")
    assert [(r["engine"], r["max_num_batched_tokens"], r["max_num_seqs"], r["command"], r["host"], r["steps"])
            for r in runs] == [(0, 2048, 8, "python serve.py", "gpu-07", 7),
                               (1, 100, 2, "python serve.py", "gpu-07", 9)]
    assert json.loads(runs[0]["flags"])["log_request_events"] is True
    summary = summarize(run)
    span = max(r["last_step_ts"] for r in runs) - min(r["first_step_start_ts"] for r in runs)
    assert span == pytest.approx(summary.duration_s)


def test_segments_and_gz_read_as_one_run(tmp_path):
    """The same stream whole, and cut in three segments (the later ones headed by the
    engine_config copy, the closed ones gzipped), give the same tables."""
    s = scenario_preempt()
    whole = tmp_path / "whole"
    s.write(whole)
    seg = tmp_path / "seg"
    seg.mkdir()
    lines = s.lines()
    head = dict(s.events[0], segment=0)
    parts = [lines[:10], lines[10:20], lines[20:]]
    for n, part in enumerate(parts, start=1):
        if n > 1:
            part = [json.dumps(dict(head, segment=n)) + "\n", *part]
        name = "events-4242.jsonl" if n == 1 else f"events-4242.{n}.jsonl"
        data = "".join(part).encode()
        if n < len(parts):
            (seg / f"{name}.gz").write_bytes(gzip.compress(data))
        else:
            (seg / name).write_bytes(data)
    export_parquet(whole, tmp_path / "a", run_id="r")
    export_parquet(seg, tmp_path / "b", run_id="r")
    for name in TABLES:
        ta, tb = table(tmp_path / "a", name), table(tmp_path / "b", name)
        assert ta == tb, name
    assert len(table(tmp_path / "b", "steps")) == 9


def test_a_folder_of_other_files_is_never_replaced_and_an_interrupted_export_leaves_nothing(two_engines, tmp_path,
                                                                                             monkeypatch):
    run, _, _ = two_engines
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(ExportError, match="not a folder of vllm-probe Parquet tables"):
        export_parquet(run, mine)
    assert os.listdir(mine) == ["notes.txt"]
    out = tmp_path / "pq"
    export_parquet(run, out)
    before = {p: (out / p).read_bytes() for p in os.listdir(out)}

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("vllm_probe.exporters.parquet._requests", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export_parquet(run, out)
    assert {p: (out / p).read_bytes() for p in os.listdir(out)} == before  # the previous tables, whole
    assert sorted(os.listdir(tmp_path)) == ["20261201-000000-two", "mine", "pq"]  # no temporary left


def test_the_cli_writes_the_folder_and_refuses_stdout_and_filters(two_engines, tmp_path):
    run, _, _ = two_engines
    out = tmp_path / "pq"
    cmd = [sys.executable, "-m", "vllm_probe", "export", str(run), "--format", "parquet"]
    proc = subprocess.run([*cmd, "-o", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "steps 16, chunks 10, preemptions 2, requests 4, runs 2" in proc.stderr
    for bad, why in ((["-o", "-"], "give it with -o DIR"), (["-o", str(out), "--events", "step"], "apply to")):
        proc = subprocess.run([*cmd, *bad], capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and why in proc.stderr


def _fleet(tmp_path):
    """Three runs on two hosts at two max_num_seqs, each exported into fleet/<run>/."""
    specs = [("r1", "host-a", 2, 0.0), ("r2", "host-a", 2, 3600.0), ("r3", "host-b", 4, 7200.0)]
    fleet = tmp_path / "fleet"
    runs = []
    for name, host, seqs, shift in specs:
        s = scenario_preempt(t=1_800_000_000.0 + shift)
        s.events[0]["max_num_seqs"] = seqs
        if name == "r3":  # one preemption fewer: its event and its step's list
            s.events = [e for e in s.events if not (e["event"] == "preempt" and e["step"] == 5)]
            next(e for e in s.events if e["event"] == "step" and e["step"] == 5)["preempted"] = []
        run = tmp_path / "runs" / name
        s.write(run)
        (run / "meta.json").write_text(json.dumps({"command": ["serve"], "host": host}))
        export_parquet(run, fleet / name)
        runs.append(run)
    return fleet, runs


#: docs/fleet.md's query: preemptions per hour of stepping, per server and max_num_seqs. A
#: run's preemptions as summary counts them: per engine core its preempt events, or the
#: ids in its steps' preempted lists where those counted more (preempt events off).
FLEET_QUERY = """
WITH spans AS (
  SELECT run_id, host, any_value(max_num_seqs) AS max_num_seqs,
         max(last_step_ts) - min(first_step_start_ts) AS seconds
  FROM read_parquet('{fleet}/*/runs.parquet') GROUP BY run_id, host),
events AS (SELECT run_id, engine, count(*) AS n FROM read_parquet('{fleet}/*/preemptions.parquet')
           GROUP BY run_id, engine),
lists AS (SELECT run_id, engine, sum(len(preempted)) AS n FROM read_parquet('{fleet}/*/steps.parquet')
          GROUP BY run_id, engine),
per_run AS (SELECT run_id, sum(greatest(coalesce(events.n, 0), coalesce(lists.n, 0))) AS preemptions
            FROM lists FULL JOIN events USING (run_id, engine) GROUP BY run_id)
SELECT host, max_num_seqs, count(*) AS runs, sum(coalesce(preemptions, 0)) AS preemptions,
       sum(seconds) / 3600 AS hours, sum(coalesce(preemptions, 0)) / (sum(seconds) / 3600) AS per_hour
FROM spans LEFT JOIN per_run USING (run_id) GROUP BY host, max_num_seqs ORDER BY host, max_num_seqs
"""


def test_one_query_over_the_fleets_parquet_equals_summary_run_by_run(tmp_path):
    duckdb = pytest.importorskip("duckdb")
    fleet, runs = _fleet(tmp_path)
    rows = duckdb.sql(FLEET_QUERY.format(fleet=fleet)).fetchall()
    expected: dict[tuple, list] = {}
    for run in runs:
        s = summarize(run)
        host = json.loads((run / "meta.json").read_text())["host"]
        e = expected.setdefault((host, s.config["max_num_seqs"]), [0, 0, 0.0])
        e[0] += 1
        e[1] += s.preemptions.count
        e[2] += s.duration_s
    assert [(h, m, n, p) for h, m, n, p, _, _ in rows] == [(h, m, n, p) for (h, m), (n, p, _) in expected.items()]
    assert [(h, m, n, p) for h, m, n, p, _, _ in rows] == [("host-a", 2, 2, 4), ("host-b", 4, 1, 1)]
    for (_, _, _, _, hours, per_hour), (_, pe, secs) in zip(rows, expected.values()):
        assert hours == pytest.approx(secs / 3600) and per_hour == pytest.approx(pe / (secs / 3600))


def test_the_same_question_over_the_jsonl_with_read_json(tmp_path):
    duckdb = pytest.importorskip("duckdb")
    _, runs = _fleet(tmp_path)
    root = runs[0].parent
    query = f"""
    SELECT parse_path(filename)[-2] AS run_id, count(*) FILTER (WHERE event = 'preempt') AS preemptions,
           max(ts) FILTER (WHERE event = 'step')
             - min(ts - schedule_us * 1e-6) FILTER (WHERE event = 'step') AS seconds,
           any_value(max_num_seqs) FILTER (WHERE event = 'engine_config') AS max_num_seqs
    FROM read_json('{root}/*/events-*.jsonl*', format = 'newline_delimited', union_by_name = true, filename = true)
    GROUP BY run_id ORDER BY run_id"""
    rows = duckdb.sql(query).fetchall()
    assert [(r, p, m) for r, p, _, m in rows] == [("r1", 2, 2), ("r2", 2, 2), ("r3", 1, 4)]
    for (_, _, secs, _), run in zip(rows, runs):
        assert secs == pytest.approx(summarize(run).duration_s)
