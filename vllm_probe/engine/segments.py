"""A run's event files in segments: their names, gzip on close, and what is kept.

Segment 1 of an engine core is ``events-<pid>.jsonl``, segment n ``events-<pid>.<n>.jsonl``.
A closed segment goes to :class:`SegmentKeeper`'s thread, off the scheduler's and the
writer's path: gzipped (``.gz.tmp``, renamed to ``.jsonl.gz``, then the ``.jsonl`` removed;
a crash in between leaves a readable file) and the oldest closed segments removed
(``keep_mb`` / ``keep_hours``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import zlib
from collections import deque
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from .encoding import QueuedEvent

logger = logging.getLogger("vllm_probe")

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
                write_all(out, deflate.compress(view[:n]))
            write_all(out, deflate.flush())
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


def write_all(out: BinaryIO, data: bytes | memoryview) -> None:
    """All of ``data`` to an unbuffered file (``FileIO.write`` may write less)."""
    view = memoryview(data)
    while view:
        view = view[out.write(view):]


def open_private(path: Path) -> BinaryIO:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    return os.fdopen(fd, "ab", buffering=0)


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


def segment_copy(item: QueuedEvent, n: int) -> QueuedEvent:
    """The queued ``engine_config`` event ``item`` marked ``segment: n`` (same ``ts``)."""
    kind, ts, engine, values = item
    if type(values) is tuple:
        names = kind.field_names
        padded = list(values) + [None] * (len(names) - len(values))
        padded[names.index("segment")] = n
        return (kind, ts, engine, tuple(padded))
    return (kind, ts, engine, msgspec.structs.replace(values, segment=n))


__all__ = ["COMPRESS_CHUNK", "GZIP_LEVEL", "SegmentKeeper", "compress_segment", "open_private", "segment_copy",
           "segment_path", "write_all"]
