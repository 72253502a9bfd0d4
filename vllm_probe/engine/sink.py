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
import logging
import os
import threading
import time
from collections import deque
from multiprocessing import util as mp_util
from pathlib import Path
from typing import Any, BinaryIO
from collections.abc import Callable

import structlog

from ..schema.events import ENGINE_CONFIG, PROBE_STATS, EventKind
from .encoding import Deferred, JSONLines, LineBuffer, QueuedEvent, event_dicts
from .segments import SegmentKeeper, compress_segment, open_private, segment_copy, segment_path, write_all

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
        self._opener = opener or open_private
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
        self._buffer = LineBuffer()
        self._log = structlog.wrap_logger(
            self._buffer,
            processors=[event_dicts, JSONLines()],
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
            copies = [segment_copy(item, self.segment) for item in self._configs.values()]
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
            write_all(file, data)
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


__all__ = ["FLUSH_INTERVAL_S", "STALL_WAIT_S", "STOPPING_FLUSH_INTERVAL_S", "WRITE_BATCH", "Deferred", "EventSink",
           "SegmentKeeper", "compress_segment", "segment_path"]
