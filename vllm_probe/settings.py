"""The ``settings.json`` of the seed notes: its ``scheduler_probe`` flags switch event kinds.

A settings file is JSON, YAML (``.yaml``/``.yml``) or TOML (``.toml``) with these
top-level sections, all optional::

    {
      "model": "facebook/opt-125m",
      "sampling": {"temperature": 0.8, "top_p": 0.95, "max_tokens": 256},
      "scheduler_probe": {
        "log_schedule_each_step": true,
        "log_preempt_events": true,
        "log_chunk_boundaries": true
      }
    }

Only ``scheduler_probe`` affects the probe; ``model`` and ``sampling`` are read by the
examples. Unknown keys and wrong types are errors (:class:`SettingsError`), so a typo
never silently leaves a flag at its default.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import yaml


class SettingsError(ValueError):
    """A settings file cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class ProbeFlags:
    """The ``scheduler_probe`` section. Each flag switches one family of events."""

    #: ``step`` events, one per ``schedule()`` call.
    log_schedule_each_step: bool = True
    #: ``preempt`` events, one per preempted request.
    log_preempt_events: bool = True
    #: ``chunk`` events, one per prefill chunk.
    log_chunk_boundaries: bool = True
    #: ``request_added`` / ``request_finished`` events (needed for queue time and TTFT).
    log_request_events: bool = True
    #: Events held in memory before the writer thread drains them; beyond it they are
    #: dropped and counted, so a stalled disk never grows the engine's memory.
    queue_capacity: int = 65536

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_SECTION_TYPES: dict[str, type | tuple[type, ...]] = {
    "model": str,
    "sampling": dict,
    "scheduler_probe": dict,
}
_SAMPLING_TYPES: dict[str, tuple[type, ...]] = {
    "temperature": (int, float),
    "top_p": (int, float),
    "max_tokens": (int,),
    "seed": (int,),
}


@dataclass(frozen=True)
class Settings:
    """A parsed settings file. ``source`` is the path it came from (None: defaults)."""

    flags: ProbeFlags
    model: str | None = None
    sampling: dict[str, Any] | None = None
    source: str | None = None


def _type_name(t: type | tuple[type, ...]) -> str:
    ts = t if isinstance(t, tuple) else (t,)
    names = {bool: "true/false", int: "an integer", float: "a number", str: "a string", dict: "an object"}
    return " or ".join(names.get(x, x.__name__) for x in ts)


def _check_type(value: Any, expected: type | tuple[type, ...], where: str) -> None:
    exp = expected if isinstance(expected, tuple) else (expected,)
    # bool is a subclass of int: `"max_tokens": true` must not pass as an integer.
    if isinstance(value, bool) and bool not in exp:
        ok = False
    else:
        ok = isinstance(value, exp)
    if not ok:
        # default=str: YAML and TOML also decode dates and times, which json cannot encode
        raise SettingsError(f"{where}: expected {_type_name(expected)}, got {json.dumps(value, default=str)}")


def _parse_text(text: str, path: Path) -> Any:
    suffix = path.suffix.lower()
    try:
        if suffix in (".yaml", ".yml"):
            return yaml.safe_load(text)
        if suffix == ".toml":
            return tomllib.loads(text)
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise SettingsError(f"{path}: not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except yaml.YAMLError as e:
        raise SettingsError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    except tomllib.TOMLDecodeError as e:
        raise SettingsError(f"{path}: not valid TOML: {e}") from None
    except RecursionError:
        raise SettingsError(f"{path}: nested too deeply to be a settings file") from None


def parse_settings(data: Any, source: str) -> Settings:
    """Validate an already-decoded settings object.

    Raises:
        SettingsError: wrong type, unknown key, or a value out of range; the message
            starts with ``source`` and names the key (e.g. ``scheduler_probe.log_x``).
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SettingsError(f"{source}: the top level must be an object, got {type(data).__name__}")
    for key, value in data.items():
        if key not in _SECTION_TYPES:
            raise SettingsError(f"{source}: unknown key {key!r} (known: {', '.join(_SECTION_TYPES)})")
        _check_type(value, _SECTION_TYPES[key], f"{source}: {key}")

    probe = data.get("scheduler_probe", {})
    known = {f.name: f for f in fields(ProbeFlags)}
    for key, value in probe.items():
        if key not in known:
            raise SettingsError(
                f"{source}: unknown key 'scheduler_probe.{key}' (known: {', '.join(known)})"
            )
        expected = bool if known[key].type in ("bool", bool) else int
        _check_type(value, expected, f"{source}: scheduler_probe.{key}")
    if probe.get("queue_capacity", 1) < 1:
        raise SettingsError(f"{source}: scheduler_probe.queue_capacity must be at least 1")

    sampling = data.get("sampling")
    if sampling is not None:
        for key, value in sampling.items():
            if key not in _SAMPLING_TYPES:
                raise SettingsError(
                    f"{source}: unknown key 'sampling.{key}' (known: {', '.join(_SAMPLING_TYPES)})"
                )
            _check_type(value, _SAMPLING_TYPES[key], f"{source}: sampling.{key}")

    return Settings(flags=ProbeFlags(**probe), model=data.get("model"), sampling=sampling, source=source)


def load_settings(path: str | Path | None) -> Settings:
    """Read and validate a settings file; ``None`` gives the defaults (every flag on).

    Raises:
        SettingsError: the file is missing or unreadable, cannot be parsed, or fails
            :func:`parse_settings`.
    """
    if path is None:
        return Settings(flags=ProbeFlags())
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SettingsError(f"{p}: settings file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SettingsError(f"{p}: cannot read settings file: {e}") from None
    return parse_settings(_parse_text(text, p), str(p))
