"""``priority-slot-wait``: under the priority policy, high-priority requests waited for a
running slot held by lower-priority requests.

The waiting queue is ordered by (priority, arrival), but a waiting request gets a slot only
when one is free, and vLLM preempts only when a request cannot allocate KV blocks — never for
a slot — so priority does not get a request past a full running queue.
"""

from __future__ import annotations

import msgspec

from ...episode_types import PRIORITY_WAIT_MIN_STEPS
from ..context import Context, engine_of, engines_of, steps_text
from ...text import fmt_count, fmt_count_or
from ..evidence import Evidence
from ..findings import WARNING, EngineBasis, Finding, Remedy, basis_of, evidence_of
from ..knobs import KNOB_SEQS_UP
from ..kv import seqs_cap
from ..rule import Goal, Rule, Threshold

class RunningRequest(msgspec.Struct):
    """A running request.

    Attributes:
        req_id: the request.
        priority: its priority value (lower runs first).
    """

    req_id: str
    priority: int


class PriorityWaitEntry(msgspec.Struct):
    """A high-priority request that waited for a slot.

    Attributes:
        req_id: the request.
        priority: its priority value (lower runs first).
        steps: the steps it waited, ``[arrival step, first chunk step - 1]``.
        slot_steps: steps of its wait whose head_blocked_by was a full running queue (max_num_seqs or deferred).
        head_blocked_by: steps per head_blocked_by reason while it waited.
        lower_priority_running: running requests of lower priority (larger value) that held slots throughout its wait
            (up to 4).
    """

    req_id: str
    priority: int
    steps: list[int]
    slot_steps: int
    head_blocked_by: dict[str, int]
    lower_priority_running: list[RunningRequest]


class PrioritySlotWaitEvidence(Evidence, kw_only=True):
    """``priority-slot-wait``: under the priority policy, high-priority requests waited for a running slot held by
    lower-priority ones.

    Attributes:
        requests: such requests in all.
        waits: the longest of them (up to 8).
        max_num_seqs: the engine's max_num_seqs.
    """

    requests: int
    waits: list[PriorityWaitEntry]
    max_num_seqs: int | None


def evaluate(ctx: Context) -> list[Finding]:
    """Under the priority policy: high-priority requests waited for a running slot held by
    lower-priority requests (vLLM preempts for KV blocks, never for slots)."""
    out = []
    for eng, ep in engines_of(ctx):
        if not ep.priority_wait_count:
            continue
        waits = ep.priority_waits.items()
        worst = waits[0]
        low_rid, low_p = worst.lower[0]
        cfg = eng.config
        msg = (f"{ep.priority_wait_count} request{'s' if ep.priority_wait_count != 1 else ''} of higher priority "
               f"waited for a running slot while requests of lower priority held all {fmt_count_or(cfg.max_num_seqs)} "
               f"(e.g. {worst.req_id}, priority {worst.priority}, waited {fmt_count(worst.slot_steps)} steps with the "
               f"running queue full while {low_rid}, priority {low_p}, ran): vLLM preempts for KV blocks, never for a "
               "slot, so priority does not get a request past a full running queue")
        out.append(Finding("priority-slot-wait", WARNING, msg, PrioritySlotWaitEvidence(
            engine=engine_of(ctx, eng), requests=ep.priority_wait_count,
            waits=[PriorityWaitEntry(w.req_id, w.priority, [w.arrival_step, w.first_step - 1], w.slot_steps,
                                     dict(w.reasons), [RunningRequest(r, p) for r, p in w.lower]) for w in waits],
            max_num_seqs=cfg.max_num_seqs), basis=EngineBasis(eng=eng, ep=ep)))
    return out


def arithmetic(ctx: Context, f: Finding) -> Remedy | None:
    """``max_num_seqs`` up by the requests that waited (within what the cache holds at full length)."""
    e = evidence_of(f, PrioritySlotWaitEvidence)
    b = basis_of(f, EngineBasis)
    eng, ep = b.eng, b.ep
    seqs = eng.config.max_num_seqs or 0
    add = min(e.requests, len(e.waits)) or 1
    want = seqs + add
    cap = seqs_cap(eng, ep)
    if cap is not None:
        want = min(want, cap)
    if want <= seqs:
        return None
    return Remedy(
        "max_num_seqs", want,
        f"max_num_seqs {seqs} + {add} (the high-priority requests that waited for a slot at once, at most) = {want}"
        + (f", at most the {cap} requests the KV cache holds at full length" if cap is not None else "")
        + ": a free slot admits them by priority",
        "more requests per step: each decode step takes longer (inter-token latency)",
        "vLLM 0.32 scheduler.py:776-841 (preemption only when allocate_slots fails) and :921-924 (the slot limit)",
        whatif={"max_num_seqs": want})


def goal(f: Finding) -> Goal:
    """The waiting high-priority requests' queue p90 halved."""
    waits = evidence_of(f, PrioritySlotWaitEvidence).waits
    return Goal("queue_p90", reduce_by=0.5, requests=tuple(w.req_id for w in waits))


def view(f: Finding) -> list[str]:
    """Each waiting request and the lower-priority requests running meanwhile."""
    e = evidence_of(f, PrioritySlotWaitEvidence)
    return [f"{w.req_id} (priority {w.priority}) waited {steps_text(w.steps)}, {fmt_count(w.slot_steps)} steps "
            f"with the running queue full; running meanwhile: "
            + ", ".join(f"{r.req_id} (priority {r.priority})" for r in w.lower_priority_running)
            for w in e.waits[:4]]


def step(f: Finding) -> int | None:
    """The longest wait's arrival."""
    e = evidence_of(f, PrioritySlotWaitEvidence)
    return e.waits[0].steps[0] if e.waits else None


RULE = Rule(
    "priority-slot-wait",
    "Under the priority policy the WAITING queue is ordered by (priority, arrival), but a "
    "waiting request gets a slot only when one is free: the WAITING loop stops at "
    "num_running >= max_num_active_reqs (vLLM 0.32 scheduler.py:921-924), and vLLM preempts "
    "only when a request cannot allocate KV blocks (:776-841, the victim being the running "
    "request with the largest (priority, arrival)). A high-priority request therefore waits "
    "behind a full running queue of lower-priority requests.",
    evaluate,
    PrioritySlotWaitEvidence,
    (Threshold("PRIORITY_WAIT_MIN_STEPS", PRIORITY_WAIT_MIN_STEPS, "steps with the running queue full",
               "as HOL_MIN_WAIT_STEPS: a few steps, not one finishing request (episodes.py)"),),
    goal=goal,
    knobs=(KNOB_SEQS_UP,),
    arithmetic=arithmetic, view=view, step=step, wait="explains")
