"""Everything that differs between vLLM releases, in one place.

The probe reads vLLM's V1 scheduler (``vllm/v1/core/sched/scheduler.py``). Its private
methods and attributes change between releases; each difference the probe cares about
is one entry of :data:`DIFFERENCES` below (what changed, in which release, how the probe
handles it), and the readers below (:func:`token_budget`, :func:`queue_lengths_reader`,
:func:`finish_reason`, :func:`engine_settings`) are where the hooks meet those
differences. The methods the probe wraps, with the parameters each wrapper relies on,
are the patch table in :mod:`.patches`; :func:`signature_problem` checks them. Written
for the V1 scheduler of 0.12 and later; every minor release from 0.12 to the newest is
run by the compatibility suite (``python -m tests.compat``, the matrix in
docs/compatibility.md). Releases before 0.12 are refused (:data:`MIN_SUPPORTED`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, TypeVar
from collections.abc import Callable


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
               "snapshots around schedule() would need a loop over "
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
               "token_budget() and engine_config.max_num_scheduled_tokens read the scheduler's "
               "attribute", "max_num_scheduled_tokens budget"),
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
               "whole prompts; engine_config.scheduler_reserve_full_isl records it",
               "admission: whole prompt must fit"),
    Difference((0, 24), "schedule(self, throttle_prefills=False); EngineCore passes it positionally. "
               "With it (data-parallel prefill balancing) new prefills are deferred while a "
               "running request decodes, unless prefill_capacity_bound (0.24: only requests "
               "with no computed token).",
               "wrapper passes *args/**kwargs on and hands the argument to head_blocked_by "
               "(prefill_limit)", "schedule(throttle_prefills)"),
    Difference((0, 24), "SchedulerConfig.watermark: free-block headroom kept at admission.",
               "engine_config.watermark from 0.24", "watermark"),
    Difference((0, 25), "Paused streaming-input sessions count in the admission cap "
               "(len(running) + num_waiting_for_streaming_input).",
               "the admission profile adds them", "admission: streaming sessions in the cap"),
    Difference((0, 26), "_free_request returns a tuple (KV and EC transfer params) instead of a dict.",
               "wrapper returns vLLM's result untouched", "_free_request returns tuple"),
    Difference((0, 26), "Scheduler.hash_block_size: prefix-cache hashes at a granularity of "
               "their own (earlier releases hash at block_size).",
               "engine_config.hash_block_size reads it, else block_size", "hash_block_size"),
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
    Difference((0, 31), "SchedulerConfig.max_num_active_seqs (admission limit below max_num_seqs) "
               "and long_prefill_token_threshold_adaptive.",
               "engine_config records both from 0.31", "max_num_active_seqs, adaptive threshold"),
    Difference((0, 32), "PAUSED_NEW still admits from kv_holding_waiting.",
               "head_blocked_by is `deferred` under PAUSED_NEW only when kv_holding_waiting is empty",
               "admission: PAUSED_NEW drains KV holders"),
    Difference((0, 33), "Local prefill cadence (prefill_schedule_interval): new prefills wait "
               "for their turn while a request decodes, unless prefill_capacity_bound.",
               "head_blocked_by is prefill_limit", "admission: prefill cadence"),
    Difference((0, 34), "A resumed (preempted) request is scheduled as a new one: it is in "
               "SchedulerOutput.scheduled_new_reqs (NewRequestData with its prefill_token_ids), and "
               "CachedRequestData loses resumed_req_ids and all_token_ids. _preempt_request and "
               "_update_after_schedule are unchanged.",
               "nothing to adapt: the chunk hook marks a pass `resumed` from the requests it saw "
               "preempted (never from resumed_req_ids) and takes a request in scheduled_new_reqs that "
               "it saw preempted as that pass; step.new_reqs counts resumed requests, as before",
               "resumed requests in scheduled_new_reqs"),
    Difference((0, 34), "With --max-num-inflight-kv-loads and a KV connector, requests that may load "
               "KV asynchronously wait in Scheduler.async_kv_waiting (their head goes before "
               "`waiting`'s when it arrived earlier; under the priority policy the smaller head) and "
               "may start their load while the running queue is full; get_request_counts counts them "
               "as waiting.",
               "queue_lengths_reader() counts them as waiting; the admission profile peeks the earlier "
               "of both heads when the limit and a connector are set",
               "async_kv_waiting queue"),
    Difference((0, 34), "Cache-aware admission (cache_aware_admission_window, default 0: off; "
               "cache_aware_admission_threshold, default 0.5): under FCFS with prefix caching, once KV "
               "use reaches the threshold, requests of the first N waiting whose prefix is cached move "
               "ahead inside that window, before the waiting loop.",
               "head_blocked_by peeks the queue after schedule(), the reordered head; engine_config "
               "does not record the two settings yet, so whatif replays a run that set them in "
               "arrival order",
               "cache-aware admission"),
    Difference((0, 34), "long_prefill_token_threshold is ignored when chunked prefill is off "
               "(before, it still capped a request's tokens per step when more than one was eligible).",
               "nothing to adapt: the probe records the setting as configured; the replay runs the "
               "installed release's own rule",
               "long prefill threshold needs chunking"),
)


def differences_for(version: str) -> list[Difference]:
    """The entries of :data:`DIFFERENCES` introduced in ``version``'s minor release."""
    minor = parse_version(version)
    return [d for d in DIFFERENCES if d.since == minor]


#: Oldest release whose scheduler layout the probe supports (see DIFFERENCES).
MIN_SUPPORTED = (0, 12)
#: Newest minor release the compatibility suite last ran (every minor from
#: MIN_SUPPORTED up to it passed; docs/compatibility.md). Newer ones get a warning.
NEWEST_TESTED = (0, 34)


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
    budget: int | None = getattr(sched, "max_num_scheduled_tokens", None)
    if budget is None:
        budget = sched.scheduler_config.max_num_batched_tokens
    return budget


def queue_lengths_reader(sched: Any) -> Callable[[Any], tuple[int, int]]:
    """Return a function ``sched -> (running, waiting)`` (request counts), chosen once
    per scheduler so the step hook does no ``hasattr`` per step.

    Requests skipped by the waiting loop (0.18-0.30, ``skipped_waiting``) and, from 0.31,
    those that hold KV blocks while they wait (``kv_holding_waiting``) and, from 0.34,
    those parked for an asynchronous KV load (``async_kv_waiting``) count as waiting, as
    in vLLM's own ``Scheduler.get_request_counts``.
    """
    if hasattr(sched, "async_kv_waiting"):
        return lambda s: (len(s.running), len(s.waiting) + len(s.kv_holding_waiting) + len(s.async_kv_waiting))
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
        "engine": data_parallel_rank(pc),
        **scheduler_inputs(sched),
    }


def data_parallel_rank(pc: Any) -> int:
    """The engine core's data-parallel rank: ``parallel_config.data_parallel_index`` where the
    release has it, else ``data_parallel_rank``. vLLM runs a dense model's ranks as
    independent engine cores and resets each one's ``data_parallel_rank`` to 0 and
    ``data_parallel_size`` to 1; ``data_parallel_index`` keeps the rank
    (``ParallelConfig.reconfigure_for_independent_dp_rank``, ``run_engine_core``,
    ``vllm/v1/engine/core.py`` 0.32). 0 when neither is an int."""
    for name in ("data_parallel_index", "data_parallel_rank"):
        rank = getattr(pc, name, None)
        if isinstance(rank, int) and rank >= 0:
            return rank
    return 0


_T = TypeVar("_T")


def _or_none(read: Callable[[], _T]) -> _T | None:
    """``read()``, or None when it raises: an optional setting never costs the probe."""
    try:
        return read()
    except Exception:
        return None


def scheduler_inputs(sched: Any) -> dict[str, Any]:
    """The scheduler inputs beyond the classic settings, as optional ``engine_config``
    fields (what ``vllm-probe whatif`` needs to rebuild the same scheduler; each is None
    where the release has no such setting, see :data:`DIFFERENCES`). Never raises.

    From ``vllm/v1/core/sched/scheduler.py`` (0.32): ``max_num_scheduled_tokens``
    (``__init__``: the config value, else ``max_num_batched_tokens``),
    ``max_num_active_reqs`` (only when configured below ``max_num_seqs``),
    ``scheduler_config.long_prefill_token_threshold_adaptive``,
    ``scheduler_reserve_full_isl``, ``scheduler_config.watermark`` (passed to the
    ``KVCacheManager``), ``hash_block_size``; ``vllm_config.num_speculative_tokens``;
    the KV-cache group specs and, for ``gpu_memory_utilization`` → blocks, the bytes of
    one block (the largest group's page size times its layers: groups overlay one pool,
    ``vllm/v1/kv_cache_interface.py`` ``KVCacheTensor``), the overrides that bypass the
    memory computation, and the device's total memory (:func:`device_memory_bytes`);
    each KV-cache group's spec (:func:`kv_group_specs`), vLLM's own "Maximum concurrency"
    figure (``cache_config.kv_cache_max_concurrency``, set by ``update_kv_cache_capacity``
    before the scheduler is built, 0.32) and the speculative method
    (``speculative_config.method``).
    """
    vc = sched.vllm_config
    sc, cc = vc.scheduler_config, vc.cache_config
    kv = sched.kv_cache_config

    def active() -> int | None:
        configured = getattr(sc, "max_num_active_seqs", None)
        return configured if configured is not None and configured < sc.max_num_seqs else None

    def spec_tokens() -> int | None:
        spec = getattr(vc, "speculative_config", None)
        return getattr(spec, "num_speculative_tokens", None) if spec is not None else None

    def block_bytes() -> int | None:
        sizes = [g.kv_cache_spec.page_size_bytes * len(g.layer_names) for g in kv.kv_cache_groups]
        return max(sizes) if sizes else None

    return {
        "max_num_scheduled_tokens": getattr(sched, "max_num_scheduled_tokens", None),
        "max_num_active_seqs": _or_none(active),
        "long_prefill_token_threshold_adaptive": getattr(sc, "long_prefill_token_threshold_adaptive", None),
        "scheduler_reserve_full_isl": getattr(sc, "scheduler_reserve_full_isl", None),
        "watermark": getattr(sc, "watermark", None),
        "hash_block_size": getattr(sched, "hash_block_size", None) or getattr(sched, "block_size", None),
        "num_speculative_tokens": _or_none(spec_tokens),
        "kv_cache_groups": _or_none(lambda: [type(g.kv_cache_spec).__name__ for g in kv.kv_cache_groups]),
        "gpu_memory_utilization": getattr(cc, "gpu_memory_utilization", None),
        "num_gpu_blocks_override": getattr(cc, "num_gpu_blocks_override", None),
        "kv_cache_memory_bytes": getattr(cc, "kv_cache_memory_bytes", None),
        "kv_block_bytes": _or_none(block_bytes),
        "device_memory_bytes": device_memory_bytes(),
        "kv_cache_group_specs": kv_group_specs(sched),
        "kv_max_concurrency": _or_none(lambda: _float(cc.kv_cache_max_concurrency)),
        "speculative_method": _or_none(lambda: _str(vc.speculative_config.method)),
    }


def _float(v: Any) -> float | None:
    return None if v is None else float(v)


def _str(v: Any) -> str | None:
    return None if v is None else str(getattr(v, "value", v))


def kv_group_specs(sched: Any) -> list[dict[str, Any]] | None:
    """Each KV-cache group of a built scheduler, for ``engine_config.kv_cache_group_specs``:
    ``{"kind", "block_size", "sliding_window", "layers", "blocks_per_request"}`` (tokens,
    tokens, layers, blocks). Never raises: None when the groups cannot be read.

    From ``sched.kv_cache_config.kv_cache_groups`` (``vllm/v1/kv_cache_interface.py``,
    ``KVCacheGroupSpec``: ``layer_names``, ``kv_cache_spec``; every release from 0.9).
    ``sliding_window`` is the spec's (``SlidingWindowSpec``; a ``FullAttentionSpec`` keeps the
    model's window when the hybrid allocator is off and allocates for every token);
    ``blocks_per_request`` is what vLLM's start-up line counts for one request of
    ``max_model_len`` tokens in that group, ``cdiv(spec.max_memory_usage_bytes(vllm_config),
    spec.page_size_bytes)`` (``get_max_concurrency_for_kv_cache_config``,
    ``vllm/v1/core/kv_cache_utils.py`` 0.32), None where the spec cannot say.
    """
    vc = sched.vllm_config

    def per_request(spec: Any) -> int | None:
        try:
            page = spec.page_size_bytes
            return -(-int(spec.max_memory_usage_bytes(vc)) // int(page)) if page else None
        except Exception:
            return None

    def read() -> list[dict[str, Any]]:
        out = []
        for g in sched.kv_cache_config.kv_cache_groups:
            spec = g.kv_cache_spec
            window = getattr(spec, "sliding_window", None)
            out.append({"kind": type(spec).__name__, "block_size": int(spec.block_size),
                        "sliding_window": int(window) if window else None, "layers": len(g.layer_names),
                        "blocks_per_request": per_request(spec)})
        return out

    return _or_none(read)


def output_index(model_output: Any) -> dict[str, int]:
    """Request id -> its row in a ``ModelRunnerOutput``'s ``sampled_token_ids``:
    ``req_id_to_index`` up to 0.33; from 0.34 the rows follow ``req_ids`` (the
    constructor lost the argument; ``vllm/v1/outputs.py``)."""
    index: dict[str, int] | None = getattr(model_output, "req_id_to_index", None)
    if index is None:
        index = {rid: i for i, rid in enumerate(model_output.req_ids)}
    return index


def sampled_per_step(sched: Any) -> int:
    """Tokens a decode samples besides accepted drafts: ``Scheduler.num_sampled_tokens_per_step``
    (0.32: 1, 0 for diffusion models), 1 where the release has no such attribute; the
    accepted drafts of a verifying step are ``len(sampled) - this`` (``update_from_output``)."""
    n = getattr(sched, "num_sampled_tokens_per_step", 1)
    return n if isinstance(n, int) else 1


def platform_name() -> str | None:
    """vLLM's platform in lower case (``cpu``, ``cuda``, ``rocm``, ``tpu``, ``xpu``,
    ``oot`` …): ``current_platform``'s ``PlatformEnum`` name (``vllm/platforms/interface.py``,
    every release since 0.6), else its ``device_type``. None when it cannot be read."""

    def read() -> str | None:
        from vllm.platforms import current_platform

        enum = getattr(current_platform, "_enum", None)
        name = getattr(enum, "name", None) or getattr(current_platform, "device_type", None)
        return str(name).lower() if name else None

    return _or_none(read)


def device_memory_bytes() -> int | None:
    """Total memory of the device ``gpu_memory_utilization`` is a share of (bytes), where
    vLLM's platform can say without touching the device: the CPU backend's NUMA node
    (``CpuPlatform.get_device_total_memory``, what ``CPUWorker`` takes the share of) and
    CUDA through NVML (``NvmlCudaPlatform``; the other CUDA path would create a CUDA
    context in the engine core). None elsewhere, and when the call fails."""

    def read() -> int | None:
        from vllm.platforms import current_platform

        if current_platform.is_cpu() or type(current_platform).__name__ == "NvmlCudaPlatform":
            return int(current_platform.get_device_total_memory())
        return None

    return _or_none(read)
