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
before step N's output is processed.

**Arrivals** (``timed``, the default): a request becomes available at its front-end
stamp plus the recorded lag (:meth:`~vllm_probe.analysis.workload.Workload.lag_s`),
clamped into the window the recorded run allows
(:func:`~vllm_probe.analysis.workload.availability_windows`), and is added at the first
step boundary at or after that; members of an offline burst (``anchored``) are added
before the same step index as recorded. When nothing is left to run, the clock jumps to
the next arrival (a real engine core blocks; it never steps idle). ``steps``: every
request is added before its recorded step index (exact schedules on any run; the clock
still advances by the model).

**Time**: each step lasts what ``step_time(features)`` says (s, features of
:mod:`vllm_probe.sim.stepmodel`); the clock stands still inside ``schedule()``, so the
simulated ``schedule_us`` is 0 (scheduling time is part of the step period).

**Each request stops after exactly its recorded output tokens**: ``length`` (and
unfinished) requests get ``max_tokens`` equal to that count; ``stop`` requests keep
their ``max_tokens`` and sample a stop token at their last one; aborted ones are aborted
at their recorded time (``steps``: step).
"""

from __future__ import annotations

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
from .harness import SchedulerSpec, _fit, _hash_fn, make_scheduler, model_runner_output
from .stepmodel import ShapeTracker, output_features

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


class PromptBuilder:
    """Token ids for replayed prompts that share exactly the blocks the recorded ones did.

    Each distinct block id (a ``block_digests`` entry, or a trace's hash id) gets a
    block of ``block_tokens`` ids of its own; the tokens after a request's last shared
    block are unique to it. Two rebuilt prompts therefore share exactly the leading
    blocks whose ids were equal, and vLLM's KV-cache manager hits (and evicts) where the
    recorded one did. Ids are plain integers far above any vocabulary (the scheduler
    only hashes them). ``partial``: a trailing id covering fewer than ``block_tokens``
    tokens gets its own tokens per length (vLLM's ``TimedTrace`` keys partial chunks by
    ``hash:size``).
    """

    _BLOCK_BASE = 1 << 32
    _TAIL_BASE = 1 << 48

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self._index: dict[Any, int] = {}

    def _block(self, key: Any, size: int) -> list[int]:
        idx = self._index.setdefault((key, size), len(self._index))
        base = self._BLOCK_BASE + idx * self.block_tokens
        return list(range(base, base + size))

    def tokens(self, order: int, prompt_len: int, ids: Sequence[Any] | None) -> list[int]:
        """``prompt_len`` token ids for request ``order`` whose blocks are ``ids``."""
        out: list[int] = []
        for key in ids or ():
            if len(out) >= prompt_len:
                break
            out += self._block(key, min(self.block_tokens, prompt_len - len(out)))
        base = self._TAIL_BASE + order * (1 << 24)
        out += range(base, base + prompt_len - len(out))
        return out


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


def _request_factory(w: Workload, spec: SchedulerSpec, prompts: Callable[[WorkloadRequest], list[int]] | None):
    """``make(r) -> vLLM Request`` for the workload's requests (see the module docstring
    for how each stops)."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.request import Request

    hasher = get_request_block_hasher(spec.block_size, _hash_fn())
    builder = PromptBuilder(w.block_tokens or int(w.config.get("hash_block_size") or spec.block_size))
    max_model_len = spec.max_model_len

    def make(r: WorkloadRequest) -> Any:
        tokens = prompts(r) if prompts is not None else builder.tokens(r.order, r.prompt_len, r.block_digests)
        out = max(r.output_tokens, 1)
        stop: list[int] = []
        if r.finish_reason == "stop":
            max_tokens, stop = max(r.max_tokens or out, out), [STOP_TOKEN]
        elif r.finish_reason in ("abort", "error"):
            max_tokens = r.max_tokens or max(max_model_len - r.prompt_len, 1)
        else:  # length, or unfinished: as if it had stopped where the log ended
            max_tokens = out
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0, stop_token_ids=stop)
        req = Request(**_fit("Request", Request.__init__, dict(
            request_id=r.req_id, prompt_token_ids=tokens, sampling_params=params, pooling_params=None,
            block_hasher=hasher, eos_token_id=2, mm_features=None, priority=r.priority)))
        # the recorded stamp: the priority policy orders by (priority, arrival_time)
        req.arrival_time = r.stamp
        return req

    return make


def _model_output(sched: Any, out: Any, samplers: set[str], stop_at: dict[str, int]) -> Any:
    """vLLM's ``ModelRunnerOutput`` for ``out``: one token for each request in
    ``samplers`` (its step ended its prefill or decoded), the stop token when it is a
    ``stop`` request's last."""
    req_ids = list(out.num_scheduled_tokens)
    sampled: list[list[int]] = []
    requests = sched.requests
    for rid in req_ids:
        if rid not in samplers:
            sampled.append([])
            continue
        last = stop_at.get(rid)
        if last is not None:
            req = requests.get(rid)
            if req is not None and req.num_output_tokens + 1 >= last:
                sampled.append([STOP_TOKEN])
                continue
        sampled.append([SAMPLE_TOKEN])
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
        closed: ``(N, think_s)``: a closed-loop client (:mod:`vllm_probe.sim.arrivals`):
            the first ``N`` requests arrive as recorded, each later one ``think_s`` after
            a request finishes in the replay (in recorded order; no request is anchored).
        time_limit_s: stop after this many wall seconds (looked at every
            :data:`CLOCK_EVERY` steps; None: no limit).

    Raises:
        ReplayError: the scheduler stopped making progress (a request that never fits).
        ReplayTimeLimit: ``time_limit_s`` ran out.
        ImportError: vLLM is not installed.
    """
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
    rt = Runtime(flags or ProbeFlags(), lambda _rt: target, clock=clock.time, timer=clock.time)
    previous = patches.uninstall(Scheduler)  # the plugin's probe in this process: back afterwards
    try:
        patches.install(Scheduler, rt, vllm.__version__)
        if not rt.patched:  # install() left a class patched elsewhere as it was
            raise ReplayError("vLLM's Scheduler is patched by another copy of vllm-probe in this process")
        sched = make_scheduler(spec, scheduler_cls)
        return _loop(w, sched, step_time, clock, mode, w.lag_s() if lag_s is None else lag_s,
                     _request_factory(w, spec, prompts), depth, max_steps, RequestStatus, closed, time_limit_s)
    finally:
        patches.uninstall(Scheduler)
        if previous is not None:
            patches.install(Scheduler, previous, previous.vllm_version)


def _loop(w: Workload, sched: Any, step_time: Callable, clock: VirtualClock, mode: str, lag_s: float,
          make: Callable, depth: int, max_steps: int | None, status: Any,
          closed: tuple[int, float] | None = None, time_limit_s: float | None = None) -> ReplayStats:
    t0 = w.t0
    reqs = w.requests
    if max_steps is None:
        max_steps = 100 * (sum(r.prompt_len + r.output_tokens for r in reqs) + len(reqs)) + 1000
    stop_at = {r.req_id: max(r.output_tokens, 1) for r in reqs if r.finish_reason == "stop"}
    aborts = {r.req_id: r for r in reqs if r.finish_reason in ("abort", "error")}

    def avail(r: WorkloadRequest) -> float:
        """When ``r`` can be added (s since ``t0``)."""
        a = r.stamp + lag_s
        if r.avail_lo is not None and r.avail_hi is not None:
            a = min(max(a, r.avail_lo), r.avail_hi)
        return a - t0

    if mode == "steps":
        anchored = sorted(reqs, key=lambda r: (r.add_before_step, r.order))
        timed: list[WorkloadRequest] = []
    elif closed is not None:
        anchored = []
        timed = sorted(reqs, key=lambda r: (r.stamp, r.order))
    else:
        anchored = sorted((r for r in reqs if r.anchored), key=lambda r: (r.add_before_step, r.order))
        timed = sorted((r for r in reqs if not r.anchored), key=lambda r: (avail(r), r.order))
    times = [avail(r) for r in timed]
    if closed is not None:  # later requests wait for a finish (see the arrivals module)
        times = times[:closed[0]] + [float("inf")] * max(0, len(times) - closed[0])
    released = min(closed[0], len(times)) if closed is not None else 0
    sent: dict[int, float] = {}  # closed loop: request (order) -> when the client sent it (s since t0)
    i = j = 0
    step = 0
    firsts = times[:1] + [(anchored[0].avail_hi if anchored[0].avail_hi is not None else anchored[0].stamp) - t0
                          for _ in anchored[:1]]
    now = min(firsts) if firsts else 0.0  # the first step starts when its request is there
    shapes = ShapeTracker()
    queue: deque = deque()
    stats = ReplayStats(requests=len(reqs))
    idle_steps = 0
    wall0, cpu0 = time.perf_counter(), time.thread_time()
    while step < max_steps:
        if time_limit_s is not None and step % CLOCK_EVERY == 0 and time.perf_counter() - wall0 > time_limit_s:
            raise ReplayTimeLimit(step, time.perf_counter() - wall0)
        due = []
        while j < len(anchored) and anchored[j].add_before_step <= step:
            due.append(anchored[j])
            j += 1
        while i < len(timed) and times[i] <= now + 1e-9:
            due.append(timed[i])
            i += 1
        clock.now = t0 + now
        for r in sorted(due, key=lambda r: r.order):
            req = make(r)
            if r.order in sent:  # stamped when the client sent it, as the front end would
                req.arrival_time = t0 + sent[r.order]
            sched.add_request(req)
        if sched.has_requests():
            out = sched.schedule()
            samplers = _samplers(sched, out)
            busy = out.total_num_scheduled_tokens > 0
            if busy:
                stats.last_busy_step = step
                idle_steps = 0
            else:
                idle_steps += 1
                if idle_steps >= STUCK_STEPS and i >= len(timed) and j >= len(anchored) and not queue:
                    raise ReplayError(f"no progress for {STUCK_STEPS} steps with {len(sched.requests)} "
                                      "requests left: a request cannot be admitted at these settings")
            now += step_time(output_features(sched, out, shapes))
            clock.now = t0 + now
            step += 1
            queue.appendleft((out, samplers))
            if len(queue) < depth and (busy or sched.has_requests()):
                continue  # async: keep the batch queue full before waiting on an output
        elif not queue:
            if i >= len(timed) and j >= len(anchored):
                break
            if j < len(anchored) and (i >= len(timed) or mode == "steps"):
                # the engine blocked with nothing to do; the next burst comes before this same step
                batch = anchored[j].add_before_step
                while j < len(anchored) and anchored[j].add_before_step == batch:
                    sched.add_request(make(anchored[j]))
                    j += 1
            else:
                if times[i] == float("inf"):  # closed loop with nothing in flight: send the next now
                    times[i] = now
                    sent[timed[i].order] = now
                    released = max(released, i + 1)
                now = max(now, times[i])  # idle: jump to the next arrival
            continue
        out, samplers = queue.pop()
        before = len(sched.requests)
        for rid in [rid for rid, r in aborts.items() if _abort_due(r, step - 1, now + t0, mode)]:
            del aborts[rid]
            if rid in sched.requests:
                sched.finish_requests(rid, status.FINISHED_ABORTED)
        sched.update_from_output(out, _model_output(sched, out, samplers, stop_at))
        if closed is not None:
            for _ in range(before - len(sched.requests)):  # each finish releases the next request
                if released < len(times):
                    times[released] = max(now + closed[1] + lag_s, times[released - 1] if released else 0.0)
                    sent[timed[released].order] = times[released] - lag_s
                    released += 1
    stats.steps = step
    stats.virtual_s = now
    stats.wall_s = time.perf_counter() - wall0
    stats.cpu_s = time.thread_time() - cpu0
    return stats


def _abort_due(r: WorkloadRequest, step: int, now: float, mode: str) -> bool:
    """Whether the recorded abort of ``r`` has happened by ``step`` / epoch ``now``."""
    if mode == "steps" or r.finish_ts is None:
        return r.finish_step is not None and r.finish_step <= step
    return r.finish_ts <= now
