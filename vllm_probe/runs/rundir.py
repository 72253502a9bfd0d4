"""Run directories: one per ``vllm-probe run``, holding ``meta.json`` and event files.

Layout::

    vllm-probe-runs/20261129-221500-long_prompts/
        meta.json            command line, settings, start/end time, exit code, engine_started
        events-<pid>.jsonl   one per engine-core process (schema: docs/events.md): its
                             first segment; later ones events-<pid>.<n>.jsonl, closed
                             ones possibly gzipped (.jsonl.gz), the oldest possibly
                             removed (scheduler_probe.max_segment_mb, keep_mb)
        command.log          the command's output (``run --live`` only)

Directories and files are created readable by the owner only (0700 / 0600): event
logs reveal workload shape and request ids.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

#: Default parent of run directories, relative to the current directory.
DEFAULT_ROOT = Path("vllm-probe-runs")
META_FILE = "meta.json"
EVENT_GLOB = "events-*.jsonl"
COMMAND_LOG = "command.log"


class RunDirError(Exception):
    """A run directory is missing, unreadable or cannot be created."""


class NoEventsError(Exception):
    """A run holds no usable event: no event file, or every line skipped."""


def _slug(command: list[str]) -> str:
    words = [Path(w).stem for w in command if not w.startswith("-")]
    # prefer the script or module name over the interpreter
    pick = next((w for w in words[1:] if w not in ("python", "python3", "-m", "vllm")), words[0] if words else "run")
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", pick)[:40] or "run"


def create_run_dir(command: list[str], root: Path | None = None) -> Path:
    """Create a new, empty run directory under ``root`` (mode 0700) and return it.

    Raises:
        RunDirError: ``root`` cannot be created or written.
    """
    root = Path(root or DEFAULT_ROOT)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = f"{stamp}-{_slug(command)}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        for i in range(1, 1000):
            path = root / (base if i == 1 else f"{base}-{i}")
            try:
                path.mkdir(mode=0o700)
                return path
            except FileExistsError:
                continue
    except OSError as e:
        raise RunDirError(f"cannot create a run directory under {root}: {e.strerror or e}") from None
    raise RunDirError(f"too many runs named {base} under {root}")


def write_meta(run_dir: Path, meta: dict[str, Any]) -> None:
    """Write ``meta.json`` atomically (0600)."""
    tmp = Path(run_dir) / (META_FILE + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(meta, f, indent=2)
    os.replace(tmp, Path(run_dir) / META_FILE)


def read_meta(run_dir: Path) -> dict[str, Any]:
    """``meta.json`` of a run, or ``{}`` when absent, unreadable or not a JSON object.
    Fields the views compute with are left out when of the wrong type: ``command`` (a
    list of strings), ``start_time`` / ``end_time`` (finite numbers), ``exit_code`` (int)."""
    try:
        meta = json.loads((Path(run_dir) / META_FILE).read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(meta, dict):
        return {}
    command = meta.get("command")
    if command is not None and not (isinstance(command, list) and all(isinstance(c, str) for c in command)):
        del meta["command"]
    for key in ("start_time", "end_time"):
        value = meta.get(key)
        if value is not None and not (type(value) in (int, float) and math.isfinite(value)):
            del meta[key]
    if meta.get("exit_code") is not None and type(meta["exit_code"]) is not int:
        del meta["exit_code"]
    return meta


#: An event file's name: its stream (``events-<pid>``), segment number (absent: 1) and
#: whether it is gzipped. ``.gz.tmp`` files (a compression in progress) do not match.
SEGMENT_NAME = re.compile(r"^(?P<stream>events-.+?)(?:\.(?P<n>[0-9]+))?\.jsonl(?P<gz>\.gz)?$")


@dataclass(frozen=True)
class Segment:
    """One file of an engine core's events: segment ``n`` (1-based) at ``path``."""

    n: int
    path: Path

    @property
    def gz(self) -> bool:
        """Whether the file is gzipped (a closed segment the probe compressed)."""
        return self.path.name.endswith(".gz")


@dataclass(frozen=True)
class EventStream:
    """One engine core's events: its segments present on disk, in order.

    ``name`` is the first segment's name without ``.jsonl`` (``events-<pid>``). When
    retention removed the oldest segments, ``segments[0].n`` > 1 and :attr:`removed`
    says how many went (segments 1 to ``removed``).
    """

    name: str
    segments: tuple[Segment, ...]

    @property
    def removed(self) -> int:
        """Segments removed from the start of the stream (0: it starts at segment 1)."""
        return self.segments[0].n - 1 if self.segments else 0

    @property
    def paths(self) -> list[Path]:
        return [seg.path for seg in self.segments]


def segment_of(path: Path) -> int | None:
    """The segment number of an event file's name (1 for ``events-<pid>.jsonl``); None for
    a name that is not an event file's."""
    m = SEGMENT_NAME.match(Path(path).name)
    if m is None:
        return None
    return int(m["n"]) if m["n"] else 1


def event_streams(run_dir: Path) -> list[EventStream]:
    """The run's event streams (one per engine core), sorted by name, each with its
    segments in order.

    A segment present both as ``.jsonl`` and ``.jsonl.gz`` (the probe was stopped between
    compressing it and removing the original; both are whole) is read once, from the
    ``.jsonl``; a ``.gz.tmp`` is ignored. Never raises (an unreadable directory: []).
    """
    found: dict[str, dict[int, Path]] = {}
    try:
        names = os.listdir(run_dir)
    except OSError:
        return []
    for name in names:
        m = SEGMENT_NAME.match(name)
        if m is None:
            continue
        n = int(m["n"]) if m["n"] else 1
        if n < 1:
            continue
        segs = found.setdefault(m["stream"], {})
        if n in segs and not m["gz"]:
            segs[n] = Path(run_dir) / name  # the plain file wins over its .gz twin
        else:
            segs.setdefault(n, Path(run_dir) / name)
    return [EventStream(stream, tuple(Segment(n, segs[n]) for n in sorted(segs)))
            for stream, segs in sorted(found.items())]


def event_files(run_dir: Path) -> list[Path]:
    """The run's event files: each engine core's segments in order, engine cores sorted by
    name (:func:`event_streams`)."""
    return [seg.path for stream in event_streams(run_dir) for seg in stream.segments]


def engine_started(run_dir: Path) -> bool:
    """Whether any engine core of the run wrote events (a non-empty event file): False
    when the command ended before vLLM built a scheduler (a script error, vLLM failing at
    start-up). ``finish_run`` records it in ``meta.json`` as ``engine_started``."""
    for path in event_files(run_dir):
        try:
            if path.stat().st_size > 0:
                return True
        except OSError:
            continue
    return False


def never_started(run_dir: Path, meta: dict[str, Any] | None = None) -> bool:
    """A finished run whose command never started an engine: ``meta.json`` says
    ``engine_started: false``, or (runs recorded before that key) it has an end time and
    no event file."""
    meta = read_meta(run_dir) if meta is None else meta
    if "engine_started" in meta:
        return meta["engine_started"] is False
    return meta.get("end_time") is not None and not event_files(run_dir)


def never_started_note(meta: dict[str, Any]) -> str:
    """``": the command (exit 1) ended before vLLM's engine core started"`` for a run whose
    ``meta.json`` says so (``engine_started`` false), else ``""``."""
    if meta.get("engine_started") is False:
        code = meta.get("exit_code")
        return f": the command{f' (exit {code})' if code is not None else ''} ended before vLLM's engine core started"
    return ""


def find_latest_run(root: Path | None = None) -> tuple[Path, list[Path]]:
    """The newest run directory under ``root`` that started an engine (directly in it, or
    one level down as ``examples/compare_budgets.py`` nests its runs, by ``meta.json``'s
    start time), and the newer runs skipped because their command never started one
    (:func:`never_started`). When no run started an engine, the newest run and no skip.
    Simulated runs (``vllm-probe whatif``'s, ``meta.json`` ``simulated``) are not
    candidates: "the latest run" is the latest one recorded.

    Raises:
        RunDirError: ``root`` does not exist or holds no run.
    """
    root = Path(root or DEFAULT_ROOT)
    if not root.is_dir():
        raise RunDirError(f"no run directory: {root} does not exist (start one with `vllm-probe run -- COMMAND`)")
    metas = {m.parent: read_meta(m.parent) for pattern in (f"*/{META_FILE}", f"*/*/{META_FILE}")
             for m in root.glob(pattern)}
    runs = [run for run, meta in metas.items() if not meta.get("simulated")]
    if not runs:
        raise RunDirError(f"no run directory under {root} (start one with `vllm-probe run -- COMMAND`)")

    def started(run: Path) -> tuple[float, str]:
        start = metas[run].get("start_time")
        if start is None:
            try:
                start = (run / META_FILE).stat().st_mtime
            except OSError:
                start = 0.0
        return start, str(run)

    newest_first = sorted(runs, key=started, reverse=True)
    for i, run in enumerate(newest_first):
        if not never_started(run, metas[run]):
            return run, newest_first[:i]
    return newest_first[0], []


def latest_run(root: Path | None = None) -> Path:
    """The run :func:`find_latest_run` picks.

    Raises:
        RunDirError: ``root`` does not exist or holds no run.
    """
    return find_latest_run(root)[0]


def resolve_run_dir(arg: str | None, note: Callable[[str], None] | None = None) -> Path:
    """A RUN_DIR argument (None: the latest run, :func:`find_latest_run`) checked to exist;
    ``~`` is expanded. ``note`` is told, in one line, of newer runs skipped because their
    command never started an engine.

    Raises:
        RunDirError: the directory does not exist.
    """
    if arg is None:
        run, skipped = find_latest_run()
        if skipped and note is not None:
            newest = skipped[0]
            code = read_meta(newest).get("exit_code")
            more = f" and {len(skipped) - 1} more" if len(skipped) > 1 else ""
            note(f"showing {run}: the newer {newest}{more} never started an engine"
                 + (f" (exit {code})" if code is not None else ""))
        return run
    path = Path(arg).expanduser()
    if not path.is_dir():
        raise RunDirError(f"run directory not found: {path}")
    return path


# -- outputs written whole ------------------------------------------------------------------
# Every command that writes a directory or a file (whatif, tune, calibrate, export) writes
# it under a temporary name beside its final one and renames it when complete, so an
# interrupted command (Ctrl-C, a kill, a full disk) never leaves something that looks
# whole: either the previous output, or nothing, plus at most a temporary that the next
# run of the command recognises by its name and removes.

#: Marks a temporary output: ``.<name>.partial-<pid>`` beside ``<name>``.
PARTIAL_MARK = ".partial-"


def partial_name(path: Path, pid: int | None = None) -> Path:
    """The temporary sibling an output ``path`` is written under: ``.<name>.partial-<pid>``."""
    path = Path(path)
    return path.with_name(f".{path.name}{PARTIAL_MARK}{os.getpid() if pid is None else pid}")


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, someone else's
        return True
    return True


def remove_partials(path: Path) -> list[Path]:
    """Remove the temporaries interrupted writes of ``path`` left (``.<name>.partial-<pid>``
    whose process is gone); returns what was removed. Never raises."""
    import shutil

    path = Path(path)
    removed: list[Path] = []
    try:
        siblings = list(path.parent.glob(f".{glob_escape(path.name)}{PARTIAL_MARK}*"))
    except OSError:
        return removed
    for p in siblings:
        tail = p.name.rsplit(PARTIAL_MARK, 1)[-1]
        if not tail.isdigit() or _pid_alive(int(tail)):
            continue
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
            removed.append(p)
        except OSError:
            continue
    return removed


def glob_escape(name: str) -> str:
    """``name`` with glob's special characters escaped."""
    import glob

    return glob.escape(name)


@contextmanager
def atomic_dir(path: Path, mode: int = 0o700) -> Iterator[Path]:
    """Write the directory ``path`` whole: yields a new, empty temporary directory
    (``.<name>.partial-<pid>``, created ``mode``) to fill; when the block ends normally
    it is renamed to ``path``, replacing what was there (a previous output is moved aside
    and removed after the rename). When the block raises (``KeyboardInterrupt``
    included), the temporary is removed and ``path`` is left as it was. Temporaries of
    earlier interrupted writes of ``path`` are removed first (:func:`remove_partials`).
    The parent is created (0700) if missing.

    Raises:
        OSError: the temporary cannot be created or renamed (it is removed).
    """
    import shutil

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    remove_partials(path)
    tmp = partial_name(path)
    if tmp.exists():
        shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=mode)
    try:
        yield tmp
        old = None
        if path.exists() or path.is_symlink():
            old = partial_name(path.with_name(path.name + ".old"))
            os.rename(path, old)
        try:
            os.rename(tmp, path)
        except OSError:
            if old is not None:
                os.rename(old, path)  # put the previous output back
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextmanager
def atomic_file(path: Path, mode: int = 0o600, binary: bool = True) -> Iterator[Any]:
    """Write the file ``path`` whole: yields a file object (binary unless ``binary`` is
    False) on a temporary sibling (``.<name>.partial-<pid>``, created ``mode``); when the
    block ends normally it is flushed, fsynced and renamed over ``path``. When the block
    raises, the temporary is removed and ``path`` is left as it was. Temporaries of
    earlier interrupted writes are removed first.

    Raises:
        OSError: the temporary cannot be created, written or renamed (it is removed).
    """
    path = Path(path)
    remove_partials(path)
    tmp = partial_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
