"""``preemption-thrash``: one request preempted again and again, or two preempting each other.

A victim starts again from scratch on readmission and, readmitted as the newest running
request, it is the next victim under FCFS: a long prefill can be preempted and resumed every
step and never finish (vLLM #25538).
"""

from __future__ import annotations

import msgspec

from ..context import MEASURED, Context, engine_of, engines_of, wrote
from ...text import fmt_count, fmt_count_or
from ..evidence import Evidence
from ..findings import CRITICAL, WARNING, EngineBasis, Finding, Remedy, basis_of, evidence_of
from ..knobs import KNOB_BLOCKS_UP, KNOB_SEQS_DOWN
from ..kv import kv_remedy
from ..rule import Goal, Rule, Threshold

# -- thresholds ----------------------------------------------------------------------------

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


class ThrashRequest(msgspec.Struct):
    """One request preempted repeatedly.

    Attributes:
        req_id: the request.
        preemptions: times it was preempted.
        steps: steps of its preemptions (the first 32).
        discarded_tokens: computed tokens its preemptions threw away (tokens).
        prompt_len: its prompt (tokens); null when unknown.
        finished: it finished within the run.
    """

    req_id: str
    preemptions: int
    steps: list[int]
    discarded_tokens: int
    prompt_len: int | None
    finished: bool


class ThrashEvidence(Evidence, kw_only=True):
    """``preemption-thrash``: one request preempted again and again.

    Attributes:
        requests: the requests preempted repeatedly, most preempted first (up to 20).
        repeated_requests: how many requests were preempted repeatedly in all.
        pair: two requests that preempted each other (their preemption steps alternate); left out when none.
        alternations: alternations between the pair's preemption steps; left out when no pair.
    """

    requests: list[ThrashRequest]
    repeated_requests: int
    pair: list[str] | None = None
    alternations: int | None = None


def _interleaved(a: list[int], b: list[int]) -> int:
    """Alternations between two requests' preemption steps (A, B, A, B … counts 3)."""
    seq = sorted([(s, 0) for s in a] + [(s, 1) for s in b])
    return sum(1 for x, y in zip(seq, seq[1:]) if x[1] != y[1])


def evaluate(ctx: Context) -> list[Finding]:
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
        out.append(Finding("preemption-thrash", severity, msg, evidence, basis=EngineBasis(eng=eng, ep=ep)))
    return out


def arithmetic(ctx: Context, f: Finding) -> Remedy | None:
    """The KV arithmetic of :func:`~vllm_probe.analysis.doctor.kv.kv_remedy`, as the storm's."""
    b = basis_of(f, EngineBasis)
    return kv_remedy(b.eng, b.ep)


def view(f: Finding) -> list[str]:
    """The most preempted requests, their steps and the tokens they lost."""
    e = evidence_of(f, ThrashEvidence)
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


def step(f: Finding) -> int | None:
    """The worst request's first preemption."""
    e = evidence_of(f, ThrashEvidence)
    return e.requests[0].steps[0] if e.requests and e.requests[0].steps else None


RULE = Rule(
    "preemption-thrash",
    "vLLM preempts when a running request needs a block and none is free (vLLM 0.32 "
    "scheduler.py:776-841: allocate_slots returns None, then the victim is self.running[-1] under "
    "FCFS, or max(running, key=(priority, arrival_time)) under the priority policy, :795-806). "
    "A victim starts again from scratch on readmission (_preempt_request, :1571-1607: "
    "num_computed_tokens = 0), and, readmitted as the newest running request, it is the next "
    "victim again.",
    evaluate,
    ThrashEvidence,
    (Threshold("THRASH_PREEMPTIONS", THRASH_PREEMPTIONS, "preemptions of one request", MEASURED),
     Threshold("THRASH_TWICE_DISCARD_PER_PROMPT", THRASH_TWICE_DISCARD_PER_PROMPT,
               "discarded tokens per prompt token, twice preempted",
        "the work lost exceeds the prompt it had to prefill"),
     Threshold("THRASH_CRITICAL_PREEMPTIONS", THRASH_CRITICAL_PREEMPTIONS, "preemptions of one request",
        "vLLM #25538: a long prefill preempted and resumed every step never finishes")),
    goal=lambda f: Goal("worst_request_preemptions", at_most=1),
    knobs=(KNOB_SEQS_DOWN, KNOB_BLOCKS_UP),
    arithmetic=arithmetic, view=view, step=step,
    severity=(CRITICAL, WARNING), wait="explains")
