"""The patch table: which methods of vLLM's ``Scheduler`` the probe wraps, and how.

One table, :data:`PATCHES`, one :class:`Patch` per hook — the shape of ddtrace's and
OpenTelemetry's instrumentors (one table per integration, with install and uninstall).
Each entry names the method, the hook its errors are counted under, the leading
parameters its wrapper relies on (checked before anything is patched), whether the
probe can work without it, the flags that need it, the wrapper, and why it is there
(the vLLM code it mirrors). What each hook records is in :mod:`.hooks`; the releases
that differ, in :mod:`.compat`.

:func:`install` wraps the base class ``vllm.v1.core.sched.scheduler.Scheduler`` once,
so subclasses that call ``super()`` (``AsyncScheduler``, the diffusion schedulers) are
reached too; :func:`uninstall` puts vLLM's originals back.

Every wrapper calls vLLM's original outside any ``try`` of ours and returns its result
untouched. The probe's own work sits in a ``try`` whose failures are counted per hook
(:class:`.hooks.HookHealth`); a hook that fails :data:`.hooks.MAX_HOOK_ERRORS` times
switches its events off, while the bookkeeping the other hooks rely on (step index,
preempted requests awaiting their re-prefill) goes on.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable

from ..settings import ProbeFlags
from . import compat
from .hooks import PROBE_ATTR, WRAPPED_ATTR, Runtime, SchedulerProbe

logger = logging.getLogger("vllm_probe")

#: Where the class :func:`install` is given lives (the plugin imports it from there).
SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"
SCHEDULER_CLASS = "Scheduler"

#: ``(runtime, vLLM's original method) -> the wrapper installed in its place``.
WrapperFactory = Callable[[Runtime, Callable[..., Any]], Callable[..., Any]]


@dataclass(frozen=True, kw_only=True)
class Patch:
    """One scheduler method the probe wraps.

    Attributes:
        hook: the name its errors are counted under (``probe_stats.hook_errors``,
            ``hooks_disabled``) and that its warnings use, e.g. ``"preempt"``.
        method: the attribute of ``Scheduler`` that is replaced, e.g. ``"_preempt_request"``.
        params: the leading parameter names after ``self`` the wrapper relies on; a
            release whose method lacks them gets one warning and this hook is skipped
            (:func:`.compat.signature_problem`).
        required: without it the probe patches nothing at all.
        flags: :class:`~vllm_probe.settings.ProbeFlags` fields of which any one, when
            true, needs this hook; ``()``: always installed.
        wrap: builds the wrapper from the :class:`~.hooks.Runtime` and vLLM's original.
        why: what the wrapper reads there, and the vLLM code and releases it mirrors.
    """

    hook: str
    method: str
    params: tuple[str, ...]
    required: bool
    flags: tuple[str, ...]
    wrap: WrapperFactory
    why: str

    def wanted(self, flags: ProbeFlags) -> bool:
        """Whether ``flags`` need this hook."""
        return not self.flags or any(getattr(flags, f) for f in self.flags)


# -- wrappers ---------------------------------------------------------------------------
# `self.__dict__.get(PROBE_ATTR)` is None for schedulers built before install() or whose
# engine_config hook failed: those run untouched.


def _wrap_init(rt: Runtime, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
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


def _wrap_schedule(rt: Runtime, original: Callable[..., Any]) -> Callable[..., Any]:
    health = rt.health
    timer = rt.timer  # time.perf_counter in vLLM; a replay's virtual clock

    @functools.wraps(original)
    def schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        probe = self.__dict__.get(PROBE_ATTR)
        if probe is None:
            return original(self, *args, **kwargs)
        try:  # the step index and in_schedule: chunk, preempt and finish events use them
            probe.begin_step()  # too, so this runs even when step events are switched off
        except Exception as e:
            health.failed("step", e)
        t0 = timer()
        out = original(self, *args, **kwargs)
        seconds = timer() - t0
        if "step" in health.disabled:
            probe.in_schedule = False
            return out
        try:  # throttle_prefills (0.24+, passed positionally by EngineCore): head_blocked_by reads it
            probe.end_step(self, out, seconds, args[0] if args else kwargs.get("throttle_prefills", False))
        except Exception as e:
            health.failed("step", e)
        return out
    return schedule


def _wrap_update_after_schedule(rt: Runtime, original: Callable[..., Any]) -> Callable[..., Any]:
    health = rt.health

    @functools.wraps(original)
    def _update_after_schedule(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        probe = self.__dict__.get(PROBE_ATTR)
        if probe is not None and "chunk" not in health.disabled:
            try:
                probe.on_chunks(self, scheduler_output)
            except Exception as e:
                probe.chunks_seen = False
                health.failed("chunk", e)
        return original(self, scheduler_output, *args, **kwargs)
    return _update_after_schedule


def _wrap_preempt(rt: Runtime, original: Callable[..., Any]) -> Callable[..., Any]:
    health = rt.health

    @functools.wraps(original)
    def _preempt_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
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


def _wrap_add_request(rt: Runtime, original: Callable[..., Any]) -> Callable[..., Any]:
    health = rt.health

    @functools.wraps(original)
    def add_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
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


def _wrap_free_request(rt: Runtime, original: Callable[..., Any]) -> Callable[..., Any]:
    health = rt.health

    @functools.wraps(original)
    def _free_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        probe = self.__dict__.get(PROBE_ATTR)
        if probe is not None and "request_finished" not in health.disabled:
            try:
                probe.on_finished(request)
            except Exception as e:
                health.failed("request_finished", e)
        return original(self, request, *args, **kwargs)
    return _free_request


def _wrap_update_from_output(rt: Runtime, original: Callable[..., Any]) -> Callable[..., Any]:
    health = rt.health

    @functools.wraps(original)
    def update_from_output(self: Any, scheduler_output: Any, model_runner_output: Any, *args: Any,
                           **kwargs: Any) -> Any:
        probe = self.__dict__.get(PROBE_ATTR)
        if probe is not None and probe.spec_on and "spec_decode" not in health.disabled:
            try:
                probe.on_output(self, scheduler_output, model_runner_output)
            except Exception as e:
                health.failed("spec_decode", e)
        return original(self, scheduler_output, model_runner_output, *args, **kwargs)
    return update_from_output


#: Feeds the step event's prefill/decode split and its ``preempted`` list as well.
_STEP_DETAIL = ("log_chunk_boundaries", "log_schedule_each_step")

#: Every method the probe wraps, in install order (also the order of ``hook_errors``).
#: File: ``vllm/v1/core/sched/scheduler.py``; release differences in :mod:`.compat`.
PATCHES: tuple[Patch, ...] = (
    Patch(hook="engine_config", method="__init__", params=("vllm_config", "kv_cache_config"),
          required=True, flags=(), wrap=_wrap_init,
          why="Once the scheduler is built: attach the probe's per-scheduler state and write "
              "engine_config with the effective settings. Scheduler.__init__(self, vllm_config, "
              "kv_cache_config, ...) in every release from 0.12."),
    Patch(hook="step", method="schedule", params=(), required=True, flags=(), wrap=_wrap_schedule,
          why="One step event per call and the time spent inside; the step index feeds every "
              "other event, so it is installed even with step events off. schedule(self) up "
              "to 0.23, schedule(self, throttle_prefills=False) from 0.24 (EngineCore passes "
              "it positionally: the wrapper passes *args on)."),
    Patch(hook="chunk", method="_update_after_schedule", params=("scheduler_output",),
          required=False, flags=_STEP_DETAIL, wrap=_wrap_update_after_schedule,
          why="The prefill-chunk boundary: vLLM advances num_computed_tokens of every "
              "scheduled request here, so the wrapper reads it just before (from 0.9.2)."),
    Patch(hook="preempt", method="_preempt_request", params=("request",), required=False,
          flags=("log_preempt_events", *_STEP_DETAIL), wrap=_wrap_preempt,
          why="Preemption by recompute (from 0.12): vLLM resets request.num_computed_tokens "
              "to 0, so the discarded tokens are read before the call; also reached from "
              "reset_prefix_cache(), outside a step. (request, timestamp) in 0.12, "
              "drop_stale_output from 0.27."),
    Patch(hook="request_added", method="add_request", params=("request",), required=False,
          flags=("log_request_events",), wrap=_wrap_add_request,
          why="A request reaches the engine core's scheduler; streaming-input sessions re-add "
              "an existing id, which is not a new request."),
    Patch(hook="request_finished", method="_free_request", params=("request",), required=False,
          flags=("log_request_events",), wrap=_wrap_free_request,
          why="A request leaves the scheduler (stopped, length, aborted). delay_free_blocks "
              "from 0.16, a tuple result from 0.26: passed through untouched."),
    Patch(hook="spec_decode", method="update_from_output", params=("scheduler_output", "model_runner_output"),
          required=False, flags=("log_schedule_each_step", "log_request_events"), wrap=_wrap_update_from_output,
          why="Speculative decoding: the drafts a step verified and how many the model accepted "
              "(len(sampled_token_ids) - 1 per request), read before vLLM rolls the rejected ones "
              "back; a step without drafts costs one attribute read. update_from_output(self, "
              "scheduler_output, model_runner_output) in every release from 0.12."),
)

#: Patched class -> (its Runtime, [(method name, vLLM's original)]).
_installed: dict[type, tuple[Runtime, list[tuple[str, Callable[..., Any]]]]] = {}


def install(scheduler_cls: type, rt: Runtime, vllm_version: str) -> list[str]:
    """Wrap the methods of :data:`PATCHES` that ``rt.flags`` need on ``scheduler_cls``.

    Returns the ``Class.method`` names patched, e.g. ``["Scheduler.__init__", ...]``.
    Idempotent: a class already patched (by this or another copy of the plugin) is left
    as it is and the names patched earlier are returned. A method that is missing, or
    whose signature lacks the entry's ``params``, is skipped with one warning; if a
    *required* one is unusable nothing is patched and ``[]`` is returned. Never raises
    for a bad layout.
    """
    if scheduler_cls in _installed or getattr(getattr(scheduler_cls, "schedule", None), WRAPPED_ATTR, None):
        _, done = _installed.get(scheduler_cls, (None, []))
        return [f"{scheduler_cls.__name__}.{m}" for m, _ in done]
    plan: list[tuple[Patch, Callable[..., Any]]] = []
    for patch in PATCHES:
        if not patch.wanted(rt.flags):
            continue
        original = scheduler_cls.__dict__.get(patch.method)
        problem = "missing" if original is None else compat.signature_problem(original, patch.params)
        if problem or original is None:
            if patch.required:
                logger.warning(
                    "vllm-probe: %s.%s %s in vLLM %s; the probe patches nothing",
                    scheduler_cls.__name__, patch.method, problem, vllm_version,
                )
                return []
            logger.warning(
                "vllm-probe: %s.%s %s in vLLM %s; %s events are unavailable, other hooks still work",
                scheduler_cls.__name__, patch.method, problem, vllm_version, patch.hook,
            )
            continue
        plan.append((patch, original))
    rt.vllm_version = vllm_version
    rt.health.track(p.hook for p in PATCHES)
    done = []
    for patch, original in plan:
        wrapper = patch.wrap(rt, original)
        setattr(wrapper, WRAPPED_ATTR, original)
        setattr(scheduler_cls, patch.method, wrapper)
        done.append((patch.method, original))
    _installed[scheduler_cls] = (rt, done)
    rt.patched = [f"{scheduler_cls.__name__}.{m}" for m, _ in done]
    return list(rt.patched)


def uninstall(scheduler_cls: type) -> Runtime | None:
    """Restore vLLM's originals on ``scheduler_cls`` (tests and benchmarks use this).

    Returns the :class:`~.hooks.Runtime` that :func:`install` put there (its sink, if
    any, still open: :meth:`~.hooks.Runtime.close` closes it), or None when the class
    was not patched here.
    """
    rt, done = _installed.pop(scheduler_cls, (None, []))
    for method, original in done:
        setattr(scheduler_cls, method, original)
    return rt
