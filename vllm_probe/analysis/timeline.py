"""The whole run, step by step, in bounded memory: a timeline of spans of equal width.

The state's rolling window keeps the last few hundred steps (the live chart); a finished
run's story needs all of them: the overview chart of a finished run, and the step
ranges the doctor's findings cite as evidence. :class:`Timeline` keeps at most
``max_spans`` spans, each aggregating a run of consecutive steps; when it is full,
neighbouring spans merge and the width doubles. Memory is O(``max_spans``) however long
the run; each step costs O(1) (amortised: a merge touches every span once per doubling).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

#: Spans kept per engine core (a finished run's chart has at most this many columns).
MAX_SPANS = 512


@dataclass(slots=True)
class Span:
    """Consecutive steps of one engine core, aggregated. Sums are over the span's steps
    (tokens, requests, preemptions); ``*_max`` the largest value of one step."""

    first_step: int
    last_step: int
    first_ts: float  # ts of the first step, epoch s
    last_ts: float  # ts of the last step, epoch s
    steps: int = 0
    scheduled: int = 0  # tokens
    budget: int = 0  # tokens: sum of the steps' token budgets
    prefill: int = 0  # tokens
    decode: int = 0  # tokens
    running_sum: int = 0  # requests, for the mean
    running_max: int = 0
    waiting_sum: int = 0
    waiting_max: int = 0
    kv_sum: float = 0.0  # KV-cache use 0..1, for the mean
    kv_max: float = 0.0
    preemptions: int = 0  # requests preempted in the span's steps
    idle_waiting: int = 0  # steps that scheduled 0 tokens while requests waited
    bound: dict[str, int] = field(default_factory=dict)  # steps by the limit that held them back

    @property
    def running_mean(self) -> float:
        return self.running_sum / self.steps if self.steps else 0.0

    @property
    def waiting_mean(self) -> float:
        return self.waiting_sum / self.steps if self.steps else 0.0

    @property
    def kv_mean(self) -> float:
        return self.kv_sum / self.steps if self.steps else 0.0

    def merge(self, other: "Span") -> None:
        """Take in the span that follows this one."""
        self.last_step, self.last_ts = other.last_step, other.last_ts
        self.steps += other.steps
        self.scheduled += other.scheduled
        self.budget += other.budget
        self.prefill += other.prefill
        self.decode += other.decode
        self.running_sum += other.running_sum
        self.running_max = max(self.running_max, other.running_max)
        self.waiting_sum += other.waiting_sum
        self.waiting_max = max(self.waiting_max, other.waiting_max)
        self.kv_sum += other.kv_sum
        self.kv_max = max(self.kv_max, other.kv_max)
        self.preemptions += other.preemptions
        self.idle_waiting += other.idle_waiting
        for k, n in other.bound.items():
            self.bound[k] = self.bound.get(k, 0) + n


class Timeline:
    """Every step of one engine core in at most ``max_spans`` spans of ``width`` steps.

    Args:
        max_spans: spans kept (>= 2); the width doubles whenever they would be exceeded.
    """

    def __init__(self, max_spans: int = MAX_SPANS) -> None:
        self.max_spans = max(max_spans, 2)
        self.width = 1  # steps per span
        self.spans: list[Span] = []

    def add(self, step: int, ts: float, scheduled: int, budget: int, prefill: int, decode: int, running: int,
            waiting: int, kv_usage: float, preempted: int, bound: str) -> None:
        """One step (the fields of its ``step`` event, ``preempted`` as a count, and its
        binding limit, :func:`vllm_probe.analysis.figures.bound_by`)."""
        spans = self.spans
        span = spans[-1] if spans else None
        if span is None or span.steps >= self.width:
            if len(spans) == self.max_spans:
                self._halve()
                spans = self.spans
            span = Span(step, step, ts, ts)
            spans.append(span)
        span.last_step, span.last_ts = step, ts
        span.steps += 1
        span.scheduled += scheduled
        span.budget += budget
        span.prefill += prefill
        span.decode += decode
        span.running_sum += running
        if running > span.running_max:
            span.running_max = running
        span.waiting_sum += waiting
        if waiting > span.waiting_max:
            span.waiting_max = waiting
        span.kv_sum += kv_usage
        if kv_usage > span.kv_max:
            span.kv_max = kv_usage
        span.preemptions += preempted
        if waiting and not scheduled:
            span.idle_waiting += 1
        span.bound[bound] = span.bound.get(bound, 0) + 1

    def _halve(self) -> None:
        """Merge neighbouring spans: half as many, twice as wide."""
        spans = self.spans
        merged = []
        for i in range(0, len(spans), 2):
            span = spans[i]
            if i + 1 < len(spans):
                span.merge(spans[i + 1])
            merged.append(span)
        self.spans = merged
        self.width *= 2

    def __iter__(self) -> Iterator[Span]:
        return iter(self.spans)

    def __len__(self) -> int:
        return len(self.spans)
