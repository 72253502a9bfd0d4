"""Which limit held an engine core back — the KV cache, the token budget or ``max_num_seqs``
— read from the steps whose ``head_blocked_by`` names it (or, for a run without the field,
the steps :func:`~vllm_probe.analysis.figures.bound_by` attributes to it). One limit per
engine core is named (:func:`binding`); the rules kv-bound, seqs-bound and budget-bound
(each in its own file) say it, with the evidence, goal, step and view they share here.
"""

from __future__ import annotations

from dataclasses import dataclass


from ..engine_state import EngineState
from .context import SRC_SGLANG, Context, engine_of, engines_of, first_of, steps_text
from ..text import fmt_count, fmt_figure, fmt_pct
from .evidence import Evidence
from .findings import EngineBasis, Finding, evidence_of
from .rule import Goal, Threshold

# -- thresholds ----------------------------------------------------------------------------

#: kv-bound / budget-bound / seqs-bound: requests waited after at least this share of the
#: steps (below it the queue is incidental; SGLang's guide: #queue-req 0 frequently means
#: the client, not the server, sets the pace) ...
BOUND_MIN_WAITING_SHARE = 0.2
#: ... and one limit stopped the head in at least this share of those steps.
BOUND_SHARE = 0.5

#: The thresholds the three limit rules (kv-, seqs-, budget-bound) share: one limit per
#: engine core is named, from the same waiting steps.
BOUND_THRESHOLDS = (
    Threshold("BOUND_MIN_WAITING_SHARE", BOUND_MIN_WAITING_SHARE, "share of steps", SRC_SGLANG),
    Threshold("BOUND_SHARE", BOUND_SHARE, "share of waiting steps", "the limit that held most"),
)


class BoundEvidence(Evidence, kw_only=True):
    """``kv-bound``, ``budget-bound``, ``seqs-bound``: which limit held the run back.

    Attributes:
        steps: steps whose head_blocked_by named this limit.
        waiting_steps: steps after which requests waited.
        total_steps: the engine core's steps.
        share_of_waiting_steps: steps / waiting_steps (0..1).
        step_range: the steps where it held most, ``[first, last]``.
        running_max: most requests running in those steps.
        running_mean: mean requests running in those steps.
        waiting_max: most requests waiting in those steps.
        waiting_mean: mean requests waiting in those steps.
        kv_usage_mean: mean KV cache use in those steps (0..1).
        max_num_seqs: the engine's max_num_seqs.
        inferred_from_queues: the run has no head_blocked_by (an older probe): the limit was inferred from the queues.
        vllm_max_concurrency: kv-bound only: vLLM's start-up "Maximum concurrency Nx" (the KV blocks over those one
            request of max_model_len takes in every KV-cache group, as vLLM prints it); left out when unknown.
        budget_use_median: budget-bound only: the median step's share of the token budget (0..1).
        concurrency_at_run_lengths: kv-bound only: the requests the KV cache holds at once at this run's lengths (usable
            blocks // the mean blocks at full length, prompt + max_tokens, over every KV-cache group): the "Maximum
            concurrency" reading that applies to this workload; left out when unknown.
    """

    steps: int
    waiting_steps: int
    total_steps: int
    share_of_waiting_steps: float
    step_range: list[int]
    running_max: int
    running_mean: float
    waiting_max: int
    waiting_mean: float
    kv_usage_mean: float
    max_num_seqs: int | None
    inferred_from_queues: bool
    vllm_max_concurrency: float | None = None
    budget_use_median: float | None = None
    concurrency_at_run_lengths: int | None = None


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


class BoundBasis(EngineBasis, kw_only=True):
    """What a limit rule's arithmetic reads: the engine core, its episodes and the steps the
    limit held back.

    Attributes:
        limit: the limit's steps (:class:`LimitSteps`).
    """

    limit: LimitSteps


@dataclass
class Binding:
    """The limit that held one engine core back most, as a limit rule says it.

    Attributes:
        finding_id: ``kv-bound``, ``seqs-bound`` or ``budget-bound``.
        basis: the engine core, its episodes and the limit's steps.
        evidence: the shared evidence (each rule adds its own fields).
        held: ``in N of M steps (x%) requests waited``, the message's common part.
        inferred: the run has no head_blocked_by: the limit was inferred from the queues.
    """

    finding_id: str
    basis: BoundBasis
    evidence: BoundEvidence
    held: str
    inferred: bool


def _bindings(ctx: Context) -> list[Binding]:
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
        held = (f"in {fmt_count(agg.steps)} of {fmt_count(eng.steps)} steps ({fmt_pct(agg.steps / eng.steps)}) "
                "requests waited")
        out.append(Binding(fid, BoundBasis(eng=eng, ep=ep, limit=agg), evidence, held, inferred))
    return out


def binding(ctx: Context, finding_id: str) -> list[Binding]:
    """The engine cores whose waits the limit of ``finding_id`` held most (chosen once per
    evaluation, for the three limit rules together: one limit per engine core)."""
    found = ctx.cache.get("binding")
    if found is None:
        found = ctx.cache["binding"] = _bindings(ctx)
    return [b for b in found if b.finding_id == finding_id]


# -- what the three limit rules share: goal, step, view ----------------------------------------


def bound_goal(f: Finding) -> Goal:
    """Queue p90 30 % lower over the requests that waited in the limit's steps (the
    requests the finding is about; over every request, a short limit in a long run is lost
    in the others' queue times: measured on a real run of 160 light requests around an
    8-request storm, queue p90 2.9 ms of all against seconds of the waiting ones)."""
    e = evidence_of(f, BoundEvidence)
    rng = e.step_range
    return Goal("queue_p90", reduce_by=0.3,
                steps=(int(rng[0]), int(rng[1])) if rng and len(rng) == 2 else None)


def bound_step(f: Finding) -> int | None:
    """The first step the limit held."""
    return first_of(evidence_of(f, BoundEvidence).step_range)


def view_bound(f: Finding) -> list[str]:
    """The limit's steps, queues and KV use, one line."""
    e = evidence_of(f, BoundEvidence)
    return [f"steps {steps_text(e.step_range)} · running max {e.running_max} (mean {e.running_mean:.1f}) · "
            f"waiting max {e.waiting_max} (mean {e.waiting_mean:.1f}) · KV {fmt_figure(e.kv_usage_mean, '%')} "
            f"mean" + (" · inferred from the queues" if e.inferred_from_queues else "")]
