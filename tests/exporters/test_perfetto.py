"""The Perfetto / chrome://tracing export checked against the Trace Event Format rules,
and its slices against timings worked out by hand (tests/_events.py)."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
from collections import defaultdict

import pytest

from tests._events import scenario_chunked, scenario_preempt, records
from tests.conftest import ROOT, requires_vllm
from vllm_probe.exporters.perfetto import SCHED_TID, build_trace, export_perfetto
from vllm_probe.runs.reader import ReadStats

METADATA_NAMES = {"process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index"}


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def validate(doc: dict) -> list[dict]:
    """Assert the Trace Event Format rules we rely on; return the events.

    JSON Object Format with ``traceEvents``; every event has ``name`` (string), ``ph``,
    ``pid``; ``ts`` in integer microseconds (>= 0); X: ``tid`` and ``dur`` >= 0; i: scope
    ``s`` in g/p/t; C: numeric args; M: a known metadata name and its ``name`` /
    ``sort_index`` argument. Complete slices on one (pid, tid) never partially overlap.
    """
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    assert doc.get("displayTimeUnit") in (None, "ms", "ns")
    events = doc["traceEvents"]
    slices = defaultdict(list)
    for ev in events:
        assert isinstance(ev.get("name"), str) and ev["name"], ev
        assert isinstance(ev.get("pid"), int), ev
        ph = ev["ph"]
        assert ph in {"X", "i", "C", "M"}, ev
        assert isinstance(ev.get("ts"), int) and ev["ts"] >= 0, ev  # integer µs
        if ph == "X":
            assert isinstance(ev.get("tid"), int) and isinstance(ev.get("dur"), int) and ev["dur"] >= 0, ev
            slices[(ev["pid"], ev["tid"])].append(ev)
        elif ph == "i":
            assert ev.get("s") in ("g", "p", "t") and isinstance(ev.get("tid"), int), ev
        elif ph == "C":
            assert ev.get("args") and all(_is_num(v) for v in ev["args"].values()), ev
        elif ph == "M":
            assert ev["name"] in METADATA_NAMES, ev
            key = "name" if ev["name"] in ("process_name", "thread_name") else "sort_index"
            assert key in ev["args"], ev
            if ev["name"].startswith("thread"):
                assert isinstance(ev.get("tid"), int), ev
        if "args" in ev:
            assert isinstance(ev["args"], dict)
    for track, evs in slices.items():  # proper nesting: a stack of open slices per track
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[int] = []
        for e in evs:
            while stack and stack[-1] <= e["ts"]:
                stack.pop()
            end = e["ts"] + e["dur"]
            assert not stack or end <= stack[-1], f"partial overlap on {track}: {e}"
            stack.append(end)
    return events


def trace_of(events, **kw) -> dict:
    buf = io.BytesIO()
    build_trace(records(events), buf, **kw)
    return json.loads(buf.getvalue())


def track(events, tid):
    return sorted((e for e in events if e.get("tid") == tid and e["ph"] in "Xi"),
                  key=lambda e: (e["ts"], e["ph"] == "X"))


def tid_of(events, label_start):
    return next(e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"
                and e["args"]["name"].startswith(label_start))


def test_chunked_prompt_slices_by_hand():
    doc = trace_of(scenario_chunked(t=100.0).events)  # ts 0 = the first event (t)
    events = validate(doc)
    tid = tid_of(events, "req R")
    got = [(e["name"], e["ph"], e["ts"], e.get("dur")) for e in track(events, tid)]
    # queued: arrival t+0.1 → end of step 0's schedule() (t+0.301); each chunk runs from the
    # end of its step's schedule() to the start of the next one (next ts − 1 ms); decode
    # from there to request_finished (t+0.85)
    assert got == [
        ("queued", "X", 100_000, 201_000),
        ("prefill [0, 2048)", "X", 301_000, 99_000),
        ("prefill [2048, 4096)", "X", 401_000, 99_000),
        ("prefill [4096, 5000)", "X", 501_000, 99_000),
        ("decode", "X", 600_000, 250_000),
    ]
    assert track(events, tid)[0]["args"] == {"prompt_len": 5000, "max_tokens": 4, "priority": 0}
    chunk = track(events, tid)[2]["args"]
    assert ((chunk["chunk_index"], chunk["start"], chunk["end"], chunk["tokens"], chunk["step"])
            == (1, 2048, 4096, 2048, 1))
    assert track(events, tid)[-1]["args"]["output_tokens"] == 4
    sched = track(events, SCHED_TID)
    assert [(e["name"], e["args"]["step"], e["ts"], e["dur"]) for e in sched[:2]] == [
        ("schedule()", 0, 300_000, 1_000), ("schedule()", 1, 400_000, 1_000)]
    kv = [e for e in events if e["ph"] == "C" and e["name"] == "KV-cache use"]
    assert [e["args"]["percent"] for e in kv] == [25.0, 50.0, 62.5, 62.5, 62.5, 62.5, 0.0]
    assert kv[0]["ts"] == 301_000
    tokens = [e["args"] for e in events if e["ph"] == "C" and e["name"] == "step tokens"]
    assert tokens[2] == {"prefill": 904, "decode": 0, "unused budget": 1144}  # adds up to the budget
    reqs = [e["args"] for e in events if e["ph"] == "C" and e["name"] == "requests"]
    assert reqs[0] == {"running": 1, "waiting": 0}
    procs = [e for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    assert [p["args"]["name"] for p in procs] == ["vLLM engine core · DP rank 0 (pid 4242)"]
    assert doc["otherData"]["t0_epoch_s"] == 100.0


def test_preempted_request_shows_instant_then_recompute():
    events = validate(trace_of(scenario_preempt().events))
    b = track(events, tid_of(events, "req B"))
    assert [e["name"] for e in b] == [
        "queued", "prefill [0, 50)", "prefill [50, 80)", "decode", "preempted", "queued (preempted)",
        "recompute [0, 81)", "decode", "preempted", "queued (preempted)", "recompute [0, 82)", "decode",
    ]
    first_preempt = b[4]
    assert first_preempt["ph"] == "i" and first_preempt["s"] == "t"
    assert first_preempt["args"]["discarded_tokens"] == 80 and first_preempt["args"]["num_preemptions"] == 1
    # the decode slice ends where the preemption happens; the queue slice starts there
    assert b[3]["ts"] + b[3]["dur"] == first_preempt["ts"] == b[5]["ts"] == 390_000 + 500_000
    assert b[-1]["args"]["num_preemptions"] == 2
    a = track(events, tid_of(events, "req A"))
    assert [e["name"] for e in a] == ["queued", "prefill [0, 100)", "prefill [100, 150)", "decode"]
    sched = [e for e in events if e.get("tid") == SCHED_TID and e["ph"] == "X"]
    assert len(sched) == 9 and sched[3]["args"]["preempted"] == ["B"]


def test_two_engine_cores_are_two_processes(tmp_path):
    a = scenario_chunked(engine=0, pid=11, t=100.0, req="a")
    b = scenario_chunked(engine=1, pid=22, t=100.05, req="b")
    a.write(tmp_path)
    b.write(tmp_path)
    out = tmp_path / "trace.json"
    result = export_perfetto(tmp_path, out)
    events = validate(json.loads(out.read_text()))
    procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {11: "vLLM engine core · DP rank 0 (pid 11)", 22: "vLLM engine core · DP rank 1 (pid 22)"}
    threads = {(e["pid"], e["args"]["name"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(11, "req a · 5000 tok"), (22, "req b · 5000 tok"), (11, "scheduler"), (22, "scheduler")} <= threads
    assert (result.engines, result.requests, result.steps) == (2, 2, 14)
    # engine 1's slices are 50 ms later than engine 0's
    qa = next(e for e in events if e["pid"] == 11 and e["name"] == "prefill [0, 2048)")
    qb = next(e for e in events if e["pid"] == 22 and e["name"] == "prefill [0, 2048)")
    assert qb["ts"] - qa["ts"] == 50_000


def test_unfinished_requests_and_missing_step_events_still_nest():
    evs = [e for e in scenario_preempt().events if e["event"] not in ("request_finished",)]
    validate(trace_of(evs))
    no_steps = [e for e in scenario_preempt().events if e["event"] != "step"]
    events = validate(trace_of(no_steps))
    b = track(events, tid_of(events, "req B"))
    assert [e["name"] for e in b][:3] == ["queued", "prefill [0, 50)", "prefill [50, 80)"]
    assert not [e for e in events if e["ph"] == "C"]


def test_cli_perfetto_gz_and_stdout(tmp_path):
    scenario_preempt().write(tmp_path / "run")
    r = subprocess.run([sys.executable, "-m", "vllm_probe", "export", str(tmp_path / "run"), "--format", "perfetto",
                        "-o", str(tmp_path / "t.json.gz")], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    with gzip.open(tmp_path / "t.json.gz", "rt") as f:
        validate(json.load(f))
    r = subprocess.run([sys.executable, "-m", "vllm_probe", "export", str(tmp_path / "run"), "--format", "perfetto",
                        "-o", "-"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and validate(json.loads(r.stdout))
    r = subprocess.run([sys.executable, "-m", "vllm_probe", "export", str(tmp_path / "run"), "--format", "perfetto",
                        "--events", "step"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "apply to --format jsonl only" in r.stderr


@requires_vllm
@pytest.mark.engine
def test_real_run_trace_is_valid(quick_run, tmp_path):
    out = tmp_path / "trace.json"
    stats = ReadStats()
    result = export_perfetto(quick_run, out, stats=stats)
    events = validate(json.loads(out.read_text()))
    assert result.requests == 8 and stats.skipped == 0
    names = [e["name"] for e in events if e["ph"] == "X"]
    assert sum(n.startswith("prefill [") for n in names) >= 8 * 3
    assert sum(n == "decode" for n in names) >= 8
    preempts = [e for e in events if e["ph"] == "i" and e["name"] == "preempted"]
    assert len(preempts) >= 1
    # after each preemption the request's next slices are a queue and recompute chunks
    for p in preempts:
        nxt = [e for e in track(events, p["tid"]) if e["ts"] >= p["ts"] and e["ph"] == "X"]
        assert nxt[0]["name"] == "queued (preempted)" and nxt[1]["name"].startswith("recompute [0, ")
