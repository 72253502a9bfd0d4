"""``unexplained-wait``: requests waited longer than :data:`ADMIT_WITHIN_STEPS` steps for
their first chunk and no rule explains it.

After each step the probe records why the head of the queue was not admitted
(``head_blocked_by``); a long wait that no other rule explains is named with those reasons,
so that "nothing held this run back" is said only when it is true
(:func:`vllm_probe.analysis.doctor.all_clear` reads :func:`longest_wait_steps`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...episodes import EngineEpisodes
from ...episode_types import Wait
from ..context import MEASURED, Context, engine_of, engines_of, reasons_text, steps_text, wrote
from ...text import fmt_count, fmt_pct
from ..evidence import Evidence
from ..findings import WARNING, EngineBasis, Finding, Remedy, basis_of, evidence_of
from ..knobs import KNOB_ASYNC_OFF, KNOB_BLOCKS_UP, KNOB_BUDGET_UP, KNOB_SEQS_DOWN, KNOB_SEQS_UP
from ..kv import kv_remedy
from ..limits import BOUND_SHARE
from ..rule import Goal, Knob, Rule, Threshold

#: "Nothing held this run back" is said only when every request was admitted within this
#: many steps of arriving (its first prefill chunk); a longer wait that no rule explains is
#: ``unexplained-wait`` (the all-clear must be earned). Measured here: the
#: longest wait in the healthy scenarios (light, lone-long-prompt) is at most 2 steps; 32
#: leaves room for a burst admitted a few requests per step.
ADMIT_WITHIN_STEPS = 32

#: Waits listed in unexplained-wait's evidence (the longest; episodes keep this many).
TOP_WAITS_LISTED = 8


class WaitEntry(msgspec.Struct):
    """A request's wait from arrival to its first prefill chunk.

    Attributes:
        req_id: the request.
        waited_steps: steps from arrival to its first chunk (still waiting: so far).
        steps: the steps it waited, ``[arrival step, first chunk step - 1]``.
        admitted: it was admitted within the run (false: still waiting at its end).
        head_blocked_by: steps per head_blocked_by reason while it waited.
    """

    req_id: str
    waited_steps: int
    steps: list[int]
    admitted: bool
    head_blocked_by: dict[str, int]


class UnexplainedWaitEvidence(Evidence, kw_only=True):
    """``unexplained-wait``: requests waited longer than ADMIT_WITHIN_STEPS steps and no rule explains why.

    Attributes:
        admit_within_steps: the threshold ADMIT_WITHIN_STEPS (steps).
        longest_wait_steps: the longest wait (steps).
        requests: the longest waits over the threshold (up to 8).
        head_blocked_by: steps per head_blocked_by reason over those waits.
        limit: the reason that held at least half of those steps (``kv_cache``, ``max_num_seqs``,
            ``token_budget``, ``deferred``, ``preemption``, ``prefill_limit``); left out when none did.
    """

    admit_within_steps: int
    longest_wait_steps: int
    requests: list[WaitEntry]
    head_blocked_by: dict[str, int]
    limit: str | None = None


def waits(ep: EngineEpisodes) -> list[Wait]:
    """Waits, longest first; a request not admitted by the end counts only when the steps of
    its wait say requests waited (head_blocked_by recorded): a hand-made or truncated stream
    may never show a request's first chunk."""
    last = ep.eng.last_step
    return [w for w in ep.all_waits() if w.first_step <= last or w.reasons]


def long_waits(ep: EngineEpisodes) -> list[Wait]:
    """The waits longer than :data:`ADMIT_WITHIN_STEPS`, longest first."""
    return [w for w in waits(ep) if w.steps > ADMIT_WITHIN_STEPS]


def longest_wait_steps(ctx: Context) -> int | None:
    """The longest wait from arrival to the first prefill chunk over the run's engine cores
    (steps; still-waiting requests count their wait so far); None when chunk or request
    events are off (waits are not known)."""
    longest: int | None = None
    for eng, ep in engines_of(ctx):
        if not (wrote(eng, "log_chunk_boundaries") and wrote(eng, "log_request_events")):
            return None
        found = waits(ep)
        longest = max(longest or 0, found[0].steps if found else 0)
    return longest


def evaluate(ctx: Context) -> list[Finding]:
    """Requests that waited more than :data:`ADMIT_WITHIN_STEPS` steps for their first chunk
    while no finding that explains waits (a rule whose ``wait`` is ``explains``) names
    what held them: name the head_blocked_by
    reasons over their waits, even if no rule explains why."""
    out = []
    for eng, ep in engines_of(ctx):
        if not (wrote(eng, "log_chunk_boundaries") and wrote(eng, "log_request_events")):
            ctx.not_checked["unexplained-wait"] = ("needs chunk and request events "
                                                   "(scheduler_probe.log_chunk_boundaries, log_request_events): how "
                                                   "long requests waited is not known")
            continue
        engine = engine_of(ctx, eng)
        if engine in ctx.explained or None in ctx.explained:
            continue
        waits = long_waits(ep)
        if not waits:
            continue
        reasons: dict[str, int] = {}
        for w in waits:
            for k, v in w.reasons.items():
                reasons[k] = reasons.get(k, 0) + v
        last = eng.last_step
        longest = waits[0]
        listed = waits[:TOP_WAITS_LISTED]
        limit = dominant(reasons)
        head = (f"{len(waits)}{'+' if len(waits) >= TOP_WAITS_LISTED else ''} request{'s' if len(waits) != 1 else ''} "
                f"waited more than {ADMIT_WITHIN_STEPS} steps for their first chunk (longest {longest.req_id}, "
                f"{fmt_count(longest.steps)} steps from step {longest.arrival_step})")
        if limit is not None:
            msg = (f"{head}: {LIMIT_WORDS[limit]} held them — the head of the queue was blocked by {limit} in "
                   f"{fmt_pct(reasons[limit] / sum(reasons.values()))} of their waiting steps; no limit rule names it "
                   "because it held a stretch of the run, not a share of the whole that kv-, seqs- or budget-bound "
                   "needs")
        elif reasons:
            msg = f"{head} and no rule explains it; the head of the queue was blocked by {reasons_text(reasons)}"
        else:
            msg = f"{head} and no rule explains it; the run records no head_blocked_by for those steps"
        out.append(Finding("unexplained-wait", WARNING, msg, UnexplainedWaitEvidence(
            engine=engine, admit_within_steps=ADMIT_WITHIN_STEPS, longest_wait_steps=longest.steps,
            requests=[WaitEntry(w.req_id, w.steps, [w.arrival_step, w.first_step - 1], w.first_step <= last,
                                dict(w.reasons)) for w in listed],
            head_blocked_by=reasons, limit=limit), basis=EngineBasis(eng=eng, ep=ep)))
    return out


#: A head_blocked_by reason that holds at least this share of the waits' steps names the
#: limit that held them (as a limit rule's BOUND_SHARE does for the whole run).
DOMINANT_SHARE = BOUND_SHARE
#: How each limit reads in the message.
LIMIT_WORDS = {"kv_cache": "the KV cache", "max_num_seqs": "max_num_seqs (a full running queue)",
               "token_budget": "the token budget", "deferred": "deferred admission (held slots)",
               "preemption": "preemption (a step that preempts admits nobody)",
               "prefill_limit": "the prefill limit"}


def dominant(reasons: dict[str, int]) -> str | None:
    """The head_blocked_by reason holding at least :data:`DOMINANT_SHARE` of ``reasons``' steps
    (None: none does, or nothing was recorded)."""
    total = sum(reasons.values())
    if not total:
        return None
    top = max(reasons, key=reasons.__getitem__)
    return top if reasons[top] >= DOMINANT_SHARE * total and top in LIMIT_WORDS else None


def goal(f: Finding) -> Goal:
    """The queue p90 of the requests that waited, 30 % lower."""
    e = evidence_of(f, UnexplainedWaitEvidence)
    return Goal("queue_p90", reduce_by=0.3, requests=tuple(w.req_id for w in e.requests))


def _for(limits: tuple[str, ...], knob: Knob) -> Knob:
    """``knob``, with candidates only when the finding's limit is one of ``limits``."""
    def candidates(settings: dict[str, Any], finding: Finding) -> list[Any]:
        e = finding.evidence
        if not isinstance(e, UnexplainedWaitEvidence) or e.limit not in limits:
            return []
        return list(knob.candidates(settings, finding))
    return Knob(knob.setting, knob.direction, candidates, knob.min_release, knob.beyond_cap)


#: The knobs of each limit the waits may have been held by.
KNOBS = (_for(("kv_cache", "preemption"), KNOB_BLOCKS_UP), _for(("kv_cache", "preemption"), KNOB_SEQS_DOWN),
         _for(("max_num_seqs",), KNOB_SEQS_UP), _for(("token_budget",), KNOB_BUDGET_UP),
         _for(("deferred",), KNOB_ASYNC_OFF))


def arithmetic(ctx: Context, f: Finding) -> Remedy | None:
    """For a KV-cache limit, the KV arithmetic of the storm's and kv-bound's remedies; the
    other limits are left to the replay (their knobs)."""
    e = evidence_of(f, UnexplainedWaitEvidence)
    if e.limit not in ("kv_cache", "preemption"):
        return None
    b = basis_of(f, EngineBasis)
    return kv_remedy(b.eng, b.ep)


def view(f: Finding) -> list[str]:
    """The longest waits and what blocked the head over them."""
    e = evidence_of(f, UnexplainedWaitEvidence)
    out = [f"{w.req_id} waited {fmt_count(w.waited_steps)} steps, {steps_text(w.steps)}"
           + ("" if w.admitted else " (still waiting at the end)")
           + (f": head blocked by {reasons_text(w.head_blocked_by)}" if w.head_blocked_by else "")
           for w in e.requests[:4]]
    if e.head_blocked_by:
        out.append("over all of them: " + reasons_text(e.head_blocked_by))
    return out


def step(f: Finding) -> int | None:
    """The longest wait's arrival."""
    e = evidence_of(f, UnexplainedWaitEvidence)
    return e.requests[0].steps[0] if e.requests else None


RULE = Rule(
    "unexplained-wait",
    "A request waits from its arrival until the WAITING loop admits it (vLLM 0.32 "
    "scheduler.py:912-1280); after each step the probe records why the head of the queue was "
    "not admitted (head_blocked_by: token_budget, max_num_seqs, kv_cache, preemption, "
    "prefill_limit, deferred). A wait longer than ADMIT_WITHIN_STEPS that no other rule "
    "explains is named with those reasons, so that \"nothing held this run back\" is said "
    "only when it is true.",
    evaluate,
    UnexplainedWaitEvidence,
    (Threshold("ADMIT_WITHIN_STEPS", ADMIT_WITHIN_STEPS, "steps from arrival to the first chunk",
        MEASURED + ": the longest wait in the healthy scenarios is at most 2 steps"),),
    goal=goal, knobs=KNOBS, arithmetic=arithmetic, view=view, step=step, wait="unexplained")
