"""Everything that differs between vLLM releases, in one place.

The probe reads vLLM's V1 scheduler (``vllm/v1/core/sched/scheduler.py``). Its private
methods and attributes change between releases; each difference the probe cares about
is one entry of :data:`DIFFERENCES` below (what changed, in which release, how the probe
handles it), and the readers below (:func:`token_budget`, :func:`queue_lengths_reader`,
:func:`finish_reason`, :func:`engine_settings`) are where the hooks meet those
differences. The methods the probe wraps, with the parameters each wrapper relies on,
are the patch table in :mod:`.patches`; :func:`signature_problem` checks them. Written for the V1 scheduler of 0.12 and later; every minor release from
0.12 to the newest is run by the compatibility suite (``python -m tests.compat``, the
matrix in docs/compatibility.md). Releases before 0.12 are refused (:data:`MIN_SUPPORTED`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Difference:
    """One change in vLLM that the probe depends on.

    ``since``: the first minor release with the change (the compatibility suite runs
    the latest patch of each minor, so a change made in a patch release is listed
    under its minor). ``short``: a few words for the compatibility table.
    """

    since: tuple[int, int]
    what: str
    handling: str
    short: str


DIFFERENCES: tuple[Difference, ...] = (
    Difference((0, 12), "Scheduler._preempt_request(request, timestamp) appears; before it "
               "preemption is inline in schedule() and nothing can be wrapped. Status "
               "snapshots around schedule() (design.md section 3) would need a loop over "
               "the running requests on every step, which the decode-only hot path must not have.",
               "MIN_SUPPORTED = 0.12: older releases are refused (the plugin warns once and "
               "patches nothing)",
               "_preempt_request(request, timestamp)"),
    Difference((0, 12), "Admission (head_blocked_by): a step that preempted admits nobody "
               "(`if not preempted_reqs` before the waiting loop); the waiting loop stops at "
               "`len(running) == max_num_running_reqs`; only the head's next chunk must fit "
               "the free blocks, so a long prompt is admitted chunk by chunk and may later "
               "preempt itself.",
               "admission.head_blocked_by: preemption first, then the loop-top stops; "
               "kv_cache by elimination", "admission: preemption gate, chunk-only fit"),
    Difference((0, 16), "_free_request(request, delay_free_blocks=False) gains a parameter.",
               "wrapper passes *args/**kwargs on", "_free_request(delay_free_blocks)"),
    Difference((0, 17), "Scheduler.max_num_scheduled_tokens may differ from "
               "max_num_batched_tokens (scheduler_config.max_num_scheduled_tokens).",
               "token_budget() reads the scheduler's attribute", "max_num_scheduled_tokens budget"),
    Difference((0, 17), "PauseState: the waiting phase runs only while UNPAUSED.",
               "head_blocked_by is `deferred` while paused", "admission: PauseState"),
    Difference((0, 18), "Requests skipped by the waiting loop (grammar, remote KV) are kept in "
               "Scheduler.skipped_waiting, visited before `waiting` (FCFS; under the priority "
               "policy the smaller head of the two), and counted as waiting by "
               "get_request_counts (up to 0.30).",
               "queue_lengths_reader() counts them as waiting; the admission profile peeks "
               "skipped_waiting first", "skipped_waiting queue"),
    Difference((0, 19), "scheduler_reserve_full_isl (default True): a waiting request is "
               "admitted only when its whole prompt fits the free KV blocks, not only its "
               "next chunk (can_fit_full_sequence; from 0.21 allocate_slots(full_sequence_must_fit)).",
               "head_blocked_by names it kv_cache by elimination; the doctor's remedies count "
               "whole prompts", "admission: whole prompt must fit"),
    Difference((0, 24), "schedule(self, throttle_prefills=False); EngineCore passes it positionally. "
               "With it (data-parallel prefill balancing) new prefills are deferred while a "
               "running request decodes, unless prefill_capacity_bound (0.24: only requests "
               "with no computed token).",
               "wrapper passes *args/**kwargs on and hands the argument to head_blocked_by "
               "(prefill_limit)", "schedule(throttle_prefills)"),
    Difference((0, 25), "Paused streaming-input sessions count in the admission cap "
               "(len(running) + num_waiting_for_streaming_input).",
               "the admission profile adds them", "admission: streaming sessions in the cap"),
    Difference((0, 26), "_free_request returns a tuple (KV and EC transfer params) instead of a dict.",
               "wrapper returns vLLM's result untouched", "_free_request returns tuple"),
    Difference((0, 27), "_preempt_request(..., drop_stale_output=False); "
               "SchedulerOutput.preempted_req_ids accumulates every preemption since the last step. "
               "A request preempted with output still in flight is skipped until it is stale-free.",
               "wrapper passes the argument on; preempted_req_ids is not read (preemptions "
               "come from the _preempt_request hook); a stale head is `deferred`",
               "_preempt_request(drop_stale_output)"),
    Difference((0, 28), "Spec decode reserves draft slots per request out of max_num_batched_tokens "
               "(a second, input budget).",
               "head_blocked_by reads it as token_budget", "admission: input budget"),
    Difference((0, 31), "Requests that hold KV blocks while waiting move to kv_holding_waiting "
               "(visited first); the admission cap is max_num_active_reqs; skipped requests "
               "are kept in deferred_waiting; long_prefill_token_threshold applies only when "
               "more than one request is eligible.",
               "queue_lengths_reader() counts them as waiting, as get_request_counts does; the "
               "admission profile peeks kv_holding_waiting first and reads max_num_active_reqs",
               "kv_holding_waiting queue"),
    Difference((0, 32), "PAUSED_NEW still admits from kv_holding_waiting.",
               "head_blocked_by is `deferred` under PAUSED_NEW only when kv_holding_waiting is empty",
               "admission: PAUSED_NEW drains KV holders"),
    Difference((0, 33), "Local prefill cadence (prefill_schedule_interval): new prefills wait "
               "for their turn while a request decodes, unless prefill_capacity_bound.",
               "head_blocked_by is prefill_limit", "admission: prefill cadence"),
)


def differences_for(version: str) -> list[Difference]:
    """The entries of :data:`DIFFERENCES` introduced in ``version``'s minor release."""
    minor = parse_version(version)
    return [d for d in DIFFERENCES if d.since == minor]


#: Oldest release whose scheduler layout the probe supports (see DIFFERENCES).
MIN_SUPPORTED = (0, 12)
#: Newest minor release the compatibility suite last ran (every minor from
#: MIN_SUPPORTED up to it passed; docs/compatibility.md). Newer ones get a warning.
NEWEST_TESTED = (0, 33)


def is_tested(version: str) -> bool:
    """Whether the compatibility suite covers ``version``'s minor release."""
    return MIN_SUPPORTED <= parse_version(version) <= NEWEST_TESTED


def parse_version(version: str) -> tuple[int, int]:
    """``"0.32.0"`` → ``(0, 32)``; unparseable → ``(0, 0)``."""
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    while len(parts) < 2:
        parts.append(0)
    return parts[0], parts[1]


def signature_problem(func: Any, params: tuple[str, ...]) -> str | None:
    """Why ``func`` does not fit a wrapper expecting ``params`` after ``self``, or None.

    ``params`` are the leading positional parameter names the wrapper relies on (an entry
    of :data:`.patches.PATCHES`); the answer reads e.g. ``"expected parameters (request),
    found (req, timestamp)"`` or ``"signature cannot be inspected"``. Never raises.
    """
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return "signature cannot be inspected"
    names = [p.name for p in sig.parameters.values()
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if names[:1] == ["self"]:
        names = names[1:]
    if tuple(names[: len(params)]) != params:
        return f"expected parameters ({', '.join(params)}), found ({', '.join(names)})"
    return None


# -- readers: one place for attributes that moved between releases ---------------------


def token_budget(sched: Any) -> int:
    """The per-step token budget in tokens.

    ``Scheduler.max_num_scheduled_tokens`` (``vllm/v1/core/sched/scheduler.py``, from
    0.17 it may differ from the configured budget; see DIFFERENCES), else
    ``scheduler_config.max_num_batched_tokens``.
    """
    budget = getattr(sched, "max_num_scheduled_tokens", None)
    if budget is None:
        budget = sched.scheduler_config.max_num_batched_tokens
    return budget


def queue_lengths_reader(sched: Any):
    """Return a function ``sched -> (running, waiting)`` (request counts), chosen once
    per scheduler so the step hook does no ``hasattr`` per step.

    Requests skipped by the waiting loop (0.18-0.30, ``skipped_waiting``) and, from 0.31,
    those that hold KV blocks while they wait (``kv_holding_waiting``) count as waiting,
    as in vLLM's own ``Scheduler.get_request_counts``.
    """
    if hasattr(sched, "kv_holding_waiting"):
        return lambda s: (len(s.running), len(s.waiting) + len(s.kv_holding_waiting))
    if hasattr(sched, "skipped_waiting"):
        return lambda s: (len(s.running), len(s.waiting) + len(s.skipped_waiting))
    return lambda s: (len(s.running), len(s.waiting))


def finish_reason(request: Any) -> str:
    """Finish reason of a finished request as vLLM's API reports it.

    ``request.get_finished_reason()`` (``vllm/v1/request.py``: ``stop``, ``length``,
    ``abort``, ``error``); when it gives None or raises, the request status's name in
    lower case (e.g. ``finished_aborted``). Never raises.
    """
    try:
        reason = request.get_finished_reason()
    except Exception:
        reason = None
    if reason is not None:
        return str(reason)
    status = getattr(request, "status", None)
    return getattr(status, "name", str(status)).lower()


def engine_settings(sched: Any) -> dict[str, Any]:
    """The effective scheduler settings of a built ``Scheduler``, after vLLM applied its
    defaults and platform overrides.

    Returns ``{engine_config field: value}`` for the fields the probe takes from here
    (token and block counts in tokens / blocks) plus ``"engine"``, the data-parallel
    rank. Reads ``sched.vllm_config`` (``vllm/config/``: ``scheduler_config``,
    ``cache_config``, ``parallel_config``, ``model_config``) and ``sched.kv_cache_config``;
    ``enable_chunked_prefill`` was ``chunked_prefill_enabled`` in older releases. Raises
    ``AttributeError`` when a release lacks a required attribute (the ``engine_config``
    hook counts it and leaves that scheduler unprobed).
    """
    vc = sched.vllm_config
    sc, cc = vc.scheduler_config, vc.cache_config
    pc = vc.parallel_config
    num_blocks = sched.kv_cache_config.num_blocks
    block_size = getattr(sched, "block_size", None) or cc.block_size
    policy = getattr(sc, "policy", None)
    chunked = getattr(sc, "enable_chunked_prefill", None)
    if chunked is None:
        chunked = getattr(sc, "chunked_prefill_enabled", None)
    return {
        "max_num_batched_tokens": sc.max_num_batched_tokens,
        "max_num_seqs": sc.max_num_seqs,
        "enable_chunked_prefill": chunked,
        "long_prefill_token_threshold": getattr(sc, "long_prefill_token_threshold", None),
        "num_kv_blocks": num_blocks,
        "block_size": block_size,
        "kv_capacity_tokens": max(num_blocks - 1, 0) * block_size if block_size else None,
        "max_model_len": vc.model_config.max_model_len,
        "scheduling_policy": str(getattr(policy, "value", policy)),
        "async_scheduling": bool(getattr(sc, "async_scheduling", False)),
        "prefix_caching": bool(cc.enable_prefix_caching),
        "data_parallel_size": getattr(pc, "data_parallel_size", 1),
        "engine": getattr(pc, "data_parallel_rank", 0) or 0,
    }
