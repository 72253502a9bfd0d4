"""``vllm-probe tail`` end to end: on the real run of the long-prompt example, and on a
run directory that grows while tail follows it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from tests.conftest import ROOT, run_cli, vllm_probe_cmd
from tests.analysis.test_state import hand_stream

STEP_LINE = re.compile(r"^\+\d+\.\d{3}s step (\d+) \| (\d+)/(\d+) tok ")
PREEMPT_LINE = re.compile(r"^\+\d+\.\d{3}s preempt step (\d+) \| req (\S+) \| discarded (\d+) tok ")


def read_events(run_dir: Path) -> list[dict]:
    events = []
    for path in sorted(run_dir.glob("events-*.jsonl")):
        events += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(events, key=lambda ev: ev["ts"])


def test_plain_lines_match_the_events_of_a_real_run(quick_run):
    events = read_events(quick_run)
    kinds = Counter(ev["event"] for ev in events)
    assert kinds["preempt"] >= 1 and kinds["step"] > 100  # the workload preempts

    proc = run_cli("tail", "--plain", str(quick_run), timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    steps = [STEP_LINE.match(line) for line in lines if STEP_LINE.match(line)]
    preempts = [PREEMPT_LINE.match(line) for line in lines if PREEMPT_LINE.match(line)]
    assert len(steps) == kinds["step"]
    assert len(preempts) == kinds["preempt"]
    assert len(lines) == kinds["step"] + kinds["preempt"]  # nothing else on stdout

    step_events = [ev for ev in events if ev["event"] == "step"]
    assert [int(m.group(1)) for m in steps] == [ev["step"] for ev in step_events]
    assert [(int(m.group(2)), int(m.group(3))) for m in steps] == \
        [(ev["scheduled_tokens"], ev["token_budget"]) for ev in step_events]
    preempt_events = [ev for ev in events if ev["event"] == "preempt"]
    assert [(int(m.group(1)), m.group(2), int(m.group(3))) for m in preempts] == \
        [(ev["step"], ev["req_id"], ev["discarded_tokens"]) for ev in preempt_events]
    # the running total on the last step line counts every preemption of the run
    last_step_line = [line for line in lines if STEP_LINE.match(line)][-1]
    assert last_step_line.endswith(f"(total {kinds['preempt']})")


def test_dashboard_of_a_finished_real_run(quick_run):
    events = read_events(quick_run)
    kinds = Counter(ev["event"] for ev in events)
    discarded = sum(ev["discarded_tokens"] for ev in events if ev["event"] == "preempt")
    env = {**__import__("os").environ, "COLUMNS": "160"}
    proc = run_cli("tail", str(quick_run), timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    flat = re.sub(r"\s+", " ", proc.stdout)
    assert "finished · exit 0" in flat
    assert f"total {kinds['preempt']} " in flat
    assert f"discarded {discarded:,} tok" in flat
    assert f"{kinds['request_finished']} finished" in flat
    assert f"{kinds['step']:,} steps" in flat


def test_replay_prints_the_same_lines(quick_run):
    plain = run_cli("tail", "--plain", str(quick_run), timeout=120)
    replay = run_cli("tail", "--plain", "--replay", "1000", str(quick_run), timeout=300)
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout == plain.stdout


def test_follows_a_growing_run_and_files_that_appear_later(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"command": ["x"], "start_time": 98.0, "end_time": None}))
    stream = hand_stream(0)
    other = hand_stream(1)
    proc = subprocess.Popen(vllm_probe_cmd("tail", "--plain", str(run)), cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        f0 = run / "events-100.jsonl"
        with open(f0, "w") as f:
            for ev in stream[:8]:
                f.write(json.dumps(ev) + "\n")
            f.write(json.dumps(stream[8])[:30])  # the writer is mid-line
            f.flush()
            time.sleep(0.6)
            f.write(json.dumps(stream[8])[30:] + "\n")
            for ev in stream[9:]:
                f.write(json.dumps(ev) + "\n")
        time.sleep(0.4)
        (run / "events-200.jsonl").write_text("".join(json.dumps(ev) + "\n" for ev in other))  # a second engine core
        time.sleep(0.6)
        (run / "meta.json").write_text(json.dumps({"command": ["x"], "start_time": 98.0, "end_time": 101.0,
                                                    "exit_code": 0}))
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    lines = out.splitlines()
    assert sum(1 for line in lines if " step " in line and "preempt" not in line.split("|")[0]) == 16
    assert sum(1 for line in lines if "preempt" in line.split("|")[0]) == 2
    assert any(" step dp1 7 " in line for line in lines)  # the second engine core, labelled
    assert "lines skipped" not in err  # the line written in two parts is not an error


def test_bad_input_never_tracebacks(tmp_path):
    missing = run_cli("tail", str(tmp_path / "nope"))
    assert missing.returncode == 2
    assert missing.stderr.strip() == f"vllm-probe: error: run directory not found: {tmp_path / 'nope'}"

    no_runs = run_cli("tail", cwd=tmp_path)
    assert no_runs.returncode == 2 and "no run directory" in no_runs.stderr and "Traceback" not in no_runs.stderr

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "meta.json").write_text(json.dumps({"command": ["x"], "start_time": 1.0, "end_time": 2.0,
                                                  "exit_code": 1}))
    proc = run_cli("tail", "--plain", str(empty))
    assert proc.returncode == 1 and f"no events in {empty}" in proc.stderr and proc.stdout == ""

    bad = tmp_path / "bad"
    bad.mkdir()
    good = [json.dumps(ev) for ev in hand_stream()]
    body = "\n".join(good[:5] + ["{oops", json.dumps({"event": "new_kind", "ts": 100.15})] + good[5:]) + "\n"
    (bad / "events-1.jsonl").write_text(body + good[-1][:20])  # truncated last line
    proc = run_cli("tail", "--plain", str(bad))  # no meta.json: the files as they are
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 9  # 8 steps + 1 preemption
    assert "1 truncated line(s)" in proc.stderr
    assert "2 lines skipped (1 malformed, 1 unknown kind)" in proc.stderr
    dash = run_cli("tail", str(bad), env={**__import__("os").environ, "COLUMNS": "120"})
    assert dash.returncode == 0 and "Traceback" not in dash.stderr
    assert "3 lines skipped (1 malformed, 1 truncated, 1 unknown kind)" in re.sub(r"\s+", " ", dash.stdout)


def test_plain_into_a_closed_pipe_is_quiet(quick_run):
    proc = subprocess.run(f"{sys.executable} -m vllm_probe tail --plain {quick_run} | head -3", shell=True,
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert len(proc.stdout.splitlines()) == 3
    assert proc.stderr == ""
