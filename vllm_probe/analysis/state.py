"""Scheduler state rebuilt from events: per engine, per step (rolling), per request.

The one request-lifecycle model: it feeds the dashboard, the ``--plain`` lines, the
summary, compare, the doctor, the metrics and the Perfetto export, so every view agrees
on what "queue time" or "time to first token" means. What is kept per engine core, and
how memory stays bounded: :mod:`vllm_probe.analysis.engine_state`. A consumer that needs
every finished request (the summary) sets ``RunState.on_request_finished``, one that
follows every transition (the Perfetto export, the doctor's episodes) a
:class:`StateListener`. Events come in as the records of
:mod:`vllm_probe.schema.records` (what the reader yields) or as dicts (hand-made
streams), which are converted first.

Requests and their timings: :mod:`vllm_probe.analysis.requests`.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Callable, Iterable

from ..schema.records import STRUCTS
from .engine_state import (
    KNOWN_REASONS, FINISHED_KEEP, OTHER_REASON, STEP_WINDOW, EngineState, StepRecord, count_value,
)
from .figures import DECODE_PERIOD_BUCKETS_PER_S, chunk_reread_tokens, preempt_reason, share
from .timeline import FULL_BUDGET_SHARE, MAX_SPANS
from .requests import DECODE, FINISHED, PREEMPTED, PREFILL, RequestState


class RunState:
    """All engines of a run, updated one event at a time with :meth:`apply`.

    Args:
        step_window: recent steps kept per engine (rolling chart, rates).
        finished_keep: finished requests kept per engine (request table).
        on_request_finished: called with each :class:`RequestState` as it finishes.
        listener: a :class:`StateListener` told of every transition.
        timeline_spans: spans each engine core's timeline keeps (:class:`~vllm_probe.analysis.timeline.Timeline`).
        buckets: keep ``EngineState.schedule_s`` (the metrics' bucketed schedule times);
            False for consumers that never read it (summary, doctor): one bisect less per step.
    """

    def __init__(
        self,
        step_window: int = STEP_WINDOW,
        finished_keep: int = FINISHED_KEEP,
        on_request_finished: Callable[[RequestState], None] | None = None,
        listener: StateListener | None = None,
        timeline_spans: int = MAX_SPANS,
        buckets: bool = True,
    ) -> None:
        self.engines: dict[int, EngineState] = {}
        self.step_window = step_window
        self.finished_keep = finished_keep
        self.timeline_spans = timeline_spans
        self.buckets = buckets
        self.on_request_finished = on_request_finished
        self.listener = listener
        self.events = 0
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
            eng = self.engines[idx] = EngineState(idx, self.step_window, self.finished_keep, self.timeline_spans)
        return eng

    def apply(self, ev: Any) -> None:
        """Update the state with one record of :mod:`vllm_probe.schema.records` (as the
        reader yields them; past the reader there are only records).

        Raises:
            TypeError: ``ev`` is a dict (decode it with :mod:`vllm_probe.runs.reader`, or
                build the record: ``tests/_events.py``'s ``records``).
        """
        handler = self._handlers.get(type(ev))
        if handler is None:
            if type(ev) is dict:
                raise TypeError("RunState.apply takes records (vllm_probe.schema.records), not event dicts")
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
        self.events += 1
        handler(eng, ev)

    def apply_batch(self, batch: list[Any]) -> None:
        """Update the state with a list of records, in order: the same as :meth:`apply` on
        each (records only, not dicts: what :func:`~vllm_probe.runs.reader.iter_file_batches`
        yields), with the per-event bookkeeping (engine core, pids, time range, count)
        done once per run of records of the same engine core (summary's and doctor's hot
        loop; no handler reads the time range or the count mid-stream)."""
        handlers = self._handlers
        eng: EngineState | None = None
        idx = -1
        pids: set[int] = set()
        first = last = 0.0
        n = 0
        for ev in batch:
            handler = handlers.get(type(ev))
            if handler is None:
                continue
            if ev.engine != idx:
                if eng is not None:
                    self._range(eng, first, last)
                idx = ev.engine
                eng = self.engines.get(idx) or self.engine(idx)
                pids = eng.pids
                first = last = ev.ts
            ts = ev.ts
            if ts > last:
                last = ts
            elif ts < first:
                first = ts
            pid = ev.pid
            if pid is not None and pid not in pids:
                pids.add(pid)
            n += 1
            assert eng is not None  # bound at the first record (idx starts at -1)
            handler(eng, ev)
        if eng is not None:
            self._range(eng, first, last)
        self.events += n

    @staticmethod
    def _range(eng: EngineState, first: float, last: float) -> None:
        """Widen the engine core's event time range to ``[first, last]`` (epoch s)."""
        if eng.last_ts is None:
            eng.first_ts, eng.last_ts = first, last
            return
        if last > eng.last_ts:
            eng.last_ts = last
        if eng.first_ts is None or first < eng.first_ts:
            eng.first_ts = first

    def apply_all(self, events: Iterable[Any]) -> RunState:
        apply = self.apply
        for ev in events:
            apply(ev)
        return self

    # -- totals across engines ----------------------------------------------------------

    @property
    def first_ts(self) -> float | None:
        """The earliest event time of any engine core (epoch s; None before the first event)."""
        return min((e.first_ts for e in self.engines.values() if e.first_ts is not None), default=None)

    @property
    def last_ts(self) -> float | None:
        """The latest event time of any engine core (epoch s; None before the first event)."""
        return max((e.last_ts for e in self.engines.values() if e.last_ts is not None), default=None)

    def total(self, attr: str) -> int | float:
        total: int | float = sum(getattr(e, attr) for e in self.engines.values())
        return total

    def stepping_s(self) -> float | None:
        """Seconds the schedulers were stepping: from the earliest step's start (its ``ts``
        minus its ``schedule_us``) to the latest step's ``ts``, across engines; None
        before the first step. Unlike the command's wall time, no engine start-up."""
        starts = [e.stepping_since for e in self.engines.values() if e.stepping_since is not None]
        if not starts:
            return None
        return max(max(e.last_step_ts for e in self.engines.values() if e.last_step_ts is not None)
                   - min(starts), 0.0)

    def busy_s(self) -> float | None:
        """Seconds the busiest engine core had at least one request: per engine core, from
        a ``request_added`` that finds it empty to the ``request_finished`` (or a step's
        ``finished`` id) that empties it, summed over such periods (a period still open
        counts up to that core's latest event); the run's figure is the largest core's, so
        it does not depend on how the cores' files interleave. None without
        ``request_added`` events.

        On a server, :meth:`stepping_s` (a run's ``duration``) also counts the idle time
        between bursts: two bursts of 5 s and 17 s, 31.8 s apart, read 53.8 s of duration
        and 22 s busy (tests/analysis/test_busy.py). Output tokens per busy second is the
        engine's throughput while it had work."""
        busiest = None
        for eng in self.engines.values():
            b = eng.busy_total_s
            if eng.busy_since is not None:
                last = eng.last_ts if eng.last_ts is not None else eng.busy_since
                b += max(last - eng.busy_since, 0.0)
            elif not b:
                continue
            busiest = b if busiest is None else max(busiest, b)
        return busiest

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

    def _engine_config(self, eng: EngineState, ev: Any) -> None:
        if eng.config is None:
            eng.started_ts = ev.ts
            if ev.segment is not None:  # a segment's copy first: retention removed the start
                eng.window_segment = ev.segment
        flags = ev.flags
        if type(flags) is dict:
            eng._requests_logged = flags.get("log_request_events", True) is not False
        eng.config = ev
        eng.max_num_seqs = ev.max_num_seqs
        if eng.speed_mark_start_us is None:
            eng.speed_mark_start_us = ev.speed_mark_us

    def _step(self, eng: EngineState, ev: Any) -> None:
        # the hot path of every reader (most lines are steps): each field and attribute is
        # read once into a local, bound_by is inlined, and the schedule-time buckets are
        # kept only when a consumer asks (``buckets``)
        step = ev.step
        last_step = eng.last_step
        if step is None:
            step = last_step + 1
        timeline = eng.timeline  # fed as Timeline's docstring says: a span opens before its first step counts
        ts = ev.ts
        if not timeline.left:
            timeline.open_span(step, ts)
        timeline.left -= 1
        if step > last_step:
            eng.last_step = step
        eng.steps += 1
        scheduled = ev.scheduled_tokens or 0
        budget = ev.token_budget
        prefill = ev.prefill_tokens
        decode = ev.decode_tokens
        schedule_us = ev.schedule_us
        if schedule_us is None:
            schedule_us = 0.0
        elif self.buckets:
            eng.schedule_s.add(schedule_us * 1e-6)
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
        key = (running, waiting)
        hist = eng.queue_steps
        hist[key] = hist.get(key, 0) + 1
        if n_preempted:
            eng.preempt.in_step_lists += n_preempted
            per_step = eng.preempt.per_step
            per_step[n_preempted] = per_step.get(n_preempted, 0) + 1
        # figures.bound_by, inlined
        if budget is not None and scheduled >= budget:
            bound = "token_budget"
        elif waiting and eng.max_num_seqs is not None and running >= eng.max_num_seqs:
            bound = "max_num_seqs"
        elif waiting or n_preempted:
            bound = "kv_cache"
        else:
            bound = "none"
        eng.bound_counts[bound] += 1
        blocked = ev.head_blocked_by
        if blocked is not None:
            if blocked not in KNOWN_REASONS:
                blocked = OTHER_REASON
            counts = eng.head_blocked_counts
            counts[blocked] = counts.get(blocked, 0) + 1
        kv = ev.kv_usage or 0.0
        budget_or_0 = budget or 0
        eng.budget_total += budget_or_0
        eng.running_total += running
        eng.waiting_total += waiting
        eng.kv_total += kv
        timeline.peaks(running, waiting, kv)
        if waiting and not scheduled:
            eng.idle_waiting_steps += 1
        # only a stall, a full-budget step or an open run can start, extend or end a run
        if timeline.runs_open or (waiting and (not scheduled or (budget and scheduled >= FULL_BUDGET_SHARE * budget))):
            timeline.runs(step, scheduled, budget_or_0, prefill or 0, waiting, blocked)
        if self.step_window:
            eng.window.append(StepRecord(
                step, ts, scheduled, budget_or_0, prefill, decode, running, waiting, kv, schedule_us,
                n_preempted, bound, blocked,
            ))
        key = (scheduled, budget_or_0)
        hist = eng.step_tokens
        hist[key] = hist.get(key, 0) + 1
        self._step_end(eng, ev, step, ts, schedule_us)

    def _step_end(self, eng: EngineState, ev: Any, step: int, ts: float, schedule_us: float) -> None:
        """The rest of a step event: its timing (``schedule_us`` in µs, ``ts`` in seconds),
        the period since the step before when both only decoded, the requests it finished
        and the first tokens it delivered."""
        prev = eng.latest
        eng.latest = ev
        if ev.decode_tokens and not ev.prefill_tokens and prev is not None and not prev.prefill_tokens:
            batch = ev.decode_reqs
            if batch and batch == prev.decode_reqs and ts > prev.ts:
                key = (batch, int((ts - prev.ts) * DECODE_PERIOD_BUCKETS_PER_S + 0.5))  # to the nearest 10 µs
                hist = eng.decode_periods
                hist[key] = hist.get(key, 0) + 1
        if schedule_us > eng.schedule_us_max:
            eng.schedule_us_max = schedule_us
        start = ts - schedule_us * 1e-6
        since = eng.stepping_since
        if since is None or start < since:
            eng.stepping_since = start
        last_ts = eng.last_step_ts
        if last_ts is None or ts > last_ts:
            eng.last_step_ts = ts
        finished = ev.finished
        if finished:
            # Normally request_finished came first and the request is gone already; with
            # log_request_events off this is the only sign, and keeps memory bounded.
            requests = eng.requests
            for rid in finished:
                if rid in requests:
                    self._finish(eng, rid, ts, None, None, None)
        if eng.awaiting_first_token:
            done = [r for r in eng.awaiting_first_token.values()
                    if r.first_token_step is not None and r.first_token_step < step]
            for req in done:
                req.first_token_ts = ts
                del eng.awaiting_first_token[req.req_id]
                self._first_token(eng, req)
        if self.listener is not None:
            self.listener.on_step(eng, ev)

    def _chunk(self, eng: EngineState, ev: Any) -> None:
        req = eng.request(ev.req_id)
        pf = eng.prefill
        pf.chunks += 1
        req.chunks += 1
        start = ev.start or 0
        end = start if ev.end is None else ev.end
        index = ev.chunk_index or 0
        pf.chunk_tokens += end - start
        reread = chunk_reread_tokens(index, start)
        pf.reread_kv_tokens += reread
        req.reread_tokens += reread
        if ev.prompt_len is not None:
            req.prompt_len = ev.prompt_len
        if index == 0:
            req.passes += 1
            hits = start if ev.prefix_hit_tokens is None else ev.prefix_hit_tokens
            if ev.step != eng.hits_step:
                eng.hits_step, eng.step_prefix_hits = ev.step, 0
            eng.step_prefix_hits += hits
            if ev.resumed:
                pf.resumed_passes += 1
                pf.resumed_prefix_hit_tokens += hits
                pf.resumed_prefill_tokens += ev.prefill_len if ev.prefill_len is not None else end
            else:
                pf.first_passes += 1
                pf.prefix_hit_tokens += hits
                pf.first_pass_prompt_tokens += ev.prompt_len if ev.prompt_len is not None else end
                if hits:
                    pf.requests_with_prefix_hits += 1
            if req.first_scheduled_ts is None:
                req.first_scheduled_ts = ev.ts
                req.first_scheduled_step = ev.step
                req.prefix_hit_tokens = hits
                queue_s = req.queue_time_s
                if queue_s is not None:
                    eng.queue_s.add(queue_s)
        if ev.resumed:
            req.recomputed_tokens += end - start
            eng.preempt.recomputed_tokens += end - start
            eng.recent_recomputed.append((ev.step, end - start))
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
                eng.awaiting_first_token[req.req_id] = req
                hist = pf.first_pass_chunks
                hist[index + 1] = hist.get(index + 1, 0) + 1
        else:
            req.phase = PREFILL
        if self.listener is not None:
            self.listener.on_chunk(eng, req, ev)

    def _preempt(self, eng: EngineState, ev: Any) -> None:
        req = eng.request(ev.req_id)
        p = eng.preempt
        p.events += 1
        if not req.preemptions:
            p.requests += 1
        discarded = ev.discarded_tokens or 0
        p.discarded_tokens += discarded
        reason = preempt_reason(ev.reason)
        p.by_reason[reason] = p.by_reason.get(reason, 0) + 1
        p.discarded_by_reason[reason] = p.discarded_by_reason.get(reason, 0) + discarded
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
        eng.preempt_seen.add(ev)
        eng.recent_preempts.append(ev)
        if self.listener is not None:
            self.listener.on_preempt(eng, req, ev)

    def _added(self, eng: EngineState, ev: Any) -> None:
        eng.requests_added += 1
        if eng.busy_since is None:  # the first request of the engine core's busy period
            eng.busy_since = ev.ts
        req = eng.requests.get(ev.req_id)
        if req is None:
            req = eng.requests[ev.req_id] = RequestState(ev.req_id, eng.engine)
        req.arrival_step = eng.last_arrival_step = eng.last_step + 1
        req.prompt_len = ev.prompt_len
        req.max_tokens = ev.max_tokens
        req.priority = ev.priority
        req.arrival_ts = ev.ts if ev.arrival_ts is None else ev.arrival_ts
        # per request, not per step; inlined (a summary counts tens of thousands)
        for hist, value in ((eng.priorities, ev.priority), (eng.seen_max_tokens, ev.max_tokens),
                            (eng.seen_temperature, ev.temperature), (eng.seen_top_p, ev.top_p)):
            if value is not None:
                n = hist.get(value)
                if n is not None:
                    hist[value] = n + 1
                else:
                    count_value(hist, value)
        if self.listener is not None:
            self.listener.on_added(eng, req, ev)

    def _finished(self, eng: EngineState, ev: Any) -> None:
        self._finish(eng, ev.req_id, ev.ts, ev.reason, ev.output_tokens, ev.num_preemptions)

    def _finish(self, eng: EngineState, req_id: str, ts: float, reason: str | None, output_tokens: int | None,
                num_preemptions: int | None) -> None:
        req = eng.requests.pop(req_id, None)
        if req is None:  # nothing of it read before its end: added before the window
            req = RequestState(req_id, eng.engine)
            if eng._requests_logged:
                req.before_window = True
                eng.requests_before_window += 1
        eng.requests_finished += 1
        if eng.busy_since is not None and not eng.requests:
            eng.busy_total_s += max(ts - eng.busy_since, 0.0)  # the last request left: idle from here
            eng.busy_since = None
        req.phase = FINISHED
        req.finished_ts = ts
        req.finish_reason = reason
        if output_tokens is not None:
            req.output_tokens = output_tokens
        if num_preemptions is not None:
            req.preemptions = num_preemptions
        if eng.awaiting_first_token.pop(req.req_id, None) is not None:
            req.first_token_ts = ts
            self._first_token(eng, req)
        eng.finished.append(req)
        if self.on_request_finished is not None:
            self.on_request_finished(req)
        if self.listener is not None:
            self.listener.on_finished(eng, req)

    def _probe_stats(self, eng: EngineState, ev: Any) -> None:
        eng.probe_stats[ev.pid] = ev
        if ev.speed_mark_us is not None:  # a line written before the end's mark was taken lacks it
            eng.speed_mark_end_us = ev.speed_mark_us

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


class Listeners(StateListener):
    """Several listeners on one state (``RunState`` takes one): each transition is passed
    to each of them, in the order given (the doctor's episodes and a page's series follow
    the same read)."""

    def __init__(self, *listeners: StateListener) -> None:
        self.listeners = listeners

    def on_added(self, eng: EngineState, req: RequestState, ev: Any) -> None:
        for listener in self.listeners:
            listener.on_added(eng, req, ev)

    def on_chunk(self, eng: EngineState, req: RequestState, ev: Any) -> None:
        for listener in self.listeners:
            listener.on_chunk(eng, req, ev)

    def on_preempt(self, eng: EngineState, req: RequestState, ev: Any) -> None:
        for listener in self.listeners:
            listener.on_preempt(eng, req, ev)

    def on_finished(self, eng: EngineState, req: RequestState) -> None:
        for listener in self.listeners:
            listener.on_finished(eng, req)

    def on_step(self, eng: EngineState, ev: Any) -> None:
        for listener in self.listeners:
            listener.on_step(eng, ev)
