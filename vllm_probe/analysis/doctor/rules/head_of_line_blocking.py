"""``head-of-line-blocking``: short requests whose time to first token is mostly queue time
while long prefills take the token budget.

FCFS admits the waiting queue in order within one step's token budget, so short requests
queued behind long prompts wait while the long prefills take the budget;
``long_prefill_token_threshold`` caps one request's chunk so the short ones fit beside it.
"Short" is by the tokens left to compute (prompt minus prefix-cache hit).
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...episodes import QUEUE_SHARE_OF_TTFT, SHORT_PROMPT_SHARE, EngineEpisodes
from ...episode_types import Wait
from ..context import (
    MEASURED, SRC_VLLM_CHUNKED, Context, engine_of, engines_of, pct_range, round_up, rounded, steps_text, wrote,
)
from ...text import fmt_count, fmt_count_or, fmt_duration, fmt_pct
from ..evidence import Evidence
from ..findings import WARNING, EngineBasis, Finding, Remedy, basis_of, evidence_of
from ..knobs import BUDGET_MAX_FACTOR, KNOB_BUDGET_UP, recorded_int
from ..rule import Goal, Knob, Rule, Threshold

# -- thresholds ----------------------------------------------------------------------------

#: head-of-line-blocking: a short request (prompt <= SHORT_PROMPT_SHARE of the budget,
#: episodes.py) waited at least this many steps for its first chunk ...
HOL_MIN_WAIT_STEPS = 3
#: ... with queue time at least QUEUE_SHARE_OF_TTFT of its TTFT (episodes.py) and long
#: requests (prompt > SHORT_PROMPT_SHARE of the budget) taking at least this share of the
#: prefill tokens scheduled meanwhile (measured here: 100 % in the short-behind-long burst).
HOL_TAKER_SHARE = 0.5
#: Long requests named per blocked request (the largest takers).
HOL_TAKERS_SHOWN = 8


class HolBlocked(msgspec.Struct):
    """A short request that waited behind long prefills.

    Attributes:
        req_id: the request.
        prompt_len: its prompt (tokens).
        waited_steps: steps from arrival to its first chunk.
        steps: the steps it waited, ``[arrival step, first chunk step - 1]``.
        queue_s: its queue time (s).
        ttft_s: its time to first token (s).
        queue_share: queue_s / ttft_s (0..1).
        head_blocked_by: steps per head_blocked_by reason while it waited.
        prefix_hit_tokens: of its prompt, tokens served by the prefix cache (it is short by the tokens left to compute:
            prompt_len - prefix_hit_tokens).
    """

    req_id: str
    prompt_len: int | None
    waited_steps: int
    steps: list[int]
    queue_s: float | None
    ttft_s: float | None
    queue_share: float | None
    head_blocked_by: dict[str, int]
    prefix_hit_tokens: int = 0


class HolTaker(msgspec.Struct):
    """A long request whose prefill took the budget meanwhile.

    Attributes:
        req_id: the request.
        prompt_len: its prompt (tokens).
        prefill_tokens: prefill tokens it was scheduled while the short requests waited.
        first_chunk_step: step of its first prefill chunk; null when not seen.
    """

    req_id: str
    prompt_len: int | None
    prefill_tokens: int
    first_chunk_step: int | None


class HolEvidence(Evidence, kw_only=True):
    """``head-of-line-blocking``: short requests queue behind long prefills.

    Attributes:
        blocked: the short requests that waited (up to 8).
        takers: the long requests that took the prefill budget meanwhile.
        taken_share: the long requests' share of the prefill tokens scheduled meanwhile (0..1).
        short_requests_blocked: short requests whose time to first token was mostly queue time, in all.
        complete: the chunk ring held every step of the waits (false: takers may be missing).
    """

    blocked: list[HolBlocked]
    takers: list[HolTaker]
    taken_share: float
    short_requests_blocked: int
    complete: bool


class HolBasis(EngineBasis, kw_only=True):
    """What head-of-line-blocking's arithmetic reads beside the engine core.

    Attributes:
        budget: the token budget (tokens).
        waits: the short requests' waits.
        takers: the long takers, ``{req_id: (prefill tokens taken, prompt_len)}``.
        names: the takers' ids, most tokens first.
        starts: their first chunk steps, in ``names`` order (None: not seen).
        first: the first step of the waits.
        last: their last step.
    """

    budget: int
    waits: list[Wait]
    takers: dict[str, tuple[int, int | None]]
    names: list[str]
    starts: list[int | None]
    first: int
    last: int


def _blocked_victims(ep: EngineEpisodes, budget: int,
                     ) -> list[tuple[Wait, list[tuple[str, int, int | None]], int, int, bool]]:
    """Short requests whose wait was mostly queue time while long requests' prefills took
    the budget: ``(wait, long takers [(req_id, tokens, prompt_len)], their tokens, all
    prefill tokens of the wait, complete)``."""
    long_min = SHORT_PROMPT_SHARE * budget
    out = []
    for w in ep.blocked_short.items():
        if w.steps < HOL_MIN_WAIT_STEPS:
            continue
        takers, total, complete = ep.takers(w.arrival_step, w.first_step, exclude=w.req_id, n=HOL_TAKERS_SHOWN)
        long_takers = [t for t in takers if (t[2] or 0) > long_min]
        taken = sum(t[1] for t in long_takers)
        if not total or taken < HOL_TAKER_SHARE * total:
            continue
        out.append((w, long_takers, taken, total, complete))
    return out


def evaluate(ctx: Context) -> list[Finding]:
    """Short requests whose time to first token is mostly queue time while long prefills
    take the budget."""
    out = []
    for eng, ep in engines_of(ctx):
        cfg = eng.config
        if cfg is None or not cfg.max_num_batched_tokens:
            continue
        if not (wrote(eng, "log_chunk_boundaries") and wrote(eng, "log_request_events")
                and wrote(eng, "log_schedule_each_step")):
            ctx.not_checked["head-of-line-blocking"] = (
                "needs step, chunk and request events (scheduler_probe.log_schedule_each_step, "
                "log_chunk_boundaries, log_request_events)")
            continue
        budget = cfg.max_num_batched_tokens
        victims = _blocked_victims(ep, budget)
        if not victims:
            continue
        waits = [v[0] for v in victims]
        takers: dict[str, tuple[int, int | None]] = {}
        for _, long_takers, _, _, _ in victims:
            for rid, tokens, plen in long_takers:
                if rid not in takers or tokens > takers[rid][0]:
                    takers[rid] = (tokens, plen)
        taken = max(v[2] for v in victims)
        total = max(v[3] for v in victims)
        shares = [w.queue_share for w in waits if w.queue_share is not None]
        short_prompts = sorted({w.prompt_len for w in waits if w.prompt_len is not None})
        warm = [w for w in waits if w.hit_tokens]
        first, last = min(w.arrival_step for w in waits), max(w.first_step for w in waits) - 1
        names = sorted(takers, key=lambda r: -takers[r][0])
        long_prompts = sorted({p for _, p in takers.values() if p})
        if len(names) == 1:
            who = f"{names[0]}'s {fmt_count(long_prompts[0]) + '-token ' if long_prompts else ''}prefill"
        else:
            who = (f"the prefills of {len(names)} long requests ({'/'.join(fmt_count(p) for p in long_prompts)}-token "
                   f"prompts: {', '.join(names[:3])}{' …' if len(names) > 3 else ''})")
        msg = (f"{len(waits)} short request{'s' if len(waits) != 1 else ''} "
               f"({'/'.join(fmt_count(p) for p in short_prompts)}-token prompts) waited up to "
               f"{max(w.steps for w in waits)} steps for their first chunk while {who} took {fmt_pct(taken / total)} "
               f"of the prefill tokens (steps {first}-{last}); queue time was {pct_range(shares)} of their time to "
               "first token")
        if warm:
            msg += (f"; {len(warm)} of them cache-warm ({'/'.join(fmt_count(w.to_compute or 0) for w in warm)} tokens "
                    f"left to compute after prefix-cache hits)")
        if ep.blocked_short_count > len(waits):
            msg += f" ({ep.blocked_short_count} short requests waited mostly in the queue in all)"
        starts = ep.first_chunk_steps(names)
        out.append(Finding("head-of-line-blocking", WARNING, msg, HolEvidence(
            engine=engine_of(ctx, eng),
            blocked=[HolBlocked(w.req_id, w.prompt_len, w.steps, [w.arrival_step, w.first_step - 1], rounded(w.queue_s),
                                rounded(w.ttft_s), rounded(w.queue_share), dict(w.reasons), w.hit_tokens)
                     for w in waits],
            takers=[HolTaker(rid, takers[rid][1], takers[rid][0], st) for rid, st in zip(names, starts)],
            taken_share=round(taken / total, 4), short_requests_blocked=ep.blocked_short_count,
            complete=all(v[4] for v in victims)),
            basis=HolBasis(eng=eng, ep=ep, budget=budget, waits=waits, takers=takers, names=names, starts=starts,
                           first=first, last=last)))
    return out


def arithmetic(ctx: Context, f: Finding) -> Remedy | None:
    """The chunk cap when the long prefills were already running, else the budget that
    admits them and the short ones in one step (or priorities)."""
    b = basis_of(f, HolBasis)
    eng, budget, waits, takers, starts, first, last = b.eng, b.budget, b.waits, b.takers, b.starts, b.first, b.last
    # the long requests ran before the short ones arrived (a running long prefill: a chunk
    # cap lets the short ones in beside it) or were queued ahead of them (then only a larger
    # budget, or priority, gets the short ones in sooner)
    arrived = min(w.arrival_step for w in waits)
    running_before = all(s is not None and s < arrived for s in starts)
    short_total = sum(w.to_compute or 0 for w in waits)
    quarter = max(budget // 4, 1)
    long_prefill_alt = {
        "setting": "long_prefill_token_threshold", "value": quarter,
        "whatif": {"long_prefill_token_threshold": quarter},
        "arithmetic": f"a quarter of the budget ({fmt_count(budget)} // 4 = {fmt_count(quarter)}) caps each long "
                      f"prefill's chunk so the short requests fit beside them (measured: a quarter of the budget "
                      f"cut the short requests' queue p90 from 2.9 s to 0.86 s)"}
    priority_alt = {"setting": "scheduling_policy", "value": "priority", "whatif": {"scheduling_policy": "priority"},
                    "arithmetic": "send short requests with a higher priority (a lower priority value)"}
    if running_before:
        cap = max(budget - short_total, budget // 2)
        remedy = Remedy(
            "long_prefill_token_threshold", cap,
            f"budget {fmt_count(budget)} − the waiting short prompts ({fmt_count(short_total)} tokens) = "
            f"{fmt_count(budget - short_total)} (at least half the budget) → long_prefill_token_threshold "
            f"{fmt_count(cap)} caps the long prefill chunks so the short requests fit beside them (vLLM 0.31+: applied "
            "when more than one request is eligible)",
            "the long prompts take more steps to prefill (their own TTFT grows)", SRC_VLLM_CHUNKED,
            whatif={"long_prefill_token_threshold": cap})
    else:
        # running requests decode one token each in the same step: the budget holds them too
        decodes = max((sp.running_max for sp in eng.timeline if sp.first_step <= last and sp.last_step >= first),
                      default=0)
        # whole prompts, not the tokens they took here: in one larger step the long
        # prompts are prefilled together, before any of them can hit the prefix cache
        long_total = sum(plen or tokens for tokens, plen in takers.values())
        want = round_up(long_total + short_total + decodes, 256)
        if want > BUDGET_MAX_FACTOR * budget:
            # a budget that takes every queued prompt at once is far beyond what operators run
            # (40,960 for a 512 budget, measured): cap the long prefills' chunks instead
            most = BUDGET_MAX_FACTOR * budget
            return Remedy(
                "long_prefill_token_threshold", quarter,
                f"the short requests waited behind the prefills of long requests queued ahead of them; a budget "
                f"holding those prompts ({fmt_count(long_total)} tokens) + the short ones' {fmt_count(short_total)} "
                f"would be {fmt_count(want)}, more than {BUDGET_MAX_FACTOR}× the {fmt_count(budget)}-token budget → "
                f"long_prefill_token_threshold {fmt_count(quarter)} (a quarter of the budget) caps each long prefill's "
                f"chunk so the short requests fit beside them (measured: 2.9 s → 0.86 s short-request queue p90)",
                "the long prompts take more steps to prefill (their own TTFT grows; +61 % worst, measured)",
                SRC_VLLM_CHUNKED, whatif={"long_prefill_token_threshold": quarter},
                alternatives=[{"setting": "max_num_batched_tokens", "value": most,
                               "whatif": {"max_num_batched_tokens": most},
                               "arithmetic": f"the largest budget offered, {BUDGET_MAX_FACTOR}× the recorded one"},
                              priority_alt])
        remedy = Remedy(
            "max_num_batched_tokens", want,
            f"the short requests waited behind the prefills of long requests queued ahead of them; their prompts "
            f"({fmt_count(long_total)} tokens) + the short ones' {fmt_count(short_total)} + {fmt_count(decodes)} "
            f"decode token{'s' if decodes != 1 else ''} of the requests running meanwhile, rounded up to 256 → "
            f"max_num_batched_tokens {fmt_count(want)} admits them in the same step",
            "larger steps: running decodes wait longer per token (inter-token latency)", SRC_VLLM_CHUNKED,
            whatif={"max_num_batched_tokens": want},
            alternatives=[long_prefill_alt, priority_alt])
    return remedy


def goal(f: Finding) -> Goal:
    """The blocked short requests' TTFT p90 halved; the long requests' TTFT p90 is watched (a
    chunk cap slows them down)."""
    e = evidence_of(f, HolEvidence)
    longs = tuple(t.req_id for t in e.takers)
    return Goal("ttft_p90", reduce_by=0.5, requests=tuple(b.req_id for b in e.blocked),
                watch=((f"the {len(longs)} long requests", longs),) if longs else ())


def step(f: Finding) -> int | None:
    """The first blocked request's arrival."""
    e = evidence_of(f, HolEvidence)
    return e.blocked[0].steps[0] if e.blocked else None


def view(f: Finding) -> list[str]:
    """The blocked short requests, then the long requests that took the budget."""
    e = evidence_of(f, HolEvidence)
    out = [f"{b.req_id} (prompt {fmt_count_or(b.prompt_len)}) waited {b.waited_steps} steps, {steps_text(b.steps)}: "
           f"queue {fmt_duration(b.queue_s)} of TTFT {fmt_duration(b.ttft_s)}" for b in e.blocked[:4]]
    for t in e.takers[:4]:
        out.append(f"budget taken by {t.req_id} (prompt {fmt_count_or(t.prompt_len)}): "
                   f"{fmt_count_or(t.prefill_tokens)} prefill tokens" + (f", first chunk at step {t.first_chunk_step}"
                                        if t.first_chunk_step is not None else ""))
    return out


# -- knobs ------------------------------------------------------------------------------------

#: long_prefill_token_threshold candidates, as shares of the budget (measured: ¼ of the
#: budget cut the short requests' queue p90 from 2.9 s to 0.86 s).
LONG_PREFILL_SHARES = (0.5, 0.25, 0.125)
#: Thresholds are offered in multiples of this many tokens.
LONG_PREFILL_STEP = 16


def threshold_room(settings: dict[str, Any], finding: Finding) -> int | None:
    """The largest ``long_prefill_token_threshold`` that lets the short requests in beside
    the long prefills: the long requests' chunks together must leave the shortest room for
    the longest short prompt, ``(budget − short) // long requests`` (tokens; rounded down to
    :data:`LONG_PREFILL_STEP`). With eight long prompts under a 512-token budget, 64 lets
    them fill it: measured, the short requests' TTFT fell 47 % instead of the 50 % sought.
    None when the finding names no long request."""
    budget = recorded_int(settings, "max_num_batched_tokens")
    if budget is None or not isinstance(finding.evidence, HolEvidence) or not finding.evidence.takers:
        return None
    e = finding.evidence
    short = max(((b.prompt_len or 0) - b.prefix_hit_tokens for b in e.blocked), default=0)
    room = (budget - short) // len(e.takers)
    return room // LONG_PREFILL_STEP * LONG_PREFILL_STEP


def long_prefill_candidates(settings: dict[str, Any], finding: Finding) -> list[int]:
    """``long_prefill_token_threshold`` at :data:`LONG_PREFILL_SHARES` of the budget, none
    above :func:`threshold_room` (the mechanism's bound), that bound first when it is a smaller
    change than every share (a larger cap); none at all when it leaves less than
    :data:`LONG_PREFILL_STEP` tokens (a cap cannot get the short requests in: the budget or
    priorities can)."""
    budget = recorded_int(settings, "max_num_batched_tokens")
    if budget is None:
        return []
    current = recorded_int(settings, "long_prefill_token_threshold")
    room = threshold_room(settings, finding)
    if room is not None and room < LONG_PREFILL_STEP:
        return []
    out = []
    for share in LONG_PREFILL_SHARES:
        v = max(int(budget * share), 1)
        if v not in out and (current is None or v < current) and (room is None or v <= room):
            out.append(v)
    if room is not None and room not in out and (current is None or room < current) and (
            not out or out[0] < room):
        out.insert(0, room)
    return out


#: ``long_prefill_token_threshold`` down: the long prefills' chunks leave room for the short requests.
KNOB_LONG_PREFILL = Knob("long_prefill_token_threshold", "down", long_prefill_candidates, min_release="0.31")
#: The priority policy: short requests sent with a higher priority.
KNOB_PRIORITY = Knob("scheduling_policy", "set", lambda settings, finding: ["priority"])


RULE = Rule(
    "head-of-line-blocking",
    "FCFS admits the waiting queue in order within one step's token budget (vLLM 0.32 "
    "scheduler.py: the RUNNING loop spends the budget first, :659, then the WAITING loop, :912), "
    "so short requests queued behind long prompts wait while the long prefills take the budget. "
    "long_prefill_token_threshold caps one request's chunk (:708-709 for running requests, "
    ":1155-1156 for waiting ones; applied when more than one request is eligible, :640-654), so "
    "the short ones fit beside a long prefill; \"short\" is by the tokens left to compute "
    "(prompt minus prefix-cache hit).",
    evaluate,
    HolEvidence,
    (Threshold("SHORT_PROMPT_SHARE", SHORT_PROMPT_SHARE, "share of the token budget",
               "a short request fits any step many times over (episodes.py)"),
     Threshold("HOL_MIN_WAIT_STEPS", HOL_MIN_WAIT_STEPS, "steps", MEASURED),
     Threshold("QUEUE_SHARE_OF_TTFT", QUEUE_SHARE_OF_TTFT, "share of TTFT", "\"mostly queue time\" (episodes.py)"),
     Threshold("HOL_TAKER_SHARE", HOL_TAKER_SHARE, "share of prefill tokens",
               MEASURED + ": 100 % in short-behind-long")),
    goal=goal,
    knobs=(KNOB_LONG_PREFILL, KNOB_BUDGET_UP, KNOB_PRIORITY),
    arithmetic=arithmetic, view=view, step=step, wait="explains")
