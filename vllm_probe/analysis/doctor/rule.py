"""One doctor rule, one object: what it looks for, why (the mechanism in vLLM's code), its
thresholds and their sources, the typed evidence it returns, the figure its remedy must move
(its goal) and the settings that can move it (its knobs), and how a view lays it out.

Each rule is one file of :mod:`vllm_probe.analysis.doctor.rules`, read top to bottom. The
three sides agree on this interface:

- the analysis side (``analysis/doctor/``) defines every :class:`Rule` and its ``evaluate``;
- the advice side (``advice/``, a floor above ``sim/``) reads only :attr:`Rule.goal` and
  :attr:`Rule.knobs` to search settings by replaying the run, and :attr:`Rule.arithmetic` to
  say where the search began;
- the views read :attr:`Rule.view` and never the evidence by string keys.

Knob and goal names are ``vllm-probe whatif --set`` names (:mod:`vllm_probe.sim.engine_args`)
and figure names of :mod:`vllm_probe.analysis.objectives`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .context import Context
    from .findings import Finding, Remedy


@dataclass(frozen=True)
class Threshold:
    """A number a rule compares against, with its unit and where it comes from.

    Attributes:
        name: the constant's name (``STORM_PER_100_STEPS``).
        value: its value.
        unit: ``steps``, ``tokens``, ``share`` (0-1), ``preemptions per 100 steps``, ...
        source: the vLLM file and release, tuning guide or measurement it mirrors.
    """

    name: str
    value: float
    unit: str
    source: str


@dataclass(frozen=True)
class Goal:
    """What a remedy must do to one figure of the run for the finding to be resolved.

    Attributes:
        figure: a figure name of :mod:`vllm_probe.analysis.objectives` (``ttft_p90``,
            ``queue_p90``, ``preemptions``, ``held_slot_steps``, ...).
        at_most: resolved when the predicted figure is at most this value (same unit).
        reduce_by: resolved when the predicted figure is at most ``(1 - reduce_by)`` times
            the recorded one (0.5: halved).
        requests: measure the figure over these request ids only (e.g. the short requests
            a head-of-line finding names); empty: every request.
        steps: ``(first, last)`` recorded steps: measure the figure over the requests that
            waited in them (in the waiting queue after at least one of those steps), e.g.
            a limit's steps; resolved to ``requests`` by the remedy search. None: not used.
        watch: ``(label, request ids)`` of requests a remedy may cost, whose ``figure`` is
            reported beside the goal as a trade-off (e.g. the long prompts a chunk cap
            slows down).
    """

    figure: str
    at_most: float | None = None
    reduce_by: float | None = None
    requests: tuple[str, ...] = ()
    steps: tuple[int, int] | None = None
    watch: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def met(self, recorded: float | None, predicted: float | None) -> bool | None:
        """Whether ``predicted`` reaches the goal; None when either figure is unknown."""
        if predicted is None:
            return None
        ok = True
        if self.at_most is not None:
            ok = ok and predicted <= self.at_most
        if self.reduce_by is not None:
            if recorded is None:
                return None
            # a relative tolerance: 10 preemptions reduced by 0.9 must accept 1 ((1 - 0.9) * 10
            # is 0.9999999999999998 in floating point)
            ok = ok and predicted <= (1.0 - self.reduce_by) * recorded + 1e-9 * max(1.0, abs(recorded))
        return ok


@dataclass(frozen=True)
class Knob:
    """A setting a rule's remedy may change, and the values worth trying.

    Attributes:
        setting: the ``whatif --set`` name (``max_num_batched_tokens``, ``num_kv_blocks``,
            ``max_num_seqs``, ``long_prefill_token_threshold``, ``async_scheduling``, ...).
        direction: which way from the recorded value helps (``up``, ``down``, or ``set``
            for a value that is not ordered, e.g. ``async_scheduling=False``).
        candidates: ``(recorded engine_config settings, finding) -> values`` to try, in the
            order the search should try them (smallest change first), already bounded by
            what operators run (e.g. a budget within 8x the recorded one) and by the
            platform (:class:`vllm_probe.analysis.doctor.context.Platform`-like bounds).
        min_release: the first vLLM release that has the setting (None: every supported).
        beyond_cap: its candidates are bounded by the rule's own mechanism, not by what
            operators usually run (a token budget that holds the one prompt a rule is about
            may exceed :data:`~vllm_probe.analysis.doctor.knobs.BUDGET_MAX_FACTOR` × the
            recorded one).
    """

    setting: str
    direction: Literal["up", "down", "set"]
    candidates: Callable[[dict[str, Any], Finding], Sequence[Any]]
    min_release: str | None = None
    beyond_cap: bool = False


@dataclass(frozen=True)
class Rule:
    """One entry of the doctor's catalogue.

    Attributes:
        id: the finding id (a public interface: ``preemption-storm``, ...).
        mechanism: one paragraph: what the scheduler does that this rule detects, citing
            the vLLM lines (file, function, release).
        thresholds: the numbers it compares against.
        evidence: the msgspec Struct type of its findings' ``evidence``.
        evaluate: ``Context -> list[Finding]``.
        goal: ``Finding -> Goal | None``: what its remedy must achieve (None: no remedy).
        knobs: the settings a remedy may change, tried by the replay.
        arithmetic: ``(Context, Finding) -> Remedy | None``: the remedy from the run's
            numbers alone: where the search starts, and the answer with ``--no-replay``
            (marked unchecked).
        view: ``Finding -> list[str]``: the lines a text view shows under the message.
        step: ``Finding -> int | None``: a step to look at first (``tail --replay
            --from-step``); None: none.
        severity: the severities its findings can have, worst first (the catalogue's
            documentation; a finding carries its own).
        wait: what its findings say about requests' waits: ``explains`` — they name the
            limit that held requests back (``unexplained-wait`` stays silent beside them);
            ``unexplained`` — they report waits no rule explains; None — neither. A finding
            of either kind at warning or above drops ``underloaded`` beside it.
    """

    id: str
    mechanism: str
    evaluate: Callable[[Context], list[Finding]]
    evidence: type | None = None
    thresholds: tuple[Threshold, ...] = ()
    goal: Callable[[Finding], Goal | None] = field(default=lambda f: None)
    knobs: tuple[Knob, ...] = ()
    arithmetic: Callable[[Context, Finding], Remedy | None] = field(default=lambda ctx, f: None)
    view: Callable[[Finding], list[str]] = field(default=lambda f: [])
    step: Callable[[Finding], int | None] = field(default=lambda f: None)
    severity: tuple[str, ...] = ("warning",)
    wait: Literal["explains", "unexplained"] | None = None
