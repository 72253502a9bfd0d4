"""Data-parallel ranks of a run: which event streams each rank wrote, and one rank's records.

vLLM runs one engine core per data-parallel rank, each with its own scheduler in its own
process (``EngineCoreProc``, ``vllm/v1/engine/core.py`` 0.32), and the probe writes one event
stream per engine core (``events-<pid>.jsonl`` and its segments) whose every event carries
``engine``, the rank. A stream's rank is the ``engine`` of its first record (its
``engine_config``); :func:`rank_records` still keeps only the records of the rank asked for,
so a stream that holds several ranks (several schedulers of one process writing to one sink,
as a test may drive them) is read right too.

Two streams of one rank are normal one after the other (an engine core restarted: the
second starts after the first ended). Two that ran *at the same time* are two engine cores
that both said rank 0: a dense model's independent ranks recorded by a probe that read
``parallel_config.data_parallel_rank``, which vLLM resets to 0 in every such rank
(``ParallelConfig.reconfigure_for_independent_dp_rank``, 0.32; ``data_parallel_index`` keeps
the rank). :attr:`Layout.clashes` names such ranks; their figures mix the engine cores.

Never raises for a bad file: an unreadable or empty stream has no rank and is left out.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .reader import ReadStats, iter_file_batches, iter_file_lines, iter_stream, parse_line
from .rundir import EventStream, event_streams, read_meta, write_meta

#: Bytes read from the end of a stream's last plain segment to find its last event's ``ts``.
TAIL_BYTES = 1 << 16


class RankError(ValueError):
    """A rank that the run does not hold, or a layout a command cannot take; one line."""


@dataclass(frozen=True)
class Layout:
    """The run's event streams by data-parallel rank.

    Attributes:
        ranks: rank → its streams, in name order (ranks sorted).
        spans: stream name → ``(first ts, last ts)`` of its events (epoch s), for the
            streams of ranks written by more than one stream.
        clashes: ranks whose streams ran at the same time (see the module docstring).
    """

    ranks: dict[int, tuple[EventStream, ...]] = field(default_factory=dict)
    spans: dict[str, tuple[float, float]] = field(default_factory=dict)
    clashes: tuple[int, ...] = ()

    @property
    def ids(self) -> list[int]:
        """The ranks, sorted."""
        return sorted(self.ranks)

    @property
    def multi(self) -> bool:
        """Whether the run has more than one data-parallel rank."""
        return len(self.ranks) > 1

    def streams(self, rank: int) -> tuple[EventStream, ...]:
        """The streams of ``rank``.

        Raises:
            RankError: the run has no such rank (the message names the ranks it has).
        """
        if rank not in self.ranks:
            have = ", ".join(str(r) for r in self.ids) or "none"
            raise RankError(f"no data-parallel rank {rank} in this run (its ranks: {have})")
        return self.ranks[rank]

    def clash_note(self) -> str | None:
        """One line when :attr:`clashes` is not empty, else None."""
        if not self.clashes:
            return None
        n = max(len(self.ranks[r]) for r in self.clashes)
        which = ", ".join(str(r) for r in self.clashes)
        return (f"{n} engine cores wrote data-parallel rank {which} at the same time (a dense model's independent "
                "ranks recorded by a probe that read parallel_config.data_parallel_rank, which vLLM resets to 0 "
                "in each): their figures are mixed; record again with this probe, which reads "
                "data_parallel_index")


def _first_record(stream: EventStream) -> Any | None:
    """The first readable record of ``stream`` (None: empty or unreadable)."""
    for rec in iter_stream(stream, ReadStats()):
        return rec
    return None


def _last_ts(stream: EventStream) -> float | None:
    """The ``ts`` of the last readable record of ``stream``: the tail of its last plain
    segment (a gzipped one is read whole); None when nothing is readable."""
    if not stream.segments:
        return None
    path = stream.segments[-1].path
    if stream.segments[-1].gz:
        last = None
        for batch in iter_file_batches(path, ReadStats()):
            last = batch[-1].ts
        return last
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(size - TAIL_BYTES, 0))
            lines = f.read().split(b"\n")
    except OSError:
        return None
    stats = ReadStats()
    for line in reversed(lines[1:] if len(lines) > 1 else lines):  # the first may be cut by the seek
        if line.strip():
            rec = parse_line(line + b"\n", stats)
            if rec is not None:
                return float(rec.ts)
    return None


def layout(run_dir: str | Path) -> Layout:
    """The run's streams by rank (see the module docstring), from each stream's first
    record (and the tail of the streams of a rank written by several). Never raises."""
    streams = event_streams(Path(run_dir))
    return layout_of(streams, {s.name: rec for s in streams if (rec := _first_record(s)) is not None}, _last_ts)


def layout_of(streams: list[EventStream], firsts: dict[str, Any],
              last_ts: Callable[[EventStream], float | None]) -> Layout:
    """The :class:`Layout` of ``streams`` given each one's first readable record (by stream
    name; a stream without one is left out) and ``last_ts``, the ``ts`` of a stream's last
    record (epoch s; None: unknown), asked only of ranks written by several streams. A
    reader that went through every record has both (:mod:`vllm_probe.analysis.reading`)."""
    ranks: dict[int, list[EventStream]] = {}
    starts: dict[str, float] = {}
    for stream in streams:
        rec = firsts.get(stream.name)
        if rec is None:
            continue
        ranks.setdefault(int(rec.engine or 0), []).append(stream)
        starts[stream.name] = float(rec.ts)
    spans: dict[str, tuple[float, float]] = {}
    clashes = []
    for rank, of_rank in ranks.items():
        if len(of_rank) < 2:
            continue
        for s in of_rank:
            last = last_ts(s)
            spans[s.name] = (starts[s.name], last if last is not None else starts[s.name])
        ordered = sorted(spans[s.name] for s in of_rank)
        if any(b[0] < a[1] for a, b in zip(ordered, ordered[1:])):
            clashes.append(rank)
    return Layout({r: tuple(ranks[r]) for r in sorted(ranks)}, spans, tuple(sorted(clashes)))


def rank_batches(streams: tuple[EventStream, ...] | list[EventStream], rank: int,
                 stats: ReadStats) -> Iterator[list]:
    """The records of ``rank`` in ``streams``, each stream's files in order, as lists (the
    batches of :func:`~vllm_probe.runs.reader.iter_file_batches`, records of other ranks
    left out; ``stats`` counts every line read)."""
    for stream in streams:
        for path in stream.paths:
            for batch in iter_file_batches(path, stats):
                kept = [rec for rec in batch if rec.engine == rank]
                if kept:
                    yield kept


def rank_records(stream: EventStream, rank: int, stats: ReadStats) -> Iterator[Any]:
    """The records of ``rank`` in one stream, in file order (:func:`~vllm_probe.runs.reader.iter_stream`)."""
    return (rec for rec in iter_stream(stream, stats) if rec.engine == rank)


def rank_view(run_dir: str | Path, rank: int, dest: str | Path, lay: Layout | None = None) -> Path:
    """A run directory at ``dest`` holding rank ``rank`` of the run in ``run_dir`` alone:
    each of its streams linked (a stream that also holds other ranks: its lines of this
    rank copied), and ``meta.json`` with ``rank_of`` (``{"run", "rank"}``). Every command
    reads it as a run of one engine core: the doctor's remedy search replays a rank there.

    Raises:
        RankError: the run has no such rank.
        OSError: ``dest`` cannot be written.
    """
    run_dir, dest = Path(run_dir), Path(dest)
    lay = lay or layout(run_dir)
    streams = lay.streams(rank)
    dest.mkdir(parents=True, exist_ok=True)
    for stream in streams:
        pure = all(rec.engine == rank for rec in iter_stream(stream, ReadStats()))
        for path in stream.paths:
            target = dest / path.name
            if pure:
                target.symlink_to(path.resolve())
                continue
            target = dest / path.name.removesuffix(".gz")  # the copy is plain text
            with open(target, "wb") as f:  # a shared stream: this rank's lines only, verbatim
                f.writelines(raw for rec, raw in iter_file_lines(path, ReadStats()) if rec.engine == rank)
    meta = read_meta(run_dir)
    meta["rank_of"] = {"run": str(run_dir), "rank": rank}
    write_meta(dest, meta)
    return dest


__all__ = ["Layout", "RankError", "TAIL_BYTES", "layout", "layout_of", "rank_batches", "rank_records", "rank_view"]
