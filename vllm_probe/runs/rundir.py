"""Run directories: one per ``vllm-probe run``, holding ``meta.json`` and event files.

Layout::

    vllm-probe-runs/20261129-221500-long_prompts/
        meta.json            command line, settings, start/end time, exit code
        events-<pid>.jsonl   one per engine-core process (schema: docs/events.md)
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
from pathlib import Path
from typing import Any

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


def event_files(run_dir: Path) -> list[Path]:
    """The run's event files, sorted by name."""
    return sorted(Path(run_dir).glob(EVENT_GLOB))


def latest_run(root: Path | None = None) -> Path:
    """The newest run directory under ``root``: directly in it, or one level down (as
    ``examples/compare_budgets.py`` nests its runs), by ``meta.json``'s start time.
    Simulated runs (``vllm-probe whatif``'s, ``meta.json`` ``simulated``) are not
    candidates: "the latest run" is the latest one recorded.

    Raises:
        RunDirError: ``root`` does not exist or holds no run.
    """
    root = Path(root or DEFAULT_ROOT)
    if not root.is_dir():
        raise RunDirError(f"no run directory: {root} does not exist (start one with `vllm-probe run -- COMMAND`)")
    runs = [m.parent for pattern in (f"*/{META_FILE}", f"*/*/{META_FILE}") for m in root.glob(pattern)
            if not read_meta(m.parent).get("simulated")]
    if not runs:
        raise RunDirError(f"no run directory under {root} (start one with `vllm-probe run -- COMMAND`)")

    def started(run: Path) -> tuple[float, str]:
        start = read_meta(run).get("start_time")
        if start is None:
            try:
                start = (run / META_FILE).stat().st_mtime
            except OSError:
                start = 0.0
        return start, str(run)

    return max(runs, key=started)


def resolve_run_dir(arg: str | None) -> Path:
    """A RUN_DIR argument (None: the latest run) checked to exist.

    Raises:
        RunDirError: the directory does not exist.
    """
    if arg is None:
        return latest_run()
    path = Path(arg)
    if not path.is_dir():
        raise RunDirError(f"run directory not found: {path}")
    return path
