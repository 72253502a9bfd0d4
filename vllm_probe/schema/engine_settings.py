"""The settings vocabulary: one table of the vLLM settings the probe names, each with its
``whatif --set`` name, its engine argument (``LLM(...)`` keyword, ``EngineArgs`` field), its
``vllm serve`` flag, the ``engine_config`` field that records it, its type, unit and bounds.

Every other place reads this table: the replay's settings
(:mod:`vllm_probe.sim.engine_args`), the ``--set``/``--knob`` help and parsing, the
doctor's remedies and plan (named by ``whatif`` name, with the engine argument and flag
beside them), ``tune``'s flags, the settings files' type checks
(:mod:`vllm_probe.settings`) and the expected-settings check
(:mod:`vllm_probe.analysis.expected`). docs/whatif.md's table is generated from it
(``python -m vllm_probe.schema.engine_settings``).

Sources: vLLM 0.32 ``vllm/engine/arg_utils.py`` (``EngineArgs``: names, types, flags —
booleans are ``--x``/``--no-x``, argparse's ``BooleanOptionalAction``) and
``vllm/config/scheduler.py``, ``vllm/config/cache.py`` (bounds).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineSetting:
    """One setting.

    Attributes:
        name: the ``whatif --set`` / ``tune --knob`` name; the name remedies and plans use.
        engine_arg: vLLM's engine argument (``LLM(name=...)``, ``EngineArgs``).
        config_key: the ``engine_config`` event field that records it (None: not recorded).
        type: ``int``, ``float``, ``bool`` or ``str``.
        unit: ``tokens``, ``requests``, ``blocks``, ``0..1`` or ``-``.
        doc: what it does, one line.
        replayable: ``whatif`` can change it (False: recorded and checked only, e.g.
            ``max_model_len``).
        scheduler_config: the ``SchedulerConfig`` field the replay passes it as (None:
            the replay's harness spec has a field of its own).
        default: vLLM's default where a release without the setting behaves as if it had
            this value.
        lo: the least value vLLM accepts (None: no bound); ``lo_open``: strictly above it.
        hi: the largest (None: no bound); ``hi_open``: strictly below it.
        bounds_doc: how an error states the bounds (default: ``must be at least LO``).
        memory: it sizes the KV cache (a change costs device or CPU memory).
        min_release: the first vLLM release that has it (None: every supported release).
    """

    name: str
    engine_arg: str
    config_key: str | None
    type: type
    unit: str
    doc: str
    replayable: bool = True
    scheduler_config: str | None = None
    default: Any = None
    lo: float | None = None
    lo_open: bool = False
    hi: float | None = None
    hi_open: bool = False
    bounds_doc: str = ""
    memory: bool = False
    min_release: str | None = None

    @property
    def flag(self) -> str:
        """``vllm serve``'s flag (``--max-num-seqs``)."""
        return "--" + self.engine_arg.replace("_", "-")

    def flags(self, value: Any) -> list[str]:
        """The ``vllm serve`` arguments that set ``value`` (``["--max-num-seqs", "8"]``;
        a boolean as ``--x`` / ``--no-x``)."""
        if isinstance(value, bool):
            return [self.flag if value else "--no-" + self.flag[2:]]
        return [self.flag, str(value)]

    def out_of_bounds(self, value: Any) -> str | None:
        """Why vLLM would refuse ``value`` (``max_num_seqs=0: must be at least 1``), or None."""
        if isinstance(value, (bool, str)) or not isinstance(value, (int, float)):
            return None
        low = self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo)
        high = self.hi is not None and (value >= self.hi if self.hi_open else value > self.hi)
        if not (low or high):
            return None
        return f"{self.name}={value}: {self.bounds_doc or f'must be at least {self.lo:g}'}"


#: Every setting, replayable ones first in ``--set``'s order.
ENGINE_SETTINGS: tuple[EngineSetting, ...] = (
    EngineSetting("max_num_batched_tokens", "max_num_batched_tokens", "max_num_batched_tokens", int, "tokens",
                  "token budget of one step", lo=1),
    EngineSetting("max_num_seqs", "max_num_seqs", "max_num_seqs", int, "requests",
                  "most requests in the running queue", lo=1),
    EngineSetting("num_kv_blocks", "num_gpu_blocks_override", "num_kv_blocks", int, "blocks",
                  "KV-cache blocks, as num_gpu_blocks_override sets them (block 0 is reserved)", lo=1, memory=True),
    EngineSetting("gpu_memory_utilization", "gpu_memory_utilization", "gpu_memory_utilization", float, "0..1",
                  "share of device memory; converted to KV blocks from what the recorded engine reported",
                  lo=0, lo_open=True, hi=1, bounds_doc="a share of device memory in (0, 1]", memory=True),
    EngineSetting("long_prefill_token_threshold", "long_prefill_token_threshold", "long_prefill_token_threshold",
                  int, "tokens", "cap on one request's prefill chunk (0: none)", lo=0,
                  bounds_doc="0 (none) or a token count", min_release="0.31"),
    EngineSetting("max_num_partial_prefills", "max_num_partial_prefills", None, int, "requests",
                  "concurrent partial prefills (releases up to 0.26 accept it; the V1 scheduler never reads it)",
                  scheduler_config="max_num_partial_prefills", lo=1),
    EngineSetting("enable_chunked_prefill", "enable_chunked_prefill", "enable_chunked_prefill", bool, "-",
                  "split prompts across steps"),
    EngineSetting("enable_prefix_caching", "enable_prefix_caching", "prefix_caching", bool, "-",
                  "automatic prefix caching"),
    EngineSetting("scheduling_policy", "scheduling_policy", "scheduling_policy", str, "-", "fcfs or priority",
                  scheduler_config="policy"),
    EngineSetting("max_num_scheduled_tokens", "max_num_scheduled_tokens", "max_num_scheduled_tokens", int, "tokens",
                  "tokens one step may schedule, set apart from max_num_batched_tokens (0.17+)",
                  scheduler_config="max_num_scheduled_tokens", lo=1),
    EngineSetting("max_num_active_seqs", "max_num_active_seqs", "max_num_active_seqs", int, "requests",
                  "admission limit below max_num_seqs (0.31+)", scheduler_config="max_num_active_seqs", lo=1),
    EngineSetting("long_prefill_token_threshold_adaptive", "long_prefill_token_threshold_adaptive",
                  "long_prefill_token_threshold_adaptive", bool, "-",
                  "raise the long-prefill threshold to budget / running requests (0.31+)",
                  scheduler_config="long_prefill_token_threshold_adaptive", default=False),
    EngineSetting("scheduler_reserve_full_isl", "scheduler_reserve_full_isl", "scheduler_reserve_full_isl", bool,
                  "-", "admit a request only when its whole prompt fits in free KV blocks (0.19+; before, "
                  "admission needed only the first chunk's blocks)", scheduler_config="scheduler_reserve_full_isl"),
    EngineSetting("watermark", "watermark", "watermark", float, "0..1",
                  "share of KV blocks kept free at admission (0.24+)", scheduler_config="watermark", default=0.0,
                  lo=0, hi=1, hi_open=True, bounds_doc="a share of KV blocks in [0, 1)"),
    EngineSetting("async_scheduling", "async_scheduling", "async_scheduling", bool, "-",
                  "AsyncScheduler: schedule step N+1 before step N's output (a finished request holds its slot "
                  "one more step; vllm/v1/core/sched/async_scheduler.py, 0.32)"),
    EngineSetting("max_model_len", "max_model_len", "max_model_len", int, "tokens",
                  "longest request (prompt + output)", replayable=False, lo=1),
    EngineSetting("block_size", "block_size", "block_size", int, "tokens", "tokens per KV-cache block",
                  replayable=False, lo=1),
    EngineSetting("data_parallel_size", "data_parallel_size", "data_parallel_size", int, "engine cores",
                  "data-parallel ranks", replayable=False, lo=1),
)

#: By ``whatif`` name.
BY_NAME: dict[str, EngineSetting] = {s.name: s for s in ENGINE_SETTINGS}
#: By engine argument.
BY_ENGINE_ARG: dict[str, EngineSetting] = {s.engine_arg: s for s in ENGINE_SETTINGS}


def engine_arg_of(name: str) -> str:
    """The engine argument of a ``whatif`` name (the name itself when it is not in the table)."""
    s = BY_NAME.get(name)
    return s.engine_arg if s is not None else name


def serve_flags(settings: dict[str, Any]) -> list[str]:
    """The ``vllm serve`` arguments that apply ``settings`` (``whatif`` names → values):
    ``{"max_num_batched_tokens": 1024, "num_kv_blocks": 56}`` →
    ``["--max-num-batched-tokens", "1024", "--num-gpu-blocks-override", "56"]``."""
    out: list[str] = []
    for k, v in settings.items():
        s = BY_NAME.get(k)
        out += s.flags(v) if s is not None else ["--" + k.replace("_", "-"), str(v)]
    return out


def engine_kwargs(settings: dict[str, Any]) -> str:
    """The same as ``LLM(...)`` engine arguments: ``max_num_seqs=8, num_gpu_blocks_override=56``."""
    return ", ".join(f"{engine_arg_of(k)}={v!r}" for k, v in settings.items())


def reference() -> str:
    """docs/whatif.md's table of settings (Markdown)."""
    rows = ["| whatif name | engine argument | `vllm serve` flag | type | unit | bounds | replayed |",
            "|---|---|---|---|---|---|---|"]
    for s in ENGINE_SETTINGS:
        bounds = " ".join(x for x in (
            "" if s.lo is None else ("> " if s.lo_open else "≥ ") + f"{s.lo:g}",
            "" if s.hi is None else ("< " if s.hi_open else "≤ ") + f"{s.hi:g}") if x) or "-"
        rows.append(f"| `{s.name}` | `{s.engine_arg}` | `{s.flag}` | {s.type.__name__} | {s.unit} | {bounds} | "
                    f"{'yes' if s.replayable else 'no (recorded)'} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(reference())
