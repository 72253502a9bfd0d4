"""``stall``: steps that scheduled nothing while requests waited, and why.

In a synchronous scheduler a step with anything running schedules its decodes, so an empty
step with requests waiting means the head of the waiting queue cannot be admitted now: its
whole prompt does not fit the free KV blocks, or admission was deferred. A prompt that fits
``max_model_len`` but never the KV cache stalls the queue for good (vLLM #39734); under
async scheduling the empty steps are held slots, which ``held-slots`` names instead.
"""

from __future__ import annotations

from typing import Literal

from ..context import MEASURED, SRC_ASYNC, Context, engine_of, engines_of, reasons_text, steps_text
from ...text import fmt_count, fmt_count_or
from ..evidence import Evidence
from ..findings import CRITICAL, WARNING, EngineBasis, Finding, Remedy, basis_of, evidence_of
from ..knobs import KNOB_ASYNC_OFF, KNOB_BLOCKS_UP
from ..kv import groups_text, memory_advice, memory_cost, request_blocks
from ..rule import Goal, Rule, Threshold
from . import held_slots

# -- thresholds ----------------------------------------------------------------------------

#: stall: at least this many steps scheduled nothing while requests waited (in a
#: synchronous scheduler any such step means the head can never run now; measured here:
#: 0 in every healthy run) ...
STALL_MIN_STEPS = 3
#: ... critical when the log ends inside a stall at least this long (the queue never drained).
STALL_CRITICAL_STEPS = 50


class StallEvidence(Evidence, kw_only=True):
    """``stall``: steps that scheduled nothing while requests waited.

    Attributes:
        stall_steps: such steps in all.
        first_step: the first of them.
        longest: the longest run of them, ``[first, last]``.
        head_blocked_by: steps per head_blocked_by reason over the stalls.
        head: the request at the head of the queue (the state's guess: a preempted one first, else the oldest).
        head_prompt_len: its prompt (tokens).
        never_drained: the log ends inside a stall of at least STALL_CRITICAL_STEPS steps.
        stalls: the longest stalls, ``[first, last]`` each (up to 5).
    """

    stall_steps: int
    first_step: int | None
    longest: list[int]
    head_blocked_by: dict[str, int]
    head: str | None
    head_prompt_len: int | None
    never_drained: bool
    stalls: list[list[int]]


class StallBasis(EngineBasis, kw_only=True):
    """What the stall's arithmetic reads.

    Attributes:
        cause: ``never_fits`` — the head's prompt needs more blocks than the KV cache has;
            ``async`` — admission deferred under async scheduling; None — neither (no remedy).
        head: the head request (``never_fits``).
        head_prompt_len: its prompt (tokens).
        need: the blocks its prompt needs.
        usable: the KV cache's usable blocks.
        block_size: tokens per block.
    """

    cause: Literal["never_fits", "async"] | None = None
    head: str | None = None
    head_prompt_len: int | None = None
    need: int = 0
    usable: int = 0
    block_size: int = 0


def evaluate(ctx: Context) -> list[Finding]:
    """Steps that scheduled nothing while requests waited, with their cause."""
    out = []
    for eng, ep in engines_of(ctx):
        runs = eng.timeline.stalls
        if runs.steps < STALL_MIN_STEPS:
            continue
        cfg = eng.config
        stalls = runs.all()
        longest, first = stalls[0], runs.first
        reasons: dict[str, int] = {}
        for st in stalls:
            for k, v in st.reasons.items():
                reasons[k] = reasons.get(k, 0) + v
        open_stall = runs.open
        never = (not ctx.live and open_stall is not None and open_stall.last_step == eng.last_step
                 and open_stall.steps >= STALL_CRITICAL_STEPS)
        cause_reason = max(reasons, key=reasons.__getitem__) if reasons else None
        if cause_reason == "deferred" and held_slots.fires(ep):
            continue  # held-slots names the mechanism (0-token steps are one machine's shape of it)
        head, head_len = (first.head, first.head_prompt_len) if first is not None else (None, None)
        basis = StallBasis(eng=eng, ep=ep)
        if open_stall is not None and open_stall.head:
            head, head_len = open_stall.head, open_stall.head_prompt_len
        cause = {"kv_cache": "the head did not fit the KV cache", "deferred": "admission was deferred",
                 "max_num_seqs": "the running queue was full", "preemption": "the steps preempted",
                 "token_budget": "the budget was used up", "prefill_limit": "new prefills were held back"}.get(
                     cause_reason or "", "the cause is not recorded (no head_blocked_by)")
        msg = (f"{fmt_count(runs.steps)} steps scheduled nothing while requests waited (first at step "
               f"{first.first_step if first else '?'}, longest {fmt_count(longest.steps)} steps from step "
               f"{longest.first_step}): {cause}")
        if cfg is not None and cause_reason == "kv_cache" and head_len and cfg.block_size and cfg.num_kv_blocks:
            need = request_blocks(cfg, head_len)  # over every KV-cache group of a hybrid model
            usable = cfg.num_kv_blocks - 1
            if need > usable:
                msg += (f"; the head {head} needs {need} blocks for its {fmt_count(head_len)}-token prompt and the KV "
                        f"cache has {usable}: it can never fit")
                basis = StallBasis(eng=eng, ep=ep, cause="never_fits", head=head, head_prompt_len=head_len,
                                   need=need, usable=usable, block_size=cfg.block_size)
        if cause_reason == "deferred" and cfg is not None and (cfg.async_scheduling or
                                                               cfg.scheduler_class == "AsyncScheduler"):
            msg += ("; under async scheduling a finished request keeps its slot one more step, so with short "
                    "outputs every other step admits nobody (raising max_num_seqs does not change it)")
            basis = StallBasis(eng=eng, ep=ep, cause="async")
        if never and open_stall is not None:
            msg += f"; the queue never drained (the log ends {open_stall.steps} steps into it)"
        out.append(Finding("stall", CRITICAL if never else WARNING, msg, StallEvidence(
            engine=engine_of(ctx, eng), stall_steps=runs.steps, first_step=first.first_step if first else None,
            longest=[longest.first_step, longest.last_step], head_blocked_by=reasons, head=head,
            head_prompt_len=head_len, never_drained=never,
            stalls=[[s.first_step, s.last_step] for s in stalls[:5]]), basis=basis))
    return out


def arithmetic(ctx: Context, f: Finding) -> Remedy | None:
    """A head that can never fit: blocks for its prompt; under async scheduling: async off."""
    b = basis_of(f, StallBasis)
    if b.cause is None:
        return None
    if b.cause == "async":
        return Remedy("async_scheduling", False,
                      "the 0-token steps come from the slot held for the in-flight last token; without async "
                      "scheduling the slot frees in the same step",
                      "without async scheduling the next step is not prepared while the GPU runs this one",
                      SRC_ASYNC)
    head, head_len, need, usable, block = b.head, b.head_prompt_len or 0, b.need, b.usable, b.block_size
    groups = groups_text(b.eng.config)
    blocks = (f"{need} blocks over its {groups}" if groups else f"⌈{fmt_count(head_len)} / {block}⌉ = {need} blocks")
    return Remedy(
        "num_kv_blocks", need + 1,
        f"{head}'s prompt: {blocks} + 1 reserved → "
        f"num_kv_blocks ≥ {need + 1} ({memory_advice(b.eng.config, need + 1)}); or max_model_len ≤ "
        f"{fmt_count(usable * block)} so that vLLM rejects such prompts at once", memory_cost(b.eng.config),
        "vLLM issue #39734: a request that fits max_model_len but never the KV cache stalls the queue",
        whatif={"num_kv_blocks": need + 1})


def goal(f: Finding) -> Goal:
    """Held slots 90 % fewer under async scheduling; else the queue p90 30 % lower."""
    if isinstance(f.basis, StallBasis) and f.basis.cause == "async":
        return Goal("held_slot_steps", reduce_by=0.9)
    return Goal("queue_p90", reduce_by=0.3)


def view(f: Finding) -> list[str]:
    """The stalls' steps, what blocked the head, the head."""
    e = evidence_of(f, StallEvidence)
    out = ["stalls at steps " + ", ".join(steps_text(s) for s in e.stalls)]
    if e.head_blocked_by:
        out.append("head blocked by " + reasons_text(e.head_blocked_by))
    if e.head:
        out.append(f"head {e.head} (prompt {fmt_count_or(e.head_prompt_len)})")
    return out


RULE = Rule(
    "stall",
    "A step that schedules no token while requests wait. In a synchronous scheduler a step "
    "with anything running schedules its decodes (vLLM 0.32 vllm/v1/core/sched/scheduler.py:659, "
    "Scheduler.schedule's RUNNING loop), so an empty step means the head of the waiting queue "
    "cannot be admitted now: its whole prompt does not fit the free blocks (scheduler.py:1256-1280, "
    "allocate_slots(full_sequence_must_fit=scheduler_reserve_full_isl) fails and the WAITING loop "
    "breaks), or admission was deferred. vLLM #39734: a prompt that fits max_model_len but never "
    "the KV cache stalls the queue for good.",
    evaluate,
    StallEvidence,
    (Threshold("STALL_MIN_STEPS", STALL_MIN_STEPS, "steps", MEASURED + ": 0 in every healthy run"),
     Threshold("STALL_CRITICAL_STEPS", STALL_CRITICAL_STEPS, "steps", "the queue never drained")),
    goal=goal,
    knobs=(KNOB_BLOCKS_UP, KNOB_ASYNC_OFF),
    arithmetic=arithmetic, view=view, step=lambda f: evidence_of(f, StallEvidence).first_step,
    severity=(CRITICAL, WARNING), wait="explains")
