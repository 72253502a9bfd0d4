"""The retention window (issue 19 item 2): when retention removed the start of a run,
every view says so in one line, and figures that need a request's start are unknown
for the requests added before the window, never wrong."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from vllm_probe.analysis.window import RetentionWindow, retention_note_of, span
from vllm_probe.runs.rundir import event_streams


@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    """Twelve requests arriving 15 steps apart on vLLM's real Scheduler, written in ~4 KB
    segments of which ~10 KB are kept: the start of the run is gone."""
    pytest.importorskip("vllm")
    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_probe import engine as probe
    from vllm_probe.engine.hooks import file_sink_factory
    from vllm_probe.settings import ProbeFlags
    from vllm_probe.sim import harness as testing

    run = tmp_path_factory.mktemp("win") / "run"
    rt = probe.Runtime(ProbeFlags(max_segment_mb=0.004, keep_mb=0.01), file_sink_factory(run))
    assert probe.install(Scheduler, rt, "0.32.0")
    try:
        s = testing.make_scheduler(testing.SchedulerSpec(max_num_batched_tokens=64, num_blocks=40))
        for i in range(12):
            s.add_request(testing.make_request(100, 40, req_id=f"q{i}", seed=i))
            for _ in range(15):
                testing.step(s)
        testing.run_until_idle(s)
    finally:
        probe.uninstall(Scheduler)
    rt.sink.close()
    assert rt.sink.keeper.wait_idle(30) and rt.sink.keeper.removed > 5
    (run / "meta.json").write_text(json.dumps({"command": ["python", "serve.py"], "exit_code": 0,
                                               "start_time": 1.0, "end_time": 2.0}))
    return run


def _raw(run):
    out = []
    for seg in event_streams(run)[0].segments:
        data = gzip.decompress(seg.path.read_bytes()) if seg.gz else seg.path.read_bytes()
        out += [json.loads(line) for line in data.splitlines()]
    return out


def test_the_window_line_and_the_requests_before_it(windowed):
    from vllm_probe.analysis.summary import summarize

    stream = event_streams(windowed)[0]
    raw = _raw(windowed)
    head = raw[0]
    assert head["event"] == "engine_config" and head["segment"] == stream.segments[0].n > 1
    first_step = next(e for e in raw if e["event"] == "step")
    after = first_step["ts"] - first_step["schedule_us"] * 1e-6 - head["ts"]
    expected = (f"retention removed segments 1–{stream.removed}: the window starts at step "
                f"{first_step['step']:,}, {span(after)} after the start")
    s = summarize(windowed)
    assert s.retention == expected
    # requests of the window whose request_added is gone
    added = {e["req_id"] for e in raw if e["event"] == "request_added"}
    seen = {e["req_id"] for e in raw if "req_id" in e}
    before = seen - added
    assert before and s.requests_before_window == len(before)
    finished_in = [e for e in raw if e["event"] == "request_finished" and e["req_id"] in added]
    assert s.requests_finished == len(finished_in)
    assert s.output_tokens == sum(e["output_tokens"] for e in finished_in)  # theirs only
    assert s.latency.ttft_s.n == s.latency.ttft_steps.n == s.latency.e2e_s.n == len(finished_in)
    assert retention_note_of(windowed) == expected  # export's and whatif's reading of the head


def test_every_view_says_it_in_one_line(windowed):
    from vllm_probe.analysis.summary import summarize

    line = summarize(windowed).retention
    for cmd in (["summary", str(windowed)], ["doctor", str(windowed)], ["compare", str(windowed), str(windowed)],
                ["tail", "--plain", str(windowed)], ["export", str(windowed), "--out", "-"]):
        proc = subprocess.run([sys.executable, "-m", "vllm_probe", *cmd], capture_output=True, text=True,
                              cwd=ROOT, timeout=300, env={**os.environ, "COLUMNS": "250"})  # one line unwrapped
        text = proc.stdout + proc.stderr
        assert proc.returncode in (0, 1), (cmd, text[-2000:])
        assert text.count(line) >= 1, (cmd, text[-2000:])
        assert "Traceback" not in text
    proc = subprocess.run([sys.executable, "-m", "vllm_probe", "summary", "--json", str(windowed)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    d = json.loads(proc.stdout)
    assert d["retention"] == line and d["requests_before_window"] > 0


def test_the_window_text():
    w = RetentionWindow(engine=0, removed=12, first_step=48112, after_start_s=3 * 3600 + 600,
                        requests_before_window=3)
    assert w.text() == "retention removed segments 1–12: the window starts at step 48,112, 3 h 10 min after the start"
    assert RetentionWindow(0, 1, 7, 65.0, 0).text() == (
        "retention removed segment 1: the window starts at step 7, 1 min 5 s after the start")
    assert span(12.54) == "12.5 s" and span(7200) == "2 h"
