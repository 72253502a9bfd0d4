"""Hostile logs through every reading command: counted skips and exit 0, never a crash.

Each bad line below made at least one command raise before the reader validated field
types against the schema (``tail --plain`` and the Perfetto export did arithmetic on a
string; ``Infinity`` overflowed the timeline's µs; deep nesting raised RecursionError;
a ``meta.json`` list crashed every view).
"""

from __future__ import annotations

import json

import pytest

from tests._events import scenario_chunked
from tests.conftest import run_cli
from vllm_probe.analysis.summary import summarize

BAD_LINES = [
    '{"event": "step", "ts": 100.35, "engine": 0, "step": 9, "scheduled_tokens": "12", "token_budget": 2048}\n',
    '{"event": "step", "ts": 100.36, "engine": 0, "step": 9, "kv_usage": "0.5", "preempted": true}\n',
    '{"event": "step", "ts": 100.37, "engine": [1], "step": 9}\n',
    '{"event": "step", "ts": 100.38, "engine": 0, "step": 9, "schedule_us": [1]}\n',
    '{"event": "chunk", "ts": 100.39, "engine": 0, "req_id": "R", "start": "12", "end": 20}\n',
    '{"event": "chunk", "ts": 100.40, "engine": 0, "req_id": {"id": 1}, "start": 0, "end": 20}\n',
    '{"event": "step", "ts": Infinity, "engine": 0, "step": 9}\n',
    '{"event": "request_added", "ts": 100.41, "engine": 0, "req_id": "Z", "arrival_ts": NaN}\n',
    '{"event": "step", "ts": 100.42, "engine": 0, "x": ' + "[" * 5000 + "]" * 5000 + "}\n",
    # well-typed but out of range: a step from 1970 with negative tokens, a share above 1
    '{"event": "step", "ts": 1, "engine": 0, "step": 5000, "scheduled_tokens": -5, "token_budget": 0}\n',
    '{"event": "step", "ts": 100.43, "engine": 0, "step": 9, "kv_usage": 1.5}\n',
    '{"event": "preempt", "ts": 100.44, "engine": 0, "req_id": "R", "discarded_tokens": -100}\n',
]

METAS = {
    "good": {"command": ["python", "x.py"], "start_time": 99.0, "end_time": 101.0, "exit_code": 0},
    "a list": [1, 2, 3],
    "wrong types": {"command": 5, "start_time": "soon", "end_time": [1], "exit_code": "0"},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("bad")
    scenario_chunked().write(base / "clean")
    out = {}
    for name, meta in METAS.items():
        run = base / name.replace(" ", "-")
        scenario_chunked().write(run, extra_lines=BAD_LINES)
        (run / "meta.json").write_text(json.dumps(meta))
        out[name] = run
    return base / "clean", out


def test_bad_lines_are_counted_and_leave_the_figures_alone(runs):
    clean, bad = runs
    s = summarize(bad["good"])
    assert s.read["malformed"] == len(BAD_LINES) and s.read["events"] == summarize(clean).read["events"]
    for attr in ("steps", "tokens_per_step", "chunking", "latency", "preemptions", "bound_by", "duration_s"):
        assert getattr(s, attr) == getattr(summarize(clean), attr), attr


@pytest.mark.parametrize("meta", list(METAS))
@pytest.mark.parametrize("command", ["summary", "summary-json", "compare", "export", "perfetto", "tail", "doctor",
                                     "doctor-json", "report", "parquet"])
def test_every_reading_command_survives(runs, meta, command, tmp_path):
    clean, bad = runs
    run = str(bad[meta])
    if command in ("report", "parquet"):
        pytest.importorskip("bokeh" if command == "report" else "pyarrow")
    args = {
        "summary": ["summary", run],
        "summary-json": ["summary", run, "--json"],
        "compare": ["compare", str(clean), run],
        "export": ["export", run, "-o", str(tmp_path / "out.jsonl")],
        "perfetto": ["export", run, "--format", "perfetto", "-o", str(tmp_path / "trace.json")],
        "tail": ["tail", "--plain", "--no-follow", run],
        "doctor": ["doctor", run],
        "doctor-json": ["doctor", run, "--json"],
        "report": ["report", run, "-o", str(tmp_path / "report.html")],
        "parquet": ["export", run, "--format", "parquet", "-o", str(tmp_path / "pq")],
    }[command]
    r = run_cli(*args, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr
    if command == "summary-json":
        data = json.loads(r.stdout)  # strict JSON: no NaN / Infinity got through
        assert data["read"]["malformed"] == len(BAD_LINES) and data["steps"] == 7
    if command == "perfetto":
        trace = json.loads((tmp_path / "trace.json").read_text())
        assert all(isinstance(e["ts"], int) for e in trace["traceEvents"])
    if command == "export":  # export copies lines verbatim: only the valid ones
        lines = (tmp_path / "out.jsonl").read_text().splitlines()
        assert len(lines) == summarize(clean).read["events"]
    if command == "report":  # the page's totals are the clean stream's
        page = (tmp_path / "report.html").read_text()
        assert f"data-total='steps' data-run='0' data-value='{summarize(clean).steps}'" in page
    if command == "parquet":
        import pyarrow.parquet as pq

        assert pq.read_table(tmp_path / "pq" / "steps.parquet").num_rows == summarize(clean).steps == 7
    if command == "tail":
        assert sum(" step " in line for line in r.stdout.splitlines()) == 7
    if command == "doctor-json":  # the clean stream's findings, whatever the bad lines
        clean_run = json.loads(run_cli("doctor", str(clean), "--json").stdout)
        assert json.loads(r.stdout)["findings"] == clean_run["findings"]
