"""Replay a workload through vLLM's real scheduler, the probe installed, on a virtual clock.

The scheduler is the installed vLLM's own ``Scheduler`` (or ``AsyncScheduler`` when the
spec's ``async_scheduling`` is on: whatif's setting, on by default for a run whose
``engine_config`` names ``AsyncScheduler``), built by :mod:`vllm_probe.sim.harness` with no
model; the probe is installed on it (:func:`vllm_probe.engine.patches.install`) with a
:class:`VirtualClock`, so the replay writes the same events as a real engine core, into
an ordinary run directory that every reading command reads unchanged.

**The engine loop** mirrors ``EngineCore`` (``vllm/v1/engine/core.py``, 0.32): before
each iteration the requests that are due are added, in arrival order (the engine drains
its input queue between steps); then ``schedule()``; aborts that are due are processed
just before ``update_from_output`` (``_process_aborts_queue``); ``update_from_output``
gets a fake model output in which every request whose step ends its prefill or decodes
samples one token. With async scheduling (``AsyncScheduler``) the outputs go through a
batch queue of two, as ``EngineCore.step_with_batch_queue`` does: step N+1 is scheduled
before step N's output is processed. Once its last request has finished, a server's engine
core steps once more to report the finished requests (``run_busy_loop`` while
``has_requests()``); an engine core that ``LLM`` steps in its own process does not
(:func:`flushes_when_idle` reads which from the recording), and neither does the replay.

**Tokens**: each request's prompt and answer are rebuilt from its recorded block digests
(:class:`~vllm_probe.sim.tokens.PromptBuilder`), and the fake model samples the answer's planned tokens, so a
prompt that repeats an earlier answer hits that answer's cached blocks as in the engine.

**Arrivals** (``timed``, the default): a request becomes available at its front-end
stamp plus the recorded lag (:meth:`~vllm_probe.analysis.workload.Workload.lag_s`),
clamped into the window the recorded run allows
(:func:`~vllm_probe.analysis.workload.availability_windows`), and is added at the first
step boundary at or after that; members of an offline burst (``anchored``) are added
before the same step index as recorded. When nothing is left to run, the clock jumps to
the next arrival (a real engine core blocks; it never steps idle). Requests of a
closed-loop client (:mod:`vllm_probe.sim.arrivals`: ``closed``, or the workload's
``clients``) are sent by its finishes instead: its first ``N`` as recorded, each later one
when one of its requests finishes, after the think time recorded for that request.
``steps``: every request is added before its recorded step index (exact schedules on any
run; the clock still advances by the model).

**Time**: each step lasts what ``step_time(features)`` says (s, features of
:mod:`vllm_probe.sim.stepmodel`); the clock stands still inside ``schedule()``, so the
simulated ``schedule_us`` is 0 (scheduling time is part of the step period).

**Each request stops after exactly its recorded output tokens**: ``length`` (and
unfinished) requests get ``max_tokens`` equal to that count; ``stop`` requests keep
their ``max_tokens`` and sample a stop token at their last one; aborted ones are aborted
at their recorded time (``steps``: step).
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Sequence

import msgspec

from ..analysis.workload import Workload, WorkloadRequest
from ..engine import patches
from ..engine.hooks import Runtime
from ..schema.events import ENGINE_CONFIG
from ..settings import ProbeFlags
from .harness import SchedulerSpec, block_hash_fn, fit_kwargs, make_scheduler, model_runner_output
from .model_shape import Drafts, as_recorded
from .stepmodel import ShapeTracker, output_features
from .tokens import PromptBuilder, TokenPlan

#: Token id the fake model samples; :data:`STOP_TOKEN` ends a ``stop`` request.
SAMPLE_TOKEN = 7
STOP_TOKEN = 9
#: Consecutive steps that schedule nothing, with nothing left to arrive, before the
#: replay gives up (a request that can never be admitted).
STUCK_STEPS = 10_000
#: Steps between two looks at the clock when the replay has a time limit.
CLOCK_EVERY = 256
#: The start of a :class:`ReplayError`'s message when the replay hit its time limit.
TIME_LIMIT_STOP = "stopped at its time limit"


class ReplayError(RuntimeError):
    """The replay cannot go on (a request that never fits, or its time limit:
    :class:`ReplayTimeLimit`); one line."""


class ReplayTimeLimit(ReplayError):
    """The replay ran past its time limit: ``step`` steps replayed in ``elapsed_s`` wall
    seconds (the message starts with :data:`TIME_LIMIT_STOP`)."""

    def __init__(self, step: int, elapsed_s: float) -> None:
        super().__init__(f"{TIME_LIMIT_STOP} after {elapsed_s:.0f} s, at step {step:,}")
        self.step = step
        self.elapsed_s = elapsed_s

    def __reduce__(self) -> tuple[type, tuple[int, float]]:  # pickled across worker processes
        return type(self), (self.step, self.elapsed_s)


class VirtualClock:
    """The replay's time: epoch seconds, moved by the loop (``time()`` reads it)."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def time(self) -> float:
        return self.now


@dataclass
class ReplayStats:
    """What one replay did.

    Attributes:
        steps: ``schedule()`` calls.
        last_busy_step: the last step that scheduled tokens (-1: none).
        virtual_s: the virtual time from the first arrival to the end (s).
        wall_s: wall time of the loop (s; building the scheduler excluded).
        cpu_s: CPU time of the replaying thread over the loop (s).
        requests: requests added.
    """

    steps: int = 0
    last_busy_step: int = -1
    virtual_s: float = 0.0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    requests: int = 0

    @property
    def steps_per_cpu_s(self) -> float | None:
        return self.steps / self.cpu_s if self.cpu_s > 0 else None


class _ConfigOverlay:
    """The sink of a replay: the harness scheduler's ``engine_config`` with the recorded
    engine's fields the harness cannot have (its memory, its KV-cache groups, its
    vLLM version's absent settings) put back, everything else passed through."""

    def __init__(self, sink: Any, overlay: dict[str, Any]) -> None:
        self.sink = sink
        self.overlay = overlay

    def emit(self, kind: Any, ts: float, engine: int, values: Any) -> None:
        if kind is ENGINE_CONFIG and self.overlay:
            values = msgspec.structs.replace(values, **self.overlay)
        self.sink.emit(kind, ts, engine, values)

    def close(self) -> None:
        if hasattr(self.sink, "close"):
            self.sink.close()


class _Requests:
    """``make(r) -> vLLM Request`` for the workload's requests (see the module docstring
    for how each stops), and the output tokens each samples (:meth:`sample`).

    Without ``prompts``, each request's tokens come from a :class:`PromptBuilder` plan of
    its recorded digests, prompt and answer: the fake model samples the plan's output
    tokens, so the blocks an answer fills hash as the recorded ones did and a later prompt
    that repeats them (a conversation's next turn, an identical prompt resumed after a
    preemption) hits them as it did in the engine. With ``prompts`` (token ids given),
    every output token is :data:`SAMPLE_TOKEN`, a stop request's last :data:`STOP_TOKEN`.
    """

    def __init__(self, w: Workload, spec: SchedulerSpec,
                 prompts: Callable[[WorkloadRequest], list[int]] | None) -> None:
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher

        self.hasher = get_request_block_hasher(spec.block_size, block_hash_fn())
        self.builder = PromptBuilder(w.block_tokens or int(w.config.get("hash_block_size") or spec.block_size))
        self.prompts = prompts
        self.max_model_len = spec.max_model_len
        self.plans: dict[str, TokenPlan] = {}
        #: speculative decoding: the recorded drafts each request proposes and accepts
        self.drafts = Drafts.of(w, spec, SAMPLE_TOKEN)

    def __call__(self, r: WorkloadRequest) -> Any:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        out = max(r.output_tokens, 1)
        stop: list[int] = []
        if r.finish_reason == "stop":
            max_tokens, stop = max(r.max_tokens or out, out), [STOP_TOKEN]
        elif r.finish_reason in ("abort", "error"):
            max_tokens = r.max_tokens or max(self.max_model_len - r.prompt_len, 1)
        else:  # length, or unfinished: as if it had stopped where the log ended
            max_tokens = out
        if self.prompts is not None:
            tokens = self.prompts(r)
        else:
            planned = r.output_tokens if r.finish_reason in ("abort", "error") else out
            plan = self.builder.plan(r.order, r.prompt_len, r.block_digests, r.output_digests, planned,
                                     STOP_TOKEN if stop else None)
            self.plans[r.req_id] = plan
            tokens = plan.prompt()
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0, stop_token_ids=stop)
        req = Request(**fit_kwargs("Request", Request.__init__, dict(
            request_id=r.req_id, prompt_token_ids=tokens, sampling_params=params, pooling_params=None,
            block_hasher=self.hasher, eos_token_id=2, mm_features=None, priority=r.priority)))
        # the recorded stamp: the priority policy orders by (priority, arrival_time)
        req.arrival_time = r.stamp
        return req

    def sample(self, rid: str, index: int) -> int | None:
        """The token request ``rid`` samples as its output ``index`` (0-based); None when
        it has no plan (``prompts`` given)."""
        plan = self.plans.get(rid)
        return None if plan is None else plan.output_token(index, SAMPLE_TOKEN)


def _request_factory(w: Workload, spec: SchedulerSpec,
                     prompts: Callable[[WorkloadRequest], list[int]] | None) -> _Requests:
    """The requests of a replay (:class:`_Requests`)."""
    return _Requests(w, spec, prompts)


def _model_output(sched: Any, out: Any, samplers: set[str], stop_at: dict[str, int],
                  planned: Callable[[str, int], int | None] | None = None,
                  accepted: Callable[[str, int, int], int] | None = None) -> Any:
    """vLLM's ``ModelRunnerOutput`` for ``out``: for each request in ``samplers`` (its step
    ended its prefill or decoded) one token, plus the drafts ``accepted(req_id, output
    index, proposed drafts)`` accepts where the step verified drafts (speculative
    decoding: an accepted draft is an output token of the same step). Each token is the one
    ``planned(req_id, output index)`` gives, else the stop token at a ``stop`` request's
    last, else :data:`SAMPLE_TOKEN`."""
    req_ids = list(out.num_scheduled_tokens)
    sampled: list[list[int]] = []
    requests = sched.requests
    spec = out.scheduled_spec_decode_tokens if accepted is not None else None
    for rid in req_ids:
        if rid not in samplers:
            sampled.append([])
            continue
        req = requests.get(rid)
        n = 1
        if spec and req is not None:
            ids = spec.get(rid)
            if ids:
                proposed = next((i for i, t in enumerate(ids) if t < 0), len(ids))
                n += accepted(rid, req.num_output_tokens, proposed) if proposed else 0  # type: ignore[misc]
        toks = []
        at = req.num_output_tokens if req is not None else 0
        last = stop_at.get(rid)
        for k in range(n):
            tok = planned(rid, at + k) if planned is not None and req is not None else None
            if tok is None:
                tok = STOP_TOKEN if last is not None and req is not None and at + k + 1 >= last else SAMPLE_TOKEN
            toks.append(tok)
        sampled.append(toks)
    return model_runner_output(req_ids, sampled)


def _samplers(sched: Any, out: Any) -> set[str]:
    """Requests that sample a token in the step just scheduled: those whose computed
    tokens reach their end after it (``Request.is_prefill_chunk`` is False; vLLM sets it
    in ``_update_after_schedule``, placeholders of async scheduling included)."""
    requests = sched.requests
    try:
        return {rid for rid in out.num_scheduled_tokens if not requests[rid].is_prefill_chunk}
    except AttributeError:  # releases without the flag (sync scheduling only)
        return {rid for rid in out.num_scheduled_tokens
                if requests[rid].num_computed_tokens >= requests[rid].num_tokens}


def replay(
    w: Workload,
    spec: SchedulerSpec,
    step_time: Callable[[Sequence[float]], float],
    sink: Any,
    *,
    mode: str = "timed",
    lag_s: float | None = None,
    prompts: Callable[[WorkloadRequest], list[int]] | None = None,
    flags: ProbeFlags | None = None,
    config_overlay: dict[str, Any] | None = None,
    max_steps: int | None = None,
    closed: tuple[int, float] | None = None,
    time_limit_s: float | None = None,
) -> ReplayStats:
    """Replay ``w`` on the scheduler ``spec`` describes, the probe writing to ``sink``.

    Args:
        step_time: ``features -> s``, the step-time model (features:
            :data:`~vllm_probe.sim.stepmodel.FEATURES`).
        sink: where the probe's events go (``emit``; an ``EventSink`` or the harness's
            ``MemorySink``).
        mode: ``timed`` or ``steps`` (see the module docstring).
        lag_s: front-end lag (s); default the workload's own.
        prompts: token ids per request (default: rebuilt from block digests, else unique).
        flags: the probe's flags (default all on).
        config_overlay: ``engine_config`` fields to write instead of the harness's.
        max_steps: stop after this many steps (default: 100 × the workload's tokens).
        closed: ``(N, think_s)``: every request is one closed-loop client's
            (:mod:`vllm_probe.sim.arrivals`): the first ``N`` arrive as recorded, each later
            one (in recorded order; none is anchored) after a request finishes in the replay,
            its own recorded ``think_s`` later (else ``think_s``). None: the workload's own
            clients (``Workload.clients``, each request's ``client``), the other requests
            at their recorded times.
        time_limit_s: stop after this many wall seconds from the call, building the
            scheduler included (looked at every :data:`CLOCK_EVERY` steps; None: no limit).

    Raises:
        ReplayError: the scheduler stopped making progress (a request that never fits).
        ReplayTimeLimit: ``time_limit_s`` ran out.
        ImportError: vLLM is not installed.
    """
    called = time.perf_counter()
    import vllm
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import RequestStatus

    if mode not in ("timed", "steps"):
        raise ValueError(f"mode must be 'timed' or 'steps', not {mode!r}")
    scheduler_cls = None
    if spec.async_scheduling:
        # whatif's async_scheduling setting (engine_args.resolve) chooses the class; EngineCore drives
        # an AsyncScheduler through step_with_batch_queue (vllm/v1/engine/core.py, 0.32): depth 2 below
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler

        scheduler_cls = AsyncScheduler
    depth = 2 if scheduler_cls is not None else 1  # EngineCore's batch queue
    clock = VirtualClock(w.t0)  # engine_config is stamped at the recording's start, as the steps are
    target = _ConfigOverlay(sink, config_overlay or {})
    # no machine-speed mark: a replay's machine is its step-time model, not this host
    rt = Runtime(flags or ProbeFlags(), lambda _rt: target, clock=clock.time, timer=clock.time, speed_mark=None)
    previous = patches.uninstall(Scheduler)  # the plugin's probe in this process: back afterwards
    try:
        patches.install(Scheduler, rt, vllm.__version__)
        if not rt.patched:  # install() left a class patched elsewhere as it was
            raise ReplayError("vLLM's Scheduler is patched by another copy of vllm-probe in this process")
        spec = as_recorded(spec, w.config)
        sched = make_scheduler(spec, scheduler_cls)
        return _loop(w, sched, step_time, clock, mode, w.lag_s() if lag_s is None else lag_s,
                     _request_factory(w, spec, prompts), depth, max_steps, RequestStatus, closed,
                     None if time_limit_s is None else time_limit_s - (time.perf_counter() - called))
    finally:
        patches.uninstall(Scheduler)
        if previous is not None:
            patches.install(Scheduler, previous, previous.vllm_version)


class _Client:
    """A closed-loop client in the replay: its requests in recorded order, how many it
    keeps in flight, its think time (s) where a request has none of its own."""

    __slots__ = ("queue", "n", "think_s", "inflight", "last")

    def __init__(self, requests: list[WorkloadRequest], n: int, think_s: float) -> None:
        self.queue = deque(requests)
        self.n = n
        self.think_s = think_s
        self.inflight = 0
        self.last = 0.0  # when its latest request became available (s since t0): sent in order


def _clients(w: Workload, closed: tuple[int, float] | None) -> list[_Client]:
    """The closed-loop clients of a replay: ``closed`` makes every request one client's;
    otherwise the workload's own (:attr:`~vllm_probe.analysis.workload.Workload.clients`,
    each request's ``client``)."""
    if closed is not None:
        return [_Client(sorted(w.requests, key=lambda r: (r.stamp, r.order)), closed[0], closed[1])]
    out = []
    for c, (n, think) in sorted(w.clients.items()):
        members = sorted((r for r in w.requests if r.client == c), key=lambda r: (r.stamp, r.order))
        if members:
            out.append(_Client(members, n, think))
    return out


class _Arrivals:
    """Where a replay's requests come from, in the module docstring's order: offline bursts
    anchored to a step index, requests at their recorded times (plus the front-end lag,
    clamped into their windows), and closed-loop clients that send their next request when
    one finishes. Times are seconds since the recording's ``t0``."""

    def __init__(self, w: Workload, mode: str, lag_s: float, closed: tuple[int, float] | None) -> None:
        self.t0 = w.t0
        self.lag_s = lag_s
        reqs = w.requests
        self.clients = _clients(w, closed) if mode != "steps" else []
        #: request -> the closed-loop client that sent it (popped when it finishes)
        self.client_of: dict[str, _Client | None] = {r.req_id: c for c in self.clients for r in c.queue}
        if mode == "steps":
            self.anchored = sorted(reqs, key=lambda r: (r.add_before_step, r.order))
            self.timed: list[WorkloadRequest] = []
        else:  # a closed-loop client's requests are never anchored to a step: they follow its finishes
            self.anchored = sorted((r for r in reqs if r.anchored and r.req_id not in self.client_of),
                                   key=lambda r: (r.add_before_step, r.order))
            self.timed = sorted((r for r in reqs if not r.anchored and r.req_id not in self.client_of),
                                key=lambda r: (self.avail(r), r.order))
        self.times = [self.avail(r) for r in self.timed]
        self.i = self.j = 0  # next timed, next anchored
        #: closed-loop requests sent so far, by when they become available: (s, order, request)
        self.sent_heap: list[tuple[float, int, WorkloadRequest]] = []
        self.sent: dict[int, float] = {}  # request (order) -> when its client sent it (s)
        for c in self.clients:  # the first N of each client as recorded
            for _ in range(min(c.n, len(c.queue))):
                r = c.queue.popleft()
                c.inflight += 1
                c.last = max(c.last, self.avail(r))
                heapq.heappush(self.sent_heap, (self.avail(r), r.order, r))

    def avail(self, r: WorkloadRequest) -> float:
        """When ``r`` can be added (s since ``t0``)."""
        a = r.stamp + self.lag_s
        if r.avail_lo is not None and r.avail_hi is not None:
            a = min(max(a, r.avail_lo), r.avail_hi)
        return a - self.t0

    def first(self) -> float:
        """When the first request is there (s): the first step starts then."""
        firsts = self.times[:1] + [self.sent_heap[0][0] for _ in self.sent_heap[:1]] + [
            (r.avail_hi if r.avail_hi is not None else r.stamp) - self.t0 for r in self.anchored[:1]]
        return min(firsts) if firsts else 0.0

    def due(self, step: int, now: float) -> list[WorkloadRequest]:
        """The requests to add before step ``step`` at ``now``, in arrival order."""
        due = []
        anchored, timed, times, heap = self.anchored, self.timed, self.times, self.sent_heap
        while self.j < len(anchored) and anchored[self.j].add_before_step <= step:
            due.append(anchored[self.j])
            self.j += 1
        while self.i < len(timed) and times[self.i] <= now + 1e-9:
            due.append(timed[self.i])
            self.i += 1
        while heap and heap[0][0] <= now + 1e-9:
            due.append(heapq.heappop(heap)[2])
        return sorted(due, key=lambda r: r.order) if len(due) > 1 else due

    def pending(self) -> bool:
        """Whether any request is still to come (an idle engine is then not stuck)."""
        return (self.i < len(self.timed) or self.j < len(self.anchored) or bool(self.sent_heap)
                or any(c.queue for c in self.clients))

    def when_idle(self, sched: Any, make: _Requests, now: float, mode: str) -> float | None:
        """Nothing to run and no output pending: the next burst is added (before this same
        step), a closed-loop client with nothing in flight sends its next, or the clock jumps
        to the next arrival. Returns the new ``now`` (s), None when nothing is left to come."""
        stuck = [c for c in self.clients if c.queue and not c.inflight]
        more_timed = self.i < len(self.timed) or bool(self.sent_heap)
        if self.j >= len(self.anchored) and not more_timed and not stuck:
            return None
        if self.j < len(self.anchored) and ((not more_timed and not stuck) or mode == "steps"):
            batch = self.anchored[self.j].add_before_step
            while self.j < len(self.anchored) and self.anchored[self.j].add_before_step == batch:
                sched.add_request(make(self.anchored[self.j]))
                self.j += 1
        elif stuck:
            self._send(min(stuck, key=lambda c: c.queue[0].order), now, now)
        else:
            now = max(now, min(self.times[self.i] if self.i < len(self.timed) else float("inf"),
                               self.sent_heap[0][0] if self.sent_heap else float("inf")))
        return now

    def finished(self, rid: str, now: float) -> None:
        """Request ``rid`` left the scheduler at ``now``: its client, if any, sends its next
        after that request's think time."""
        c = self.client_of.pop(rid, None)
        if c is None:
            return
        c.inflight -= 1
        if c.queue:
            think = c.queue[0].think_s
            think = c.think_s if think is None else think
            at = max(now + think + self.lag_s, c.last)
            self._send(c, at, at - self.lag_s)

    def _send(self, c: _Client, at: float, stamp: float) -> None:
        """``c``'s next request becomes available at ``at``, stamped ``stamp`` (s)."""
        r = c.queue.popleft()
        c.inflight += 1
        c.last = at
        self.sent[r.order] = stamp
        heapq.heappush(self.sent_heap, (at, r.order, r))


def _loop(w: Workload, sched: Any, step_time: Callable, clock: VirtualClock, mode: str, lag_s: float,
          make: _Requests, depth: int, max_steps: int | None, status: Any,
          closed: tuple[int, float] | None = None, time_limit_s: float | None = None) -> ReplayStats:
    """``EngineCore``'s loop on the virtual clock (the module docstring): add what is due,
    ``schedule()``, advance the clock by the step-time model, then (``depth`` outputs later,
    the batch queue) process aborts and ``update_from_output``."""
    t0 = w.t0
    flush_idle = flushes_when_idle(w)
    reqs = w.requests
    if max_steps is None:
        max_steps = 100 * (sum(r.prompt_len + r.output_tokens for r in reqs) + len(reqs)) + 1000
    stop_at = {r.req_id: max(r.output_tokens, 1) for r in reqs if r.finish_reason == "stop"}
    aborts = {r.req_id: r for r in reqs if r.finish_reason in ("abort", "error")}
    arrivals = _Arrivals(w, mode, lag_s, closed)
    step = 0
    now = arrivals.first()
    shapes = ShapeTracker()
    queue: deque = deque()
    stats = ReplayStats(requests=len(reqs))
    idle_steps = 0
    wall0, cpu0 = time.perf_counter(), time.thread_time()
    while step < max_steps:
        if time_limit_s is not None and step % CLOCK_EVERY == 0 and time.perf_counter() - wall0 > time_limit_s:
            raise ReplayTimeLimit(step, time.perf_counter() - wall0)
        clock.now = t0 + now
        for r in arrivals.due(step, now):
            req = make(r)
            if r.order in arrivals.sent:  # stamped when the client sent it, as the front end would
                req.arrival_time = t0 + arrivals.sent[r.order]
            sched.add_request(req)
        # an engine core stepped in-process by LLM stops once its caller has nothing unfinished
        if sched.has_requests() if flush_idle else sched.has_unfinished_requests():
            out = sched.schedule()
            samplers = _samplers(sched, out)
            busy = out.total_num_scheduled_tokens > 0
            if busy:
                stats.last_busy_step = step
                idle_steps = 0
            else:
                idle_steps += 1
                if idle_steps >= STUCK_STEPS and not queue and not arrivals.pending():
                    raise ReplayError(f"no progress for {STUCK_STEPS} steps with {len(sched.requests)} "
                                      "requests left: a request cannot be admitted at these settings")
            now += step_time(output_features(sched, out, shapes))
            clock.now = t0 + now
            step += 1
            queue.appendleft((out, samplers))
            if len(queue) < depth and (busy or sched.has_requests()):
                continue  # async: keep the batch queue full before waiting on an output
        elif not queue:
            idle_now = arrivals.when_idle(sched, make, now, mode)
            if idle_now is None:
                break
            now = idle_now
            continue
        out, samplers = queue.pop()
        _process_output(sched, out, samplers, step, now, mode, aborts, stop_at, make, depth, arrivals, status)
    stats.steps = step
    stats.virtual_s = now
    stats.wall_s = time.perf_counter() - wall0
    stats.cpu_s = time.thread_time() - cpu0
    return stats


def _process_output(sched: Any, out: Any, samplers: set[str], step: int, now: float, mode: str,
                    aborts: dict[str, WorkloadRequest], stop_at: dict[str, int], make: _Requests, depth: int,
                    arrivals: _Arrivals, status: Any) -> None:
    """One scheduled step's output: the aborts due before it (``_process_aborts_queue``),
    ``update_from_output`` with the fake model's output, the recorded drafts proposed for
    the next step, and the finished requests' clients told."""
    t0 = arrivals.t0
    for rid in [rid for rid, r in aborts.items() if _abort_due(r, step - 1, now + t0, mode)]:
        del aborts[rid]
        if rid in sched.requests:
            sched.finish_requests(rid, status.FINISHED_ABORTED)
            arrivals.finished(rid, now)
    sched.update_from_output(out, _model_output(sched, out, samplers, stop_at, make.sample,
                                                make.drafts.accepted if make.drafts else None))
    if make.drafts and depth == 1 and out.total_num_scheduled_tokens:
        make.drafts.propose(sched, out)
    if arrivals.client_of:  # a request leaves the scheduler only by finishing in the step that scheduled it
        live = sched.requests
        for rid in out.num_scheduled_tokens:
            if rid not in live:
                arrivals.finished(rid, now)


def flushes_when_idle(w: Workload) -> bool:
    """Whether the recorded engine core ran one more step once its last request had
    finished, scheduling nothing and reporting the finished requests (its ``finished``
    list), as ``EngineCore.run_busy_loop`` does while the scheduler ``has_requests()``: a
    server, ``AsyncLLM``, ``LLM`` with its engine core in a process of its own. An engine
    core that ``LLM`` steps in its own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``:
    ``LLMEngine.step`` while the front end has unfinished requests) stops at the last
    finish; its next step, if any, reports them. Read from the recording: its last step
    comes after its last finish (True), or is the step of it (False); True when some
    request never finished or nothing was recorded (a timed trace)."""
    finishes = [r.finish_step for r in w.requests if r.finish_step is not None]
    if not finishes or w.unfinished or w.last_step < 0:
        return True
    return w.last_step > max(finishes)


def _abort_due(r: WorkloadRequest, step: int, now: float, mode: str) -> bool:
    """Whether the recorded abort of ``r`` has happened by ``step`` / epoch ``now``."""
    if mode == "steps" or r.finish_ts is None:
        return r.finish_step is not None and r.finish_step <= step
    return r.finish_ts <= now
