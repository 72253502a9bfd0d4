"""The episodes a run's :class:`~vllm_probe.analysis.episodes.Episodes` keeps, as records
the doctor's rules and the views read: a request's wait, a request preempted again and
again, prompts chunked while nothing decoded, held running slots under ``AsyncScheduler``,
a priority request waiting on lower-priority slots."""

from __future__ import annotations

from dataclasses import dataclass, field

@dataclass(slots=True)
class Wait:
    """A request's wait from arrival to its first prefill chunk (steps and seconds).

    ``steps``: steps from the one after its arrival through the one before its first
    chunk (``first_step - arrival_step``); ``reasons``: steps per ``head_blocked_by``
    reason in that range; ``ttft_s``/``queue_s``: its time to first token and queue time
    (s, None until known); ``prompt_len``: tokens.
    """

    req_id: str
    engine: int
    arrival_step: int
    first_step: int
    prompt_len: int | None
    reasons: dict[str, int]
    queue_s: float | None = None
    ttft_s: float | None = None
    ttft_steps: int | None = None
    hit_tokens: int = 0  # of its prompt, served by the prefix cache on its first chunk

    @property
    def to_compute(self) -> int | None:
        """Prompt tokens it had left to compute (prompt minus its prefix-cache hit)."""
        return None if self.prompt_len is None else max(self.prompt_len - self.hit_tokens, 0)

    @property
    def steps(self) -> int:
        return self.first_step - self.arrival_step

    @property
    def queue_share(self) -> float | None:
        """Queue time / time to first token (0..1), None when either is unknown."""
        if self.queue_s is None or not self.ttft_s:
            return None
        return min(self.queue_s / self.ttft_s, 1.0)


@dataclass(slots=True)
class Repeated:
    """A request preempted more than once: its preemptions, their steps (the first
    :data:`~vllm_probe.analysis.episodes.PREEMPT_STEPS_KEEP`), the computed tokens they discarded, its prompt length."""

    req_id: str
    engine: int
    preemptions: int
    steps: list[int]
    discarded_tokens: int
    prompt_len: int | None
    finished: bool


@dataclass(slots=True)
class ChunkedAlone:
    """First prefill passes cut into chunks while nothing decoded alongside (totals)."""

    prompts: int = 0
    extra_steps: int = 0  # chunks - 1 per pass: steps a single-shot prefill would not take
    reread_tokens: int = 0  # KV tokens later chunks read again (figures.chunk_reread_tokens)
    longest_prompt: int = 0  # tokens
    example: str | None = None  # the request with the longest such prompt
    example_steps: tuple[int, int] | None = None  # its first and last chunk's steps
    requests: list[str] = field(default_factory=list)  # the first CHUNKED_ALONE_KEPT of them


#: Requests :class:`ChunkedAlone` names (its counts cover every one).
CHUNKED_ALONE_KEPT = 64


#: head_blocked_by reasons a held slot shows as: the running queue is full
#: (``max_num_seqs``), which the probe reads as ``deferred`` while the slots are held by
#: requests whose last token is in flight (measured: every waiting step reads
#: ``deferred`` on vLLM 0.32).
HELD_REASONS = ("deferred", "max_num_seqs")


@dataclass(slots=True)
class HeldSlots:
    """Steps of an ``AsyncScheduler`` engine core whose running queue held slots for
    requests that had produced their last token.

    vLLM 0.32's ``Scheduler.schedule`` skips a running request whose in-flight tokens
    already reach its ``max_tokens`` (vllm/v1/core/sched/scheduler.py:663-678: async
    scheduling, ``num_output_placeholders``); it leaves ``self.running`` only when that
    step's output is processed (``update_from_output``, :2294-2295), after the next step
    was scheduled. Until then it holds a slot, and the WAITING loop stops at
    ``max_num_seqs`` (:921-924). A step counts when requests waited after it, the running
    queue was at ``max_num_seqs``, the head was blocked by one of :data:`HELD_REASONS`
    (or the run records no reason), and some running requests scheduled nothing
    (``running - prefill_reqs - decode_reqs`` > 0: the held slots). Step-based only, so
    the same mechanism reads the same at any step rate.

    Attributes:
        waiting_steps: steps of the async engine after which requests waited.
        steps: held steps (those that count, above).
        slot_steps: held slots summed over them (slot-steps: the goal figure ``held_slot_steps``).
        held_max: most slots held in one step.
        first_step, last_step: the first and last held step (-1: none).
        running_max, waiting_max: most running / waiting in a held step.
        tokens_min, tokens_max: fewest / most tokens a held step scheduled (the shape:
            0/4,096 on a busy machine, 256/3,840 on a quiet one, measured).
        tokens_sum: tokens the held steps scheduled.
        reasons: held steps per head_blocked_by reason.
    """

    waiting_steps: int = 0
    steps: int = 0
    slot_steps: int = 0
    held_max: int = 0
    first_step: int = -1
    last_step: int = -1
    running_max: int = 0
    waiting_max: int = 0
    tokens_min: int = -1
    tokens_max: int = 0
    tokens_sum: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


#: priority-slot-wait: a request counts when the head was blocked by a full running queue
#: (:data:`HELD_REASONS`) in at least this many steps of its wait.
PRIORITY_WAIT_MIN_STEPS = 3


@dataclass(slots=True)
class PriorityWait:
    """Under the priority policy, a request that waited for a running slot while requests of
    lower priority (a larger priority value) held slots throughout its wait.

    ``slot_steps``: steps of its wait whose head_blocked_by was a full running queue;
    ``lower``: ``(req_id, priority)`` of running requests admitted before it arrived and
    still running when it was admitted (up to 4)."""

    req_id: str
    priority: int
    arrival_step: int
    first_step: int
    slot_steps: int
    reasons: dict[str, int]
    lower: list[tuple[str, int]]
