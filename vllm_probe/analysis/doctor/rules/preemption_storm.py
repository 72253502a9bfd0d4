"""``preemption-storm``: preemptions frequent (per 100 steps) or costly (share of the computed
tokens thrown away).

Admission reserves only the prompt's blocks, so running requests outgrow the KV cache while
they decode; a step that cannot allocate a decode block preempts, and the victim's computed
tokens are discarded and computed again on readmission (recompute).
"""

from __future__ import annotations

import msgspec

from ..context import MEASURED, SRC_VLLM_PREEMPTION, Context, engine_of, engines_of, wrote
from ...text import fmt_count, fmt_count_or, fmt_pct
from ..evidence import Evidence
from ..findings import CRITICAL, WARNING, EngineBasis, Finding, Remedy, basis_of, evidence_of
from ..knobs import KNOB_BLOCKS_UP, KNOB_SEQS_DOWN
from ..kv import kv_remedy
from ..rule import Goal, Rule, Threshold

# -- thresholds ----------------------------------------------------------------------------

#: preemption-storm needs at least this many preemptions (one is an event, not a storm).
STORM_MIN_PREEMPTIONS = 2
#: ... and either this many preemptions per 100 steps (frequent; measured here: runs with
#: a KV cache sized for their load preempt 0 times, the demo 0.3 per 100 steps) ...
STORM_PER_100_STEPS = 1.0
#: ... or this share of the tokens the engine computed (every step's scheduled tokens:
#: prefill chunks and decodes; a decoding victim loses its output too) discarded (costly;
#: vLLM's tuning guide: preemption "can adversely affect end-to-end latency").
STORM_DISCARD_SHARE = 0.05
#: At least this share of the computed tokens thrown away: critical (as much wasted as kept).
STORM_CRITICAL_DISCARD_SHARE = 0.5


class BusiestStep(msgspec.Struct):
    """One step with preemptions.

    Attributes:
        step: the step index.
        preempted: request ids preempted in it, in vLLM's order.
    """

    step: int
    preempted: list[str]


class StormEvidence(Evidence, kw_only=True):
    """``preemption-storm``: preemptions frequent or costly.

    Attributes:
        preemptions: preempt events (or, with them off, preemptions in step events).
        requests: distinct requests preempted.
        per_100_steps: preemptions per 100 steps; null with step events off.
        discarded_tokens: computed tokens the preemptions threw away (tokens).
        computed_tokens: tokens the engine computed, every step's prefill and decode (with step events off: the prefill
            chunks).
        discarded_share: discarded_tokens / computed_tokens (0..1).
        first_step: step of the first preemption.
        busiest_steps: the steps with the most preemptions (up to 3).
        peak_kv_demand_blocks: KV blocks the admitted requests would hold at full length (prompt + max_tokens) at its
            peak; null when unknown.
        peak_running: requests admitted at that peak.
        usable_kv_blocks: the KV cache's blocks minus the one vLLM reserves.
        readmitted_prefix_hit_tokens: tokens of readmitted requests' re-prefills served from the prefix cache rather
            than recomputed (vLLM counts them as hits, #25780); null when chunk events are off.
        recomputed_tokens: tokens of readmitted requests' re-prefills that were computed again; null when chunk events
            are off.
        victim_priorities: under the priority policy, preemptions per victim priority value (vLLM preempts the running
            request with the largest (priority, arrival)); left out otherwise.
        judged_on_count: true when only preempt events were recorded (step and chunk events off): the storm is judged on
            its count alone; left out otherwise.
        recompute_tax: recomputed prompt tokens ÷ all computed tokens (vLLM RFC #54644; 0..1); null without chunk
            events.
    """

    preemptions: int
    requests: int
    per_100_steps: float | None
    discarded_tokens: int
    computed_tokens: int
    discarded_share: float
    first_step: int | None
    busiest_steps: list[BusiestStep]
    peak_kv_demand_blocks: int | None
    peak_running: int | None
    usable_kv_blocks: int | None
    readmitted_prefix_hit_tokens: int | None = None
    recomputed_tokens: int | None = None
    victim_priorities: dict[str, int] | None = None
    judged_on_count: bool | None = None
    recompute_tax: float | None = None


def evaluate(ctx: Context) -> list[Finding]:
    """Preemptions frequent (per 100 steps) or costly (share of prefill work discarded)."""
    out = []
    for eng, ep in engines_of(ctx):
        n = eng.preemptions or eng.step_preemptions
        if n < STORM_MIN_PREEMPTIONS:
            continue
        per_100 = 100 * n / eng.steps if eng.steps else None  # None: step events are off
        work = eng.scheduled_tokens or eng.chunk_tokens  # step events off: the prefill chunks
        share = eng.discarded_tokens / work if work else 0.0
        # only preempt events (step and chunk events off): neither rate nor cost is known, and
        # every preemption discarded computed work: judged on the count alone
        count_only = per_100 is None and not work
        if not count_only and (per_100 is None or per_100 < STORM_PER_100_STEPS) and share < STORM_DISCARD_SHARE:
            continue
        busiest = [BusiestStep(step, victims) for step, victims in ep.preempting_steps.items()[:3]]
        first = ep.first_preempt[0] if ep.first_preempt else (busiest[0].step if busiest else None)
        rate = (f"in {fmt_count(eng.steps)} steps ({per_100:.1f} per 100 steps, {fmt_count(eng.requests_preempted)} "
                "requests)"
                if per_100 is not None else f"({fmt_count(eng.requests_preempted)} requests)")
        of_what = ("of the tokens the engine computed" if eng.scheduled_tokens else
                   "of the prompt tokens it prefilled (decode tokens are not known with step events off)")
        if count_only:
            msg = (f"{fmt_count(n)} preemptions ({fmt_count(eng.requests_preempted)} requests)"
                   + (f" threw away {fmt_count(eng.discarded_tokens)} computed tokens" if eng.discarded_tokens else "")
                   + (f"; the first at step {first}" if first is not None else "")
                   + " (only preempt events were recorded: how often and how costly against the whole run is not "
                     "known)")
        else:
            msg = (f"{fmt_count(n)} preemptions {rate}"
                   + (f" threw away {fmt_count(eng.discarded_tokens)} computed tokens, {fmt_pct(share)} {of_what}"
                      if eng.discarded_tokens else "") + (f"; the first at step {first}" if first is not None else ""))
        if eng.recompute_tax:
            msg += f"; recompute tax {fmt_pct(eng.recompute_tax)}"
        hits = recomputed = None
        if wrote(eng, "log_chunk_boundaries") and eng.resumed_passes:
            hits, recomputed = eng.resumed_prefix_hit_tokens, eng.recomputed_tokens
            if hits:
                msg += (f"; the readmitted requests' re-prefills recomputed {fmt_count(recomputed)} tokens and took "
                        f"{fmt_count(hits)} from the prefix cache (vLLM counts those as prefix-cache hits, #25780)")
        victims_by = None
        if eng.config is not None and eng.config.scheduling_policy == "priority" and ep.victim_priorities:
            victims_by = {str(k): v for k, v in sorted(ep.victim_priorities.items())}
            msg += ("; under the priority policy vLLM preempts the running request with the largest (priority, "
                    "arrival): victims by priority " + ", ".join(f"{k}: {v}" for k, v in victims_by.items()))
        out.append(Finding(
            "preemption-storm", CRITICAL if share >= STORM_CRITICAL_DISCARD_SHARE and not count_only else WARNING, msg,
            StormEvidence(
                engine=engine_of(ctx, eng), preemptions=n, requests=eng.requests_preempted,
                per_100_steps=round(per_100, 2) if per_100 is not None else None,
                discarded_tokens=eng.discarded_tokens, computed_tokens=work, discarded_share=round(share, 4),
                first_step=first, busiest_steps=busiest, peak_kv_demand_blocks=ep.peak_demand_blocks or None,
                peak_running=ep.peak_running or None,
                usable_kv_blocks=(eng.config.num_kv_blocks - 1) if eng.config and eng.config.num_kv_blocks else None,
                readmitted_prefix_hit_tokens=hits, recomputed_tokens=recomputed, victim_priorities=victims_by,
                judged_on_count=count_only or None,
                recompute_tax=round(eng.recompute_tax, 4) if eng.recompute_tax is not None else None),
            basis=EngineBasis(eng=eng, ep=ep)))
    return out


def arithmetic(ctx: Context, f: Finding) -> Remedy | None:
    """The KV arithmetic of :func:`~vllm_probe.analysis.doctor.kv.kv_remedy` (peak demand, or
    the first preemption)."""
    b = basis_of(f, EngineBasis)
    return kv_remedy(b.eng, b.ep)


def view(f: Finding) -> list[str]:
    """The busiest steps and their victims; the peak KV demand against the usable blocks."""
    e = evidence_of(f, StormEvidence)
    out = []
    if e.busiest_steps:
        out.append("busiest steps: " + ", ".join(f"{b.step} ({', '.join(b.preempted[:3])})" for b in e.busiest_steps))
    if e.peak_kv_demand_blocks:
        out.append(f"peak KV demand {fmt_count_or(e.peak_kv_demand_blocks)} blocks for {e.peak_running} running "
                   f"requests at full length; {fmt_count_or(e.usable_kv_blocks)} usable")
    return out


RULE = Rule(
    "preemption-storm",
    "Admission reserves only the prompt's blocks (vLLM 0.32 scheduler.py:1256-1280), so running "
    "requests outgrow the cache while they decode; a step that cannot allocate a decode block "
    "preempts (:776-841, allocate_slots → _preempt_request) and the victim's computed tokens are "
    "discarded; on readmission its prompt is recomputed, or served from the prefix cache where "
    "its blocks survived (get_computed_blocks, :1037; vLLM counts those as hits, #25780). A step "
    "that preempts admits nobody (:900, the WAITING loop runs only `if not preempted_reqs`).",
    evaluate,
    StormEvidence,
    (Threshold("STORM_MIN_PREEMPTIONS", STORM_MIN_PREEMPTIONS, "preemptions",
               "one preemption is an event, not a storm"),
     Threshold("STORM_PER_100_STEPS", STORM_PER_100_STEPS, "preemptions per 100 steps",
               MEASURED + ": runs sized for their load preempt 0 times"),
     Threshold("STORM_DISCARD_SHARE", STORM_DISCARD_SHARE, "share of computed tokens", SRC_VLLM_PREEMPTION),
     Threshold("STORM_CRITICAL_DISCARD_SHARE", STORM_CRITICAL_DISCARD_SHARE, "share of computed tokens",
               "as much computed work thrown away as kept")),
    goal=lambda f: Goal("preemptions", reduce_by=0.9),
    knobs=(KNOB_SEQS_DOWN, KNOB_BLOCKS_UP),
    arithmetic=arithmetic, view=view, step=lambda f: evidence_of(f, StormEvidence).first_step,
    severity=(CRITICAL, WARNING), wait="explains")
