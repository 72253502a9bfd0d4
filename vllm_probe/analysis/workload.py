"""The workload of a recorded run: what a replay needs to serve the same requests again.

Pure (records in, plain data out): :func:`workload_of` reads one engine core's records
in file order; :func:`load_workload` reads a run directory through the reader. The
replay (:mod:`vllm_probe.sim.replay`), the step-time model (:mod:`vllm_probe.sim.stepmodel`)
and the timed-trace export (:mod:`vllm_probe.exporters.trace`) read the result.

Per request (numbered by the order of its ``request_added`` line: ``order``):

* ``prompt_len``, ``max_tokens``, ``priority``, ``arrival_ts`` (the front end's stamp),
  ``added_ts`` (the ``request_added`` line's ``ts``) and ``block_digests``;
* ``output_tokens``: the tokens it produced (``request_finished``); a request still
  running when the log ends (``unfinished``) is given what it produced so far, as the
  lifecycle model estimates it (:meth:`~vllm_probe.analysis.requests.RequestState.estimated_output_tokens`);
* ``add_before_step``: the ``schedule()`` call it was added before. The engine core is
  single-threaded and adds requests only between steps (``EngineCore._process_input_queue``,
  ``vllm/v1/engine/core.py`` 0.32), so a ``request_added`` line that follows the last
  line of step ``k - 1`` (any line carrying ``step``) was added before step ``k``;
* its **availability window** (:func:`availability_windows`) and whether it is
  **anchored** to its step index (the burst of an offline ``LLM.generate`` call).

Per step: its start (``ts - schedule_us``, epoch s), scheduled tokens and the step
event's counts; the chunks ``(step, order, chunk_index, start, end, last, resumed)`` and
the preemptions ``(step, order, discarded_tokens)`` (``reason`` ``kv_cache`` only) for the
step-time model and for exactness checks.

A data-parallel run's workload is one rank's (:func:`load_workload`'s ``rank``): the requests
the front end sent to that engine core, as it sent them; the balancing across ranks is
the recording's, not replayed.

Errors (:class:`WorkloadError`, one line naming the flag or the problem): no event file,
no ``engine_config``, no ``request_added`` (``scheduler_probe.log_request_events`` off),
no ``step`` events (``log_schedule_each_step`` off), several data-parallel ranks and no
rank chosen, a rank written by several engine cores (restarted, or two that both said
rank 0).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple
from collections.abc import Iterable

from ..runs.reader import ReadStats
from ..runs.rundir import event_streams
from ..schema.events import ENGINE_CONFIG
from .requests import RequestState
from .state import RunState


class WorkloadError(ValueError):
    """A run cannot be turned into a workload; the message is one line for the user."""


@dataclass
class WorkloadRequest:
    """One request of the workload. Times are epoch seconds, lengths tokens."""

    order: int
    req_id: str
    prompt_len: int
    max_tokens: int | None
    output_tokens: int  # produced (finished) or produced so far (unfinished, estimated)
    priority: int = 0
    arrival_ts: float | None = None  # the front end's stamp
    added_ts: float | None = None  # when the engine core's scheduler took it
    add_before_step: int = 0
    finish_reason: str | None = None  # None: still running when the log ended
    finish_step: int | None = None
    finish_ts: float | None = None
    block_digests: list[str] | None = None
    #: digests of the full blocks past the prompt's at its finish (its answer's blocks,
    #: ``request_finished.output_block_digests``): a later prompt that repeats them hits them
    output_digests: list[str] | None = None
    #: availability window, see :func:`availability_windows` (epoch s)
    idle_add: bool = False
    avail_lo: float | None = None
    avail_hi: float | None = None
    anchored: bool = False
    #: speculative decoding: ``"output index:proposed:accepted"`` per step that verified its
    #: drafts (``request_finished.draft_verifications``); None: no drafts recorded
    draft_verifications: list[str] | None = None
    #: the closed-loop client that sent it, a key of :attr:`Workload.clients` (set by
    #: :func:`vllm_probe.sim.arrivals.resolve`); None: sent at its recorded time
    client: int | None = None
    #: s from the finish that sent it to its stamp, as recorded (its client's think time
    #: and turnaround); None: its client's median
    think_s: float | None = None

    @property
    def unfinished(self) -> bool:
        return self.finish_reason is None

    @property
    def stamp(self) -> float:
        """The arrival stamp, else the time it was added (epoch s)."""
        return self.arrival_ts if self.arrival_ts is not None else self.added_ts  # type: ignore[return-value]


class StepRow(NamedTuple):
    """One recorded step: index, start (``ts - schedule_us``, epoch s), ``ts``,
    ``schedule_us`` (µs), scheduled tokens, and the step event's decode count (None
    when the chunk hook was off)."""

    step: int
    start: float
    ts: float
    schedule_us: float
    scheduled_tokens: int
    decode_reqs: int | None


class ChunkRow(NamedTuple):
    """One recorded prefill chunk, its request by ``order``; positions in tokens."""

    step: int
    order: int
    chunk_index: int
    start: int
    end: int
    last: bool
    resumed: bool


class PreemptRow(NamedTuple):
    """One recorded preemption by recompute (``reason`` ``kv_cache``)."""

    step: int
    order: int
    discarded_tokens: int


@dataclass
class Workload:
    """A run's workload and recorded schedule (one engine core).

    Attributes:
        source: the run directory (or trace file) it came from.
        config: the ``engine_config`` fields (a dict; absent fields left out).
        requests: by ``order``.
        steps, chunks, preempts: the recorded schedule (empty for a trace).
        last_step: the last step index any line named (-1: none).
        chunk_events: whether chunk events were recorded (the step-time model's
            attention terms and exactness checks need them).
        block_tokens: tokens per entry of the requests' ``block_digests`` (None: the
            engine's ``hash_block_size``; a timed trace's hash ids cover their own size).
        clients: the closed-loop clients the replay runs (the requests' ``client``).
    """

    source: str
    config: dict[str, Any]
    requests: list[WorkloadRequest]
    steps: list[StepRow] = field(default_factory=list)
    chunks: list[ChunkRow] = field(default_factory=list)
    preempts: list[PreemptRow] = field(default_factory=list)
    last_step: int = -1
    chunk_events: bool = True
    block_tokens: int | None = None
    #: closed-loop clients, ``{client: (requests in flight, median think time s)}``, as
    #: :func:`vllm_probe.sim.arrivals.resolve` found or was told them (empty: none)
    clients: dict[int, tuple[int, float]] = field(default_factory=dict)

    @property
    def t0(self) -> float:
        """Time origin: the first arrival stamp (epoch s)."""
        return min(r.stamp for r in self.requests)

    @property
    def unfinished(self) -> int:
        """Requests still running when the log ended."""
        return sum(r.unfinished for r in self.requests)

    @property
    def has_digests(self) -> bool:
        return any(r.block_digests for r in self.requests)

    def waited_in(self, first: int, last: int) -> tuple[str, ...]:
        """Ids of the requests that were in the waiting queue after at least one of steps
        ``first``..``last`` (added before a step of them, first scheduled after it), in
        arrival order; () without chunk events (the first scheduled step is not known)."""
        if not self.chunk_events:
            return ()
        started: dict[int, int] = {}
        for c in self.chunks:
            if c.step < started.get(c.order, 1 << 62):
                started[c.order] = c.step
        out = []
        for r in self.requests:
            s = started.get(r.order)
            if s is not None and s > r.add_before_step and r.add_before_step <= last and s - 1 >= first:
                out.append(r.req_id)
        return tuple(out)

    def lag_s(self) -> float:
        """Seconds from a request's front-end stamp to the start of the first step that
        could hold it: front-end processing, IPC to the engine core and its wake-up.

        The median of ``avail_hi - arrival_ts`` over requests that reached an idle
        engine core (they started a step as soon as they arrived); without one, the
        smallest such gap over all requests; 0 without arrival stamps.
        """
        gaps = [(r.avail_hi - r.arrival_ts, r.idle_add) for r in self.requests
                if r.arrival_ts is not None and r.avail_hi is not None]
        if not gaps:
            return 0.0
        idle = [g for g, was_idle in gaps if was_idle]
        return max(float(statistics.median(idle)) if idle else min(g for g, _ in gaps), 0.0)


def load_workload(run_dir: str | Path, stats: ReadStats | None = None, rank: int | None = None) -> Workload:
    """The workload of the run in ``run_dir`` (see the module docstring): of data-parallel
    rank ``rank`` (its own records, :func:`~vllm_probe.runs.ranks.rank_records`); None: the
    run's one rank. A run of one event stream is read by the command's one pass
    (:func:`vllm_probe.analysis.reading.read`), which gathers the workload beside the
    state; each call returns its own copy (the replay's arrivals change it).

    Raises:
        WorkloadError: no event file; several ranks and ``rank`` None; no such rank; a rank
            written by several engine cores; or what :func:`workload_of` raises.
    """
    from ..runs.ranks import RankError, layout, rank_records
    from ..runs.rundir import NoEventsError

    all_streams = event_streams(Path(run_dir))
    if not all_streams:
        raise WorkloadError(f"no event files (events-*.jsonl) in {run_dir}")
    reading = None
    if len(all_streams) == 1:
        from .reading import read

        try:
            reading = read(run_dir, "workload")
        except NoEventsError:
            raise WorkloadError(f"no readable event in the event files of {run_dir}") from None
    lay = reading.layout if reading is not None else layout(run_dir)
    if not lay.ranks:
        raise WorkloadError(f"no readable event in the event files of {run_dir}")
    if rank is None:
        if lay.multi:
            raise WorkloadError(f"{run_dir} holds {len(lay.ranks)} data-parallel ranks "
                                f"({', '.join(str(r) for r in lay.ids)}); a replay takes one rank's own requests "
                                "(--rank N)")
        rank = lay.ids[0]
    try:
        streams = lay.streams(rank)
    except RankError as e:
        raise WorkloadError(f"{run_dir}: {e}") from None
    if len(streams) > 1:
        why = lay.clash_note() if rank in lay.clashes else "an engine core restarted"
        raise WorkloadError(f"{run_dir}: data-parallel rank {rank} has {len(streams)} engine-core files ({why}); "
                            "a replay takes one engine core's")
    if reading is not None:  # the stream's own rank: the pass gathered it
        if stats is not None:
            stats.add(reading.stats)
        return reading.workload_copy()
    return workload_of(rank_records(streams[0], rank, stats or ReadStats()), str(run_dir))


def workload_of(records: Iterable[Any], source: str = "") -> Workload:
    """The workload of one engine core's records, in file order.

    Raises:
        WorkloadError: no ``engine_config``; no request or step events (the flag is named).
    """
    state = RunState(step_window=0)  # the lifecycle model, for unfinished requests
    builder = WorkloadBuilder()
    add = builder.add
    for rec in records:
        state.apply(rec)
        add(rec)
    return builder.workload(source, [r for eng in state.engines.values() for r in eng.requests.values()])


class WorkloadBuilder:
    """A workload gathered record by record (:meth:`add`, one engine core's records in
    file order), then built (:meth:`workload`): :func:`workload_of`, and the one pass
    of :mod:`vllm_probe.analysis.reading` that feeds these records to the state too.
    Memory: a row per step, chunk and preemption, a request per ``request_added``."""

    def __init__(self) -> None:
        self.config: dict[str, Any] | None = None
        self.reqs: dict[str, WorkloadRequest] = {}
        self.steps: list[StepRow] = []
        self.chunks: list[ChunkRow] = []
        self.preempts: list[PreemptRow] = []
        self.last_step = -1
        self.chunk_seen = False

    def add(self, rec: Any) -> None:
        """Take one record (the next of the engine core's, in file order)."""
        kind = rec.kind
        reqs = self.reqs
        if kind == "step":
            self.last_step = max(self.last_step, rec.step)
            self.steps.append(StepRow(rec.step, rec.ts - (rec.schedule_us or 0.0) * 1e-6, rec.ts,
                                      rec.schedule_us or 0.0, rec.scheduled_tokens or 0, rec.decode_reqs))
        elif kind == "chunk":
            self.chunk_seen = True
            self.last_step = max(self.last_step, rec.step)
            r = reqs.get(rec.req_id)
            if r is not None:
                self.chunks.append(ChunkRow(rec.step, r.order, rec.chunk_index, rec.start, rec.end,
                                            bool(rec.last), bool(rec.resumed)))
        elif kind == "preempt":
            self.last_step = max(self.last_step, rec.step)
            r = reqs.get(rec.req_id)
            if r is not None and (rec.reason or "kv_cache") == "kv_cache":
                self.preempts.append(PreemptRow(rec.step, r.order, rec.discarded_tokens or 0))
        elif kind == "request_added":
            if rec.req_id in reqs:
                return  # a streaming-input session re-adds its id: not a new request
            reqs[rec.req_id] = WorkloadRequest(
                order=len(reqs), req_id=rec.req_id, prompt_len=rec.prompt_len or 0,
                max_tokens=rec.max_tokens, output_tokens=0, priority=rec.priority or 0,
                arrival_ts=rec.arrival_ts, added_ts=rec.ts, add_before_step=self.last_step + 1,
                block_digests=list(rec.block_digests) if rec.block_digests else None,
            )
        elif kind == "request_finished":
            self.last_step = max(self.last_step, rec.step)
            r = reqs.get(rec.req_id)
            if r is not None:
                r.output_tokens = rec.output_tokens or 0
                r.finish_reason = rec.reason or "stop"
                r.finish_step = rec.step
                r.finish_ts = rec.ts
                r.output_digests = list(rec.output_block_digests) if rec.output_block_digests else None
                r.draft_verifications = getattr(rec, "draft_verifications", None) or None
        elif kind == ENGINE_CONFIG.name and self.config is None:
            self.config = {k: v for k, v in _fields(rec).items() if v is not None}

    def workload(self, source: str, in_flight: Iterable[RequestState]) -> Workload:
        """The :class:`Workload` of the records taken; ``in_flight``: the requests the
        lifecycle model (the state the same records were applied to) still holds
        unfinished at the end, whose output so far it estimates. Call once.

        Raises:
            WorkloadError: no ``engine_config``; no request or step events (the flag is named).
        """
        config, reqs, steps, last_step = self.config, self.reqs, self.steps, self.last_step
        if config is None:
            raise WorkloadError(f"{source}: no engine_config line (not a vllm-probe run, or cut before the engine "
                                "started)")
        flags = config.get("flags") or {}
        if not reqs:
            why = ("scheduler_probe.log_request_events was off" if flags.get("log_request_events") is False
                   else "no request reached the engine")
            raise WorkloadError(f"{source}: no request_added events ({why}); whatif needs them")
        if not steps:
            why = ("scheduler_probe.log_schedule_each_step was off" if flags.get("log_schedule_each_step") is False
                   else "the engine never stepped")
            raise WorkloadError(f"{source}: no step events ({why}); whatif fits its step-time model on them")
        for req_state in in_flight:  # still running when the log ended
            r = reqs.get(req_state.req_id)
            if r is not None and r.finish_reason is None:
                r.output_tokens = req_state.estimated_output_tokens(last_step) or 0
        w = Workload(source, config, list(reqs.values()), steps, self.chunks, self.preempts, last_step,
                     chunk_events=self.chunk_seen)
        availability_windows(w)
        return w


def _fields(rec: Any) -> dict[str, Any]:
    """The kind's own fields of a record (the common ``ts``, ``pid``, ``schema`` left out)."""
    return {f: getattr(rec, f) for f in rec.__struct_fields__ if f not in ("ts", "pid", "schema")}


def availability_windows(w: Workload) -> None:
    """When could each request have been taken by the engine core? Sets ``idle_add``,
    ``avail_lo``, ``avail_hi`` and ``anchored`` (times on the step-start base,
    ``start[k] = ts - schedule_us`` of step ``k``, epoch s).

    The engine core drains its input queue only between steps, just before
    ``schedule()``, so ``added_ts`` is censored: a request added before step ``k`` while
    the engine was busy became available somewhere in ``(start[k-1], start[k]]``. One
    that reached an idle engine core (nothing unfinished) woke it: step ``k`` began as
    soon as it could, so its availability is ``start[k]`` itself, and so is that of the
    others added before step ``k`` (the engine core drains its input queue once it wakes:
    they came after the one that woke it; a window reaching back to ``start[k-1]`` would
    let a replay start step ``k`` with one of them alone).

    *Anchored*: requests added before step 0 or 1 whose front-end stamp precedes the
    start of step 1: the burst of an offline ``LLM.generate`` call, whose first request
    starts step 0 while the others arrive during it (a race with the front end: in most
    recorded runs one request came before step 0 and the rest before step 1). A replay
    adds them before the same step index at any setting, so the recorded pattern is kept.
    """
    start = {s.step: s.start for s in w.steps}
    finished_by: dict[int, int] = {}
    for r in w.requests:
        if r.finish_step is not None:
            finished_by[r.finish_step + 1] = finished_by.get(r.finish_step + 1, 0) + 1
    fin_steps = sorted(finished_by.items())
    added = finished = fi = 0
    woken = None  # the step an idle engine core was woken for
    s1 = start.get(1)
    for r in sorted(w.requests, key=lambda r: (r.add_before_step, r.order)):
        k = r.add_before_step
        while fi < len(fin_steps) and fin_steps[fi][0] <= k:
            finished += fin_steps[fi][1]
            fi += 1
        r.idle_add = added == finished
        added += 1  # noqa: SIM113 - read above, before this request counts
        if r.idle_add:
            woken = k
        hi = start.get(k, r.added_ts)
        r.avail_hi = hi
        # drained with the request that woke the engine: it came after that one, by start[k]
        r.avail_lo = hi if (r.idle_add or k == woken or k - 1 not in start) else start[k - 1] + 1e-6
        r.anchored = k <= 1 and s1 is not None and r.arrival_ts is not None and r.arrival_ts <= s1
