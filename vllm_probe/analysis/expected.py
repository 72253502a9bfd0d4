"""What the user expected against what the engine ran with ("I changed config.toml
but nothing changed": command-line flags win).

A user's file names vLLM engine arguments (``config.toml``'s ``[scheduler]``, a YAML of
engine arguments: :class:`vllm_probe.settings.Expected`); the engine core's
``engine_config`` event records the settings in force, after vLLM applied its defaults,
the platform's overrides and the command line. :func:`check_expected` lines them up,
one :class:`SettingCheck` per expected setting. The summary shows the differences and
the doctor's ``config-not-applied`` finding reports them. A ``settings.json``'s
``sampling`` section is checked against what the requests asked for
(:func:`check_sampling`, from ``request_added``), and its ``model`` is reported as not
recorded (:func:`check_model`: no event names the model).
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..schema.engine_settings import ENGINE_SETTINGS

#: vLLM engine argument -> the ``engine_config`` field that records its effect (the
#: settings vocabulary's recorded entries).
ENGINE_ARG_FIELDS: dict[str, str] = {s.engine_arg: s.config_key for s in ENGINE_SETTINGS if s.config_key}
#: Settings the V1 engine does not have, and why (vLLM 0.32, ``vllm/engine/arg_utils.py``).
NOT_IN_V1: dict[str, str] = {
    "preemption_mode": "vLLM V1 always preempts by recompute (the swap mode was V0's)",
}

#: Statuses of a :class:`SettingCheck`. ``unknown``: not an engine argument of vLLM (a
#: misspelt key: vLLM would never see it, so the run cannot show "no difference").
DIFFERS, MATCHES, NOT_RECORDED, NOT_V1, UNKNOWN = "differs", "matches", "not_recorded", "not_v1", "unknown"

#: How alike a name must be to vLLM's closest engine argument to be offered as "did you
#: mean" (``difflib.SequenceMatcher.ratio``; ``max_num_batched_token`` against
#: ``max_num_batched_tokens`` is 0.98, against ``max_num_seqs`` 0.55).
CLOSE_NAME_RATIO = 0.75


@functools.lru_cache(maxsize=1)
def engine_arg_names() -> frozenset[str]:
    """The names of vLLM's engine arguments: the annotated fields of ``EngineArgs`` in the
    installed ``vllm/engine/arg_utils.py``, read with ``ast`` (vLLM is not imported: that
    takes seconds). Without vLLM installed (or an ``arg_utils.py`` that does not parse):
    the arguments this module knows (:data:`ENGINE_ARG_FIELDS`, :data:`NOT_IN_V1`)."""
    known = frozenset(ENGINE_ARG_FIELDS) | frozenset(NOT_IN_V1)
    try:
        spec = importlib.util.find_spec("vllm")
        if spec is None or not spec.submodule_search_locations:
            return known
        path = Path(next(iter(spec.submodule_search_locations))) / "engine" / "arg_utils.py"
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError, ImportError):
        return known
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "EngineArgs":
            names = {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
            return frozenset(names) | known
    return known


def closest_engine_arg(name: str) -> str | None:
    """vLLM's engine argument closest to ``name`` (``difflib``, at least
    :data:`CLOSE_NAME_RATIO` alike), None when none is."""
    near = difflib.get_close_matches(name, sorted(engine_arg_names()), n=1, cutoff=CLOSE_NAME_RATIO)
    return near[0] if near else None


@dataclass(frozen=True)
class SettingCheck:
    """One expected setting against the engine's.

    Attributes:
        setting: the engine argument as the file names it (Python spelling).
        expected: its value in the file.
        effective: the value ``engine_config`` recorded (None: not recorded).
        status: :data:`DIFFERS`, :data:`MATCHES`, :data:`NOT_RECORDED` (``engine_config``
            has no field for it), :data:`NOT_V1` (no such setting in vLLM V1) or
            :data:`UNKNOWN` (not an engine argument of vLLM: misspelt).
        note: why, for the last three; for sampling, how many requests had which value.
        suggestion: for :data:`UNKNOWN`, vLLM's closest engine argument (None: none close).
        section: where the setting is in the file: ``engine`` (``[scheduler]``, engine
            arguments), ``model`` or ``sampling``.
    """

    setting: str
    expected: Any
    effective: Any
    status: str
    note: str = ""
    section: str = "engine"
    suggestion: str | None = None


def _same(expected: Any, effective: Any) -> bool:
    """Equal as settings: booleans only to booleans, numbers by value, names case-blind."""
    if isinstance(expected, bool) or isinstance(effective, bool):
        return type(expected) is type(effective) and expected == effective
    if isinstance(expected, (int, float)) and isinstance(effective, (int, float)):
        return math.isclose(expected, effective, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(expected, str) and isinstance(effective, str):
        return expected.strip().lower() == effective.strip().lower()
    return bool(expected == effective)


def check_expected(expected_engine: dict[str, Any], config: Any) -> list[SettingCheck]:
    """Each expected engine argument against the ``engine_config`` record ``config``
    (None: no engine_config in the run), in the file's order."""
    checks = []
    for setting, value in expected_engine.items():
        if setting in NOT_IN_V1:
            checks.append(SettingCheck(setting, value, None, NOT_V1, NOT_IN_V1[setting]))
            continue
        field = ENGINE_ARG_FIELDS.get(setting)
        if field is None and setting not in engine_arg_names():
            near = closest_engine_arg(setting)
            note = "not an engine argument of vLLM" + (f": did you mean {near}?" if near else "")
            checks.append(SettingCheck(setting, value, None, UNKNOWN, note, suggestion=near))
            continue
        effective = getattr(config, field, None) if (config is not None and field) else None
        if effective is None:
            why = "engine_config does not record it" if field is None or config is not None else "no engine_config"
            checks.append(SettingCheck(setting, value, None, NOT_RECORDED, why))
        else:
            checks.append(SettingCheck(setting, value, effective, MATCHES if _same(value, effective) else DIFFERS))
    return checks


def check_model(model: Any) -> list[SettingCheck]:
    """A settings file's ``model`` (None: no check): events do not name the engine's model,
    so it is :data:`NOT_RECORDED` (the command line in ``meta.json`` usually does)."""
    if model is None:
        return []
    return [SettingCheck("model", model, None, NOT_RECORDED, "the events do not name the model; see the command",
                         "model")]


def check_sampling(expected_sampling: dict[str, Any], seen: dict[str, dict[Any, int]]) -> list[SettingCheck]:
    """A settings file's ``sampling`` section against what the requests asked for.

    Args:
        expected_sampling: e.g. ``{"temperature": 0.8, "top_p": 0.95, "max_tokens": 256}``.
        seen: field -> value -> requests, from ``request_added``
            (:attr:`vllm_probe.analysis.state.EngineState.sampling_seen`).

    Each check's ``effective`` is the value every request had, or the list of values
    seen, most frequent first; :data:`MATCHES` only when every request had the expected
    value; :data:`NOT_RECORDED` when no request recorded the field.
    """
    checks = []
    for setting, value in expected_sampling.items():
        values = seen.get(setting) or {}
        if not values:
            checks.append(SettingCheck(setting, value, None, NOT_RECORDED, "no request recorded it", "sampling"))
            continue
        ranked = sorted(values, key=lambda v: (-values[v], str(v)))
        total = sum(values.values())
        effective = ranked[0] if len(ranked) == 1 else ranked
        same = len(ranked) == 1 and _same(value, ranked[0])
        note = f"{total} request{'s' if total != 1 else ''}" if len(ranked) == 1 else \
            ", ".join(f"{v}: {values[v]}" for v in ranked[:4]) + (" …" if len(ranked) > 4 else "")
        checks.append(SettingCheck(setting, value, effective, MATCHES if same else DIFFERS, note, "sampling"))
    return checks
