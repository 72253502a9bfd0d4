"""Guarantee 6 at the command line: ``vllm-probe run`` passes stop signals on, once.

SIGTERM or SIGINT sent to ``vllm-probe`` (e.g. by a supervisor) reaches the command;
a Ctrl-C typed in the terminal reaches the command directly (same process group) and
is not delivered a second time. The command here counts the signals it receives.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, vllm_probe_cmd

COUNTER = """
import signal, sys, time
got = []
for s in (signal.SIGINT, signal.SIGTERM):
    signal.signal(s, lambda n, f: got.append(signal.Signals(n).name))
print("ready", flush=True)
deadline = time.time() + 30
while not got and time.time() < deadline:
    time.sleep(0.01)
time.sleep(0.5)  # a second copy would have arrived by now
print("got", ",".join(got), flush=True)
sys.exit(3)
"""


def _start(tmp_path, **popen):
    return subprocess.Popen(vllm_probe_cmd("run", "--out", str(tmp_path / "run"), "--", sys.executable, "-c", COUNTER),
                            cwd=ROOT, **popen)


def _wait_ready(read_line) -> None:
    deadline = time.time() + 30
    while time.time() < deadline:
        if b"ready" in read_line():
            return
    raise AssertionError("the command did not start")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_to_vllm_probe_reaches_the_command_once(sig, tmp_path):
    # its own session: the command can only get the signal through vllm-probe
    proc = _start(tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _wait_ready(proc.stdout.readline)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert out.decode().split() == ["got", sig.name], err.decode()[-2000:]
    assert proc.returncode == 3  # the command's own exit code


def test_ctrl_c_in_a_terminal_reaches_the_command_once(tmp_path):
    import fcntl
    import termios

    master, slave = os.openpty()

    def controlling_tty():  # a new session whose terminal is the pty, as in a shell
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = _start(tmp_path, stdin=slave, stdout=slave, stderr=slave, preexec_fn=controlling_tty)
    os.close(slave)
    output = b""

    def read_line():
        nonlocal output
        chunk = os.read(master, 4096)
        output += chunk
        return chunk

    try:
        _wait_ready(read_line)
        os.write(master, b"\x03")  # Ctrl-C: the terminal signals its foreground group
        proc.wait(timeout=30)
        try:
            while True:
                read_line()
        except OSError:  # EIO once every process holding the pty is gone
            pass
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)
    assert b"got SIGINT\r\n" in output, output.decode(errors="replace")
    assert proc.returncode == 3
