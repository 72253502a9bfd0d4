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

from dataclasses import dataclass, field
from typing import Any, Callable

from ..episodes import SHORT_PROMPT_SHARE, EngineEpisodes, Episodes, Wait
from ..expected import DIFFERS, NOT_RECORDED, NOT_V1, SettingCheck
from ..figures import Distribution, budget_use_counts
from ..engine_state import EngineState
from ..state import RunState
from .findings import CRITICAL, INFO, WARNING, Finding, Remedy

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
#: head-of-line-blocking: a short request (prompt <= SHORT_PROMPT_SHARE of the budget,
#: episodes.py) waited at least this many steps for its first chunk ...
HOL_MIN_WAIT_STEPS = 3
#: ... with queue time at least QUEUE_SHARE_OF_TTFT of its TTFT (episodes.py) and long
#: requests (prompt > SHORT_PROMPT_SHARE of the budget) taking at least this share of the
#: prefill tokens scheduled meanwhile (measured here: 100 % in the short-behind-long burst).
HOL_TAKER_SHARE = 0.5
#: Long requests named per blocked request (the largest takers).
HOL_TAKERS_SHOWN = 8
#: kv-bound / budget-bound / seqs-bound: requests waited after at least this share of the
#: steps (below it the queue is incidental; SGLang's guide: #queue-req 0 frequently means
#: the client, not the server, sets the pace) ...
BOUND_MIN_WAITING_SHARE = 0.2
#: ... and one limit stopped the head in at least this share of those steps.
BOUND_SHARE = 0.5
#: KV use above which the cache counts as full (SGLang's guide: token usage > 0.9 is good
#: utilization; below it with requests queued the server is too conservative).
KV_FULL = 0.9
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

#: Sources, cited by the remedies.
SRC_VLLM_PREEMPTION = "vLLM tuning guide, Preemption (docs/configuration/optimization.md)"
SRC_VLLM_CHUNKED = "vLLM tuning guide, Chunked Prefill (docs/configuration/optimization.md)"
SRC_SGLANG = "SGLang hyperparameter tuning guide (#queue-req, token usage)"
SRC_SEED_34 = "seed notes §3.4: later chunks re-read the KV of the earlier ones"
SRC_SEED_5 = "seed notes §5: command-line flags win over config files"
SRC_FULL_ISL = "vLLM 0.19+ scheduler_reserve_full_isl (vllm/v1/core/sched/scheduler.py)"
SRC_ASYNC = "vLLM AsyncScheduler: a finished request's slot frees one step later (vllm/v1/core/sched/async_scheduler.py)"

# -- context ---------------------------------------------------------------------------------


@dataclass
class Context:
    """What the rules read.

    Attributes:
        state: the run's state, events applied.
        episodes: the :class:`Episodes` that followed it.
        expected: the user's expected settings against ``engine_config`` (``--expect``,
            or ``meta.json["expected"]``); None: nothing to check.
        expected_source: the file they came from.
        live: the run is still going (a stall at the end is not yet "never drains").
    """

    state: RunState
    episodes: Episodes
    expected: list[SettingCheck] | None = None
    expected_source: str | None = None
    live: bool = False
    not_checked: dict[str, str] = field(default_factory=dict)  # rule id -> why (filled by rules)


# A finding's message is part of ``--json``, so it is written here, not in a view; its
# numbers read as tui.format.pct and tui.format.count have them (a test keeps them equal).
def _pct(v: float) -> str:
    return f"{100 * v:.1f}%" if 0 < v < 0.1 else f"{100 * v:.0f}%"


def _n(v: int | float) -> str:
    return f"{int(v):,}"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _engine_ev(ctx: Context, eng: EngineState) -> dict[str, Any]:
    return {"engine": eng.engine} if len(ctx.state.engines) > 1 else {}


def _engines(ctx: Context) -> list[tuple[EngineState, EngineEpisodes]]:
    return [(ctx.state.engines[i], ctx.episodes.of(ctx.state.engines[i])) for i in ctx.state.engine_ids()]


def _flag(eng: EngineState, name: str) -> bool:
    """Whether the engine core wrote ``name`` events (its ``engine_config.flags``; True when unknown)."""
    flags = eng.config.flags if eng.config is not None else None
    return not isinstance(flags, dict) or flags.get(name, True) is not False


# -- shared arithmetic -----------------------------------------------------------------------


def kv_remedy(eng: EngineState, ep: EngineEpisodes) -> Remedy | None:
    """More KV blocks, or fewer running requests, from the KV demand the run reached.

    The demand is the blocks the admitted requests would hold at full length (prompt +
    ``max_tokens``, capped at ``max_model_len``; vLLM admits on the prompt alone, so
    this is what the cache must hold for them to finish without preemption). At its
    peak, ``n`` requests needed ``peak`` blocks: ``num_gpu_blocks_override >= peak + 1``
    (vLLM reserves block 0), or ``max_num_seqs = usable // (peak / n)``. When the peak
    fits (prefix-cache sharing, ``max_tokens`` unknown), ``max_num_seqs`` drops to the
    running queue left by the first preemption.
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
        return Remedy(
            "num_gpu_blocks_override", peak + 1,
            f"at step {ep.peak_step} the running requests needed {each} at full length (prompt + max_tokens, "
            f"{cfg.block_size} tokens per block) = {_n(peak)} blocks; the KV cache has {_n(usable)} "
            f"(+1 reserved) → num_gpu_blocks_override ≥ {_n(peak + 1)} (on a GPU: raise gpu_memory_utilization "
            f"until vLLM reports that many blocks)",
            tradeoff, SRC_VLLM_PREEMPTION, whatif={"num_kv_blocks": peak + 1},
            alternatives=[{"setting": "max_num_seqs", "value": seqs, "whatif": {"max_num_seqs": seqs},
                           "arithmetic": f"{_n(usable)} usable blocks // {per:.1f} blocks per request = {seqs}"}])
    if ep.first_preempt is not None:
        step, running = ep.first_preempt
        seqs = max(running, 1)
        return Remedy(
            "max_num_seqs", seqs,
            f"the first preemption (step {step}) left {running} running: that many fit the KV cache of "
            f"{_n(usable)} blocks → max_num_seqs {seqs}",
            tradeoff, SRC_VLLM_PREEMPTION, whatif={"max_num_seqs": seqs})
    return None


# -- the rules -------------------------------------------------------------------------------


def preemption_storm(ctx: Context) -> list[Finding]:
    """Preemptions frequent (per 100 steps) or costly (share of prefill work discarded)."""
    out = []
    for eng, ep in _engines(ctx):
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
        rate = (f"in {_n(eng.steps)} steps ({per_100:.1f} per 100 steps, {_n(eng.requests_preempted)} requests)"
                if per_100 is not None else f"({_n(eng.requests_preempted)} requests)")
        msg = (f"{_n(n)} preemptions {rate}" + (f" threw away {_n(eng.discarded_tokens)} computed tokens, {_pct(share)} of the tokens the engine computed"
                               if eng.discarded_tokens else "") + (f"; the first at step {first}" if first is not None else ""))
        out.append(Finding(
            "preemption-storm", CRITICAL if share >= STORM_CRITICAL_DISCARD_SHARE else WARNING, msg,
            {**_engine_ev(ctx, eng), "preemptions": n, "requests": eng.requests_preempted,
             "per_100_steps": round(per_100, 2) if per_100 is not None else None, "discarded_tokens": eng.discarded_tokens, "computed_tokens": work,
             "discarded_share": round(share, 4), "first_step": first, "busiest_steps": busiest,
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
    for eng, ep in _engines(ctx):
        if not _flag(eng, "log_preempt_events"):
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
                   f"discarding {_n(worst.discarded_tokens + other.discarded_tokens)} computed tokens against "
                   f"{_n((worst.prompt_len or 0) + (other.prompt_len or 0))} prompt tokens")
        else:
            msg = (f"{worst.req_id} was preempted {worst.preemptions} times"
                   + (f" (steps {span[0]}-{span[1]})" if span else "")
                   + f", discarding {_n(worst.discarded_tokens)} computed tokens"
                   + (f" against its {_n(worst.prompt_len)}-token prompt ({ratio:.1f}×)" if ratio is not None else ""))
        if len(cands) > (2 if pair else 1):
            msg += f"; {len(cands) - (2 if pair else 1)} more request(s) preempted repeatedly"
        evidence = {**_engine_ev(ctx, eng), "requests": [
            {"req_id": r.req_id, "preemptions": r.preemptions, "steps": r.steps, "discarded_tokens": r.discarded_tokens,
             "prompt_len": r.prompt_len, "finished": r.finished} for r in cands[:5]]}
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
    for eng, ep in _engines(ctx):
        cfg = eng.config
        if cfg is None or not cfg.max_num_batched_tokens:
            continue
        if not (_flag(eng, "log_chunk_boundaries") and _flag(eng, "log_request_events")
                and _flag(eng, "log_schedule_each_step")):
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
            who = f"{names[0]}'s {_n(long_prompts[0]) + '-token ' if long_prompts else ''}prefill"
        else:
            who = (f"the prefills of {len(names)} long requests ({'/'.join(_n(p) for p in long_prompts)}-token prompts: "
                   f"{', '.join(names[:3])}{' …' if len(names) > 3 else ''})")
        msg = (f"{len(waits)} short request{'s' if len(waits) != 1 else ''} "
               f"({'/'.join(_n(p) for p in short_prompts)}-token prompts) waited up to {max(w.steps for w in waits)} "
               f"steps for their first chunk while {who} took {_pct(taken / total)} of the prefill tokens "
               f"(steps {first}-{last}); queue time was {_range_pct(shares)} of their time to first token")
        if ep.blocked_short_count > len(waits):
            msg += f" ({ep.blocked_short_count} short requests waited mostly in the queue in all)"
        # the long requests ran before the short ones arrived (a running long prefill: a chunk
        # cap lets the short ones in beside it) or were queued ahead of them (then only a larger
        # budget, or priority, gets the short ones in sooner)
        starts = [ep.first_chunk_step(rid) for rid in names]
        arrived = min(w.arrival_step for w in waits)
        running_before = all(s is not None and s < arrived for s in starts)
        short_total = sum(w.prompt_len or 0 for w in waits)
        if running_before:
            cap = max(budget - short_total, budget // 2)
            remedy = Remedy(
                "long_prefill_token_threshold", cap,
                f"budget {_n(budget)} − the waiting short prompts ({_n(short_total)} tokens) = {_n(budget - short_total)}"
                f" (at least half the budget) → long_prefill_token_threshold {_n(cap)} caps the long prefill chunks so "
                f"the short requests fit beside them (vLLM 0.31+: applied when more than one request is eligible)",
                "the long prompts take more steps to prefill (their own TTFT grows)", SRC_VLLM_CHUNKED,
                whatif={"long_prefill_token_threshold": cap})
        else:
            want = _round_up(taken + short_total, 256)
            remedy = Remedy(
                "max_num_batched_tokens", want,
                f"the short requests waited behind {_n(taken)} prefill tokens of long requests queued ahead of them; "
                f"{_n(taken)} + their {_n(short_total)} prompt tokens, rounded up to 256 → max_num_batched_tokens "
                f"{_n(want)} admits them in the same step",
                "larger steps: running decodes wait longer per token (inter-token latency)", SRC_VLLM_CHUNKED,
                whatif={"max_num_batched_tokens": want},
                alternatives=[{"setting": "scheduling_policy", "value": "priority", "whatif": {"scheduling_policy": "priority"},
                               "arithmetic": "send short requests with a higher priority (a lower priority value)"}])
        out.append(Finding("head-of-line-blocking", WARNING, msg, {
            **_engine_ev(ctx, eng),
            "blocked": [{"req_id": w.req_id, "prompt_len": w.prompt_len, "waited_steps": w.steps,
                         "steps": [w.arrival_step, w.first_step - 1], "queue_s": _r(w.queue_s), "ttft_s": _r(w.ttft_s),
                         "queue_share": _r(w.queue_share), "head_blocked_by": w.reasons} for w in waits],
            "takers": [{"req_id": rid, "prompt_len": takers[rid][1], "prefill_tokens": takers[rid][0],
                        "first_chunk_step": st} for rid, st in zip(names, starts)],
            "taken_share": round(taken / total, 4),
            "short_requests_blocked": ep.blocked_short_count,
            "complete": all(v[4] for v in victims)}, remedy))
    return out


def _range_pct(values: list[float]) -> str:
    lo, hi = _pct(min(values)), _pct(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


def _r(v: float | None, nd: int = 4) -> float | None:
    return None if v is None else round(v, nd)


def _round_up(v: int, to: int) -> int:
    return _cdiv(v, to) * to


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
    for eng, ep in _engines(ctx):
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
        evidence = {**_engine_ev(ctx, eng), "steps": agg.steps, "waiting_steps": waited,
                    "total_steps": eng.steps, "share_of_waiting_steps": round(share, 4),
                    "step_range": [agg.first_step, agg.last_step], "running_max": agg.running_max,
                    "running_mean": round(agg.running_mean, 2), "waiting_max": agg.waiting_max,
                    "waiting_mean": round(agg.waiting_mean, 2), "kv_usage_mean": round(agg.kv_mean, 4),
                    "max_num_seqs": cfg.max_num_seqs, "inferred_from_queues": inferred}
        head = (f"in {_n(agg.steps)} of {_n(eng.steps)} steps ({_pct(agg.steps / eng.steps)}) requests waited")
        if fid == "kv-bound":
            full = agg.kv_mean >= KV_FULL
            why = "" if inferred else " because the head of the queue did not fit"
            msg = (f"The KV cache held the run back: {head}{why}; running "
                   f"plateaued at {agg.running_max} of max_num_seqs {cfg.max_num_seqs} while up to {agg.waiting_max} "
                   f"waited, KV cache {_pct(agg.kv_mean)} used on average")
            if not full:
                msg += (f" — admission waits for the whole prompt to fit, so the head waited with "
                        f"{_pct(1 - agg.kv_mean)} of the cache free")
            concurrency = _vllm_concurrency(cfg)
            if concurrency is not None:
                evidence["vllm_max_concurrency"] = round(concurrency, 2)
                if agg.running_max > concurrency * 1.5:
                    msg += (f"; vLLM's start-up line \"Maximum concurrency {concurrency:.2f}x\" assumes every request "
                            f"fills max_model_len, this run ran {agg.running_max} at once")
            out.append(Finding("kv-bound", WARNING, msg, evidence, _kv_bound_remedy(eng, ep, agg)
                               or kv_remedy(eng, ep)))
        elif fid == "budget-bound":
            use = Distribution.of_counts(budget_use_counts([eng.step_tokens]))
            evidence["budget_use_median"] = _r(use.median)
            msg = (f"The token budget held the run back: {head} with the budget of {_n(cfg.max_num_batched_tokens)} "
                   f"tokens used up (median step {_pct(use.median or 0)} of it); up to {agg.waiting_max} waited")
            want = cfg.max_num_batched_tokens * 2
            out.append(Finding("budget-bound", INFO, msg, evidence, Remedy(
                "max_num_batched_tokens", want,
                f"twice the budget ({_n(cfg.max_num_batched_tokens)} × 2): each step prefills twice as many waiting "
                f"prompt tokens", "larger steps: running decodes wait longer per token (inter-token latency)",
                SRC_VLLM_CHUNKED, whatif={"max_num_batched_tokens": want})))
        else:
            msg = (f"max_num_seqs held the run back: {head} with the running queue full "
                   f"({agg.running_max} of {cfg.max_num_seqs}) while up to {agg.waiting_max} waited, KV cache "
                   f"{_pct(agg.kv_mean)} used on average")
            out.append(Finding("seqs-bound", WARNING, msg, evidence, _seqs_remedy(eng, ep, agg)))
    return out


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
    need = _cdiv(int(round(target * per * 10)), 10) + 1
    if need <= cfg.num_kv_blocks:
        return None
    every = " (all of the run's)" if target == eng.requests_added else ""
    return Remedy(
        "num_gpu_blocks_override", need,
        f"up to {agg.running_max} ran and {agg.waiting_max} waited: {target} requests{every} × {per:.1f} blocks at full "
        f"length (prompt + max_tokens, {cfg.block_size} tokens per block) + 1 reserved = {_n(need)} blocks; the KV cache "
        f"has {_n(cfg.num_kv_blocks)} → num_gpu_blocks_override {_n(need)} (on a GPU: raise gpu_memory_utilization "
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
        return Remedy(
            "max_num_seqs", want,
            f"{_pct(1 - agg.kv_mean)} of {_n(cfg.num_kv_blocks - 1)} KV blocks ({free:.0f}) free on average while the "
            f"queue was full, {per:.1f} blocks per request at full length → room for {more} more: max_num_seqs "
            f"{seqs} + {add} = {want}",
            "more requests per step: each decode step takes longer (inter-token latency)", SRC_SGLANG,
            whatif={"max_num_seqs": want})
    want = seqs + agg.waiting_max
    return Remedy("max_num_seqs", want, f"max_num_seqs {seqs} + the {agg.waiting_max} that waited = {want}",
                  "more requests per step: each decode step takes longer; the KV cache may bind next",
                  SRC_SGLANG, whatif={"max_num_seqs": want})


def stall(ctx: Context) -> list[Finding]:
    """Steps that scheduled nothing while requests waited, with their cause."""
    out = []
    for eng, ep in _engines(ctx):
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
        msg = (f"{_n(runs.steps)} steps scheduled nothing while requests waited (first at step "
               f"{first.first_step if first else '?'}, longest {_n(longest.steps)} steps from step {longest.first_step}): "
               f"{cause}")
        if cfg is not None and cause_reason == "kv_cache" and head_len and cfg.block_size and cfg.num_kv_blocks:
            need = _cdiv(head_len, cfg.block_size)
            usable = cfg.num_kv_blocks - 1
            if need > usable:
                msg += (f"; the head {head} needs {need} blocks for its {_n(head_len)}-token prompt and the KV cache "
                        f"has {usable}: it can never fit")
                remedy = Remedy(
                    "num_gpu_blocks_override", need + 1,
                    f"{head}'s prompt: ⌈{_n(head_len)} / {cfg.block_size}⌉ = {need} blocks + 1 reserved → "
                    f"num_gpu_blocks_override ≥ {need + 1}; or max_model_len ≤ {_n(usable * cfg.block_size)} so that "
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
            **_engine_ev(ctx, eng), "stall_steps": runs.steps,
            "first_step": first.first_step if first else None,
            "longest": [longest.first_step, longest.last_step], "head_blocked_by": reasons, "head": head,
            "head_prompt_len": head_len, "never_drained": never,
            "stalls": [[s.first_step, s.last_step] for s in stalls[:5]]}, remedy))
    return out


def chunking_without_benefit(ctx: Context) -> list[Finding]:
    """Long prompts chunked while nothing decoded alongside (seed notes §3.4)."""
    out = []
    for eng, ep in _engines(ctx):
        c = ep.chunked_alone
        cfg = eng.config
        if not c.prompts or cfg is None or not eng.steps or not _flag(eng, "log_schedule_each_step"):
            continue
        share = c.extra_steps / eng.steps
        want = _round_up(max(c.longest_prompt, cfg.max_num_batched_tokens or 0), 256)
        msg = (f"{c.prompts} prompt{'s were' if c.prompts != 1 else ' was'} cut into chunks while nothing decoded "
               f"alongside: chunking only added {_n(c.extra_steps)} step{'s' if c.extra_steps != 1 else ''} "
               f"({_pct(share)} of the run) and "
               f"{_n(c.reread_tokens)} KV tokens read again; the longest, {c.example} "
               f"({_n(c.longest_prompt)} tokens, steps {c.example_steps[0]}-{c.example_steps[1]})")
        out.append(Finding("chunking-without-benefit", WARNING if share >= CHUNK_ALONE_WARN_SHARE else INFO, msg, {
            **_engine_ev(ctx, eng), "prompts": c.prompts, "extra_steps": c.extra_steps, "share_of_steps": round(share, 4),
            "reread_kv_tokens": c.reread_tokens, "example": c.example, "example_prompt_len": c.longest_prompt,
            "example_steps": list(c.example_steps) if c.example_steps else None},
            Remedy("max_num_batched_tokens", want,
                   f"the longest such prompt ({_n(c.longest_prompt)} tokens), rounded up to 256 → "
                   f"max_num_batched_tokens {_n(want)} prefills it in one step",
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
        return _n(v)
    return str(v)


def underloaded(ctx: Context) -> list[Finding]:
    """The waiting queue stayed empty and the budget mostly unused: not the scheduler."""
    out = []
    for eng, ep in _engines(ctx):
        if eng.steps < UNDERLOADED_MIN_STEPS:
            continue
        waited = waiting_steps(eng)
        share = waited / eng.steps
        use = Distribution.of_counts(budget_use_counts([eng.step_tokens]))
        if share > UNDERLOADED_WAITING_SHARE or use.median is None or use.median > UNDERLOADED_BUDGET_USE:
            continue
        waited_text = (f"Requests waited after only {_pct(share)} of {_n(eng.steps)} steps" if waited
                       else f"No request waited in {_n(eng.steps)} steps")
        out.append(Finding("underloaded", INFO,
                           f"{waited_text} and the median step used "
                           f"{_pct(use.median)} of the {_n(eng.config.max_num_batched_tokens if eng.config else 0)}-token "
                           f"budget: the scheduler is not the bottleneck (the client sends too slowly)",
                           {**_engine_ev(ctx, eng), "waiting_steps": waited, "total_steps": eng.steps,
                            "budget_use_median": _r(use.median)}))
    return out


def not_checked(ctx: Context) -> list[Finding]:
    """What the run's data could not support (flags off, an older probe, lost events)."""
    for eng in ctx.state.engines.values():
        if not _flag(eng, "log_schedule_each_step"):
            for rid in ("kv-bound", "budget-bound", "seqs-bound", "stall", "underloaded", "chunking-without-benefit",
                        "head-of-line-blocking"):
                ctx.not_checked.setdefault(rid, "step events are off (scheduler_probe.log_schedule_each_step)")
        if not _flag(eng, "log_chunk_boundaries"):
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
