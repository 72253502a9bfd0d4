"""Each per-step and per-request figure, defined once.

Every view (dashboard, ``--plain`` lines, summary, compare, the timeline) and every rule
reads its figures from here or from the state built with them
(:mod:`vllm_probe.analysis.state`), so a figure means the same wherever it is shown.
Pure functions of event fields (units as in docs/events.md); no I/O.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from collections.abc import Iterable, Mapping

#: Resolution of the decode-step period histogram (µs; :attr:`~vllm_probe.analysis.
#: engine_state.EngineState.decode_periods`): 0.5 % of a 2 ms decode step.
DECODE_PERIOD_US = 10
DECODE_PERIOD_BUCKETS_PER_S = 1_000_000 // DECODE_PERIOD_US

#: Names of the limits :func:`bound_by` can return, in tie-break order.
LIMITS = ("token_budget", "max_num_seqs", "kv_cache", "none")

#: A histogram ``{value: count}`` of numbers (token counts, seconds).
Counts = Mapping[int, int] | Mapping[float, int]

#: ``preempt`` reasons the probe writes (docs/events.md); any other value counts as
#: :data:`OTHER_REASON`, so a hostile log cannot grow the state or a metric's labels.
PREEMPT_REASONS = ("kv_cache", "reset")
OTHER_REASON = "other"


def budget_use(scheduled: int, budget: int | None) -> float | None:
    """Share of a step's token budget it scheduled (0..1): ``scheduled_tokens /
    token_budget`` of a ``step`` event; None when the budget is unknown or 0."""
    return scheduled / budget if budget else None


def budget_use_counts(step_tokens: Iterable[Mapping[tuple[int, int], int]]) -> dict[float, int]:
    """Histogram ``{budget use 0..1: steps}`` of the state's exact histograms of
    ``(scheduled_tokens, token_budget) -> steps`` (one per engine core; steps with an
    unknown or zero budget left out). Its :meth:`Distribution.of_counts` is the run's
    budget use."""
    use: dict[float, int] = {}
    for hist in step_tokens:
        for (sched, budget), n in hist.items():
            share = budget_use(sched, budget)
            if share is not None:
                use[share] = use.get(share, 0) + n
    return use


def unused_budget(scheduled: int, budget: int | None) -> int:
    """Tokens of a step's budget left unscheduled (tokens, >= 0; 0 when unknown)."""
    return max((budget or 0) - scheduled, 0)


def prefill_share(prefill_tokens: int, decode_tokens: int) -> float | None:
    """Prefill tokens / (prefill + decode) tokens (0..1); None when both are 0."""
    total = prefill_tokens + decode_tokens
    return prefill_tokens / total if total else None


def bound_by(scheduled: int, budget: int | None, running: int, waiting: int, preempted: bool,
             max_num_seqs: int | None) -> str:
    """Which limit held a step back (one of :data:`LIMITS`), from its ``step`` event's
    ``scheduled_tokens``, ``token_budget`` (None: unknown), ``running``, ``waiting``
    (requests), whether it preempted, and the engine's ``max_num_seqs``.

    ``token_budget``: the step used its whole budget. ``max_num_seqs``: requests wait
    while the running queue is full. ``kv_cache``: a preemption happened, or requests
    wait with budget and sequence slots to spare (in vLLM's V1 scheduler,
    ``vllm/v1/core/sched/scheduler.py``, the remaining reason not to admit them is that
    their KV blocks cannot be allocated). ``none``: nothing waits; the workload, not a
    limit, set the batch.
    """
    if budget is not None and scheduled >= budget:
        return "token_budget"
    if waiting and max_num_seqs is not None and running >= max_num_seqs:
        return "max_num_seqs"
    if waiting or preempted:
        return "kv_cache"
    return "none"


def chunk_reread_tokens(chunk_index: int, start: int) -> int:
    """KV tokens a prefill chunk reads again because its prompt was chunked (tokens).

    Chunked prefill's cost: from the second chunk of a pass on, attention reads the KV of
    every earlier position of the pass. Chunk ``k >= 1`` with positions ``[start, end)`` reads
    the ``start`` entries computed before it; a single-shot prefill of the same pass
    reads only the prefix-cache hits of its first chunk, which the chunked pass reads
    too. So the sum over a run is exactly the extra KV reading chunking caused (a
    5,000-token prompt cut 2,048 / 2,048 / 904 re-reads 2,048 + 4,096 = 6,144).
    """
    return start if chunk_index >= 1 else 0


def share(part: float, whole: float | None) -> float | None:
    """``part / whole`` (0..1), e.g. prefix-cache hit tokens of the prompt tokens; None
    when ``whole`` is 0 or unknown."""
    return part / whole if whole else None


def per_second(amount: float, span_s: float | None) -> float | None:
    """``amount`` per second of ``span_s`` (None when the span is unknown or 0)."""
    return amount / span_s if span_s else None


def preempt_reason(reason: str | None) -> str:
    """A ``preempt`` event's ``reason`` as one of :data:`PREEMPT_REASONS`, else
    :data:`OTHER_REASON` (absent or unknown)."""
    return reason if reason in PREEMPT_REASONS else OTHER_REASON


# -- distributions ------------------------------------------------------------------------

#: Upper bounds of the bucketed distributions (:class:`Buckets`) the state and the
#: metrics keep. Seconds of ``schedule()`` per step (10 µs .. 250 ms):
SCHEDULE_S_BOUNDS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25)
#: Seconds of a request's queue time and time to first token: vLLM's own buckets for
#: ``vllm:time_to_first_token_seconds`` (vllm/v1/metrics/loggers.py), so quantiles of
#: both sides line up.
LATENCY_S_BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
#: Tokens scheduled in one step: powers of two, 1 .. 65,536.
STEP_TOKENS_BOUNDS = tuple(float(2 ** i) for i in range(17))
#: Share of a step's token budget it used (0..1).
BUDGET_USE_BOUNDS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
#: Prefill chunks of the pass that produced a prompt's first token.
CHUNKS_PER_PROMPT_BOUNDS = (1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 64.0)


class Buckets:
    """A distribution kept as counts per bucket of fixed upper bounds, plus the sum of
    the values: bounded memory however many values it sees (Prometheus' histogram).

    ``counts[i]`` counts the values ``<= bounds[i]`` and above the previous bound; the
    last count (one more than there are bounds) the values above every bound.
    """

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Iterable[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def add(self, value: float, n: int = 1) -> None:
        """Count ``value`` ``n`` times."""
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n

    @classmethod
    def of_counts(cls, counts: Counts, bounds: Iterable[float]) -> Buckets:
        """Of an exact histogram ``{value: count}`` (as the state keeps some)."""
        b = cls(bounds)
        for value, n in counts.items():
            b.add(value, n)
        return b

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, values <= it)`` per bound, ending with ``(inf, count)``."""
        out, total = [], 0
        for bound, n in zip(self.bounds + (math.inf,), self.counts):
            total += n
            out.append((bound, total))
        return out


def quantile(sorted_values: list[float], q: float) -> float | None:
    """Linear-interpolation quantile of already sorted values (None when empty).

    numpy's default ("linear") method: the median of 1, 2, 3, 4 is 2.5.
    """
    n = len(sorted_values)
    if n == 0:
        return None
    pos = q * (n - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


def _nth_from_counts(items: list[tuple[float, int]], rank: int) -> float:
    """Value at 0-based ``rank`` of the multiset given as sorted ``(value, count)`` pairs."""
    seen = 0
    for value, count in items:
        seen += count
        if rank < seen:
            return value
    return items[-1][0]


def quantile_from_counts(counts: Counts, q: float) -> float | None:
    """:func:`quantile` of a histogram ``{value: count}`` without expanding it."""
    n = sum(counts.values())
    if n == 0:
        return None
    items = sorted(counts.items())
    pos = q * (n - 1)
    lo = math.floor(pos)
    a = _nth_from_counts(items, lo)
    b = _nth_from_counts(items, min(lo + 1, n - 1))
    return a + (b - a) * (pos - lo)


@dataclass
class Distribution:
    """Count, mean, median, p90 and max of a set of values (None when empty); the unit
    is the values' own."""

    n: int = 0
    mean: float | None = None
    median: float | None = None
    p90: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Distribution:
        """Of ``values`` (None values left out)."""
        vals = sorted(v for v in values if v is not None)
        if not vals:
            return cls()
        return cls(len(vals), sum(vals) / len(vals), quantile(vals, 0.5), quantile(vals, 0.9), vals[-1])

    @classmethod
    def of_counts(cls, counts: Counts) -> Distribution:
        """Of a histogram ``{value: count}``."""
        n = sum(counts.values())
        if n == 0:
            return cls()
        return cls(n, sum(v * c for v, c in counts.items()) / n, quantile_from_counts(counts, 0.5),
                   quantile_from_counts(counts, 0.9), max(counts))
