"""The hooks: what happens inside vLLM's scheduler when the probe is installed.

:func:`install` wraps the methods listed in :data:`vllm_probe.engine.compat.TARGETS` on the
base ``Scheduler`` class once, so subclasses that call ``super()`` (``AsyncScheduler``,
the diffusion schedulers) are reached too. Each wrapper calls vLLM's original outside
any ``try`` of ours and returns its result untouched; the probe's own work sits in a
``try`` whose failures are counted per hook (:class:`HookHealth`), and a hook that
fails :data:`MAX_HOOK_ERRORS` times switches its events off with one warning; the
bookkeeping the other hooks rely on (step index, preempted requests awaiting their
re-prefill) goes on.

Hot-path budget (see docs/performance.md): per step the probe reads a few counters and
appends one tuple to the sink's queue; per-request work happens only for requests that
are prefilling, admitted, preempted or finished.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from pathlib import Path
from time import perf_counter
from typing import Any, Callable

from .. import __version__, envvars
from . import compat
from ..schema.events import CHUNK, ENGINE_CONFIG, PREEMPT, REQUEST_ADDED, REQUEST_FINISHED, STEP
from ..settings import ProbeFlags
from .signals import on_stop_signals
from .sink import EventSink

logger = logging.getLogger("vllm_probe")

#: Exceptions a hook may raise before it switches itself off.
MAX_HOOK_ERRORS = 3
#: Attribute holding a scheduler's :class:`SchedulerProbe`.
PROBE_ATTR = "_vllm_probe"
#: Attribute set on our wrappers, pointing at vLLM's original (guards double wrapping).
WRAPPED_ATTR = "__vllm_probe_original__"

HOOKS = ("engine_config", "step", "chunk", "preempt", "request_added", "request_finished")


class HookHealth:
    """Per-process count of exceptions caught in each hook, and which are switched off."""

    def __init__(self) -> None:
        self.errors: dict[str, int] = {h: 0 for h in HOOKS}
        self.disabled: set[str] = set()

    def failed(self, hook: str, exc: BaseException, limit: int = MAX_HOOK_ERRORS) -> None:
        self.errors[hook] = self.errors.get(hook, 0) + 1
        if self.errors[hook] == 1:
            logger.debug("vllm-probe: error in hook %r", hook, exc_info=exc)
        if self.errors[hook] >= limit and hook not in self.disabled:
            self.disabled.add(hook)
            logger.warning(
                "vllm-probe: hook %r disabled after %d errors (last: %s: %s); vLLM is unaffected",
                hook, self.errors[hook], type(exc).__name__, exc,
            )

    def snapshot(self) -> tuple[dict[str, int], list[str]]:
        return dict(self.errors), sorted(self.disabled)


class Runtime:
    """Process-wide probe state: flags, health, the lazily created sink.

    Args:
        flags: which event kinds to write.
        sink_factory: builds the sink on the first scheduler (so only engine-core
            processes, where a ``Scheduler`` is built, ever create a file).
    """

    def __init__(self, flags: ProbeFlags, sink_factory: Callable[["Runtime"], Any]) -> None:
        self.flags = flags
        self.health = HookHealth()
        self._sink_factory = sink_factory
        self._sink = None
        self.patched: list[str] = []
        self.vllm_version = "unknown"
        #: Called once, when the first scheduler of this process gets its probe: the
        #: plugin logs there, so only engine cores (not API servers or workers) say so.
        self.on_first_scheduler: Callable[[], None] | None = None

    @property
    def sink(self):
        if self._sink is None:
            self._sink = self._sink_factory(self)
        return self._sink

    def enabled(self, hook: str) -> bool:
        return hook not in self.health.disabled

    def close(self) -> None:
        """Close the sink if one was made (it writes its final ``probe_stats`` line).

        Idempotent. In vLLM's processes the sink closes itself at exit; tests and
        benchmarks that install the probe in their own process call this when done.
        """
        if self._sink is not None:
            self._sink.close()


def file_sink_factory(run_dir: Path) -> Callable[[Runtime], EventSink]:
    """A factory writing ``<run_dir>/events-<pid>.jsonl`` (run_dir created 0700)."""

    def make(rt: Runtime) -> EventSink:
        path = Path(run_dir) / f"events-{os.getpid()}.jsonl"
        try:
            Path(run_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError:
            pass  # the sink reports the failure to open the file
        sink = EventSink(path, capacity=rt.flags.queue_capacity, stats_extra=rt.health.snapshot)
        on_stop_signals(sink.checkpoint)
        return sink

    return make


class _Pass:
    """A prefill pass in progress: where it ends, the next chunk index, resumed or not."""

    __slots__ = ("prefill_len", "index", "resumed")

    def __init__(self, prefill_len: int, index: int, resumed: bool) -> None:
        self.prefill_len = prefill_len
        self.index = index
        self.resumed = resumed


class SchedulerProbe:
    """State the probe keeps for one ``Scheduler`` instance (one engine core).

    ``step`` is the index of the step in progress (0-based). ``prefilling`` holds the
    requests whose prefill pass has started but not reached ``prefill_len``;
    ``resume_pending`` the preempted requests not yet readmitted. Both stay small
    (bounded by the running and waiting queues), which keeps decode-only steps O(1).
    """

    def __init__(self, rt: Runtime, sched: Any) -> None:
        self.rt = rt
        self.flags = rt.flags
        self.emit = rt.sink.emit
        settings = compat.engine_settings(sched)
        self.engine = settings.pop("engine")
        if hasattr(rt.sink, "engine"):  # the file's probe_stats carry this engine's rank
            rt.sink.engine = self.engine
        self.budget = compat.token_budget(sched)
        self.queue_lengths = compat.queue_lengths_reader(sched)
        self.step = -1
        self.in_schedule = False
        self.step_preempted: list[str] = []
        self.step_prefill_reqs = 0
        self.step_prefill_tokens = 0
        self.step_new_reqs = 0
        self.chunks_seen = False
        self.prefilling: dict[str, _Pass] = {}
        self.resume_pending: set[str] = set()
        self.emit(ENGINE_CONFIG, time.time(), self.engine, (
            rt.vllm_version, __version__, type(sched).__name__, list(rt.patched),
            *(settings[f.name] for f in ENGINE_CONFIG.fields[4:-1]),
            self.flags.to_dict(),
        ))

    # -- step -------------------------------------------------------------------------

    def begin_step(self) -> None:
        self.step += 1
        self.in_schedule = True
        self.step_preempted = []
        self.step_prefill_reqs = self.step_prefill_tokens = self.step_new_reqs = 0
        self.chunks_seen = False

    def end_step(self, sched: Any, out: Any, seconds: float) -> None:
        self.in_schedule = False
        if not self.flags.log_schedule_each_step:
            return
        n_tokens = out.total_num_scheduled_tokens
        n_reqs = len(out.num_scheduled_tokens)
        if self.chunks_seen:
            pre_r, pre_t = self.step_prefill_reqs, self.step_prefill_tokens
            dec_r, dec_t = n_reqs - pre_r, n_tokens - pre_t
        else:  # chunk hook missing or switched off: the split is unknown
            pre_r = pre_t = dec_r = dec_t = None
        running, waiting = self.queue_lengths(sched)
        kvm = sched.kv_cache_manager
        finished = out.finished_req_ids
        self.emit(STEP, time.time(), self.engine, (
            self.step, n_tokens, self.budget, pre_r, pre_t, dec_r, dec_t,
            self.step_new_reqs, running, waiting, kvm.usage,
            kvm.block_pool.get_num_free_blocks(), seconds * 1e6,
            self.step_preempted, list(finished) if finished else [],
        ))

    # -- prefill chunks (called before num_computed_tokens advances) -------------------

    def on_chunks(self, sched: Any, out: Any) -> None:
        if not (self.prefilling or self.resume_pending or out.scheduled_new_reqs):
            self.chunks_seen = True  # decode-only step: begin_step's zero counts stand
            return
        nst = out.num_scheduled_tokens
        requests = sched.requests
        emit = self.emit if self.flags.log_chunk_boundaries else None
        step, engine = self.step, self.engine
        pre_r = pre_t = 0
        ts = time.time()
        prefilling = self.prefilling
        if prefilling:
            for rid in out.finished_req_ids:
                prefilling.pop(rid, None)
            done = []
            for rid, p in prefilling.items():
                n = nst.get(rid)
                if not n:
                    continue
                req = requests[rid]
                start = req.num_computed_tokens
                end = start + n
                last = end >= p.prefill_len
                if emit:
                    emit(CHUNK, ts, engine, (step, rid, p.index, start, end, req.num_prompt_tokens,
                                             p.prefill_len, last, p.resumed, None))
                p.index += 1
                pre_r += 1
                pre_t += n
                if last:
                    done.append(rid)
            for rid in done:
                del prefilling[rid]
        starting = [r.req_id for r in out.scheduled_new_reqs]
        pending = self.resume_pending
        if pending:
            pending.difference_update(out.finished_req_ids)
            starting.extend(rid for rid in pending if rid in nst and rid not in starting)
        for rid in starting:
            req = requests[rid]
            resumed = rid in pending
            if resumed:
                pending.discard(rid)
            n = nst[rid]
            start = req.num_computed_tokens
            end = start + n
            prefill_len = req.num_tokens
            last = end >= prefill_len
            if emit:
                emit(CHUNK, ts, engine, (step, rid, 0, start, end, req.num_prompt_tokens,
                                         prefill_len, last, resumed, start))
            if not last:
                prefilling[rid] = _Pass(prefill_len, 1, resumed)
            pre_r += 1
            pre_t += n
        self.step_prefill_reqs = pre_r
        self.step_prefill_tokens = pre_t
        self.step_new_reqs = len(starting)
        self.chunks_seen = True

    # -- preemption (called around vLLM's _preempt_request) ----------------------------

    def before_preempt(self, sched: Any, request: Any) -> tuple[int, float]:
        """Bookkeeping that chunk and step events rely on (runs even when preempt
        events are switched off); returns what the preempt event needs."""
        rid = request.request_id
        self.prefilling.pop(rid, None)
        self.resume_pending.add(rid)
        if self.in_schedule:
            self.step_preempted.append(rid)
        return request.num_computed_tokens, sched.kv_cache_manager.usage

    def after_preempt(self, sched: Any, request: Any, snap: tuple[int, float]) -> None:
        rid = request.request_id
        if not self.flags.log_preempt_events:
            return
        discarded, usage = snap
        running, waiting = self.queue_lengths(sched)
        self.emit(PREEMPT, time.time(), self.engine, (
            self.step, rid, discarded, request.num_prompt_tokens, request.num_output_tokens,
            getattr(request, "num_preemptions", None), usage, running, waiting,
            "kv_cache" if self.in_schedule else "reset",
        ))

    # -- request lifecycle --------------------------------------------------------------

    def on_added(self, request: Any) -> None:
        sp = request.sampling_params
        self.emit(REQUEST_ADDED, time.time(), self.engine, (
            request.request_id, request.num_prompt_tokens,
            getattr(sp, "max_tokens", None), getattr(sp, "temperature", None),
            getattr(sp, "top_p", None), getattr(request, "priority", 0), request.arrival_time,
        ))

    def on_finished(self, request: Any) -> None:
        rid = request.request_id
        self.prefilling.pop(rid, None)
        self.resume_pending.discard(rid)
        if self.flags.log_request_events:
            self.emit(REQUEST_FINISHED, time.time(), self.engine, (
                max(self.step, 0), rid, compat.finish_reason(request), request.num_prompt_tokens,
                request.num_output_tokens, getattr(request, "num_preemptions", None),
            ))


# -- wrappers ---------------------------------------------------------------------------
# Each factory takes vLLM's original method and returns the wrapper installed in its
# place. `self.__dict__.get(PROBE_ATTR)` is None for schedulers built before install()
# or whose engine_config hook failed: those run untouched.


def _wrap_init(rt: Runtime, original: Callable) -> Callable:
    @functools.wraps(original)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if rt.enabled("engine_config"):
            try:
                self.__dict__[PROBE_ATTR] = SchedulerProbe(rt, self)
                announce, rt.on_first_scheduler = rt.on_first_scheduler, None
                if announce is not None:
                    announce()
            except Exception as e:  # no probe on this scheduler: say so at once
                rt.health.failed("engine_config", e, limit=1)
    return __init__


def _wrap_schedule(rt: Runtime, original: Callable) -> Callable:
    health = rt.health

    @functools.wraps(original)
    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        probe = self.__dict__.get(PROBE_ATTR)
        if probe is None:
            return original(self, *args, **kwargs)
        try:  # the step index and in_schedule: chunk, preempt and finish events use them
            probe.begin_step()  # too, so this runs even when step events are switched off
        except Exception as e:
            health.failed("step", e)
        t0 = perf_counter()
        out = original(self, *args, **kwargs)
        seconds = perf_counter() - t0
        if "step" in health.disabled:
            probe.in_schedule = False
            return out
        try:
            probe.end_step(self, out, seconds)
        except Exception as e:
            health.failed("step", e)
        return out
    return schedule


def _wrap_update_after_schedule(rt: Runtime, original: Callable) -> Callable:
    health = rt.health

    @functools.wraps(original)
    def _update_after_schedule(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        probe = self.__dict__.get(PROBE_ATTR)
        if probe is not None and "chunk" not in health.disabled:
            try:
                probe.on_chunks(self, scheduler_output)
            except Exception as e:
                probe.chunks_seen = False
                health.failed("chunk", e)
        return original(self, scheduler_output, *args, **kwargs)
    return _update_after_schedule


def _wrap_preempt(rt: Runtime, original: Callable) -> Callable:
    health = rt.health

    @functools.wraps(original)
    def _preempt_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        probe = self.__dict__.get(PROBE_ATTR)
        snap = None
        if probe is not None:  # bookkeeping for chunk and step events: even when switched off
            try:
                snap = probe.before_preempt(self, request)
            except Exception as e:
                health.failed("preempt", e)
        result = original(self, request, *args, **kwargs)
        if snap is not None and "preempt" not in health.disabled:
            try:
                probe.after_preempt(self, request, snap)
            except Exception as e:
                health.failed("preempt", e)
        return result
    return _preempt_request


def _wrap_add_request(rt: Runtime, original: Callable) -> Callable:
    health = rt.health

    @functools.wraps(original)
    def add_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        probe = self.__dict__.get(PROBE_ATTR)
        is_new = False
        if probe is not None and "request_added" not in health.disabled:
            try:  # streaming-input sessions re-add an existing id: not a new request
                is_new = request.request_id not in self.requests
            except Exception as e:
                health.failed("request_added", e)
        result = original(self, request, *args, **kwargs)
        if is_new:
            try:
                probe.on_added(request)
            except Exception as e:
                health.failed("request_added", e)
        return result
    return add_request


def _wrap_free_request(rt: Runtime, original: Callable) -> Callable:
    health = rt.health

    @functools.wraps(original)
    def _free_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        probe = self.__dict__.get(PROBE_ATTR)
        if probe is not None and "request_finished" not in health.disabled:
            try:
                probe.on_finished(request)
            except Exception as e:
                health.failed("request_finished", e)
        return original(self, request, *args, **kwargs)
    return _free_request


_WRAPPER_FACTORIES: dict[str, Callable[[Runtime, Callable], Callable]] = {
    "engine_config": _wrap_init,
    "step": _wrap_schedule,
    "chunk": _wrap_update_after_schedule,
    "preempt": _wrap_preempt,
    "request_added": _wrap_add_request,
    "request_finished": _wrap_free_request,
}


def _wanted_hooks(flags: ProbeFlags) -> set[str]:
    """Hooks needed for the flags. Chunk and preempt tracking also feed step events."""
    wanted = {"engine_config", "step"}
    if flags.log_chunk_boundaries or flags.log_schedule_each_step:
        wanted |= {"chunk", "preempt"}
    if flags.log_preempt_events:
        wanted.add("preempt")
    if flags.log_request_events:
        wanted |= {"request_added", "request_finished"}
    return wanted


#: Patched class -> (its Runtime, [(method name, vLLM's original)]).
_installed: dict[type, tuple[Runtime, list[tuple[str, Callable]]]] = {}


def install(scheduler_cls: type, rt: Runtime, vllm_version: str) -> list[str]:
    """Wrap the hook targets on ``scheduler_cls``; return the ``Class.method`` names patched.

    Idempotent: a class already patched (by this or another copy of the plugin) is left
    as it is and the names patched earlier are returned. A target that is missing, or
    whose signature does not match :data:`compat.TARGETS`, is skipped with one warning;
    if a *required* target is unusable nothing is patched and ``[]`` is returned.
    Never raises for a bad layout.
    """
    if scheduler_cls in _installed or getattr(scheduler_cls.schedule, WRAPPED_ATTR, None):
        _, done = _installed.get(scheduler_cls, (None, []))
        return [f"{scheduler_cls.__name__}.{m}" for m, _ in done]
    wanted = _wanted_hooks(rt.flags)
    plan: list[tuple[compat.Target, Callable]] = []
    for target in compat.TARGETS:
        if target.hook not in wanted:
            continue
        original = scheduler_cls.__dict__.get(target.method)
        problem = "missing" if original is None else compat.signature_problem(original, target.params)
        if problem:
            if target.required:
                logger.warning(
                    "vllm-probe: %s.%s %s in vLLM %s; the probe patches nothing",
                    scheduler_cls.__name__, target.method, problem, vllm_version,
                )
                return []
            logger.warning(
                "vllm-probe: %s.%s %s in vLLM %s; %s events are unavailable, other hooks still work",
                scheduler_cls.__name__, target.method, problem, vllm_version, target.hook,
            )
            continue
        plan.append((target, original))
    rt.vllm_version = vllm_version
    done = []
    for target, original in plan:
        wrapper = _WRAPPER_FACTORIES[target.hook](rt, original)
        setattr(wrapper, WRAPPED_ATTR, original)
        setattr(scheduler_cls, target.method, wrapper)
        done.append((target.method, original))
    _installed[scheduler_cls] = (rt, done)
    rt.patched = [f"{scheduler_cls.__name__}.{m}" for m, _ in done]
    return list(rt.patched)


def uninstall(scheduler_cls: type) -> Runtime | None:
    """Restore vLLM's originals on ``scheduler_cls`` (tests and benchmarks use this).

    Returns the :class:`Runtime` that :func:`install` put there (its sink, if any, still
    open: :meth:`Runtime.close` closes it), or None when the class was not patched here.
    """
    rt, done = _installed.pop(scheduler_cls, (None, []))
    for method, original in done:
        setattr(scheduler_cls, method, original)
    return rt


def attached_probe(sched: Any) -> SchedulerProbe | None:
    """The probe attached to a scheduler instance, if any."""
    return sched.__dict__.get(PROBE_ATTR)


def default_run_dir() -> Path:
    """Run directory from the environment (``VLLMPROBE_RUN_DIR``), else the manual one."""
    return Path(os.environ.get(envvars.RUN_DIR) or envvars.DEFAULT_MANUAL_RUN_DIR)

