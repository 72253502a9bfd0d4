"""Reading event files: validated records, time-ordered merging, live following.

Shared by every consumer (state, summary, dashboard, exporters). Each line is decoded
into the record of its kind (:mod:`vllm_probe.schema.records`), which checks every
field's JSON type against the schema, so no consumer ever does arithmetic on a string;
past this module there are only records. Bad input never raises: a line that is not a
JSON object (JSON as msgspec reads it: strict, so ``NaN`` and out-of-range numbers are
not), has a field of the wrong type, is of an unknown kind, or is a partial last line
(the writer was mid-line) is skipped and counted in :class:`ReadStats`; a newer
``schema`` is read and counted.
"""

from __future__ import annotations

import heapq
import io
import os
from operator import attrgetter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import msgspec

from ..schema import records
from ..schema.events import KINDS, SCHEMA_VERSION
from .rundir import event_files

_decode_any = msgspec.json.Decoder().decode


@dataclass
class ReadStats:
    """Counts of what was read and skipped (lines)."""

    events: int = 0
    malformed: int = 0  # not a JSON object, no string "event" / numeric "ts", or a field of the wrong type
    partial: int = 0  # last line without newline: the writer was mid-line
    unknown_kind: int = 0
    newer_schema: int = 0  # read anyway; fields we know keep their meaning per policy
    files: set[str] = field(default_factory=set)

    @property
    def skipped(self) -> int:
        return self.malformed + self.partial + self.unknown_kind

    def describe(self) -> str:
        """One line for users, e.g. ``"1200 events, 2 lines skipped (1 malformed, 1 partial)"``."""
        parts = [f"{n} {what}" for n, what in (
            (self.malformed, "malformed"), (self.partial, "partial"), (self.unknown_kind, "unknown kind"),
        ) if n]
        text = f"{self.events} events"
        if parts:
            text += f", {self.skipped} lines skipped ({', '.join(parts)})"
        if self.newer_schema:
            text += f", {self.newer_schema} with a newer schema than {SCHEMA_VERSION}"
        return text


def parse_line(line: str | bytes, stats: ReadStats) -> Any | None:
    """Decode one complete line into its record (:mod:`vllm_probe.schema.records`); None
    when it is skipped (counted in ``stats``).

    This is the slow path that says why a line does not decode as a record; ``engine``
    absent or null reads as 0. A line the typed decoder reads is read as the fast path
    reads it (msgspec skips unknown keys unchecked, invalid UTF-8 in them included; found
    by tests/runs/test_fuzz_readers.py), so both paths classify every line alike.
    """
    try:
        rec = records.decode(line)
    except (ValueError, RecursionError):
        pass
    else:
        if rec.schema is not None and rec.schema > SCHEMA_VERSION:
            stats.newer_schema += 1
        stats.events += 1
        return rec
    try:
        ev = _decode_any(line)
    except (ValueError, RecursionError):  # not JSON; or nested deeper than msgspec recurses
        stats.malformed += 1
        return None
    if type(ev) is not dict or type(ev.get("event")) is not str or type(ev.get("ts")) not in (int, float):
        stats.malformed += 1
        return None
    if ev["event"] not in KINDS:
        stats.unknown_kind += 1
        return None
    if ev.get("engine") is None:
        ev["engine"] = 0
    rec = records.from_dict(ev)
    if rec is None:
        stats.malformed += 1
        return None
    if rec.schema is not None and rec.schema > SCHEMA_VERSION:
        stats.newer_schema += 1
    stats.events += 1
    return rec


def _read(path: Path, stats: ReadStats, with_lines: bool) -> Iterator:
    """The records of one file's event lines in file order (see :func:`_decode_lines`)."""
    stats.files.add(str(path))
    try:
        f = open(path, "rb")
    except OSError:
        return
    with f:
        yield from _decode_lines(f, stats, with_lines)


def _decode_lines(lines: Iterable[bytes], stats: ReadStats, with_lines: bool) -> Iterator:
    """The records of newline-terminated lines; ``(record, raw line)`` pairs
    ``with_lines``. A last line without its newline is partial: counted, not read.
    One loop for every reader: it is summary's hot path."""
    decode, latest = records.decode, SCHEMA_VERSION
    for raw in lines:
        if not raw.endswith(b"\n"):
            if raw.strip():
                stats.partial += 1
            break
        try:
            ev = decode(raw)
        except (ValueError, RecursionError):  # classify it (or take a null engine as 0)
            if not raw.strip():
                continue
            ev = parse_line(raw, stats)
            if ev is None:
                continue
        else:
            schema = ev.schema
            if schema is not None and schema > latest:
                stats.newer_schema += 1
            stats.events += 1
        yield (ev, raw) if with_lines else ev


def iter_file(path: Path, stats: ReadStats) -> Iterator:
    """Stream the records of one file in file order."""
    return _read(path, stats, False)


#: Sort key of records by time (``ts``, epoch s).
record_ts = attrgetter("ts")


def iter_run(run_dir: Path, stats: ReadStats) -> Iterator:
    """Stream every record of a run, merged across files in time order.

    Memory: one pending event per file (``heapq.merge``). Files of different engine
    cores interleave by ``ts``; within a file, order is the file's (the writer's).
    """
    streams = [iter_file(p, stats) for p in event_files(run_dir)]
    if len(streams) == 1:
        return streams[0]
    return heapq.merge(*streams, key=record_ts)


def iter_file_lines(path: Path, stats: ReadStats) -> Iterator[tuple[Any, bytes]]:
    """Like :func:`iter_file`, yielding ``(record, raw line)`` pairs for
    verbatim export; lines are classified (and counted in ``stats``) the same way."""
    return _read(path, stats, True)


def iter_run_lines(run_dir: Path, stats: ReadStats) -> Iterator[tuple[Any, bytes]]:
    """Like :func:`iter_run`, yielding ``(record, raw line)`` pairs merged by ``ts``."""
    streams = [iter_file_lines(p, stats) for p in event_files(run_dir)]
    if len(streams) == 1:
        return streams[0]
    return heapq.merge(*streams, key=_pair_ts)


def _pair_ts(pair: tuple[Any, bytes]) -> float:
    return pair[0].ts


class Follower:
    """Follow a run directory live: new lines of every file, files that appear later.

    :meth:`poll` returns the events completed since the last call (file by file; each
    file in order). A line still being written is kept until its newline arrives.
    """

    def __init__(self, run_dir: Path, stats: ReadStats | None = None, chunk_bytes: int = 1 << 20) -> None:
        self.run_dir = Path(run_dir)
        self.stats = stats or ReadStats()
        self._offsets: dict[Path, int] = {}
        self._rest: dict[Path, bytes] = {}
        self._chunk = chunk_bytes

    def poll(self, max_bytes: int | None = None) -> list:
        """The records completed since the last call (at most ``max_bytes`` read per file
        per call when given)."""
        out: list = []
        for path in event_files(self.run_dir):
            self.stats.files.add(str(path))
            offset = self._offsets.get(path, 0)
            try:
                size = os.path.getsize(path)
            except OSError:
                continue
            if size <= offset:
                continue
            want = size - offset if max_bytes is None else min(size - offset, max_bytes)
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read(want)
            except OSError:
                continue
            self._offsets[path] = offset + len(data)
            data = self._rest.pop(path, b"") + data
            end = data.rfind(b"\n") + 1  # complete lines end here; the rest waits for its newline
            if end < len(data):
                self._rest[path] = data[end:]
            out.extend(_decode_lines(io.BytesIO(data[:end]), self.stats, False))
        return out

    def pending_partial(self) -> int:
        """Lines currently incomplete (writer mid-line, or a truncated file's end)."""
        return sum(1 for v in self._rest.values() if v.strip())
