"""``underloaded`` (info): requests rarely waited and the median step used little of its
budget — the client, not the scheduler, set the pace (SGLang's guide: #queue-req 0
frequently). Dropped beside any finding that says requests were held back.
"""

from __future__ import annotations


from ...figures import Distribution, budget_use_counts
from ..context import SRC_SGLANG, Context, engine_of, engines_of, rounded
from ...text import fmt_count, fmt_count_or, fmt_figure, fmt_pct
from ..evidence import Evidence
from ..findings import INFO, Finding, evidence_of
from ..limits import waiting_steps
from ..rule import Rule, Threshold

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


class UnderloadedEvidence(Evidence, kw_only=True):
    """``underloaded``: the scheduler is not the bottleneck.

    Attributes:
        waiting_steps: steps after which requests waited.
        total_steps: the engine core's steps.
        budget_use_median: the median step's share of the token budget (0..1).
        burst: every request arrived before step BURST_STEPS (an offline burst).
    """

    waiting_steps: int
    total_steps: int
    budget_use_median: float | None
    burst: bool


def evaluate(ctx: Context) -> list[Finding]:
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


def view(f: Finding) -> list[str]:
    """How often requests waited and how full the median step was."""
    e = evidence_of(f, UnderloadedEvidence)
    return [f"requests waited after {fmt_count_or(e.waiting_steps)} of {fmt_count_or(e.total_steps)} steps · "
            f"median step {fmt_figure(e.budget_use_median, '%')} of the token budget"
            + (" · one offline burst" if e.burst else "")]


RULE = Rule(
    "underloaded",
    "Requests rarely waited and the median step used little of its budget: the client, not "
    "the scheduler, set the pace (SGLang's guide: #queue-req 0 frequently).",
    evaluate,
    UnderloadedEvidence,
    (Threshold("UNDERLOADED_WAITING_SHARE", UNDERLOADED_WAITING_SHARE, "share of steps", SRC_SGLANG),
     Threshold("UNDERLOADED_BUDGET_USE", UNDERLOADED_BUDGET_USE, "share of the token budget", SRC_SGLANG),
     Threshold("UNDERLOADED_MIN_STEPS", UNDERLOADED_MIN_STEPS, "steps", "too short a run says nothing"),
     Threshold("BURST_STEPS", BURST_STEPS, "steps",
               "an offline LLM.generate burst arrives before step 1 (docs/whatif.md)")),
    view=view, severity=(INFO,))
