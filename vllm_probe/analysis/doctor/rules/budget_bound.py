"""``budget-bound``: the token budget held the run back (info: a busy engine).

The step's token budget (``max_num_batched_tokens``) is spent before the waiting queue is
reached. Which limit held an engine core back is chosen once for the three limit rules
(:mod:`..limits`).
"""

from __future__ import annotations

from ...figures import Distribution, budget_use_counts
from ..context import SRC_VLLM_CHUNKED, Context, rounded
from ...text import fmt_count, fmt_pct
from ..findings import INFO, Finding, Remedy, basis_of
from ..knobs import KNOB_BUDGET_UP
from ..limits import BOUND_THRESHOLDS, BoundBasis, BoundEvidence, binding, bound_goal, bound_step, view_bound
from ..rule import Rule


def evaluate(ctx: Context) -> list[Finding]:
    """The engine cores whose waits a used-up token budget held most."""
    out = []
    for b in binding(ctx, "budget-bound"):
        eng, agg, evidence = b.basis.eng, b.basis.limit, b.evidence
        cfg = eng.config
        use = Distribution.of_counts(budget_use_counts([eng.step_tokens]))
        evidence.budget_use_median = rounded(use.median)
        msg = (f"The token budget held the run back: {b.held} with the budget of "
               f"{fmt_count(cfg.max_num_batched_tokens)} tokens used up (median step {fmt_pct(use.median or 0)} of "
               f"it); up to {agg.waiting_max} waited")
        out.append(Finding("budget-bound", INFO, msg, evidence, basis=b.basis))
    return out


def arithmetic(ctx: Context, f: Finding) -> Remedy | None:
    """Twice the budget."""
    eng = basis_of(f, BoundBasis).eng
    cfg = eng.config
    want = cfg.max_num_batched_tokens * 2
    return Remedy(
        "max_num_batched_tokens", want,
        f"twice the budget ({fmt_count(cfg.max_num_batched_tokens)} × 2): each step prefills twice as many waiting "
        f"prompt tokens", "larger steps: running decodes wait longer per token (inter-token latency)",
        SRC_VLLM_CHUNKED, whatif={"max_num_batched_tokens": want})


RULE = Rule(
    "budget-bound",
    "The step's token budget (max_num_batched_tokens) is spent before the waiting queue is "
    "reached (vLLM 0.32 scheduler.py:659 and :912, both loops run `while token_budget > 0`): a "
    "busy engine.",
    evaluate,
    BoundEvidence,
    BOUND_THRESHOLDS,
    goal=bound_goal,
    knobs=(KNOB_BUDGET_UP,),
    arithmetic=arithmetic, view=view_bound, step=bound_step, severity=(INFO,),
    wait="explains")
