"""``vllm-probe run --live`` with stand-in commands (no vLLM needed): the command's
output goes to command.log, failures show its last lines and pass the exit code on,
Ctrl-C sends SIGINT then SIGTERM, and the run directory is complete afterwards."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

from tests.conftest import ROOT, run_cli
from tests.analysis.test_state import hand_stream

#: A stand-in for a vLLM script: writes the hand-made events where the probe would,
#: prints to stdout and stderr, then exits with the code given as argv[1].
FAKE = textwrap.dedent("""
    import json, os, sys, time
    events = json.loads(sys.argv[2])
    path = os.path.join(os.environ["VLLMPROBE_RUN_DIR"], f"events-{os.getpid()}.jsonl")
    with open(path, "w") as f:
        for ev in events:
            f.write(json.dumps(ev) + "\\n")
    for i in range(30):
        print(f"command line {i}")
    print("something went wrong", file=sys.stderr)
    sys.exit(int(sys.argv[1]))
""")

#: Ignores SIGINT (as a busy engine might), exits 143 on SIGTERM; says what it got.
STUBBORN = textwrap.dedent("""
    import os, signal, sys, time
    def on_int(*_):
        print("got SIGINT", flush=True)
    def on_term(*_):
        print("got SIGTERM", flush=True)
        sys.exit(143)
    signal.signal(signal.SIGINT, on_int)
    signal.signal(signal.SIGTERM, on_term)
    open(os.path.join(os.environ["VLLMPROBE_RUN_DIR"], "ready"), "w").close()
    while True:
        time.sleep(0.05)
""")


def test_failure_shows_log_tail_and_passes_exit_code(tmp_path):
    script = tmp_path / "fake.py"
    script.write_text(FAKE)
    out = tmp_path / "run"
    proc = run_cli("run", "--live", "--out", str(out), "--", sys.executable, str(script), "3",
                   json.dumps(hand_stream()), timeout=60)
    assert proc.returncode == 3
    log = (out / "command.log").read_text()
    assert "command line 0\n" in log and "command line 29\n" in log and "something went wrong" in log
    # the last lines of the log are shown, the early ones are not
    assert "command line 29" in proc.stderr and "something went wrong" in proc.stderr
    assert "command line 5\n" not in proc.stderr
    assert "exited with code 3" in proc.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["exit_code"] == 3 and meta["end_time"] >= meta["start_time"]
    # stdout is not a terminal here: plain lines (8 steps, 1 preemption) instead of the dashboard
    assert len(proc.stdout.splitlines()) == 9
    assert "8 steps, 4 chunks, 1 preemptions, 2/2 requests finished" in proc.stderr


def test_success_returns_zero_and_output_stays_in_the_log(tmp_path):
    script = tmp_path / "fake.py"
    script.write_text(FAKE)
    out = tmp_path / "run"
    proc = run_cli("run", "--live", "--out", str(out), "--", sys.executable, str(script), "0",
                   json.dumps(hand_stream()), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "command line" not in proc.stdout + proc.stderr
    assert (out / "command.log").stat().st_mode & 0o777 == 0o600


def test_missing_command_is_one_line(tmp_path):
    proc = run_cli("run", "--live", "--out", str(tmp_path / "run"), "--", "no-such-command-xyz")
    assert proc.returncode == 127
    assert proc.stderr.strip() == "vllm-probe: error: command not found: no-such-command-xyz"


def test_ctrl_c_sends_sigint_then_sigterm(tmp_path):
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    out = tmp_path / "run"
    code = (f"import sys; from pathlib import Path; from vllm_probe.tui.watch import run_live; "
            f"from vllm_probe.settings import load_settings; "
            f"sys.exit(run_live([sys.executable, {str(script)!r}], load_settings(None), Path({str(out)!r}), "
            f"grace_s=1.0))")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 30
        while not (out / "ready").exists():
            assert time.time() < deadline and proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
        t0 = time.time()
        proc.send_signal(signal.SIGINT)  # what Ctrl-C does to vllm-probe
        _, err = proc.communicate(timeout=30)
        elapsed = time.time() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    log = (out / "command.log").read_text()
    assert log.index("got SIGINT") < log.index("got SIGTERM")
    assert 0.9 <= elapsed < 10  # SIGTERM came after the 1 s grace period
    meta = json.loads((out / "meta.json").read_text())
    assert meta["exit_code"] == 143 and meta["end_time"] is not None

