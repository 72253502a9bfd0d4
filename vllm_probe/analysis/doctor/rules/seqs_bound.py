"""``seqs-bound``: ``max_num_seqs`` held the run back.

The WAITING loop stops when the running requests reach ``max_num_seqs``: requests wait with
the KV cache free. Which limit held an engine core back is chosen once for the three limit
rules (:mod:`..limits`).
"""

from __future__ import annotations

from ..context import SRC_SGLANG, Context
from ...text import fmt_count, fmt_pct
from ..findings import WARNING, Finding, Remedy, basis_of
from ..knobs import KNOB_SEQS_UP
from ..kv import mean_full_blocks, pool_blocks, seqs_cap
from ..limits import BOUND_THRESHOLDS, BoundBasis, BoundEvidence, binding, bound_goal, bound_step, view_bound
from ..rule import Rule


def evaluate(ctx: Context) -> list[Finding]:
    """The engine cores whose waits a full running queue held most."""
    out = []
    for b in binding(ctx, "seqs-bound"):
        agg, cfg = b.basis.limit, b.basis.eng.config
        msg = (f"max_num_seqs held the run back: {b.held} with the running queue full "
               f"({agg.running_max} of {cfg.max_num_seqs}) while up to {agg.waiting_max} waited, KV cache "
               f"{fmt_pct(agg.kv_mean)} used on average")
        out.append(Finding("seqs-bound", WARNING, msg, b.evidence, basis=b.basis))
    return out


def arithmetic(ctx: Context, f: Finding) -> Remedy | None:
    """``max_num_seqs`` up by what the free KV blocks held while the queue was full, never past
    what the cache holds at full length."""
    b = basis_of(f, BoundBasis)
    eng, ep, agg = b.eng, b.ep, b.limit
    cfg = eng.config
    per = mean_full_blocks(ep, cfg)
    seqs = cfg.max_num_seqs or 0
    if per and cfg.num_kv_blocks:
        free = (1 - agg.kv_mean) * (cfg.num_kv_blocks - 1)
        more = int(free // per)
        if more <= 0:
            return None  # the KV cache is as full as the queue: raising it would only move the limit
        add = min(more, agg.waiting_max)
        want = seqs + add
        cap = seqs_cap(eng, ep)
        capped = cap is not None and want > cap
        if cap is not None and capped:
            # never more slots than the cache holds at full length: a storm's remedy lowered
            # max_num_seqs to that, and asking for more would undo it (advice converges)
            want, add = cap, cap - seqs
            if add <= 0:
                return None
        return Remedy(
            "max_num_seqs", want,
            f"{fmt_pct(1 - agg.kv_mean)} of {fmt_count(cfg.num_kv_blocks - 1)} KV blocks ({free:.0f}) free on average "
            f"while the queue was full, {per:.1f} blocks per request at full length → room for {more} more: "
            f"max_num_seqs {seqs} + {add} = {want}"
            + (f" (at most {cap}: the cache holds {cap} of the largest requests, "
               f"{pool_blocks(cfg, ep.full_blocks_max)} blocks each, at full length)" if capped else ""),
            "more requests per step: each decode step takes longer (inter-token latency)", SRC_SGLANG,
            whatif={"max_num_seqs": want})
    want = seqs + agg.waiting_max
    return Remedy("max_num_seqs", want, f"max_num_seqs {seqs} + the {agg.waiting_max} that waited = {want}",
                  "more requests per step: each decode step takes longer; the KV cache may bind next",
                  SRC_SGLANG, whatif={"max_num_seqs": want})


RULE = Rule(
    "seqs-bound",
    "The WAITING loop stops when the running requests reach max_num_seqs (vLLM 0.32 "
    "scheduler.py:921-924: num_running >= self.max_num_active_reqs, which defaults to "
    "max_num_seqs, :129-136): requests wait with the KV cache free.",
    evaluate,
    BoundEvidence,
    BOUND_THRESHOLDS,
    goal=bound_goal,
    knobs=(KNOB_SEQS_UP,),
    arithmetic=arithmetic, view=view_bound, step=bound_step, wait="explains")
