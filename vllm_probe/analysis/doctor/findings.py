"""What the doctor reports: a :class:`Finding`, its :class:`Remedy`, severities; the typed
:class:`Basis` a rule's arithmetic reads and the typed :class:`Prediction` of its search.

The shape of ``vllm-probe doctor --json`` (a public interface)::

    {"run_dir": "...", "findings": [{"id", "severity", "message", "evidence": {...},
                                     "remedy": {...} | null, "predicted": {...} | null}]}

``remedy`` is :meth:`Remedy.to_dict`; ``predicted`` is :class:`Prediction`, filled by the
remedy search (:mod:`vllm_probe.advice.remedies`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from ...schema.engine_settings import engine_arg_of, serve_flags
from ..engine_state import EngineState
from ..episodes import EngineEpisodes
from .evidence import Evidence

CRITICAL, WARNING, INFO = "critical", "warning", "info"
#: Severities, worst first.
SEVERITIES = (CRITICAL, WARNING, INFO)


class Basis(msgspec.Struct, kw_only=True):
    """What a rule's arithmetic and knobs read beside the evidence. Never encoded (not part
    of ``--json``); a rule that needs more subclasses it in its own file."""


class EngineBasis(Basis, kw_only=True):
    """The engine core a finding is about: its state and the episodes that followed it.

    Attributes:
        eng: the engine core's state.
        ep: its episodes.
    """

    eng: EngineState
    ep: EngineEpisodes


@dataclass
class Remedy:
    """What to change, by how much, and why.

    Attributes:
        setting: the setting to change, by its ``whatif`` name (``num_kv_blocks``); its
            engine argument and ``vllm serve`` flag are in ``to_dict()``'s ``engine_arg``
            and ``flags`` (:mod:`vllm_probe.schema.engine_settings`).
        value: the suggested value, computed from the run.
        arithmetic: how the value follows from the run's numbers, one line.
        tradeoff: what the change costs, one line.
        source: the rule's source (vLLM's tuning guide, SGLang's, vLLM's
            code with file and release, or a measurement here).
        whatif: the same change in ``vllm-probe whatif --set`` names (``num_kv_blocks``
            counts blocks as ``engine_config`` does); empty when the replay cannot
            model it. ``doctor --whatif`` replays exactly these settings.
        alternatives: other changes that address the same finding, each
            ``{"setting", "value", "whatif", "arithmetic"}``.
    """

    setting: str
    value: Any
    arithmetic: str
    tradeoff: str
    source: str
    whatif: dict[str, Any] = field(default_factory=dict)
    alternatives: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Its fields, with ``engine_arg`` and ``flags`` (the same change as vLLM spells it)
        after ``value``, in the remedy and in each of its alternatives."""
        d = asdict(self)
        d["alternatives"] = [_spelt(a) for a in d["alternatives"]]
        return _spelt(d)


def _spelt(change: dict[str, Any]) -> dict[str, Any]:
    """A change (``setting``, ``value``, ...) with vLLM's spelling of it after ``value``:
    ``engine_arg`` (``LLM(...)``) and ``flags`` (``vllm serve``)."""
    if "setting" not in change or "value" not in change:
        return change
    d = dict(change)
    setting, value = d.pop("setting"), d.pop("value")
    return {"setting": setting, "value": value, "engine_arg": engine_arg_of(setting),
            "flags": serve_flags({setting: value})} | d


class GoalRecord(msgspec.Struct):
    """A finding's goal as its search reports it (:class:`~.rule.Goal`).

    Attributes:
        figure: the figure's name (:mod:`vllm_probe.analysis.objectives`).
        at_most: reached when the figure is at most this (its unit); null: no such bound.
        reduce_by: reached when the figure falls by this share (0..1); null: no such bound.
        requests: the request ids the figure is measured over (empty: every request).
        target: ``at_most``, or ``"lower"`` for a reduce_by goal.
    """

    figure: str
    at_most: float | None
    reduce_by: float | None
    requests: list[str]
    target: float | str | None


class BaselineError(msgspec.Struct):
    """The replay at the recorded settings against the recording.

    Attributes:
        within: every figure is within its tolerance.
        figures: each figure's relative error (null: not comparable).
        off: the figures beyond their tolerance.
    """

    within: bool
    figures: dict[str, float | None]
    off: list[str]


class TriedRecord(msgspec.Struct, kw_only=True):
    """One replayed change of a search.

    Attributes:
        settings: the ``whatif --set`` names and values replayed.
        predicted: the goal figure the replay gave (null: the replay failed).
        met: it reached the goal (null: unknown, the replay spilled or was stopped).
        outside_region: share of the replay's steps outside the step-time model's fitted
            region (0..1; null: unknown).
        extrapolated_share: share of its predicted seconds from beyond that region; only
            with ``extrapolated``.
        extrapolated: true when those seconds kept the point from being judged; left out
            otherwise.
        spilled: true when a replay of a stretch ran past its next recorded arrival (and
            could not be widened); left out otherwise.
        replayed_on: the wider stretch (or ``{"whole_run": true}``) it was replayed on
            after spilling; left out otherwise.
        error: why the replay failed; left out when it ran.
    """

    settings: dict[str, Any]
    predicted: float | None
    met: bool | None
    outside_region: float | None
    extrapolated_share: float | UnsetType | None = UNSET
    extrapolated: bool | UnsetType = UNSET
    spilled: bool | UnsetType = UNSET
    replayed_on: dict[str, Any] | UnsetType = UNSET
    error: str | UnsetType = UNSET


class FigureChange(msgspec.Struct):
    """A figure at the shown settings against the replay at the recorded settings.

    Attributes:
        recorded: the recorded run's figure (beside, not the reference).
        predicted: the replay's figure at the shown settings.
        unit: its unit (:mod:`vllm_probe.analysis.objectives`).
        baseline: the replay at the recorded settings: what ``predicted`` is compared with.
    """

    recorded: float | None
    predicted: float | None
    unit: str
    baseline: float | None = None


class Prediction(msgspec.Struct, kw_only=True):
    """A finding's remedy search (``predicted`` in ``doctor --json``). Two shapes: a search
    that could not replay the baseline has only ``error`` and ``complete``; every other
    has ``goal`` through ``outside_region``, and the optional fields as noted.

    Attributes:
        error: why the replay at the recorded settings gave nothing (the remedy is then
            the arithmetic, unchecked).
        goal: the goal searched.
        recorded: the goal figure in the recording (or its stretch).
        baseline: the goal figure replayed at the recorded settings.
        baseline_error: that replay against the recording.
        tried: every replayed change, in the order replayed.
        complete: false when the time budget stopped the search.
        skipped: candidates not tried, one line each (a release without the setting, a
            platform that cannot take it, beyond what operators run).
        resolved: a tried change reached the goal.
        baseline_outside_region: share of the baseline replay's steps outside the step-time
            model's fitted region (0..1).
        outside_region: the same for the shown change; null without one.
        stretch: the stretch of the run replayed (first_step, last_step, steps, of_steps,
            requests, ...); left out when the whole run was.
        settings: the shown change (the remedy, or the closest); left out without one.
        run_dir: its replayed run directory (kept with ``--out`` only, else null).
        figures: the goal figure and the trade-offs, recorded and predicted at the shown
            change; the goal's label names its request count when it has requests.
        closest: with no remedy: the tried change nearest the goal (null: none ran).
        extrapolated: with no remedy: the changes the replay says reach the goal only with
            seconds priced beyond the fitted region.
    """

    error: str | UnsetType = UNSET
    goal: GoalRecord | UnsetType = UNSET
    recorded: float | UnsetType | None = UNSET
    baseline: float | UnsetType | None = UNSET
    baseline_error: BaselineError | UnsetType = UNSET
    tried: list[TriedRecord] | UnsetType = UNSET
    complete: bool = True
    skipped: list[str] | UnsetType = UNSET
    resolved: bool | UnsetType = UNSET
    baseline_outside_region: float | UnsetType | None = UNSET
    outside_region: float | UnsetType | None = UNSET
    stretch: dict[str, Any] | UnsetType = UNSET
    settings: dict[str, Any] | UnsetType = UNSET
    run_dir: str | UnsetType | None = UNSET
    figures: dict[str, FigureChange] | UnsetType = UNSET
    closest: TriedRecord | UnsetType | None = UNSET
    extrapolated: list[TriedRecord] | UnsetType = UNSET


@dataclass
class Finding:
    """One finding of the doctor.

    Attributes:
        id: the rule's id from the catalogue (``preemption-storm`` …; a public interface).
        severity: ``critical``, ``warning`` or ``info``.
        message: one sentence with the run's numbers.
        evidence: what to look at, typed per rule (each rule's file): step ranges
            (``[first, last]``, inclusive), request ids, counts; ``engine``
            (data-parallel rank) when the run has several.
        remedy: what to change (None: no setting helps, or none is needed).
        predicted: the remedy search (:class:`Prediction`); None without a replay.
        basis: what the rule's arithmetic reads beside the evidence (:class:`Basis`, or a
            rule's subclass of it); not part of ``--json``.
    """

    id: str
    severity: str
    message: str
    evidence: Evidence = field(default_factory=Evidence)
    remedy: Remedy | None = None
    predicted: Prediction | None = None
    basis: Basis | None = field(default=None, repr=False, compare=False)

    @property
    def engine(self) -> int | None:
        """The data-parallel rank the finding is about (``evidence.engine``); None: the
        whole run."""
        return self.evidence.engine

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "severity": self.severity, "message": self.message,
                "evidence": msgspec.to_builtins(self.evidence),
                "remedy": self.remedy.to_dict() if self.remedy is not None else None,
                "predicted": msgspec.to_builtins(self.predicted) if self.predicted is not None else None}


T = TypeVar("T")


def known(value: T | UnsetType) -> T | None:
    """A :class:`Prediction` field's value, None where the prediction has none (``UNSET``)."""
    return None if isinstance(value, UnsetType) else value


E = TypeVar("E", bound=Evidence)
B = TypeVar("B", bound=Basis)


def evidence_of(f: Finding, cls: type[E]) -> E:
    """``f.evidence`` as its rule's type (every finding of a rule carries that type)."""
    e = f.evidence
    assert isinstance(e, cls), (f.id, type(e).__name__)
    return e


def basis_of(f: Finding, cls: type[B]) -> B:
    """``f.basis`` as its rule's type; raises ``TypeError`` when the finding has another
    (a finding made by hand, not by its rule)."""
    b = f.basis
    if not isinstance(b, cls):
        raise TypeError(f"{f.id}: basis is {type(b).__name__}, not {cls.__name__}")
    return b


def worst_first(findings: list[Finding], order: tuple[str, ...] = ()) -> list[Finding]:
    """Sorted by severity (critical first), then by the catalogue's ``order`` of ids."""
    rank = {rid: i for i, rid in enumerate(order)}
    return sorted(findings, key=lambda f: (SEVERITIES.index(f.severity), rank.get(f.id, len(rank))))


def has_critical(findings: list[Finding]) -> bool:
    return any(f.severity == CRITICAL for f in findings)
