"""Every predicted second with its interval, built from what the recording itself shows.

A replay prices each step with one step-time model at the recording's average speed
(:mod:`vllm_probe.sim.plan`); a real run of the same settings runs at whatever speed the
machine has then. The interval of a figure in seconds (or tokens per second) says how far
that can move it, from three things the recording measures:

* **speed** — the machine's speed over the recording (:func:`vllm_probe.sim.stepmodel.drift_factors`:
  measured / predicted time of each tenth of the run). The baseline is replayed twice more,
  every step priced at the slowest and at the fastest tenth's factor (:func:`measure_spread`:
  two replays per recording, not per setting); each figure's ratio there to its value at one
  speed is its response to the machine's speed, queueing included (a queue grows faster than
  the step time), and every setting's figure is widened by those ratios;
* **model** — how far the recorded figure lies outside the baseline's speed range: what the
  step-time model misses at the recorded settings, beyond the machine's speed, widens every
  interval of that figure by that share, both ways;
* **region** — the share of a replay's predicted seconds that comes from beyond the region
  the step-time model was fitted on (:attr:`vllm_probe.sim.stepmodel.StepTimeModel.extrapolated_share`),
  above the baseline's, widens that replay's intervals by that share, both ways.

Counts (steps, preemptions, tokens) do not depend on the step time's scale at one speed and
carry no interval. A comparison states a direction only when the two intervals separate
(:func:`direction`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..analysis.objectives import OBJECTIVES

#: The figures that carry an interval: the summary's seconds and throughput.
TIMED: tuple[str, ...] = tuple(n for n, o in OBJECTIVES.items() if o.unit in ("s", "tokens/s") and o.summary_path)
#: A speed range narrower than this (±1 %) is not replayed: the intervals are the model's
#: and the region's alone.
MIN_SPEED_SPREAD = 0.01
#: The model term is capped here (±50 %): beyond it the baseline is off and says so.
MAX_MODEL_SHARE = 0.5


@dataclass(frozen=True)
class Interval:
    """A predicted figure's range.

    Attributes:
        lo: the low end (the figure's unit).
        hi: the high end.
        source: what it is made of, one line (``--json``'s ``from``).
    """

    lo: float
    hi: float
    source: str

    def to_dict(self) -> dict[str, Any]:
        """``{"lo", "hi", "from"}``."""
        return {"lo": self.lo, "hi": self.hi, "from": self.source}

    def separates(self, other: Interval) -> bool:
        """Whether the two ranges do not overlap."""
        return self.hi < other.lo or other.hi < self.lo


@dataclass
class Spread:
    """What widens the intervals of one recording's replays (:func:`measure_spread`).

    Attributes:
        speed: ``(slowest, fastest)`` speed factors of the recording's tenths (time
            multipliers: 1.2 is 20 % slower than the average).
        response: per figure, ``(value at the slowest / at one speed, value at the fastest /
            at one speed)`` of the baseline.
        model: per figure, the share by which the recorded value lies outside the baseline's
            speed range (0: inside).
        baseline_extrapolated: the baseline replay's extrapolated share (0..1).
        replays: the replays this cost (0 or 2).
        proportional: the replays at the slowest and fastest speed could not run (the
            doctor's budget ran out): each figure is taken to move with the speed, seconds
            by its factor and throughput by its inverse, queueing's faster growth not seen.
    """

    speed: tuple[float, float] = (1.0, 1.0)
    response: dict[str, tuple[float, float]] = field(default_factory=dict)
    model: dict[str, float] = field(default_factory=dict)
    baseline_extrapolated: float = 0.0
    replays: int = 0
    proportional: bool = False

    def to_dict(self) -> dict[str, Any]:
        """``{"speed": [slowest, fastest], "replays", "model": {figure: share}}``."""
        return {"speed": list(self.speed), "replays": self.replays,
                "model": {k: round(v, 4) for k, v in self.model.items() if v}}

    def interval(self, name: str, value: float | None, extrapolated: float | None = None) -> Interval | None:
        """The interval of figure ``name`` predicted at ``value`` by a replay whose
        extrapolated share is ``extrapolated`` (None: a figure without one, or unknown)."""
        if value is None or name not in TIMED:
            return None
        lo_r, hi_r = self.response.get(name, (1.0, 1.0))
        low, high = min(lo_r, hi_r, 1.0), max(lo_r, hi_r, 1.0)
        m = self.model.get(name, 0.0)
        x = max(0.0, (extrapolated or 0.0) - self.baseline_extrapolated)
        lo = value * low * (1.0 - m) * (1.0 - min(x, 0.9))
        hi = value * high * (1.0 + m) * (1.0 + x)
        parts = []
        if self.replays:
            parts.append(f"speed ×{self.speed[1]:.2f}–{self.speed[0]:.2f} (the recording's tenths"
                         + ("; taken as proportional: its replays did not run)" if self.proportional else ")"))
        if m:
            parts.append(f"model ±{m * 100:.0f} % (the recording beyond the baseline's speed range)")
        if x:
            parts.append(f"region ±{x * 100:.0f} % (seconds beyond the fitted region)")
        return Interval(lo, hi, "; ".join(parts) or "one speed: the recording's steps ran at a steady speed")

    def intervals(self, figures: dict[str, float | None], extrapolated: float | None = None,
                  ) -> dict[str, Interval]:
        """Every timed figure's interval (``figures``: objective names → predicted values)."""
        out = {}
        for name in TIMED:
            iv = self.interval(name, figures.get(name), extrapolated)
            if iv is not None:
                out[name] = iv
        return out


def speed_range(drift: list[tuple[int, float]]) -> tuple[float, float]:
    """``(slowest, fastest)`` time factors of the recording's tenths: the largest and the
    least factor (``(1.0, 1.0)`` without drift factors)."""
    if not drift:
        return (1.0, 1.0)
    factors = [f for _, f in drift]
    return (max(factors), min(factors))


def measure_spread(drift: list[tuple[int, float]], baseline: dict[str, float | None],
                   recorded: dict[str, float | None], baseline_extrapolated: float | None,
                   replay_at: Callable[[float], dict[str, float | None] | None]) -> Spread:
    """The spread of one recording's replays.

    Args:
        drift: the recording's speed factors per tenth (:attr:`vllm_probe.sim.plan.ReplayPlan.drift`).
        baseline: the baseline's figures at one speed (objective names).
        recorded: the recording's figures.
        baseline_extrapolated: the baseline's extrapolated share.
        replay_at: replays the baseline with every step time multiplied by a factor and
            returns its figures (None: it could not run; then :attr:`Spread.proportional`).
    """
    slow, fast = speed_range(drift)
    spread = Spread((slow, fast), baseline_extrapolated=baseline_extrapolated or 0.0)
    if slow - fast > MIN_SPEED_SPREAD:
        at_slow, at_fast = replay_at(slow), replay_at(fast)
        spread.replays = 2
        if at_slow is not None and at_fast is not None:
            for name in TIMED:
                v = baseline.get(name)
                a, b = at_slow.get(name), at_fast.get(name)
                if v and a is not None and b is not None:
                    spread.response[name] = (a / v, b / v)
        else:  # not the machine's steady speed: a figure moves at least as its step times do
            spread.proportional = True
            for name in TIMED:
                per_s = OBJECTIVES[name].unit == "tokens/s"
                spread.response[name] = (1 / slow, 1 / fast) if per_s else (slow, fast)
    for name in TIMED:
        v, r = baseline.get(name), recorded.get(name)
        if not v or r is None:
            continue
        lo_r, hi_r = spread.response.get(name, (1.0, 1.0))
        lo, hi = v * min(lo_r, hi_r, 1.0), v * max(lo_r, hi_r, 1.0)
        beyond = (lo - r) / v if r < lo else (r - hi) / v if r > hi else 0.0
        spread.model[name] = min(beyond, MAX_MODEL_SHARE)
    return spread


#: Directions of a compared figure.
BETTER, WORSE, UNCHANGED, UNCLEAR = "better", "worse", "unchanged", "unclear"


def direction(name: str, base: float | None, value: float | None, base_iv: Interval | None = None,
              value_iv: Interval | None = None) -> str:
    """How ``value`` compares with ``base`` for figure ``name``: ``unchanged`` when equal;
    for a figure with intervals, ``better``/``worse`` only when the intervals separate, else
    ``unclear``; counts by their exact values."""
    if base is None or value is None:
        return UNCLEAR
    if value == base:
        return UNCHANGED
    if base_iv is not None and value_iv is not None and not base_iv.separates(value_iv):
        return UNCLEAR
    lower_better = OBJECTIVES[name].better == "lower" if name in OBJECTIVES else True
    return BETTER if (value < base) == lower_better else WORSE


__all__ = ["BETTER", "TIMED", "UNCHANGED", "UNCLEAR", "WORSE", "Interval", "Spread", "direction", "measure_spread",
           "speed_range"]
