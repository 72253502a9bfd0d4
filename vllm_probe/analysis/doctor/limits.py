"""The bound findings — kv-bound, budget-bound, seqs-bound: which limit held the run
back, read from the steps whose ``head_blocked_by`` names it (or, for a run without the
field, the steps :func:`~vllm_probe.analysis.figures.bound_by` attributes to it), and
the KV arithmetic their remedies and the preemption findings share (:func:`kv_remedy`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..engine_state import EngineState
from ..episodes import EngineEpisodes
from ..figures import Distribution, budget_use_counts
from .context import (
    SRC_FULL_ISL, SRC_SGLANG, SRC_VLLM_CHUNKED, SRC_VLLM_PREEMPTION, Context, cdiv, engine_of, engines_of,
    fmt_count, fmt_pct, rounded,
)
from .evidence import BoundEvidence
from .findings import INFO, WARNING, Finding, Remedy

# -- thresholds ----------------------------------------------------------------------------

#: kv-bound / budget-bound / seqs-bound: requests waited after at least this share of the
#: steps (below it the queue is incidental; SGLang's guide: #queue-req 0 frequently means
#: the client, not the server, sets the pace) ...
BOUND_MIN_WAITING_SHARE = 0.2
#: ... and one limit stopped the head in at least this share of those steps.
BOUND_SHARE = 0.5
#: KV use above which the cache counts as full (SGLang's guide: token usage > 0.9 is good
#: utilization; below it with requests queued the server is too conservative).
KV_FULL = 0.9


def kv_remedy(eng: EngineState, ep: EngineEpisodes) -> Remedy | None:
    """Fewer running requests, or more KV blocks, from the KV demand the run reached.

    The demand is the blocks the admitted requests would hold at full length (prompt +
    ``max_tokens``, capped at ``max_model_len``; vLLM admits on the prompt alone, so
    this is what the cache must hold for them to finish without preemption). At its
    peak, ``n`` requests needed ``peak`` blocks: ``max_num_seqs = usable // (peak / n)``
    leads (when it is below the recorded ``max_num_seqs``), ``num_gpu_blocks_override >=
    peak + 1`` (vLLM reserves block 0) is the alternative: more blocks let admission take
    more requests, which outgrow the larger cache in turn (design.md §7: 176 blocks
    needed at the peak, 181 given, still 40 preemptions of 64). When the peak fits
    (prefix-cache sharing, ``max_tokens`` unknown), ``max_num_seqs`` drops to the running
    queue left by the first preemption.
    """
    cfg = eng.config
    if cfg is None or not cfg.num_kv_blocks or not cfg.block_size:
        return None
    usable = cfg.num_kv_blocks - 1
    peak, n = ep.peak_demand_blocks, ep.peak_running
    tradeoff = ("more KV blocks take device memory (gpu_memory_utilization: less headroom for activations); "
                "a lower max_num_seqs caps concurrency and throughput")
    if peak > usable and n:
        per = peak / n
        sizes = [b for b, k in ep.full_blocks_seen.items() if k]
        each = f"{n} × {sizes[0]} blocks" if len(sizes) == 1 else f"{n} requests, {per:.1f} blocks each on average"
        seqs = max(int(usable // per), 1)
        blocks_text = (f"at step {ep.peak_step} the running requests needed {each} at full length (prompt + max_tokens, "
                       f"{cfg.block_size} tokens per block) = {fmt_count(peak)} blocks; the KV cache has {fmt_count(usable)} "
                       f"(+1 reserved) → num_gpu_blocks_override ≥ {fmt_count(peak + 1)} (on a GPU: raise "
                       f"gpu_memory_utilization until vLLM reports that many blocks)")
        if cfg.max_num_seqs and seqs < cfg.max_num_seqs:
            return Remedy(
                "max_num_seqs", seqs,
                f"at step {ep.peak_step} the running requests needed {each} at full length (prompt + max_tokens, "
                f"{cfg.block_size} tokens per block) = {fmt_count(peak)} blocks against {fmt_count(usable)} usable: "
                f"{fmt_count(usable)} // {per:.1f} blocks per request = {seqs} run to the end without preemption → "
                f"max_num_seqs {seqs}",
                tradeoff, SRC_VLLM_PREEMPTION, whatif={"max_num_seqs": seqs},
                alternatives=[{"setting": "num_gpu_blocks_override", "value": peak + 1,
                               "whatif": {"num_kv_blocks": peak + 1},
                               "arithmetic": blocks_text + "; more blocks also let admission take more requests, "
                                             "which can outgrow the cache again (check with --whatif)"}])
        return Remedy(
            "num_gpu_blocks_override", peak + 1, blocks_text,
            tradeoff, SRC_VLLM_PREEMPTION, whatif={"num_kv_blocks": peak + 1})
    if ep.first_preempt is not None:
        step, running = ep.first_preempt
        seqs = max(running, 1)
        return Remedy(
            "max_num_seqs", seqs,
            f"the first preemption (step {step}) left {running} running: that many fit the KV cache of "
            f"{fmt_count(usable)} blocks → max_num_seqs {seqs}",
            tradeoff, SRC_VLLM_PREEMPTION, whatif={"max_num_seqs": seqs})
    return None


#: head_blocked_by reasons that count for each bound finding.
BOUND_REASONS = {"kv-bound": ("kv_cache", "preemption"), "budget-bound": ("token_budget",),
                 "seqs-bound": ("max_num_seqs",)}
#: A run without head_blocked_by: the limit of figures.bound_by that stands in for each.
_BOUND_FALLBACK = {"kv-bound": "kv_cache", "budget-bound": "token_budget", "seqs-bound": "max_num_seqs"}


@dataclass
class LimitSteps:
    """The steps one limit held back, from the timeline: ``steps`` exact (the spans'
    counts); the range, maxima and means over the spans where it held most steps
    (exact per step while the run has at most ``timeline.MAX_SPANS`` steps)."""

    steps: int = 0
    first_step: int = -1
    last_step: int = -1
    running_max: int = 0
    waiting_max: int = 0
    running_mean: float = 0.0
    waiting_mean: float = 0.0
    kv_mean: float = 0.0


def limit_steps(eng: EngineState, reasons: tuple[str, ...], inferred_limit: str | None = None) -> LimitSteps:
    """The steps whose ``head_blocked_by`` is one of ``reasons`` (or, for a run without
    the field, whose :func:`~vllm_probe.analysis.figures.bound_by` is ``inferred_limit``)."""
    m = LimitSteps()
    weight = 0
    run_sum = wait_sum = kv_sum = 0.0
    for sp in eng.timeline:
        n = sp.bound.get(inferred_limit, 0) if inferred_limit else sum(sp.head_blocked.get(r, 0) for r in reasons)
        if not n:
            continue
        m.steps += n
        if n * 2 < sp.steps:
            continue  # another limit held most of this span's steps: its figures are not this one's
        m.first_step = sp.first_step if m.first_step < 0 else m.first_step
        m.last_step = sp.last_step
        m.running_max, m.waiting_max = max(m.running_max, sp.running_max), max(m.waiting_max, sp.waiting_max)
        weight += n
        run_sum += sp.running_mean * n
        wait_sum += sp.waiting_mean * n
        kv_sum += sp.kv_mean * n
    if weight:
        m.running_mean, m.waiting_mean, m.kv_mean = run_sum / weight, wait_sum / weight, kv_sum / weight
    return m


def waiting_steps(eng: EngineState) -> int:
    """Steps after which requests waited: those that carry ``head_blocked_by``; for a
    run without the field, those that ``bound_by`` did not call ``none``."""
    recorded = sum(eng.head_blocked_counts.values())
    return recorded if recorded else eng.steps - eng.bound_counts.get("none", 0)


def bound(ctx: Context) -> list[Finding]:
    """Which limit held the run back: kv-bound, budget-bound or seqs-bound."""
    out = []
    for eng, ep in engines_of(ctx):
        cfg = eng.config
        waited = waiting_steps(eng)
        if cfg is None or not eng.steps or waited < BOUND_MIN_WAITING_SHARE * eng.steps:
            continue
        inferred = not eng.head_blocked_counts
        if inferred:
            ctx.not_checked["head_blocked_by"] = ("this run has no step.head_blocked_by (an older probe): "
                                                  "kv-bound, budget-bound and seqs-bound are inferred from the queues")
            aggs = {fid: limit_steps(eng, (), lim) for fid, lim in _BOUND_FALLBACK.items()}
        else:
            aggs = {fid: limit_steps(eng, reasons) for fid, reasons in BOUND_REASONS.items()}
        fid, agg = max(aggs.items(), key=lambda kv: kv[1].steps)
        share = agg.steps / waited if waited else 0.0
        if not agg.steps or share < BOUND_SHARE:
            continue
        evidence = BoundEvidence(
            engine=engine_of(ctx, eng), steps=agg.steps, waiting_steps=waited, total_steps=eng.steps,
            share_of_waiting_steps=round(share, 4), step_range=[agg.first_step, agg.last_step],
            running_max=agg.running_max, running_mean=round(agg.running_mean, 2), waiting_max=agg.waiting_max,
            waiting_mean=round(agg.waiting_mean, 2), kv_usage_mean=round(agg.kv_mean, 4),
            max_num_seqs=cfg.max_num_seqs, inferred_from_queues=inferred)
        head = (f"in {fmt_count(agg.steps)} of {fmt_count(eng.steps)} steps ({fmt_pct(agg.steps / eng.steps)}) requests waited")
        if fid == "kv-bound":
            full = agg.kv_mean >= KV_FULL
            why = "" if inferred else " because the head of the queue did not fit"
            msg = (f"The KV cache held the run back: {head}{why}; running "
                   f"plateaued at {agg.running_max} of max_num_seqs {cfg.max_num_seqs} while up to {agg.waiting_max} "
                   f"waited, KV cache {fmt_pct(agg.kv_mean)} used on average")
            if not full:
                msg += (f" — admission waits for the whole prompt to fit, so the head waited with "
                        f"{fmt_pct(1 - agg.kv_mean)} of the cache free")
            concurrency = _vllm_concurrency(cfg)
            if concurrency is not None:
                evidence.vllm_max_concurrency = round(concurrency, 2)
                per = _mean_full_blocks(ep)
                at_run = int((cfg.num_kv_blocks - 1) // per) if per and cfg.num_kv_blocks else None
                evidence.concurrency_at_run_lengths = at_run
                if agg.running_max > concurrency * 1.5:
                    msg += (f"; vLLM's start-up line \"Maximum concurrency {concurrency:.2f}x\" assumes every request "
                            f"fills max_model_len, this run ran {agg.running_max} at once")
                    if at_run is not None:
                        msg += (f"; at this run's request lengths (prompt + max_tokens, {per:.1f} blocks each on "
                                f"average) the cache holds {fmt_count(at_run)} request{'s' if at_run != 1 else ''} to "
                                f"the end at once: that is the reading that applies")
            out.append(Finding("kv-bound", WARNING, msg, evidence, basis=(eng, ep, agg)))
        elif fid == "budget-bound":
            use = Distribution.of_counts(budget_use_counts([eng.step_tokens]))
            evidence.budget_use_median = rounded(use.median)
            msg = (f"The token budget held the run back: {head} with the budget of {fmt_count(cfg.max_num_batched_tokens)} "
                   f"tokens used up (median step {fmt_pct(use.median or 0)} of it); up to {agg.waiting_max} waited")
            out.append(Finding("budget-bound", INFO, msg, evidence, basis=(eng, ep, agg)))
        else:
            msg = (f"max_num_seqs held the run back: {head} with the running queue full "
                   f"({agg.running_max} of {cfg.max_num_seqs}) while up to {agg.waiting_max} waited, KV cache "
                   f"{fmt_pct(agg.kv_mean)} used on average")
            out.append(Finding("seqs-bound", WARNING, msg, evidence, basis=(eng, ep, agg)))
    return out


def bound_of(ctx: Context, finding_id: str) -> list[Finding]:
    """The findings of :func:`bound` with id ``finding_id`` (bound runs once per evaluation:
    one limit per engine core)."""
    found = ctx.cache.get("bound")
    if found is None:
        found = ctx.cache["bound"] = bound(ctx)
    return [f for f in found if f.id == finding_id]


def kv_bound_remedy(ctx: Context, f: Finding) -> Remedy | None:
    """Blocks for every request that ran or waited at once, else :func:`kv_remedy`."""
    eng, ep, agg = f.basis
    return _kv_bound_remedy(eng, ep, agg) or kv_remedy(eng, ep)


def budget_remedy(ctx: Context, f: Finding) -> Remedy | None:
    """Twice the budget."""
    eng = f.basis[0]
    cfg = eng.config
    want = cfg.max_num_batched_tokens * 2
    return Remedy(
        "max_num_batched_tokens", want,
        f"twice the budget ({fmt_count(cfg.max_num_batched_tokens)} × 2): each step prefills twice as many waiting "
        f"prompt tokens", "larger steps: running decodes wait longer per token (inter-token latency)",
        SRC_VLLM_CHUNKED, whatif={"max_num_batched_tokens": want})


def seqs_remedy(ctx: Context, f: Finding) -> Remedy | None:
    """max_num_seqs up by what the free KV blocks held while the queue was full."""
    return _seqs_remedy(*f.basis)


def _vllm_concurrency(cfg: Any) -> float | None:
    """vLLM's start-up "Maximum concurrency for N tokens per request: Xx": KV capacity in
    tokens / max_model_len (vllm/v1/core/kv_cache_utils.py)."""
    if cfg.kv_capacity_tokens and cfg.max_model_len:
        return cfg.kv_capacity_tokens / cfg.max_model_len
    return None


def _mean_full_blocks(ep: EngineEpisodes) -> float | None:
    n = sum(ep.full_blocks_seen.values())
    return sum(b * k for b, k in ep.full_blocks_seen.items()) / n if n else None


def _kv_bound_remedy(eng: EngineState, ep: EngineEpisodes, agg: LimitSteps) -> Remedy | None:
    """Blocks for every request that was running or waiting at once (up to max_num_seqs)."""
    cfg = eng.config
    per = _mean_full_blocks(ep)
    if not per or not cfg.num_kv_blocks:
        return None
    target = min(cfg.max_num_seqs or 1 << 30, agg.running_max + agg.waiting_max, eng.requests_added or 1 << 30)
    need = cdiv(int(round(target * per * 10)), 10) + 1
    if need <= cfg.num_kv_blocks:
        return None
    every = " (all of the run's)" if target == eng.requests_added else ""
    return Remedy(
        "num_gpu_blocks_override", need,
        f"up to {agg.running_max} ran and {agg.waiting_max} waited: {target} requests{every} × {per:.1f} blocks at full "
        f"length (prompt + max_tokens, {cfg.block_size} tokens per block) + 1 reserved = {fmt_count(need)} blocks; the KV cache "
        f"has {fmt_count(cfg.num_kv_blocks)} → num_gpu_blocks_override {fmt_count(need)} (on a GPU: raise gpu_memory_utilization "
        f"until vLLM reports that many)",
        "more KV blocks take device memory (gpu_memory_utilization: less headroom for activations)",
        SRC_SGLANG + "; " + SRC_FULL_ISL, whatif={"num_kv_blocks": need})


def _seqs_remedy(eng: EngineState, ep: EngineEpisodes, agg: LimitSteps) -> Remedy | None:
    """max_num_seqs up by what the free KV blocks held while the queue was full."""
    cfg = eng.config
    per = _mean_full_blocks(ep)
    seqs = cfg.max_num_seqs or 0
    if per and cfg.num_kv_blocks:
        free = (1 - agg.kv_mean) * (cfg.num_kv_blocks - 1)
        more = int(free // per)
        if more <= 0:
            return None  # the KV cache is as full as the queue: raising it would only move the limit
        add = min(more, agg.waiting_max)
        want = seqs + add
        cap = max((cfg.num_kv_blocks - 1) // ep.full_blocks_max, 1) if ep.full_blocks_max else None
        capped = cap is not None and want > cap
        if capped:
            # never more slots than the cache holds at full length: a storm's remedy lowered
            # max_num_seqs to that, and asking for more would undo it (advice converges)
            want, add = cap, cap - seqs
            if add <= 0:
                return None
        return Remedy(
            "max_num_seqs", want,
            f"{fmt_pct(1 - agg.kv_mean)} of {fmt_count(cfg.num_kv_blocks - 1)} KV blocks ({free:.0f}) free on average while the "
            f"queue was full, {per:.1f} blocks per request at full length → room for {more} more: max_num_seqs "
            f"{seqs} + {add} = {want}" + (f" (at most {cap}: the cache holds {cap} of the largest requests, "
                                          f"{ep.full_blocks_max} blocks each, at full length)" if capped else ""),
            "more requests per step: each decode step takes longer (inter-token latency)", SRC_SGLANG,
            whatif={"max_num_seqs": want})
    want = seqs + agg.waiting_max
    return Remedy("max_num_seqs", want, f"max_num_seqs {seqs} + the {agg.waiting_max} that waited = {want}",
                  "more requests per step: each decode step takes longer; the KV cache may bind next",
                  SRC_SGLANG, whatif={"max_num_seqs": want})
