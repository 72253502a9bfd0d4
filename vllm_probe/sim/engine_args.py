"""The engine arguments a what-if replay can change, how they map onto vLLM, and their checks.

:data:`SETTINGS` names every setting ``vllm-probe whatif --set KEY=V[,V...]`` takes, by
vLLM's engine-argument names (``max_num_batched_tokens``, ``enable_prefix_caching`` …),
with the ``engine_config`` field that records it. :func:`parse_sets` turns ``--set``
arguments into the grid (their cartesian product); :func:`resolve` applies one point
of it to a recorded ``engine_config`` and returns every setting in force plus the
harness's :class:`~vllm_probe.sim.harness.SchedulerSpec`; :func:`check` validates it
the way vLLM would at start-up, before any replay runs.

Errors are :class:`SettingError`, one line each:

* an unknown key (with the closest known one), a value of the wrong type;
* a setting the installed vLLM does not have (``max_num_partial_prefills`` after 0.26;
  the V1 scheduler never read it) or that the recorded run cannot convert
  (``gpu_memory_utilization`` when the run fixed its KV cache with
  ``num_gpu_blocks_override``);
* what vLLM's own ``SchedulerConfig`` refuses (its message, e.g. "max_num_batched_tokens
  (8) must be greater than or equal to max_num_seqs (16)");
* a KV cache that cannot hold one request of ``max_model_len`` (vLLM refuses to start:
  ``check_enough_kv_cache_memory`` in ``vllm/v1/core/kv_cache_utils.py``).
"""

from __future__ import annotations

import difflib
import itertools
import math
from dataclasses import replace
from typing import Any

from ..schema.engine_settings import ENGINE_SETTINGS, EngineSetting
from .harness import SchedulerSpec


class SettingError(ValueError):
    """A ``--set`` the replay cannot take; the message is one line."""


#: A setting a replay can change (the settings vocabulary's entry).
Setting = EngineSetting

#: The settings ``whatif --set`` takes, by name (the replayable entries of
#: :data:`vllm_probe.schema.engine_settings.ENGINE_SETTINGS`).
SETTINGS: dict[str, Setting] = {s.name: s for s in ENGINE_SETTINGS if s.replayable}

#: Settings whose values are only passed when set apart (vLLM derives them otherwise).
_DERIVED = {"max_num_scheduled_tokens": "max_num_batched_tokens", "max_num_active_seqs": "max_num_seqs"}


def parse_value(setting: Setting, text: str) -> Any:
    """``text`` as ``setting``'s type (``true``/``on``/``1`` for booleans).

    Raises:
        SettingError: not of the type, not finite, a policy other than fcfs or priority.
    """
    text = text.strip()
    if setting.type is bool:
        value = {"true": True, "on": True, "1": True, "false": False, "off": False, "0": False}.get(text.lower())
        if value is None:
            raise SettingError(f"{setting.name}={text}: expected true or false")
        return value
    if setting.type is int:
        try:
            return int(text.replace("_", ""))
        except ValueError:
            raise SettingError(f"{setting.name}={text}: expected an integer ({setting.unit})") from None
    if setting.type is float:
        try:
            number = float(text)
        except ValueError:
            raise SettingError(f"{setting.name}={text}: expected a number ({setting.unit})") from None
        if not math.isfinite(number):
            raise SettingError(f"{setting.name}={text}: expected a finite number")
        return number
    if setting.name == "scheduling_policy" and text not in ("fcfs", "priority"):
        raise SettingError(f"scheduling_policy={text}: expected fcfs or priority")
    return text


def unknown_key(key: str) -> SettingError:
    """The error for a key that is not in :data:`SETTINGS`, with the closest known one."""
    close = difflib.get_close_matches(key, SETTINGS, n=1)
    hint = f" (did you mean {close[0]}?)" if close else f" (known: {', '.join(SETTINGS)})"
    return SettingError(f"unknown setting {key!r}{hint}")


def parse_sets(sets: list[str]) -> list[dict[str, Any]]:
    """``["max_num_batched_tokens=2048,16384", "num_kv_blocks=64"]`` → the grid: one
    dict per point of the cartesian product, keys in the order given (``[{}]`` for none).

    Raises:
        SettingError: no ``=``, an unknown key, a key given twice, a bad value.
    """
    axes: list[list[tuple[str, Any]]] = []
    seen: set[str] = set()
    for item in sets:
        key, eq, values = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or not values.strip():
            raise SettingError(f"--set {item!r}: expected KEY=VALUE[,VALUE...]")
        if key not in SETTINGS:
            raise unknown_key(key)
        if key in seen:
            raise SettingError(f"--set {key} given twice; list its values once: {key}=A,B")
        seen.add(key)
        axes.append([(key, parse_value(SETTINGS[key], v)) for v in values.split(",") if v.strip()])
    return [dict(point) for point in itertools.product(*axes)] if axes else [{}]


def recorded_settings(config: dict[str, Any]) -> dict[str, Any]:
    """Every setting of :data:`SETTINGS` as the recorded ``engine_config`` has it (None:
    not recorded or not in that release)."""
    out = {}
    for name, s in SETTINGS.items():
        value = config.get(s.config_key) if s.config_key else None
        if name in _DERIVED and value == config.get(_DERIVED[name]):
            value = None  # not set apart: vLLM derives it
        out[name] = value
    return out


def kv_blocks_for_utilization(config: dict[str, Any], utilization: float) -> int:
    """KV blocks the recorded engine would have at ``utilization``.

    vLLM sizes the KV cache as ``utilization × device memory − what the model and its
    activations take`` (``CPUWorker.determine_available_memory``, ``Worker.
    determine_available_memory``, vLLM 0.32), divided into blocks of ``kv_block_bytes``;
    the rest does not depend on the utilization, so the recorded block count moves by
    ``Δutilization × device_memory_bytes / kv_block_bytes`` (rounded down).

    Raises:
        SettingError: ``utilization`` outside (0, 1] (vLLM's ``CacheConfig`` refuses it,
            0.32), the run's KV cache was fixed (``num_gpu_blocks_override`` or
            ``kv_cache_memory_bytes``), or the engine_config lacks what the conversion
            needs (a run recorded by an older probe, or a device it cannot read).
    """
    if not 0 < utilization <= 1:  # vLLM's CacheConfig: gt=0, le=1
        raise SettingError(f"gpu_memory_utilization={utilization:g}: vLLM accepts a share of the device's memory "
                           "above 0 and at most 1")
    if config.get("num_gpu_blocks_override") is not None:
        raise SettingError(
            f"the recorded run fixed its KV cache with num_gpu_blocks_override={config['num_gpu_blocks_override']}, "
            "so vLLM ignored gpu_memory_utilization; set num_kv_blocks instead")
    if config.get("kv_cache_memory_bytes") is not None:
        raise SettingError("the recorded run fixed its KV cache with kv_cache_memory_bytes, so vLLM ignored "
                           "gpu_memory_utilization; set num_kv_blocks instead")
    missing = [k for k in ("gpu_memory_utilization", "kv_block_bytes", "device_memory_bytes", "num_kv_blocks")
               if not config.get(k)]
    if missing:
        raise SettingError(f"gpu_memory_utilization cannot be converted to KV blocks: engine_config lacks "
                           f"{', '.join(missing)} (recorded by an older vllm-probe, or a device it cannot read); "
                           "set num_kv_blocks instead")
    delta = (utilization - config["gpu_memory_utilization"]) * config["device_memory_bytes"]
    return config["num_kv_blocks"] + math.floor(delta / config["kv_block_bytes"])


def resolve(config: dict[str, Any], overrides: dict[str, Any]) -> tuple[dict[str, Any], SchedulerSpec]:
    """Apply ``overrides`` (a point of the grid) to a recorded ``engine_config``.

    Returns every setting of :data:`SETTINGS` in force (by name; None where the release
    has no such setting) and the harness spec that builds that scheduler.

    Raises:
        SettingError: both ``num_kv_blocks`` and ``gpu_memory_utilization`` given, or
            what :func:`kv_blocks_for_utilization` raises.
    """
    settings = recorded_settings(config)
    for key in overrides:
        if key not in SETTINGS:
            raise unknown_key(key)
    if config.get("scheduler_class") == "AsyncScheduler":
        # the CPU platform records False, but the scheduler class says AsyncScheduler ran
        settings["async_scheduling"] = True
    settings.update(overrides)
    if "gpu_memory_utilization" in overrides:
        if "num_kv_blocks" in overrides:
            raise SettingError("set num_kv_blocks or gpu_memory_utilization, not both")
        settings["num_kv_blocks"] = kv_blocks_for_utilization(config, overrides["gpu_memory_utilization"])
    extra: dict[str, Any] = {}
    for name, s in SETTINGS.items():
        value = settings.get(name)
        if s.scheduler_config and value is not None:
            if name == "scheduling_policy" and value == "fcfs" and "scheduling_policy" not in overrides:
                continue  # vLLM's default: leave it to the release
            extra[s.scheduler_config] = value
    spec = SchedulerSpec(
        max_num_batched_tokens=settings["max_num_batched_tokens"],
        max_num_seqs=settings["max_num_seqs"],
        num_blocks=settings["num_kv_blocks"],
        block_size=config["block_size"],
        max_model_len=config["max_model_len"],
        enable_chunked_prefill=bool(settings["enable_chunked_prefill"]),
        enable_prefix_caching=bool(settings["enable_prefix_caching"]),
        long_prefill_token_threshold=settings["long_prefill_token_threshold"] or 0,
        async_scheduling=bool(settings["async_scheduling"]),
        extra=extra,
    )
    return settings, spec


def check(spec: SchedulerSpec, overrides: dict[str, Any]) -> SchedulerSpec:
    """Refuse what vLLM would refuse at start-up; needs vLLM. Returns ``spec`` less the
    recorded settings the installed vLLM lacks that were at that release's behaviour
    (:attr:`Setting.default`).

    Raises:
        SettingError: a setting the installed vLLM lacks (one the user set, or one the
            recorded run had at a value this release cannot reproduce), vLLM's own
            message for what ``SchedulerConfig`` refuses, or a KV cache too small for
            one request of ``max_model_len``.
    """
    import vllm
    from vllm.config import SchedulerConfig

    from .harness import accepts, make_vllm_config

    extra = dict(spec.extra)
    for field_name, value in spec.extra.items():
        if accepts(SchedulerConfig, field_name):
            continue
        name = next(n for n, s in SETTINGS.items() if s.scheduler_config == field_name)
        if name not in overrides and value == SETTINGS[name].default:
            del extra[field_name]
            continue
        whose = "you set it" if name in overrides else f"the recorded run used {name}={value}"
        raise SettingError(f"{name}: {whose}, but vLLM {vllm.__version__} here has no such setting")
    spec = replace(spec, extra=extra)
    usable = spec.num_blocks - 1
    need = -(-spec.max_model_len // spec.block_size)
    if usable < need:
        raise SettingError(
            f"num_kv_blocks={spec.num_blocks} cannot hold one request of max_model_len {spec.max_model_len}: "
            f"vLLM needs {need} blocks of {spec.block_size} tokens besides the reserved one and refuses to start "
            f"(check_enough_kv_cache_memory); this cache holds at most {usable * spec.block_size} tokens")
    try:
        make_vllm_config(spec)
    except Exception as e:  # pydantic's ValidationError, ValueError: vLLM's own message
        given = ", ".join(f"{k}={v}" for k, v in overrides.items())
        raise SettingError((f"{given}: " if given else "") + vllm_message(e)) from None
    return spec


def vllm_message(e: Exception) -> str:
    """The first line of what vLLM said, without pydantic's framing ("1 validation error
    for SchedulerConfig", "Value error, ", the input dump and the docs link)."""
    errors = getattr(e, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            msg = first.get("msg", "").removeprefix("Value error, ").strip()
            field = ".".join(str(part) for part in first.get("loc", ()) if isinstance(part, str))
            return "vLLM: " + (f"{field}: " if field else "") + msg
        except Exception:
            pass
    text = str(e).strip().splitlines()
    return "vLLM: " + (text[0] if text else type(e).__name__)
