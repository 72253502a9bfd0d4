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
from typing import Any

from .requests import RequestState
from .engine_state import EngineState
from .state import StateListener
from .timeline import Ranked, StepRun
from .episode_types import (
    CHUNKED_ALONE_KEPT, HELD_REASONS, PRIORITY_WAIT_MIN_STEPS, ChunkedAlone, HeldSlots, PriorityWait, Repeated, Wait,
)

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


#: An admitted request whose first token is not known yet: (arrival_step, first_step,
#: prompt_len, head_blocked_counts at arrival or None, at admission).
_Waiting = tuple[int, int, int | None, dict[str, int] | None, dict[str, int]]


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
