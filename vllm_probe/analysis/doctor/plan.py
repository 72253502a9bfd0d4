"""The doctor's one prescription per run: the :class:`Plan` (``doctor --json``'s ``plan``).

A plan is one set of setting changes, searched jointly over every finding's goal by
replaying the run (:mod:`vllm_probe.advice.plan`), with what it clears, what it leaves and
why, what it is predicted to do to each figure (better, worse, unchanged, or unclear where
the intervals overlap), the mechanism in step terms, what it costs, and how to apply it and
check it with a rerun. Where goals conflict it says which, and its ``alternatives`` are the
other plans on the Pareto front (same shape).
"""

from __future__ import annotations

from typing import Any

import msgspec


class PlanFigure(msgspec.Struct, kw_only=True):
    """One figure under the plan, against the replay at the recorded settings.

    Attributes:
        unit: the figure's unit (:mod:`vllm_probe.analysis.objectives`).
        recorded: the recording's value (shown beside, never the reference of a Δ).
        baseline: the replay at the recorded settings: the reference every Δ is against.
        predicted: the replay at the plan's settings.
        direction: ``better``, ``worse``, ``unchanged``, or ``unclear`` (a figure in seconds
            whose intervals overlap: the model cannot tell its direction).
        interval: the predicted value's interval ``{"lo", "hi", "from"}`` (seconds and
            throughput only; null for counts, which are exact).
        baseline_interval: the baseline's interval, the same way.
        goal: the finding id whose goal this figure is; null for a trade-off.
        met: for a goal: whether the plan reaches it; null for a trade-off.
    """

    unit: str
    recorded: float | None
    baseline: float | None
    predicted: float | None
    direction: str
    interval: dict[str, Any] | None = None
    baseline_interval: dict[str, Any] | None = None
    goal: str | None = None
    met: bool | None = None


class Plan(msgspec.Struct, kw_only=True):
    """One set of changes for the whole run.

    Attributes:
        settings: the changes, by ``whatif`` names (:mod:`vllm_probe.schema.engine_settings`).
        flags: the same as ``vllm serve`` arguments.
        engine_args: the same as ``LLM(...)`` engine arguments.
        checked: the replay reached every goal it ``clears`` at these settings (false: the
            rules' arithmetic, not replayed; ``--no-replay``, no vLLM, or the budget ran out
            first).
        complete: false when the search's time budget stopped it before it had tried all
            it meant to.
        clears: ids of the findings whose goals the plan reaches, in report order.
        leaves: ids of the warning or critical findings it does not clear.
        left_because: per finding id it leaves, why, one line.
        predicted: every goal figure (labelled ``figure`` or ``figure (N requests)``) and
            trade-off, as :class:`PlanFigure`.
        mechanism: the plan in the scheduler's own terms, ``{name: [baseline, predicted]}``
            (decodes per step, tokens per step, running requests median).
        cost: what the plan costs, one line each (memory, concurrency, latency it worsens).
        replays: replays the plan's search ran.
        rerun: the commands that record a rerun at the plan's settings and check it.
        conflict: which goals conflict (no replayed setting met them together), one
            sentence; null when none do.
        stretch: the stretch of the run the plan was replayed on (as the remedies' ``stretch``);
            null: the whole run.
        alternatives: other plans on the Pareto front of the goals (at most two more).
    """

    settings: dict[str, Any]
    flags: list[str]
    engine_args: dict[str, Any]
    checked: bool
    complete: bool = True
    clears: list[str] = msgspec.field(default_factory=list)
    leaves: list[str] = msgspec.field(default_factory=list)
    left_because: dict[str, str] = msgspec.field(default_factory=dict)
    predicted: dict[str, PlanFigure] = msgspec.field(default_factory=dict)
    mechanism: dict[str, list[float | None]] = msgspec.field(default_factory=dict)
    cost: list[str] = msgspec.field(default_factory=list)
    replays: int = 0
    rerun: list[str] = msgspec.field(default_factory=list)
    conflict: str | None = None
    stretch: dict[str, Any] | None = None
    alternatives: list[Plan] = msgspec.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The ``plan`` object of ``doctor --json``."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out


__all__ = ["Plan", "PlanFigure"]
