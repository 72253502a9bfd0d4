"""Why the head of vLLM's waiting queue was not admitted in a step (``step.head_blocked_by``).

After ``Scheduler.schedule()`` returned with requests still waiting, :func:`head_blocked_by`
names what stopped the first of them, in vLLM's terms (:data:`REASONS`):

* ``preemption`` — the step preempted: vLLM skips the waiting phase in such a step
  (``if not preempted_reqs``, ``vllm/v1/core/sched/scheduler.py:900`` in 0.32, every
  release);
* ``deferred`` — the head waits for something outside the scheduler: its grammar is
  still compiling, its remote KV still in transfer, its streaming input pending, stale
  in-flight output after an async preemption (0.27+), a LoRA slot, a KV connector; the
  scheduler is paused; or under ``AsyncScheduler`` its slot is held by a request whose
  last token is still in flight (the slot frees one step later, so raising
  ``max_num_seqs`` would not help);
* ``token_budget`` — the step's token budget was used up before the head (or, chunked
  prefill off, its prompt exceeds what was left);
* ``max_num_seqs`` — the running queue was full;
* ``prefill_limit`` — vLLM held new prefills back: the data-parallel prefill throttle
  (``schedule(throttle_prefills=True)``, 0.24+) or the local prefill cadence
  (``prefill_schedule_interval``, 0.33);
* ``kv_cache`` — the blocks vLLM requires to admit it (its whole prompt from 0.19,
  ``scheduler_reserve_full_isl``; its next chunk before) exceed the free blocks.

O(1) per step: the head is a peek at the queue, the rest is a handful of counters read
after the call (vLLM changes none of them after the loop breaks); no loop over the
waiting or running queue, no prefix-cache lookup (it would cost 20-150 µs and, up to
0.26, inflate vLLM's hit-rate metrics). ``kv_cache`` is therefore named by elimination:
allocation failure is the only stop that cannot be read cheaply and the only one left
when the others are excluded, which makes it exact despite prefix-cache hits, watermark
and copy-on-write blocks. Where the two disagree, the head's own block comes first (a
head that cannot run whatever happens is ``deferred`` even when vLLM stopped earlier on
the budget), and the async rule above replaces vLLM's literal ``max_num_seqs``.

The release differences (where the head is, the admission cap, the pause states,
which prefill deferrals exist) are entries of :data:`vllm_probe.engine.compat.DIFFERENCES`;
:class:`AdmissionProfile` reads them from the scheduler once, in the ``__init__`` hook.
Validated on the real scheduler of every minor release of the compatibility matrix
(tests/engine/test_head_blocked_by.py, run by the compatibility suite; docs/compatibility.md).
Known limits are listed in docs/events.md under ``step``.
"""

from __future__ import annotations

from collections import deque
from typing import Any
from collections.abc import Callable

from ..schema.events import HEAD_BLOCKED_REASONS as REASONS
from .compat import parse_version

__all__ = ["REASONS", "AdmissionProfile", "head_blocked_by"]

#: ``RequestStatus`` members of a request that waits for something outside the scheduler
#: (``WAITING_FOR_FSM`` became ``WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR`` in 0.19).
_BLOCKED_STATUSES = frozenset({"WAITING_FOR_REMOTE_KVS", "WAITING_FOR_FSM",
                               "WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR", "WAITING_FOR_STREAMING_REQ"})


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# -- the head of the waiting queue, per release (compat.DIFFERENCES) -------------------------
# vLLM's FCFS queue is a ``deque`` subclass whose ``__bool__``/``__len__`` are Python methods
# around deque's own; where the queues are deques (checked once, in the profile) the head is
# read with deque's C methods: ~0.3 µs instead of ~2.6 µs through ``peek_request`` (measured
# on vLLM 0.32's FCFSRequestQueue). Other queues (the priority policy's heap) use peek_request.

_len = deque.__len__
_first = deque.__getitem__


def _head_single(s: Any) -> Any:
    """0.12-0.17: one waiting queue."""
    w = s.waiting
    return w.peek_request() if w else None


def _head_single_deque(s: Any) -> Any:
    w = s.waiting
    return _first(w, 0) if _len(w) else None


def _head_skipped_fcfs(s: Any) -> Any:
    """0.18-0.30, FCFS: requests skipped earlier (``skipped_waiting``) are visited first."""
    q = s.skipped_waiting or s.waiting
    return q.peek_request() if q else None


def _head_skipped_fcfs_deque(s: Any) -> Any:
    q = s.skipped_waiting
    if not _len(q):
        q = s.waiting
    return _first(q, 0) if _len(q) else None


def _head_skipped_priority(s: Any) -> Any:
    """0.18-0.30, priority policy: the smaller of both heads."""
    a, b = s.waiting, s.skipped_waiting
    if a and b:
        ra, rb = a.peek_request(), b.peek_request()
        return ra if ra < rb else rb
    q = a or b
    return q.peek_request() if q else None


def _head_kv_holding(s: Any) -> Any:
    """0.31+: requests that hold KV blocks while waiting (``kv_holding_waiting``) first."""
    q = s.kv_holding_waiting or s.waiting
    return q.peek_request() if q else None


def _head_kv_holding_deque(s: Any) -> Any:
    q = s.kv_holding_waiting
    if not _len(q):
        q = s.waiting
    return _first(q, 0) if _len(q) else None


def _head_async_kv(s: Any) -> Any:
    """0.34+ with ``max_num_inflight_kv_loads`` and a KV connector: after
    ``kv_holding_waiting``, the earlier of the ``waiting`` and ``async_kv_waiting`` heads
    (``Scheduler._next_waiting_queue``: by arrival under FCFS, the smaller under priority)."""
    if s.kv_holding_waiting:
        return s.kv_holding_waiting.peek_request()
    a, b = s.waiting, s.async_kv_waiting
    if a and b:
        ra, rb = a.peek_request(), b.peek_request()
        if s.policy.name == "PRIORITY":
            return rb if rb < ra else ra
        return rb if rb.arrival_time < ra.arrival_time else ra
    q = a or b
    return q.peek_request() if q else None


class AdmissionProfile:
    """What one scheduler's release offers, read once (:meth:`of`); the per-step
    :func:`head_blocked_by` only reads the attributes named here.

    Detection is by attribute; ``version`` (``"0.32.0"``) is used only for behaviour no
    attribute reveals: 0.24's throttle defers only fresh requests, stale in-flight
    output exists from 0.27, ``PAUSED_NEW`` drains ``kv_holding_waiting`` from 0.32.
    Raises whatever reading an unexpected layout raises (:meth:`of` catches it).
    """

    def __init__(self, sched: Any, version: str) -> None:
        v = parse_version(version)
        sc = sched.scheduler_config
        if (hasattr(sched, "async_kv_waiting") and getattr(sc, "max_num_inflight_kv_loads", None)
                and getattr(sched, "connector", None) is not None):
            # only then does vLLM park requests there (Scheduler._enqueue_waiting_request)
            self.head: Callable[[Any], Any] = _head_async_kv
        elif hasattr(sched, "kv_holding_waiting"):
            queues = (sched.kv_holding_waiting, sched.waiting)
            self.head = _head_kv_holding
            if all(isinstance(q, deque) for q in queues):
                self.head = _head_kv_holding_deque
        elif hasattr(sched, "skipped_waiting"):
            policy = getattr(getattr(sched, "policy", None), "name", "FCFS")
            self.head = _head_skipped_priority if policy == "PRIORITY" else _head_skipped_fcfs
            if self.head is _head_skipped_fcfs and all(isinstance(q, deque) for q in (sched.skipped_waiting,
                                                                                      sched.waiting)):
                self.head = _head_skipped_fcfs_deque
        else:
            self.head = _head_single_deque if isinstance(sched.waiting, deque) else _head_single
        self.budget: int = getattr(sched, "max_num_scheduled_tokens", None) or sc.max_num_batched_tokens
        # 0.28+: spec decode reserves draft slots per request out of max_num_batched_tokens
        self.input_budget = sc.max_num_batched_tokens if hasattr(sched, "num_prefill_lookahead") else None
        spec = getattr(sched.vllm_config, "speculative_config", None)
        self.draft_slots = (getattr(spec, "max_num_new_slots_for_drafting", 0) or 0) if spec else 0
        self.cap_attr = "max_num_active_reqs" if hasattr(sched, "max_num_active_reqs") else "max_num_running_reqs"
        getattr(sched, self.cap_attr)  # fail here, not per step, on an unknown layout
        self.has_streaming = hasattr(sched, "num_waiting_for_streaming_input") and v >= (0, 25)
        from vllm.v1.request import RequestStatus

        # enum members resolved once: Enum.name is a property, slow on the hot path
        self.blocked = frozenset(m for m in RequestStatus if m.name in _BLOCKED_STATUSES)
        self.st_remote = getattr(RequestStatus, "WAITING_FOR_REMOTE_KVS", None)
        self.st_stream = getattr(RequestStatus, "WAITING_FOR_STREAMING_REQ", None)
        self.has_pause = hasattr(sched, "_pause_state")
        self.unpaused = self.paused_all = None
        if self.has_pause:
            states = type(sched._pause_state)
            self.unpaused, self.paused_all = states.UNPAUSED, states.PAUSED_ALL
        self.paused_new_drains_kv = v >= (0, 32)
        self.has_stale = v >= (0, 27)
        try:
            from vllm.v1.core.sched.async_scheduler import AsyncScheduler

            self.is_async = isinstance(sched, AsyncScheduler)
        except ImportError:
            self.is_async = bool(getattr(sc, "async_scheduling", False))
        self.has_throttle = hasattr(sched, "prefill_capacity_bound")
        self.throttle_fresh_only = v < (0, 25)
        self.has_cadence = hasattr(sched, "local_prefill_interval")
        self.chunked = bool(getattr(sc, "enable_chunked_prefill", True))
        groups = sched.kv_cache_config.kv_cache_groups
        self.single_group = len(groups) == 1
        self.block_size = groups[0].kv_cache_spec.block_size if groups else sched.block_size
        self.full_isl = bool(getattr(sched, "scheduler_reserve_full_isl", False))
        self.watermark = getattr(sched.kv_cache_manager, "watermark_blocks", 0) or 0
        self.lookahead = getattr(sched, "num_lookahead_tokens", 0) or 0
        self.max_model_len = sched.max_model_len
        # models whose waiting loop can stop on a budget-like limit that is not the budget
        self.budget_like = bool(
            getattr(sched, "need_mamba_block_aligned_split", False)
            or getattr(sched, "num_spec_tokens", 0)
            or getattr(sched, "num_prefill_lookahead", 0)
            or getattr(sched, "max_num_encoder_input_tokens", 0)
        )
        self.lora = getattr(sched, "lora_config", None) is not None
        self.connector = (getattr(sched, "connector", None) is not None
                          or getattr(sched, "ec_connector", None) is not None)
        self.deferred_set = getattr(sched, "deferred_waiting", None) is not None
        self.skipped_queue = hasattr(sched, "skipped_waiting")

    @classmethod
    def of(cls, sched: Any, version: str) -> AdmissionProfile | None:
        """The profile of ``sched``, or None when its layout cannot be read (then the
        step events carry no ``head_blocked_by``). Never raises."""
        try:
            return cls(sched, version)
        except Exception:
            return None


def _self_blocked(s: Any, p: AdmissionProfile, h: Any) -> bool:
    """Whether vLLM would skip the head if it looked at it now (read-only mirror of the
    skip checks that need no per-step state of ``schedule()``)."""
    st = h.status
    if st in p.blocked:
        if st is p.st_remote:
            return h.request_id not in s.finished_recving_kv_req_ids
        if st is p.st_stream:
            return True
        so = h.structured_output_request  # grammar still compiling (or failed)
        grammar = so.grammar if so is not None else None
        return grammar is None or isinstance(grammar, Exception)
    return bool(p.has_stale and getattr(h, "num_stale_output_tokens", 0) and not h.drop_stale_output)


def _prefills_deferred(s: Any, p: AdmissionProfile, out: Any, throttle: bool) -> bool:
    """Whether this step ran with vLLM's ``defer_prefills`` (read after the call:
    ``prefill_capacity_bound`` is rewritten only on steps that did not defer)."""
    if not s.running:  # vLLM: ... and any(not r.is_prefill_chunk for r in self.running)
        return False
    if p.has_throttle and throttle and not s.prefill_capacity_bound:
        return True
    if p.has_cadence and s.local_prefill_interval > 1 and not s.prefill_capacity_bound:
        ran = out.total_num_scheduled_tokens > 0
        if ran and s.last_prefill_step == s.num_executed_steps:
            return False  # this step carried prefill: the cadence did not hold it
        executed_before = s.num_executed_steps - (1 if ran else 0)
        return bool((executed_before + 1) - s.last_prefill_step < s.local_prefill_interval)
    return False


def _blocks_surely_fit(s: Any, p: AdmissionProfile, h: Any, token_left: int) -> bool:
    """An upper bound of the blocks ``allocate_slots`` needs for the head fits the free
    blocks (prefix-cache hits only lower the need, so no lookup is done)."""
    if not p.single_group:
        return False
    total = min(h.num_tokens, p.max_model_len)
    need = total - h.num_computed_tokens
    if not p.full_isl:
        need = min(need, token_left)
    upper = _cdiv(need + p.lookahead, p.block_size) + 2  # +1 rounding, +1 copy-on-write block
    free = s.kv_cache_manager.block_pool.get_num_free_blocks()
    if s.running:
        free -= p.watermark
    return bool(free >= upper)


def head_blocked_by(p: AdmissionProfile, s: Any, out: Any, preempted: Any,
                    throttle_prefills: bool = False) -> str | None:
    """One of :data:`REASONS`, or None when nothing waits.

    Args:
        p: the scheduler's :class:`AdmissionProfile`.
        s: the ``Scheduler`` whose ``schedule()`` just returned ``out``.
        out: that ``SchedulerOutput``.
        preempted: the requests ``_preempt_request`` saw during this ``schedule()`` call
            (not ``out.preempted_req_ids``: from 0.27 it also holds preemptions made by
            ``reset_prefix_cache()`` outside a step).
        throttle_prefills: the argument ``schedule()`` was called with (0.24+).

    Raises whatever an unexpected layout raises (the step hook switches the field off
    for that scheduler at the first exception).
    """
    h = p.head(s)
    if h is None:
        return None
    if preempted:
        return "preemption"
    if p.has_pause:
        st = s._pause_state
        if st is not p.unpaused and (st is p.paused_all or not p.paused_new_drains_kv
                                     or not s.kv_holding_waiting):
            return "deferred"
    if _self_blocked(s, p, h):
        return "deferred"
    total = out.total_num_scheduled_tokens
    token_left = p.budget - total
    if token_left <= 0:
        return "token_budget"
    n_sched = len(out.num_scheduled_tokens)
    if (p.input_budget is not None and p.draft_slots
            and p.input_budget - total - p.draft_slots * n_sched <= p.draft_slots):
        return "token_budget"
    n_running = len(s.running)
    slots = n_running + (s.num_waiting_for_streaming_input if p.has_streaming else 0)
    cap = getattr(s, p.cap_attr)
    if slots >= cap:
        if p.is_async:
            idle = n_running - n_sched  # running but not scheduled: last token in flight
            if idle > 0 and slots - idle < cap:
                return "deferred"
        return "max_num_seqs"
    # vLLM looked at the head and stopped on it (or skipped it for a reason not visible)
    if (p.has_throttle or p.has_cadence) and _prefills_deferred(s, p, out, throttle_prefills):
        if p.throttle_fresh_only:
            held = h.num_computed_tokens == 0
        else:
            held = h.num_computed_tokens < h.num_tokens - 1
        if held:
            return "prefill_limit"
    if not p.chunked and h.num_tokens - h.num_computed_tokens > token_left:
        return "token_budget"
    if p.lora and getattr(h, "lora_request", None) is not None:
        # rare branch: only when the head carries a LoRA and nothing above explains it
        loras = {r.lora_request.lora_int_id for rid in out.num_scheduled_tokens
                 if (r := s.requests.get(rid)) is not None and r.lora_request}
        if len(loras) >= s.lora_config.max_loras and h.lora_request.lora_int_id not in loras:
            return "deferred"
    if p.connector:
        # a connector "cannot tell yet" is not visible; the head skipped before is the hint
        if p.deferred_set and h in s.deferred_waiting:
            return "deferred"
        if p.skipped_queue and s.skipped_waiting and s.skipped_waiting.peek_request() is h:
            return "deferred"
    if p.budget_like and _blocks_surely_fit(s, p, h, token_left):
        return "token_budget"
    return "kv_cache"

