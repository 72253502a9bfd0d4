"""One pass over a run directory's event files, kept for the rest of the command.

A command asks several questions of one recording: ``doctor`` its findings (the state and
the episodes), the replay's workload, the recorded summary with its notable moments and
per-request figures (:mod:`vllm_probe.analysis.objectives`); and of each replay's run
directory its summary, its per-request figures and, for the plan, its findings. Each
question used to read the event files again. :func:`read` answers them all from one
pass: every record is applied once to one :class:`~vllm_probe.analysis.state.RunState`
that the doctor's :class:`~vllm_probe.analysis.episodes.Episodes` follow, and each
stream's first and last record give the data-parallel :class:`~vllm_probe.runs.ranks.Layout`;
the same pass gathers the parts asked for. ``analyze_story``, ``story``, ``examine``,
``request_rows``/``measure`` and ``load_workload`` take their part of the same
:class:`Reading`.

The parts (:data:`PARTS`), asked by name because each costs what a command may not need:

* ``summary``: each finished request's latencies (memory per request) and the
  :class:`~vllm_probe.analysis.recompute.RecomputeListener` (a call per step, memory per
  request preempted and running), for :meth:`Reading.summary`;
* ``rows``: each finished request's :class:`~vllm_probe.analysis.requests.RequestState`
  (memory per request), what :func:`~vllm_probe.analysis.objectives.request_rows` gives;
* ``workload``: a run of one event stream tapped into its
  :class:`~vllm_probe.analysis.workload.Workload` (memory per step);

A reading that lacks a part asked for is read again with every part, so a command says
what it will need in its first call: ``doctor`` and ``tune`` replay (summary, rows,
workload), ``whatif`` replays (summary, workload), ``summary`` (summary).

A reading is found again by the run directory as named and each event file's (name, size,
mtime_ns), and ``meta.json``'s: a file that changed (a live run, a run directory written
anew) is read again.

Memory: at most :data:`CAPACITY` readings (an LRU), so a process holds a few runs' states,
requests and workloads, never one per replay. A search replays dozens of run directories,
each read once and asked its questions together (its summary, its figures, then perhaps
its findings): a few places serve them. The recording they replay asked for its workload
(replays never do), so the least recently used reading *without* a workload goes first:
the recording stays while its replays' readings come and go, and ``whatif``'s recorded
summary, read after the replays, is not a second read. Entries are not dropped when a
command ends (the process ends; a long-lived one keeps at most :data:`CAPACITY`), and a
changed file is read again. No prompt text is held: events carry none.

What a reading holds is shared by its callers and only read: the summary and the
workload, which callers change (the moments, the arrivals' clients), are built or
copied for each call.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..runs.ranks import Layout, layout_of
from ..runs.ranks import layout as streams_layout
from ..runs.reader import ReadStats, iter_file_batches
from ..runs.rundir import META_FILE, EventStream, NoEventsError, event_streams, never_started_note, read_meta
from .episodes import Episodes
from .recompute import RecomputeListener
from .requests import RequestState
from .state import Listeners, RunState
from .summary import FinishedRequests, apply_events, build_summary
from .summary_types import Summary
from .workload import Workload, WorkloadBuilder, WorkloadError

#: Readings kept (least recently used dropped first; see the module docstring).
CAPACITY = 4
#: What a pass gathers besides the state, its episodes and the layout, when asked.
PARTS = frozenset({"summary", "rows", "workload"})

#: (name, size in bytes, mtime in ns) of each event file, then of ``meta.json`` (None: absent)
_Key = tuple[tuple[tuple[str, int, int], ...], tuple[int, int] | None]


@dataclass
class Reading:
    """What one pass over a run directory gave (see the module docstring). Read it, never
    change it: every caller of the command shares it.

    Attributes:
        run_dir: the run directory as named by the first call.
        parts: the parts gathered (:data:`PARTS`).
        stats: what the pass read and skipped (lines, files).
        meta: the run's ``meta.json`` (``{}``: none).
        state: every record applied (``step_window=0``, no bucketed schedule times).
        episodes: the doctor's episodes, followed with the state.
        layout: the event streams by data-parallel rank.
        finished: each finished request's latencies, for :meth:`summary` (part ``summary``).
        rows: every finished request's :class:`~vllm_probe.analysis.requests.RequestState`,
            in finishing order (part ``rows``).
        recompute: recomputed positions by the probe's count and vLLM's (part ``summary``).
        workload: the workload of the run's one stream (part ``workload``; None: a run of
            several streams, or :attr:`workload_error`).
        workload_error: why the stream has no workload (a :class:`WorkloadError`'s line).
    """

    run_dir: str
    parts: frozenset[str]
    stats: ReadStats
    meta: dict[str, Any]
    state: RunState
    episodes: Episodes
    layout: Layout
    finished: FinishedRequests | None = None
    rows: list[RequestState] | None = None
    recompute: RecomputeListener | None = None
    workload: Workload | None = None
    workload_error: str | None = None

    def counted(self, stats: ReadStats | None) -> ReadStats:
        """``stats`` with this reading's counts added (None: a copy of them), as if the
        caller's own read had counted them."""
        stats = stats if stats is not None else ReadStats()
        stats.add(self.stats)
        return stats

    def summary(self, stats: ReadStats | None = None, boundaries: Iterable[int] | None = None,
                moments: bool = False) -> Summary:
        """A new :class:`~vllm_probe.analysis.summary_types.Summary` of the run, as
        :func:`~vllm_probe.analysis.summary.analyze` gives it (``stats``: the caller's,
        counted; ``boundaries`` in tokens); ``moments``: its notable moments filled, as
        :func:`~vllm_probe.analysis.summary.analyze_story` gives it.

        Raises:
            ValueError: part ``summary`` was not asked for.
        """
        if self.finished is None:
            raise ValueError(f"{self.run_dir}: read without its summary")
        s = build_summary(self.state, self.finished, self.counted(stats), str(Path(self.run_dir)),
                          copy.deepcopy(self.meta), boundaries, self.recompute)
        if moments:
            from .moments import notable_moments

            s.moments = [dataclasses.asdict(m) for m in notable_moments(self.state, self.episodes)]
        return s

    def workload_copy(self) -> Workload:
        """A copy of the workload of the run's one stream, the caller's to change.

        Raises:
            WorkloadError: the stream has none (its reason), or part ``workload`` was not asked for.
        """
        w = self.workload
        if w is None:
            raise WorkloadError(self.workload_error or f"{self.run_dir}: read without its workload")
        return dataclasses.replace(
            w, config=copy.deepcopy(w.config), requests=[dataclasses.replace(r) for r in w.requests],
            steps=list(w.steps), chunks=list(w.chunks), preempts=list(w.preempts), clients=dict(w.clients))


_readings: OrderedDict[str, tuple[_Key, Reading]] = OrderedDict()


def read(run_dir: str | Path, *parts: str) -> Reading:
    """The :class:`Reading` of the run in ``run_dir`` with ``parts`` (names of
    :data:`PARTS`, e.g. ``read(run, "summary", "rows")``): the one kept when the run's
    files are unchanged and it has them, else a new pass gathering them and every part the
    kept one had.

    Raises:
        ValueError: an unknown part.
        NoEventsError: no event file, or no readable event in them (as
            :func:`~vllm_probe.analysis.summary.analyze` says it).
    """
    asked = frozenset(parts)
    if not asked <= PARTS:
        raise ValueError(f"unknown reading parts {sorted(asked - PARTS)} (known: {sorted(PARTS)})")
    name = str(run_dir)
    streams = event_streams(Path(name))
    key = _key(Path(name), streams)
    kept = _readings.get(name)
    if kept is not None and kept[0] == key:
        if asked <= kept[1].parts:
            _readings.move_to_end(name)
            return kept[1]
        asked |= kept[1].parts
    if not streams:
        raise NoEventsError(f"no event files (events-*.jsonl) in {name}{never_started_note(read_meta(Path(name)))}")
    reading = _read(name, streams, asked)
    if reading.stats.events == 0:
        raise NoEventsError(f"no readable events in {name} ({reading.stats.describe()})")
    _readings[name] = (key, reading)
    _readings.move_to_end(name)
    while len(_readings) > CAPACITY:
        # the least recently used reading goes, one without a workload first: the recording
        # a command replays stays while its replays' readings come and go
        old = next((n for n, (_, r) in _readings.items() if "workload" not in r.parts), next(iter(_readings)))
        del _readings[old]
    return reading


def cached(run_dir: str | Path) -> Reading | None:
    """The kept :class:`Reading` of ``run_dir`` if its files are unchanged, else None
    (nothing is read)."""
    name = str(run_dir)
    kept = _readings.get(name)
    if kept is None or kept[0] != _key(Path(name), event_streams(Path(name))):
        return None
    return kept[1]


def clear() -> None:
    """Drop every kept reading (a benchmark timing the reading itself, a test counting reads)."""
    _readings.clear()


def _key(run_dir: Path, streams: list[EventStream]) -> _Key:
    """What tells a changed run from the one read: its files' names, sizes and mtimes."""
    files = []
    for stream in streams:
        for path in stream.paths:
            try:
                st = os.stat(path)
            except OSError:
                files.append((path.name, -1, -1))
                continue
            files.append((path.name, st.st_size, st.st_mtime_ns))
    try:
        st = os.stat(run_dir / META_FILE)
        meta: tuple[int, int] | None = (st.st_size, st.st_mtime_ns)
    except OSError:
        meta = None
    return tuple(files), meta


def _read(name: str, streams: list[EventStream], parts: frozenset[str]) -> Reading:
    """The pass: every stream's files in order, in batches, to one state and its listeners
    (a run's engine cores are kept apart by the state: no time-ordered merge needed)."""
    stats = ReadStats()
    episodes = Episodes()
    finished = FinishedRequests() if "summary" in parts else None
    rows: list[RequestState] | None = [] if "rows" in parts else None
    counts = RecomputeListener() if "summary" in parts else None
    on_finished: Callable[[RequestState], None] | None = finished
    if rows is not None:
        on_finished = rows.append if finished is None else _Both(finished, rows.append)
    state = RunState(step_window=0, on_request_finished=on_finished,
                     listener=episodes if counts is None else Listeners(episodes, counts), buckets=False)
    # the workload is one stream's: a run of several is replayed rank by rank, each its own read
    builder = WorkloadBuilder() if "workload" in parts and len(streams) == 1 else None
    tap = _Tap(builder)
    apply_events(state, tap.batches(streams, stats), batched=True)
    reading = Reading(name, parts, stats, read_meta(Path(name)), state, episodes,
                      layout_of(streams, tap.firsts, lambda s: tap.lasts.get(s.name)), finished, rows, counts)
    if builder is not None and tap.rank is not None:
        eng = state.engines.get(tap.rank)
        try:
            reading.workload = builder.workload(name, eng.requests.values() if eng is not None else ())
        except WorkloadError as e:
            reading.workload_error = str(e)
    return reading


class _Both:
    """The state's ``on_request_finished`` when the summary's latencies and the rows both
    take each finished request."""

    __slots__ = ("first", "second")

    def __init__(self, first: Any, second: Any) -> None:
        self.first, self.second = first, second

    def __call__(self, req: RequestState) -> None:
        self.first(req)
        self.second(req)


class _Tap:
    """What the pass notes of the batches on their way to the state: each stream's first
    record and last ``ts`` (its layout), and the records of the workload's rank (the
    engine of the stream's first record) for ``builder``."""

    def __init__(self, builder: WorkloadBuilder | None) -> None:
        self.builder = builder
        self.firsts: dict[str, Any] = {}
        self.lasts: dict[str, float] = {}
        self.rank: int | None = None

    def batches(self, streams: list[EventStream], stats: ReadStats) -> Iterator[list[Any]]:
        """Every stream's records, its files in order, as the reader's batches."""
        for stream in streams:
            for path in stream.paths:
                for batch in iter_file_batches(path, stats):
                    if stream.name not in self.firsts:
                        self.firsts[stream.name] = batch[0]
                        self.rank = batch[0].engine
                    self.lasts[stream.name] = batch[-1].ts
                    if self.builder is not None:
                        add, rank = self.builder.add, self.rank
                        for rec in batch:
                            if rec.engine == rank:  # a stream shared by several ranks: this one's
                                add(rec)
                    yield batch


def layout(run_dir: str | Path, *parts: str) -> Layout:
    """The run's data-parallel layout, for a command that reads the whole run next: from
    :func:`read`'s pass (with ``parts``) when the run is one event stream, else each
    stream's first record (:func:`vllm_probe.runs.ranks.layout`: the command reads rank by
    rank). Never raises for the run (an unreadable one: the empty layout)."""
    if len(event_streams(Path(run_dir))) == 1:
        try:
            return read(run_dir, *parts).layout
        except NoEventsError:
            return Layout()
    return streams_layout(run_dir)


__all__ = ["CAPACITY", "PARTS", "Reading", "cached", "clear", "layout", "read"]
