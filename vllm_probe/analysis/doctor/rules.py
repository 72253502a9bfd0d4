"""The doctor's catalogue: one :class:`~.rule.Rule` per finding id (:data:`CATALOGUE`, in
report order; :data:`RULES` by id): its mechanism in vLLM's code, its thresholds (the named
constants below, with unit and source), ``evaluate`` (the run's state and episodes →
findings with typed evidence, :mod:`.evidence`), its goal and knobs (what ``advice/``
searches), the remedy arithmetic and the lines a view shows.
``python -m vllm_probe.analysis.doctor.rules`` prints docs/doctor.md's rule reference.

Every rule reads the one state (:class:`~vllm_probe.analysis.state.RunState`), its
timeline and the :class:`~vllm_probe.analysis.episodes.Episodes` that followed it, so the
same rules run on a finished run (``vllm-probe doctor``) and on the live state (the
dashboard's findings panel). Rules run per engine core; with several data-parallel ranks
each finding's evidence names its ``engine``. docs/doctor.md lists the thresholds and
one real example of each finding.

Sources cited below: vLLM's tuning guide is docs/configuration/optimization.md
("Preemption", "Chunked Prefill"); SGLang's is docs/advanced_features/hyperparameter_tuning.md
(#queue-req, token usage); the seed notes are /work/shared/seed (§3.4 chunking's KV
re-reads, §5 settings that did not apply); "measured here" means on the CPU engine of
this project (docs/doctor.md gives the runs).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, TypeVar
from collections.abc import Callable

import msgspec

from ..episodes import PRIORITY_WAIT_MIN_STEPS, QUEUE_SHARE_OF_TTFT, SHORT_PROMPT_SHARE, EngineEpisodes, Wait
from ..expected import DIFFERS, NOT_RECORDED, NOT_V1, UNKNOWN
from ..engine_state import EngineState
from ..figures import Distribution, budget_use_counts
from . import limits
from .context import (
    SRC_ASYNC, SRC_SEED_5, SRC_SEED_34, SRC_SGLANG, SRC_VLLM_CHUNKED, SRC_VLLM_PREEMPTION, Context, cdiv,
    engine_of, engines_of, fmt_count, fmt_count_or, fmt_duration, fmt_figure, fmt_pct, pct_range, round_up, rounded,
    wrote,
)
from .evidence import (
    Evidence, PrioritySlotWaitEvidence, PriorityWaitEntry, RunningRequest, UnexplainedWaitEvidence, WaitEntry,
    BoundEvidence, BusiestStep, ChunkingEvidence, ConfigEvidence, HeldSlotsEvidence, HolBlocked, HolEvidence, HolTaker,
    NotCheckedEvidence,
    NotInV1, SettingDiffers, UnknownSetting, StallEvidence, StormEvidence, ThrashEvidence, ThrashRequest,
    UnderloadedEvidence,
    field_docs,
)
from .findings import CRITICAL, INFO, WARNING, Finding, Remedy
from .limits import (
    BOUND_MIN_WAITING_SHARE, BOUND_SHARE, KV_FULL, bound_of, budget_remedy, kv_bound_remedy, kv_remedy, seqs_remedy,
    waiting_steps,
)
from .rule import Goal, Knob, Rule, Threshold

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
#: preemption-thrash: one request preempted at least this many times ...
THRASH_PREEMPTIONS = 3
#: ... or twice with more computed tokens discarded than its prompt has.
THRASH_TWICE_DISCARD_PER_PROMPT = 1.0
#: A request preempted this often is critical: vLLM #25538, a long prefill preempted and
#: resumed every step, never finishes.
THRASH_CRITICAL_PREEMPTIONS = 10
#: Requests listed in preemption-thrash's evidence (most preempted first; the count of all
#: of them is ``repeated_requests``).
THRASH_LISTED = 20
#: head-of-line-blocking: a short request (prompt <= SHORT_PROMPT_SHARE of the budget,
#: episodes.py) waited at least this many steps for its first chunk ...
HOL_MIN_WAIT_STEPS = 3
#: ... with queue time at least QUEUE_SHARE_OF_TTFT of its TTFT (episodes.py) and long
#: requests (prompt > SHORT_PROMPT_SHARE of the budget) taking at least this share of the
#: prefill tokens scheduled meanwhile (measured here: 100 % in the short-behind-long burst).
HOL_TAKER_SHARE = 0.5
#: Long requests named per blocked request (the largest takers).
HOL_TAKERS_SHOWN = 8
#: stall: at least this many steps scheduled nothing while requests waited (in a
#: synchronous scheduler any such step means the head can never run now; measured here:
#: 0 in every healthy run) ...
STALL_MIN_STEPS = 3
#: ... critical when the log ends inside a stall at least this long (the queue never drained).
STALL_CRITICAL_STEPS = 50
#: held-slots: at least this many held steps (an async step whose full running queue holds
#: slots for requests whose last token is in flight while requests wait) ...
HELD_MIN_STEPS = 3
#: ... and at least this share of the async engine's steps with requests waiting (below it
#: the held slots are incidental: a finished request frees its slot one step later anyway).
HELD_MIN_SHARE = 0.2
#: ... and the held slots at least this share of the slots (max_num_seqs per async step with
#: requests waiting): with long outputs one finishing request holds 1 of max_num_seqs slots
#: for one step now and then, a few percent of the capacity; with one-token outputs half of
#: the slots are held (design.md §7: every other step).
HELD_MIN_SLOT_SHARE = 0.1
#: "Nothing held this run back" is said only when every request was admitted within this
#: many steps of arriving (its first prefill chunk); a longer wait that no rule explains is
#: ``unexplained-wait`` (issue 17: the all-clear must be earned). Measured here: the
#: longest wait in the healthy scenarios (light, lone-long-prompt) is at most 2 steps; 32
#: leaves room for a burst admitted a few requests per step.
ADMIT_WITHIN_STEPS = 32
#: Findings that explain a wait (the scheduler held requests back, by a named limit).
EXPLAINS_WAITS = ("stall", "preemption-thrash", "preemption-storm", "head-of-line-blocking", "kv-bound", "seqs-bound",
                  "budget-bound", "held-slots", "priority-slot-wait")
#: chunking-without-benefit is a warning when the steps chunking added are at least this
#: share of the run (else info).
CHUNK_ALONE_WARN_SHARE = 0.05
#: underloaded: requests waited after at most this share of the steps ...
UNDERLOADED_WAITING_SHARE = 0.05
#: ... the median step used at most this share of its token budget ...
UNDERLOADED_BUDGET_USE = 0.25
#: ... over at least this many steps (SGLang's guide: #queue-req 0 frequently: the client
#: sends too slowly).
UNDERLOADED_MIN_STEPS = 50
#: A workload whose requests all arrived before this step is an offline burst
#: (``LLM.generate``: one request before step 0, the rest before step 1, docs/whatif.md).
BURST_STEPS = 1

# -- the rules -------------------------------------------------------------------------------


def preemption_storm(ctx: Context) -> list[Finding]:
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
            basis=(eng, ep)))
    return out


def _interleaved(a: list[int], b: list[int]) -> int:
    """Alternations between two requests' preemption steps (A, B, A, B … counts 3)."""
    seq = sorted([(s, 0) for s in a] + [(s, 1) for s in b])
    return sum(1 for x, y in zip(seq, seq[1:]) if x[1] != y[1])


def preemption_thrash(ctx: Context) -> list[Finding]:
    """One request preempted again and again, or two preempting each other."""
    out = []
    for eng, ep in engines_of(ctx):
        if not wrote(eng, "log_preempt_events"):
            ctx.not_checked["preemption-thrash"] = "preempt events are off (scheduler_probe.log_preempt_events)"
            continue
        cands = [r for r in ep.all_repeated()
                 if r.preemptions >= THRASH_PREEMPTIONS
                 or (r.prompt_len and r.discarded_tokens > THRASH_TWICE_DISCARD_PER_PROMPT * r.prompt_len)]
        if not cands:
            continue
        worst = cands[0]
        pair = None
        for other in cands[1:4]:
            alternations = _interleaved(worst.steps, other.steps)
            if alternations >= 3:
                pair = (other, alternations)
                break
        span = [worst.steps[0], worst.steps[-1]] if worst.steps else None
        ratio = worst.discarded_tokens / worst.prompt_len if worst.prompt_len else None
        if pair is not None:
            other, alternations = pair
            msg = (f"{worst.req_id} and {other.req_id} preempted each other: {worst.preemptions} and "
                   f"{other.preemptions} times (steps "
                   f"{min(worst.steps + other.steps)}-{max(worst.steps + other.steps)}), discarding "
                   f"{fmt_count(worst.discarded_tokens + other.discarded_tokens)} computed tokens against "
                   f"{fmt_count((worst.prompt_len or 0) + (other.prompt_len or 0))} prompt tokens")
        else:
            msg = (f"{worst.req_id} was preempted {worst.preemptions} times"
                   + (f" (steps {span[0]}-{span[1]})" if span else "")
                   + f", discarding {fmt_count(worst.discarded_tokens)} computed tokens"
                   + (f" against its {fmt_count(worst.prompt_len or 0)}-token prompt ({ratio:.1f}×)"
                      if ratio is not None else ""))
        if len(cands) > (2 if pair else 1):
            msg += f"; {len(cands) - (2 if pair else 1)} more request(s) preempted repeatedly"
        evidence = ThrashEvidence(
            engine=engine_of(ctx, eng),
            requests=[ThrashRequest(r.req_id, r.preemptions, list(r.steps), r.discarded_tokens, r.prompt_len,
                                    r.finished)
                      for r in cands[:THRASH_LISTED]],
            repeated_requests=len(cands))
        if pair is not None:
            evidence.pair = [worst.req_id, pair[0].req_id]
            evidence.alternations = pair[1]
        severity = CRITICAL if worst.preemptions >= THRASH_CRITICAL_PREEMPTIONS else WARNING
        out.append(Finding("preemption-thrash", severity, msg, evidence, basis=(eng, ep)))
    return out


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


def head_of_line_blocking(ctx: Context) -> list[Finding]:
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
            basis=HolBasis(eng, budget, waits, takers, names, starts, first, last)))
    return out


@dataclass
class HolBasis:
    """What head-of-line-blocking's arithmetic reads: the engine core, its budget, the
    waits, the long takers ``{req_id: (tokens, prompt_len)}``, their names and first
    chunk steps, and the steps of the waits."""

    eng: Any
    budget: int
    waits: list[Wait]
    takers: dict[str, tuple[int, int | None]]
    names: list[str]
    starts: list[int | None]
    first: int
    last: int


def head_of_line_remedy(ctx: Context, f: Finding) -> Remedy | None:
    """The chunk cap when the long prefills were already running, else the budget that
    admits them and the short ones in one step (or priorities)."""
    b: HolBasis = f.basis
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
                      f"prefill's chunk so the short requests fit beside them (design.md §7: a quarter of the budget "
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
            # (issue 17: 40,960 for a 512 budget): cap the long prefills' chunks instead
            most = BUDGET_MAX_FACTOR * budget
            return Remedy(
                "long_prefill_token_threshold", quarter,
                f"the short requests waited behind the prefills of long requests queued ahead of them; a budget "
                f"holding those prompts ({fmt_count(long_total)} tokens) + the short ones' {fmt_count(short_total)} "
                f"would be {fmt_count(want)}, more than {BUDGET_MAX_FACTOR}× the {fmt_count(budget)}-token budget → "
                f"long_prefill_token_threshold {fmt_count(quarter)} (a quarter of the budget) caps each long prefill's "
                f"chunk so the short requests fit beside them (design.md §7: 2.9 s → 0.86 s short-request queue p90)",
                "the long prompts take more steps to prefill (their own TTFT grows; +61 % worst in design.md §7)",
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


def stall(ctx: Context) -> list[Finding]:
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
        if cause_reason == "deferred" and _held_fires(ep):
            continue  # held-slots names the mechanism (0-token steps are one machine's shape of it)
        head, head_len = (first.head, first.head_prompt_len) if first is not None else (None, None)
        basis: tuple[Any, ...] = ()
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
            need = cdiv(head_len, cfg.block_size)
            usable = cfg.num_kv_blocks - 1
            if need > usable:
                msg += (f"; the head {head} needs {need} blocks for its {fmt_count(head_len)}-token prompt and the KV "
                        f"cache has {usable}: it can never fit")
                basis = ("never_fits", head, head_len, need, usable, cfg.block_size)
        if cause_reason == "deferred" and cfg is not None and (cfg.async_scheduling or
                                                               cfg.scheduler_class == "AsyncScheduler"):
            msg += ("; under async scheduling a finished request keeps its slot one more step, so with short "
                    "outputs every other step admits nobody (raising max_num_seqs does not change it)")
            basis = ("async",)
        if never and open_stall is not None:
            msg += f"; the queue never drained (the log ends {open_stall.steps} steps into it)"
        out.append(Finding("stall", CRITICAL if never else WARNING, msg, StallEvidence(
            engine=engine_of(ctx, eng), stall_steps=runs.steps, first_step=first.first_step if first else None,
            longest=[longest.first_step, longest.last_step], head_blocked_by=reasons, head=head,
            head_prompt_len=head_len, never_drained=never,
            stalls=[[s.first_step, s.last_step] for s in stalls[:5]]), basis=basis))
    return out


def stall_remedy(ctx: Context, f: Finding) -> Remedy | None:
    """A head that can never fit: blocks for its prompt; under async scheduling: async off."""
    if not f.basis:
        return None
    if f.basis[0] == "async":
        return Remedy("async_scheduling", False,
                      "the 0-token steps come from the slot held for the in-flight last token; without async "
                      "scheduling the slot frees in the same step",
                      "without async scheduling the next step is not prepared while the GPU runs this one",
                      SRC_ASYNC)
    _, head, head_len, need, usable, block = f.basis
    return Remedy(
        "num_gpu_blocks_override", need + 1,
        f"{head}'s prompt: ⌈{fmt_count(head_len)} / {block}⌉ = {need} blocks + 1 reserved → "
        f"num_gpu_blocks_override ≥ {need + 1}; or max_model_len ≤ {fmt_count(usable * block)} so that "
        f"vLLM rejects such prompts at once", "more KV blocks take device memory",
        "vLLM issue #39734: a request that fits max_model_len but never the KV cache stalls the queue",
        whatif={"num_kv_blocks": need + 1})


def _held_fires(ep: EngineEpisodes) -> bool:
    """Whether held-slots' thresholds are met on this engine core."""
    h = ep.held
    seqs = ep.eng.config.max_num_seqs if ep.eng.config is not None else None
    return (h.steps >= HELD_MIN_STEPS and bool(h.waiting_steps) and h.steps >= HELD_MIN_SHARE * h.waiting_steps
            and bool(seqs) and h.slot_steps >= HELD_MIN_SLOT_SHARE * (seqs or 0) * h.waiting_steps)


def held_slots(ctx: Context) -> list[Finding]:
    """Under AsyncScheduler: requests wait while running slots are held by requests whose
    last token is in flight (:class:`~vllm_probe.analysis.episodes.HeldSlots`)."""
    out = []
    for eng, ep in engines_of(ctx):
        h = ep.held
        if not wrote(eng, "log_schedule_each_step"):
            continue  # not-checked names the step rules
        if not _held_fires(ep):
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
            head_blocked_by=dict(h.reasons), scheduler_class=cfg.scheduler_class), basis=(eng, ep)))
    return out


def held_slots_remedy(ctx: Context, f: Finding) -> Remedy | None:
    """``async_scheduling`` off; or ``max_num_seqs`` up by the most slots held, within what
    the KV cache holds at full length."""
    e = _ev(f, HeldSlotsEvidence)
    eng, ep = f.basis
    cfg = eng.config
    alternatives = []
    seqs = cfg.max_num_seqs or 0
    want = seqs + e.held_max
    cap = _seqs_cap(eng, ep)
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


def _seqs_cap(eng: Any, ep: EngineEpisodes) -> int | None:
    """The requests the KV cache holds at once at full length (prompt + max_tokens): usable
    blocks // the largest request's blocks at full length; None when unknown."""
    cfg = eng.config
    if cfg is None or not cfg.num_kv_blocks or not ep.full_blocks_max:
        return None
    cap: int = max((cfg.num_kv_blocks - 1) // ep.full_blocks_max, 1)
    return cap


def view_held(f: Finding) -> list[str]:
    e = _ev(f, HeldSlotsEvidence)
    return [f"held steps {_steps(e.step_range)} · slots held max {e.held_max} ({fmt_count(e.held_slot_steps)} "
            f"slot-steps) · running max {e.running_max} of {fmt_count_or(e.max_num_seqs)} · waiting max "
            f"{e.waiting_max}",
            f"tokens per held step {fmt_count(e.tokens_min)}–{fmt_count(e.tokens_max)} (mean {e.tokens_mean:,.0f}) · "
            f"head blocked by {_reasons(e.head_blocked_by)} · {e.scheduler_class or 'scheduler not recorded'}"]


def _waits(ep: EngineEpisodes) -> list[Wait]:
    """Waits, longest first; a request not admitted by the end counts only when the steps of
    its wait say requests waited (head_blocked_by recorded): a hand-made or truncated stream
    may never show a request's first chunk."""
    last = ep.eng.last_step
    return [w for w in ep.all_waits() if w.first_step <= last or w.reasons]


def priority_slot_wait(ctx: Context) -> list[Finding]:
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
            max_num_seqs=cfg.max_num_seqs), basis=(eng, ep)))
    return out


def priority_slot_remedy(ctx: Context, f: Finding) -> Remedy | None:
    """``max_num_seqs`` up by the requests that waited (within what the cache holds at full length)."""
    e = _ev(f, PrioritySlotWaitEvidence)
    eng, ep = f.basis
    seqs = eng.config.max_num_seqs or 0
    add = min(e.requests, len(e.waits)) or 1
    want = seqs + add
    cap = _seqs_cap(eng, ep)
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


def view_priority(f: Finding) -> list[str]:
    e = _ev(f, PrioritySlotWaitEvidence)
    return [f"{w.req_id} (priority {w.priority}) waited {_steps(w.steps)}, {fmt_count(w.slot_steps)} steps with the "
            f"running queue full; running meanwhile: " + ", ".join(f"{r.req_id} (priority {r.priority})"
                                                                   for r in w.lower_priority_running)
            for w in e.waits[:4]]


def _long_waits(ep: EngineEpisodes) -> list[Wait]:
    return [w for w in _waits(ep) if w.steps > ADMIT_WITHIN_STEPS]


def longest_wait_steps(ctx: Context) -> int | None:
    """The longest wait from arrival to the first prefill chunk over the run's engine cores
    (steps; still-waiting requests count their wait so far); None when chunk or request
    events are off (waits are not known)."""
    longest: int | None = None
    for eng, ep in engines_of(ctx):
        if not (wrote(eng, "log_chunk_boundaries") and wrote(eng, "log_request_events")):
            return None
        waits = _waits(ep)
        longest = max(longest or 0, waits[0].steps if waits else 0)
    return longest


def unexplained_wait(ctx: Context) -> list[Finding]:
    """Requests that waited more than :data:`ADMIT_WITHIN_STEPS` steps for their first chunk
    while no finding of :data:`EXPLAINS_WAITS` names what held them: name the head_blocked_by
    reasons over their waits, even if no rule explains why."""
    out = []
    found = ctx.cache.get("found", [])
    for eng, ep in engines_of(ctx):
        if not (wrote(eng, "log_chunk_boundaries") and wrote(eng, "log_request_events")):
            ctx.not_checked["unexplained-wait"] = ("needs chunk and request events "
                                                   "(scheduler_probe.log_chunk_boundaries, log_request_events): how "
                                                   "long requests waited is not known")
            continue
        engine = engine_of(ctx, eng)
        if any(f.id in EXPLAINS_WAITS and f.engine in (engine, None) for f in found):
            continue
        waits = _long_waits(ep)
        if not waits:
            continue
        reasons: dict[str, int] = {}
        for w in waits:
            for k, v in w.reasons.items():
                reasons[k] = reasons.get(k, 0) + v
        last = eng.last_step
        longest = waits[0]
        listed = waits[:TOP_WAITS_LISTED]
        why = (f"; the head of the queue was blocked by {_reasons(reasons)} over their waits" if reasons else
               "; the run records no head_blocked_by for those steps")
        msg = (f"{len(waits)}{'+' if len(waits) >= TOP_WAITS_LISTED else ''} request{'s' if len(waits) != 1 else ''} "
               f"waited more than {ADMIT_WITHIN_STEPS} steps for their first chunk (longest {longest.req_id}, "
               f"{fmt_count(longest.steps)} steps from step {longest.arrival_step}) and no rule explains it{why}")
        out.append(Finding("unexplained-wait", WARNING, msg, UnexplainedWaitEvidence(
            engine=engine, admit_within_steps=ADMIT_WITHIN_STEPS, longest_wait_steps=longest.steps,
            requests=[WaitEntry(w.req_id, w.steps, [w.arrival_step, w.first_step - 1], w.first_step <= last,
                                dict(w.reasons)) for w in listed],
            head_blocked_by=reasons)))
    return out


#: Waits listed in unexplained-wait's evidence (the longest; episodes keep this many).
TOP_WAITS_LISTED = 8


def view_unexplained(f: Finding) -> list[str]:
    e = _ev(f, UnexplainedWaitEvidence)
    out = [f"{w.req_id} waited {fmt_count(w.waited_steps)} steps, {_steps(w.steps)}"
           + ("" if w.admitted else " (still waiting at the end)")
           + (f": head blocked by {_reasons(w.head_blocked_by)}" if w.head_blocked_by else "") for w in e.requests[:4]]
    if e.head_blocked_by:
        out.append("over all of them: " + _reasons(e.head_blocked_by))
    return out


def all_clear(ctx: Context, findings: list[Finding]) -> str | None:
    """The report's line when no finding is above info, earned: said only when every
    request was admitted within :data:`ADMIT_WITHIN_STEPS` steps (else what held them);
    None when a finding is above info."""
    if any(f.severity in (CRITICAL, WARNING) for f in findings):
        return None
    longest = longest_wait_steps(ctx)
    if longest is None:
        return ("No finding above info; how long requests waited is not known (chunk or request events are off), so "
                "whether anything held them back is not checked.")
    if longest <= ADMIT_WITHIN_STEPS:
        return (f"No finding above info: every request was admitted within {ADMIT_WITHIN_STEPS} steps "
                f"(the longest waited {fmt_count(longest)}); nothing held this run back.")
    named = [f.id for f in findings if f.id in EXPLAINS_WAITS]
    return (f"No finding above info, but requests waited up to {fmt_count(longest)} steps for their first chunk"
            + (f": {', '.join(named)} (info) names what held them." if named else "."))


def chunking_without_benefit(ctx: Context) -> list[Finding]:
    """Long prompts chunked while nothing decoded alongside (seed notes §3.4)."""
    out = []
    for eng, ep in engines_of(ctx):
        c = ep.chunked_alone
        cfg = eng.config
        if not c.prompts or cfg is None or not eng.steps or not wrote(eng, "log_schedule_each_step"):
            continue
        share = c.extra_steps / eng.steps
        want = round_up(max(c.longest_prompt, cfg.max_num_batched_tokens or 0), 256)
        if cfg.max_num_batched_tokens:
            want = min(want, BUDGET_MAX_FACTOR * cfg.max_num_batched_tokens)  # within what operators run
        first, last = c.example_steps or (0, 0)  # set with the example
        msg = (f"{c.prompts} prompt{'s were' if c.prompts != 1 else ' was'} cut into chunks while nothing decoded "
               f"alongside: chunking only added {fmt_count(c.extra_steps)} step{'s' if c.extra_steps != 1 else ''} "
               f"({fmt_pct(share)} of the run) and "
               f"{fmt_count(c.reread_tokens)} KV tokens read again; the longest, {c.example} "
               f"({fmt_count(c.longest_prompt)} tokens, steps {first}-{last})")
        out.append(Finding("chunking-without-benefit", WARNING if share >= CHUNK_ALONE_WARN_SHARE else INFO, msg,
                           ChunkingEvidence(
                               engine=engine_of(ctx, eng), prompts=c.prompts, extra_steps=c.extra_steps,
                               share_of_steps=round(share, 4), reread_kv_tokens=c.reread_tokens, example=c.example,
                               example_prompt_len=c.longest_prompt,
                               example_steps=list(c.example_steps) if c.example_steps else None),
                           basis=want))
    return out


def chunking_remedy(ctx: Context, f: Finding) -> Remedy | None:
    """A budget that holds the longest such prompt, rounded up to 256."""
    e = _ev(f, ChunkingEvidence)
    want = f.basis
    if want < e.example_prompt_len:
        text = (f"the longest such prompt ({fmt_count(e.example_prompt_len)} tokens) is more than {BUDGET_MAX_FACTOR}× "
                f"the budget: max_num_batched_tokens {fmt_count(want)} ({BUDGET_MAX_FACTOR}×, the most offered) cuts "
                "it into fewer chunks")
    else:
        text = (f"the longest such prompt ({fmt_count(e.example_prompt_len)} tokens), rounded up to 256 → "
                f"max_num_batched_tokens {fmt_count(want)} prefills it in one step")
    return Remedy("max_num_batched_tokens", want, text,
                  "when requests do decode alongside, a larger budget makes their steps longer (inter-token latency)",
                  SRC_SEED_34 + "; " + SRC_VLLM_CHUNKED, whatif={"max_num_batched_tokens": want})


def config_not_applied(ctx: Context) -> list[Finding]:
    """Expected settings (``--expect``, or what ``run --settings`` recorded) that the
    effective ``engine_config`` contradicts."""
    if not ctx.expected:
        return []
    differs = [c for c in ctx.expected if c.status == DIFFERS]
    unrecorded = [c for c in ctx.expected if c.status == NOT_RECORDED]
    unknown = [c for c in ctx.expected if c.status == UNKNOWN]  # misspelt: vLLM never saw them (issue 17 item 7)
    if not differs and not unknown:
        return []
    src = ctx.expected_source or "the expected settings"
    parts = [f"{c.setting} {_v(c.expected)} expected, {_v(c.effective)} in force" for c in differs]
    parts += [f"{c.setting} is not an engine argument of vLLM"
              + (f" (did you mean {c.suggestion}?)" if c.suggestion else "") for c in unknown]
    n = len(differs) + len(unknown)
    msg = (f"{n} setting{'s' if n != 1 else ''} of {src} did not take effect: " + "; ".join(parts)
           + (" (command-line flags and engine arguments win over config files)" if differs else ""))
    # what the file meant: a misspelt name read as its closest engine argument
    meant = [(c.setting, c.expected) for c in differs] + [(c.suggestion, c.expected) for c in unknown if c.suggestion]
    whatif = {_WHATIF_NAME[name]: value for name, value in meant if name in _WHATIF_NAME}
    misspelt = [(c.suggestion, c.setting) for c in unknown if c.suggestion]
    return [Finding("config-not-applied", WARNING, msg, ConfigEvidence(
        source=src, differs=[SettingDiffers(c.setting, c.expected, c.effective) for c in differs],
        not_recorded=[c.setting for c in unrecorded],
        not_in_v1=[NotInV1(c.setting, c.note) for c in ctx.expected if c.status == NOT_V1],
        unknown=[UnknownSetting(c.setting, c.expected, c.suggestion) for c in unknown] or None),
        basis=(meant, whatif, misspelt, src))]


def config_remedy(ctx: Context, f: Finding) -> Remedy | None:
    """The settings the file meant, passed where they win (the command line); a misspelt
    name is read as vLLM's closest engine argument."""
    meant, whatif, misspelt, src = f.basis
    if not meant:
        return None
    return Remedy(meant[0][0], meant[0][1],
                  "pass " + ", ".join(f"--{name.replace('_', '-')} {_arg(value)}" for name, value in meant)
                  + " on the command line (or in the engine arguments the server reads)"
                  + (f"; in {src}, spell " + ", ".join(f"{good} (not {bad})" for good, bad in misspelt)
                     if misspelt else ""),
                  "none: the run then has the settings the file meant", SRC_SEED_5, whatif=whatif)


#: vLLM engine argument -> ``vllm-probe whatif --set`` name.
_WHATIF_NAME = {"max_num_batched_tokens": "max_num_batched_tokens", "max_num_seqs": "max_num_seqs",
                "num_gpu_blocks_override": "num_kv_blocks", "gpu_memory_utilization": "gpu_memory_utilization",
                "long_prefill_token_threshold": "long_prefill_token_threshold",
                "enable_chunked_prefill": "enable_chunked_prefill", "enable_prefix_caching": "enable_prefix_caching",
                "scheduling_policy": "scheduling_policy"}


def _arg(v: Any) -> str:
    """A value as a command-line flag takes it (``8192``, ``true``)."""
    return str(v).lower() if isinstance(v, bool) else str(v)


def _v(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int):
        return fmt_count(v)
    return str(v)


def underloaded(ctx: Context) -> list[Finding]:
    """The waiting queue stayed empty and the budget mostly unused: not the scheduler."""
    out = []
    for eng, _ep in engines_of(ctx):
        if eng.steps < UNDERLOADED_MIN_STEPS:
            continue
        waited = waiting_steps(eng)
        share = waited / eng.steps
        use = Distribution.of_counts(budget_use_counts([eng.step_tokens]))
        if share > UNDERLOADED_WAITING_SHARE or use.median is None or use.median > UNDERLOADED_BUDGET_USE:
            continue
        waited_text = (f"Requests waited after only {fmt_pct(share)} of {fmt_count(eng.steps)} steps" if waited
                       else f"No request waited in {fmt_count(eng.steps)} steps")
        burst = eng.requests_added and eng.last_arrival_step <= BURST_STEPS
        why = (f"the workload is one burst of {fmt_count(eng.requests_added)} requests, all there from the start: once "
               f"prefilled they only decode, a token each per step; more requests at once would fill the budget"
               if burst else "the client sends too slowly")
        out.append(Finding("underloaded", INFO,
                           f"{waited_text} and the median step used {fmt_pct(use.median)} of the "
                           f"{fmt_count(eng.config.max_num_batched_tokens if eng.config else 0)}-token budget: the "
                           f"scheduler is not the bottleneck ({why})",
                           UnderloadedEvidence(engine=engine_of(ctx, eng), waiting_steps=waited, total_steps=eng.steps,
                                               budget_use_median=rounded(use.median), burst=bool(burst))))
    return out


def not_checked(ctx: Context) -> list[Finding]:
    """What the run's data could not support (flags off, an older probe, lost events)."""
    for eng in ctx.state.engines.values():
        if not wrote(eng, "log_schedule_each_step"):
            for rid in ("kv-bound", "budget-bound", "seqs-bound", "stall", "underloaded", "chunking-without-benefit",
                        "head-of-line-blocking", "held-slots"):
                ctx.not_checked.setdefault(rid, "step events are off (scheduler_probe.log_schedule_each_step)")
        if not wrote(eng, "log_chunk_boundaries"):
            ctx.not_checked.setdefault("chunking-without-benefit",
                                       "chunk events are off (scheduler_probe.log_chunk_boundaries)")
        if eng.events_dropped or eng.hooks_disabled:
            ctx.not_checked.setdefault(
                "all", f"the probe lost {eng.events_dropped} events"
                + (f" and switched off {', '.join(eng.hooks_disabled)}" if eng.hooks_disabled else "")
                + ": counts may be low")
    if not ctx.not_checked:
        return []
    by_why: dict[str, list[str]] = {}
    for rule_id, why in ctx.not_checked.items():
        by_why.setdefault(why, []).append(rule_id)
    return [Finding("not-checked", INFO, "Not checked: " + "; ".join(f"{', '.join(ids)}: {why}"
                                                                     for why, ids in by_why.items()),
                    NotCheckedEvidence(rules=dict(ctx.not_checked)))]


def storm_remedy(ctx: Context, f: Finding) -> Remedy | None:
    """The KV arithmetic of :func:`~.limits.kv_remedy` (peak demand, or the first preemption)."""
    return kv_remedy(*f.basis)


# -- views: the lines a text view shows under a finding's message (no computation) ------------


def _steps(r: list[int] | None) -> str:
    if not r or r[0] is None:
        return "-"
    return f"{r[0]}" if r[0] == r[1] else f"{r[0]}–{r[1]}"


def _reasons(d: dict[str, int]) -> str:
    total = sum(d.values()) or 1
    return ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in sorted(d.items(), key=lambda kv: -kv[1]))


def view_storm(f: Finding) -> list[str]:
    e = _ev(f, StormEvidence)
    out = []
    if e.busiest_steps:
        out.append("busiest steps: " + ", ".join(f"{b.step} ({', '.join(b.preempted[:3])})" for b in e.busiest_steps))
    if e.peak_kv_demand_blocks:
        out.append(f"peak KV demand {fmt_count_or(e.peak_kv_demand_blocks)} blocks for {e.peak_running} running "
                   f"requests at full length; {fmt_count_or(e.usable_kv_blocks)} usable")
    return out


def view_thrash(f: Finding) -> list[str]:
    e = _ev(f, ThrashEvidence)
    requests = e.requests
    out = [f"{r.req_id} ×{r.preemptions} at steps {', '.join(str(s) for s in r.steps[:8])}"
           f"{' …' if len(r.steps) > 8 else ''} (discarded {fmt_count_or(r.discarded_tokens)} tok, "
           f"prompt {fmt_count_or(r.prompt_len)})" for r in requests[:4]]
    rest = requests[4:]
    if rest:
        more = e.repeated_requests - len(requests)
        out.append("and " + ", ".join(f"{r.req_id} ×{r.preemptions}" for r in rest)
                   + (f" (+{more} more: doctor --json)" if more > 0 else ""))
    return out


def view_hol(f: Finding) -> list[str]:
    e = _ev(f, HolEvidence)
    out = [f"{b.req_id} (prompt {fmt_count_or(b.prompt_len)}) waited {b.waited_steps} steps, {_steps(b.steps)}: "
           f"queue {fmt_duration(b.queue_s)} of TTFT {fmt_duration(b.ttft_s)}" for b in e.blocked[:4]]
    for t in e.takers[:4]:
        out.append(f"budget taken by {t.req_id} (prompt {fmt_count_or(t.prompt_len)}): "
                   f"{fmt_count_or(t.prefill_tokens)} prefill tokens" + (f", first chunk at step {t.first_chunk_step}"
                                        if t.first_chunk_step is not None else ""))
    return out


def view_bound(f: Finding) -> list[str]:
    e = _ev(f, BoundEvidence)
    return [f"steps {_steps(e.step_range)} · running max {e.running_max} (mean {e.running_mean:.1f}) · "
            f"waiting max {e.waiting_max} (mean {e.waiting_mean:.1f}) · KV {fmt_figure(e.kv_usage_mean, '%')} "
            f"mean" + (" · inferred from the queues" if e.inferred_from_queues else "")]


def view_stall(f: Finding) -> list[str]:
    e = _ev(f, StallEvidence)
    out = ["stalls at steps " + ", ".join(_steps(s) for s in e.stalls)]
    if e.head_blocked_by:
        out.append("head blocked by " + _reasons(e.head_blocked_by))
    if e.head:
        out.append(f"head {e.head} (prompt {fmt_count_or(e.head_prompt_len)})")
    return out


def view_chunking(f: Finding) -> list[str]:
    e = _ev(f, ChunkingEvidence)
    return [f"e.g. {e.example} ({fmt_count_or(e.example_prompt_len)} tokens), steps {_steps(e.example_steps)}"]


def view_config(f: Finding) -> list[str]:
    e = _ev(f, ConfigEvidence)
    out = [f"{d.setting}: expected {fmt_figure(d.expected)}, in force {fmt_figure(d.effective)}" for d in e.differs]
    if e.not_recorded:
        out.append("not recorded by engine_config (not checked): " + ", ".join(e.not_recorded))
    for n in e.not_in_v1:
        out.append(f"{n.setting}: not a setting of vLLM V1 ({n.note})")
    return out


def view_underloaded(f: Finding) -> list[str]:
    e = _ev(f, UnderloadedEvidence)
    return [f"requests waited after {fmt_count_or(e.waiting_steps)} of {fmt_count_or(e.total_steps)} steps · "
            f"median step {fmt_figure(e.budget_use_median, '%')} of the token budget"
            + (" · one offline burst" if e.burst else "")]


# -- goals and knobs: what a remedy must do, and what it may change (advice/ searches them) ----------


def _int(settings: dict[str, Any], name: str) -> int | None:
    v = settings.get(name)
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else None


def scaled(name: str, factors: tuple[float, ...], lo: int = 1,
           hi_factor: float | None = None) -> Callable[[dict[str, Any], Finding], list[int]]:
    """Candidates ``recorded × factor`` (rounded, distinct, in ``factors`` order), at least
    ``lo`` and at most ``hi_factor ×`` the recorded value; none when it is not recorded."""
    def candidates(settings: dict[str, Any], finding: Finding) -> list[int]:
        base = _int(settings, name)
        if base is None:
            return []
        out: list[int] = []
        for k in factors:
            v = max(round(base * k), lo)
            if hi_factor is not None and v > base * hi_factor:
                continue
            if v != base and v not in out:
                out.append(v)
        return out
    return candidates


#: A budget remedy stays within this many times the recorded budget (issue 17: operators
#: run budgets of the same order; design.md §7: the budget that took every queued prompt
#: at once was ~80× and not a setting anyone runs).
BUDGET_MAX_FACTOR = 8
#: long_prefill_token_threshold candidates, as shares of the budget (design.md §7: ¼ of the
#: budget cut the short requests' queue p90 from 2.9 s to 0.86 s).
LONG_PREFILL_SHARES = (0.5, 0.25, 0.125)


def long_prefill_candidates(settings: dict[str, Any], finding: Finding) -> list[int]:
    """``long_prefill_token_threshold`` at :data:`LONG_PREFILL_SHARES` of the budget."""
    budget = _int(settings, "max_num_batched_tokens")
    if budget is None:
        return []
    current = _int(settings, "long_prefill_token_threshold")
    out = []
    for share in LONG_PREFILL_SHARES:
        v = max(int(budget * share), 1)
        if v not in out and (current is None or v < current):
            out.append(v)
    return out


def seqs_down_candidates(settings: dict[str, Any], finding: Finding) -> list[int]:
    """``max_num_seqs`` below the most requests that really ran at once (× 0.75, 0.5, 0.25,
    0.125, then 2 and 1), not below the configured value: a run whose 3 requests ran under
    ``max_num_seqs`` 64 is not helped by 48 or 32 (measured on the thrash scenario: every
    scaled value of the configured 64 left the storm as it was; 1-2 ended it)."""
    configured = _int(settings, "max_num_seqs")
    basis = finding.basis
    eng = basis[0] if isinstance(basis, tuple) and basis and isinstance(basis[0], EngineState) else None
    peak = eng.running_max if eng is not None else None
    if peak is None and eng is not None and eng.preempt_seen.running_max is not None:
        peak = eng.preempt_seen.running_max + 1  # step events off: running after a preemption, plus its victim
    base = min(v for v in (configured, peak) if v is not None) if (configured or peak) else None
    if base is None:
        return []
    out: list[int] = []
    for v in [round(base * k) for k in (0.75, 0.5, 0.25, 0.125)] + [2, 1]:
        if 1 <= v < base and (configured is None or v < configured) and v not in out:
            out.append(v)
    return sorted(out, reverse=True)


KNOB_SEQS_DOWN = Knob("max_num_seqs", "down", seqs_down_candidates)
def seqs_up_candidates(settings: dict[str, Any], finding: Finding) -> list[int]:
    """``max_num_seqs`` × 1.5, 2, 3, 4, never above what the KV cache holds at full length
    (advice converges: a storm's remedy lowered it to that)."""
    values = scaled("max_num_seqs", (1.5, 2, 3, 4))(settings, finding)
    basis = finding.basis
    cap = _seqs_cap(basis[0], basis[1]) if isinstance(basis, tuple) and len(basis) >= 2 else None
    return [v for v in values if cap is None or v <= cap]


KNOB_SEQS_UP = Knob("max_num_seqs", "up", seqs_up_candidates)
KNOB_BLOCKS_UP = Knob("num_kv_blocks", "up", scaled("num_kv_blocks", (1.25, 1.5, 2, 3, 4)))
KNOB_BUDGET_UP = Knob("max_num_batched_tokens", "up",
                      scaled("max_num_batched_tokens", (1.5, 2, 4, 8), hi_factor=BUDGET_MAX_FACTOR))
KNOB_LONG_PREFILL = Knob("long_prefill_token_threshold", "down", long_prefill_candidates, min_release="0.31")
KNOB_PRIORITY = Knob("scheduling_policy", "set", lambda settings, finding: ["priority"])
KNOB_ASYNC_OFF = Knob("async_scheduling", "set", lambda settings, finding: [False])


def _bound_goal(f: Finding) -> Goal:
    """Queue p90 30 % lower over the requests that waited in the limit's steps (the
    requests the finding is about; over every request, a short limit in a long run is lost
    in the others' queue times: measured on a real run of 160 light requests around an
    8-request storm, queue p90 2.9 ms of all against seconds of the waiting ones)."""
    e = _ev(f, BoundEvidence)
    rng = e.step_range
    return Goal("queue_p90", reduce_by=0.3,
                steps=(int(rng[0]), int(rng[1])) if rng and len(rng) == 2 else None)


def _hol_goal(f: Finding) -> Goal:
    e = _ev(f, HolEvidence)
    return Goal("ttft_p90", reduce_by=0.5, requests=tuple(b.req_id for b in e.blocked))


def _first_of(r: list[int] | None) -> int | None:
    return r[0] if r and isinstance(r[0], int) else None


E = TypeVar("E", bound=Evidence)


def _ev(f: Finding, cls: type[E]) -> E:
    """``f.evidence`` as its rule's type (every finding of a rule carries that type)."""
    e = f.evidence
    assert isinstance(e, cls), (f.id, type(e).__name__)
    return e


def _thrash_step(f: Finding) -> int | None:
    e = _ev(f, ThrashEvidence)
    return e.requests[0].steps[0] if e.requests and e.requests[0].steps else None


def _hol_step(f: Finding) -> int | None:
    e = _ev(f, HolEvidence)
    return e.blocked[0].steps[0] if e.blocked else None


def _bound_step(f: Finding) -> int | None:
    return _first_of(_ev(f, BoundEvidence).step_range)


def _priority_step(f: Finding) -> int | None:
    e = _ev(f, PrioritySlotWaitEvidence)
    return e.waits[0].steps[0] if e.waits else None


def _unexplained_step(f: Finding) -> int | None:
    e = _ev(f, UnexplainedWaitEvidence)
    return e.requests[0].steps[0] if e.requests else None


# -- the catalogue ----------------------------------------------------------------------------------


def _t(name: str, unit: str, source: str) -> Threshold:
    return Threshold(name, globals()[name] if name in globals() else getattr(limits, name), unit, source)


MEASURED = "measured here (docs/doctor.md gives the runs)"

#: The thresholds the three limit rules (kv-, seqs-, budget-bound) share: one limit per
#: engine core is named, from the same waiting steps.
BOUND_THRESHOLDS = (
    Threshold("BOUND_MIN_WAITING_SHARE", BOUND_MIN_WAITING_SHARE, "share of steps", SRC_SGLANG),
    Threshold("BOUND_SHARE", BOUND_SHARE, "share of waiting steps", "the limit that held most"),
)


CATALOGUE: tuple[Rule, ...] = (
    Rule(
        "stall",
        "A step that schedules no token while requests wait. In a synchronous scheduler a step "
        "with anything running schedules its decodes (vLLM 0.32 vllm/v1/core/sched/scheduler.py:659, "
        "Scheduler.schedule's RUNNING loop), so an empty step means the head of the waiting queue "
        "cannot be admitted now: its whole prompt does not fit the free blocks (scheduler.py:1256-1280, "
        "allocate_slots(full_sequence_must_fit=scheduler_reserve_full_isl) fails and the WAITING loop "
        "breaks), or admission was deferred. vLLM #39734: a prompt that fits max_model_len but never "
        "the KV cache stalls the queue for good.",
        stall,
        StallEvidence,
        (_t("STALL_MIN_STEPS", "steps", MEASURED + ": 0 in every healthy run"),
         _t("STALL_CRITICAL_STEPS", "steps", "the queue never drained")),
        goal=lambda f: (Goal("held_slot_steps", reduce_by=0.9) if f.basis and f.basis[0] == "async"
                        else Goal("queue_p90", reduce_by=0.3)),
        knobs=(KNOB_BLOCKS_UP, KNOB_ASYNC_OFF),
        arithmetic=stall_remedy, view=view_stall, step=lambda f: _ev(f, StallEvidence).first_step,
        severity=(CRITICAL, WARNING)),
    Rule(
        "preemption-thrash",
        "vLLM preempts when a running request needs a block and none is free (vLLM 0.32 "
        "scheduler.py:776-841: allocate_slots returns None, then the victim is self.running[-1] under "
        "FCFS, or max(running, key=(priority, arrival_time)) under the priority policy, :795-806). "
        "A victim starts again from scratch on readmission (_preempt_request, :1571-1607: "
        "num_computed_tokens = 0), and, readmitted as the newest running request, it is the next "
        "victim again.",
        preemption_thrash,
        ThrashEvidence,
        (_t("THRASH_PREEMPTIONS", "preemptions of one request", MEASURED),
         _t("THRASH_TWICE_DISCARD_PER_PROMPT", "discarded tokens per prompt token, twice preempted",
            "the work lost exceeds the prompt it had to prefill"),
         _t("THRASH_CRITICAL_PREEMPTIONS", "preemptions of one request",
            "vLLM #25538: a long prefill preempted and resumed every step never finishes")),
        goal=lambda f: Goal("worst_request_preemptions", at_most=1),
        knobs=(KNOB_SEQS_DOWN, KNOB_BLOCKS_UP),
        arithmetic=storm_remedy, view=view_thrash,
        step=_thrash_step,
        severity=(CRITICAL, WARNING)),
    Rule(
        "preemption-storm",
        "Admission reserves only the prompt's blocks (vLLM 0.32 scheduler.py:1256-1280), so running "
        "requests outgrow the cache while they decode; a step that cannot allocate a decode block "
        "preempts (:776-841, allocate_slots → _preempt_request) and the victim's computed tokens are "
        "discarded; on readmission its prompt is recomputed, or served from the prefix cache where "
        "its blocks survived (get_computed_blocks, :1037; vLLM counts those as hits, #25780). A step "
        "that preempts admits nobody (:900, the WAITING loop runs only `if not preempted_reqs`).",
        preemption_storm,
        StormEvidence,
        (_t("STORM_MIN_PREEMPTIONS", "preemptions", "one preemption is an event, not a storm"),
         _t("STORM_PER_100_STEPS", "preemptions per 100 steps",
            MEASURED + ": runs sized for their load preempt 0 times"),
         _t("STORM_DISCARD_SHARE", "share of computed tokens", SRC_VLLM_PREEMPTION),
         _t("STORM_CRITICAL_DISCARD_SHARE", "share of computed tokens", "as much computed work thrown away as kept")),
        goal=lambda f: Goal("preemptions", reduce_by=0.9),
        knobs=(KNOB_SEQS_DOWN, KNOB_BLOCKS_UP),
        arithmetic=storm_remedy, view=view_storm, step=lambda f: _ev(f, StormEvidence).first_step,
        severity=(CRITICAL, WARNING)),
    Rule(
        "head-of-line-blocking",
        "FCFS admits the waiting queue in order within one step's token budget (vLLM 0.32 "
        "scheduler.py: the RUNNING loop spends the budget first, :659, then the WAITING loop, :912), "
        "so short requests queued behind long prompts wait while the long prefills take the budget. "
        "long_prefill_token_threshold caps one request's chunk (:708-709 for running requests, "
        ":1155-1156 for waiting ones; applied when more than one request is eligible, :640-654), so "
        "the short ones fit beside a long prefill; \"short\" is by the tokens left to compute "
        "(prompt minus prefix-cache hit).",
        head_of_line_blocking,
        HolEvidence,
        (Threshold("SHORT_PROMPT_SHARE", SHORT_PROMPT_SHARE, "share of the token budget",
                   "a short request fits any step many times over (episodes.py)"),
         _t("HOL_MIN_WAIT_STEPS", "steps", MEASURED),
         Threshold("QUEUE_SHARE_OF_TTFT", QUEUE_SHARE_OF_TTFT, "share of TTFT", "\"mostly queue time\" (episodes.py)"),
         _t("HOL_TAKER_SHARE", "share of prefill tokens", MEASURED + ": 100 % in short-behind-long")),
        goal=_hol_goal,
        knobs=(KNOB_LONG_PREFILL, KNOB_BUDGET_UP, KNOB_PRIORITY),
        arithmetic=head_of_line_remedy, view=view_hol,
        step=_hol_step),
    Rule(
        "kv-bound",
        "Admission needs the head's whole prompt to fit the free KV blocks (vLLM 0.32 "
        "scheduler.py:1256-1280, allocate_slots(full_sequence_must_fit=scheduler_reserve_full_isl), "
        "0.19+; the WAITING loop breaks when it fails), and FCFS admits nobody behind it: requests "
        "wait with the cache nearly full, or with blocks free that the head's prompt exceeds.",
        lambda ctx: bound_of(ctx, "kv-bound"),
        BoundEvidence,
        (*BOUND_THRESHOLDS,
         Threshold("KV_FULL", KV_FULL, "share of KV blocks", SRC_SGLANG + ": token usage > 0.9 is good utilization")),
        goal=_bound_goal,
        knobs=(KNOB_BLOCKS_UP, KNOB_SEQS_DOWN),
        arithmetic=kv_bound_remedy, view=view_bound, step=_bound_step),
    Rule(
        "seqs-bound",
        "The WAITING loop stops when the running requests reach max_num_seqs (vLLM 0.32 "
        "scheduler.py:921-924: num_running >= self.max_num_active_reqs, which defaults to "
        "max_num_seqs, :129-136): requests wait with the KV cache free.",
        lambda ctx: bound_of(ctx, "seqs-bound"),
        BoundEvidence,
        BOUND_THRESHOLDS,
        goal=_bound_goal,
        knobs=(KNOB_SEQS_UP,),
        arithmetic=seqs_remedy, view=view_bound, step=_bound_step),
    Rule(
        "budget-bound",
        "The step's token budget (max_num_batched_tokens) is spent before the waiting queue is "
        "reached (vLLM 0.32 scheduler.py:659 and :912, both loops run `while token_budget > 0`): a "
        "busy engine.",
        lambda ctx: bound_of(ctx, "budget-bound"),
        BoundEvidence,
        BOUND_THRESHOLDS,
        goal=_bound_goal,
        knobs=(KNOB_BUDGET_UP,),
        arithmetic=budget_remedy, view=view_bound, step=_bound_step,
        severity=(INFO,)),
    Rule(
        "held-slots",
        "Under AsyncScheduler the next step is scheduled before the previous step's output is "
        "processed. A running request whose in-flight tokens already reach its max_tokens is "
        "skipped (vLLM 0.32 scheduler.py:663-678, num_output_placeholders) but stays in "
        "self.running until update_from_output removes it (:2294-2295), one step later; while "
        "it does, it holds one of max_num_seqs slots and the WAITING loop stops at "
        "num_running >= max_num_active_reqs (:921-924). With short outputs many slots are held "
        "at once: steps of 0/4,096 tokens on a busy machine, 3,840/256 on a quiet one "
        "(design.md §7, vLLM #45257).",
        held_slots,
        HeldSlotsEvidence,
        (_t("HELD_MIN_STEPS", "steps", "held steps: at least a few, not one finishing request"),
         _t("HELD_MIN_SHARE", "share of the async steps with requests waiting",
            "below it a finished request's one-step hold is incidental"),
         _t("HELD_MIN_SLOT_SHARE", "share of max_num_seqs × the async steps with requests waiting",
            "long outputs hold a slot for one step in hundreds (a few percent); one-token outputs half of them")),
        goal=lambda f: Goal("held_slot_steps", reduce_by=0.9),
        knobs=(KNOB_ASYNC_OFF, KNOB_SEQS_UP),
        arithmetic=held_slots_remedy, view=view_held,
        step=lambda f: _first_of(_ev(f, HeldSlotsEvidence).step_range)),
    Rule(
        "config-not-applied",
        "The engine ran with settings other than the file meant: command-line flags and engine "
        "arguments win over config files (seed notes §5); engine_config records what was in force.",
        config_not_applied,
        ConfigEvidence,
        goal=lambda f: None,
        arithmetic=config_remedy, view=view_config),
    Rule(
        "chunking-without-benefit",
        "A prompt longer than the budget is cut into chunks (vLLM 0.32 scheduler.py, the WAITING "
        "loop schedules at most the token budget left of a prompt); each later chunk re-reads the KV "
        "of the earlier ones (seed notes §3.4). Chunking pays off only when decodes run beside the "
        "chunks.",
        chunking_without_benefit,
        ChunkingEvidence,
        (_t("CHUNK_ALONE_WARN_SHARE", "share of steps", MEASURED),),
        goal=lambda f: Goal("reread_kv_tokens", reduce_by=0.5),
        knobs=(KNOB_BUDGET_UP,),
        arithmetic=chunking_remedy, view=view_chunking,
        step=lambda f: _first_of(_ev(f, ChunkingEvidence).example_steps),
        severity=(WARNING, INFO)),
    Rule(
        "priority-slot-wait",
        "Under the priority policy the WAITING queue is ordered by (priority, arrival), but a "
        "waiting request gets a slot only when one is free: the WAITING loop stops at "
        "num_running >= max_num_active_reqs (vLLM 0.32 scheduler.py:921-924), and vLLM preempts "
        "only when a request cannot allocate KV blocks (:776-841, the victim being the running "
        "request with the largest (priority, arrival)). A high-priority request therefore waits "
        "behind a full running queue of lower-priority requests.",
        priority_slot_wait,
        PrioritySlotWaitEvidence,
        (Threshold("PRIORITY_WAIT_MIN_STEPS", PRIORITY_WAIT_MIN_STEPS, "steps with the running queue full",
                   "as HOL_MIN_WAIT_STEPS: a few steps, not one finishing request (episodes.py)"),),
        goal=lambda f: Goal("queue_p90", reduce_by=0.5,
                            requests=tuple(w.req_id for w in _ev(f, PrioritySlotWaitEvidence).waits)),
        knobs=(KNOB_SEQS_UP,),
        arithmetic=priority_slot_remedy, view=view_priority,
        step=_priority_step),
    Rule(
        "unexplained-wait",
        "A request waits from its arrival until the WAITING loop admits it (vLLM 0.32 "
        "scheduler.py:912-1280); after each step the probe records why the head of the queue was "
        "not admitted (head_blocked_by: token_budget, max_num_seqs, kv_cache, preemption, "
        "prefill_limit, deferred). A wait longer than ADMIT_WITHIN_STEPS that no other rule "
        "explains is named with those reasons, so that \"nothing held this run back\" is said "
        "only when it is true.",
        unexplained_wait,
        UnexplainedWaitEvidence,
        (_t("ADMIT_WITHIN_STEPS", "steps from arrival to the first chunk",
            MEASURED + ": the longest wait in the healthy scenarios is at most 2 steps"),),
        goal=lambda f: Goal("queue_p90", reduce_by=0.3),
        view=view_unexplained, step=_unexplained_step),
    Rule(
        "underloaded",
        "Requests rarely waited and the median step used little of its budget: the client, not "
        "the scheduler, set the pace (SGLang's guide: #queue-req 0 frequently).",
        underloaded,
        UnderloadedEvidence,
        (_t("UNDERLOADED_WAITING_SHARE", "share of steps", SRC_SGLANG),
         _t("UNDERLOADED_BUDGET_USE", "share of the token budget", SRC_SGLANG),
         _t("UNDERLOADED_MIN_STEPS", "steps", "too short a run says nothing"),
         _t("BURST_STEPS", "steps", "an offline LLM.generate burst arrives before step 1 (docs/whatif.md)")),
        view=view_underloaded, severity=(INFO,)),
    Rule(
        "not-checked",
        "What the run's data could not support: events switched off, an older probe without "
        "head_blocked_by, or events the probe dropped.",
        not_checked,
        NotCheckedEvidence,
        severity=(INFO,)),  # last: the others note what they could not check
)

#: The rules by finding id.
RULES: dict[str, Rule] = {r.id: r for r in CATALOGUE}
#: Every finding id, in report order (a public interface).
FINDING_IDS: tuple[str, ...] = tuple(r.id for r in CATALOGUE)


def _type_name(t: Any) -> str:
    return getattr(t, "__name__", None) or str(t).replace("typing.", "")


#: Markers around the generated reference in docs/doctor.md.
REFERENCE_BEGIN = ("<!-- rule reference: generated by `python -m vllm_probe.analysis.doctor.rules`; "
                   "do not edit by hand -->")
REFERENCE_END = "<!-- end of the rule reference -->"


def reference() -> str:
    """docs/doctor.md's rule reference: per rule, its mechanism, thresholds (value, unit,
    source), the knobs a remedy may change, and its evidence fields with their type and
    meaning (from :mod:`.evidence`'s docstrings), between :data:`REFERENCE_BEGIN` and
    :data:`REFERENCE_END`."""
    out = [REFERENCE_BEGIN, ""]
    seen: set[type] = set()
    for rule in CATALOGUE:
        out.append(f"### Rule `{rule.id}` ({', '.join(rule.severity)})")
        out.append("")
        out.append(rule.mechanism)
        out.append("")
        if rule.thresholds:
            out.append("| threshold | value | unit | source |")
            out.append("|---|---|---|---|")
            for t in rule.thresholds:
                out.append(f"| `{t.name}` | {t.value:g} | {t.unit} | {t.source} |")
            out.append("")
        if rule.knobs:
            out.append("Knobs: " + ", ".join(f"`{k.setting}` ({k.direction})" for k in rule.knobs) + ".")
            out.append("")
        ev = rule.evidence
        if ev is None:
            continue
        out.append(f"Evidence (`{ev.__name__}`):")
        out.append("")
        _fields(ev, out, seen)
    out.append(REFERENCE_END)
    return "\n".join(out) + "\n"


def _fields(ev: type, out: list[str], seen: set[type]) -> None:
    docs = field_docs(ev)
    nested: list[type] = []
    out.append("| field | type | meaning |")
    out.append("|---|---|---|")
    info = msgspec.inspect.type_info(ev)
    assert isinstance(info, msgspec.inspect.StructType)
    for fld in info.fields:
        t = fld.type
        out.append(f"| `{fld.encode_name}` | {_describe(t, nested)} | {docs.get(fld.name, '')} |")
    out.append("")
    for sub in nested:
        if sub in seen:
            continue
        seen.add(sub)
        out.append(f"`{sub.__name__}` (its entries):")
        out.append("")
        _fields(sub, out, seen)


def _describe(t: Any, nested: list[type]) -> str:
    mi = msgspec.inspect
    if isinstance(t, mi.UnionType):
        parts = [_describe(x, nested) for x in t.types if not isinstance(x, mi.NoneType)]
        return " \\| ".join(parts) + (" or null" if t.includes_none else "")
    if isinstance(t, mi.ListType):
        return f"list of {_describe(t.item_type, nested)}"
    if isinstance(t, mi.DictType):
        return f"object of {_describe(t.value_type, nested)}"
    if isinstance(t, mi.StructType):
        if t.cls not in nested:
            nested.append(t.cls)
        return f"`{t.cls.__name__}`"
    names: dict[type, str] = {mi.IntType: "int", mi.FloatType: "float", mi.StrType: "string", mi.BoolType: "bool",
                              mi.AnyType: "any"}
    return names.get(type(t), type(t).__name__)


if __name__ == "__main__":
    sys.stdout.write(reference())
