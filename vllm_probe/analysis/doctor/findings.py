"""What the doctor reports: a :class:`Finding`, its :class:`Remedy`, severities.

The shape of ``vllm-probe doctor --json`` (a public interface)::

    {"run_dir": "...", "findings": [{"id", "severity", "message", "evidence": {...},
                                     "remedy": {...} | null, "predicted": {...} | null}]}

``remedy`` is :meth:`Remedy.to_dict`; ``predicted`` is filled by ``--whatif``
(:mod:`vllm_probe.analysis.doctor.predict`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import msgspec

from .evidence import Evidence

CRITICAL, WARNING, INFO = "critical", "warning", "info"
#: Severities, worst first.
SEVERITIES = (CRITICAL, WARNING, INFO)


@dataclass
class Remedy:
    """What to change, by how much, and why.

    Attributes:
        setting: the vLLM engine argument to change (as ``vllm serve`` / ``LLM(...)``
            spell it with underscores), e.g. ``num_gpu_blocks_override``.
        value: the suggested value, computed from the run.
        arithmetic: how the value follows from the run's numbers, one line.
        tradeoff: what the change costs, one line.
        source: the rule's source (vLLM's tuning guide, SGLang's, the seed notes, vLLM's
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
        return asdict(self)


@dataclass
class Finding:
    """One finding of the doctor.

    Attributes:
        id: the rule's id from the catalogue (``preemption-storm`` …; a public interface).
        severity: ``critical``, ``warning`` or ``info``.
        message: one sentence with the run's numbers.
        evidence: what to look at, typed per rule (:mod:`.evidence`): step ranges
            (``[first, last]``, inclusive), request ids, counts; ``engine``
            (data-parallel rank) when the run has several.
        remedy: what to change (None: no setting helps, or none is needed).
        predicted: with ``--whatif``: ``{"settings", "run_dir", "figures": {name:
            {"recorded", "predicted", "unit"}}, "resolved", "baseline_error"}``
            (:func:`vllm_probe.analysis.doctor.predict.attach`); else None.
    """

    id: str
    severity: str
    message: str
    evidence: Evidence = field(default_factory=Evidence)
    remedy: Remedy | None = None
    predicted: dict[str, Any] | None = None
    #: what the rule's arithmetic reads beside the evidence (the engine core's state and
    #: episodes, the figures it computed): not part of ``--json``
    basis: Any = field(default=None, repr=False, compare=False)

    @property
    def engine(self) -> int | None:
        """The data-parallel rank the finding is about (``evidence.engine``); None: the
        whole run."""
        return self.evidence.engine

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "severity": self.severity, "message": self.message, "evidence": msgspec.to_builtins(self.evidence),
                "remedy": self.remedy.to_dict() if self.remedy is not None else None, "predicted": self.predicted}


def worst_first(findings: list[Finding], order: tuple[str, ...] = ()) -> list[Finding]:
    """Sorted by severity (critical first), then by the catalogue's ``order`` of ids."""
    rank = {rid: i for i, rid in enumerate(order)}
    return sorted(findings, key=lambda f: (SEVERITIES.index(f.severity), rank.get(f.id, len(rank))))


def has_critical(findings: list[Finding]) -> bool:
    return any(f.severity == CRITICAL for f in findings)
