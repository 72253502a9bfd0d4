"""What is known of one engine core (a data-parallel rank) of a run: its settings, the
recent steps (rolling), its requests, counters, exact and bucketed histograms.

:class:`~vllm_probe.analysis.state.RunState` updates it one event at a time; views read
it (the dashboard's panels, the summary, the metrics, the doctor's rules). Memory is
bounded for a run of any length: steps in a rolling window, finished requests in a
bounded list, run totals as counters, histograms keyed by value or bucketed
(:class:`~vllm_probe.analysis.figures.Buckets`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Any, ClassVar

from ..schema.events import HEAD_BLOCKED_REASONS
from .figures import (
    LATENCY_S_BOUNDS, LIMITS, PREEMPT_REASONS, SCHEDULE_S_BOUNDS, Buckets, budget_use, per_second, share,
)
from .requests import DECODE, PREEMPTED, PREFILL, WAITING, RequestState
from .timeline import MAX_SPANS, Timeline

#: Default number of recent steps kept per engine.
STEP_WINDOW = 600
#: Default number of finished requests kept per engine.
FINISHED_KEEP = 200
#: Default number of recent preemptions kept per engine.
PREEMPT_KEEP = 50
#: Recompute chunks kept for the rolling window's recompute tax (a chunk per resumed pass
#: per step: more than a default window of steps holds in practice)
RECENT_RECOMPUTES_KEEP = 4096
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
KNOWN_REASONS = frozenset(HEAD_BLOCKED_REASONS)


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
    bound_counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LIMITS, 0))

    @property
    def budget_use(self) -> float | None:
        """Scheduled tokens / token budget over the window (0..1)."""
        return budget_use(self.scheduled_tokens, self.budget_tokens)

    @property
    def preempt_per_100_steps(self) -> float | None:
        return 100.0 * self.preemptions / self.steps if self.steps else None


@dataclass(slots=True)
class PreemptionSeen:
    """What the ``preempt`` events alone say about where and under which load the
    preemptions happened, for runs with step events off (``settings.minimal.yaml``):
    the preemption rules read it when ``EngineState.steps`` is 0.

    Attributes:
        first_step, last_step: the lowest / highest ``preempt.step`` (-1: none yet).
        running_max, waiting_max: the most requests running / waiting after a
            preemption (``preempt.running`` / ``preempt.waiting``; None: not recorded).
        kv_usage_max: the highest ``preempt.kv_usage`` (0..1; None: not recorded).
    """

    first_step: int = -1
    last_step: int = -1
    running_max: int | None = None
    waiting_max: int | None = None
    kv_usage_max: float | None = None

    def add(self, ev: Any) -> None:
        """Fold one ``preempt`` record in."""
        step = ev.step
        if step is not None:
            if self.first_step < 0 or step < self.first_step:
                self.first_step = step
            if step > self.last_step:
                self.last_step = step
        for name, value in (("running_max", ev.running), ("waiting_max", ev.waiting), ("kv_usage_max", ev.kv_usage)):
            if value is not None:
                have = getattr(self, name)
                if have is None or value > have:
                    setattr(self, name, value)


@dataclass(slots=True)
class PreemptionCounts:
    """The preemptions of one engine core (``EngineState.preempt``).

    Attributes:
        events: ``preempt`` events.
        in_step_lists: ids in the steps' ``preempted`` lists (right with preempt events off).
        by_reason, discarded_by_reason: preempt events and their discarded tokens by
            ``reason`` (:func:`~vllm_probe.analysis.figures.preempt_reason`).
        requests: distinct requests preempted at least once.
        discarded_tokens: computed tokens thrown away (``preempt.discarded_tokens``).
        recomputed_tokens: tokens of chunks in resumed (recompute) passes.
        per_step: exact histogram: requests preempted in one step (its ``preempted``
            list) -> steps, for steps with any.
    """

    events: int = 0
    in_step_lists: int = 0
    by_reason: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PREEMPT_REASONS, 0))
    discarded_by_reason: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PREEMPT_REASONS, 0))
    requests: int = 0
    discarded_tokens: int = 0
    recomputed_tokens: int = 0
    per_step: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class PrefillCounts:
    """The prefill chunks of one engine core (``EngineState.prefill``); tokens.

    Attributes:
        chunks, chunk_tokens: prefill chunks and their tokens (``end - start``).
        reread_kv_tokens: :func:`~vllm_probe.analysis.figures.chunk_reread_tokens` summed
            over chunks.
        first_passes: first passes started (first chunks of requests not resumed);
            first_pass_prompt_tokens: their ``prompt_len`` (what the hits are a share of);
            prefix_hit_tokens: the prefix cache served on their first chunks;
            requests_with_prefix_hits: those that started with a hit.
        resumed_passes, resumed_prefill_tokens, resumed_prefix_hit_tokens: re-admissions
            after a preemption, the ``prefill_len`` they computed again, and the part the
            prefix cache served (their first chunks).
        first_pass_chunks: exact histogram: chunks of the prefill pass that produced a
            prompt's first token -> prompts.
    """

    chunks: int = 0
    chunk_tokens: int = 0
    reread_kv_tokens: int = 0
    prefix_hit_tokens: int = 0
    first_passes: int = 0
    first_pass_prompt_tokens: int = 0
    requests_with_prefix_hits: int = 0
    resumed_passes: int = 0
    resumed_prefill_tokens: int = 0
    resumed_prefix_hit_tokens: int = 0
    first_pass_chunks: dict[int, int] = field(default_factory=dict)


def _read_only(group: str, name: str, doc: str) -> property:
    """``EngineState.<old name>``: a read-only view of ``EngineState.<group>.<name>``
    (readers keep their names; only RunState writes, through the group)."""
    getter = attrgetter(f"{group}.{name}")
    return property(getter, doc=doc)


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
    #: sums over the steps, for the timeline's spans: token budgets (tokens), running and
    #: waiting after each step (requests), KV use (0..1 per step), and the steps that
    #: scheduled nothing while requests waited
    budget_total: int = 0
    running_total: int = 0
    waiting_total: int = 0
    kv_total: float = 0.0
    idle_waiting_steps: int = 0
    schedule_us_total: float = 0.0
    schedule_us_max: float = 0.0
    #: seconds inside ``schedule()`` per step (steps with ``schedule_us``)
    schedule_s: Buckets = field(default_factory=lambda: Buckets(SCHEDULE_S_BOUNDS))
    #: exact histogram of the steps' ``(scheduled_tokens, token_budget)`` (absent: 0) -> steps;
    #: its size is bounded by the distinct pairs, not by the number of steps
    step_tokens: dict[tuple[int, int], int] = field(default_factory=dict)
    #: exact histogram of the periods between two consecutive decode-only steps of the same
    #: decode batch: ``(decode requests, period in DECODE_PERIOD_US buckets)`` -> steps (the
    #: engine's own speed mark, :class:`~vllm_probe.analysis.summary_types.SpeedMark`)
    decode_periods: dict[tuple[int, int], int] = field(default_factory=dict)
    stepping_since: float | None = None  # earliest step start (ts - schedule_us), epoch s
    last_step_ts: float | None = None  # latest ts of a step event, epoch s
    #: the preemption counters (preempt events, the steps' lists, tokens discarded and
    #: recomputed); read them through the properties below or the group
    preempt: PreemptionCounts = field(default_factory=PreemptionCounts)
    #: where and under which load the preempt events happened (step events off: all there is)
    preempt_seen: PreemptionSeen = field(default_factory=PreemptionSeen)
    #: the prefill counters (chunks, re-read KV, prefix-cache hits of first and resumed passes)
    prefill: PrefillCounts = field(default_factory=PrefillCounts)
    #: prefix-cache hits of the first chunks scheduled in step :attr:`hits_step` (tokens;
    #: :meth:`prefix_hits_in_step`, the ``--plain`` line's "hit")
    hits_step: int | None = None
    step_prefix_hits: int = 0
    requests_added: int = 0
    #: the step before which the latest request arrived (its ``arrival_step``; -1: none yet):
    #: an offline burst has them all before the first steps
    last_arrival_step: int = -1
    requests_finished: int = 0
    #: exact histogram of the steps' ``(running, waiting)`` queue lengths (requests) -> steps
    #: (one dict update per step; bounded by the distinct pairs)
    queue_steps: dict[tuple[int, int], int] = field(default_factory=dict)
    #: requests by ``request_added.priority`` (requests)
    priorities: dict[int | str, int] = field(default_factory=dict)
    #: what the requests asked for (``request_added``): field -> value -> requests, for
    #: :data:`SAMPLING_FIELDS` (compared with a settings file's ``sampling`` section)
    sampling_seen: dict[str, dict[Any, int]] = field(default_factory=lambda: {k: {} for k in SAMPLING_FIELDS})
    #: seconds of queue time / time to first token (definitions in analysis/requests.py),
    #: each counted once per request as soon as it is known (finished or not)
    queue_s: Buckets = field(default_factory=lambda: Buckets(LATENCY_S_BOUNDS))
    ttft_s: Buckets = field(default_factory=lambda: Buckets(LATENCY_S_BOUNDS))
    bound_counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LIMITS, 0))
    #: steps per ``step.head_blocked_by`` reason (why the head of the waiting queue was not
    #: admitted; :data:`~vllm_probe.schema.events.HEAD_BLOCKED_REASONS`, an unknown value as
    #: :data:`OTHER_REASON`); steps without the field (nothing waited, or an older probe)
    #: are not counted. Read by the summary's shares and the metrics
    #: (``vllm_probe_steps_by_head_blocked_total``).
    head_blocked_counts: dict[str, int] = field(default_factory=dict)
    #: the latest ``probe_stats`` record of each file, by pid (counts are cumulative per
    #: file, and a stopping engine core writes one with every flush: the last one is final)
    #: busy time (RunState.busy_s): when the current period with a request in this engine
    #: core began (epoch s; None: idle), and the seconds of the periods that ended
    busy_since: float | None = None
    busy_total_s: float = 0.0
    probe_stats: dict[Any, Any] = field(default_factory=dict)
    #: the segment this engine core's events start at when retention removed the ones
    #: before it (the first ``engine_config`` read is a segment's copy, ``segment: n``);
    #: None: read from the start (:mod:`vllm_probe.analysis.window`)
    window_segment: int | None = None
    #: ``ts`` of the engine core's ``engine_config`` (its scheduler was built; epoch s)
    started_ts: float | None = None
    #: the machine-speed mark when the engine core's probe started (``engine_config.speed_mark_us``
    #: of its first ``engine_config`` that has one; µs, lower is faster) and at its end (the
    #: latest ``probe_stats.speed_mark_us``); None: not recorded (an older probe, a replay, a
    #: killed engine core's end)
    speed_mark_start_us: float | None = None
    speed_mark_end_us: float | None = None
    #: requests whose ``request_added`` was not read (added before the window, with
    #: request events on): figures from arrival are unknown for them (requests)
    requests_before_window: int = 0
    _requests_logged: bool = True  # engine_config.flags.log_request_events
    #: ``(step, tokens)`` of the latest recompute chunks (resumed passes), for the recompute
    #: tax over the rolling window (:meth:`recent_recompute_tax`); bounded
    recent_recomputed: deque[tuple[int | None, int]] = field(
        default_factory=lambda: deque(maxlen=RECENT_RECOMPUTES_KEEP))
    window: deque[StepRecord] = field(init=False)
    #: every step of the run, in bounded spans (the finished run's overview, evidence ranges)
    timeline: Timeline = field(init=False)
    recent_preempts: deque[Any] = field(init=False)
    requests: dict[str, RequestState] = field(default_factory=dict)
    finished: deque[RequestState] = field(init=False)
    #: requests whose prefill pass just ended: their first token comes with the next step
    #: (or their finish); written by RunState's handlers
    awaiting_first_token: dict[str, RequestState] = field(default_factory=dict)
    #: ``engine_config.max_num_seqs``, set by RunState when the config is read (the per-step
    #: path reads it without going through the config record)
    max_num_seqs: int | None = None
    # the histograms of sampling_seen, one attribute each for request_added's loop
    seen_max_tokens: dict[Any, int] = field(init=False, repr=False)
    seen_temperature: dict[Any, int] = field(init=False, repr=False)
    seen_top_p: dict[Any, int] = field(init=False, repr=False)

    if TYPE_CHECKING:  # the read-only views set on the class below it, as mypy sees them
        preemptions: ClassVar[int]
        step_preemptions: ClassVar[int]
        preemptions_by_reason: ClassVar[dict[str, int]]
        discarded_by_reason: ClassVar[dict[str, int]]
        requests_preempted: ClassVar[int]
        discarded_tokens: ClassVar[int]
        recomputed_tokens: ClassVar[int]
        preempted_steps: ClassVar[dict[int, int]]
        chunks: ClassVar[int]
        chunk_tokens: ClassVar[int]
        reread_kv_tokens: ClassVar[int]
        prefix_hit_tokens: ClassVar[int]
        first_passes: ClassVar[int]
        first_pass_prompt_tokens: ClassVar[int]
        requests_with_prefix_hits: ClassVar[int]
        resumed_passes: ClassVar[int]
        resumed_prefill_tokens: ClassVar[int]
        resumed_prefix_hit_tokens: ClassVar[int]
        first_pass_chunks: ClassVar[dict[int, int]]

    def __post_init__(self) -> None:
        self.seen_max_tokens, self.seen_temperature, self.seen_top_p = (
            self.sampling_seen[name] for name in SAMPLING_FIELDS)
        self.window = deque(maxlen=self.step_window)
        self.timeline = Timeline(self, self.timeline_spans)
        self.recent_preempts = deque(maxlen=PREEMPT_KEEP)
        self.finished = deque(maxlen=self.finished_keep)

    @property
    def preemptions_total(self) -> int:
        """The run's preemptions, one figure for every view (the dashboard, the ``--plain``
        lines, the summary): ``preempt`` events, or with those off the ids in the steps'
        ``preempted`` lists, whichever counted more (within a step the preempt events come
        first; with both on they agree once the step is read)."""
        p = self.preempt
        return p.events if p.events >= p.in_step_lists else p.in_step_lists

    @property
    def step_budget(self) -> int | None:
        """The token budget of the latest step (``step.token_budget``), else the engine's
        ``max_num_batched_tokens`` (``engine_config``); None when neither is known. The one
        budget every view feeds to :func:`~vllm_probe.analysis.figures.budget_use`."""
        latest = self.latest
        budget: int | None = latest.token_budget if latest is not None else None
        if budget:
            return budget
        config = self.config
        return (config.max_num_batched_tokens or None) if config is not None else None

    def request(self, req_id: str) -> RequestState:
        req = self.requests.get(req_id)
        if req is None:  # events of a request added before the window (or the probe) started
            req = self.requests[req_id] = RequestState(req_id, self.engine, arrival_step=self.last_step + 1)
            if self._requests_logged:
                req.before_window = True
                self.requests_before_window += 1
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
    def recompute_tax(self) -> float | None:
        """The recompute tax (vLLM RFC #54644): tokens recomputed after preemptions (chunks
        of resumed passes, prompt and output so far) over every token the engine computed
        (the steps' ``scheduled_tokens``), 0..1; None without step events."""
        return share(self.recomputed_tokens, self.scheduled_tokens) if self.steps else None

    def recent_recompute_tax(self, ws: WindowStats | None = None) -> float | None:
        """:attr:`recompute_tax` over the steps of the rolling window (``ws``, or
        :meth:`window_stats`), 0..1; None with no token scheduled there."""
        ws = ws or self.window_stats()
        if not ws.steps or not ws.scheduled_tokens or ws.first_step is None:
            return None
        first = ws.first_step
        recomputed = sum(n for step, n in self.recent_recomputed if step is not None and step >= first)
        return min(recomputed / ws.scheduled_tokens, 1.0)

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


def count_value(hist: dict[Any, int], value: Any) -> None:
    """Count ``value`` in ``hist``, under :data:`OTHER_VALUES` once it holds
    :data:`DISTINCT_KEEP` distinct values."""
    if value not in hist and len(hist) >= DISTINCT_KEEP:
        value = OTHER_VALUES
    hist[value] = hist.get(value, 0) + 1


#: The names readers use (the doctor, the views, the summary, the metrics), each a
#: read-only view of its group's field.
for _name, (_group, _field, _doc) in {
    "preemptions": ("preempt", "events", "preempt events"),
    "step_preemptions": ("preempt", "in_step_lists", "ids in the steps' preempted lists"),
    "preemptions_by_reason": ("preempt", "by_reason", "preempt events by reason"),
    "discarded_by_reason": ("preempt", "discarded_by_reason", "discarded tokens by reason"),
    "requests_preempted": ("preempt", "requests", "distinct requests preempted at least once"),
    "discarded_tokens": ("preempt", "discarded_tokens", "computed tokens thrown away by preemptions"),
    "recomputed_tokens": ("preempt", "recomputed_tokens", "tokens of chunks in resumed passes"),
    "preempted_steps": ("preempt", "per_step", "requests preempted in one step -> steps"),
    "chunks": ("prefill", "chunks", "prefill chunks"),
    "chunk_tokens": ("prefill", "chunk_tokens", "tokens of every prefill chunk"),
    "reread_kv_tokens": ("prefill", "reread_kv_tokens", "KV tokens re-read by later chunks"),
    "prefix_hit_tokens": ("prefill", "prefix_hit_tokens", "prefix-cache hits of first passes"),
    "first_passes": ("prefill", "first_passes", "first passes started"),
    "first_pass_prompt_tokens": ("prefill", "first_pass_prompt_tokens", "prompt tokens of first passes"),
    "requests_with_prefix_hits": ("prefill", "requests_with_prefix_hits", "first passes with a hit"),
    "resumed_passes": ("prefill", "resumed_passes", "re-admissions after a preemption"),
    "resumed_prefill_tokens": ("prefill", "resumed_prefill_tokens", "prefill_len of re-admissions"),
    "resumed_prefix_hit_tokens": ("prefill", "resumed_prefix_hit_tokens", "prefix-cache hits of re-admissions"),
    "first_pass_chunks": ("prefill", "first_pass_chunks", "chunks of the first pass -> prompts"),
}.items():
    setattr(EngineState, _name, _read_only(_group, _field, _doc))
del _name, _group, _field, _doc
