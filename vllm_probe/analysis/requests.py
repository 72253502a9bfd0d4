"""What is known of one request: its phase, chunks, preemptions and timings.

Part of the one request-lifecycle model (:mod:`vllm_probe.analysis.state` keeps these per
engine core and moves them through their phases). Phases: ``waiting`` → ``prefill`` →
``decode`` → ``finished``, with ``preempted`` (waiting again, its KV gone) possible from
``prefill`` and ``decode``.

Timing definitions (event fields in docs/events.md):

* queue time: arrival (``request_added.arrival_ts``) → ``ts`` of the step that scheduled
  the request's first prefill chunk.
* time to first token (TTFT): arrival → ``ts`` of the first step after the one that
  scheduled the last chunk of its first prefill pass (the token is sampled at the end of
  that step; with async scheduling this is approximate by one step). In steps: the
  number of steps from arrival through the one that ran the last chunk.
* decode time: first token → ``request_finished``; mean inter-token time: decode time /
  (output tokens − 1).
* end-to-end latency: arrival → ``ts`` of ``request_finished`` (what a client waits for
  the whole answer: queue time + prefill + decode, preemptions included).
"""

from __future__ import annotations

from dataclasses import dataclass

WAITING, PREFILL, DECODE, PREEMPTED, FINISHED = "waiting", "prefill", "decode", "preempted", "finished"


@dataclass(slots=True)
class RequestState:
    """What is known of one request. Times are epoch seconds; None until known."""

    req_id: str
    engine: int = 0
    phase: str = WAITING
    prompt_len: int | None = None
    max_tokens: int | None = None
    priority: int | None = None  # ``request_added.priority`` (lower runs first under the priority policy)
    arrival_ts: float | None = None
    arrival_step: int = 0
    first_scheduled_ts: float | None = None
    first_scheduled_step: int | None = None
    first_token_step: int | None = None
    first_token_ts: float | None = None
    finished_ts: float | None = None
    finish_reason: str | None = None
    computed: int = 0  # tokens computed so far (end of the latest chunk)
    prefill_len: int | None = None  # end of the current prefill pass
    chunk_index: int = -1  # index of the latest chunk in the current pass
    last_chunk: tuple[int, int] | None = None  # [start, end) of the latest chunk
    chunks: int = 0  # all chunks, recompute passes included
    first_pass_chunks: int = 0
    passes: int = 0
    preemptions: int = 0
    discarded_tokens: int = 0
    recomputed_tokens: int = 0  # tokens of chunks in resumed passes
    reread_tokens: int = 0  # KV tokens its chunks read again (figures.chunk_reread_tokens)
    prefix_hit_tokens: int = 0  # of the first pass
    output_tokens: int | None = None  # known at preemption and at finish
    pass_end_step: int | None = None  # step of the last chunk of the latest finished prefill pass
    last_preempt_ts: float | None = None  # ts of the latest preemption (epoch s)
    last_preempt_step: int | None = None  # step of the latest preemption
    #: its ``request_added`` is not in the events read (retention removed the segment
    #: holding it, or the request came before the probe): arrival unknown, so every
    #: figure from arrival (queue time, TTFT in s and steps, end-to-end) is None
    before_window: bool = False

    @property
    def queue_time_s(self) -> float | None:
        if self.first_scheduled_ts is None or self.arrival_ts is None:
            return None
        return max(self.first_scheduled_ts - self.arrival_ts, 0.0)

    @property
    def ttft_s(self) -> float | None:
        if self.first_token_ts is None or self.arrival_ts is None:
            return None
        return max(self.first_token_ts - self.arrival_ts, 0.0)

    @property
    def ttft_steps(self) -> int | None:
        if self.first_token_step is None or self.before_window:
            return None
        return self.first_token_step - self.arrival_step + 1

    @property
    def e2e_s(self) -> float | None:
        """End-to-end latency: arrival → finish (s); None until both are known."""
        if self.finished_ts is None or self.arrival_ts is None:
            return None
        return max(self.finished_ts - self.arrival_ts, 0.0)

    @property
    def decode_time_s(self) -> float | None:
        if self.finished_ts is None or self.first_token_ts is None:
            return None
        return max(self.finished_ts - self.first_token_ts, 0.0)

    @property
    def mean_itl_s(self) -> float | None:
        d = self.decode_time_s
        if d is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return d / (self.output_tokens - 1)

    @property
    def waiting_since_ts(self) -> float | None:
        """Since when the request has been waiting to be (re)admitted, epoch s.

        The latest preemption when it has one, else its arrival. Meaningful while the
        phase is ``waiting`` or ``preempted``.
        """
        return self.last_preempt_ts if self.last_preempt_ts is not None else self.arrival_ts

    def estimated_output_tokens(self, current_step: int) -> int | None:
        """Output tokens generated through ``current_step`` (tokens).

        Exact when the phase is ``finished`` or ``preempted`` (from the events). While
        decoding it is an estimate: step events carry counts, not per-request decode
        lists, so it assumes one decode token per step since the prefill pass ended
        (the last chunk's step samples the first token), capped at ``max_tokens``. vLLM
        schedules running decodes before new prefills, so it is exact unless the token
        budget ran out before a decode; then it is an upper bound. None when unknown.
        """
        if self.phase == DECODE and self.pass_end_step is not None:
            base = 0
            if self.prefill_len is not None and self.prompt_len is not None:
                base = max(self.prefill_len - self.prompt_len, 0)
            est = base + 1 + max(current_step - self.pass_end_step, 0)
            return min(est, self.max_tokens) if self.max_tokens else est
        if self.output_tokens is not None:
            return self.output_tokens
        return 0 if self.phase in (WAITING, PREFILL) else None

    def estimated_computed_tokens(self, current_step: int) -> int | None:
        """Tokens whose KV is computed through ``current_step`` (tokens).

        Prefill: the end of the latest chunk (exact). Decode: the end of the prefill
        pass plus one token per step since (estimate, see
        :meth:`estimated_output_tokens`). Preempted or waiting: 0. Finished: None.
        """
        if self.phase == DECODE and self.pass_end_step is not None and self.prefill_len is not None:
            computed = self.prefill_len + max(current_step - self.pass_end_step, 0)
            if self.prompt_len is not None and self.max_tokens:
                computed = min(computed, self.prompt_len + self.max_tokens - 1)
            return computed
        if self.phase == FINISHED:
            return None
        return self.computed
