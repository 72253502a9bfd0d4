"""Typed evidence of the doctor's findings: one :class:`msgspec.Struct` per rule, field by
field, with units.

``doctor --json`` encodes a finding's ``evidence`` with :func:`msgspec.to_builtins`: the
keys are the field names, in this order. Fields with a default (``engine``, and the few a
rule sets only in some cases) are left out while they hold it; every other field is
always written, ``null`` when unknown. docs/doctor.md's evidence reference is generated
from these docstrings (``python -m vllm_probe.analysis.doctor.rules``); a test keeps the
two equal, and another that every field is described.

Step ranges are ``[first, last]``, inclusive step indices of the engine core; request ids
are vLLM's; token counts are tokens; shares are 0..1.
"""

from __future__ import annotations

from typing import Any

import msgspec


class Evidence(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Base of every rule's evidence.

    Attributes:
        engine: data-parallel rank the finding is about; left out when the run has one engine core.
    """

    engine: int | None = None


class BusiestStep(msgspec.Struct):
    """One step with preemptions.

    Attributes:
        step: the step index.
        preempted: request ids preempted in it, in vLLM's order.
    """

    step: int
    preempted: list[str]


class StormEvidence(Evidence, kw_only=True):
    """``preemption-storm``: preemptions frequent or costly.

    Attributes:
        preemptions: preempt events (or, with them off, preemptions in step events).
        requests: distinct requests preempted.
        per_100_steps: preemptions per 100 steps; null with step events off.
        discarded_tokens: computed tokens the preemptions threw away (tokens).
        computed_tokens: tokens the engine computed, every step's prefill and decode (with step events off: the prefill chunks).
        discarded_share: discarded_tokens / computed_tokens (0..1).
        first_step: step of the first preemption.
        busiest_steps: the steps with the most preemptions (up to 3).
        peak_kv_demand_blocks: KV blocks the admitted requests would hold at full length (prompt + max_tokens) at its peak; null when unknown.
        peak_running: requests admitted at that peak.
        usable_kv_blocks: the KV cache's blocks minus the one vLLM reserves.
        readmitted_prefix_hit_tokens: tokens of readmitted requests' re-prefills served from the prefix cache rather than recomputed (vLLM counts them as hits, #25780); null when chunk events are off.
        recomputed_tokens: tokens of readmitted requests' re-prefills that were computed again; null when chunk events are off.
        victim_priorities: under the priority policy, preemptions per victim priority value (vLLM preempts the running request with the largest (priority, arrival)); left out otherwise.
        judged_on_count: true when only preempt events were recorded (step and chunk events off): the storm is judged on its count alone; left out otherwise.
    """

    preemptions: int
    requests: int
    per_100_steps: float | None
    discarded_tokens: int
    computed_tokens: int
    discarded_share: float
    first_step: int | None
    busiest_steps: list[BusiestStep]
    peak_kv_demand_blocks: int | None
    peak_running: int | None
    usable_kv_blocks: int | None
    readmitted_prefix_hit_tokens: int | None = None
    recomputed_tokens: int | None = None
    victim_priorities: dict[str, int] | None = None
    judged_on_count: bool | None = None


class ThrashRequest(msgspec.Struct):
    """One request preempted repeatedly.

    Attributes:
        req_id: the request.
        preemptions: times it was preempted.
        steps: steps of its preemptions (the first 32).
        discarded_tokens: computed tokens its preemptions threw away (tokens).
        prompt_len: its prompt (tokens); null when unknown.
        finished: it finished within the run.
    """

    req_id: str
    preemptions: int
    steps: list[int]
    discarded_tokens: int
    prompt_len: int | None
    finished: bool


class ThrashEvidence(Evidence, kw_only=True):
    """``preemption-thrash``: one request preempted again and again.

    Attributes:
        requests: the requests preempted repeatedly, most preempted first (up to 20).
        repeated_requests: how many requests were preempted repeatedly in all.
        pair: two requests that preempted each other (their preemption steps alternate); left out when none.
        alternations: alternations between the pair's preemption steps; left out when no pair.
    """

    requests: list[ThrashRequest]
    repeated_requests: int
    pair: list[str] | None = None
    alternations: int | None = None


class HolBlocked(msgspec.Struct):
    """A short request that waited behind long prefills.

    Attributes:
        req_id: the request.
        prompt_len: its prompt (tokens).
        waited_steps: steps from arrival to its first chunk.
        steps: the steps it waited, ``[arrival step, first chunk step - 1]``.
        queue_s: its queue time (s).
        ttft_s: its time to first token (s).
        queue_share: queue_s / ttft_s (0..1).
        head_blocked_by: steps per head_blocked_by reason while it waited.
        prefix_hit_tokens: of its prompt, tokens served by the prefix cache (it is short by the tokens left to compute: prompt_len - prefix_hit_tokens).
    """

    req_id: str
    prompt_len: int | None
    waited_steps: int
    steps: list[int]
    queue_s: float | None
    ttft_s: float | None
    queue_share: float | None
    head_blocked_by: dict[str, int]
    prefix_hit_tokens: int = 0


class HolTaker(msgspec.Struct):
    """A long request whose prefill took the budget meanwhile.

    Attributes:
        req_id: the request.
        prompt_len: its prompt (tokens).
        prefill_tokens: prefill tokens it was scheduled while the short requests waited.
        first_chunk_step: step of its first prefill chunk; null when not seen.
    """

    req_id: str
    prompt_len: int | None
    prefill_tokens: int
    first_chunk_step: int | None


class HolEvidence(Evidence, kw_only=True):
    """``head-of-line-blocking``: short requests queue behind long prefills.

    Attributes:
        blocked: the short requests that waited (up to 8).
        takers: the long requests that took the prefill budget meanwhile.
        taken_share: the long requests' share of the prefill tokens scheduled meanwhile (0..1).
        short_requests_blocked: short requests whose time to first token was mostly queue time, in all.
        complete: the chunk ring held every step of the waits (false: takers may be missing).
    """

    blocked: list[HolBlocked]
    takers: list[HolTaker]
    taken_share: float
    short_requests_blocked: int
    complete: bool


class BoundEvidence(Evidence, kw_only=True):
    """``kv-bound``, ``budget-bound``, ``seqs-bound``: which limit held the run back.

    Attributes:
        steps: steps whose head_blocked_by named this limit.
        waiting_steps: steps after which requests waited.
        total_steps: the engine core's steps.
        share_of_waiting_steps: steps / waiting_steps (0..1).
        step_range: the steps where it held most, ``[first, last]``.
        running_max: most requests running in those steps.
        running_mean: mean requests running in those steps.
        waiting_max: most requests waiting in those steps.
        waiting_mean: mean requests waiting in those steps.
        kv_usage_mean: mean KV cache use in those steps (0..1).
        max_num_seqs: the engine's max_num_seqs.
        inferred_from_queues: the run has no head_blocked_by (an older probe): the limit was inferred from the queues.
        vllm_max_concurrency: kv-bound only: vLLM's start-up "Maximum concurrency Nx" (KV capacity / max_model_len); left out when unknown.
        budget_use_median: budget-bound only: the median step's share of the token budget (0..1).
        concurrency_at_run_lengths: kv-bound only: the requests the KV cache holds at once at this run's lengths (usable blocks // the mean blocks at full length, prompt + max_tokens): the "Maximum concurrency" reading that applies to this workload; left out when unknown.
    """

    steps: int
    waiting_steps: int
    total_steps: int
    share_of_waiting_steps: float
    step_range: list[int]
    running_max: int
    running_mean: float
    waiting_max: int
    waiting_mean: float
    kv_usage_mean: float
    max_num_seqs: int | None
    inferred_from_queues: bool
    vllm_max_concurrency: float | None = None
    budget_use_median: float | None = None
    concurrency_at_run_lengths: int | None = None


class StallEvidence(Evidence, kw_only=True):
    """``stall``: steps that scheduled nothing while requests waited.

    Attributes:
        stall_steps: such steps in all.
        first_step: the first of them.
        longest: the longest run of them, ``[first, last]``.
        head_blocked_by: steps per head_blocked_by reason over the stalls.
        head: the request at the head of the queue (the state's guess: a preempted one first, else the oldest).
        head_prompt_len: its prompt (tokens).
        never_drained: the log ends inside a stall of at least STALL_CRITICAL_STEPS steps.
        stalls: the longest stalls, ``[first, last]`` each (up to 5).
    """

    stall_steps: int
    first_step: int | None
    longest: list[int]
    head_blocked_by: dict[str, int]
    head: str | None
    head_prompt_len: int | None
    never_drained: bool
    stalls: list[list[int]]


class HeldSlotsEvidence(Evidence, kw_only=True):
    """``held-slots``: under AsyncScheduler, requests waited while running slots were held by
    requests that had already produced their last token.

    Attributes:
        held_steps: steps after which requests waited with the running queue at max_num_seqs and some of its requests scheduling nothing (their last token in flight).
        waiting_steps: steps of the async engine core after which requests waited.
        share_of_waiting_steps: held_steps / waiting_steps (0..1).
        held_slot_steps: held slots summed over the held steps (slot-steps).
        held_slot_share: held_slot_steps / (max_num_seqs × waiting_steps): the share of the running slots held while requests waited (0..1).
        held_max: most slots held in one step.
        step_range: the first and last held step, ``[first, last]``.
        max_num_seqs: the engine's max_num_seqs.
        running_max: most requests running in a held step.
        waiting_max: most requests waiting after a held step.
        tokens_min: fewest tokens a held step scheduled.
        tokens_max: most tokens a held step scheduled.
        tokens_mean: mean tokens a held step scheduled.
        head_blocked_by: held steps per head_blocked_by reason (``unrecorded``: the run has no such field).
        scheduler_class: the scheduler class engine_config recorded.
    """

    held_steps: int
    waiting_steps: int
    share_of_waiting_steps: float
    held_slot_steps: int
    held_slot_share: float
    held_max: int
    step_range: list[int]
    max_num_seqs: int | None
    running_max: int
    waiting_max: int
    tokens_min: int
    tokens_max: int
    tokens_mean: float
    head_blocked_by: dict[str, int]
    scheduler_class: str | None


class WaitEntry(msgspec.Struct):
    """A request's wait from arrival to its first prefill chunk.

    Attributes:
        req_id: the request.
        waited_steps: steps from arrival to its first chunk (still waiting: so far).
        steps: the steps it waited, ``[arrival step, first chunk step - 1]``.
        admitted: it was admitted within the run (false: still waiting at its end).
        head_blocked_by: steps per head_blocked_by reason while it waited.
    """

    req_id: str
    waited_steps: int
    steps: list[int]
    admitted: bool
    head_blocked_by: dict[str, int]


class UnexplainedWaitEvidence(Evidence, kw_only=True):
    """``unexplained-wait``: requests waited longer than ADMIT_WITHIN_STEPS steps and no rule explains why.

    Attributes:
        admit_within_steps: the threshold ADMIT_WITHIN_STEPS (steps).
        longest_wait_steps: the longest wait (steps).
        requests: the longest waits over the threshold (up to 8).
        head_blocked_by: steps per head_blocked_by reason over those waits.
    """

    admit_within_steps: int
    longest_wait_steps: int
    requests: list[WaitEntry]
    head_blocked_by: dict[str, int]


class RunningRequest(msgspec.Struct):
    """A running request.

    Attributes:
        req_id: the request.
        priority: its priority value (lower runs first).
    """

    req_id: str
    priority: int


class PriorityWaitEntry(msgspec.Struct):
    """A high-priority request that waited for a slot.

    Attributes:
        req_id: the request.
        priority: its priority value (lower runs first).
        steps: the steps it waited, ``[arrival step, first chunk step - 1]``.
        slot_steps: steps of its wait whose head_blocked_by was a full running queue (max_num_seqs or deferred).
        head_blocked_by: steps per head_blocked_by reason while it waited.
        lower_priority_running: running requests of lower priority (larger value) that held slots throughout its wait (up to 4).
    """

    req_id: str
    priority: int
    steps: list[int]
    slot_steps: int
    head_blocked_by: dict[str, int]
    lower_priority_running: list[RunningRequest]


class PrioritySlotWaitEvidence(Evidence, kw_only=True):
    """``priority-slot-wait``: under the priority policy, high-priority requests waited for a running slot held by lower-priority ones.

    Attributes:
        requests: such requests in all.
        waits: the longest of them (up to 8).
        max_num_seqs: the engine's max_num_seqs.
    """

    requests: int
    waits: list[PriorityWaitEntry]
    max_num_seqs: int | None


class ChunkingEvidence(Evidence, kw_only=True):
    """``chunking-without-benefit``: long prompts chunked with nothing decoding beside them.

    Attributes:
        prompts: first prefill passes cut into chunks while nothing decoded alongside.
        extra_steps: steps the chunking added (chunks - 1 per pass).
        share_of_steps: extra_steps / the engine core's steps (0..1).
        reread_kv_tokens: KV tokens later chunks read again (tokens).
        example: the request with the longest such prompt.
        example_prompt_len: its prompt (tokens).
        example_steps: its first and last chunk's steps, ``[first, last]``.
    """

    prompts: int
    extra_steps: int
    share_of_steps: float
    reread_kv_tokens: int
    example: str | None
    example_prompt_len: int
    example_steps: list[int] | None


class SettingDiffers(msgspec.Struct):
    """An expected setting the engine did not run with.

    Attributes:
        setting: the vLLM engine argument.
        expected: the value the file gave.
        effective: the value in engine_config.
    """

    setting: str
    expected: Any
    effective: Any


class NotInV1(msgspec.Struct):
    """An expected setting vLLM V1 does not have.

    Attributes:
        setting: the name the file gave.
        note: what V1 does instead.
    """

    setting: str
    note: str | None


class ConfigEvidence(Evidence, kw_only=True):
    """``config-not-applied``: the file said one thing, the engine ran another.

    Attributes:
        source: the file the expected settings came from.
        differs: the settings that did not take effect.
        not_recorded: expected settings engine_config does not record (not checked).
        not_in_v1: expected settings that are not settings of vLLM V1.
    """

    source: str
    differs: list[SettingDiffers]
    not_recorded: list[str]
    not_in_v1: list[NotInV1]


class UnderloadedEvidence(Evidence, kw_only=True):
    """``underloaded``: the scheduler is not the bottleneck.

    Attributes:
        waiting_steps: steps after which requests waited.
        total_steps: the engine core's steps.
        budget_use_median: the median step's share of the token budget (0..1).
        burst: every request arrived before step BURST_STEPS (an offline burst).
    """

    waiting_steps: int
    total_steps: int
    budget_use_median: float | None
    burst: bool


class NotCheckedEvidence(Evidence, kw_only=True):
    """``not-checked``: what the run's data could not support.

    Attributes:
        rules: rule id (or ``all``, ``head_blocked_by``) -> why it was not checked.
    """

    rules: dict[str, str]


def field_docs(cls: type) -> dict[str, str]:
    """The ``Attributes:`` entries of ``cls``'s docstring (and its bases'), by field name."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        doc = klass.__doc__ or ""
        if "Attributes:" not in doc or klass is msgspec.Struct:
            continue
        name = None
        for raw in doc.split("Attributes:", 1)[1].splitlines():
            line = raw.strip()
            if not line:
                continue
            head, sep, rest = line.partition(": ")
            if sep and head.isidentifier() and raw.startswith(" " * 8) and not raw.startswith(" " * 12):
                name = head
                out[name] = rest.strip()
            elif name is not None:
                out[name] += " " + line
    return out
