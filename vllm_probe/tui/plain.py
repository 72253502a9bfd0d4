"""``--plain`` output: one compact text line per step and one per preemption.

For pipes, logs and ``grep``. Every line starts with the event's time since the run's
first event (``+12.345s``, seconds), then its kind::

    +1.205s step 36 | 1024/1024 tok 100% | prefill 1000 tok 2 req | decode 24 tok 24 req | run 24 wait 8 (head: token_budget) | kv 87% free 9 blk | preempted 0 (total 1)
    +1.204s preempt step 36 | req 4-98ba3ee3 | discarded 1014 tok | prompt 1536 out 0 | x1 | kv 95% | run 4 wait 12

With several engine cores (data-parallel ranks) the kind is followed by ``dpN``. When
requests wait, ``(head: REASON)`` after the queues says why the first of them was not
admitted (``step.head_blocked_by``, docs/events.md). When the engine has prefix caching
on, step lines also say how many prompt tokens the prefix cache served to the chunks of
that step (``| hit 256 tok |`` before ``preempted``; first passes and re-admissions alike).
Other event kinds print nothing. Numbers carry no thousands separators (easy to parse);
shares read as everywhere else (:func:`vllm_probe.tui.format.pct`). Running totals come
from the state the record was just applied to (:mod:`vllm_probe.analysis.state`).
"""  # noqa: E501 - a --plain step line quoted whole

from __future__ import annotations

from typing import Any

from ..analysis.figures import budget_use
from ..analysis.engine_state import OTHER_REASON
from ..analysis.state import RunState
from ..schema.events import HEAD_BLOCKED_REASONS
from .format import pct


def _v(v: object) -> str:
    return "-" if v is None else str(v)


def _pct(v: float | None) -> str:
    return "-" if v is None else pct(v)


def _reason(reason: str) -> str:
    """A ``head_blocked_by`` value as printed: an unknown one (a newer probe, a hostile
    log) reads ``other``, so a line never carries text from the file."""
    return reason if reason in HEAD_BLOCKED_REASONS else OTHER_REASON


class PlainFormatter:
    """Turns records, each just applied to ``state``, into ``--plain`` lines (``None`` for
    kinds without a line)."""

    def __init__(self, state: RunState) -> None:
        self.state = state

    def _engine(self, ev: Any) -> str:
        state = self.state
        config = state.config
        multi = (any(rank != 0 for rank in state.engines)
                 or (config is not None and (config.data_parallel_size or 1) > 1))
        return f" dp{ev.engine}" if multi else ""

    def _t(self, ts: float) -> str:
        origin = self.state.first_ts
        return f"+{ts - (ts if origin is None else origin):.3f}s"

    def format(self, ev: Any) -> str | None:
        """The line for one record, or None."""
        if ev.kind == "step":
            return self._step(ev)
        if ev.kind == "preempt":
            return self._preempt(ev)
        return None

    def _step(self, ev: Any) -> str:
        preempted = len(ev.preempted or ())
        eng = self.state.engines[ev.engine]
        sched, budget = ev.scheduled_tokens or 0, eng.step_budget
        hits = (f"hit {eng.prefix_hits_in_step(ev.step)} tok | "
                if eng.config is not None and eng.config.prefix_caching else "")
        return (f"{self._t(ev.ts)} step{self._engine(ev)} {_v(ev.step)} | {sched}/{_v(budget or None)} tok "
                f"{_pct(budget_use(sched, budget))} | "
                f"prefill {_v(ev.prefill_tokens)} tok {_v(ev.prefill_reqs)} req | "
                f"decode {_v(ev.decode_tokens)} tok {_v(ev.decode_reqs)} req | "
                f"run {_v(ev.running)} wait {_v(ev.waiting)}"
                + (f" (head: {_reason(ev.head_blocked_by)})" if ev.head_blocked_by else "")
                + f" | kv {_pct(ev.kv_usage)} free {_v(ev.free_blocks)} blk | "
                f"{hits}preempted {preempted} (total {eng.preemptions_total})")

    def _preempt(self, ev: Any) -> str:
        reason = ev.reason
        return (f"{self._t(ev.ts)} preempt{self._engine(ev)} step {_v(ev.step)} | req {ev.req_id} | "
                f"discarded {_v(ev.discarded_tokens)} tok | prompt {_v(ev.prompt_len)} "
                f"out {_v(ev.output_tokens)} | x{_v(ev.num_preemptions)} | kv {_pct(ev.kv_usage)} | "
                f"run {_v(ev.running)} wait {_v(ev.waiting)}"
                + (f" | {reason}" if reason and reason != "kv_cache" else ""))
