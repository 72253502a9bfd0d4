"""Reading event files: validated records, time-ordered merging, live following.

Shared by every consumer (state, summary, dashboard, exporters). Each line is decoded
into the record of its kind (:mod:`vllm_probe.schema.records`), which checks every
field's JSON type against the schema, so no consumer ever does arithmetic on a string;
past this module there are only records. Bad input never raises: a line that is not a
JSON object (JSON as msgspec reads it: strict, so ``NaN`` and out-of-range numbers are
not), has a field of the wrong type, is of an unknown kind, or is a partial last line
(the writer was mid-line) is skipped and counted in :class:`ReadStats`; a newer
``schema`` is read and counted.

Segments (:func:`~vllm_probe.runs.rundir.event_streams`): an engine core's events may
span several files, ``events-<pid>.jsonl`` then ``events-<pid>.<n>.jsonl``, closed ones
gzipped. Every reader here reads a stream's segments in order, ``.gz`` included, as one
stream: the ``engine_config`` copy heading each segment (``segment: n``) is skipped,
except at the head of the first segment present, where retention removed the ones
before it and the copy is the stream's only ``engine_config`` (the state reads
``segment`` there as the start of the window, :mod:`vllm_probe.analysis.state`).
"""

from __future__ import annotations

import gzip
import heapq
import io
import itertools
import zlib
from operator import attrgetter
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from collections.abc import Iterable, Iterator

import msgspec

from ..schema import records
from ..schema.events import KINDS, SCHEMA_VERSION
from .rundir import SEGMENT_NAME, EventStream, event_streams, segment_of

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
    #: ``engine_config`` copies heading segments after the first read (not events)
    segment_headers: int = 0
    #: segments a live reader never read: removed by retention before it got to them
    segments_missed: int = 0
    #: gzipped segments that end short or are not gzip (read up to the damage, counted)
    damaged_gz: int = 0

    def add(self, other: ReadStats) -> None:
        """Count ``other``'s lines and files in these too (one reading, counted for each of
        the callers it serves)."""
        for f in fields(self):
            if f.name == "files":
                self.files |= other.files
            else:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

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
        if self.damaged_gz:
            text += f", {self.damaged_gz} damaged .gz segment{'s' if self.damaged_gz > 1 else ''} read up to the damage"
        if self.segments_missed:
            text += (f", {self.segments_missed} segment{'s' if self.segments_missed > 1 else ''} "
                     "removed by retention before they were read")
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


def open_segment(path: Path):
    """A binary file object over an event file's lines: ``gzip`` for ``.gz``.

    Raises:
        OSError: the file cannot be opened.
    """
    if str(path).endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb")


def _gz_lines(f, stats: ReadStats) -> Iterator[bytes]:
    """The lines of a gzip file object; a damaged or truncated one ends where it breaks
    (counted in ``stats.damaged_gz``; the last line there counts as partial)."""
    try:
        yield from f
    except (EOFError, OSError, zlib.error):
        stats.damaged_gz += 1


def _read(path: Path, stats: ReadStats, with_lines: bool, skip_headers: bool | None = None) -> Iterator:
    """The records of one file's event lines in file order (see :func:`_decode_lines`).

    ``skip_headers``: leave out the ``engine_config`` copies heading the segment (None:
    when the segment before it is on disk, :func:`_continues`).
    """
    stats.files.add(str(path))
    try:
        f = open_segment(path)
    except OSError:
        return
    if skip_headers is None:
        skip_headers = _continues(Path(path))
    with f:
        lines = _gz_lines(f, stats) if str(path).endswith(".gz") else f
        decoded = _decode_lines(lines, stats, with_lines)
        if skip_headers:
            decoded = _skip_headers(decoded, stats, with_lines)
        yield from decoded


def _continues(path: Path) -> bool:
    """Whether the segment at ``path`` continues a stream read before it: the segment
    before it is on disk (plain or gzipped)."""
    n = segment_of(path)
    m = SEGMENT_NAME.match(path.name)
    if n is None or n <= 1 or m is None:
        return False
    prev = path.with_name(f"{m['stream']}{'' if n == 2 else f'.{n - 1}'}.jsonl")
    return prev.exists() or prev.with_name(prev.name + ".gz").exists()


#: Any: the record classes are built at import (schema.records), their fields unknown to mypy
_ENGINE_CONFIG: Any = records.EngineConfigEvent


def _skip_headers(decoded: Iterator, stats: ReadStats, with_lines: bool) -> Iterator:
    """``decoded`` without its leading ``engine_config`` copies (``segment`` set), which
    are uncounted from ``stats.events`` and counted in ``stats.segment_headers``."""
    for item in decoded:
        rec = item[0] if with_lines else item
        if type(rec) is _ENGINE_CONFIG and rec.segment is not None:
            stats.events -= 1
            stats.segment_headers += 1
            continue
        yield item
        break
    yield from decoded


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
    """Stream the records of one event file in file order (``.gz`` read as it goes; the
    ``engine_config`` copies heading a segment left out when the segment before it is on
    disk, so chaining a stream's files reads it once)."""
    return _read(path, stats, False)


#: Bytes of lines per batch of :func:`iter_file_batches` (about 50 event lines: small
#: enough that the batch's records stay in the CPU's caches; 1 MiB batches decoded 2.5x
#: slower here, docs/performance.md).
BATCH_BYTES = 1 << 14


def iter_file_batches(path: Path, stats: ReadStats, batch_bytes: int = BATCH_BYTES) -> Iterator[list]:
    """The records of one file in file order, as lists (one per ``batch_bytes`` of lines
    read): the same records, classified and counted in ``stats`` the same way as
    :func:`iter_file`. Memory: one batch.

    This is summary's and doctor's hot path: the lines of a batch (``readlines``) are
    decoded by one ``map`` of the records' decoder (:func:`decode_batch`: no Python code
    per line); only a batch in which some line does not decode as a record (malformed,
    blank, of an unknown kind, a null ``engine``) goes line by line through
    :func:`_decode_lines`, which says why. A last line without its newline is partial
    (the writer was mid-line): counted, not read, and the file's reading stops there.
    """
    stats.files.add(str(path))
    try:
        f = open_segment(path)
    except OSError:
        return
    skip_headers = _continues(Path(path))  # a later segment: its engine_config copies are not events
    with f:
        while True:
            try:
                lines = f.readlines(batch_bytes)
            except (EOFError, OSError, zlib.error):  # a damaged .gz: read up to the damage
                stats.damaged_gz += 1
                return
            if not lines:
                return
            partial = not lines[-1].endswith(b"\n")
            last = lines.pop() if partial else b""
            batch = decode_batch(lines, stats) if lines else []
            if skip_headers and batch:
                batch, skip_headers = _drop_headers(batch, stats)
            if batch:
                yield batch
            if partial:
                list(_decode_lines((last,), stats, False))  # counts it
                return


def _drop_headers(batch: list, stats: ReadStats) -> tuple[list, bool]:
    """``batch`` without its leading ``engine_config`` copies (``segment`` set; uncounted
    from ``stats.events``, counted in ``stats.segment_headers``), and whether the next
    batch may still start with one (this one held nothing else)."""
    i = 0
    while i < len(batch) and type(batch[i]) is _ENGINE_CONFIG and batch[i].segment is not None:
        i += 1
    stats.events -= i
    stats.segment_headers += i
    return batch[i:], i == len(batch)


_schema_of = attrgetter("schema")
_NOT_NEWER = frozenset((None, SCHEMA_VERSION))


def decode_batch(lines: list[bytes], stats: ReadStats) -> list:
    """The records of ``lines`` (complete lines, each ending with its newline; one list,
    in order), counted in ``stats`` exactly as :func:`_decode_lines` counts them."""
    try:
        batch = list(map(records.decode, lines))
    except (ValueError, RecursionError):  # some line needs the slow path: redo the batch line by line
        return list(_decode_lines(lines, stats, False))
    stats.events += len(batch)
    # a newer schema is counted per record (a set of the batch's schemas: no Python code per line)
    if not _NOT_NEWER.issuperset(map(_schema_of, batch)):
        latest = SCHEMA_VERSION
        stats.newer_schema += sum(1 for rec in batch if rec.schema is not None and rec.schema > latest)
    return batch


def iter_stream(stream: EventStream, stats: ReadStats, with_lines: bool = False) -> Iterator:
    """One engine core's records, its segments in order as one stream: the copies of
    ``engine_config`` heading every segment but the first present are left out.
    ``with_lines``: ``(record, raw line)`` pairs."""
    return itertools.chain.from_iterable(
        _read(seg.path, stats, with_lines, skip_headers=i > 0) for i, seg in enumerate(stream.segments))


#: Sort key of records by time (``ts``, epoch s).
record_ts = attrgetter("ts")


def iter_run(run_dir: Path, stats: ReadStats) -> Iterator:
    """Stream every record of a run, merged across files in time order.

    Memory: one pending event per file (``heapq.merge``). Files of different engine
    cores interleave by ``ts``; within a file, order is the file's (the writer's).
    """
    streams = [iter_stream(st, stats) for st in event_streams(run_dir)]
    if len(streams) == 1:
        return streams[0]
    return heapq.merge(*streams, key=record_ts)


def iter_file_lines(path: Path, stats: ReadStats) -> Iterator[tuple[Any, bytes]]:
    """Like :func:`iter_file`, yielding ``(record, raw line)`` pairs for
    verbatim export; lines are classified (and counted in ``stats``) the same way."""
    return _read(path, stats, True)


def iter_run_lines(run_dir: Path, stats: ReadStats) -> Iterator[tuple[Any, bytes]]:
    """Like :func:`iter_run`, yielding ``(record, raw line)`` pairs merged by ``ts``."""
    streams = [iter_stream(st, stats, with_lines=True) for st in event_streams(run_dir)]
    if len(streams) == 1:
        return streams[0]
    return heapq.merge(*streams, key=_pair_ts)


def _pair_ts(pair: tuple[Any, bytes]) -> float:
    return pair[0].ts


class _Position:
    """Where a :class:`Follower` is in one engine core's stream: segment ``n`` (None before
    the first read), bytes of it read (uncompressed), the incomplete line kept, the open
    gzip reader of a compressed segment, whether it is the first segment read of the
    stream (its ``engine_config`` copy is the stream's config) and whether the
    segment's head (its copies) is still to come."""

    __slots__ = ("n", "offset", "rest", "gz", "first", "in_head")

    def __init__(self) -> None:
        self.n: int | None = None
        self.offset = 0
        self.rest = b""
        self.gz: Any = None
        self.first = True
        self.in_head = False

    def move_to(self, n: int, first: bool = False) -> None:
        self.close()
        self.n, self.offset, self.rest, self.first, self.in_head = n, 0, b"", first, not first

    def close(self) -> None:
        if self.gz is not None:
            try:
                self.gz.close()
            except (OSError, EOFError, zlib.error):
                pass
            self.gz = None


class Follower:
    """Follow a run directory live: new lines of every engine core's stream, streams that
    appear later, segments as the probe rotates, compresses and removes them.

    :meth:`poll` returns the events completed since the last call (stream by stream; each
    stream in order). A line still being written is kept until its newline arrives. Per
    stream it reads one segment at a time and moves to the next once the next is listed
    and this one is read to its end: the writer closes a segment before it opens the
    next, so a segment read to its end after the next was listed is complete. A segment
    compressed meanwhile is read on from its ``.gz`` at the same (uncompressed) offset.
    The ``engine_config`` copies heading segments after the first one read are skipped
    (as :func:`iter_stream` does). Segments retention removed before they were read are
    counted (``stats.segments_missed``) and the follower goes on with the oldest left.
    Memory: one position per engine core, and one read of ``chunk_bytes`` at a time.
    """

    def __init__(self, run_dir: Path, stats: ReadStats | None = None, chunk_bytes: int = 1 << 20) -> None:
        self.run_dir = Path(run_dir)
        self.stats = stats or ReadStats()
        self._pos: dict[str, _Position] = {}
        self._chunk = chunk_bytes

    def poll(self, max_bytes: int | None = None) -> list:
        """The records completed since the last call (at most ``max_bytes`` read per
        stream per call when given)."""
        out: list = []
        stats = self.stats
        for stream in event_streams(self.run_dir):
            segs = stream.segments
            if not segs:
                continue
            pos = self._pos.get(stream.name)
            if pos is None:
                pos = self._pos[stream.name] = _Position()
                pos.move_to(segs[0].n, first=True)
            budget = max_bytes
            while True:
                cur = next((seg for seg in segs if seg.n == pos.n), None)
                later = next((seg for seg in segs if seg.n > pos.n), None)  # type: ignore[operator]
                if cur is None:
                    if later is None:
                        break
                    # removed by retention before it was read to its end
                    stats.segments_missed += later.n - pos.n  # type: ignore[operator]
                    pos.move_to(later.n)
                    continue
                got, at_end = self._read(cur.path, pos, budget, out)
                if budget is not None:
                    budget -= got
                    if budget <= 0:
                        break
                if later is None or not at_end:
                    break
                if pos.rest.strip():  # the segment ended mid-line (the writer was cut off)
                    stats.partial += 1
                stats.segments_missed += later.n - cur.n - 1
                pos.move_to(later.n)
        return out

    def _read(self, path: Path, pos: _Position, budget: int | None, out: list) -> tuple[int, bool]:
        """Read on in segment ``path`` from ``pos``; complete lines decoded into ``out``.
        Returns (bytes read, whether the end of the file was reached)."""
        stats = self.stats
        stats.files.add(str(path))
        f, plain = pos.gz, False
        if f is None:
            if not str(path).endswith(".gz"):
                try:
                    f = open(path, "rb")  # noqa: SIM115 -- closed in the finally below (plain)
                    plain = True
                    f.seek(pos.offset)
                except OSError:  # compressed (or removed) since it was listed: its .gz
                    f = None
                    path = path.with_name(path.name + ".gz")
            if f is None:
                try:
                    f = pos.gz = gzip.open(path, "rb")  # noqa: SIM115 -- kept open in pos across reads
                    skip = pos.offset
                    while skip:  # the uncompressed bytes already read from the plain file
                        got = len(f.read(min(skip, self._chunk)))
                        if not got:
                            break
                        skip -= got
                except (OSError, EOFError, zlib.error):
                    stats.damaged_gz += 1 if path.exists() else 0
                    pos.close()
                    return 0, path.exists()
        total, at_end = 0, False
        try:
            while True:
                want = self._chunk if budget is None else min(self._chunk, budget - total)
                if want <= 0:
                    break
                try:
                    data = f.read(want)
                except (OSError, EOFError, zlib.error):  # a damaged .gz: read up to the damage
                    stats.damaged_gz += 1
                    data = b""
                if not data:
                    at_end = True
                    break
                pos.offset += len(data)
                total += len(data)
                data = pos.rest + data
                end = data.rfind(b"\n") + 1  # complete lines end here; the rest waits for its newline
                pos.rest = data[end:]
                if end:
                    recs = _decode_lines(io.BytesIO(data[:end]), stats, False)
                    if pos.in_head:
                        recs = self._past_head(recs, pos)
                    out.extend(recs)
        finally:
            if plain:
                f.close()
        return total, at_end

    def _past_head(self, recs: Iterator, pos: _Position) -> Iterator:
        """``recs`` without the segment's leading ``engine_config`` copies."""
        stats = self.stats
        for rec in recs:
            if pos.in_head and type(rec) is _ENGINE_CONFIG and rec.segment is not None:
                stats.events -= 1
                stats.segment_headers += 1
                continue
            pos.in_head = False
            yield rec

    def pending_partial(self) -> int:
        """Lines currently incomplete (writer mid-line, or a truncated file's end)."""
        return sum(1 for p in self._pos.values() if p.rest.strip())
