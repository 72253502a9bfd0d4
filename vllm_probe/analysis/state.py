"""Scheduler state rebuilt from events: per engine, per step (rolling), per request.

The one request-lifecycle model: it feeds the dashboard, the ``--plain`` lines, the
summary, compare and the Perfetto export, so every view agrees on what "queue time" or
"time to first token" means. Memory is bounded for a run of any length: steps are kept
in a rolling window, finished requests in a bounded list, run totals as counters,
exact histograms and bucketed ones (:class:`~vllm_probe.analysis.figures.Buckets`, for
values as many as the steps or requests: schedule() time, queue time, time to first
token); a consumer that needs every finished request (the summary) sets
``RunState.on_request_finished``, one that follows every transition (the Perfetto export) a
:class:`StateListener`. Events come in as the records of
:mod:`vllm_probe.schema.records` (what the reader yields) or as dicts (hand-made
streams), which are converted first.

Requests and their timings: :mod:`vllm_probe.analysis.requests`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from ..schema.events import HEAD_BLOCKED_REASONS
from ..schema.records import STRUCTS, from_dict
from .figures import (
    LATENCY_S_BOUNDS, LIMITS, PREEMPT_REASONS, SCHEDULE_S_BOUNDS, Buckets, budget_use, bound_by,
    chunk_reread_tokens, per_second, preempt_reason, share,
)
from .requests import DECODE, FINISHED, PREEMPTED, PREFILL, WAITING, RequestState
from .timeline import MAX_SPANS, Timeline

#: Default number of recent steps kept per engine.
STEP_WINDOW = 600
#: Default number of finished requests kept per engine.
FINISHED_KEEP = 200
#: Default number of recent preemptions kept per engine.
PREEMPT_KEEP = 50
#: ``request_added`` fields counted per value (:attr:`EngineState.sampling_seen`).
SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p")
#: Distinct values counted per field in :attr:`EngineState.priorities` and
#: :attr:`EngineState.sampling_seen`; further ones count under :data:`OTHER_VALUES`
#: (memory stays bounded whatever the clients send).
DISTINCT_KEEP = 64
OTHER_VALUES = "other"



@dataclass(slots=True)
class StepRecord:
    """The numbers of one step kept in the rolling window."""

    step: int
    ts: float
    scheduled: int
    budget: int
    prefill_tokens: int | None
    decode_tokens: int | None
    running: int
    waiting: int
    kv_usage: float
    schedule_us: float
    preempted: int
    bound: str
    head_blocked: str | None = None  # step.head_blocked_by (None: nothing waited, or not recorded)


#: What a ``head_blocked_by`` value a newer probe may write (not one of
#: :data:`~vllm_probe.schema.events.HEAD_BLOCKED_REASONS`) is counted as.
OTHER_REASON = "other"
_KNOWN_REASONS = frozenset(HEAD_BLOCKED_REASONS)


@dataclass
class WindowStats:
    """Figures over the recent steps of one engine (its rolling window).

    Rates are per second of event time (``ts``), so they are the same live, on a
    finished run and in a replay.
    """

    steps: int = 0  # step records in the window
    first_step: int | None = None
    last_step: int | None = None
    span_s: float = 0.0  # ts of the last step minus ts of the first, s
    step_rate: float | None = None  # steps/s; None with fewer than 2 steps or zero span
    token_rate: float | None = None  # scheduled tokens/s (the first step's tokens excluded)
    schedule_us_mean: float | None = None  # µs inside schedule()
    schedule_us_max: float | None = None  # µs
    scheduled_tokens: int = 0  # tokens
    budget_tokens: int = 0  # sum of the steps' token budgets, tokens
    prefill_tokens: int = 0  # tokens
    decode_tokens: int = 0  # tokens
    preemptions: int = 0  # requests preempted in the window's steps
    preempt_rate: float | None = None  # preemptions/s
    bound_counts: dict[str, int] = field(default_factory=lambda: {k: 0 for k in LIMITS})

    @property
    def budget_use(self) -> float | None:
        """Scheduled tokens / token budget over the window (0..1)."""
        return budget_use(self.scheduled_tokens, self.budget_tokens)

    @property
    def preempt_per_100_steps(self) -> float | None:
        return 100.0 * self.preemptions / self.steps if self.steps else None


@dataclass(slots=True)
class EngineState:
    """One engine core (data-parallel rank): the latest records, run totals (tokens,
    requests, events), a rolling window of steps and the requests in flight."""

    engine: int
    step_window: int = STEP_WINDOW
    finished_keep: int = FINISHED_KEEP
    timeline_spans: int = MAX_SPANS
    #: the ``engine_config`` record (None until it is read)
    config: Any = None
    pids: set[int] = field(default_factory=set)
    first_ts: float | None = None
    last_ts: float | None = None
    last_step: int = -1
    #: the latest ``step`` record (None before the first step)
    latest: Any = None
    steps: int = 0
    scheduled_tokens: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    schedule_us_total: float = 0.0
    schedule_us_max: float = 0.0
    #: seconds inside ``schedule()`` per step (steps with ``schedule_us``)
    schedule_s: Buckets = field(default_factory=lambda: Buckets(SCHEDULE_S_BOUNDS))
    #: exact histogram of the steps' ``(scheduled_tokens, token_budget)`` (absent: 0) -> steps;
    #: its size is bounded by the distinct pairs, not by the number of steps
    step_tokens: dict[tuple[int, int], int] = field(default_factory=dict)
    stepping_since: float | None = None  # earliest step start (ts - schedule_us), epoch s
    last_step_ts: float | None = None  # latest ts of a step event, epoch s
    preemptions: int = 0  # preempt events
    #: preempt events and their discarded tokens by ``reason`` (figures.preempt_reason)
    preemptions_by_reason: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PREEMPT_REASONS, 0))
    discarded_by_reason: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PREEMPT_REASONS, 0))
    step_preemptions: int = 0  # ids in the steps' ``preempted`` lists (right with preempt events off)
    requests_preempted: int = 0  # distinct requests preempted at least once
    discarded_tokens: int = 0
    recomputed_tokens: int = 0  # tokens of chunks in resumed (recompute) passes
    chunks: int = 0
    chunk_tokens: int = 0  # tokens of every prefill chunk (end - start)
    reread_kv_tokens: int = 0  # figures.chunk_reread_tokens summed over chunks (seed §3.4)
    prefix_hit_tokens: int = 0  # served by the prefix cache on first passes' first chunks
    first_passes: int = 0  # first passes started (first chunks of requests not resumed)
    first_pass_prompt_tokens: int = 0  # prompt_len of those first chunks: what the hits are a share of
    requests_with_prefix_hits: int = 0  # first passes that started with a prefix-cache hit
    #: re-admissions after a preemption (resumed passes): their number, the prefill_len they
    #: had to compute again, and the part of it the prefix cache served (their first chunks)
    resumed_passes: int = 0
    resumed_prefill_tokens: int = 0
    resumed_prefix_hit_tokens: int = 0
    #: prefix-cache hits of the first chunks scheduled in step :attr:`hits_step` (tokens;
    #: :meth:`prefix_hits_in_step`, the ``--plain`` line's "hit")
    hits_step: int | None = None
    step_prefix_hits: int = 0
    #: exact histogram: chunks of the prefill pass that produced a prompt's first token -> prompts
    first_pass_chunks: dict[int, int] = field(default_factory=dict)
    requests_added: int = 0
    requests_finished: int = 0
    #: exact histogram of the steps' ``(running, waiting)`` queue lengths (requests) -> steps
    #: (one dict update per step; bounded by the distinct pairs)
    queue_steps: dict[tuple[int, int], int] = field(default_factory=dict)
    #: exact histogram: requests preempted in one step (its ``preempted`` list) -> steps, for steps with any
    preempted_steps: dict[int, int] = field(default_factory=dict)
    #: requests by ``request_added.priority`` (requests)
    priorities: dict[int | str, int] = field(default_factory=dict)
    #: what the requests asked for (``request_added``): field -> value -> requests, for
    #: :data:`SAMPLING_FIELDS` (compared with a settings file's ``sampling`` section)
    sampling_seen: dict[str, dict[Any, int]] = field(default_factory=lambda: {k: {} for k in SAMPLING_FIELDS})
    #: seconds of queue time / time to first token (definitions in analysis/requests.py),
    #: each counted once per request as soon as it is known (finished or not)
    queue_s: Buckets = field(default_factory=lambda: Buckets(LATENCY_S_BOUNDS))
    ttft_s: Buckets = field(default_factory=lambda: Buckets(LATENCY_S_BOUNDS))
    bound_counts: dict[str, int] = field(default_factory=lambda: {k: 0 for k in LIMITS})
    #: steps per ``step.head_blocked_by`` reason (why the head of the waiting queue was not
    #: admitted; :data:`~vllm_probe.schema.events.HEAD_BLOCKED_REASONS`, an unknown value as
    #: :data:`OTHER_REASON`); steps without the field (nothing waited, or an older probe)
    #: are not counted. Read by the summary's shares and the metrics
    #: (``vllm_probe_steps_by_head_blocked_total``).
    head_blocked_counts: dict[str, int] = field(default_factory=dict)
    #: the latest ``probe_stats`` record of each file, by pid (counts are cumulative per
    #: file, and a stopping engine core writes one with every flush: the last one is final)
    probe_stats: dict[Any, Any] = field(default_factory=dict)
    window: deque = field(init=False)
    #: every step of the run, in bounded spans (the finished run's overview, evidence ranges)
    timeline: Timeline = field(init=False)
    recent_preempts: deque = field(init=False)
    requests: dict[str, RequestState] = field(default_factory=dict)
    finished: deque = field(init=False)
    _awaiting_token: dict[str, RequestState] = field(default_factory=dict)
    _max_num_seqs: int | None = None  # cached from config for the per-step hot path
    # the histograms of sampling_seen, one attribute each for request_added's loop
    _seen_max_tokens: dict = field(init=False, repr=False)
    _seen_temperature: dict = field(init=False, repr=False)
    _seen_top_p: dict = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._seen_max_tokens, self._seen_temperature, self._seen_top_p = (
            self.sampling_seen[name] for name in SAMPLING_FIELDS)
        self.window = deque(maxlen=self.step_window)
        self.timeline = Timeline(self.timeline_spans)
        self.recent_preempts = deque(maxlen=PREEMPT_KEEP)
        self.finished = deque(maxlen=self.finished_keep)

    @property
    def max_num_seqs(self) -> int | None:
        return self._max_num_seqs

    def request(self, req_id: str) -> RequestState:
        req = self.requests.get(req_id)
        if req is None:  # events of a request added before the probe started
            req = self.requests[req_id] = RequestState(req_id, self.engine, arrival_step=self.last_step + 1)
        return req

    def window_stats(self, last_n: int | None = None) -> WindowStats:
        """:class:`WindowStats` over the last ``last_n`` steps of the window (all when None)."""
        recs = list(self.window)
        if last_n is not None:
            recs = recs[-last_n:] if last_n > 0 else []
        ws = WindowStats(steps=len(recs))
        if not recs:
            return ws
        ws.first_step, ws.last_step = recs[0].step, recs[-1].step
        ws.span_s = max(recs[-1].ts - recs[0].ts, 0.0)
        sched_us_max = 0.0
        for r in recs:
            ws.scheduled_tokens += r.scheduled
            ws.budget_tokens += r.budget
            ws.prefill_tokens += r.prefill_tokens or 0
            ws.decode_tokens += r.decode_tokens or 0
            ws.preemptions += r.preempted
            ws.bound_counts[r.bound] = ws.bound_counts.get(r.bound, 0) + 1
            if r.schedule_us > sched_us_max:
                sched_us_max = r.schedule_us
        ws.schedule_us_mean = sum(r.schedule_us for r in recs) / len(recs)
        ws.schedule_us_max = sched_us_max
        if len(recs) >= 2:
            ws.step_rate = per_second(len(recs) - 1, ws.span_s)
            ws.token_rate = per_second(ws.scheduled_tokens - recs[0].scheduled, ws.span_s)
            ws.preempt_rate = per_second(ws.preemptions, ws.span_s)
        return ws

    def prefills_in_flight(self) -> list[RequestState]:
        """Requests part-way through a prefill pass (phase ``prefill``), oldest first."""
        reqs = [r for r in self.requests.values() if r.phase == PREFILL]
        reqs.sort(key=lambda r: (r.first_scheduled_step if r.first_scheduled_step is not None else 1 << 62, r.req_id))
        return reqs

    @property
    def events_written(self) -> int:
        """Event lines the probe wrote in this engine core (events; last ``probe_stats`` of
        each pid: known once the engine core writes one, at its stop)."""
        return sum(ps.events_written or 0 for ps in self.probe_stats.values())

    @property
    def events_dropped(self) -> int:
        """Events the probe lost in this engine core (events).

        ``probe_stats`` counts are cumulative per file (process): the last line of
        each pid counts.
        """
        return sum(ps.events_dropped or 0 for ps in self.probe_stats.values())

    @property
    def hook_errors(self) -> int:
        """Exceptions caught in the probe's hooks in this engine core (last line of each pid)."""
        total = 0
        for ps in self.probe_stats.values():
            errs = ps.hook_errors
            if isinstance(errs, dict):
                total += sum(n for n in errs.values() if isinstance(n, int) and not isinstance(n, bool))
        return total

    @property
    def hooks_disabled(self) -> list[str]:
        """Hooks the probe switched off after repeated errors (their events stop)."""
        return sorted({h for ps in self.probe_stats.values() for h in ps.hooks_disabled or ()})

    def prefix_hits_in_step(self, step: int | None) -> int:
        """Prompt tokens the prefix cache served to the chunks scheduled in ``step`` (first
        passes and re-admissions; tokens; 0 when none)."""
        return self.step_prefix_hits if step is not None and step == self.hits_step else 0

    @property
    def running_max(self) -> int | None:
        """Longest running queue after any step so far (requests; None before a step)."""
        return max((r for r, _ in self.queue_steps), default=None)

    @property
    def waiting_max(self) -> int | None:
        """Longest waiting queue after any step so far (requests; None before a step)."""
        return max((w for _, w in self.queue_steps), default=None)

    def queue_lengths(self) -> tuple[dict[int, int], dict[int, int]]:
        """Histograms ``{running: steps}`` and ``{waiting: steps}`` of the queue lengths
        after each step (requests), from :attr:`queue_steps`."""
        running: dict[int, int] = {}
        waiting: dict[int, int] = {}
        for (r, w), n in self.queue_steps.items():
            running[r] = running.get(r, 0) + n
            waiting[w] = waiting.get(w, 0) + n
        return running, waiting

    @property
    def prefix_hit_share(self) -> float | None:
        """Prefix-cache hits of first passes over their prompt tokens (0..1)."""
        return share(self.prefix_hit_tokens, self.first_pass_prompt_tokens)

    @property
    def priorities_vary(self) -> bool:
        """Whether the requests seen so far have more than one priority."""
        return len(self.priorities) > 1

    def phase_counts(self) -> dict[str, int]:
        """Known unfinished requests per phase (requests)."""
        counts = {WAITING: 0, PREFILL: 0, DECODE: 0, PREEMPTED: 0}
        for r in self.requests.values():
            counts[r.phase] = counts.get(r.phase, 0) + 1
        return counts


def _count_value(hist: dict, value: Any) -> None:
    """Count ``value`` in ``hist``, under :data:`OTHER_VALUES` once it holds
    :data:`DISTINCT_KEEP` distinct values."""
    if value not in hist and len(hist) >= DISTINCT_KEEP:
        value = OTHER_VALUES
    hist[value] = hist.get(value, 0) + 1


class RunState:
    """All engines of a run, updated one event at a time with :meth:`apply`.

    Args:
        step_window: recent steps kept per engine (rolling chart, rates).
        finished_keep: finished requests kept per engine (request table).
        on_request_finished: called with each :class:`RequestState` as it finishes.
        listener: a :class:`StateListener` told of every transition.
    """

    def __init__(
        self,
        step_window: int = STEP_WINDOW,
        finished_keep: int = FINISHED_KEEP,
        on_request_finished: Callable[[RequestState], None] | None = None,
        listener: "StateListener | None" = None,
    ) -> None:
        self.engines: dict[int, EngineState] = {}
        self.step_window = step_window
        self.finished_keep = finished_keep
        self.on_request_finished = on_request_finished
        self.listener = listener
        self.events = 0
        self.first_ts: float | None = None
        self.last_ts: float | None = None
        self._handlers = {  # by Struct class (vllm_probe.schema.records)
            STRUCTS["engine_config"]: self._engine_config,
            STRUCTS["step"]: self._step,
            STRUCTS["chunk"]: self._chunk,
            STRUCTS["preempt"]: self._preempt,
            STRUCTS["request_added"]: self._added,
            STRUCTS["request_finished"]: self._finished,
            STRUCTS["probe_stats"]: self._probe_stats,
        }

    def engine(self, idx: int) -> EngineState:
        eng = self.engines.get(idx)
        if eng is None:
            eng = self.engines[idx] = EngineState(idx, self.step_window, self.finished_keep)
        return eng

    def apply(self, ev) -> None:
        """Update the state with one event: a record of :mod:`vllm_probe.schema.records`
        (as the reader yields them) or an event dict (converted first; ignored when its
        kind is unknown or a field has the wrong type)."""
        if type(ev) is dict:
            ev = from_dict(ev)
            if ev is None:
                return
        handler = self._handlers.get(type(ev))
        if handler is None:
            return
        ts, idx, pid = ev.ts, ev.engine, ev.pid
        eng = self.engines.get(idx) or self.engine(idx)
        if pid is not None and pid not in eng.pids:
            eng.pids.add(pid)
        # hot path (one call per event): compare against the known range only
        if eng.last_ts is None:
            eng.first_ts = eng.last_ts = ts
        elif ts > eng.last_ts:
            eng.last_ts = ts
        elif ts < eng.first_ts:
            eng.first_ts = ts
        if self.last_ts is None:
            self.first_ts = self.last_ts = ts
        elif ts > self.last_ts:
            self.last_ts = ts
        elif ts < self.first_ts:
            self.first_ts = ts
        self.events += 1
        handler(eng, ev)

    def apply_all(self, events) -> "RunState":
        for ev in events:
            self.apply(ev)
        return self

    # -- totals across engines ----------------------------------------------------------

    def total(self, attr: str) -> int | float:
        return sum(getattr(e, attr) for e in self.engines.values())

    def stepping_s(self) -> float | None:
        """Seconds the schedulers were stepping: from the earliest step's start (its ``ts``
        minus its ``schedule_us``) to the latest step's ``ts``, across engines; None
        before the first step. Unlike the command's wall time, no engine start-up."""
        starts = [e.stepping_since for e in self.engines.values() if e.stepping_since is not None]
        if not starts:
            return None
        return max(max(e.last_step_ts for e in self.engines.values() if e.last_step_ts is not None)
                   - min(starts), 0.0)

    def prefix_hit_share(self) -> float | None:
        """Prefix-cache hits of first passes over their prompt tokens, across engines (0..1)."""
        return share(self.total("prefix_hit_tokens"), self.total("first_pass_prompt_tokens"))

    def engine_ids(self) -> list[int]:
        """Data-parallel ranks seen so far, sorted."""
        return sorted(self.engines)

    @property
    def config(self) -> Any:
        """The ``engine_config`` record of the lowest engine core that has one (None before)."""
        for idx in sorted(self.engines):
            if self.engines[idx].config is not None:
                return self.engines[idx].config
        return None

    # -- handlers -----------------------------------------------------------------------

    def _engine_config(self, eng: EngineState, ev) -> None:
        eng.config = ev
        eng._max_num_seqs = ev.max_num_seqs

    def _step(self, eng: EngineState, ev) -> None:
        step = ev.step
        if step is None:
            step = eng.last_step + 1
        if step > eng.last_step:
            eng.last_step = step
        eng.latest = ev
        eng.steps += 1
        ts = ev.ts
        scheduled = ev.scheduled_tokens or 0
        budget = ev.token_budget
        prefill, decode = ev.prefill_tokens, ev.decode_tokens
        schedule_us = ev.schedule_us
        if schedule_us is None:
            schedule_us = 0.0
        else:  # Buckets.add inlined: this runs for every step of every reader
            schedule_s, hist = schedule_us * 1e-6, eng.schedule_s
            hist.counts[bisect_left(hist.bounds, schedule_s)] += 1
            hist.sum += schedule_s
        eng.scheduled_tokens += scheduled
        if prefill:
            eng.prefill_tokens += prefill
        if decode:
            eng.decode_tokens += decode
        eng.schedule_us_total += schedule_us
        waiting = ev.waiting or 0
        running = ev.running or 0
        preempted = ev.preempted
        n_preempted = len(preempted) if preempted else 0
        eng.step_preemptions += n_preempted
        key = (running, waiting)
        hist = eng.queue_steps
        hist[key] = hist.get(key, 0) + 1
        if n_preempted:
            hist = eng.preempted_steps
            hist[n_preempted] = hist.get(n_preempted, 0) + 1
        bound = bound_by(scheduled, budget, running, waiting, bool(n_preempted), eng._max_num_seqs)
        eng.bound_counts[bound] += 1
        blocked = ev.head_blocked_by
        if blocked is not None:
            if blocked not in _KNOWN_REASONS:
                blocked = OTHER_REASON
            counts = eng.head_blocked_counts
            counts[blocked] = counts.get(blocked, 0) + 1
        kv = ev.kv_usage or 0.0
        eng.timeline.add(step, ts, scheduled, budget or 0, prefill or 0, decode or 0, running, waiting, kv,
                         n_preempted, bound, blocked)
        if self.step_window:
            eng.window.append(StepRecord(
                step, ts, scheduled, budget or 0, prefill, decode, running, waiting, kv, schedule_us,
                n_preempted, bound, blocked,
            ))
        key = (scheduled, budget or 0)
        hist = eng.step_tokens
        hist[key] = hist.get(key, 0) + 1
        if schedule_us > eng.schedule_us_max:
            eng.schedule_us_max = schedule_us
        start = ts - schedule_us * 1e-6
        if eng.stepping_since is None or start < eng.stepping_since:
            eng.stepping_since = start
        if eng.last_step_ts is None or ts > eng.last_step_ts:
            eng.last_step_ts = ts
        if ev.finished:
            # Normally request_finished came first and the request is gone already; with
            # log_request_events off this is the only sign, and keeps memory bounded.
            for rid in ev.finished:
                if rid in eng.requests:
                    self._finish(eng, rid, ts, None, None, None)
        if eng._awaiting_token:
            done = [r for r in eng._awaiting_token.values() if r.first_token_step is not None and r.first_token_step < step]
            for req in done:
                req.first_token_ts = ts
                del eng._awaiting_token[req.req_id]
                self._first_token(eng, req)
        if self.listener is not None:
            self.listener.on_step(eng, ev)

    def _chunk(self, eng: EngineState, ev) -> None:
        req = eng.request(ev.req_id)
        eng.chunks += 1
        req.chunks += 1
        start = ev.start or 0
        end = start if ev.end is None else ev.end
        index = ev.chunk_index or 0
        eng.chunk_tokens += end - start
        eng.reread_kv_tokens += chunk_reread_tokens(index, start)
        if ev.prompt_len is not None:
            req.prompt_len = ev.prompt_len
        if index == 0:
            req.passes += 1
            hits = start if ev.prefix_hit_tokens is None else ev.prefix_hit_tokens
            if ev.step != eng.hits_step:
                eng.hits_step, eng.step_prefix_hits = ev.step, 0
            eng.step_prefix_hits += hits
            if ev.resumed:
                eng.resumed_passes += 1
                eng.resumed_prefix_hit_tokens += hits
                eng.resumed_prefill_tokens += ev.prefill_len if ev.prefill_len is not None else end
            else:
                eng.first_passes += 1
                eng.prefix_hit_tokens += hits
                eng.first_pass_prompt_tokens += ev.prompt_len if ev.prompt_len is not None else end
                if hits:
                    eng.requests_with_prefix_hits += 1
            if req.first_scheduled_ts is None:
                req.first_scheduled_ts = ev.ts
                req.first_scheduled_step = ev.step
                req.prefix_hit_tokens = hits
                queue_s = req.queue_time_s
                if queue_s is not None:
                    eng.queue_s.add(queue_s)
        if ev.resumed:
            req.recomputed_tokens += end - start
            eng.recomputed_tokens += end - start
        else:
            req.first_pass_chunks += 1
        req.chunk_index = index
        req.last_chunk = (start, end)
        req.computed = end
        req.prefill_len = req.prompt_len if ev.prefill_len is None else ev.prefill_len
        if ev.last:
            req.phase = DECODE
            req.pass_end_step = ev.step
            if req.first_token_step is None:  # the pass that produced the first token
                req.first_token_step = ev.step
                eng._awaiting_token[req.req_id] = req
                hist = eng.first_pass_chunks
                hist[index + 1] = hist.get(index + 1, 0) + 1
        else:
            req.phase = PREFILL
        if self.listener is not None:
            self.listener.on_chunk(eng, req, ev)

    def _preempt(self, eng: EngineState, ev) -> None:
        req = eng.request(ev.req_id)
        eng.preemptions += 1
        if not req.preemptions:
            eng.requests_preempted += 1
        discarded = ev.discarded_tokens or 0
        eng.discarded_tokens += discarded
        reason = preempt_reason(ev.reason)
        eng.preemptions_by_reason[reason] = eng.preemptions_by_reason.get(reason, 0) + 1
        eng.discarded_by_reason[reason] = eng.discarded_by_reason.get(reason, 0) + discarded
        req.preemptions = ev.num_preemptions or req.preemptions + 1
        req.discarded_tokens += discarded
        if ev.output_tokens is not None:
            req.output_tokens = ev.output_tokens
        if ev.prompt_len is not None:
            req.prompt_len = ev.prompt_len
        req.phase = PREEMPTED
        req.computed = 0
        req.last_preempt_ts = ev.ts
        req.last_preempt_step = ev.step
        eng.recent_preempts.append(ev)
        if self.listener is not None:
            self.listener.on_preempt(eng, req, ev)

    def _added(self, eng: EngineState, ev) -> None:
        eng.requests_added += 1
        req = eng.requests.get(ev.req_id)
        if req is None:
            req = eng.requests[ev.req_id] = RequestState(ev.req_id, eng.engine)
        req.arrival_step = eng.last_step + 1
        req.prompt_len = ev.prompt_len
        req.max_tokens = ev.max_tokens
        req.priority = ev.priority
        req.arrival_ts = ev.ts if ev.arrival_ts is None else ev.arrival_ts
        # per request, not per step; inlined (a summary counts tens of thousands)
        for hist, value in ((eng.priorities, ev.priority), (eng._seen_max_tokens, ev.max_tokens),
                            (eng._seen_temperature, ev.temperature), (eng._seen_top_p, ev.top_p)):
            if value is not None:
                n = hist.get(value)
                if n is not None:
                    hist[value] = n + 1
                else:
                    _count_value(hist, value)
        if self.listener is not None:
            self.listener.on_added(eng, req, ev)

    def _finished(self, eng: EngineState, ev) -> None:
        self._finish(eng, ev.req_id, ev.ts, ev.reason, ev.output_tokens, ev.num_preemptions)

    def _finish(self, eng: EngineState, req_id: str, ts: float, reason: str | None, output_tokens: int | None,
                num_preemptions: int | None) -> None:
        req = eng.requests.pop(req_id, None) or RequestState(req_id, eng.engine)
        eng.requests_finished += 1
        req.phase = FINISHED
        req.finished_ts = ts
        req.finish_reason = reason
        if output_tokens is not None:
            req.output_tokens = output_tokens
        if num_preemptions is not None:
            req.preemptions = num_preemptions
        if eng._awaiting_token.pop(req.req_id, None) is not None:
            req.first_token_ts = ts
            self._first_token(eng, req)
        eng.finished.append(req)
        if self.on_request_finished is not None:
            self.on_request_finished(req)
        if self.listener is not None:
            self.listener.on_finished(eng, req)

    def _probe_stats(self, eng: EngineState, ev) -> None:
        eng.probe_stats[ev.pid] = ev

    @staticmethod
    def _first_token(eng: EngineState, req: RequestState) -> None:
        """The request's first token is known (``first_token_ts`` just set)."""
        ttft_s = req.ttft_s
        if ttft_s is not None:
            eng.ttft_s.add(ttft_s)


class StateListener:
    """Receives every transition of a :class:`RunState` (``RunState.listener``), after the
    state has applied it: the Perfetto export draws its slices from these. Each method
    gets the engine, the request's :class:`RequestState` where there is one, and the
    record that caused it. Methods do nothing unless overridden."""

    def on_added(self, eng: EngineState, req: RequestState, ev: Any) -> None:
        """A request arrived (``request_added``)."""

    def on_chunk(self, eng: EngineState, req: RequestState, ev: Any) -> None:
        """A prefill chunk was scheduled (``chunk``); ``req.phase`` is ``decode`` after the
        pass's last chunk, else ``prefill``."""

    def on_preempt(self, eng: EngineState, req: RequestState, ev: Any) -> None:
        """The request was preempted (``preempt``); its KV is gone, it waits again."""

    def on_finished(self, eng: EngineState, req: RequestState) -> None:
        """The request left the scheduler (``request_finished``, or a step's ``finished``
        ids when request events are off)."""

    def on_step(self, eng: EngineState, ev: Any) -> None:
        """A step ended (``step``), after the chunks and preemptions it caused."""
