"""Which candidate values a remedy search may try: the installed vLLM must have the setting,
the platform must accept it (no device-memory share on the CPU backend), vLLM's own bounds,
and what operators run (a token budget within :data:`MAX_BUDGET_FACTOR` × the recorded one,
unless the rule's own mechanism needs more).
"""

from __future__ import annotations

from typing import Any

from ..analysis.doctor.knobs import BUDGET_MAX_FACTOR
from ..analysis.doctor.rule import Knob

#: Largest token budget tried, as a multiple of the recorded one: the rules' own cap
#: (:data:`vllm_probe.analysis.doctor.knobs.BUDGET_MAX_FACTOR`).
MAX_BUDGET_FACTOR = BUDGET_MAX_FACTOR


#: Settings that size the token budget (bounded by MAX_BUDGET_FACTOR).
_BUDGETS = ("max_num_batched_tokens", "max_num_scheduled_tokens")


def release_ok(knob: Knob) -> bool:
    if knob.min_release is None:
        return True
    try:
        import vllm
        from packaging.version import Version

        return Version(vllm.__version__.split("+")[0]) >= Version(knob.min_release)
    except Exception:
        return False


def allowed(setting: str, value: Any, recorded: dict[str, Any], config: dict[str, Any],
            knob: Knob | None = None) -> str | None:
    """Why ``setting = value`` is out of bounds (one line), or None when it may be tried
    (``knob``: the rule's knob proposing it; one bounded by its rule's mechanism is not held
    to the operators' budget cap)."""
    from ..sim.engine_args import SETTINGS

    if setting not in SETTINGS:
        return f"{setting}: not a setting the replay (and this vLLM) has"
    platform = str(config.get("platform") or config.get("device") or "").lower()
    if setting == "gpu_memory_utilization" and (platform == "cpu" or not config.get("device_memory_bytes")):
        return "gpu_memory_utilization: the CPU platform sizes its KV cache from VLLM_CPU_KVCACHE_SPACE"
    out_of_bounds = SETTINGS[setting].out_of_bounds(value)
    if out_of_bounds:
        return out_of_bounds
    if setting in _BUDGETS and not (knob is not None and knob.beyond_cap):
        base = recorded.get(setting) or recorded.get("max_num_batched_tokens")
        if base and value > MAX_BUDGET_FACTOR * base:
            return f"{setting}={value}: more than {MAX_BUDGET_FACTOR}× the recorded {base}"
    return None


__all__ = ["MAX_BUDGET_FACTOR", "allowed", "release_ok"]
