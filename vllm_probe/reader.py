"""Reading event files: tolerant line parsing, time-ordered merging, live following.

Shared by every consumer (dashboard, export, summary). Bad input never raises: a line
that is not a JSON object, an unknown event kind, a newer schema or a partial last line
(the writer was mid-line) is skipped and counted in :class:`ReadStats`.
"""

from __future__ import annotations

import heapq
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import msgspec

from . import typed as _typed
from .events import KINDS, SCHEMA_VERSION
from .rundir import event_files

_fast_decode = msgspec.json.Decoder().decode  # ~4x faster than json for our lines


def _loads(line: str | bytes):
    """``json.loads`` with a fast path; identical results (msgspec rejects what json
    accepts beyond strict JSON, e.g. ``NaN``: those lines fall back to ``json``)."""
    try:
        return _fast_decode(line)
    except ValueError:
        return json.loads(line)


@dataclass
class ReadStats:
    """Counts of what was read and skipped (lines)."""

    events: int = 0
    malformed: int = 0  # not JSON, not an object, no numeric "ts" / string "event"; typed: a field of the wrong type
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


def parse_line(line: str | bytes, stats: ReadStats, typed: bool = False):
    """Decode one complete line into an event dict, or None (counted in ``stats``).

    With ``typed``, the event's Struct (:mod:`vllm_probe.typed`) instead of a dict; a
    line whose fields have the wrong JSON types is then counted malformed.
    """
    try:
        ev = _loads(line)
    except ValueError:
        stats.malformed += 1
        return None
    if not isinstance(ev, dict) or not isinstance(ev.get("event"), str) or not isinstance(ev.get("ts"), (int, float)):
        stats.malformed += 1
        return None
    if ev["event"] not in KINDS:
        stats.unknown_kind += 1
        return None
    ev.setdefault("engine", 0)
    if typed:
        ev = _typed.from_dict(ev)
        if ev is None:
            stats.malformed += 1
            return None
        schema = ev.schema
    else:
        schema = ev.get("schema", SCHEMA_VERSION)
    if isinstance(schema, int) and schema > SCHEMA_VERSION:
        stats.newer_schema += 1
    stats.events += 1
    return ev


def iter_file(path: Path, stats: ReadStats, typed: bool = False) -> Iterator:
    """Stream the events of one file in file order: dicts, or with ``typed`` the Structs
    of :mod:`vllm_probe.typed` (what ``RunState`` and ``summary`` read fastest)."""
    stats.files.add(str(path))
    try:
        f = open(path, "rb")
    except OSError:
        return
    kinds, latest = KINDS, SCHEMA_VERSION
    with f:
        if typed:
            decode = _typed.decode
            for raw in f:
                if not raw.endswith(b"\n"):
                    if raw.strip():
                        stats.partial += 1
                    break
                try:
                    ev = decode(raw)
                except ValueError:  # not strict JSON, unknown kind, wrong types: classify it
                    if raw.strip():
                        ev = parse_line(raw, stats, typed=True)
                        if ev is not None:
                            yield ev
                    continue
                schema = ev.schema
                if schema is not None and schema > latest:
                    stats.newer_schema += 1
                stats.events += 1
                yield ev
            return
        decode = _fast_decode
        for raw in f:
            if not raw.endswith(b"\n"):
                if raw.strip():
                    stats.partial += 1
                break
            try:  # fast path: a well-formed line of a known kind
                ev = decode(raw)
            except ValueError:
                ev = None
            if type(ev) is dict:
                kind, schema = ev.get("event"), ev.get("schema")
                if (type(kind) is str and kind in kinds and type(ev.get("ts")) is float and "engine" in ev
                        and (type(schema) is int and schema <= latest or schema is None)):
                    stats.events += 1
                    yield ev
                    continue
            if not raw.strip():
                continue
            ev = parse_line(raw, stats)
            if ev is not None:
                yield ev


def iter_run(run_dir: Path, stats: ReadStats) -> Iterator[dict]:
    """Stream every event of a run, merged across files in time order.

    Memory: one pending event per file (``heapq.merge``). Files of different engine
    cores interleave by ``ts``; within a file, order is the file's (the writer's).
    """
    streams = [iter_file(p, stats) for p in event_files(run_dir)]
    if len(streams) == 1:
        return streams[0]
    return heapq.merge(*streams, key=_ts_key)


def _ts_key(ev: dict) -> float:
    return ev["ts"]


class EventHead:
    """The fields of an event that merging and export filters need (no other field is
    decoded on the fast path). Attributes: ``event``, ``ts``, ``engine``, ``step``,
    ``req_id`` (None when absent; ``engine`` 0)."""

    __slots__ = ("event", "ts", "engine", "schema", "step", "req_id")

    def __init__(self, event, ts, engine=0, schema=None, step=None, req_id=None) -> None:
        self.event, self.ts, self.engine, self.schema, self.step, self.req_id = event, ts, engine, schema, step, req_id

    @classmethod
    def of(cls, ev: dict) -> "EventHead":
        return cls(ev["event"], ev["ts"], ev.get("engine", 0), ev.get("schema"), ev.get("step"), ev.get("req_id"))


class _Head(msgspec.Struct):
    event: object = None
    ts: object = None
    engine: object = 0
    schema: object = None
    step: object = None
    req_id: object = None


_decode_head = msgspec.json.Decoder(_Head).decode


def iter_file_lines(path: Path, stats: ReadStats) -> Iterator[tuple[EventHead, bytes]]:
    """Like :func:`iter_file`, yielding ``(head, raw line)`` for verbatim export.

    Lines are classified (and counted in ``stats``) exactly as :func:`iter_file` does;
    only the fields of :class:`EventHead` are decoded.
    """
    stats.files.add(str(path))
    try:
        f = open(path, "rb")
    except OSError:
        return
    decode, kinds, latest = _decode_head, KINDS, SCHEMA_VERSION
    with f:
        for raw in f:
            if not raw.endswith(b"\n"):
                if raw.strip():
                    stats.partial += 1
                break
            try:  # fast path: a well-formed line of a known kind
                head = decode(raw)
            except ValueError:
                head = None
            if head is not None:
                kind, ts, schema = head.event, head.ts, head.schema
                if (type(kind) is str and kind in kinds and type(ts) is float
                        and (schema is None or type(schema) is int and schema <= latest)):
                    stats.events += 1
                    yield head, raw
                    continue
            if not raw.strip():
                continue
            ev = parse_line(raw, stats)
            if ev is not None:
                yield EventHead.of(ev), raw


def iter_run_lines(run_dir: Path, stats: ReadStats) -> Iterator[tuple[EventHead, bytes]]:
    """Like :func:`iter_run`, yielding ``(head, raw line)`` pairs merged by ``ts``."""
    streams = [iter_file_lines(p, stats) for p in event_files(run_dir)]
    if len(streams) == 1:
        return streams[0]
    return heapq.merge(*streams, key=_pair_ts_key)


def _pair_ts_key(pair: tuple[EventHead, bytes]) -> float:
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

    def poll(self, max_bytes: int | None = None) -> list[dict]:
        """Read what is new (at most ``max_bytes`` per file per call when given)."""
        out: list[dict] = []
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
            lines = data.split(b"\n")
            tail = lines.pop()
            if tail:
                self._rest[path] = tail
            for raw in lines:
                if raw.strip():
                    ev = parse_line(raw, self.stats)
                    if ev is not None:
                        out.append(ev)
        return out

    def pending_partial(self) -> int:
        """Lines currently incomplete (writer mid-line, or a truncated file's end)."""
        return sum(1 for v in self._rest.values() if v.strip())
