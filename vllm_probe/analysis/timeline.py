"""The whole run, step by step, in bounded memory: a timeline of spans of equal width.

The state's rolling window keeps the last few hundred steps (the live chart); a finished
run's story needs all of them: the overview chart of a finished run, and the step
ranges the doctor's findings cite as evidence. :class:`Timeline` keeps at most
``max_spans`` spans, each aggregating a run of consecutive steps; when it is full,
neighbouring spans merge and the width doubles. Memory is O(``max_spans``) however long
the run; each step costs O(1) (amortised: a merge touches every span once per doubling).

Beside the spans it keeps, exactly, the runs of consecutive steps that a finished run's
notable moments and the doctor's findings cite: **stalls** (steps that scheduled nothing
while requests waited) and **prefill blocks** (steps whose full token budget went to
prefill while requests waited), the longest :data:`TOP_RUNS` of each.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Iterator

#: Spans kept per engine core (a finished run's chart has at most this many columns).
MAX_SPANS = 512
#: Longest stalls and prefill blocks kept per engine core (reports show fewer).
TOP_RUNS = 8
#: A step's budget counts as full from this share of it (tokens scheduled / token budget).
#: Measured here: vLLM leaves the last few tokens of a budget unused when no chunk fits
#: them; full steps of the CPU engine scheduled 99.6-100 % of it.
FULL_BUDGET_SHARE = 0.95
#: A full step is a prefill step when prefill tokens are at least this share of it.
PREFILL_STEP_SHARE = 0.9


@dataclass(slots=True)
class StepRun:
    """Consecutive steps of one engine core sharing a condition (a stall, a prefill block).

    ``first_step``/``last_step``: inclusive; ``waiting_max``: the longest waiting queue
    seen in them (requests); ``reasons``: steps per ``head_blocked_by`` reason (stalls);
    ``head``/``head_prompt_len``: the request most likely at the head of the waiting
    queue when the run began (set by :class:`~vllm_probe.analysis.episodes.Episodes`,
    which knows the requests; None when unknown).
    """

    first_step: int
    last_step: int
    steps: int = 1
    waiting_max: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    head: str | None = None
    head_prompt_len: int | None = None


class Ranked:
    """The ``k`` largest items by key (ties: the earlier offered stays), with a heap."""

    def __init__(self, k: int = TOP_RUNS) -> None:
        self.k = k
        self._heap: list[tuple[Any, int, Any]] = []
        self._n = 0

    def offer(self, key: Any, item: Any) -> None:
        self._n += 1
        entry = (key, -self._n, item)
        if len(self._heap) < self.k:
            heapq.heappush(self._heap, entry)
        elif entry > self._heap[0]:
            heapq.heapreplace(self._heap, entry)

    def would_enter(self, key: Any) -> bool:
        return len(self._heap) < self.k or key > self._heap[0][0]

    def items(self) -> list[Any]:
        """Largest first."""
        return [item for _, _, item in sorted(self._heap, reverse=True)]


class StepRuns:
    """The longest runs of one kind (:class:`Ranked` by length, earliest first on ties),
    the one still open at the last step, the first one, and the steps in all of them."""

    def __init__(self) -> None:
        self.kept = Ranked()
        self.open: StepRun | None = None
        self.first: StepRun | None = None
        self.steps = 0

    def extend(self, step: int, waiting: int) -> StepRun:
        """``step`` belongs to a run: continue the open one, or start one."""
        run = self.open
        self.steps += 1
        if run is not None and run.last_step == step - 1:
            run.last_step = step
            run.steps += 1
            if waiting > run.waiting_max:
                run.waiting_max = waiting
            return run
        if run is not None:
            self.kept.offer((run.steps, -run.first_step), run)
        run = self.open = StepRun(step, step, 1, waiting)
        if self.first is None:
            self.first = run
        return run

    def close(self) -> None:
        run = self.open
        if run is not None:
            self.kept.offer((run.steps, -run.first_step), run)
            self.open = None

    def all(self) -> list[StepRun]:
        """The kept runs and the open one, longest first (then earliest)."""
        runs = self.kept.items()
        if self.open is not None:
            runs.append(self.open)
        return sorted(runs, key=lambda r: (-r.steps, r.first_step))


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
    #: steps by ``step.head_blocked_by`` (why the head of the waiting queue was not admitted)
    head_blocked: dict[str, int] = field(default_factory=dict)

    @property
    def running_mean(self) -> float:
        return self.running_sum / self.steps if self.steps else 0.0

    @property
    def waiting_mean(self) -> float:
        return self.waiting_sum / self.steps if self.steps else 0.0

    @property
    def kv_mean(self) -> float:
        return self.kv_sum / self.steps if self.steps else 0.0

    def merge(self, other: Span) -> None:
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
        for k, n in other.head_blocked.items():
            self.head_blocked[k] = self.head_blocked.get(k, 0) + n


#: The engine core's cumulative per-step sums (attributes of
#: :class:`~vllm_probe.analysis.engine_state.EngineState`) and the :class:`Span` field each
#: one's difference fills.
SUMS = (("steps", "steps"), ("scheduled_tokens", "scheduled"), ("budget_total", "budget"),
        ("prefill_tokens", "prefill"), ("decode_tokens", "decode"), ("running_total", "running_sum"),
        ("waiting_total", "waiting_sum"), ("kv_total", "kv_sum"), ("step_preemptions", "preemptions"),
        ("idle_waiting_steps", "idle_waiting"))
_SUM_ATTRS = tuple(a for a, _ in SUMS)


class Timeline:
    """Every step of one engine core in at most ``max_spans`` spans of ``width`` steps.

    The engine core's state already keeps cumulative sums per step (tokens, queue lengths,
    KV use, steps per limit and per ``head_blocked_by`` reason: :data:`SUMS`); a span is
    the difference of those sums between its first step and the next span's, so the
    per-step cost is the maxima of the open span and the stall / prefill-block runs.
    :class:`~vllm_probe.analysis.state.RunState` feeds it, in this order, for each step
    before counting it: :meth:`open_span` when :attr:`left` is 0, then ``left -= 1``; and
    after counting it, the maxima (``running_max``, ``waiting_max``, ``kv_max``) and
    :meth:`runs` when requests wait or a run is open (:attr:`runs_open`).

    Args:
        totals: the engine core's state (its :data:`SUMS`, ``bound_counts``,
            ``head_blocked_counts``, ``last_step`` and ``last_step_ts``).
        max_spans: spans kept (>= 2); the width doubles whenever they would be exceeded.
    """

    def __init__(self, totals: Any, max_spans: int = MAX_SPANS) -> None:
        self.totals = totals
        self.max_spans = max(max_spans, 2)
        self.width = 1  # steps per span
        self.closed: list[Span] = []
        #: steps the open span still takes (0: the next step opens a span)
        self.left = 0
        #: the open span's maxima so far (requests, requests, KV use 0..1)
        self.running_max = self.waiting_max = 0
        self.kv_max = 0.0
        #: first step, its ts, the sums and counts before it
        self._open: tuple[int, float, tuple[Any, ...], dict[str, int], dict[str, int]] | None = None
        #: steps that scheduled nothing while requests waited
        self.stalls = StepRuns()
        #: steps whose full budget went to prefill while requests waited
        self.prefill_blocks = StepRuns()
        self.runs_open = False  # a stall or a prefill block is open

    def open_span(self, step: int, ts: float) -> None:
        """Close the open span at the last step counted and open one at ``step``
        (before ``step`` is counted in the sums)."""
        t = self.totals
        if self._open is not None:
            self.closed.append(self._span(t.last_step, t.last_step_ts))
            if len(self.closed) == self.max_spans:
                self._halve()
        self._open = (step, ts, tuple(getattr(t, a) for a in _SUM_ATTRS), dict(t.bound_counts),
                      dict(t.head_blocked_counts))
        self.left = self.width
        self.running_max = self.waiting_max = 0
        self.kv_max = 0.0

    def peaks(self, running: int, waiting: int, kv: float) -> None:
        """Keep the open span's maxima: ``running``/``waiting`` in requests, ``kv`` the
        KV-cache usage (0–1) after this step."""
        if running > self.running_max:
            self.running_max = running
        if waiting > self.waiting_max:
            self.waiting_max = waiting
        if kv > self.kv_max:
            self.kv_max = kv

    def runs(self, step: int, scheduled: int, budget: int, prefill: int, waiting: int,
             head_blocked: str | None) -> None:
        """Extend or close the stall and prefill-block runs with one step (its tokens, the
        requests waiting after it, its ``head_blocked_by``)."""
        if waiting:
            if not scheduled:
                run = self.stalls.extend(step, waiting)
                if head_blocked is not None:
                    run.reasons[head_blocked] = run.reasons.get(head_blocked, 0) + 1
                self.prefill_blocks.close()
            else:
                self.stalls.close()
                if budget and scheduled >= FULL_BUDGET_SHARE * budget and prefill >= PREFILL_STEP_SHARE * scheduled:
                    self.prefill_blocks.extend(step, waiting)
                else:
                    self.prefill_blocks.close()
        else:
            self.stalls.close()
            self.prefill_blocks.close()
        self.runs_open = self.stalls.open is not None or self.prefill_blocks.open is not None

    def _span(self, last_step: int, last_ts: float) -> Span:
        """The open span as it stands (the sums now minus the sums at its start)."""
        t = self.totals
        assert self._open is not None, "no open span"  # callers check
        first_step, first_ts, sums, bound, blocked = self._open
        span = Span(first_step, last_step, first_ts, last_ts, running_max=self.running_max,
                    waiting_max=self.waiting_max, kv_max=self.kv_max,
                    bound={k: n - bound.get(k, 0) for k, n in t.bound_counts.items() if n - bound.get(k, 0)},
                    head_blocked={k: n - blocked.get(k, 0) for k, n in t.head_blocked_counts.items()
                                  if n - blocked.get(k, 0)})
        for (attr, name), before in zip(SUMS, sums):
            setattr(span, name, getattr(t, attr) - before)
        return span

    def _halve(self) -> None:
        """Merge neighbouring closed spans: half as many, twice as wide."""
        spans = self.closed
        merged = []
        for i in range(0, len(spans), 2):
            span = spans[i]
            if i + 1 < len(spans):
                span.merge(spans[i + 1])
            merged.append(span)
        self.closed = merged
        self.width *= 2

    @property
    def spans(self) -> list[Span]:
        """The spans, first to last, the open one as it stands."""
        if self._open is None:
            return list(self.closed)
        return self.closed + [self._span(self.totals.last_step, self.totals.last_step_ts)]

    def __iter__(self) -> Iterator[Span]:
        return iter(self.spans)

    def __len__(self) -> int:
        return len(self.closed) + (self._open is not None)
