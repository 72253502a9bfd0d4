"""Where events go: a bounded in-memory queue drained by a writer thread into JSON lines.

The scheduler's thread only appends a tuple to a deque (:meth:`EventSink.emit`, well
under a microsecond); building the JSON object, encoding it (structlog's
``JSONRenderer``) and writing happen on the writer thread, which wakes every
:data:`FLUSH_INTERVAL_S`. Each wake-up writes whole lines with one ``write()`` on an
unbuffered file, so a SIGKILL leaves only complete lines and loses at most the events of
the last interval.

Faults never reach vLLM: a full queue, an unwritable directory, a full disk or a deleted
file turn into counted drops and one warning line; the final ``probe_stats`` line (or,
when the file cannot be written, a warning on stderr) reports them.
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
from typing import Any, Callable, Iterable

import structlog

from .events import PROBE_STATS, SCHEMA_VERSION, EventKind

logger = logging.getLogger("vllm_probe")

#: Longest time an event waits in memory before it is written (seconds). A SIGKILL loses
#: at most this much; SIGTERM/SIGINT and normal exits lose nothing.
FLUSH_INTERVAL_S = 0.1

#: Queue item: (kind, wall-clock ts in s, data-parallel rank, values in kind.fields order).
QueuedEvent = tuple[EventKind, float, int, tuple[Any, ...]]


class _LineBuffer:
    """structlog "logger" that collects rendered lines for one batched write."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def msg(self, line: str) -> None:
        self.lines.append(line)


class EventSink:
    """One JSON-lines file per process, fed through a bounded queue.

    Args:
        path: the ``events-<pid>.jsonl`` file to create (mode 0600; appended to if it
            exists).
        capacity: most events held in memory; beyond it :meth:`emit` drops and counts.
        stats_extra: called at close; returns ``(hook_errors, hooks_disabled)`` for the
            final ``probe_stats`` line.
        opener: opens ``path`` for binary appending; tests pass one that fails.
    """

    def __init__(
        self,
        path: Path,
        capacity: int = 65536,
        stats_extra: Callable[[], tuple[dict[str, int], list[str]]] | None = None,
        opener: Callable[[Path], Any] | None = None,
        flush_interval_s: float = FLUSH_INTERVAL_S,
    ) -> None:
        self.path = Path(path)
        self.pid = os.getpid()
        self._queue: deque[QueuedEvent] = deque()
        self._capacity = capacity
        self._stats_extra = stats_extra
        self._interval = flush_interval_s
        self.dropped_full = 0  # incremented on the scheduler thread only
        self.dropped_io = 0  # incremented on the writer thread only
        self.written = 0
        self._failure: str | None = None
        self._closed = False
        self._close_lock = threading.Lock()
        # the writer thread vs. flush()/close()/checkpoint(); re-entrant because a stop
        # signal's checkpoint may interrupt the main thread inside close()
        self._drain_lock = threading.RLock()
        self._stats_at: tuple[int, int] | None = None  # (written, dropped) at the last probe_stats
        self._stop = threading.Event()
        self._buffer = _LineBuffer()
        self._log = structlog.wrap_logger(
            self._buffer,
            processors=[self._order_fields, structlog.processors.JSONRenderer()],
            wrapper_class=structlog.BoundLogger,
        )
        self._file = None
        try:
            self._file = (opener or _open_private)(self.path)
        except OSError as e:
            self._fail(f"cannot open {self.path}: {e.strerror or e}")
        self._thread = threading.Thread(target=self._run, name="vllm-probe-writer", daemon=True)
        self._thread.start()
        # atexit covers spawned processes and the main process; multiprocessing's
        # finalizers also run in forked children, which skip atexit.
        atexit.register(self.close)
        mp_util.Finalize(self, self.close, exitpriority=100)

    # -- scheduler thread -------------------------------------------------------------

    def emit(self, kind: EventKind, ts: float, engine: int, values: tuple[Any, ...]) -> None:
        """Queue one event; never blocks, never raises. Drops (counted) when full."""
        q = self._queue
        if len(q) < self._capacity:
            q.append((kind, ts, engine, values))
        else:
            self.dropped_full += 1

    # -- writer thread ----------------------------------------------------------------

    @staticmethod
    def _order_fields(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        # structlog puts "event" last; the schema's readers expect it first.
        return {"event": event_dict.pop("event"), **event_dict}

    def _render(self, items: Iterable[QueuedEvent]) -> None:
        log = self._log
        pid = self.pid
        for kind, ts, engine, values in items:
            payload: dict[str, Any] = {"ts": ts, "pid": pid, "engine": engine, "schema": SCHEMA_VERSION}
            for f, v in zip(kind.fields, values):
                if v is None and f.optional:
                    continue
                payload[f.name] = v
            log.msg(kind.name, **payload)

    def flush(self) -> None:
        """Write everything queued so far, on the caller's thread (tests, benchmarks)."""
        self._drain()

    def _drain(self) -> None:
        with self._drain_lock:
            self._drain_locked()

    def _drain_locked(self) -> None:
        q = self._queue
        n = len(q)
        if not n:
            return
        batch = [q.popleft() for _ in range(n)]
        if self._file is None:
            self.dropped_io += n
            return
        self._render(batch)
        lines, self._buffer.lines = self._buffer.lines, []
        self._write_lines(lines, counted=n)

    def _write_lines(self, lines: list[str], counted: int) -> None:
        data = ("\n".join(lines) + "\n").encode()
        try:
            if os.fstat(self._file.fileno()).st_nlink == 0:
                raise OSError(f"{self.path} was deleted")
            view = memoryview(data)
            while view:  # FileIO.write may write less than asked
                view = view[self._file.write(view):]
            self.written += counted
        except (OSError, ValueError) as e:
            self.dropped_io += counted
            self._fail(f"cannot write {self.path}: {getattr(e, 'strerror', None) or e}")

    def _fail(self, why: str) -> None:
        if self._failure is None:
            self._failure = why
            logger.warning("vllm-probe: %s; events are dropped and counted from now on", why)
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._drain()
            except Exception:  # never let the writer die silently
                logger.exception("vllm-probe: writer error")

    # -- shutdown ---------------------------------------------------------------------

    @property
    def dropped(self) -> int:
        return self.dropped_full + self.dropped_io

    def _write_stats(self) -> None:
        with self._drain_lock:
            if self._file is None:
                return
            errors, disabled = self._stats_extra() if self._stats_extra else ({}, [])
            self._stats_at = (self.written, self.dropped)
            self._render([(PROBE_STATS, time.time(), 0, (self.written, self.dropped, errors, disabled))])
            lines, self._buffer.lines = self._buffer.lines, []
            self._write_lines(lines, counted=0)

    def checkpoint(self) -> None:
        """Write what is queued and a ``probe_stats`` line now; the file stays open.

        Called on SIGTERM/SIGINT (:func:`vllm_probe.signals.on_stop_signals`): vLLM's
        shutdown may SIGKILL the engine core right after (0.32's process manager does
        when the engine core does not exit at once), before ``atexit`` runs. Events
        emitted later are followed by another ``probe_stats`` at :meth:`close`; the
        last one in a file is final. Never raises.
        """
        if os.getpid() != self.pid or self._closed:
            return
        try:
            self._drain()
            self._write_stats()
        except Exception:
            logger.debug("vllm-probe: checkpoint failed", exc_info=True)

    def close(self) -> None:
        """Drain the queue, write ``probe_stats`` and close the file. Idempotent."""
        if os.getpid() != self.pid:  # a forked child inherited this object
            return
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
        try:
            self._drain()
            if (self.written, self.dropped) != self._stats_at:
                self._write_stats()
            if self._file is None and (self.dropped or self._failure):
                logger.warning(
                    "vllm-probe: %d events written, %d dropped (%s)",
                    self.written, self.dropped, self._failure or "queue full",
                )
        finally:
            if self._file is not None:
                try:
                    self._file.close()
                except OSError:
                    pass
                self._file = None


def _open_private(path: Path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    return os.fdopen(fd, "ab", buffering=0)
