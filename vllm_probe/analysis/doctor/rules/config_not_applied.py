"""``config-not-applied``: the engine ran with settings other than the file meant.

Command-line flags and engine arguments win over config files;
``engine_config`` records what was in force, and the expected settings (``--expect``, or what
``vllm-probe run --settings`` recorded) are checked against it. A misspelt name is read as
vLLM's closest engine argument.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ....schema.engine_settings import ENGINE_SETTINGS
from ...expected import DIFFERS, NOT_RECORDED, NOT_V1, UNKNOWN
from ..context import SRC_FLAGS_WIN, Context
from ...text import fmt_count, fmt_figure
from ..evidence import Evidence
from ..findings import WARNING, Basis, Finding, Remedy, basis_of, evidence_of
from ..rule import Rule

class SettingDiffers(msgspec.Struct):
    """An expected setting the engine did not run with.

    Attributes:
        setting: the vLLM engine argument.
        expected: the value the file gave.
        effective: the value in engine_config.
    """

    setting: str
    expected: Any
    effective: Any


class UnknownSetting(msgspec.Struct):
    """A name in the settings file that is no engine argument of vLLM (misspelt).

    Attributes:
        setting: the name as the file spells it.
        expected: the value the file gave.
        did_you_mean: vLLM's closest engine argument (difflib over ``EngineArgs``'s
            fields), or None.
    """

    setting: str
    expected: Any
    did_you_mean: str | None


class NotInV1(msgspec.Struct):
    """An expected setting vLLM V1 does not have.

    Attributes:
        setting: the name the file gave.
        note: what V1 does instead.
    """

    setting: str
    note: str | None


class ConfigEvidence(Evidence, kw_only=True):
    """``config-not-applied``: the file said one thing, the engine ran another.

    Attributes:
        source: the file the expected settings came from.
        differs: the settings that did not take effect.
        not_recorded: expected settings engine_config does not record (not checked).
        not_in_v1: expected settings that are not settings of vLLM V1.
        unknown: names that are no engine argument of vLLM (misspelt), each with vLLM's
            closest argument; absent when there are none.
    """

    source: str
    differs: list[SettingDiffers]
    not_recorded: list[str]
    not_in_v1: list[NotInV1]
    unknown: list[UnknownSetting] | None = None


class ConfigBasis(Basis, kw_only=True):
    """What the arithmetic reads (not an engine core's: the whole run's settings).

    Attributes:
        meant: ``(engine argument, value)`` the file meant, a misspelt name read as vLLM's
            closest argument.
        whatif: the same in ``whatif --set`` names, where the replay has them.
        misspelt: ``(vLLM's argument, the file's spelling)``.
        source: the file.
    """

    meant: list[tuple[str, Any]]
    whatif: dict[str, Any]
    misspelt: list[tuple[str, str]]
    source: str


def evaluate(ctx: Context) -> list[Finding]:
    """Expected settings (``--expect``, or what ``run --settings`` recorded) that the
    effective ``engine_config`` contradicts."""
    if not ctx.expected:
        return []
    differs = [c for c in ctx.expected if c.status == DIFFERS]
    unrecorded = [c for c in ctx.expected if c.status == NOT_RECORDED]
    unknown = [c for c in ctx.expected if c.status == UNKNOWN]  # misspelt: vLLM never saw them
    if not differs and not unknown:
        return []
    src = ctx.expected_source or "the expected settings"
    parts = [f"{c.setting} {_v(c.expected)} expected, {_v(c.effective)} in force" for c in differs]
    parts += [f"{c.setting} is not an engine argument of vLLM"
              + (f" (did you mean {c.suggestion}?)" if c.suggestion else "") for c in unknown]
    n = len(differs) + len(unknown)
    msg = (f"{n} setting{'s' if n != 1 else ''} of {src} did not take effect: " + "; ".join(parts)
           + (" (command-line flags and engine arguments win over config files)" if differs else ""))
    # what the file meant: a misspelt name read as its closest engine argument
    meant = [(c.setting, c.expected) for c in differs] + [(c.suggestion, c.expected) for c in unknown if c.suggestion]
    if _on_cpu(ctx) and any(name == "gpu_memory_utilization" for name, _ in meant):
        # the CPU backend reads it as a share of the machine's memory: 0.9 fails at start-up
        meant = [(name, v) for name, v in meant if name != "gpu_memory_utilization"]
        msg += ("; on the CPU backend gpu_memory_utilization is a share of the machine's memory (0.9 fails at "
                "start-up): its KV cache is sized by VLLM_CPU_KVCACHE_SPACE (GiB), so that setting is not passed on")
    whatif = {_WHATIF_NAME[name]: value for name, value in meant if name in _WHATIF_NAME}
    misspelt = [(c.suggestion, c.setting) for c in unknown if c.suggestion]
    return [Finding("config-not-applied", WARNING, msg, ConfigEvidence(
        source=src, differs=[SettingDiffers(c.setting, c.expected, c.effective) for c in differs],
        not_recorded=[c.setting for c in unrecorded],
        not_in_v1=[NotInV1(c.setting, c.note) for c in ctx.expected if c.status == NOT_V1],
        unknown=[UnknownSetting(c.setting, c.expected, c.suggestion) for c in unknown] or None),
        basis=ConfigBasis(meant=meant, whatif=whatif, misspelt=misspelt, source=src))]


def _on_cpu(ctx: Context) -> bool:
    """Whether an engine core of the run recorded the CPU platform."""
    return any(e.config is not None and str(getattr(e.config, "platform", "") or "").lower() == "cpu"
               for e in ctx.state.engines.values())


def arithmetic(ctx: Context, f: Finding) -> Remedy | None:
    """The settings the file meant, passed where they win (the command line); a misspelt
    name is read as vLLM's closest engine argument."""
    b = basis_of(f, ConfigBasis)
    meant, whatif, misspelt, src = b.meant, b.whatif, b.misspelt, b.source
    if not meant:
        return None
    return Remedy(_WHATIF_NAME.get(meant[0][0], meant[0][0]), meant[0][1],
                  "pass " + ", ".join(f"--{name.replace('_', '-')} {_arg(value)}" for name, value in meant)
                  + " on the command line (or in the engine arguments the server reads)"
                  + (f"; in {src}, spell " + ", ".join(f"{good} (not {bad})" for good, bad in misspelt)
                     if misspelt else ""),
                  "none: the run then has the settings the file meant", SRC_FLAGS_WIN, whatif=whatif)


#: vLLM engine argument -> ``vllm-probe whatif --set`` name (the settings vocabulary's replayable entries).
_WHATIF_NAME = {s.engine_arg: s.name for s in ENGINE_SETTINGS if s.replayable}


def _arg(v: Any) -> str:
    """A value as a command-line flag takes it (``8192``, ``true``)."""
    return str(v).lower() if isinstance(v, bool) else str(v)


def _v(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int):
        return fmt_count(v)
    return str(v)


def view(f: Finding) -> list[str]:
    """Each setting expected and in force; what was not checked."""
    e = evidence_of(f, ConfigEvidence)
    out = [f"{d.setting}: expected {fmt_figure(d.expected)}, in force {fmt_figure(d.effective)}" for d in e.differs]
    if e.not_recorded:
        out.append("not recorded by engine_config (not checked): " + ", ".join(e.not_recorded))
    for n in e.not_in_v1:
        out.append(f"{n.setting}: not a setting of vLLM V1 ({n.note})")
    return out


RULE = Rule(
    "config-not-applied",
    "The engine ran with settings other than the file meant: command-line flags and engine "
    "arguments win over config files; engine_config records what was in force.",
    evaluate,
    ConfigEvidence,
    arithmetic=arithmetic, view=view)
