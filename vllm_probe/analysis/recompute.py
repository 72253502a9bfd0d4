"""Recomputed token positions as vLLM itself counts them, and vLLM's own counter beside them.

vLLM PR #57698 (open, in no release yet) adds ``vllm:recomputed_token_executions_total``:
the token positions an engine core executes *again* after a preemption. Its definition
(the PR's description): per request, the scheduler keeps the highest position a
preemption made stale (the request's computed tokens when it was preempted) and counts
each later scheduled position below that frontier; prefix-cache hits are not scheduled,
so they are not counted. The per-step count is carried on ``SchedulerOutput``.

The probe's own figure in that definition (:attr:`RecomputeCounts.probe_tokens`), from its
events alone: a ``preempt`` event's ``discarded_tokens`` is the request's computed tokens
at the preemption (read before vLLM resets them), so the frontier is their largest value
over the request's preemptions; each later prefill ``chunk`` ``[start, end)`` adds
``max(0, min(end, frontier) - start)``. It differs from ``preemptions.recomputed_tokens``
(every token of a resumed pass's chunks): a request preempted while decoding re-prefills
one position more than it had computed (its last sampled token, which is new work), and
one preempted mid-prefill re-prefills the rest of its prompt, never computed before.

vLLM's own count, where the engine exposes it, is read from the ``step`` events' field
:data:`ENGINE_FIELD` (the probe reads it off ``SchedulerOutput``; absent in every release
so far): :attr:`RecomputeCounts.engine_tokens` sums it, None when no step carried it. The
two must agree to the token (:meth:`RecomputeCheck.agree`).

:class:`RecomputeListener` follows a :class:`~vllm_probe.analysis.state.RunState` (a
:class:`~vllm_probe.analysis.state.StateListener`): memory is one frontier per request
preempted and not yet finished.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .engine_state import EngineState
from .requests import RequestState
from .state import StateListener

#: The ``step`` event field holding vLLM's own count of the step's recomputed token
#: positions (the per-step increment of ``vllm:recomputed_token_executions_total``).
ENGINE_FIELD = "recomputed_token_executions"
#: vLLM's Prometheus counter that the engine's count adds up to (vLLM PR #57698).
VLLM_METRIC = "vllm:recomputed_token_executions_total"


#: record type -> whether it has :data:`ENGINE_FIELD` (a record type's fields are fixed:
#: asking each step costs an AttributeError raised and caught inside ``getattr``)
_TYPE_HAS_FIELD: dict[type, bool] = {}


def engine_count(ev: Any) -> int | None:
    """vLLM's own recomputed-token count of a ``step`` record: :data:`ENGINE_FIELD` when it
    is a non-negative int, else None (a probe or a vLLM release without it)."""
    has = _TYPE_HAS_FIELD.get(type(ev))
    if has is None:
        fields = getattr(type(ev), "__struct_fields__", None)  # a record type; other objects: each asked
        if fields is not None:
            has = _TYPE_HAS_FIELD[type(ev)] = ENGINE_FIELD in fields
    if has is False:
        return None
    value = getattr(ev, ENGINE_FIELD, None)
    return value if type(value) is int and value >= 0 else None


def below_frontier(frontier: int, start: int, end: int) -> int:
    """Positions of ``[start, end)`` below ``frontier`` (tokens): those executed again."""
    return max(0, min(end, frontier) - start)


@dataclass
class RecomputeCounts:
    """One engine core's recomputed positions (tokens).

    Attributes:
        probe_tokens: positions executed again below a preemption's stale frontier, from
            the probe's ``preempt`` and ``chunk`` events (the module docstring).
        engine_tokens: vLLM's own count, summed over the ``step`` events that carry it;
            None when none did (the engine does not expose it).
        engine_steps: ``step`` events that carried vLLM's count.
        frontier: request id → its stale frontier (positions), while it runs.
    """

    probe_tokens: int = 0
    engine_tokens: int | None = None
    engine_steps: int = 0
    frontier: dict[str, int] = field(default_factory=dict)

    def preempted(self, req_id: str, computed: int | None) -> None:
        """A preemption threw away ``computed`` positions of ``req_id``."""
        if computed:
            self.frontier[req_id] = max(self.frontier.get(req_id, 0), computed)

    def chunk(self, req_id: str, start: int | None, end: int | None) -> None:
        """``req_id`` was scheduled positions ``[start, end)``."""
        f = self.frontier.get(req_id)
        if f is not None and start is not None and end is not None:
            self.probe_tokens += below_frontier(f, start, end)

    def finished(self, req_id: str) -> None:
        self.frontier.pop(req_id, None)

    def step(self, count: int | None) -> None:
        """A step; ``count``: vLLM's own count for it (None: not recorded)."""
        if count is not None:
            self.engine_tokens = (self.engine_tokens or 0) + count
            self.engine_steps += 1


class RecomputeListener(StateListener):
    """:class:`RecomputeCounts` per engine core (``counts[rank]``), following a state."""

    def __init__(self) -> None:
        self.counts: dict[int, RecomputeCounts] = {}

    def of(self, eng: EngineState) -> RecomputeCounts:
        c = self.counts.get(eng.engine)
        if c is None:
            c = self.counts[eng.engine] = RecomputeCounts()
        return c

    def on_preempt(self, eng: EngineState, req: RequestState, ev: Any) -> None:
        self.of(eng).preempted(ev.req_id, ev.discarded_tokens)

    def on_chunk(self, eng: EngineState, req: RequestState, ev: Any) -> None:
        self.of(eng).chunk(ev.req_id, ev.start, ev.end)

    def on_finished(self, eng: EngineState, req: RequestState) -> None:
        self.of(eng).finished(req.req_id)

    def on_step(self, eng: EngineState, ev: Any) -> None:
        count = engine_count(ev)
        if count is not None:  # every step of every release so far: nothing to count
            self.of(eng).step(count)


@dataclass
class RecomputeCheck:
    """The run's recomputed positions by both counts, every engine core together (tokens).

    Attributes:
        probe_tokens: :attr:`RecomputeCounts.probe_tokens` summed.
        engine_tokens: vLLM's own count summed; None when no engine core exposed it.
        engine_steps: steps that carried vLLM's count.
    """

    probe_tokens: int = 0
    engine_tokens: int | None = None
    engine_steps: int = 0

    @classmethod
    def of(cls, listener: RecomputeListener) -> RecomputeCheck:
        counts = list(listener.counts.values())
        known = [c.engine_tokens for c in counts if c.engine_tokens is not None]
        return cls(sum(c.probe_tokens for c in counts), sum(known) if known else None,
                   sum(c.engine_steps for c in counts))

    @property
    def agree(self) -> bool | None:
        """Whether vLLM's count equals the probe's to the token; None when vLLM's is unknown."""
        return None if self.engine_tokens is None else self.engine_tokens == self.probe_tokens

    def to_dict(self) -> dict[str, Any]:
        """``summary --json``'s ``recompute_counter`` (docs/reading.md)."""
        return {"metric": VLLM_METRIC, "probe_tokens": self.probe_tokens, "engine_tokens": self.engine_tokens,
                "engine_steps": self.engine_steps, "agree": self.agree}


__all__ = ["ENGINE_FIELD", "VLLM_METRIC", "RecomputeCheck", "RecomputeCounts", "RecomputeListener", "below_frontier",
           "engine_count"]
