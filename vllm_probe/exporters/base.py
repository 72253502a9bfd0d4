"""What an export format is, and where its output goes.

An exporter turns a run directory into one file (``vllm-probe export --format NAME``).
A new format is one module with a class following :class:`Exporter`, registered in
:func:`vllm_probe.exporters.exporters` (see docs/architecture.md); the CLI lists the
registry, so nothing else changes.

Output (:func:`output_stream`): a path, a ``.gz`` path (gzip-compressed), or ``-`` for
stdout; writes are buffered (1 MiB).
"""

from __future__ import annotations

import gzip
import io
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol
from collections.abc import Iterator

from ..runs.rundir import atomic_file

#: gzip level for ``.gz`` output: 6 is ~3x faster than the default 9 for 1-2 % more bytes.
GZIP_LEVEL = 6
#: Buffer of file and gzip outputs (bytes).
BUFFER_BYTES = 1 << 20


class ExportError(Exception):
    """A bad export request: unknown format or event kind, bad step range, filters on a
    format that takes none."""


@dataclass
class ExportResult:
    """What an exporter wrote.

    Attributes:
        written: items written (lines for ``jsonl``, trace events for ``perfetto``).
        matched: of those, the ones the request selected; the rest is context the
            format adds (``engine_config`` lines kept to read a filtered export). 0 means
            nothing matched (``vllm-probe export`` exits 1).
        unit: what an item is, for messages ("events", "trace events").
        note: one more line for the user, e.g. how to read the file back (None: none).
    """

    written: int = 0
    matched: int = 0
    unit: str = "events"
    note: str | None = None


class Exporter(Protocol):
    """One export format.

    Attributes:
        name: the ``--format`` value.
        default_file: file name inside the run directory when ``-o`` is not given.
        help: one line for ``--help``.
        takes_filters: whether ``--events/--request/--from-step/--to-step`` apply.
    """

    name: str
    default_file: str
    help: str
    takes_filters: bool

    def export(self, run_dir: Path, out: str | Path | BinaryIO, filters, stats) -> ExportResult:
        """Write the run to ``out`` (a path, ``-`` or a binary stream).

        Raises:
            NoEventsError: the run has no event file.
            ExportError: a bad request.
            OSError: the output cannot be written.
        """
        ...


@contextmanager
def output_stream(out: str | Path | BinaryIO) -> Iterator[BinaryIO]:
    """A buffered binary stream for ``out``: ``-`` is stdout, ``*.gz`` is gzip-compressed,
    a stream is used as it is (not closed). Flushed (and closed, for paths) on exit.

    Raises:
        OSError: the path cannot be opened.
    """
    if not isinstance(out, (str, Path)):
        yield out
        out.flush()
        return
    if str(out) == "-":
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    path = Path(out)
    # written whole and private like the run's own files (runs.rundir.atomic_file: a
    # temporary renamed when complete, mode 0600)
    with atomic_file(path) as raw:
        if path.suffix == ".gz":
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=GZIP_LEVEL) as gz, \
                    io.BufferedWriter(gz, BUFFER_BYTES) as f:
                yield f
            return
        f = io.BufferedWriter(raw, BUFFER_BYTES)
        yield f
        f.flush()
        f.detach()  # atomic_file closes the file itself
