"""What the doctor's rules read (:class:`Context`), the sources they cite, and the small
helpers they share (numbers in messages are written by :mod:`vllm_probe.analysis.text`, as
every view writes them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..engine_state import EngineState
from ..episodes import EngineEpisodes, Episodes
from ..expected import SettingCheck
from ..state import RunState
from ..text import fmt_pct

# -- sources the rules cite -------------------------------------------------------------------

#: Sources, cited by the remedies.
SRC_VLLM_PREEMPTION = "vLLM tuning guide, Preemption (docs/configuration/optimization.md)"
SRC_VLLM_CHUNKED = "vLLM tuning guide, Chunked Prefill (docs/configuration/optimization.md)"
SRC_SGLANG = "SGLang hyperparameter tuning guide (#queue-req, token usage)"
SRC_CHUNK_REREAD = "chunked prefill: each later chunk's attention re-reads the KV of the earlier ones"
SRC_FLAGS_WIN = "vLLM's engine arguments: command-line flags win over config files"
SRC_FULL_ISL = "vLLM 0.19+ scheduler_reserve_full_isl (vllm/v1/core/sched/scheduler.py)"
SRC_ASYNC = ("vLLM AsyncScheduler: a finished request's slot frees one step later "
             "(vllm/v1/core/sched/async_scheduler.py)")
#: A threshold measured on this project's CPU engine.
MEASURED = "measured here (docs/doctor.md gives the runs)"


@dataclass
class Context:
    """What the rules read.

    Attributes:
        state: the run's state, events applied.
        episodes: the :class:`Episodes` that followed it.
        expected: the user's expected settings against ``engine_config`` (``--expect``,
            or ``meta.json["expected"]``); None: nothing to check.
        expected_source: the file they came from.
        live: the run is still going (a stall at the end is not yet "never drains").
    """

    state: RunState
    episodes: Episodes
    expected: list[SettingCheck] | None = None
    expected_source: str | None = None
    live: bool = False
    not_checked: dict[str, str] = field(default_factory=dict)  # rule id -> why (filled by rules)
    #: what one evaluation shares between rules (the binding limit is chosen once per engine core)
    cache: dict[str, Any] = field(default_factory=dict)
    #: the engine cores (None: the whole run) whose waits a finding already explains: filled
    #: as the catalogue runs, from the rules whose ``wait`` is ``explains``
    explained: set[int | None] = field(default_factory=set)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def engine_of(ctx: Context, eng: EngineState) -> int | None:
    """The evidence's ``engine``: the rank when the run has several engine cores, else None (left out)."""
    return eng.engine if len(ctx.state.engines) > 1 else None


def engines_of(ctx: Context) -> list[tuple[EngineState, EngineEpisodes]]:
    return [(ctx.state.engines[i], ctx.episodes.of(ctx.state.engines[i])) for i in ctx.state.engine_ids()]


def wrote(eng: EngineState, name: str) -> bool:
    """Whether the engine core wrote ``name`` events (its ``engine_config.flags``; True when unknown)."""
    flags = eng.config.flags if eng.config is not None else None
    return not isinstance(flags, dict) or flags.get(name, True) is not False


def pct_range(values: list[float]) -> str:
    lo, hi = fmt_pct(min(values)), fmt_pct(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


def rounded(v: float | None, nd: int = 4) -> float | None:
    return None if v is None else round(v, nd)


def round_up(v: int, to: int) -> int:
    return cdiv(v, to) * to


# -- the views' lines (a rule's ``view``): how step ranges and head_blocked_by counts read ----------


def steps_text(r: list[int] | None) -> str:
    """A ``[first, last]`` step range as ``12–40`` (``12`` for one step, ``-`` unknown)."""
    if not r or r[0] is None:
        return "-"
    return f"{r[0]}" if r[0] == r[1] else f"{r[0]}–{r[1]}"


def reasons_text(d: dict[str, int]) -> str:
    """head_blocked_by counts as shares, largest first (``kv_cache 80%, token_budget 20%``)."""
    total = sum(d.values()) or 1
    return ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in sorted(d.items(), key=lambda kv: -kv[1]))


def first_of(r: list[int] | None) -> int | None:
    """The first step of a ``[first, last]`` range (None: no range)."""
    return r[0] if r and isinstance(r[0], int) else None
