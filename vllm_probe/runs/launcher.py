"""Start a command with the probe enabled, supervise it, and record the run.

The one process supervisor behind ``vllm-probe run`` and ``run --live``. The probe itself
runs inside vLLM's processes (the plugin); this module prepares the run directory and
the environment that turns the plugin on, starts the command (in the terminal's
foreground, or in its own session with its output in ``command.log``), passes signals
on or stops it step by step (:class:`Stopper`), and records how the command ended in
``meta.json``. No view code: ``run --live`` draws with :mod:`vllm_probe.tui.watch`.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from collections.abc import Callable, Iterator

import msgspec

from .. import __version__, envvars
from .hints import spawn_hint
from .reader import ReadStats, iter_stream
from ..settings import Settings
from .rundir import (
    COMMAND_LOG, META_FILE, RunDirError, create_run_dir, engine_started, event_streams, read_meta, write_meta,
)

#: Seconds between SIGINT and SIGTERM (and between SIGTERM and SIGKILL) when a
#: supervised command is stopped (Ctrl-C under ``run --live``).
GRACE_S = 10.0
#: Lines of ``command.log`` shown when the command fails.
LOG_TAIL_LINES = 20

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]|\x1b\[[0-9;?]*[A-Za-z]")


class LaunchError(Exception):
    """The command cannot be started; ``code`` follows shell conventions (126/127)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def resolve_command(command: list[str]) -> str:
    """Absolute path of ``command[0]``.

    Raises:
        LaunchError: empty command (2), not found (127), not executable (126).
    """
    if not command:
        raise LaunchError("no command given (usage: vllm-probe run -- COMMAND [ARGS...])", 2)
    exe = command[0]
    if os.sep in exe:
        path = Path(exe)
        if not path.exists():
            raise LaunchError(f"command not found: {exe}", 127)
        if path.is_dir() or not os.access(path, os.X_OK):
            raise LaunchError(f"command is not executable: {exe}", 126)
        found = str(path)
    else:
        which = shutil.which(exe)
        if which is None:
            raise LaunchError(f"command not found: {exe}", 127)
        found = which
    _check_runnable(exe, found)
    return found


def _check_runnable(exe: str, path: str) -> None:
    """Refuse files the kernel cannot start (no ``#!`` line, missing interpreter) now,
    before a run directory exists. :func:`spawn` still turns the rare rest into a
    :class:`LaunchError`."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:  # e.g. execute-only: the kernel may still run it
        return
    if head.startswith(b"#!"):
        words = head[2:].split(b"\n", 1)[0].split()
        interpreter = os.fsdecode(words[0]) if words else ""
        if not interpreter or not os.access(interpreter, os.X_OK) or os.path.isdir(interpreter):
            raise LaunchError(f"bad interpreter {interpreter!r} in the #! line of {exe}", 126)
    elif b"\0" not in head and not head.startswith(b"\x7fELF"):  # text without #!: ENOEXEC
        raise LaunchError(f"command is a text file without a #! line: {exe}", 126)


def probe_env(run_dir: Path, settings: Settings, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that enables the plugin for ``run_dir``.

    If ``VLLM_PLUGINS`` is set (vLLM then loads only the plugins it names), ours is
    added to it; unset, vLLM loads every installed plugin, ours included.
    """
    env = dict(os.environ if base is None else base)
    env[envvars.ENABLE] = "1"
    env[envvars.RUN_DIR] = str(Path(run_dir).resolve())
    if settings.source:
        env[envvars.SETTINGS] = str(Path(settings.source).resolve())
    else:
        env.pop(envvars.SETTINGS, None)
    plugins = env.get(envvars.VLLM_PLUGINS)
    if plugins is not None:
        names = [p.strip() for p in plugins.split(",") if p.strip()]
        if envvars.PLUGIN_NAME not in names:
            names.append(envvars.PLUGIN_NAME)
        env[envvars.VLLM_PLUGINS] = ",".join(names)
    return env


@dataclass
class RunCounts:
    """What a finished run's files hold, for the closing line."""

    kinds: Counter = field(default_factory=Counter)
    stats: ReadStats = field(default_factory=ReadStats)
    dropped: int = 0
    files: int = 0

    def describe(self) -> str:
        k = self.kinds
        text = (f"{k['step']} steps, {k['chunk']} chunks, {k['preempt']} preemptions, "
                f"{k['request_finished']}/{k['request_added']} requests finished, "
                f"{self.files} engine file(s)")
        if self.dropped:
            text += f", {self.dropped} events dropped"
        if self.stats.skipped:
            text += f", {self.stats.skipped} lines skipped"
        return text


def count_events(run_dir: Path) -> RunCounts:
    """Count event kinds in a run directory (streaming)."""
    counts = RunCounts()
    for stream in event_streams(run_dir):  # one per engine core, its segments as one
        counts.files += 1
        dropped = 0
        for ev in iter_stream(stream, counts.stats):
            counts.kinds[ev.kind] += 1
            if ev.kind == "probe_stats":  # cumulative: the file's last one counts
                dropped = ev.events_dropped or 0
        counts.dropped += dropped
    return counts


def exit_code(returncode: int) -> int:
    """A process's exit status as a shell reports it: 128+N when killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def start_run(command: list[str], settings: Settings, out: Path | None = None) -> tuple[Path, dict[str, Any]]:
    """Check the command, create the run directory and its ``meta.json``.

    Raises:
        LaunchError: the command is missing or not executable.
        RunDirError: the run directory cannot be created.
    """
    resolve_command(command)
    if out is not None:
        out = Path(out)
        try:
            out.mkdir(mode=0o700, parents=True, exist_ok=True)
            if any(out.iterdir()):
                raise LaunchError(f"--out {out} is not empty; give a new directory", 2)
            probe_file = out / ".write-test"
            probe_file.touch()
            probe_file.unlink()
        except OSError as e:
            raise LaunchError(f"cannot write to --out {out}: {e.strerror or e}", 2) from None
        run_dir = out
    else:
        run_dir = create_run_dir(command)
    meta = {
        "probe_version": __version__,
        "command": command,
        "cwd": os.getcwd(),
        # the server's name: keys a fleet's runs (export --format parquet's host column)
        "host": socket.gethostname(),
        "settings_file": settings.source,
        "flags": settings.flags.to_dict(),
        # what the settings file says the engine should run with (summary, doctor compare it)
        "expected": msgspec.to_builtins(settings.expected) if settings.expected is not None else None,
        "start_time": time.time(),
        "end_time": None,
        "exit_code": None,
    }
    try:
        write_meta(run_dir, meta)
    except OSError as e:
        raise RunDirError(f"cannot write {run_dir / META_FILE}: {e.strerror or e}") from None
    return run_dir, meta


def finish_run(run_dir: Path, meta: dict[str, Any], exit_code: int) -> None:
    """Record how the command ended in ``meta.json``: end time, exit code, and
    ``engine_started`` (:func:`~vllm_probe.runs.rundir.engine_started`: false when the
    command ended before any engine core wrote events; "latest run" then skips it).
    Never raises: the command has already run, and its exit code matters more than the
    metadata (one warning line)."""
    meta = {**read_meta(run_dir), **meta, "end_time": time.time(), "exit_code": exit_code,
            "engine_started": engine_started(run_dir)}
    try:
        write_meta(run_dir, meta)
    except OSError as e:
        print(f"vllm-probe: warning: cannot update {Path(run_dir) / META_FILE}: {e.strerror or e}",
              file=sys.stderr, flush=True)


def print_failure_hint(run_dir: Path, command: list[str], code: int, log_path: Path | None = None) -> None:
    """After a command that failed before any engine core wrote events, print one hint
    line when the cause is known (:func:`vllm_probe.runs.hints.spawn_hint`; ``log_path``:
    the command's output, when it was kept)."""
    if code == 0 or engine_started(run_dir):
        return
    lines = read_log_tail(log_path, 400, 1 << 20) if log_path is not None else None
    hint = spawn_hint(command, lines)
    if hint:
        print(f"vllm-probe: hint: {hint}", file=sys.stderr, flush=True)


def spawn(command: list[str], run_dir: Path, settings: Settings,
          stdout: IO | None = None, stderr: IO | int | None = None) -> subprocess.Popen:
    """Start the command with the probe's environment (its own session when logged).

    Raises:
        LaunchError: the kernel refused to start it (recorded in ``meta.json``).
    """
    try:
        return subprocess.Popen(
            command, env=probe_env(run_dir, settings), stdout=stdout, stderr=stderr,
            stdin=subprocess.DEVNULL if stdout is not None else None,
            start_new_session=stdout is not None,
        )
    except OSError as e:
        code = 127 if isinstance(e, FileNotFoundError) else 126
        finish_run(run_dir, {"error": f"cannot start: {e.strerror or e}"}, code)
        raise LaunchError(f"cannot start {command[0]}: {e.strerror or e}", code) from None


def _wait_passing_signals(proc: subprocess.Popen) -> int:
    """Wait for ``proc``, passing on SIGTERM and SIGINT sent to this process.

    A Ctrl-C typed in the terminal reaches the command directly (same process group);
    the kernel sends that SIGINT (``si_pid`` 0), so it is not passed on a second time.
    """
    stop = {signal.SIGINT, signal.SIGTERM}
    watched = stop | {signal.SIGCHLD}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    try:
        while proc.poll() is None:
            info = signal.sigtimedwait(watched, 0.5)
            if info is None or info.si_signo not in stop:
                continue
            if info.si_signo == signal.SIGINT and info.si_pid == 0:
                continue
            try:
                proc.send_signal(info.si_signo)
            except ProcessLookupError:
                pass
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    return proc.returncode


def run_foreground(command: list[str], settings: Settings, out: Path | None = None,
                   on_start: Callable[[Path], None] | None = None) -> int:
    """``vllm-probe run`` without ``--live``: the command keeps the terminal.

    Ctrl-C reaches the command directly (same process group); SIGTERM, and SIGINT sent
    to us by another process (``kill -INT``), are passed on. ``on_start(run_dir)`` is
    called once the run directory exists, before the command starts (``run
    --metrics-port`` starts following it there). Returns the command's exit code
    (128+N when killed by signal N).
    """
    run_dir, meta = start_run(command, settings, out)
    print(f"vllm-probe: events -> {run_dir}", file=sys.stderr, flush=True)
    if on_start is not None:
        on_start(run_dir)
    proc = spawn(command, run_dir, settings)

    def forward(signum: int, _frame: Any) -> None:
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    # Handlers for signals arriving before or after _wait_passing_signals blocks them.
    old_int = signal.signal(signal.SIGINT, lambda *_: None)  # the child gets Ctrl-C itself
    old_term = signal.signal(signal.SIGTERM, forward)
    try:
        code = exit_code(_wait_passing_signals(proc))
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
    finish_run(run_dir, meta, code)
    counts = count_events(run_dir)
    print(f"vllm-probe: {counts.describe()} in {run_dir}", file=sys.stderr, flush=True)
    print_failure_hint(run_dir, command, code)
    return code


class Stopper:
    """Stops the command on request: SIGINT, then SIGTERM after a grace period, then SIGKILL.

    Signals go to the command's process group (it runs in its own session, as a
    terminal's Ctrl-C would reach every process of the foreground job).
    """

    def __init__(self, proc: subprocess.Popen, grace_s: float) -> None:
        self.proc = proc
        self.grace_s = grace_s
        self.sent: list[str] = []
        self.deadline: float | None = None
        self.requested_by: str | None = None

    def _send(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass
        self.sent.append(signal.Signals(sig).name)
        self.deadline = time.monotonic() + self.grace_s

    def request(self, signum: int) -> None:
        """Ctrl-C (SIGINT) or SIGTERM received: start or escalate the stop."""
        if self.proc.poll() is not None:
            return
        self.requested_by = self.requested_by or signal.Signals(signum).name
        if not self.sent:
            self._send(signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)
        else:
            self._escalate()

    def _escalate(self) -> None:
        if "SIGTERM" not in self.sent:
            self._send(signal.SIGTERM)
        elif "SIGKILL" not in self.sent:
            self._send(signal.SIGKILL)

    def tick(self) -> None:
        """Escalate when the grace period is over."""
        if self.deadline is not None and time.monotonic() > self.deadline and self.proc.poll() is None:
            self._escalate()

    def status(self) -> tuple[str, str]:
        if not self.sent:
            return f"● running (pid {self.proc.pid})", "bold green"
        left = max((self.deadline or 0) - time.monotonic(), 0.0)
        nxt = "SIGTERM" if "SIGTERM" not in self.sent else ("SIGKILL" if "SIGKILL" not in self.sent else None)
        text = f"■ stopping: {', '.join(self.sent)} sent"
        if nxt:
            text += f"; {nxt} in {left:.0f} s (Ctrl-C again: now)"
        return text, "bold yellow"


class SupervisedRun:
    """A command started with the probe in its own session, its stdout and stderr in
    ``command.log`` of a new run directory, stopped step by step on request
    (:class:`Stopper`). Behind ``vllm-probe run --live``.

    Raises (from the constructor):
        LaunchError, RunDirError: as :func:`start_run` and :func:`spawn`.
    """

    def __init__(self, command: list[str], settings: Settings, out: Path | None = None,
                 grace_s: float = GRACE_S, on_start: Callable[[Path], None] | None = None) -> None:
        self.run_dir, self.meta = start_run(command, settings, out)
        if on_start is not None:  # as run_foreground's
            on_start(self.run_dir)
        self.log_path = self.run_dir / COMMAND_LOG
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "ab", buffering=0) as log:
            self.proc = spawn(command, self.run_dir, settings, stdout=log, stderr=subprocess.STDOUT)
        self.stopper = Stopper(self.proc, grace_s)
        self.started = time.time()

    @property
    def exit_code(self) -> int | None:
        """The command's exit code once it ended (128+N when killed by signal N), else None."""
        code = self.proc.poll()
        return None if code is None else exit_code(code)

    @contextmanager
    def stop_on_signals(self) -> Iterator[None]:
        """While inside: SIGINT and SIGTERM sent to us stop the command step by step."""
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        for sig in handlers:
            signal.signal(sig, lambda signum, _frame: self.stopper.request(signum))
        try:
            yield
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)

    def wait(self, poll_s: float = 0.1) -> int:
        """Wait for the command (escalating a stop in progress), record its end in
        ``meta.json``; returns its exit code."""
        while self.proc.poll() is None:
            self.stopper.tick()
            time.sleep(poll_s)
        code = exit_code(self.proc.returncode)
        finish_run(self.run_dir, self.meta, code)
        return code


def read_log_tail(path: Path, lines: int = LOG_TAIL_LINES, max_bytes: int = 32768) -> list[str]:
    """The last ``lines`` non-empty lines of a log file, control characters removed.

    A progress bar redrawn with carriage returns keeps only its latest state.
    """
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(size - max_bytes, 0))
            data = f.read()
    except OSError:
        return []
    out = []
    for raw in data.decode("utf-8", "replace").split("\n"):
        line = _CONTROL.sub("", raw.rsplit("\r", 1)[-1] if "\r" in raw.rstrip("\r") else raw.rstrip("\r")).rstrip()
        if line:
            out.append(line)
    return out[-lines:]
