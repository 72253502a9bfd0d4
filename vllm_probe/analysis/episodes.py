"""Episodes of a run: what the doctor's rules and a finished run's notable moments read.

:class:`Episodes` is a :class:`~vllm_probe.analysis.state.StateListener`: attached to the
one :class:`~vllm_probe.analysis.state.RunState` (``RunState(listener=Episodes())``), it
follows every transition as the events stream in and keeps, per engine core and in
bounded memory:

* **waits** — per request, the steps from arrival to its first prefill chunk, with the
  ``head_blocked_by`` reasons over those steps (a difference of the state's cumulative
  counts, O(1)); the longest ones, and the short requests whose time to first token was
  mostly queue time (head-of-line blocking), are kept (top :data:`TOP_K`);
* **the request at the head** when a stall begins (the stalls and prefill blocks
  themselves are runs of steps the timeline keeps, :class:`~vllm_probe.analysis.timeline.StepRuns`;
  who filled a prefill block is read from the chunk ring);
* **preemptions** — the steps with the most preemptions, and the requests preempted again
  and again with the steps of each preemption;
* **chunking without benefit** — first prefill passes cut into several chunks while no
  request decoded alongside (chunking then only adds steps and KV
  re-reads);
* **held slots** — under ``AsyncScheduler``, steps whose running queue was full while
  requests waited, with running requests that scheduled nothing: slots held by requests
  whose last token is in flight (:class:`HeldSlots`);
* **KV demand** — the KV blocks the admitted requests would need at full length
  (prompt + ``max_tokens``, capped at ``max_model_len``), its peak and the running
  requests at the peak: the arithmetic behind the KV-cache remedies.

Who took the budget during a wait is read back from a bounded ring of the latest
:data:`CHUNK_RING` prefill chunks, only for the few waits that are reported
(:meth:`EngineEpisodes.takers`). Every figure the views and the doctor show comes from
here, the state or its timeline: notable moments (:func:`notable_moments`) and the
doctor's findings are one analysis.

Cost: on a step without prefill chunks, preemptions or a new stall, ``on_step`` is a
few comparisons; the rest is per chunk, preemption, arrival and finish.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

from .requests import RequestState
from .engine_state import EngineState
from .state import RunState, StateListener
from .timeline import Ranked, StepRun

#: Longest waits, repeated preemptions and preempting steps kept per engine core (the
#: reports show fewer).
TOP_K = 8
#: Prefill chunks kept per engine core to tell who took the budget during a wait.
CHUNK_RING = 32_768
#: Preemption steps kept per request (a request preempted more often keeps its count).
PREEMPT_STEPS_KEEP = 32
#: A request is short, for head-of-line blocking, when the tokens it has left to compute
#: (prompt minus its prefix-cache hit: a cache-warm follow-up with a long prompt is short)
#: are at most this share of the token budget (it would fit any step's budget many times over).
SHORT_PROMPT_SHARE = 0.25
#: A wait counts as most of a request's time to first token from this share (queue time /
#: TTFT). AIPerf and vLLM's benchmark report TTFT including queueing; this separates it.
QUEUE_SHARE_OF_TTFT = 0.5


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(slots=True)
class Wait:
    """A request's wait from arrival to its first prefill chunk (steps and seconds).

    ``steps``: steps from the one after its arrival through the one before its first
    chunk (``first_step - arrival_step``); ``reasons``: steps per ``head_blocked_by``
    reason in that range; ``ttft_s``/``queue_s``: its time to first token and queue time
    (s, None until known); ``prompt_len``: tokens.
    """

    req_id: str
    engine: int
    arrival_step: int
    first_step: int
    prompt_len: int | None
    reasons: dict[str, int]
    queue_s: float | None = None
    ttft_s: float | None = None
    ttft_steps: int | None = None
    hit_tokens: int = 0  # of its prompt, served by the prefix cache on its first chunk

    @property
    def to_compute(self) -> int | None:
        """Prompt tokens it had left to compute (prompt minus its prefix-cache hit)."""
        return None if self.prompt_len is None else max(self.prompt_len - self.hit_tokens, 0)

    @property
    def steps(self) -> int:
        return self.first_step - self.arrival_step

    @property
    def queue_share(self) -> float | None:
        """Queue time / time to first token (0..1), None when either is unknown."""
        if self.queue_s is None or not self.ttft_s:
            return None
        return min(self.queue_s / self.ttft_s, 1.0)


@dataclass(slots=True)
class Repeated:
    """A request preempted more than once: its preemptions, their steps (the first
    :data:`PREEMPT_STEPS_KEEP`), the computed tokens they discarded, its prompt length."""

    req_id: str
    engine: int
    preemptions: int
    steps: list[int]
    discarded_tokens: int
    prompt_len: int | None
    finished: bool


@dataclass(slots=True)
class ChunkedAlone:
    """First prefill passes cut into chunks while nothing decoded alongside (totals)."""

    prompts: int = 0
    extra_steps: int = 0  # chunks - 1 per pass: steps a single-shot prefill would not take
    reread_tokens: int = 0  # KV tokens later chunks read again (figures.chunk_reread_tokens)
    longest_prompt: int = 0  # tokens
    example: str | None = None  # the request with the longest such prompt
    example_steps: tuple[int, int] | None = None  # its first and last chunk's steps
    requests: list[str] = field(default_factory=list)  # the first CHUNKED_ALONE_KEPT of them


#: Requests :class:`ChunkedAlone` names (its counts cover every one).
CHUNKED_ALONE_KEPT = 64


#: An admitted request whose first token is not known yet: (arrival_step, first_step,
#: prompt_len, head_blocked_counts at arrival or None, at admission).
_Waiting = tuple[int, int, int | None, dict[str, int] | None, dict[str, int]]


#: head_blocked_by reasons a held slot shows as: the running queue is full
#: (``max_num_seqs``), which the probe reads as ``deferred`` while the slots are held by
#: requests whose last token is in flight (measured: every waiting step reads
#: ``deferred`` on vLLM 0.32).
HELD_REASONS = ("deferred", "max_num_seqs")


@dataclass(slots=True)
class HeldSlots:
    """Steps of an ``AsyncScheduler`` engine core whose running queue held slots for
    requests that had produced their last token.

    vLLM 0.32's ``Scheduler.schedule`` skips a running request whose in-flight tokens
    already reach its ``max_tokens`` (vllm/v1/core/sched/scheduler.py:663-678: async
    scheduling, ``num_output_placeholders``); it leaves ``self.running`` only when that
    step's output is processed (``update_from_output``, :2294-2295), after the next step
    was scheduled. Until then it holds a slot, and the WAITING loop stops at
    ``max_num_seqs`` (:921-924). A step counts when requests waited after it, the running
    queue was at ``max_num_seqs``, the head was blocked by one of :data:`HELD_REASONS`
    (or the run records no reason), and some running requests scheduled nothing
    (``running - prefill_reqs - decode_reqs`` > 0: the held slots). Step-based only, so
    the same mechanism reads the same at any step rate.

    Attributes:
        waiting_steps: steps of the async engine after which requests waited.
        steps: held steps (those that count, above).
        slot_steps: held slots summed over them (slot-steps: the goal figure ``held_slot_steps``).
        held_max: most slots held in one step.
        first_step, last_step: the first and last held step (-1: none).
        running_max, waiting_max: most running / waiting in a held step.
        tokens_min, tokens_max: fewest / most tokens a held step scheduled (the shape:
            0/4,096 on a busy machine, 256/3,840 on a quiet one, measured).
        tokens_sum: tokens the held steps scheduled.
        reasons: held steps per head_blocked_by reason.
    """

    waiting_steps: int = 0
    steps: int = 0
    slot_steps: int = 0
    held_max: int = 0
    first_step: int = -1
    last_step: int = -1
    running_max: int = 0
    waiting_max: int = 0
    tokens_min: int = -1
    tokens_max: int = 0
    tokens_sum: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


#: priority-slot-wait: a request counts when the head was blocked by a full running queue
#: (:data:`HELD_REASONS`) in at least this many steps of its wait.
PRIORITY_WAIT_MIN_STEPS = 3


@dataclass(slots=True)
class PriorityWait:
    """Under the priority policy, a request that waited for a running slot while requests of
    lower priority (a larger priority value) held slots throughout its wait.

    ``slot_steps``: steps of its wait whose head_blocked_by was a full running queue;
    ``lower``: ``(req_id, priority)`` of running requests admitted before it arrived and
    still running when it was admitted (up to 4)."""

    req_id: str
    priority: int
    arrival_step: int
    first_step: int
    slot_steps: int
    reasons: dict[str, int]
    lower: list[tuple[str, int]]


class _Pass:
    """A first prefill pass in progress: chunks so far, whether a step of it decoded
    anything, the KV tokens its later chunks re-read, its first step."""

    __slots__ = ("chunks", "decoded", "reread", "first_step")

    def __init__(self, first_step: int) -> None:
        self.chunks = 0
        self.decoded = False
        self.reread = 0
        self.first_step = first_step


class EngineEpisodes:
    """The episodes of one engine core (see the module docstring)."""

    def __init__(self, eng: EngineState) -> None:
        self.engine = eng.engine
        self.eng = eng
        # waits
        self._arrival_counts: dict[str, dict[str, int]] = {}  # head_blocked_counts at arrival
        self._snapshot: tuple[int, dict[str, int]] | None = None  # (last_step, counts), shared per step
        #: admitted, first token not yet known: req_id -> (arrival_step, first_step, prompt_len,
        #: head_blocked_counts at arrival, at admission); a Wait is made only when reported
        self._waiting: dict[str, _Waiting] = {}
        self.longest_waits = Ranked(TOP_K)
        self.blocked_short = Ranked(TOP_K)  # short requests whose TTFT was mostly queue time
        self.blocked_short_count = 0
        self.finished_waits = 0  # requests whose wait was complete when they finished
        # prefill chunks: this step's, and a ring of the latest (step, request, tokens)
        self._step_chunks: list[tuple[str, int, bool]] = []  # (req_id, tokens, last)
        self._ring: list[tuple[int, str, int, int]] = []  # (step, req_id, tokens, prompt_len), by step
        self._passes: dict[str, _Pass] = {}
        self.chunked_alone = ChunkedAlone()
        self.held = HeldSlots()
        # priority policy: running requests' (admission step, priority), and the waits for a slot
        self._running_since: dict[str, tuple[int, int | None]] = {}
        self.priority_waits = Ranked(TOP_K)
        self.priority_wait_count = 0
        # preemptions
        self.preempting_steps = Ranked(TOP_K)
        self.first_preempt: tuple[int, int] | None = None  # (step, running queue after it)
        self._preempt_steps: dict[str, list[int]] = {}
        self.repeated = Ranked(TOP_K)
        self.victim_priorities: dict[int, int] = {}  # preemptions per victim's priority value
        # KV demand at full length of the admitted requests, in blocks
        self._admitted: dict[str, int] = {}
        self.demand_blocks = 0
        self.peak_demand_blocks = 0
        self.peak_running = 0
        self.peak_step: int | None = None
        self.full_blocks_max = 0  # the largest request's blocks at full length
        self.full_blocks_seen: dict[int, int] = {}  # blocks at full length -> requests (histogram)

    # -- reads that need the ring --------------------------------------------------------

    def takers(self, first_step: int, end_step: int, exclude: str | None = None,
               n: int = 2) -> tuple[list[tuple[str, int, int | None]], int, bool]:
        """Who took the prefill budget in steps ``[first_step, end_step)``.

        Returns ``([(req_id, prefill tokens, prompt_len)], all prefill tokens in the range,
        complete)``, the ``n`` largest first; ``complete`` is False when the range starts
        before the oldest chunk kept (:data:`CHUNK_RING`).
        """
        ring = self._ring
        lo = bisect_left(ring, first_step, key=_step_of)
        hi = bisect_left(ring, end_step, key=_step_of)
        by: dict[str, int] = {}
        prompt: dict[str, int] = {}
        total = 0
        for _, rid, t, plen in ring[lo:hi]:
            if rid == exclude:
                continue
            by[rid] = by.get(rid, 0) + t
            prompt[rid] = plen
            total += t
        complete = not ring or ring[0][0] <= first_step or len(ring) < CHUNK_RING
        top = heapq.nlargest(n, by.items(), key=lambda kv: (kv[1], kv[0]))
        return [(rid, t, prompt.get(rid) or None) for rid, t in top], total, complete

    def first_chunk_steps(self, req_ids: list[str]) -> list[int | None]:
        """The step of each request's first prefill chunk: from the state when it is known
        there, else the oldest one in the chunk ring (one pass over it for all of them;
        None: not seen)."""
        found: dict[str, int | None] = {}
        for rid in req_ids:
            req = self.eng.requests.get(rid)
            found[rid] = req.first_scheduled_step if req is not None else None
        missing = {rid for rid, step in found.items() if step is None}
        if missing:
            for step, rid, _, _ in self._ring:
                if rid in missing:
                    found[rid] = step
                    missing.discard(rid)
                    if not missing:
                        break
        return [found[rid] for rid in req_ids]

    def block_takers(self, run: StepRun, n: int = 2) -> list[tuple[str, int, int | None]]:
        """The ``n`` requests with the most prefill tokens in a prefill block."""
        return self.takers(run.first_step, run.last_step + 1, n=n)[0]

    def all_repeated(self) -> list[Repeated]:
        """Requests preempted at least twice (finished ones kept, unfinished ones from the
        state), most preempted first."""
        out = self.repeated.items()
        for rid, steps in self._preempt_steps.items():
            req = self.eng.requests.get(rid)
            if req is not None and req.preemptions >= 2:
                out.append(Repeated(rid, self.engine, req.preemptions, list(steps), req.discarded_tokens,
                                    req.prompt_len, False))
        return sorted(out, key=lambda r: (-r.preemptions, -r.discarded_tokens, r.req_id))

    def all_waits(self) -> list[Wait]:
        """Kept longest waits plus the requests admitted and not yet finished, and those
        still waiting (their wait so far), longest first."""
        out = self.longest_waits.items() + [self._wait(rid, w) for rid, w in self._waiting.items()]
        last = self.eng.last_step
        counts = self.eng.head_blocked_counts
        for rid, start in self._arrival_counts.items():
            req = self.eng.requests.get(rid)
            if req is None or req.first_scheduled_step is not None:
                continue
            out.append(Wait(rid, self.engine, req.arrival_step, last + 1, req.prompt_len,
                            _diff(counts, start)))
        return sorted(out, key=lambda w: (-w.steps, w.arrival_step, w.req_id))

    # -- helpers -------------------------------------------------------------------------

    def _wait(self, rid: str, w: _Waiting) -> Wait:
        arrival, first, plen, then, now = w
        return Wait(rid, self.engine, arrival, first, plen, _diff(now, then) if then is not None else {})

    def _counts_now(self) -> dict[str, int]:
        """A copy of the state's ``head_blocked_counts`` as of the last step, shared by
        every arrival and admission until the next step."""
        snap = self._snapshot
        last = self.eng.last_step
        if snap is None or snap[0] != last:
            snap = self._snapshot = (last, dict(self.eng.head_blocked_counts))
        return snap[1]

    def _head_request(self) -> RequestState | None:
        """The request the scheduler most likely has at the head of its waiting queue
        (the events do not name it), in FCFS order: the latest preempted one (vLLM
        prepends it), else the earliest arrival. Under the priority policy the guess can
        be wrong (the state does not keep priorities). O(requests known); called once per
        stall, not per step."""
        waiting = [r for r in self.eng.requests.values() if r.phase in ("waiting", "preempted")]
        if not waiting:
            return None
        preempted = [r for r in waiting if r.last_preempt_step is not None]
        if preempted:
            return max(preempted, key=lambda r: (r.last_preempt_step, r.req_id))
        return min(waiting, key=lambda r: (r.arrival_step, r.arrival_ts or 0.0, r.req_id))


def _step_of(entry: tuple[int, str, int, int]) -> int:
    return entry[0]


def _diff(now: dict[str, int], then: dict[str, int]) -> dict[str, int]:
    """Steps per reason between two snapshots of ``EngineState.head_blocked_counts``."""
    return {k: n - then.get(k, 0) for k, n in now.items() if n - then.get(k, 0)}


class Episodes(StateListener):
    """The episodes of every engine core of a run (:class:`EngineEpisodes` by rank).

    Attach it to the state: ``RunState(listener=Episodes())``; read ``episodes.engines``
    (or :meth:`of`) after the events were applied, as often as wanted (live).
    """

    def __init__(self) -> None:
        self.engines: dict[int, EngineEpisodes] = {}
        self._last_eng: EngineState | None = None  # the engine of the previous event, and its episodes
        self._last_ep: EngineEpisodes  # set with _last_eng: read only when an event's engine is that one

    def of(self, eng: EngineState) -> EngineEpisodes:
        if eng is self._last_eng:
            return self._last_ep
        ep = self.engines.get(eng.engine)
        if ep is None:
            ep = self.engines[eng.engine] = EngineEpisodes(eng)
        self._last_eng, self._last_ep = eng, ep
        return ep

    # -- transitions ---------------------------------------------------------------------

    def on_added(self, eng: EngineState, req: RequestState, ev: Any) -> None:
        ep = self._last_ep if eng is self._last_eng else self.of(eng)
        ep._arrival_counts[req.req_id] = ep._counts_now()

    def on_chunk(self, eng: EngineState, req: RequestState, ev: Any) -> None:
        ep = self._last_ep if eng is self._last_eng else self.of(eng)
        rid = req.req_id
        start = ev.start or 0
        tokens = (start if ev.end is None else ev.end) - start
        step = ev.step if ev.step is not None else eng.last_step + 1
        last = bool(ev.last)
        ep._step_chunks.append((rid, tokens, last))
        ring = ep._ring
        if ring and step < ring[-1][0]:  # out of order (a hostile or merged log): keep the ring sorted
            step = ring[-1][0]
        ring.append((step, rid, tokens, req.prompt_len or 0))
        if len(ring) >= 2 * CHUNK_RING:
            del ring[:CHUNK_RING]
        index = ev.chunk_index or 0
        if index == 0:
            self._admit(ep, req, step)
            if not ev.resumed:
                if not last:  # a pass in one chunk cannot be chunked without benefit
                    ep._passes[rid] = _Pass(step)
                if req.first_scheduled_step == ev.step:
                    ep._waiting[rid] = (req.arrival_step, step, req.prompt_len, ep._arrival_counts.pop(rid, None),
                                        ep._counts_now())
                    cfg = eng.config
                    if cfg is not None and cfg.scheduling_policy == "priority":
                        self._priority_admitted(ep, req, step, ep._waiting[rid])
            if eng.config is not None and eng.config.scheduling_policy == "priority":
                ep._running_since.setdefault(rid, (step, req.priority))
        if ep._passes:
            p = ep._passes.get(rid)
            if p is not None:
                p.chunks += 1
                if index:
                    p.reread += start

    def _admit(self, ep: EngineEpisodes, req: RequestState, step: int) -> None:
        cfg = ep.eng.config
        block = cfg.block_size if cfg is not None else None
        if not block or req.req_id in ep._admitted:
            return
        full = (req.prompt_len or 0) + (req.max_tokens or 0)
        if cfg.max_model_len:
            full = min(full, cfg.max_model_len)
        blocks = _cdiv(full, block)
        ep._admitted[req.req_id] = blocks
        ep.full_blocks_seen[blocks] = ep.full_blocks_seen.get(blocks, 0) + 1
        if blocks > ep.full_blocks_max:
            ep.full_blocks_max = blocks
        ep.demand_blocks += blocks
        if ep.demand_blocks > ep.peak_demand_blocks:
            ep.peak_demand_blocks = ep.demand_blocks
            ep.peak_running = len(ep._admitted)
            ep.peak_step = step

    def _priority_admitted(self, ep: EngineEpisodes, req: RequestState, step: int, w: _Waiting) -> None:
        """A request admitted under the priority policy: did it wait for a slot that requests of
        lower priority held throughout its wait (:class:`PriorityWait`)?"""
        arrival, _, _, then, now = w
        if req.priority is None or then is None:
            return
        reasons = _diff(now, then)
        slot_steps = sum(reasons.get(r, 0) for r in HELD_REASONS)
        if slot_steps < PRIORITY_WAIT_MIN_STEPS:
            return
        lower = sorted(((rid, p) for rid, (since, p) in ep._running_since.items()
                        if since <= arrival and p is not None and p > req.priority), key=lambda x: (-x[1], x[0]))
        if not lower:
            return
        ep.priority_wait_count += 1
        ep.priority_waits.offer((slot_steps, -arrival), PriorityWait(
            req.req_id, req.priority, arrival, step, slot_steps, reasons, lower[:4]))

    def _release(self, ep: EngineEpisodes, rid: str) -> None:
        ep._running_since.pop(rid, None)
        blocks = ep._admitted.pop(rid, None)
        if blocks is not None:
            ep.demand_blocks -= blocks

    def on_preempt(self, eng: EngineState, req: RequestState, ev: Any) -> None:
        ep = self._last_ep if eng is self._last_eng else self.of(eng)
        rid = req.req_id
        self._release(ep, rid)
        ep._passes.pop(rid, None)
        if req.priority is not None:
            ep.victim_priorities[req.priority] = ep.victim_priorities.get(req.priority, 0) + 1
        if ep.first_preempt is None and ev.step is not None and ev.running is not None:
            ep.first_preempt = (ev.step, ev.running)
        steps = ep._preempt_steps.get(rid)
        if steps is None:
            steps = ep._preempt_steps[rid] = []
        if len(steps) < PREEMPT_STEPS_KEEP and ev.step is not None:
            steps.append(ev.step)

    def on_finished(self, eng: EngineState, req: RequestState) -> None:
        ep = self._last_ep if eng is self._last_eng else self.of(eng)
        rid = req.req_id
        self._release(ep, rid)
        ep._passes.pop(rid, None)
        ep._arrival_counts.pop(rid, None)
        steps = ep._preempt_steps.pop(rid, None)
        if req.preemptions >= 2:
            ep.repeated.offer((req.preemptions, req.discarded_tokens), Repeated(
                rid, eng.engine, req.preemptions, steps or [], req.discarded_tokens, req.prompt_len, True))
        w = ep._waiting.pop(rid, None)
        if w is None:
            return
        ep.finished_waits += 1
        arrival, first, plen, _, _ = w
        wait_steps = first - arrival
        queue_s, ttft_s = req.queue_time_s, req.ttft_s
        key = (wait_steps, queue_s or 0.0)
        budget = eng.config.max_num_batched_tokens if eng.config is not None else None
        to_compute = None if plen is None else plen - (req.prefix_hit_tokens or 0)
        blocked = (budget and to_compute is not None and to_compute <= SHORT_PROMPT_SHARE * budget and wait_steps > 0
                   and queue_s is not None and ttft_s and queue_s >= QUEUE_SHARE_OF_TTFT * ttft_s)
        if blocked:
            ep.blocked_short_count += 1
        if ep.longest_waits.would_enter(key) or (blocked and ep.blocked_short.would_enter(key)):
            wait = ep._wait(rid, w)
            wait.queue_s, wait.ttft_s, wait.ttft_steps = queue_s, ttft_s, req.ttft_steps
            wait.hit_tokens = req.prefix_hit_tokens or 0
            ep.longest_waits.offer(key, wait)
            if blocked:
                ep.blocked_short.offer(key, wait)

    def on_step(self, eng: EngineState, ev: Any) -> None:
        ep = self._last_ep if eng is self._last_eng else self.of(eng)
        chunks = ep._step_chunks
        if chunks:
            passes = ep._passes
            if passes:
                self._step_chunks_done(ep, ev, chunks, passes)
            chunks.clear()
        if ev.preempted:
            step = eng.last_step if ev.step is None else ev.step
            ep.preempting_steps.offer((len(ev.preempted), -step), (step, list(ev.preempted)))
        if ev.waiting:
            cfg = eng.config
            if cfg is not None and (cfg.async_scheduling or cfg.scheduler_class == "AsyncScheduler"):
                self._held_step(ep, eng, ev, cfg.max_num_seqs)
        stall = eng.timeline.stalls.open
        if stall is not None and stall.head is None and stall.steps == 1:  # a stall begins: who is the head
            head = ep._head_request()
            if head is not None:
                stall.head, stall.head_prompt_len = head.req_id, head.prompt_len

    def _held_step(self, ep: EngineEpisodes, eng: EngineState, ev: Any, seqs: int | None) -> None:
        """One step of an async engine core after which requests waited (:class:`HeldSlots`)."""
        h = ep.held
        h.waiting_steps += 1
        running = ev.running or 0
        reason = ev.head_blocked_by
        if not seqs or running < seqs or (reason is not None and reason not in HELD_REASONS):
            return
        held = running - (ev.prefill_reqs or 0) - (ev.decode_reqs or 0)
        if held <= 0:
            return
        step = eng.last_step if ev.step is None else ev.step
        tokens = ev.scheduled_tokens or 0
        h.steps += 1
        h.slot_steps += held
        h.held_max = max(h.held_max, held)
        if h.first_step < 0:
            h.first_step = step
        h.last_step = step
        h.running_max = max(h.running_max, running)
        h.waiting_max = max(h.waiting_max, ev.waiting)
        h.tokens_min = tokens if h.tokens_min < 0 else min(h.tokens_min, tokens)
        h.tokens_max = max(h.tokens_max, tokens)
        h.tokens_sum += tokens
        key = reason or "unrecorded"
        h.reasons[key] = h.reasons.get(key, 0) + 1

    def _step_chunks_done(self, ep: EngineEpisodes, ev: Any, chunks: list[tuple[str, int, bool]],
                          passes: dict[str, _Pass]) -> None:
        """The step of ``chunks`` ended: did anything decode beside them, did a pass end."""
        if ev.decode_tokens:
            for rid, _, _ in chunks:
                p = passes.get(rid)
                if p is not None:
                    p.decoded = True
        for rid, _, last in chunks:
            if last:
                p = passes.pop(rid, None)
                if p is not None and p.chunks >= 2 and not p.decoded:
                    self._chunked_alone(ep, rid, p, ev.step if ev.step is not None else ep.eng.last_step)

    def _chunked_alone(self, ep: EngineEpisodes, rid: str, p: _Pass, step: int) -> None:
        c = ep.chunked_alone
        c.prompts += 1
        c.extra_steps += p.chunks - 1
        c.reread_tokens += p.reread
        if len(c.requests) < CHUNKED_ALONE_KEPT:
            c.requests.append(rid)
        req = ep.eng.requests.get(rid)
        plen = (req.prompt_len if req is not None else None) or 0
        if plen > c.longest_prompt or c.example is None:
            c.longest_prompt, c.example, c.example_steps = plen, rid, (p.first_step, step)


# -- notable moments of a finished run (dashboard, summary) -----------------------------------


@dataclass
class Moment:
    """A step range worth looking at, with what happened (``tail --replay --from-step``).

    Attributes:
        kind: ``preemptions`` (the steps with the most preemptions), ``wait`` (a longest
            wait and who caused it), ``prefill_block`` (the longest run of full-budget
            prefill steps while others waited), ``stall`` (steps that scheduled nothing
            while requests waited).
        engine: data-parallel rank.
        first_step, last_step: the steps (inclusive).
        text: one line with the run's numbers.
        req_ids: the requests named.
    """

    kind: str
    engine: int
    first_step: int
    last_step: int
    text: str
    req_ids: list[str] = field(default_factory=list)


#: Moments of each kind listed (at most).
MOMENTS_PER_KIND = {"preemptions": 2, "wait": 2, "prefill_block": 1, "stall": 1}


def _reasons_text(reasons: dict[str, int]) -> str:
    total = sum(reasons.values())
    if not total:
        return ""
    top = sorted(reasons.items(), key=lambda kv: -kv[1])[:2]
    return ", ".join(f"{k} {round(100 * n / total)}%" for k, n in top)


def notable_moments(state: RunState, episodes: Episodes) -> list[Moment]:
    """The notable moments of a run, in step order within each engine core: the steps
    with the most preemptions, the longest waits and who took the budget meanwhile, the
    longest run of full-budget prefill steps while others waited, the longest stall.
    Counts per kind: :data:`MOMENTS_PER_KIND`."""
    out: list[Moment] = []
    for idx in sorted(episodes.engines):
        ep = episodes.engines[idx]
        for step, victims in ep.preempting_steps.items()[:MOMENTS_PER_KIND["preemptions"]]:
            n = len(victims)
            who = ", ".join(victims[:3]) + (f" +{n - 3}" if n > 3 else "")
            out.append(Moment("preemptions", idx, step, step, f"{n} preemption{'s' if n != 1 else ''}: {who}",
                              list(victims)))
        for w in ep.all_waits()[:MOMENTS_PER_KIND["wait"]]:
            if w.steps <= 0:
                continue
            takers, _, _ = ep.takers(w.arrival_step, w.first_step, exclude=w.req_id)
            by = "; budget to " + ", ".join(f"{rid} {t:,} tok" for rid, t, _ in takers) if takers else ""
            why = _reasons_text(w.reasons)
            admitted = f"admitted at step {w.first_step}" if w.first_step <= state.engines[idx].last_step \
                else "still waiting"
            out.append(Moment("wait", idx, w.arrival_step, w.first_step,
                              f"{w.req_id} waited {w.steps:,} steps ({admitted}"
                              + (f"; head blocked by {why}" if why else "") + by + ")",
                              [w.req_id] + [rid for rid, _, _ in takers]))
        tl = state.engines[idx].timeline
        for b in tl.prefill_blocks.all()[:MOMENTS_PER_KIND["prefill_block"]]:
            takers = ep.block_takers(b)
            out.append(Moment("prefill_block", idx, b.first_step, b.last_step,
                              f"{b.steps:,} full-budget prefill step{'s' if b.steps != 1 else ''} while up to "
                              f"{b.waiting_max:,} waited" + (": " if takers else "")
                              + ", ".join(f"{rid} {t:,} tok" for rid, t, _ in takers),
                              [rid for rid, _, _ in takers]))
        for st in tl.stalls.all()[:MOMENTS_PER_KIND["stall"]]:
            why = _reasons_text(st.reasons)
            out.append(Moment("stall", idx, st.first_step, st.last_step,
                              f"{st.steps:,} steps scheduled nothing while up to {st.waiting_max:,} waited"
                              + (f" (head blocked by {why})" if why else "")
                              + (f"; head {st.head}" if st.head else ""),
                              [st.head] if st.head else []))
    out.sort(key=lambda m: (m.engine, m.first_step, m.kind))
    return out
