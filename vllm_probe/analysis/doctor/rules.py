"""The doctor's catalogue: one rule per finding id, each a function of the run's state and
episodes returning findings; the thresholds as named constants with their source.

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

from typing import Any, Callable

from ..episodes import SHORT_PROMPT_SHARE, EngineEpisodes, Wait
from ..expected import DIFFERS, NOT_RECORDED, NOT_V1
from ..figures import Distribution, budget_use_counts
from .context import (
    SRC_ASYNC, SRC_SEED_5, SRC_SEED_34, SRC_VLLM_CHUNKED, Context, cdiv, engine_evidence, engines_of, fmt_count,
    fmt_pct, pct_range, round_up, rounded, wrote,
)
from .findings import CRITICAL, INFO, WARNING, Finding, Remedy
from .limits import bound, kv_remedy, waiting_steps

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
        if (per_100 is None or per_100 < STORM_PER_100_STEPS) and share < STORM_DISCARD_SHARE:
            continue
        busiest = [{"step": step, "preempted": victims} for step, victims in ep.preempting_steps.items()[:3]]
        first = ep.first_preempt[0] if ep.first_preempt else (busiest[0]["step"] if busiest else None)
        rate = (f"in {fmt_count(eng.steps)} steps ({per_100:.1f} per 100 steps, {fmt_count(eng.requests_preempted)} requests)"
                if per_100 is not None else f"({fmt_count(eng.requests_preempted)} requests)")
        of_what = ("of the tokens the engine computed" if eng.scheduled_tokens else
                   "of the prompt tokens it prefilled (decode tokens are not known with step events off)")
        msg = (f"{fmt_count(n)} preemptions {rate}"
               + (f" threw away {fmt_count(eng.discarded_tokens)} computed tokens, {fmt_pct(share)} {of_what}"
                  if eng.discarded_tokens else "") + (f"; the first at step {first}" if first is not None else "")
               + (f"; recompute tax {fmt_pct(eng.recompute_tax)}" if eng.recompute_tax else ""))
        out.append(Finding(
            "preemption-storm", CRITICAL if share >= STORM_CRITICAL_DISCARD_SHARE else WARNING, msg,
            {**engine_evidence(ctx, eng), "preemptions": n, "requests": eng.requests_preempted,
             "per_100_steps": round(per_100, 2) if per_100 is not None else None, "discarded_tokens": eng.discarded_tokens, "computed_tokens": work,
             "discarded_share": round(share, 4), "first_step": first, "busiest_steps": busiest,
             "recompute_tax": round(eng.recompute_tax, 4) if eng.recompute_tax is not None else None,
             "peak_kv_demand_blocks": ep.peak_demand_blocks or None, "peak_running": ep.peak_running or None,
             "usable_kv_blocks": (eng.config.num_kv_blocks - 1) if eng.config and eng.config.num_kv_blocks else None},
            kv_remedy(eng, ep)))
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
                   f"{other.preemptions} times (steps {min(worst.steps + other.steps)}-{max(worst.steps + other.steps)}), "
                   f"discarding {fmt_count(worst.discarded_tokens + other.discarded_tokens)} computed tokens against "
                   f"{fmt_count((worst.prompt_len or 0) + (other.prompt_len or 0))} prompt tokens")
        else:
            msg = (f"{worst.req_id} was preempted {worst.preemptions} times"
                   + (f" (steps {span[0]}-{span[1]})" if span else "")
                   + f", discarding {fmt_count(worst.discarded_tokens)} computed tokens"
                   + (f" against its {fmt_count(worst.prompt_len)}-token prompt ({ratio:.1f}×)" if ratio is not None else ""))
        if len(cands) > (2 if pair else 1):
            msg += f"; {len(cands) - (2 if pair else 1)} more request(s) preempted repeatedly"
        evidence = {**engine_evidence(ctx, eng), "requests": [
            {"req_id": r.req_id, "preemptions": r.preemptions, "steps": r.steps, "discarded_tokens": r.discarded_tokens,
             "prompt_len": r.prompt_len, "finished": r.finished} for r in cands[:THRASH_LISTED]],
            "repeated_requests": len(cands)}
        if pair is not None:
            evidence["pair"] = [worst.req_id, pair[0].req_id]
            evidence["alternations"] = pair[1]
        severity = CRITICAL if worst.preemptions >= THRASH_CRITICAL_PREEMPTIONS else WARNING
        out.append(Finding("preemption-thrash", severity, msg, evidence, kv_remedy(eng, ep)))
    return out


def _blocked_victims(ep: EngineEpisodes, budget: int) -> list[tuple[Wait, list, int, int, bool]]:
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
        first, last = min(w.arrival_step for w in waits), max(w.first_step for w in waits) - 1
        names = sorted(takers, key=lambda r: -takers[r][0])
        long_prompts = sorted({p for _, p in takers.values() if p})
        if len(names) == 1:
            who = f"{names[0]}'s {fmt_count(long_prompts[0]) + '-token ' if long_prompts else ''}prefill"
        else:
            who = (f"the prefills of {len(names)} long requests ({'/'.join(fmt_count(p) for p in long_prompts)}-token prompts: "
                   f"{', '.join(names[:3])}{' …' if len(names) > 3 else ''})")
        msg = (f"{len(waits)} short request{'s' if len(waits) != 1 else ''} "
               f"({'/'.join(fmt_count(p) for p in short_prompts)}-token prompts) waited up to {max(w.steps for w in waits)} "
               f"steps for their first chunk while {who} took {fmt_pct(taken / total)} of the prefill tokens "
               f"(steps {first}-{last}); queue time was {pct_range(shares)} of their time to first token")
        if ep.blocked_short_count > len(waits):
            msg += f" ({ep.blocked_short_count} short requests waited mostly in the queue in all)"
        # the long requests ran before the short ones arrived (a running long prefill: a chunk
        # cap lets the short ones in beside it) or were queued ahead of them (then only a larger
        # budget, or priority, gets the short ones in sooner)
        starts = ep.first_chunk_steps(names)
        arrived = min(w.arrival_step for w in waits)
        running_before = all(s is not None and s < arrived for s in starts)
        short_total = sum(w.prompt_len or 0 for w in waits)
        if running_before:
            cap = max(budget - short_total, budget // 2)
            remedy = Remedy(
                "long_prefill_token_threshold", cap,
                f"budget {fmt_count(budget)} − the waiting short prompts ({fmt_count(short_total)} tokens) = {fmt_count(budget - short_total)}"
                f" (at least half the budget) → long_prefill_token_threshold {fmt_count(cap)} caps the long prefill chunks so "
                f"the short requests fit beside them (vLLM 0.31+: applied when more than one request is eligible)",
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
            remedy = Remedy(
                "max_num_batched_tokens", want,
                f"the short requests waited behind the prefills of long requests queued ahead of them; their prompts "
                f"({fmt_count(long_total)} tokens) + the short ones' {fmt_count(short_total)} + {fmt_count(decodes)} "
                f"decode token{'s' if decodes != 1 else ''} of the requests running meanwhile, rounded up to 256 → "
                f"max_num_batched_tokens {fmt_count(want)} admits them in the same step",
                "larger steps: running decodes wait longer per token (inter-token latency)", SRC_VLLM_CHUNKED,
                whatif={"max_num_batched_tokens": want},
                alternatives=[{"setting": "scheduling_policy", "value": "priority", "whatif": {"scheduling_policy": "priority"},
                               "arithmetic": "send short requests with a higher priority (a lower priority value)"}])
        out.append(Finding("head-of-line-blocking", WARNING, msg, {
            **engine_evidence(ctx, eng),
            "blocked": [{"req_id": w.req_id, "prompt_len": w.prompt_len, "waited_steps": w.steps,
                         "steps": [w.arrival_step, w.first_step - 1], "queue_s": rounded(w.queue_s), "ttft_s": rounded(w.ttft_s),
                         "queue_share": rounded(w.queue_share), "head_blocked_by": w.reasons} for w in waits],
            "takers": [{"req_id": rid, "prompt_len": takers[rid][1], "prefill_tokens": takers[rid][0],
                        "first_chunk_step": st} for rid, st in zip(names, starts)],
            "taken_share": round(taken / total, 4),
            "short_requests_blocked": ep.blocked_short_count,
            "complete": all(v[4] for v in victims)}, remedy))
    return out


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
        cause_reason = max(reasons, key=reasons.get) if reasons else None
        head, head_len = (first.head, first.head_prompt_len) if first is not None else (None, None)
        remedy = None
        if open_stall is not None and open_stall.head:
            head, head_len = open_stall.head, open_stall.head_prompt_len
        cause = {"kv_cache": "the head did not fit the KV cache", "deferred": "admission was deferred",
                 "max_num_seqs": "the running queue was full", "preemption": "the steps preempted",
                 "token_budget": "the budget was used up", "prefill_limit": "new prefills were held back"}.get(
                     cause_reason or "", "the cause is not recorded (no head_blocked_by)")
        msg = (f"{fmt_count(runs.steps)} steps scheduled nothing while requests waited (first at step "
               f"{first.first_step if first else '?'}, longest {fmt_count(longest.steps)} steps from step {longest.first_step}): "
               f"{cause}")
        if cfg is not None and cause_reason == "kv_cache" and head_len and cfg.block_size and cfg.num_kv_blocks:
            need = cdiv(head_len, cfg.block_size)
            usable = cfg.num_kv_blocks - 1
            if need > usable:
                msg += (f"; the head {head} needs {need} blocks for its {fmt_count(head_len)}-token prompt and the KV cache "
                        f"has {usable}: it can never fit")
                remedy = Remedy(
                    "num_gpu_blocks_override", need + 1,
                    f"{head}'s prompt: ⌈{fmt_count(head_len)} / {cfg.block_size}⌉ = {need} blocks + 1 reserved → "
                    f"num_gpu_blocks_override ≥ {need + 1}; or max_model_len ≤ {fmt_count(usable * cfg.block_size)} so that "
                    f"vLLM rejects such prompts at once", "more KV blocks take device memory",
                    "vLLM issue #39734: a request that fits max_model_len but never the KV cache stalls the queue",
                    whatif={"num_kv_blocks": need + 1})
        if cause_reason == "deferred" and cfg is not None and (cfg.async_scheduling or
                                                               cfg.scheduler_class == "AsyncScheduler"):
            msg += ("; under async scheduling a finished request keeps its slot one more step, so with short "
                    "outputs every other step admits nobody (raising max_num_seqs does not change it)")
            remedy = Remedy("async_scheduling", False,
                            "the 0-token steps come from the slot held for the in-flight last token; without async "
                            "scheduling the slot frees in the same step",
                            "without async scheduling the next step is not prepared while the GPU runs this one",
                            SRC_ASYNC)
        if never:
            msg += f"; the queue never drained (the log ends {open_stall.steps} steps into it)"
        out.append(Finding("stall", CRITICAL if never else WARNING, msg, {
            **engine_evidence(ctx, eng), "stall_steps": runs.steps,
            "first_step": first.first_step if first else None,
            "longest": [longest.first_step, longest.last_step], "head_blocked_by": reasons, "head": head,
            "head_prompt_len": head_len, "never_drained": never,
            "stalls": [[s.first_step, s.last_step] for s in stalls[:5]]}, remedy))
    return out


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
        msg = (f"{c.prompts} prompt{'s were' if c.prompts != 1 else ' was'} cut into chunks while nothing decoded "
               f"alongside: chunking only added {fmt_count(c.extra_steps)} step{'s' if c.extra_steps != 1 else ''} "
               f"({fmt_pct(share)} of the run) and "
               f"{fmt_count(c.reread_tokens)} KV tokens read again; the longest, {c.example} "
               f"({fmt_count(c.longest_prompt)} tokens, steps {c.example_steps[0]}-{c.example_steps[1]})")
        out.append(Finding("chunking-without-benefit", WARNING if share >= CHUNK_ALONE_WARN_SHARE else INFO, msg, {
            **engine_evidence(ctx, eng), "prompts": c.prompts, "extra_steps": c.extra_steps, "share_of_steps": round(share, 4),
            "reread_kv_tokens": c.reread_tokens, "example": c.example, "example_prompt_len": c.longest_prompt,
            "example_steps": list(c.example_steps) if c.example_steps else None},
            Remedy("max_num_batched_tokens", want,
                   f"the longest such prompt ({fmt_count(c.longest_prompt)} tokens), rounded up to 256 → "
                   f"max_num_batched_tokens {fmt_count(want)} prefills it in one step",
                   "when requests do decode alongside, a larger budget makes their steps longer (inter-token latency)",
                   SRC_SEED_34 + "; " + SRC_VLLM_CHUNKED, whatif={"max_num_batched_tokens": want})))
    return out


def config_not_applied(ctx: Context) -> list[Finding]:
    """Expected settings (``--expect``, or what ``run --settings`` recorded) that the
    effective ``engine_config`` contradicts."""
    if not ctx.expected:
        return []
    differs = [c for c in ctx.expected if c.status == DIFFERS]
    unrecorded = [c for c in ctx.expected if c.status == NOT_RECORDED]
    if not differs:
        return []
    src = ctx.expected_source or "the expected settings"
    parts = [f"{c.setting} {_v(c.expected)} expected, {_v(c.effective)} in force" for c in differs]
    msg = (f"{len(differs)} setting{'s' if len(differs) != 1 else ''} of {src} did not take effect: " + "; ".join(parts)
           + " (command-line flags and engine arguments win over config files)")
    first = differs[0]
    whatif = {_WHATIF_NAME.get(c.setting, c.setting): c.expected for c in differs if c.setting in _WHATIF_NAME}
    return [Finding("config-not-applied", WARNING, msg, {
        "source": src, "differs": [{"setting": c.setting, "expected": c.expected, "effective": c.effective} for c in differs],
        "not_recorded": [c.setting for c in unrecorded],
        "not_in_v1": [{"setting": c.setting, "note": c.note} for c in ctx.expected if c.status == NOT_V1]},
        Remedy(first.setting, first.expected,
               "pass " + ", ".join(f"--{c.setting.replace('_', '-')} {_arg(c.expected)}" for c in differs)
               + " on the command line (or in the engine arguments the server reads)",
               "none: the run then has the settings the file meant", SRC_SEED_5, whatif=whatif))]


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
    for eng, ep in engines_of(ctx):
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
                           f"{waited_text} and the median step used "
                           f"{fmt_pct(use.median)} of the {fmt_count(eng.config.max_num_batched_tokens if eng.config else 0)}-token "
                           f"budget: the scheduler is not the bottleneck ({why})",
                           {**engine_evidence(ctx, eng), "waiting_steps": waited, "total_steps": eng.steps,
                            "budget_use_median": rounded(use.median), "burst": bool(burst)}))
    return out


def not_checked(ctx: Context) -> list[Finding]:
    """What the run's data could not support (flags off, an older probe, lost events)."""
    for eng in ctx.state.engines.values():
        if not wrote(eng, "log_schedule_each_step"):
            for rid in ("kv-bound", "budget-bound", "seqs-bound", "stall", "underloaded", "chunking-without-benefit",
                        "head-of-line-blocking"):
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
                    {"rules": dict(ctx.not_checked)})]


#: The catalogue, in report order within a severity. Each rule: ``Context -> [Finding]``.
CATALOGUE: tuple[tuple[str, Callable[[Context], list[Finding]]], ...] = (
    ("stall", stall),
    ("preemption-thrash", preemption_thrash),
    ("preemption-storm", preemption_storm),
    ("head-of-line-blocking", head_of_line_blocking),
    ("kv-bound", bound),  # also budget-bound and seqs-bound: one limit per engine core
    ("config-not-applied", config_not_applied),
    ("chunking-without-benefit", chunking_without_benefit),
    ("underloaded", underloaded),
    ("not-checked", not_checked),  # last: the others note what they could not check
)
#: Every finding id, in report order (a public interface).
FINDING_IDS = ("stall", "preemption-thrash", "preemption-storm", "head-of-line-blocking", "kv-bound", "seqs-bound",
               "budget-bound", "config-not-applied", "chunking-without-benefit", "underloaded", "not-checked")
