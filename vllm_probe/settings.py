"""Settings files as users write them: ``settings.json`` (its ``scheduler_probe`` flags) and ``config.toml``.

A settings file is JSON, YAML (``.yaml``/``.yml``) or TOML (``.toml``). Its
``scheduler_probe`` section switches the probe's event kinds; the rest belongs to other
tools and is read as it is::

    {
      "model": "facebook/opt-125m",
      "sampling": {"temperature": 0.8, "top_p": 0.95, "max_tokens": 256},
      "scheduler_probe": {
        "log_schedule_each_step": true,
        "log_preempt_events": true,
        "log_chunk_boundaries": true
      },
      "taotoken": {"api_key_env": "TAOTOKEN_API_KEY"}
    }

* ``scheduler_probe``: unknown keys and wrong types are errors (:class:`SettingsError`),
  so a typo never silently leaves a flag at its default.
* ``model``, ``sampling`` (``settings.json``) and ``[scheduler]`` (``config.toml``: vLLM's
  engine arguments) are what the user *expects* the engine to run with
  (:class:`Expected`): ``vllm-probe run`` records them in ``meta.json`` so that the summary
  and the doctor can say where the effective ``engine_config`` differs (flags
  on the command line win over a config file). ``sampling`` and ``model`` are still
  type-checked (the examples read them).
* Any other section (``server``, ``taotoken`` …) is left alone; :attr:`Settings.ignored`
  names them for one info line.

The file's shape is declared as msgspec Structs (:class:`ProbeFlags`, ``_Sampling``,
``_SettingsFile``) and checked with ``msgspec.convert``; its errors become one line
naming the file and the key.
"""

from __future__ import annotations

import difflib
import json
import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any

import msgspec
import yaml
from msgspec import UNSET, UnsetType

from .schema.engine_settings import ENGINE_SETTINGS


class SettingsError(ValueError):
    """A settings file cannot be used; the message names the file and the key."""


class ProbeFlags(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The ``scheduler_probe`` section. Each flag switches one family of events."""

    #: ``step`` events, one per ``schedule()`` call.
    log_schedule_each_step: bool = True
    #: ``preempt`` events, one per preempted request.
    log_preempt_events: bool = True
    #: ``chunk`` events, one per prefill chunk.
    log_chunk_boundaries: bool = True
    #: ``request_added`` / ``request_finished`` events (needed for queue time and TTFT).
    log_request_events: bool = True
    #: ``request_added.block_digests``: salted digests of the prompt's full-block hashes
    #: (with prefix caching on), so ``vllm-probe whatif`` replays prefix-cache hits. Never
    #: token ids; the salt is random per engine core and never written.
    log_block_digests: bool = True
    #: Events held in memory before the writer thread drains them; beyond it they are
    #: dropped and counted, so a stalled disk never grows the engine's memory. At least 1.
    queue_capacity: Annotated[int, msgspec.Meta(ge=1)] = 65536
    #: Size at which the engine core's event file is closed and the next segment opened
    #: (MiB, 2**20 bytes; fractions allowed; 0: one file, never rotated). Segment 1 is
    #: ``events-<pid>.jsonl``, segment n ``events-<pid>.<n>.jsonl``. 64 MiB is about 3 to
    #: 10 minutes of a busy GPU server (~400 bytes per step at 30-100 steps/s).
    max_segment_mb: Annotated[float, msgspec.Meta(ge=0)] = 64
    #: Also close a segment this many seconds after it was opened (None: by size only).
    rotate_every_s: Annotated[float, msgspec.Meta(gt=0)] | None = None
    #: Gzip closed segments (``.jsonl.gz``) on a helper thread, off the scheduler's path.
    compress_segments: bool = True
    #: Most MiB the closed segments of one engine core may take on disk; the oldest are
    #: removed beyond it (None: keep all). The open segment comes on top.
    keep_mb: Annotated[float, msgspec.Meta(ge=0)] | None = None
    #: Closed segments older than this many hours are removed (None: keep all).
    keep_hours: Annotated[float, msgspec.Meta(gt=0)] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The flags as ``{name: value}`` in declaration order (``engine_config.flags``)."""
        return msgspec.structs.asdict(self)


class _Sampling(msgspec.Struct, forbid_unknown_fields=True):
    """The ``sampling`` section, read by the examples (absent keys stay UNSET)."""

    temperature: int | float | UnsetType = UNSET
    top_p: int | float | UnsetType = UNSET
    max_tokens: int | UnsetType = UNSET
    seed: int | UnsetType = UNSET


class _SettingsFile(msgspec.Struct):
    """A settings file's top level: every section optional, none of the probe's and the
    examples' may be null; other tools' sections pass unchecked."""

    model: str | UnsetType = UNSET
    sampling: _Sampling | UnsetType = UNSET
    scheduler_probe: ProbeFlags = msgspec.field(default_factory=ProbeFlags)
    scheduler: dict[str, Any] | UnsetType = UNSET


#: Sections of a settings file the probe reads (all others are other tools').
PROBE_SECTIONS = ("scheduler_probe",)
#: Sections read as what the user expects of the engine (:class:`Expected`).
EXPECTED_SECTIONS = ("scheduler", "model", "sampling")


class Expected(msgspec.Struct, frozen=True):
    """What a user's file says the engine should run with (recorded in ``meta.json``).

    Attributes:
        source: the file it came from.
        engine: vLLM engine arguments by their Python names (``max_num_batched_tokens``;
            ``config.toml``'s ``[scheduler]``, or a YAML of engine arguments, dashes read
            as underscores), values as written.
        model: the ``model`` of a ``settings.json``.
        sampling: its ``sampling`` section (``max_tokens``, ``temperature`` …).
    """

    source: str
    engine: dict[str, Any] = {}
    model: str | None = None
    sampling: dict[str, Any] | None = None

    def is_empty(self) -> bool:
        return not self.engine and self.model is None and not self.sampling


@dataclass(frozen=True)
class Settings:
    """A parsed settings file. ``source`` is the path it came from (None: defaults).

    Attributes:
        flags: the ``scheduler_probe`` section.
        model, sampling: those sections, as written (the examples read them).
        expected: what the file says the engine should run with (None: nothing).
        ignored: top-level sections the probe leaves alone (other tools').
        empty: the file holds no key at all (all comments, as a one-line
            ``config.toml`` is when copied verbatim).
    """

    flags: ProbeFlags
    model: str | None = None
    sampling: dict[str, Any] | None = None
    source: str | None = None
    expected: Expected | None = None
    ignored: tuple[str, ...] = ()
    empty: bool = False


# -- msgspec's validation errors as one line naming the key ------------------------------
# msgspec says what and where ("Expected `bool`, got `str` - at `$.scheduler_probe.x`";
# "Object contains unknown field `x` - at `$.scheduler_probe`"; "Expected `int` >= 1 -
# at `$...`"; "Expected `str` - at `key` in `$...`" for a key that is not a string). The
# path names the key; what the key takes, the known keys and the value shown come from
# the Structs above and the data.

_ERROR = re.compile(r"^(?P<what>.*?)(?: - at (?P<key>`key` in )?`\$(?P<path>[^`]*)`)?$", re.DOTALL)
_TYPE_NAMES = {msgspec.inspect.BoolType: "true/false", msgspec.inspect.IntType: "an integer",
               msgspec.inspect.FloatType: "a number", msgspec.inspect.StrType: "a string",
               msgspec.inspect.StructType: "an object", msgspec.inspect.DictType: "an object",
               msgspec.inspect.NoneType: "null"}


def _struct_of(t: msgspec.inspect.Type) -> msgspec.inspect.StructType | None:
    if isinstance(t, msgspec.inspect.UnionType):
        return next((m for m in t.types if isinstance(m, msgspec.inspect.StructType)), None)
    return t if isinstance(t, msgspec.inspect.StructType) else None


def _type_name(t: msgspec.inspect.Type) -> str:
    members = t.types if isinstance(t, msgspec.inspect.UnionType) else (t,)
    return " or ".join(_TYPE_NAMES.get(type(m), type(m).__name__) for m in members)


def _shown(value: Any) -> str:
    """A value as the error line shows it: its JSON text (one line)."""
    try:  # default=str: YAML and TOML also decode dates and times, which json cannot encode
        return json.dumps(value, default=str)
    except (TypeError, ValueError, RecursionError):  # e.g. a YAML mapping with list keys
        return " ".join(repr(value).split())


def _error_line(err: msgspec.ValidationError, data: Any, source: str) -> str:
    """The one-line :class:`SettingsError` message for msgspec's ``err`` on ``data``."""
    m = _ERROR.match(str(err))
    if m is None:  # a message shape msgspec did not use so far: said as it is
        return f"{source}: {err}"
    what, path = m["what"], [k for k in (m["path"] or "").split(".") if k]
    struct: Any = msgspec.inspect.type_info(_SettingsFile)
    value, field_type = data, struct
    for key in path:  # down the Structs and the data alike
        struct = _struct_of(field_type)
        field_type = next((f.type for f in struct.fields if f.name == key), None) if struct else None
        value = value.get(key) if isinstance(value, dict) else None
        if field_type is None:
            break
    where = ".".join(path)
    section = _struct_of(field_type)
    if (m["key"] or what.startswith("Object contains unknown field")) and section and isinstance(value, dict):
        # the first key of the section that is not a string (YAML, TOML) or not a field
        known = [f.name for f in section.fields]
        unknown = next((k for k in value if not isinstance(k, str) or k not in known), None)
        if unknown is not None:
            name = f"{where}.{unknown}" if where else unknown
            return f"{source}: unknown key {name!r} (known: {', '.join(known)})"
    if not path and what.startswith("Expected `object`"):
        return f"{source}: the top level must be an object, got {type(data).__name__}"
    at_least = re.match(r"Expected `(?:int|float)( \| null)?` (>=?) (-?[\d.]+?)(?:\.0)?$", what)
    if at_least:
        bound = "at least" if at_least[2] == ">=" else "above"
        return f"{source}: {where} must be {bound} {at_least[3]}{' (or null)' if at_least[1] else ''}"
    if what.startswith("Expected `") and field_type is not None:
        return f"{source}: {where}: expected {_type_name(field_type)}, got {_shown(value)}"
    return f"{source}: {where or 'settings'}: {' '.join(what.split())}"


def _parse_text(text: str, path: Path) -> Any:
    """A settings file's text decoded by its suffix; a file of only whitespace is None
    (the defaults) in every format, as a comment-only YAML or TOML file already is."""
    suffix = path.suffix.lower()
    if not text.strip():
        return None
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
    """Validate an already-decoded settings object (``None``, an empty file: the defaults).

    Raises:
        SettingsError: wrong type, unknown key, or a value out of range; the message
            starts with ``source`` and names the key (e.g. ``scheduler_probe.log_x``).
    """
    if data is None:
        data = {}
    if isinstance(data, dict):
        for key in data:  # another tool's section is fine; a misspelt one of ours is not
            near = difflib.get_close_matches(str(key), PROBE_SECTIONS + EXPECTED_SECTIONS, n=1, cutoff=0.8)
            if near and near[0] != key:
                raise SettingsError(f"{source}: unknown key {str(key)!r} (did you mean {near[0]!r}?)")
    try:
        parsed = msgspec.convert(data, _SettingsFile)
    except msgspec.ValidationError as e:
        raise SettingsError(_error_line(e, data, source)) from None
    expected = Expected(source, _engine_args(data.get("scheduler") or {}, source, "scheduler."), data.get("model"),
                        data.get("sampling"))
    ignored = tuple(str(k) for k in data if k not in PROBE_SECTIONS + EXPECTED_SECTIONS)
    return Settings(flags=parsed.scheduler_probe, model=data.get("model"), sampling=data.get("sampling"),
                    source=source, expected=None if expected.is_empty() else expected, ignored=ignored)


#: The JSON type of each engine argument that ``engine_config`` records, as vLLM 0.32's
#: ``EngineArgs`` annotates it (``vllm/engine/arg_utils.py``: ``max_num_batched_tokens:
#: int | None``, ``gpu_memory_utilization: float``, ``scheduling_policy: SchedulerPolicy``,
#: a literal string …). A value of another type in a user's file is refused
#: (:class:`SettingsError`): ``"8k"`` is not a token budget vLLM would accept.
ENGINE_ARG_TYPES: dict[str, tuple[type, ...]] = {
    s.engine_arg: ((float, int) if s.type is float else (s.type,)) for s in ENGINE_SETTINGS if s.config_key}
_TYPE_WORDS = {int: "an integer", float: "a number", bool: "true/false", str: "a string"}


def _engine_args(mapping: dict, source: str = "settings", section: str = "") -> dict[str, Any]:
    """Engine arguments by their Python names: ``max-num-seqs`` reads ``max_num_seqs``;
    nested values (not engine arguments of the scheduler) are left out; null is kept.

    Raises:
        SettingsError: a recorded argument (:data:`ENGINE_ARG_TYPES`) has a value of the
            wrong type (``max_num_batched_tokens = "8k"``; true/false is not an integer).
    """
    out = {str(k).replace("-", "_"): v for k, v in mapping.items()
           if isinstance(v, (bool, int, float, str)) or v is None}
    for name, value in out.items():
        want = ENGINE_ARG_TYPES.get(name)
        if value is None or want is None:
            continue
        if isinstance(value, bool) != (bool in want) or not isinstance(value, want):
            raise SettingsError(f"{source}: {section}{name}: expected {_TYPE_WORDS[want[0]]} (vLLM's engine argument), "
                                f"got {_shown(value)}")
    return out


def load_expected(path: str | Path) -> Expected:
    """What a file says the engine should run with (``vllm-probe doctor --expect FILE``).

    The file is a ``config.toml`` with a ``[scheduler]`` section, a ``settings.json``
    (its ``model``/``sampling``, and ``scheduler`` if it has one), or a YAML/JSON of vLLM
    engine arguments (top-level keys, as ``vllm serve --config`` takes them).

    Raises:
        SettingsError: the file is missing, unreadable, cannot be parsed, or is not an
            object.
    """
    p = Path(path)
    data = _parse_text(_read(p), p)
    if data is None:  # an empty file: nothing expected
        return Expected(str(p))
    if not isinstance(data, dict):
        raise SettingsError(f"{p}: the top level must be an object, got {type(data).__name__}")
    if any(isinstance(data.get(k), dict) for k in ("scheduler_probe", "scheduler", "sampling")):
        settings = parse_settings(data, str(p))
        return settings.expected or Expected(str(p))
    model = data.get("model")
    return Expected(str(p), {k: v for k, v in _engine_args(data, str(p)).items() if k != "model"},
                    model if isinstance(model, str) else None)


def load_settings(path: str | Path | None) -> Settings:
    """Read and validate a settings file; ``None`` gives the defaults (every flag on).

    Raises:
        SettingsError: the file is missing or unreadable, cannot be parsed, or fails
            :func:`parse_settings`.
    """
    if path is None:
        return Settings(flags=ProbeFlags())
    p = Path(path)
    data = _parse_text(_read(p), p)
    settings = parse_settings(data, str(p))
    if not data:
        settings = replace(settings, empty=True)
    return settings


def _read(p: Path) -> str:
    try:
        return p.read_text(encoding="utf-8-sig")  # a BOM (Windows editors write one) is not part of the text
    except FileNotFoundError:
        raise SettingsError(f"{p}: settings file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SettingsError(f"{p}: cannot read settings file: {e}") from None
