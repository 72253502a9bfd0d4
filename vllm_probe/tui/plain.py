"""``--plain`` output: one compact text line per step and one per preemption.

For pipes, logs and ``grep``. Every line starts with the event's time since the run's
first event (``+12.345s``, seconds), then its kind::

    +1.205s step 36 | 1024/1024 tok 100% | prefill 1000 tok 2 req | decode 24 tok 24 req | run 24 wait 8 | kv 87% | preempted 0 (total 1)
    +1.204s preempt step 36 | req 4-98ba3ee3 | discarded 1014 tok | prompt 1536 out 0 | x1 | kv 95% | run 4 wait 12

With several engine cores (data-parallel ranks) the kind is followed by ``dpN``.
Other event kinds print nothing. Numbers carry no thousands separators (easy to parse).
"""

from __future__ import annotations

from collections import defaultdict


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def _v(v: object) -> str:
    return "-" if v is None else str(v)


class PlainFormatter:
    """Turns events, in order, into ``--plain`` lines (``None`` for kinds without a line).

    Keeps per engine core the running total of preemptions (from the steps' ``preempted``
    lists, so it is right even when ``preempt`` events are switched off), and the first
    event's time (the origin of the ``+…s`` offsets).
    """

    def __init__(self) -> None:
        self.origin: float | None = None
        self.preempt_total: dict[int, int] = defaultdict(int)
        self.multi = False

    def _engine(self, ev: dict) -> str:
        eng = ev.get("engine", 0) or 0
        if eng:
            self.multi = True
        return f" dp{eng}" if self.multi else ""

    def format(self, ev: dict) -> str | None:
        """The line for one event, or None."""
        kind = ev.get("event")
        ts = ev.get("ts", 0.0)
        if self.origin is None:
            self.origin = ts
        if kind == "engine_config":
            if (ev.get("data_parallel_size") or 1) > 1:
                self.multi = True
            return None
        if kind == "step":
            return self._step(ev, ts)
        if kind == "preempt":
            return self._preempt(ev, ts)
        return None

    def _t(self, ts: float) -> str:
        return f"+{ts - (self.origin or ts):.3f}s"

    def _step(self, ev: dict, ts: float) -> str:
        eng = ev.get("engine", 0) or 0
        preempted = len(ev.get("preempted") or ())
        self.preempt_total[eng] += preempted
        sched, budget = ev.get("scheduled_tokens", 0), ev.get("token_budget") or 0
        use = f"{100 * sched / budget:.0f}%" if budget else "-"
        return (f"{self._t(ts)} step{self._engine(ev)} {_v(ev.get('step'))} | {sched}/{_v(budget or None)} tok {use} | "
                f"prefill {_v(ev.get('prefill_tokens'))} tok {_v(ev.get('prefill_reqs'))} req | "
                f"decode {_v(ev.get('decode_tokens'))} tok {_v(ev.get('decode_reqs'))} req | "
                f"run {_v(ev.get('running'))} wait {_v(ev.get('waiting'))} | kv {_pct(ev.get('kv_usage'))} | "
                f"preempted {preempted} (total {self.preempt_total[eng]})")

    def _preempt(self, ev: dict, ts: float) -> str:
        reason = ev.get("reason")
        return (f"{self._t(ts)} preempt{self._engine(ev)} step {_v(ev.get('step'))} | req {_v(ev.get('req_id'))} | "
                f"discarded {_v(ev.get('discarded_tokens'))} tok | prompt {_v(ev.get('prompt_len'))} "
                f"out {_v(ev.get('output_tokens'))} | x{_v(ev.get('num_preemptions'))} | kv {_pct(ev.get('kv_usage'))} | "
                f"run {_v(ev.get('running'))} wait {_v(ev.get('waiting'))}"
                + (f" | {reason}" if reason and reason != "kv_cache" else ""))
