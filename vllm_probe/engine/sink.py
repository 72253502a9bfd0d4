"""Where events go: a bounded in-memory queue drained by a writer thread into JSON lines.

The scheduler's thread only appends the event its hook packed (by field name, see
:attr:`vllm_probe.schema.events.EventKind.pack`) to a deque (:meth:`EventSink.emit`,
well under a microsecond); building the JSON object, encoding it (structlog's
``JSONRenderer``) and writing happen on the writer thread, which wakes every
:data:`FLUSH_INTERVAL_S`. Each wake-up writes whole lines with one ``write()`` on an
unbuffered file, so a SIGKILL leaves only complete lines and loses at most the events of
the last interval.

Stopping: at SIGTERM/SIGINT (:meth:`EventSink.checkpoint`) everything queued is written
with a ``probe_stats`` line. vLLM 0.32's engine core goes on stepping after the signal
(a last step, aborts of in-flight requests) while its parent SIGKILLs it milliseconds
later (abort mode, ``shutdown_timeout`` 0, the default). So from the signal on, the
writer wakes every :data:`STOPPING_FLUSH_INTERVAL_S` and ends each ``write()`` with a
``probe_stats`` line counting it: wherever the kill lands, the file ends with a
``probe_stats`` line whose counts match the lines before it.

Faults never reach vLLM: a full queue, an unwritable directory, a full disk or a deleted
file turn into counted drops and one warning line; the final ``probe_stats`` line (or,
when the file cannot be written, a warning on stderr) reports them.

Segments (``scheduler_probe.max_segment_mb``, ``rotate_every_s``): the writer thread
closes the file between two lines once the next line would take it past the size (or
the segment is older than ``rotate_every_s``) and opens the next one: segment 1 is
``events-<pid>.jsonl``, segment n ``events-<pid>.<n>.jsonl``; each new segment starts
with a copy of every ``engine_config`` line seen so far, marked ``segment: n`` and
keeping its ``ts``, so a window of segments reads on its own (the copy is not an event:
``events_written`` leaves it out and readers of the whole stream skip it). A closed
segment goes to :class:`SegmentKeeper`'s thread, off the scheduler's and the writer's
path: gzipped (``compress_segments``: ``.gz.tmp``, renamed to ``.jsonl.gz``, then the
``.jsonl`` removed; a crash in between leaves a readable file and readers take one of
the two) and the oldest closed segments removed (``keep_mb`` / ``keep_hours``). A
segment that cannot be opened (disk full at rotation) is the write failure above: its
events are dropped and counted, vLLM keeps serving.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
import zlib
from collections import deque
from collections.abc import Iterable
from multiprocessing import util as mp_util
from pathlib import Path
from typing import Any, BinaryIO, cast
from collections.abc import Callable, MutableMapping

import msgspec
import structlog
from msgspec.structs import astuple

from ..schema.events import ENGINE_CONFIG, PROBE_STATS, SCHEMA_VERSION, EventKind

logger = logging.getLogger("vllm_probe")

#: Longest time an event waits in memory before it is written (seconds). A SIGKILL loses
#: at most this much; SIGTERM/SIGINT and normal exits lose nothing.
FLUSH_INTERVAL_S = 0.1

#: The writer's interval after a stop signal (seconds): vLLM may SIGKILL the engine core
#: milliseconds after it, and events of the shutdown (aborted requests) should make it.
STOPPING_FLUSH_INTERVAL_S = 0.01

#: Longest wait (s) of close() and of a stop signal's checkpoint for a writer thread
#: stuck inside write() (a hung disk): beyond it they give up instead of holding vLLM.
STALL_WAIT_S = 1.0

#: Most events rendered and written at once. A writer that fell behind (starved of the
#: GIL or a core, the disk slow) drains its backlog in such slices: its transient memory
#: (one dict and one line per event, the joined write) stays that of 512 events, ~0.7 MB,
#: instead of the backlog's. Measured with vLLM 0.32's scheduler in-process: a writer
#: held back for 1,500 to 6,000 steps and then draining them at once grew its thread's
#: glibc arena by 3 to 12 MiB, kept as free memory after (docs/guarantees.md, "Memory").
WRITE_BATCH = 512

#: Queue item: (kind, wall-clock ts in s, data-parallel rank, the event's fields): what
#: ``kind.pack(...)`` returned, or a tuple of values in ``kind.fields`` order.
QueuedEvent = tuple[EventKind, float, int, Any]


class _LineBuffer:
    """structlog "logger" that collects the rendered lines (ASCII bytes) for one batched
    write, and the events of the batch that could not be encoded (``(kind name,
    exception)``)."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.failed: list[tuple[str, Exception]] = []

    def msg(self, text: bytes, failed: list[tuple[str, Exception]] | None = None) -> None:
        if text:
            self.lines.append(text)
        if failed:
            self.failed += failed


# -- rendering: one structlog call per batch ----------------------------------------------
# The writer thread hands a whole batch to structlog once; the processor chain turns the
# queued events into ordered dicts and renders each with structlog's JSONRenderer, whose
# serializer is msgspec where msgspec writes json.dumps's exact text (_dumps). Per event
# that leaves one dict and one JSON encoding: ~5.5 µs per event of a real run on the
# 2-core test machine (7 µs with json.dumps's C encoder; ~23 µs for one structlog call
# per event, docs/performance.md). It matters because rendering holds the GIL that
# vLLM's scheduler thread needs.

class Deferred:
    """An optional field's value computed on the writer thread: ``func(arg)``.

    A hook whose field costs real work (``request_added.block_digests`` hashes every
    block of the prompt) queues ``Deferred(func, arg)`` instead of the value; the writer
    calls it while rendering, off the scheduler's thread. A call that raises or
    returns None leaves the field out of the line.
    """

    __slots__ = ("func", "arg")

    def __init__(self, func: Callable[[Any], Any], arg: Any) -> None:
        self.func = func
        self.arg = arg

    def __call__(self) -> Any:
        try:
            return self.func(self.arg)
        except Exception:
            logger.debug("vllm-probe: a deferred field failed", exc_info=True)
            return None


#: id(kind) -> (kind, name, field names, indexes of optional fields). Keyed by id: hashing
#: the frozen EventKind dataclass costs more than rendering the event.
_LAYOUTS: dict[int, tuple[EventKind, str, tuple[str, ...], tuple[int, ...]]] = {}


def _layout(kind: EventKind) -> tuple[EventKind, str, tuple[str, ...], tuple[int, ...]]:
    lay = _LAYOUTS.get(id(kind))
    if lay is None or lay[0] is not kind:
        optional = tuple(i for i, f in enumerate(kind.fields) if f.optional)
        lay = _LAYOUTS[id(kind)] = (kind, kind.name, kind.field_names, optional)
    return lay


def _event_dicts(_logger: Any, _name: str, event_dict: MutableMapping[str, Any]) -> dict[str, Any]:
    """Processor: a batch of queued events -> one dict per event, ``event`` first, then
    ``ts``, ``pid``, ``engine``, ``schema`` and the kind's fields in order; optional
    fields whose value is None are left out, :class:`Deferred` ones computed here."""
    pid = event_dict["pid"]
    dicts = []
    for kind, ts, engine, values in event_dict["batch"]:
        _, name, names, optional = _layout(kind)
        if type(values) is not tuple:  # kind.pack(...): its values in field order
            values = astuple(values)
        d = {"event": name, "ts": ts, "pid": pid, "engine": engine, "schema": SCHEMA_VERSION}
        d.update(zip(names, values))
        for i in optional:
            if i < len(values):
                v = values[i]
                if v is None:
                    del d[names[i]]
                elif type(v) is Deferred:
                    v = v()
                    if v is None:
                        del d[names[i]]
                    else:
                        d[names[i]] = v
        dicts.append(d)
    return {"events": dicts}


_SAME_SCALARS = frozenset((str, int, bool, type(None)))
_STR = frozenset((str,))


def _msgspec_agrees(values: Iterable[Any]) -> bool:
    """Whether msgspec writes each of ``values`` as ``json.dumps`` does, strings aside.

    True for ints (any size), bools, None, strings (the caller checks their characters
    on the output), floats that are zero or 1e-4 <= |x| < 1e16 — Python's ``repr``
    switches to an exponent outside that range and msgspec formats those differently
    (``0.00001`` for ``1e-05``, ``1e16`` for ``1e+16``, ``null`` for NaN and
    infinities) — and lists, tuples and str-keyed dicts of such values. False for
    anything else: an Enum, a set, a datetime or bytes are written natively by msgspec
    but handed to ``default`` by ``json.dumps``.
    """
    for v in values:
        t = type(v)
        if t in _SAME_SCALARS:
            continue
        if t is float:
            if 1e-4 <= abs(v) < 1e16 or v == 0.0:
                continue
            return False
        if t is list or t is tuple:
            if v and not _msgspec_agrees(v):
                return False
        elif t is dict:
            if not (set(map(type, v)) <= _STR and _msgspec_agrees(v.values())):
                return False
        else:
            return False
    return True


_encode = msgspec.json.Encoder().encode


def _dumps(obj: Any, default: Callable[[Any], Any] | None = None, **kw: Any) -> bytes:
    """structlog's serializer: the text of ``json.dumps(obj, default=default, **kw)``, as
    ASCII bytes.

    msgspec encodes, and ``msgspec.json.format(..., indent=0)`` spaces the result as
    ``json.dumps`` does (``", "`` and ``": "``), when that gives the same text: every
    value passes :func:`_msgspec_agrees` and the output is ASCII without DEL
    (``json.dumps`` escapes those as ``\\uXXXX``; msgspec escapes control characters,
    quotes and backslashes alike). Otherwise — a non-ASCII request id, NaN, a float
    outside [1e-4, 1e16), an object for ``default`` — or if msgspec raises, ``json.dumps``
    itself writes it. Raises what ``json.dumps`` raises (e.g. ``TypeError`` for a dict
    with tuple keys).
    """
    if not kw and _msgspec_agrees((obj,)):
        try:
            out = msgspec.json.format(_encode(obj), indent=0)
        except Exception:  # e.g. a lone surrogate: json.dumps escapes it, msgspec raises
            out = None
        if out is not None and out.isascii() and b"\x7f" not in out:
            return out
    return json.dumps(obj, default=default, **kw).encode()


class _JSONLines:
    """Final processor: each event dict through structlog's ``JSONRenderer``, one per line.

    An event that cannot be encoded (say a value JSON cannot hold) costs that event only:
    the batch is rendered again one event at a time and the failures are passed on.
    """

    def __init__(self) -> None:
        # with a serializer that returns bytes, the renderer returns bytes
        self._render = cast("Callable[[Any, str, Any], bytes]", structlog.processors.JSONRenderer(serializer=_dumps))

    def __call__(self, logger: Any, name: str, event_dict: MutableMapping[str, Any]) -> bytes | tuple[Any, ...]:
        render = self._render
        try:
            return b"\n".join([render(logger, name, d) for d in event_dict["events"]])
        except Exception:
            pass
        lines: list[bytes] = []
        failed: list[tuple[str, Exception]] = []
        for d in event_dict["events"]:
            try:
                lines.append(render(logger, name, d))
            except Exception as e:
                failed.append((d.get("event", "?"), e))
        return (b"\n".join(lines),), {"failed": failed}


#: gzip level of closed segments. Measured on a real run's events (tests/data/
#: real_run_lines.jsonl repeated to 20 MB; 2-core machine at load 6.7): level 1 writes
#: 9.4 % of the bytes at 140 MB/s of input, level 6 7.3 % at 37 MB/s. The keeper thread
#: takes the GIL between zlib calls, so the faster level leaves vLLM more of it.
GZIP_LEVEL = 1


def segment_path(first: Path, n: int) -> Path:
    """Segment ``n`` (1-based) of the stream whose first segment is ``first``:
    ``events-7.jsonl`` for 1, ``events-7.<n>.jsonl`` after."""
    first = Path(first)
    if n == 1:
        return first
    return first.with_name(f"{first.stem}.{n}{first.suffix}")


#: Bytes read from a closed segment per zlib call. One buffer, allocated once per
#: segment and refilled with ``readinto``: reading with ``read(n)`` (as
#: ``shutil.copyfileobj`` into ``gzip.GzipFile`` does) allocates a fresh ``n``-byte object
#: per call on the keeper thread, and glibc kept those freed megabytes in the thread's
#: arena: measured with vLLM 0.32's real scheduler in-process (1 MiB segments, gzip on),
#: the keeper's arena grew by ~10 MiB per 20,000 steps, all of it free memory, while
#: this loop stays flat (docs/guarantees.md, "Memory").
COMPRESS_CHUNK = 64 * 1024

#: zlib's ``wbits`` for a gzip container (header and CRC-32 trailer, RFC 1952).
_GZIP_WBITS = 16 + 15


def compress_segment(path: Path, level: int = GZIP_LEVEL) -> Path:
    """Gzip a closed segment: ``<path>.gz.tmp`` (0600), fsynced, renamed to ``<path>.gz``,
    then ``path`` removed. Returns the ``.gz`` path.

    The ``.gz`` is one gzip member (zlib's own container, readable by ``gzip.open`` and
    ``zcat``), written :data:`COMPRESS_CHUNK` bytes at a time through one reused buffer.
    A crash part-way leaves ``path`` whole and at most a ``.gz.tmp`` (which readers
    ignore), or, between the rename and the removal, both ``path`` and a whole ``.gz``
    (readers take one of the two, :func:`vllm_probe.runs.rundir.event_streams`).

    Raises:
        OSError: reading, writing or renaming failed (the ``.gz.tmp`` is removed; ``path``
            is left as it was).
    """
    path = Path(path)
    gz = path.with_name(path.name + ".gz")
    tmp = path.with_name(path.name + ".gz.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(path, "rb", buffering=0) as src, os.fdopen(fd, "wb", buffering=0) as out:
            deflate = zlib.compressobj(level, zlib.DEFLATED, _GZIP_WBITS)
            buf = bytearray(COMPRESS_CHUNK)
            view = memoryview(buf)
            while n := src.readinto(buf):
                _write_all(out, deflate.compress(view[:n]))
            _write_all(out, deflate.flush())
            os.fsync(out.fileno())
        os.rename(tmp, gz)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    os.unlink(path)
    return gz


def _write_all(out: BinaryIO, data: bytes | memoryview) -> None:
    """All of ``data`` to an unbuffered file (``FileIO.write`` may write less)."""
    view = memoryview(data)
    while view:
        view = view[out.write(view):]


class SegmentKeeper:
    """Compresses and removes an engine core's closed segments on its own thread.

    Args:
        compress: gzip each closed segment (:func:`compress_segment`).
        keep_bytes: most bytes the closed segments may take on disk (None: no bound);
            the oldest go first. The open segment is not counted: the stream takes at
            most ``keep_bytes`` plus one segment.
        keep_s: closed segments older than this (s since they were closed) are removed
            (None: kept).

    :meth:`closed` (the writer thread) only appends to a deque and sets an event; the
    thread starts with the first closed segment. A segment it cannot compress (a full
    disk) stays as it is, counted in :attr:`errors` with one warning.
    """

    def __init__(self, compress: bool, keep_bytes: int | None = None, keep_s: float | None = None) -> None:
        self.compress = compress
        self.keep_bytes = keep_bytes
        self.keep_s = keep_s
        self._pending: deque[tuple[Path, float]] = deque()
        #: closed segments on disk, oldest first: [path, bytes, closed at (epoch s)]
        self.kept: deque[list[Any]] = deque()
        self.compressed = 0
        self.removed = 0
        self.errors = 0
        #: segments handed over by :meth:`closed`, and those the keeper is done with
        self.handed = 0
        self.done = 0
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def closed(self, path: Path) -> None:
        """A segment was closed for good (writer thread; never raises)."""
        if os.getpid() != self._pid:
            return
        self._pending.append((Path(path), time.time()))
        self.handed += 1
        if self._thread is None:
            try:
                self._thread = threading.Thread(target=self._run, name="vllm-probe-segments", daemon=True)
                self._thread.start()
            except RuntimeError:  # interpreter shutting down: the segment stays as it is
                self._thread = None
                return
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(60.0 if self.keep_s else None)
            self._wake.clear()
            try:
                self.work()
            except Exception:  # never let the thread die silently
                logger.exception("vllm-probe: segment keeper error")

    def work(self) -> None:
        """Compress what was closed, then apply retention (the thread's loop body; tests
        call it directly)."""
        while self._pending:
            path, at = self._pending.popleft()
            if self.compress:
                try:
                    path = compress_segment(path)
                    self.compressed += 1
                except OSError as e:
                    self.errors += 1
                    if self.errors == 1:
                        logger.warning("vllm-probe: cannot compress %s (%s); closed segments are "
                                       "kept uncompressed", path, e.strerror or e)
            try:
                size = path.stat().st_size
            except OSError:
                size = None
            if size is not None:
                self.kept.append([path, size, at])
                self.prune()
            self.done += 1
        self.prune()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every segment handed over is compressed and pruned (tests,
        benchmarks); False if ``timeout`` (s) passed first."""
        deadline = time.monotonic() + timeout
        while self.done < self.handed:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def prune(self, now: float | None = None) -> None:
        """Remove the oldest closed segments beyond ``keep_bytes`` or older than ``keep_s``."""
        now = time.time() if now is None else now
        total = sum(k[1] for k in self.kept)
        while self.kept:
            path, size, at = self.kept[0]
            over = self.keep_bytes is not None and total > self.keep_bytes
            old = self.keep_s is not None and now - at > self.keep_s
            if not (over or old):
                break
            self.kept.popleft()
            total -= size
            try:
                os.unlink(path)
                self.removed += 1
            except FileNotFoundError:
                pass
            except OSError as e:
                self.errors += 1
                logger.warning("vllm-probe: cannot remove %s (%s)", path, e.strerror or e)


def _segment_copy(item: QueuedEvent, n: int) -> QueuedEvent:
    """The queued ``engine_config`` event ``item`` marked ``segment: n`` (same ``ts``)."""
    kind, ts, engine, values = item
    if type(values) is tuple:
        names = kind.field_names
        padded = list(values) + [None] * (len(names) - len(values))
        padded[names.index("segment")] = n
        return (kind, ts, engine, tuple(padded))
    return (kind, ts, engine, msgspec.structs.replace(values, segment=n))


class EventSink:
    """One JSON-lines stream per process, fed through a bounded queue.

    Args:
        path: the ``events-<pid>.jsonl`` file to create (mode 0600; appended to if it
            exists); later segments are named after it (:func:`segment_path`).
        capacity: most events held in memory; beyond it :meth:`emit` drops and counts.
        stats_extra: called at close; returns ``(hook_errors, hooks_disabled)`` for the
            final ``probe_stats`` line.
        opener: opens a segment's path for binary appending; tests pass one that fails.
        max_segment_bytes: close a segment before the line that would take it past this
            size (bytes; a segment holds at least one line after its header). None: one
            file.
        rotate_every_s: also close a segment this long after it was opened (s, by the
            monotonic clock; checked when lines are written). None: by size only.
        compress_segments, keep_bytes, keep_s: what :class:`SegmentKeeper` does with
            closed segments.
        speed_mark: ``() -> float | None``, the machine-speed mark in µs
            (:func:`vllm_probe.engine.speed.measure`), taken once at the end (the stop
            signal's :meth:`checkpoint`, else :meth:`close`) and written on every
            ``probe_stats`` line from then on (``speed_mark_us``); None: no mark.
    """

    def __init__(
        self,
        path: Path,
        capacity: int = 65536,
        stats_extra: Callable[[], tuple[dict[str, int], list[str]]] | None = None,
        opener: Callable[[Path], BinaryIO] | None = None,
        flush_interval_s: float = FLUSH_INTERVAL_S,
        max_segment_bytes: int | None = None,
        rotate_every_s: float | None = None,
        compress_segments: bool = False,
        keep_bytes: int | None = None,
        keep_s: float | None = None,
        speed_mark: Callable[[], float | None] | None = None,
    ) -> None:
        self.path = Path(path)
        self._opener = opener or _open_private
        self._max_bytes = max_segment_bytes or None
        self._rotate_s = rotate_every_s or None
        self._rotating = self._max_bytes is not None or self._rotate_s is not None
        #: the segment being written: its number (1-based), path, bytes, lines after its
        #: header, and when it was opened (monotonic s)
        self.segment = 1
        self.segment_path = self.path
        self._seg_bytes = 0
        self._seg_lines = 0
        self._seg_opened = time.monotonic()
        #: the latest engine_config event of each engine rank (copied into new segments)
        self._configs: dict[int, QueuedEvent] = {}
        self.keeper = SegmentKeeper(compress_segments, keep_bytes, keep_s) if self._rotating else None
        self.pid = os.getpid()
        #: data-parallel rank written on probe_stats lines (set by the engine core's probe)
        self.engine = 0
        self._queue: deque[QueuedEvent] = deque()
        self._capacity = capacity
        self._stats_extra = stats_extra
        self._interval = flush_interval_s
        self.dropped_full = 0  # incremented on the scheduler thread only
        self.dropped_io = 0  # incremented on the writer thread only
        self.dropped_encode = 0  # events that could not be encoded (writer thread)
        self._warned_encode = False
        self.written = 0
        self._failure: str | None = None
        self._closed = False
        self._close_lock = threading.Lock()
        # the writer thread vs. flush()/close()/checkpoint(); re-entrant because a stop
        # signal's checkpoint may interrupt the main thread inside close()
        self._drain_lock = threading.RLock()
        self._speed_mark = speed_mark
        #: the end's machine-speed mark (µs), once taken (:meth:`_mark_end`)
        self.end_speed_mark_us: float | None = None
        #: (written, dropped, end mark) at the last probe_stats
        self._stats_at: tuple[int, int, float | None] | None = None
        self._stopping = False  # a stop signal arrived: every write ends with probe_stats
        self._stop = threading.Event()
        self._wake = threading.Event()  # cuts the writer's wait short (stop signal, close)
        self._buffer = _LineBuffer()
        self._log = structlog.wrap_logger(
            self._buffer,
            processors=[_event_dicts, _JSONLines()],
            wrapper_class=structlog.BoundLogger,
        ).bind()  # bind once: the lazy proxy wrap_logger returns re-binds on every call
        self._file: BinaryIO | None = None
        try:
            self._file = self._opener(self.path)
        except OSError as e:
            self._fail(f"cannot open {self.path}: {e.strerror or e}")
        else:
            try:
                self._seg_bytes = os.fstat(self._file.fileno()).st_size
            except (OSError, AttributeError, ValueError):
                pass
        self._thread = threading.Thread(target=self._run, name="vllm-probe-writer", daemon=True)
        self._thread.start()
        # atexit covers spawned processes and the main process; multiprocessing's
        # finalizers also run in forked children, which skip atexit.
        atexit.register(self.close)
        mp_util.Finalize(self, self.close, exitpriority=100)

    # -- scheduler thread -------------------------------------------------------------

    def emit(self, kind: EventKind, ts: float, engine: int, values: Any) -> None:
        """Queue one event; never blocks, never raises. Drops (counted) when full.

        Args:
            kind: the event's kind (``vllm_probe.schema.events.STEP``, ...).
            ts: when it happened, ``time.time()`` (s since the epoch).
            engine: the data-parallel rank of the engine core.
            values: the fields, built by name with ``kind.pack(...)``; a tuple of values
                in ``kind.fields`` order is also taken (a recorded line replayed).
        """
        q = self._queue
        if len(q) < self._capacity:
            q.append((kind, ts, engine, values))
        else:
            self.dropped_full += 1

    # -- writer thread ----------------------------------------------------------------

    def _render(self, items: list[QueuedEvent]) -> None:
        """Render a batch with one structlog call; its lines land in ``self._buffer``."""
        if items:
            self._log.msg("batch", pid=self.pid, batch=items)

    def flush(self) -> None:
        """Write everything queued so far, on the caller's thread (tests, benchmarks)."""
        self._drain()

    def _drain(self, wait: float = -1) -> bool:
        """Write what is queued. ``wait``: longest wait (s) for the writer thread when it
        is inside write() (-1: as long as it takes); False if it gave up."""
        if not self._drain_lock.acquire(timeout=wait):
            return False
        try:
            self._drain_locked()
        finally:
            self._drain_lock.release()
        return True

    def _drain_locked(self) -> None:
        """Write what is queued now, :data:`WRITE_BATCH` events per render and write."""
        q = self._queue
        n = len(q)
        while n > 0:
            k = min(n, WRITE_BATCH)
            self._write_batch([q.popleft() for _ in range(k)])
            n -= k

    def _write_batch(self, batch: list[QueuedEvent]) -> None:
        n = len(batch)
        if self._file is None:
            self.dropped_io += n
            return
        if self._rotating:
            config = ENGINE_CONFIG
            for item in batch:
                if item[0] is config:
                    self._configs[item[2]] = item
        self._render(batch)
        lines, self._buffer.lines = self._buffer.lines, []
        failed, self._buffer.failed = self._buffer.failed, []
        if failed:
            self._unencodable(failed)
        counted = n - len(failed)
        if self._stopping:  # the same write() carries the counts that include it
            lines += self._stats_lines(self.written + counted)
        if lines:
            self._write_lines(lines, counted=counted)

    def _unencodable(self, failed: list[tuple[str, Exception]]) -> None:
        self.dropped_encode += len(failed)
        if not self._warned_encode:
            self._warned_encode = True
            kind, exc = failed[0]
            logger.warning("vllm-probe: cannot encode a %s event (%s: %s); such events are "
                           "dropped and counted", kind, type(exc).__name__, exc)

    def _write_lines(self, lines: list[bytes], counted: int) -> None:
        """Write ``lines`` (rendered text, each element one or more lines joined by
        newlines), whose first ``counted`` lines are events (the rest probe_stats),
        rotating segments between lines when due."""
        data = b"\n".join(lines) + b"\n"
        if not self._rotating:
            self._write_chunk(data, 0, counted)
            return
        pos, line_no, size = 0, 0, len(data)
        max_bytes = self._max_bytes
        while pos < size:
            if self._file is None:  # a segment could not be opened: the rest is dropped
                self.dropped_io += max(counted - line_no, 0)
                return
            nl = data.find(b"\n", pos) + 1  # end of the next line
            if self._due(nl - pos):
                self._rotate()
                continue
            end = size
            if max_bytes is not None and self._seg_bytes + size - pos > max_bytes:
                end = data.rfind(b"\n", pos, pos + max(max_bytes - self._seg_bytes, 0)) + 1
                if end <= pos:  # not even one line fits: one line (a segment holds at least one)
                    end = nl
            n_lines = data.count(b"\n", pos, end)
            self._write_chunk(memoryview(data)[pos:end], n_lines,
                              max(min(line_no + n_lines, counted) - line_no, 0))
            pos = end
            line_no += n_lines

    def _due(self, next_bytes: int) -> bool:
        """Whether the segment closes before a line of ``next_bytes`` (it holds a line)."""
        if not self._seg_lines:
            return False
        if self._max_bytes is not None and self._seg_bytes + next_bytes > self._max_bytes:
            return True
        return self._rotate_s is not None and time.monotonic() - self._seg_opened >= self._rotate_s

    def _rotate(self) -> None:
        """Close the segment, open the next with its ``engine_config`` copies, hand the
        closed one to the keeper. A failure to open is a write failure (:meth:`_fail`)."""
        old = self.segment_path
        self._close_file()
        self.segment += 1
        path = self.segment_path = segment_path(self.path, self.segment)
        self._seg_bytes = self._seg_lines = 0
        self._seg_opened = time.monotonic()
        try:
            self._file = self._opener(path)
        except OSError as e:
            self._fail(f"cannot open {path}: {e.strerror or e}")
        else:
            copies = [_segment_copy(item, self.segment) for item in self._configs.values()]
            if copies:
                self._render(copies)
                header, self._buffer.lines = self._buffer.lines, []
                self._buffer.failed = []
                if header:
                    text = b"\n".join(header) + b"\n"
                    self._write_chunk(text, 0, 0)
        if self.keeper is not None:
            self.keeper.closed(old)

    def _write_chunk(self, data: bytes | memoryview, n_lines: int, counted: int) -> None:
        """One ``write()`` of whole lines: ``n_lines`` lines (counted in the segment's
        lines, which make it due for rotation), the first ``counted`` of them events."""
        try:
            file = self._file
            if file is None:  # closed: as a write to a closed file
                raise ValueError("I/O operation on closed file")
            if os.fstat(file.fileno()).st_nlink == 0:
                raise OSError(f"{self.segment_path} was deleted")
            _write_all(file, data)
            self.written += counted
            self._seg_bytes += len(data)
            self._seg_lines += n_lines
        except (OSError, ValueError, AttributeError) as e:
            self.dropped_io += counted
            self._fail(f"cannot write {self.segment_path}: {getattr(e, 'strerror', None) or e}")

    def _close_file(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:  # a full disk at the last flush: nothing left to do with it
                pass
            self._file = None

    def _fail(self, why: str) -> None:
        if self._failure is None:
            self._failure = why
            logger.warning("vllm-probe: %s; events are dropped and counted from now on", why)
        self._close_file()

    def _run(self) -> None:
        while True:
            self._wake.wait(self._interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._drain()
            except Exception:  # never let the writer die silently
                logger.exception("vllm-probe: writer error")

    # -- shutdown ---------------------------------------------------------------------

    @property
    def dropped(self) -> int:
        """Events lost so far: queue full, write failed, or not encodable."""
        return self.dropped_full + self.dropped_io + self.dropped_encode

    def _stats_lines(self, written: int) -> list[bytes]:
        """The rendered ``probe_stats`` line for ``written`` events (with the lock held)."""
        errors, disabled = self._stats_extra() if self._stats_extra else ({}, [])
        mark = self.end_speed_mark_us
        self._stats_at = (written, self.dropped, mark)
        self._render([(PROBE_STATS, time.time(), self.engine, PROBE_STATS.pack(
            events_written=written, events_dropped=self.dropped, hook_errors=errors,
            hooks_disabled=disabled, speed_mark_us=mark))])
        lines, self._buffer.lines = self._buffer.lines, []
        self._buffer.failed = []
        return lines

    def _write_stats(self, wait: float = -1) -> None:
        if not self._drain_lock.acquire(timeout=wait):
            return
        try:
            if self._file is None:
                return
            lines = self._stats_lines(self.written)
            if lines:
                self._write_lines(lines, counted=0)
        finally:
            self._drain_lock.release()

    def checkpoint(self) -> None:
        """Write what is queued and a ``probe_stats`` line now; the file stays open.

        Called on SIGTERM/SIGINT (:func:`vllm_probe.engine.signals.on_stop_signals`): vLLM's
        shutdown may SIGKILL the engine core right after (0.32's process manager does
        when the engine core does not exit at once), before ``atexit`` runs. From here
        on the sink is *stopping*: the writer wakes every
        :data:`STOPPING_FLUSH_INTERVAL_S` and each of its writes ends with a
        ``probe_stats`` line; the last one in a file is final. Never raises.
        """
        if os.getpid() != self.pid or self._closed:
            return
        self._stopping = True
        self._interval = STOPPING_FLUSH_INTERVAL_S
        self._wake.set()  # the writer's current wait was for the old interval
        try:
            # the drain already ended with probe_stats if it wrote anything
            if self._drain(STALL_WAIT_S) and self._stats_due():
                self._write_stats(STALL_WAIT_S)
            # the events first (a SIGKILL may follow), then the few ms of the end's mark
            if self._mark_end():
                self._write_stats(STALL_WAIT_S)
        except Exception:
            logger.debug("vllm-probe: checkpoint failed", exc_info=True)

    def _stats_due(self) -> bool:
        """Whether the counts or the end's mark changed since the last ``probe_stats``."""
        return (self.written, self.dropped, self.end_speed_mark_us) != self._stats_at

    def _mark_end(self) -> bool:
        """Take the end's machine-speed mark if not taken yet; True when it was taken now."""
        if self._speed_mark is None or self.end_speed_mark_us is not None:
            return False
        self.end_speed_mark_us = self._speed_mark()
        return self.end_speed_mark_us is not None

    def close(self) -> None:
        """Drain the queue, write ``probe_stats`` and close the file. Idempotent."""
        if os.getpid() != self.pid:  # a forked child inherited this object
            return
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
        if not self._drain(STALL_WAIT_S):  # the writer is stuck in write(): leave it the file
            self.dropped_io += len(self._queue)
            self._queue.clear()
            logger.warning("vllm-probe: %d events written, %d dropped (the disk stopped responding)",
                           self.written, self.dropped)
            return
        try:
            self._mark_end()
            if self._stats_due():
                self._write_stats()
            if self._file is None and (self.dropped or self._failure):
                logger.warning(
                    "vllm-probe: %d events written, %d dropped (%s)",
                    self.written, self.dropped, self._failure or "queue full",
                )
        finally:
            self._close_file()


def _open_private(path: Path) -> BinaryIO:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    return os.fdopen(fd, "ab", buffering=0)
