"""``held-slots``: under AsyncScheduler, requests wait while running slots are held by
requests whose last token is in flight.

The async scheduler schedules step N+1 before step N's output is processed; a request that
has produced its last token stays in the running queue one step more, holding one of
``max_num_seqs`` slots. With short outputs many slots are held at once, and the waiting
queue is admitted every other step (vLLM #45257).
"""

from __future__ import annotations

from ..context import SRC_ASYNC, Context, engine_of, engines_of, first_of, reasons_text, steps_text, wrote
from ...text import fmt_count, fmt_count_or, fmt_pct
from ...episodes import EngineEpisodes
from ..evidence import Evidence
from ..findings import WARNING, EngineBasis, Finding, Remedy, basis_of, evidence_of
from ..knobs import KNOB_ASYNC_OFF, KNOB_SEQS_UP
from ..kv import seqs_cap
from ..rule import Goal, Rule, Threshold

# -- thresholds ----------------------------------------------------------------------------

#: held-slots: at least this many held steps (an async step whose full running queue holds
#: slots for requests whose last token is in flight while requests wait) ...
HELD_MIN_STEPS = 3
#: ... and at least this share of the async engine's steps with requests waiting (below it
#: the held slots are incidental: a finished request frees its slot one step later anyway).
HELD_MIN_SHARE = 0.2
#: ... and the held slots at least this share of the slots (max_num_seqs per async step with
#: requests waiting): with long outputs one finishing request holds 1 of max_num_seqs slots
#: for one step now and then, a few percent of the capacity; with one-token outputs half of
#: the slots are held (measured: every other step).
HELD_MIN_SLOT_SHARE = 0.1


class HeldSlotsEvidence(Evidence, kw_only=True):
    """``held-slots``: under AsyncScheduler, requests waited while running slots were held by
    requests that had already produced their last token.

    Attributes:
        held_steps: steps after which requests waited with the running queue at max_num_seqs and some of its requests
            scheduling nothing (their last token in flight).
        waiting_steps: steps of the async engine core after which requests waited.
        share_of_waiting_steps: held_steps / waiting_steps (0..1).
        held_slot_steps: held slots summed over the held steps (slot-steps).
        held_slot_share: held_slot_steps / (max_num_seqs × waiting_steps): the share of the running slots held while
            requests waited (0..1).
        held_max: most slots held in one step.
        step_range: the first and last held step, ``[first, last]``.
        max_num_seqs: the engine's max_num_seqs.
        running_max: most requests running in a held step.
        waiting_max: most requests waiting after a held step.
        tokens_min: fewest tokens a held step scheduled.
        tokens_max: most tokens a held step scheduled.
        tokens_mean: mean tokens a held step scheduled.
        head_blocked_by: held steps per head_blocked_by reason (``unrecorded``: the run has no such field).
        scheduler_class: the scheduler class engine_config recorded.
    """

    held_steps: int
    waiting_steps: int
    share_of_waiting_steps: float
    held_slot_steps: int
    held_slot_share: float
    held_max: int
    step_range: list[int]
    max_num_seqs: int | None
    running_max: int
    waiting_max: int
    tokens_min: int
    tokens_max: int
    tokens_mean: float
    head_blocked_by: dict[str, int]
    scheduler_class: str | None


def fires(ep: EngineEpisodes) -> bool:
    """Whether held-slots' thresholds are met on this engine core (``stall`` leaves its
    0-token steps to this rule then)."""
    h = ep.held
    seqs = ep.eng.config.max_num_seqs if ep.eng.config is not None else None
    return (h.steps >= HELD_MIN_STEPS and bool(h.waiting_steps) and h.steps >= HELD_MIN_SHARE * h.waiting_steps
            and bool(seqs) and h.slot_steps >= HELD_MIN_SLOT_SHARE * (seqs or 0) * h.waiting_steps)


def evaluate(ctx: Context) -> list[Finding]:
    """Under AsyncScheduler: requests wait while running slots are held by requests whose
    last token is in flight (:class:`~vllm_probe.analysis.episodes.HeldSlots`)."""
    out = []
    for eng, ep in engines_of(ctx):
        h = ep.held
        if not wrote(eng, "log_schedule_each_step"):
            continue  # not-checked names the step rules
        if not fires(ep):
            continue
        cfg = eng.config
        share = h.steps / h.waiting_steps
        mean = h.tokens_sum / h.steps
        msg = (f"Under async scheduling, in {fmt_count(h.steps)} of {fmt_count(h.waiting_steps)} steps "
               f"({fmt_pct(share)}) with requests waiting, the running queue was full ({h.running_max} of max_num_seqs "
               f"{cfg.max_num_seqs}) while up to {h.held_max} of its slots were held by requests whose last token was "
               f"in flight: a finished request frees its slot one step later, so up to {fmt_count(h.waiting_max)} "
               f"waited (steps {h.first_step}-{h.last_step}; the held steps scheduled {fmt_count(h.tokens_min)} to "
               f"{fmt_count(h.tokens_max)} tokens)")
        out.append(Finding("held-slots", WARNING, msg, HeldSlotsEvidence(
            engine=engine_of(ctx, eng), held_steps=h.steps, waiting_steps=h.waiting_steps,
            share_of_waiting_steps=round(share, 4), held_slot_steps=h.slot_steps,
            held_slot_share=round(h.slot_steps / (cfg.max_num_seqs * h.waiting_steps), 4), held_max=h.held_max,
            step_range=[h.first_step, h.last_step], max_num_seqs=cfg.max_num_seqs, running_max=h.running_max,
            waiting_max=h.waiting_max, tokens_min=h.tokens_min, tokens_max=h.tokens_max, tokens_mean=round(mean, 2),
            head_blocked_by=dict(h.reasons), scheduler_class=cfg.scheduler_class), basis=EngineBasis(eng=eng, ep=ep)))
    return out


def arithmetic(ctx: Context, f: Finding) -> Remedy | None:
    """``async_scheduling`` off; or ``max_num_seqs`` up by the most slots held, within what
    the KV cache holds at full length."""
    e = evidence_of(f, HeldSlotsEvidence)
    b = basis_of(f, EngineBasis)
    eng, ep = b.eng, b.ep
    cfg = eng.config
    alternatives = []
    seqs = cfg.max_num_seqs or 0
    want = seqs + e.held_max
    cap = seqs_cap(eng, ep)
    if cap is not None:
        want = min(want, cap)
    if want > seqs:
        alternatives.append({
            "setting": "max_num_seqs", "value": want, "whatif": {"max_num_seqs": want},
            "arithmetic": f"max_num_seqs {seqs} + the {e.held_max} slots held at most = {seqs + e.held_max}"
                          + (f", at most the {cap} requests the KV cache holds at full length" if cap is not None
                             and cap < seqs + e.held_max else "")
                          + ": the held slots no longer fill the running queue"})
    return Remedy(
        "async_scheduling", False,
        f"{fmt_count(e.held_slot_steps)} slot-steps held in {fmt_count(e.held_steps)} steps by requests whose last "
        f"token was in flight; without async scheduling a finished request leaves the running queue before the next "
        f"step is scheduled (vLLM 0.32 scheduler.py:2294-2295 runs before schedule())",
        "without async scheduling the next step is not prepared while the model runs this one (higher inter-token "
        "latency on a GPU)", SRC_ASYNC, whatif={"async_scheduling": False}, alternatives=alternatives)


def view(f: Finding) -> list[str]:
    """The held steps, slots, queues and tokens per held step."""
    e = evidence_of(f, HeldSlotsEvidence)
    return [f"held steps {steps_text(e.step_range)} · slots held max {e.held_max} ({fmt_count(e.held_slot_steps)} "
            f"slot-steps) · running max {e.running_max} of {fmt_count_or(e.max_num_seqs)} · waiting max "
            f"{e.waiting_max}",
            f"tokens per held step {fmt_count(e.tokens_min)}–{fmt_count(e.tokens_max)} (mean {e.tokens_mean:,.0f}) · "
            f"head blocked by {reasons_text(e.head_blocked_by)} · {e.scheduler_class or 'scheduler not recorded'}"]


RULE = Rule(
    "held-slots",
    "Under AsyncScheduler the next step is scheduled before the previous step's output is "
    "processed. A running request whose in-flight tokens already reach its max_tokens is "
    "skipped (vLLM 0.32 scheduler.py:663-678, num_output_placeholders) but stays in "
    "self.running until update_from_output removes it (:2294-2295), one step later; while "
    "it does, it holds one of max_num_seqs slots and the WAITING loop stops at "
    "num_running >= max_num_active_reqs (:921-924). With short outputs many slots are held "
    "at once: steps of 0/4,096 tokens on a busy machine, 3,840/256 on a quiet one "
    "(measured on vLLM 0.32's CPU engine; vLLM #45257).",
    evaluate,
    HeldSlotsEvidence,
    (Threshold("HELD_MIN_STEPS", HELD_MIN_STEPS, "steps", "held steps: at least a few, not one finishing request"),
     Threshold("HELD_MIN_SHARE", HELD_MIN_SHARE, "share of the async steps with requests waiting",
        "below it a finished request's one-step hold is incidental"),
     Threshold("HELD_MIN_SLOT_SHARE", HELD_MIN_SLOT_SHARE,
               "share of max_num_seqs × the async steps with requests waiting",
        "long outputs hold a slot for one step in hundreds (a few percent); one-token outputs half of them")),
    goal=lambda f: Goal("held_slot_steps", reduce_by=0.9),
    knobs=(KNOB_ASYNC_OFF, KNOB_SEQS_UP),
    arithmetic=arithmetic, view=view,
    step=lambda f: first_of(evidence_of(f, HeldSlotsEvidence).step_range), wait="explains")
