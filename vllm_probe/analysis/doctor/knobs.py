"""The knobs several rules share: which settings a remedy may change and the values worth
trying, smallest change first, already bounded by what operators run (:data:`BUDGET_MAX_FACTOR`)
and by what the KV cache holds (:func:`~.kv.seqs_cap`). A knob one rule alone uses is in that
rule's file. Names are ``vllm-probe whatif --set`` names (:mod:`vllm_probe.sim.engine_args`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .findings import EngineBasis, Finding
from .kv import seqs_cap
from .rule import Knob

#: A budget remedy stays within this many times the recorded budget: operators run budgets
#: of the same order, and the budget that took every queued prompt at once (~80× the
#: recorded one, measured) is not a setting anyone runs. The one cap: the remedy search
#: (:mod:`vllm_probe.advice.remedies`) and the rules' arithmetic read it here.
BUDGET_MAX_FACTOR = 8


def recorded_int(settings: dict[str, Any], name: str) -> int | None:
    """``settings[name]`` as a positive int (None: not recorded, not a number, or not positive)."""
    v = settings.get(name)
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else None


def scaled(name: str, factors: tuple[float, ...], lo: int = 1,
           hi_factor: float | None = None) -> Callable[[dict[str, Any], Finding], list[int]]:
    """Candidates ``recorded × factor`` (rounded, distinct, in ``factors`` order), at least
    ``lo`` and at most ``hi_factor ×`` the recorded value; none when it is not recorded."""
    def candidates(settings: dict[str, Any], finding: Finding) -> list[int]:
        base = recorded_int(settings, name)
        if base is None:
            return []
        out: list[int] = []
        for k in factors:
            v = max(round(base * k), lo)
            if hi_factor is not None and v > base * hi_factor:
                continue
            if v != base and v not in out:
                out.append(v)
        return out
    return candidates


def seqs_down_candidates(settings: dict[str, Any], finding: Finding) -> list[int]:
    """``max_num_seqs`` below the most requests that really ran at once (× 0.75, 0.5, 0.25,
    0.125, then 2 and 1), not below the configured value: a run whose 3 requests ran under
    ``max_num_seqs`` 64 is not helped by 48 or 32 (measured on the thrash scenario: every
    scaled value of the configured 64 left the storm as it was; 1-2 ended it)."""
    configured = recorded_int(settings, "max_num_seqs")
    eng = finding.basis.eng if isinstance(finding.basis, EngineBasis) else None
    peak = eng.running_max if eng is not None else None
    if peak is None and eng is not None and eng.preempt_seen.running_max is not None:
        peak = eng.preempt_seen.running_max + 1  # step events off: running after a preemption, plus its victim
    base = min(v for v in (configured, peak) if v is not None) if (configured or peak) else None
    if base is None:
        return []
    out: list[int] = []
    for v in [round(base * k) for k in (0.75, 0.5, 0.25, 0.125)] + [2, 1]:
        if 1 <= v < base and (configured is None or v < configured) and v not in out:
            out.append(v)
    return sorted(out, reverse=True)


def seqs_up_candidates(settings: dict[str, Any], finding: Finding) -> list[int]:
    """``max_num_seqs`` × 1.5, 2, 3, 4, never above what the KV cache holds at full length
    (advice converges: a storm's remedy lowered it to that), and that cap itself when it
    lies between the recorded value and a scaled one (a full running queue of 30 under a
    cap of 31 is offered 31, not nothing)."""
    values = scaled("max_num_seqs", (1.5, 2, 3, 4))(settings, finding)
    b = finding.basis
    cap = seqs_cap(b.eng, b.ep) if isinstance(b, EngineBasis) else None
    if cap is None:
        return values
    base = recorded_int(settings, "max_num_seqs") or 0
    kept = [v for v in values if v <= cap]
    if cap > base and cap not in kept and len(kept) < len(values):
        kept.append(cap)  # the most the cache holds: the largest step the rule allows
    return kept


#: ``max_num_seqs`` down from the running peak: fewer requests outgrow the KV cache.
KNOB_SEQS_DOWN = Knob("max_num_seqs", "down", seqs_down_candidates)
#: ``max_num_seqs`` up, within what the KV cache holds at full length.
KNOB_SEQS_UP = Knob("max_num_seqs", "up", seqs_up_candidates)
#: More KV blocks, up to 4× the recorded cache.
KNOB_BLOCKS_UP = Knob("num_kv_blocks", "up", scaled("num_kv_blocks", (1.25, 1.5, 2, 3, 4)))
#: A larger token budget, within :data:`BUDGET_MAX_FACTOR` × the recorded one.
KNOB_BUDGET_UP = Knob("max_num_batched_tokens", "up",
                      scaled("max_num_batched_tokens", (1.5, 2, 4, 8), hi_factor=BUDGET_MAX_FACTOR))
#: Async scheduling off (a finished request's slot frees in the same step).
KNOB_ASYNC_OFF = Knob("async_scheduling", "set", lambda settings, finding: [False])
