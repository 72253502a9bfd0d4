"""The whole run, step by step, for a page: bounded buckets with every extreme kept.

:class:`PageSeries` is a :class:`~vllm_probe.analysis.state.StateListener`: attached to
the one :class:`~vllm_probe.analysis.state.RunState` (beside the doctor's episodes,
through :class:`~vllm_probe.analysis.state.Listeners`), it follows every step and keeps,
per engine core and in bounded memory:

* **buckets** (:class:`EngineSeries`): consecutive steps of equal width, at most
  :data:`MAX_BUCKETS`; when they would be exceeded neighbours merge and the width
  doubles (as the state's :class:`~vllm_probe.analysis.timeline.Timeline` does, whose 512
  spans keep sums and maxima only). Each bucket keeps, per figure, the least, the largest
  and the sum over its steps, so a chart drawn from them shows every extreme (a spike in
  one step of a wide bucket is its maximum) and the mean. A run of at most
  :data:`MAX_BUCKETS` steps keeps every step as it was.
* **preemption marks** (:class:`PreemptionMark`): every step that preempted, with its
  victims (request, tokens discarded, the request's preemption count), never merged: a
  chart marks each one (up to :data:`MARKS_KEEP`, then only counted; the buckets still
  sum them).
* **the longest prompts** (:class:`PromptTrack`): the :data:`LONGEST_PROMPTS` requests
  with the most prompt tokens, with every prefill chunk (step, time, ``[start, end)``,
  resumed or not), every preemption and their first token and finish.
* **finished requests' latencies** (:attr:`PageSeries.latencies`): one row per finished
  request (prompt length, priority, queue time, TTFT, mean inter-token time, end-to-end),
  the rows the summary's figures are made of (requests whose arrival is outside the
  window left out, as the summary leaves them out).

Cost per step: one tuple appended to the open bucket (its extremes are taken with
``min``/``max`` when the bucket closes); preemptions, chunks and finishes are per event.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

from .engine_state import EngineState
from .requests import RequestState
from .state import StateListener

#: Buckets kept per engine core (a page's chart has at most this many points per series).
MAX_BUCKETS = 4096
#: Preemption marks kept per run (beyond it they are counted in :attr:`PageSeries.marks_dropped`).
MARKS_KEEP = 100_000
#: Requests whose prefill chunks are followed (the longest prompts of the run).
LONGEST_PROMPTS = 8
#: Chunks and preemptions kept per followed request.
TRACK_EVENTS_KEEP = 4096

#: The figures of a step each bucket keeps, in the order of a bucket's tuples: tokens
#: scheduled, of them prefill and decode (tokens), the step's token budget (tokens), the
#: running and waiting queues after the step (requests), KV-cache use (0..1).
FIGURES = ("scheduled", "prefill", "decode", "budget", "running", "waiting", "kv")


@dataclass
class EngineSeries:
    """One engine core's steps in buckets of :attr:`width` consecutive steps, as columns
    (one entry per bucket, first to last).

    Attributes:
        engine: the data-parallel rank.
        width: steps per bucket (1 while the run has at most :data:`MAX_BUCKETS` steps).
        first_step, last_step: the bucket's steps (inclusive).
        first_ts, last_ts: the ``ts`` of its first and last step (epoch s).
        steps: steps in the bucket (the last one may hold fewer than ``width``).
        preemptions: requests preempted in the bucket's steps (the steps' ``preempted`` lists).
        lo, hi, total: per figure of :data:`FIGURES`, the least and largest value of one
            step, and the sum over the bucket's steps (:meth:`mean` divides it).
    """

    engine: int
    width: int = 1
    first_step: list[int] = field(default_factory=list)
    last_step: list[int] = field(default_factory=list)
    first_ts: list[float] = field(default_factory=list)
    last_ts: list[float] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    preemptions: list[int] = field(default_factory=list)
    lo: dict[str, list[float]] = field(default_factory=lambda: {f: [] for f in FIGURES})
    hi: dict[str, list[float]] = field(default_factory=lambda: {f: [] for f in FIGURES})
    total: dict[str, list[float]] = field(default_factory=lambda: {f: [] for f in FIGURES})

    def __len__(self) -> int:
        return len(self.first_step)

    def mean(self, figure: str) -> list[float]:
        """The per-step mean of ``figure`` in each bucket (its unit)."""
        return [t / n if n else 0.0 for t, n in zip(self.total[figure], self.steps)]

    def add(self, first_step: int, last_step: int, first_ts: float, last_ts: float, preemptions: int,
            rows: list[tuple[float, ...]]) -> None:
        """Close a bucket of ``rows`` (one tuple of :data:`FIGURES` per step)."""
        self.first_step.append(first_step)
        self.last_step.append(last_step)
        self.first_ts.append(first_ts)
        self.last_ts.append(last_ts)
        self.steps.append(len(rows))
        self.preemptions.append(preemptions)
        columns = list(zip(*rows))
        for name, col in zip(FIGURES, columns):
            self.lo[name].append(min(col))
            self.hi[name].append(max(col))
            self.total[name].append(sum(col))

    def halve(self) -> None:
        """Merge neighbouring buckets: half as many, twice as wide."""
        def pairs(values: list[Any], how: Any) -> list[Any]:
            merged = [how(a, b) for a, b in zip(values[0::2], values[1::2])]
            if len(values) % 2:
                merged.append(values[-1])
            return merged

        def first(a: Any, b: Any) -> Any:
            return a

        def last(a: Any, b: Any) -> Any:
            return b

        def add(a: Any, b: Any) -> Any:
            return a + b

        self.first_step, self.first_ts = pairs(self.first_step, first), pairs(self.first_ts, first)
        self.last_step, self.last_ts = pairs(self.last_step, last), pairs(self.last_ts, last)
        self.steps, self.preemptions = pairs(self.steps, add), pairs(self.preemptions, add)
        for name in FIGURES:
            self.lo[name] = pairs(self.lo[name], min)
            self.hi[name] = pairs(self.hi[name], max)
            self.total[name] = pairs(self.total[name], add)
        self.width *= 2


@dataclass(slots=True)
class Victim:
    """A request preempted in a step: its id, the computed tokens thrown away, its
    preemptions so far, its prompt and output tokens (None: the ``preempt`` event was
    not recorded, only the step's ``preempted`` list)."""

    req_id: str
    discarded_tokens: int | None = None
    num_preemptions: int | None = None
    prompt_len: int | None = None
    output_tokens: int | None = None


@dataclass(slots=True)
class PreemptionMark:
    """A step that preempted: engine core, step, its ``ts`` (epoch s), the victims, and
    the step's KV use (0..1) and queues after it (requests; None without step events)."""

    engine: int
    step: int
    ts: float
    victims: list[Victim]
    kv_usage: float | None = None
    running: int | None = None
    waiting: int | None = None


@dataclass
class PromptTrack:
    """One of the longest prompts, followed chunk by chunk.

    Attributes:
        engine, req_id, prompt_len: which request (tokens).
        arrival_ts, arrival_step: when it arrived (epoch s; the step before which it came).
        chunks: ``(step, ts, start, end, resumed)`` per prefill chunk, in order
            (``[start, end)`` prompt positions; resumed: a recompute after a preemption).
        preemptions: ``(step, ts)`` per preemption.
        first_token_step, first_token_ts, finished_ts: when known.
        events_dropped: chunks and preemptions beyond :data:`TRACK_EVENTS_KEEP`.
    """

    engine: int
    req_id: str
    prompt_len: int
    arrival_ts: float | None = None
    arrival_step: int | None = None
    chunks: list[tuple[int, float, int, int, bool]] = field(default_factory=list)
    preemptions: list[tuple[int, float]] = field(default_factory=list)
    first_token_step: int | None = None
    first_token_ts: float | None = None
    finished_ts: float | None = None
    finished_step: int | None = None
    events_dropped: int = 0


#: One finished request's row in :attr:`PageSeries.latencies`, in the order of :data:`LATENCY_FIELDS`.
LatencyRow = tuple[Any, ...]
#: What each latency row holds: prompt tokens, priority, queue time, TTFT, mean
#: inter-token time and end-to-end latency (s; None when unknown).
LATENCY_FIELDS = ("prompt_len", "priority", "queue_s", "ttft_s", "itl_s", "e2e_s")


class _Open:
    """The open bucket of one engine core."""

    __slots__ = ("first_step", "first_ts", "last_step", "last_ts", "preemptions", "rows")

    def __init__(self, step: int, ts: float) -> None:
        self.first_step = self.last_step = step
        self.first_ts = self.last_ts = ts
        self.preemptions = 0
        self.rows: list[tuple[float, ...]] = []


class PageSeries(StateListener):
    """Follows a run's steps into bounded series for a page (see the module docstring).

    Args:
        max_buckets: buckets kept per engine core (>= 2).
        longest: prompts followed chunk by chunk.
        marks_keep: preemption marks kept.
    """

    def __init__(self, max_buckets: int = MAX_BUCKETS, longest: int = LONGEST_PROMPTS,
                 marks_keep: int = MARKS_KEEP) -> None:
        self.max_buckets = max(max_buckets, 2)
        self.longest_n = longest
        self.marks_keep = marks_keep
        self.engines: dict[int, EngineSeries] = {}
        self._open: dict[int, _Open] = {}
        self.marks: list[PreemptionMark] = []
        self.marks_dropped = 0
        #: preempt events of the step not yet ended, per engine core
        self._pending: dict[int, list[tuple[int | None, float, Victim]]] = {}
        self.latencies: list[LatencyRow] = []
        #: (prompt_len, -order, (engine, req_id)): a min-heap of the followed requests
        self._heap: list[tuple[int, int, tuple[int, str]]] = []
        self._seen = 0
        self.tracks: dict[tuple[int, str], PromptTrack] = {}

    # -- steps -------------------------------------------------------------------------

    def on_step(self, eng: EngineState, ev: Any) -> None:
        idx = eng.engine
        step = ev.step if ev.step is not None else eng.last_step
        ts = ev.ts
        kv = ev.kv_usage or 0.0
        running = ev.running or 0
        waiting = ev.waiting or 0
        row = (ev.scheduled_tokens or 0, ev.prefill_tokens or 0, ev.decode_tokens or 0, ev.token_budget or 0,
               running, waiting, kv)
        bucket = self._open.get(idx)
        if bucket is None:
            bucket = self._open[idx] = _Open(step, ts)
            if idx not in self.engines:
                self.engines[idx] = EngineSeries(idx)
        bucket.rows.append(row)
        bucket.last_step, bucket.last_ts = step, ts
        preempted = ev.preempted
        pending = self._pending.get(idx)
        if preempted or pending:
            bucket.preemptions += len(preempted) if preempted else 0
            self._mark(idx, step, ts, preempted or [], pending or [], kv, running, waiting)
            if pending:
                self._pending[idx] = []
        if len(bucket.rows) >= self.engines[idx].width:
            self._close(idx)

    def _close(self, idx: int) -> None:
        bucket = self._open.pop(idx, None)
        if bucket is None or not bucket.rows:
            return
        series = self.engines[idx]
        series.add(bucket.first_step, bucket.last_step, bucket.first_ts, bucket.last_ts, bucket.preemptions,
                   bucket.rows)
        if len(series) >= self.max_buckets:
            series.halve()

    def _mark(self, idx: int, step: int, ts: float, preempted: list[str],
              pending: list[tuple[int | None, float, Victim]], kv: float | None, running: int | None,
              waiting: int | None) -> None:
        victims = [v for _, _, v in pending]
        known = {v.req_id for v in victims}
        victims += [Victim(rid) for rid in preempted if rid not in known]
        if len(self.marks) >= self.marks_keep:
            self.marks_dropped += 1
            return
        self.marks.append(PreemptionMark(idx, step, ts, victims, kv, running, waiting))

    def finish(self) -> None:
        """Close the open buckets and mark the preemptions no step event followed (call
        once the run has been read)."""
        for idx in list(self._open):
            self._close(idx)
        for idx, pending in self._pending.items():
            by_step: dict[int | None, list[tuple[int | None, float, Victim]]] = {}
            for entry in pending:
                by_step.setdefault(entry[0], []).append(entry)
            for step, entries in by_step.items():
                self._mark(idx, step if step is not None else -1, entries[0][1], [], entries, None, None, None)
        self._pending = {}
        self.marks.sort(key=lambda m: (m.engine, m.step))

    # -- requests ----------------------------------------------------------------------

    def on_preempt(self, eng: EngineState, req: RequestState, ev: Any) -> None:
        victim = Victim(req.req_id, ev.discarded_tokens, ev.num_preemptions, ev.prompt_len, ev.output_tokens)
        self._pending.setdefault(eng.engine, []).append((ev.step, ev.ts, victim))
        track = self.tracks.get((eng.engine, req.req_id))
        if track is not None:
            if len(track.preemptions) < TRACK_EVENTS_KEEP:
                track.preemptions.append((ev.step if ev.step is not None else eng.last_step, ev.ts))
            else:
                track.events_dropped += 1

    def on_added(self, eng: EngineState, req: RequestState, ev: Any) -> None:
        self._consider(eng.engine, req)

    def on_chunk(self, eng: EngineState, req: RequestState, ev: Any) -> None:
        key = (eng.engine, req.req_id)
        if req.arrival_ts is None and not ev.chunk_index and not ev.resumed:
            self._consider(eng.engine, req)  # no request_added read: request events off, or before the window
        track = self.tracks.get(key)
        if track is None:
            return
        if len(track.chunks) < TRACK_EVENTS_KEEP:
            start = ev.start or 0
            track.chunks.append((ev.step if ev.step is not None else eng.last_step + 1, ev.ts, start,
                                 start if ev.end is None else ev.end, bool(ev.resumed)))
        else:
            track.events_dropped += 1
        if req.first_token_step is not None and track.first_token_step is None:
            track.first_token_step = req.first_token_step

    def on_finished(self, eng: EngineState, req: RequestState) -> None:
        if not req.before_window:
            self.latencies.append((req.prompt_len, req.priority, req.queue_time_s, req.ttft_s, req.mean_itl_s,
                                   req.e2e_s))
        track = self.tracks.get((eng.engine, req.req_id))
        if track is not None:
            track.finished_ts = req.finished_ts
            track.finished_step = eng.last_step
            track.first_token_ts = req.first_token_ts
            track.first_token_step = req.first_token_step

    def _consider(self, idx: int, req: RequestState) -> None:
        key = (idx, req.req_id)
        if req.prompt_len is None:
            return
        self._seen += 1
        entry = (req.prompt_len, -self._seen, key)
        if len(self._heap) < self.longest_n:
            heapq.heappush(self._heap, entry)
        elif entry > self._heap[0]:
            evicted = heapq.heapreplace(self._heap, entry)
            self.tracks.pop(evicted[2], None)
        else:
            return
        self.tracks[key] = PromptTrack(idx, req.req_id, req.prompt_len, req.arrival_ts,
                                       None if req.before_window else req.arrival_step)

    def longest(self) -> list[PromptTrack]:
        """The followed requests, longest prompt first (earlier arrival first on ties);
        their first-token times are filled from the state's requests."""
        return [self.tracks[key] for _, _, key in sorted(self._heap, key=lambda e: (-e[0], -e[1]))
                if key in self.tracks]

    def fill_first_tokens(self, engines: dict[int, EngineState]) -> None:
        """First-token times of followed requests still in flight (read from the state)."""
        for (idx, rid), track in self.tracks.items():
            req = engines[idx].requests.get(rid) if idx in engines else None
            if req is not None:
                track.first_token_step = req.first_token_step
                track.first_token_ts = req.first_token_ts
