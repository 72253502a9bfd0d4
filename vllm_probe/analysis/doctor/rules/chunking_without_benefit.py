"""``chunking-without-benefit``: long prompts cut into chunks while nothing decoded alongside.

A prompt longer than the token budget is cut into prefill chunks, and each later chunk
re-reads the KV of the earlier ones. Chunking pays off only when decodes
run beside the chunks; with nothing decoding it only adds steps and KV reads.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..context import (
    MEASURED, SRC_CHUNK_REREAD, SRC_VLLM_CHUNKED, Context, engine_of, engines_of, first_of, round_up, steps_text, wrote,
)
from ...text import fmt_count, fmt_count_or, fmt_pct
from ..evidence import Evidence
from ..findings import INFO, WARNING, EngineBasis, Finding, Remedy, basis_of, evidence_of
from ..knobs import BUDGET_MAX_FACTOR, recorded_int, scaled
from ..rule import Goal, Knob, Rule, Threshold

#: chunking-without-benefit is a warning when the steps chunking added are at least this
#: share of the run (else info).
CHUNK_ALONE_WARN_SHARE = 0.05


class ChunkingEvidence(Evidence, kw_only=True):
    """``chunking-without-benefit``: long prompts chunked with nothing decoding beside them.

    Attributes:
        prompts: first prefill passes cut into chunks while nothing decoded alongside.
        extra_steps: steps the chunking added (chunks - 1 per pass).
        share_of_steps: extra_steps / the engine core's steps (0..1).
        reread_kv_tokens: KV tokens later chunks read again (tokens).
        example: the request with the longest such prompt.
        example_prompt_len: its prompt (tokens).
        example_steps: its first and last chunk's steps, ``[first, last]``.
        requests: the requests whose prompts were so chunked (up to 64; their count is ``prompts``).
    """

    prompts: int
    extra_steps: int
    share_of_steps: float
    reread_kv_tokens: int
    example: str | None
    example_prompt_len: int
    example_steps: list[int] | None
    requests: list[str] = msgspec.field(default_factory=list)


class ChunkingBasis(EngineBasis, kw_only=True):
    """What the arithmetic reads.

    Attributes:
        budget: the budget that holds the longest such prompt, rounded up to 256 and within
            :data:`~vllm_probe.analysis.doctor.knobs.BUDGET_MAX_FACTOR` × the recorded one (tokens).
    """

    budget: int


def evaluate(ctx: Context) -> list[Finding]:
    """Long prompts chunked while nothing decoded alongside ."""
    out = []
    for eng, ep in engines_of(ctx):
        c = ep.chunked_alone
        cfg = eng.config
        if not c.prompts or cfg is None or not eng.steps or not wrote(eng, "log_schedule_each_step"):
            continue
        share = c.extra_steps / eng.steps
        want = round_up(max(c.longest_prompt, cfg.max_num_batched_tokens or 0), 256)
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
                               example_steps=list(c.example_steps) if c.example_steps else None,
                               requests=list(c.requests)),
                           basis=ChunkingBasis(eng=eng, ep=ep, budget=want)))
    return out


def arithmetic(ctx: Context, f: Finding) -> Remedy | None:
    """A budget that holds the longest such prompt, rounded up to 256."""
    e = evidence_of(f, ChunkingEvidence)
    b = basis_of(f, ChunkingBasis)
    want = b.budget
    text = (f"the longest such prompt ({fmt_count(e.example_prompt_len)} tokens), rounded up to 256 → "
            f"max_num_batched_tokens {fmt_count(want)} prefills it, and every shorter one, in one step")
    recorded = b.eng.config.max_num_batched_tokens if b.eng.config is not None else None
    if recorded and want > BUDGET_MAX_FACTOR * recorded:
        text += (f" (more than the {BUDGET_MAX_FACTOR}× of the recorded budget remedies stay within otherwise: "
                 "the one value that does what this rule is about)")
    return Remedy("max_num_batched_tokens", want, text,
                  "when requests do decode alongside, a larger budget makes their steps longer (inter-token latency)",
                  SRC_CHUNK_REREAD + "; " + SRC_VLLM_CHUNKED, whatif={"max_num_batched_tokens": want})


def goal(f: Finding) -> Goal:
    """No KV re-read of the prompts chunked with nothing decoding beside them: each prefilled
    in one step (what the finding is about; halving the re-read leaves it chunked, and the
    finding with it)."""
    return Goal("reread_kv_tokens", at_most=0, requests=tuple(evidence_of(f, ChunkingEvidence).requests))


def prompt_budgets(settings: dict[str, Any], finding: Finding) -> list[int]:
    """Token budgets from 1.5× the recorded one up to the one that holds the longest such
    prompt (rounded up to 256), that one included even beyond
    :data:`~vllm_probe.analysis.doctor.knobs.BUDGET_MAX_FACTOR` × the recorded budget: it is
    the rule's own fix."""
    base = recorded_int(settings, "max_num_batched_tokens")
    if base is None or not isinstance(finding.evidence, ChunkingEvidence):
        return []
    want = round_up(max(finding.evidence.example_prompt_len, base), 256)
    below = [v for v in scaled("max_num_batched_tokens", (1.5, 2, 4, 8))(settings, finding) if v < want]
    return below + ([want] if want > base else [])


#: A larger budget, up to the one that prefills the longest such prompt in one step.
KNOB_PROMPT_BUDGET = Knob("max_num_batched_tokens", "up", prompt_budgets, beyond_cap=True)


def view(f: Finding) -> list[str]:
    """The longest such prompt and its chunks' steps."""
    e = evidence_of(f, ChunkingEvidence)
    return [f"e.g. {e.example} ({fmt_count_or(e.example_prompt_len)} tokens), steps {steps_text(e.example_steps)}"]


RULE = Rule(
    "chunking-without-benefit",
    "A prompt longer than the budget is cut into chunks (vLLM 0.32 scheduler.py, the WAITING "
    "loop schedules at most the token budget left of a prompt); each later chunk re-reads the KV "
    "of the earlier ones. Chunking pays off only when decodes run beside the "
    "chunks.",
    evaluate,
    ChunkingEvidence,
    (Threshold("CHUNK_ALONE_WARN_SHARE", CHUNK_ALONE_WARN_SHARE, "share of steps", MEASURED),),
    goal=goal,
    knobs=(KNOB_PROMPT_BUDGET,),
    arithmetic=arithmetic, view=view, step=lambda f: first_of(evidence_of(f, ChunkingEvidence).example_steps),
    severity=(WARNING, INFO))
