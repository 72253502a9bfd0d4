"""Merged, filtered JSONL export of a run (``vllm-probe export``).

Every engine core's ``events-<pid>.jsonl`` is read as a stream and merged by ``ts``
(``reader.iter_run_lines``: one pending line per file), filtered, and written verbatim
(each line exactly as the probe wrote it). Memory does not grow with the run's size:
besides one pending line per file, the step filter keeps one integer per engine core.

Filters (all optional, combined with AND):

* ``kinds``: keep only these event kinds (names of ``vllm_probe.schema.events.KINDS``).
* ``request``: keep only events whose ``req_id`` is this id. ``engine_config`` lines
  are kept too (they are the context needed to read the rest), unless ``kinds``
  excludes them.
* ``from_step`` / ``to_step`` (inclusive, per engine core; steps are 0-based and
  counted by each engine core): events with a ``step`` field are kept when it is in the
  range. Events without one (``request_added``, ``probe_stats``) belong to the step the
  engine core runs next (the latest ``step`` event's index + 1, as
  ``state.RequestState.arrival_step`` counts), and are kept when that is in the range.
  ``engine_config`` lines are always kept (context).

Output: a path (``.gz`` suffix → gzip-compressed), or ``-`` for stdout
(:func:`vllm_probe.exporters.base.output_stream`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO
from collections.abc import Iterable, Iterator

from ..runs.reader import ReadStats, iter_run_lines
from ..runs.rundir import NoEventsError, event_files
from ..schema.events import KINDS
from .base import ExportError, ExportResult, output_stream


@dataclass(frozen=True)
class Filters:
    """What to keep; None means no filter on that axis."""

    kinds: frozenset[str] | None = None
    request: str | None = None
    from_step: int | None = None
    to_step: int | None = None

    @classmethod
    def make(cls, kinds: str | Iterable[str] | None = None, request: str | None = None,
             from_step: int | None = None, to_step: int | None = None) -> Filters:
        """Validated filters; ``kinds`` may be a comma-separated string.

        Raises:
            ExportError: an unknown kind, a negative step or ``from_step > to_step``.
        """
        kind_set = None
        if kinds is not None:
            names = [k.strip() for k in (kinds.split(",") if isinstance(kinds, str) else kinds)]
            names = [k for k in names if k]
            unknown = sorted(set(names) - set(KINDS))
            if unknown:
                raise ExportError(f"unknown event kind(s): {', '.join(unknown)} (known: {', '.join(KINDS)})")
            if not names:
                raise ExportError("--events needs at least one kind")
            kind_set = frozenset(names)
        for name, v in (("--from-step", from_step), ("--to-step", to_step)):
            if v is not None and v < 0:
                raise ExportError(f"{name} must be >= 0, got {v}")
        if from_step is not None and to_step is not None and from_step > to_step:
            raise ExportError(f"--from-step {from_step} is after --to-step {to_step}")
        return cls(kind_set, request, from_step, to_step)

    @property
    def active(self) -> bool:
        return any(v is not None for v in (self.kinds, self.request, self.from_step, self.to_step))


def filter_lines(pairs: Iterable[tuple[Any, bytes]], f: Filters) -> Iterator[tuple[Any, bytes]]:
    """Apply ``f`` to a time-ordered stream of ``(record, raw line)`` pairs
    (``reader.iter_run_lines``)."""
    if not f.active:
        yield from pairs
        return
    kinds, request = f.kinds, f.request
    lo = f.from_step if f.from_step is not None else 0
    hi = f.to_step if f.to_step is not None else float("inf")
    by_step = f.from_step is not None or f.to_step is not None
    last_step: dict = {}  # engine -> index of its latest step event
    for pair in pairs:
        ev = pair[0]
        kind = ev.kind
        if by_step and kind == "step":
            st = ev.step
            if st is not None and st > last_step.get(ev.engine, -1):
                last_step[ev.engine] = st
        if kinds is not None and kind not in kinds:
            continue
        if kind == "engine_config":
            yield pair
            continue
        if request is not None and getattr(ev, "req_id", None) != request:
            continue
        if by_step:
            st = getattr(ev, "step", None)
            if st is None:
                st = last_step.get(ev.engine, -1) + 1
            if not lo <= st <= hi:
                continue
        yield pair


def export_jsonl(run_dir: str | Path, out: str | Path | BinaryIO, filters: Filters | None = None,
                 stats: ReadStats | None = None) -> ExportResult:
    """Write the run's events, merged by time and filtered, as JSON lines.

    Args:
        run_dir: the run directory.
        out: output path (``.gz`` compressed, ``-`` stdout) or a binary stream.
        filters: what to keep (default: everything).
        stats: receives the read/skip counts.

    Returns:
        Lines written; ``matched`` leaves out the ``engine_config`` lines kept only as
        context for a request or step filter.

    Raises:
        NoEventsError: the run has no event file.
        OSError: the output cannot be written.
    """
    run_dir = Path(run_dir)
    stats = stats if stats is not None else ReadStats()
    if not event_files(run_dir):
        raise NoEventsError(f"no event files (events-*.jsonl) in {run_dir}")
    filters = filters or Filters()
    pairs = filter_lines(iter_run_lines(run_dir, stats), filters)
    context_kind = "engine_config" if filters.active and filters.kinds is None else None
    written = context = 0
    with output_stream(out) as stream:
        write = stream.write
        for ev, raw in pairs:
            write(raw)
            written += 1
            if ev.kind == context_kind:
                context += 1
    return ExportResult(written=written, matched=written - context, unit="events")


class JsonlExporter:
    """``--format jsonl``: the run's lines, verbatim, merged by time and filtered."""

    name = "jsonl"
    default_file = "events.jsonl"
    help = "merged event lines, verbatim (default)"
    takes_filters = True

    def export(self, run_dir: Path, out: str | Path | BinaryIO, filters: Filters | None,
               stats: ReadStats) -> ExportResult:
        return export_jsonl(run_dir, out, filters, stats)
