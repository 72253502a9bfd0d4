"""How a finding's goal is judged on replays: the reference a ``reduce_by`` goal is taken
from, the seconds the step-time model extrapolates counted double, the goal's figure in a
replay, the steps a goal's figure lies in, the size of a change, and how a goal reads.

Shared by each finding's remedy search (:mod:`vllm_probe.advice.remedies`) and the run's plan
(:mod:`vllm_probe.advice.plan`), so both judge a goal the same way.
"""

from __future__ import annotations

import math
from typing import Any

from ..analysis.doctor.findings import Finding
from ..analysis.doctor.rule import Goal
from ..analysis.objectives import objective
from ..analysis.workload import Workload
from .evaluate import Evaluation

#: A goal in seconds is judged on the replay's figure raised by this many times the share
#: of its predicted seconds that comes from feature values beyond the step-time model's
#: fitted region, beyond the baseline replay's share
#: (:attr:`vllm_probe.sim.stepmodel.StepTimeModel.extrapolated_share`): the seconds the
#: model extrapolates are counted as if they could cost double. Measured (docs/doctor.md):
#: held-slots' max_num_seqs 64 (4,096-token prefills against a profile fitted up to 2,047)
#: ran its steps at 25.8 ms where the replay priced 14.4 ms (1.8×): predicted queue p90
#: 0.135 → 0.088 s, real 0.142 → 0.160 s; seed-burst's 128 KV blocks put decode attention
#: 3-4× beyond the profile, 14 % of its seconds, and its prediction held (2.64 s; 2.16 s
#: real). Part 13 measured 16-143 % errors where a setting creates steps the recording
#: never had.
EXTRAPOLATION_COST = 1.0


def reference(baseline: float | None, recorded: float | None) -> float | None:
    """The figure a ``reduce_by`` goal is taken from: the lower of the replay at the recorded
    settings (``baseline``) and the recording (``recorded``); either alone when the other is
    unknown.

    The stricter of the two, so that a change must beat the model's own baseline (its error
    at the recorded settings is no improvement) and, in absolute terms, what really ran.
    Measured (docs/tune.md): short-behind-long recorded under load had a short
    requests' TTFT p90 of 0.323 s and a baseline replay of 0.687 s; a threshold of 512
    predicted 0.256 s, "half the baseline", and measured 0.285 s for real (-12 %). Against
    the recording, 0.256 s is not half, and the search went on to a change that is.
    """
    known = [v for v in (baseline, recorded) if v is not None]
    return min(known) if known else None


def judged(figure: str, value: float, share: float | None, baseline_share: float | None) -> float:
    """The value of a replay's ``figure`` the goal is judged on: a figure in seconds raised
    by :data:`EXTRAPOLATION_COST` × the share (0..1, :attr:`Evaluation.extrapolated_share`)
    of the replay's predicted seconds from beyond the fitted region in excess of the
    baseline replay's (``baseline_share``); any other figure (counts of steps, preemptions
    and tokens do not depend on the step time) as it is."""
    if share is None or objective(figure).unit != "s":
        return value
    excess = max(0.0, share - (baseline_share or 0.0))
    return value * (1.0 + EXTRAPOLATION_COST * excess)


def change_size(overrides: dict[str, Any], recorded: dict[str, Any]) -> float:
    total = 0.0
    for k, v in overrides.items():
        r = recorded.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and isinstance(r, (int, float)) \
                and not isinstance(r, bool) and r > 0 and v > 0:
            total += abs(math.log(v / r))
        else:
            total += 1.0
    return total


def figure_of(ev: Evaluation, goal: Goal) -> float | None:
    return (ev.figures_subset if goal.requests else ev.figures).get(goal.figure)


def goal_steps(goal: Goal, finding: Finding, w: Workload) -> tuple[int, int] | None:
    """Recorded steps ``(first, last)`` holding everything ``goal``'s figure counts: its
    requests from their arrival to their finish, the run's preempt events, the finding's
    held-slot steps; None when the figure is the whole run's (a quantile over every
    request, throughput) or the steps are not known (a request unfinished, preempt events
    off)."""
    if goal.requests:
        ids = set(goal.requests)
        rs = [r for r in w.requests if r.req_id in ids]
        if len(rs) != len(ids) or any(r.finish_step is None for r in rs):
            return None
        return min(r.add_before_step for r in rs), max(int(r.finish_step or 0) for r in rs)
    if goal.figure in ("preemptions", "worst_request_preemptions"):
        steps = [p.step for p in w.preempts]
        return (min(steps), max(steps)) if steps else None
    if goal.figure == "held_slot_steps":
        rng = getattr(finding.evidence, "step_range", None)
        return (int(rng[0]), int(rng[1])) if rng else None
    return None


def goal_label(g: Goal) -> str:
    """A goal's figure as reports label it: ``queue_p90 (11 requests)``, ``reread_kv_tokens (1
    request)``, ``preemptions``."""
    n = len(g.requests)
    return g.figure + (f" ({n} request{'s' if n != 1 else ''})" if n else "")


def goal_dict(g: Goal) -> dict[str, Any]:
    return {"figure": g.figure, "at_most": g.at_most, "reduce_by": g.reduce_by, "requests": list(g.requests)}


def goal_text(g: Goal) -> str:
    parts = []
    if g.at_most is not None:
        parts.append(f"{g.figure} ≤ {g.at_most:g}")
    if g.reduce_by is not None:
        parts.append(f"{g.figure} {g.reduce_by * 100:.0f} % lower")
    if g.requests:
        parts.append(f"over {len(g.requests)} request(s)")
    return ", ".join(parts) or g.figure


__all__ = ["EXTRAPOLATION_COST", "change_size", "figure_of", "goal_dict", "goal_label", "goal_steps", "goal_text",
           "judged", "reference"]
