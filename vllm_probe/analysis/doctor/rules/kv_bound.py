"""``kv-bound``: the KV cache held the run back.

Admission needs the head's whole prompt to fit the free KV blocks (vLLM 0.19+,
``scheduler_reserve_full_isl``), and FCFS admits nobody behind it: requests wait with the
cache nearly full, or with blocks free that the head's prompt exceeds. Which limit held an
engine core back is chosen once for the three limit rules (:mod:`..limits`).
"""

from __future__ import annotations

from ...engine_state import EngineState
from ...episodes import EngineEpisodes
from ..context import SRC_FULL_ISL, SRC_SGLANG, Context, cdiv
from ...text import fmt_count, fmt_pct
from ..findings import WARNING, Finding, Remedy, basis_of
from ..knobs import KNOB_BLOCKS_UP, KNOB_SEQS_DOWN
from ..kv import kv_remedy, mean_full_blocks, memory_advice, memory_cost, per_block_text, vllm_concurrency
from ..limits import (
    BOUND_THRESHOLDS, BoundBasis, BoundEvidence, LimitSteps, binding, bound_goal, bound_step, view_bound,
)
from ..rule import Rule, Threshold

#: KV use above which the cache counts as full (SGLang's guide: token usage > 0.9 is good
#: utilization; below it with requests queued the server is too conservative).
KV_FULL = 0.9


def evaluate(ctx: Context) -> list[Finding]:
    """The engine cores whose waits the KV cache held most, with vLLM's "Maximum concurrency"
    read against the run's own request lengths."""
    out = []
    for b in binding(ctx, "kv-bound"):
        eng, ep, agg, evidence = b.basis.eng, b.basis.ep, b.basis.limit, b.evidence
        cfg = eng.config
        full = agg.kv_mean >= KV_FULL
        why = "" if b.inferred else " because the head of the queue did not fit"
        msg = (f"The KV cache held the run back: {b.held}{why}; running "
               f"plateaued at {agg.running_max} of max_num_seqs {cfg.max_num_seqs} while up to {agg.waiting_max} "
               f"waited, KV cache {fmt_pct(agg.kv_mean)} used on average")
        if not full:
            msg += (f" — admission waits for the whole prompt to fit, so the head waited with "
                    f"{fmt_pct(1 - agg.kv_mean)} of the cache free")
        concurrency = vllm_concurrency(cfg)
        if concurrency is not None:
            evidence.vllm_max_concurrency = round(concurrency, 2)
            per = mean_full_blocks(ep, cfg)
            at_run = int((cfg.num_kv_blocks - 1) // per) if per and cfg.num_kv_blocks else None
            evidence.concurrency_at_run_lengths = at_run
            if agg.running_max > concurrency * 1.5:
                msg += (f"; vLLM's start-up line \"Maximum concurrency {concurrency:.2f}x\" assumes every request "
                        f"fills max_model_len, this run ran {agg.running_max} at once")
                if at_run is not None:
                    msg += (f"; at this run's request lengths (prompt + max_tokens, {per:.1f} blocks each on "
                            f"average) the cache holds {fmt_count(at_run)} request{'s' if at_run != 1 else ''} to "
                            f"the end at once: that is the reading that applies")
        out.append(Finding("kv-bound", WARNING, msg, evidence, basis=b.basis))
    return out


def arithmetic(ctx: Context, f: Finding) -> Remedy | None:
    """Blocks for every request that ran or waited at once, else
    :func:`~vllm_probe.analysis.doctor.kv.kv_remedy`."""
    b = basis_of(f, BoundBasis)
    return _blocks_for_everyone(b.eng, b.ep, b.limit) or kv_remedy(b.eng, b.ep)


def _blocks_for_everyone(eng: EngineState, ep: EngineEpisodes, agg: LimitSteps) -> Remedy | None:
    """Blocks for every request that was running or waiting at once (up to max_num_seqs)."""
    cfg = eng.config
    per = mean_full_blocks(ep, cfg)
    if not per or not cfg.num_kv_blocks:
        return None
    target = min(cfg.max_num_seqs or 1 << 30, agg.running_max + agg.waiting_max, eng.requests_added or 1 << 30)
    need = cdiv(round(target * per * 10), 10) + 1
    if need <= cfg.num_kv_blocks:
        return None
    every = " (all of the run's)" if target == eng.requests_added else ""
    return Remedy(
        "num_kv_blocks", need,
        f"up to {agg.running_max} ran and {agg.waiting_max} waited: {target} requests{every} × {per:.1f} blocks at "
        f"full length (prompt + max_tokens, {per_block_text(cfg)}) + 1 reserved = {fmt_count(need)} "
        f"blocks; the KV cache has {fmt_count(cfg.num_kv_blocks)} → num_kv_blocks {fmt_count(need)} "
        f"({memory_advice(cfg, need)})",
        memory_cost(cfg),
        SRC_SGLANG + "; " + SRC_FULL_ISL, whatif={"num_kv_blocks": need})


RULE = Rule(
    "kv-bound",
    "Admission needs the head's whole prompt to fit the free KV blocks (vLLM 0.32 "
    "scheduler.py:1256-1280, allocate_slots(full_sequence_must_fit=scheduler_reserve_full_isl), "
    "0.19+; the WAITING loop breaks when it fails), and FCFS admits nobody behind it: requests "
    "wait with the cache nearly full, or with blocks free that the head's prompt exceeds.",
    evaluate,
    BoundEvidence,
    (*BOUND_THRESHOLDS,
     Threshold("KV_FULL", KV_FULL, "share of KV blocks", SRC_SGLANG + ": token usage > 0.9 is good utilization")),
    goal=bound_goal,
    knobs=(KNOB_BLOCKS_UP, KNOB_SEQS_DOWN),
    arithmetic=arithmetic, view=view_bound, step=bound_step, wait="explains")
