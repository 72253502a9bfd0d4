"""One live run per process: the files followed once, one state, one live doctor.

:class:`LiveRun` is what every live consumer reads: the dashboard and the ``--plain``
lines (:mod:`vllm_probe.tui.watch`), the metrics server
(:class:`vllm_probe.exporters.prometheus.MetricsServer`, which either attaches to the
dashboard's LiveRun or follows its own), the live doctor (:attr:`LiveRun.diagnosis`) and
any later push exporter. It holds one :class:`~vllm_probe.runs.reader.Follower` over the
run directory's files (files that appear later included), one
:class:`~vllm_probe.analysis.state.RunState` and one
:class:`~vllm_probe.analysis.doctor.LiveDiagnosis`, so ``run --live --metrics-port``
reads every line once and keeps one state (tests/analysis/test_follow.py counts it).

Threads: whoever calls :meth:`LiveRun.pump` (the dashboard's loop, or the metrics
server's own thread when nothing else follows the run) is the only writer of the state;
it holds :attr:`LiveRun.lock` for at most :data:`APPLY_SLICE` events at a time, so a
reader in another thread (a Prometheus scrape) takes the lock and never waits for a
whole backlog. Subscribers (:meth:`LiveRun.subscribe`) are called with each record
right after it was applied, in the pumping thread, with the lock held.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

from ..runs.reader import Follower, ReadStats, record_ts
from ..runs.rundir import read_meta
from .doctor import LiveDiagnosis
from .recompute import RecomputeListener
from .state import Listeners, RunState, StateListener

#: Bytes read per file per look (bounds memory on a large finished run).
READ_CHUNK = 4 << 20
#: Events applied per hold of the lock: a scrape in another thread waits for at most this
#: many (~2 ms).
APPLY_SLICE = 500
#: Seconds between two reads of ``meta.json`` while pumping (model name, end of the run).
META_EVERY_S = 1.0
#: The doctor's findings are recomputed at most this often while the run goes on (s):
#: the dashboard's findings panel. A metrics-only process uses 5 s
#: (:data:`vllm_probe.exporters.prometheus.FINDINGS_EVERY_S`: a scrape interval is 5 s or more).
FINDINGS_EVERY_S = 1.0

#: ``subscriber(record)``: called after each record was applied to the state.
Subscriber = Callable[[Any], None]


class LiveRun:
    """A run directory followed into one state, shared by every live consumer.

    Args:
        run_dir: the run directory (it may not hold any event file yet).
        step_window: steps kept for rolling views (the dashboard's chart); 0: totals only.
        finished_keep: finished requests kept for views (None: the state's default).
        engine: only this data-parallel rank's records are applied (None: all).
        findings_every_s: :class:`LiveDiagnosis`'s interval (s); None: no live doctor.

    Attributes:
        stats: the reader's counts (events read, lines skipped) of this one Follower.
        state: the one :class:`RunState`.
        diagnosis: the one :class:`LiveDiagnosis` (its episodes follow the state), or None.
        recompute: recomputed positions by the probe's count and vLLM's own, per engine core
            (:class:`~vllm_probe.analysis.recompute.RecomputeListener`, following the state).
        lock: held while records are applied; take it to read the state from another thread.
        meta: the run's ``meta.json`` as last read (every :data:`META_EVERY_S` while pumping).
        incomplete: lines still without their newline after the last pump.
        applied: records applied to the state (what an engine filter let through).
        behind: the last pump stopped on its time budget with data left.
        finished: set by the owner once the run has ended (a partial last line is then a
            truncated one).
    """

    def __init__(self, run_dir: Path | str, *, step_window: int = 600, finished_keep: int | None = None,
                 engine: int | None = None, findings_every_s: float | None = FINDINGS_EVERY_S) -> None:
        self.run_dir = Path(run_dir)
        self.stats = ReadStats()
        self.follower = Follower(self.run_dir, self.stats)
        self.diagnosis = LiveDiagnosis(findings_every_s) if findings_every_s is not None else None
        self.recompute = RecomputeListener()
        listener: StateListener = (Listeners(self.diagnosis.episodes, self.recompute) if self.diagnosis is not None
                                   else self.recompute)
        kw: dict[str, Any] = {} if finished_keep is None else {"finished_keep": finished_keep}
        self.state = RunState(step_window=step_window, listener=listener, **kw)
        self.engine = engine
        self.lock = threading.RLock()
        self.meta: dict[str, Any] = read_meta(self.run_dir)
        self._meta_at = time.monotonic()
        self.incomplete = 0
        self.applied = 0
        self.behind = False
        self.finished = False
        self._subscribers: list[Subscriber] = []

    def subscribe(self, fn: Subscriber) -> None:
        """Call ``fn(record)`` after each record is applied (in the pumping thread, lock held)."""
        self._subscribers.append(fn)

    def refresh_meta(self) -> dict[str, Any]:
        """Read ``meta.json`` again (now) and return it."""
        self.meta, self._meta_at = read_meta(self.run_dir), time.monotonic()
        return self.meta

    def pump(self, budget_s: float | None = None, max_bytes: int | None = READ_CHUNK) -> int:
        """Read what the files hold now (``max_bytes`` per file per look, looking again until
        nothing is new) and apply it; returns the records read.

        Stops after ``budget_s`` seconds (then :attr:`behind` is True) so that a large
        backlog does not freeze a screen; the next call continues.
        """
        start = time.monotonic()
        if start - self._meta_at >= META_EVERY_S:
            self.refresh_meta()
        total = 0
        self.behind = False
        apply, engine, subscribers = self.state.apply, self.engine, self._subscribers
        while True:
            batch = self.follower.poll(max_bytes)
            if not batch:
                break
            batch.sort(key=record_ts)  # files of several engine cores interleave
            if engine is not None:
                batch = [ev for ev in batch if ev.engine == engine]
            for i in range(0, len(batch), APPLY_SLICE):
                with self.lock:
                    for ev in batch[i:i + APPLY_SLICE]:
                        apply(ev)
                        for fn in subscribers:
                            fn(ev)
            self.applied += len(batch)
            total += len(batch)
            if budget_s is not None and time.monotonic() - start > budget_s:
                self.behind = True
                break
        self.incomplete = self.follower.pending_partial()  # after: a completed line is in the state
        return total

    @property
    def truncated(self) -> int:
        """Incomplete last lines, counted once the run has finished."""
        return self.incomplete if self.finished else 0

    def findings(self, meta: dict[str, Any] | None = None, finished: bool | None = None) -> list[Any]:
        """The live doctor's findings on the state so far (:class:`LiveDiagnosis`); ``meta``
        defaults to :attr:`meta`, ``finished`` to whether ``meta`` has an end time. Empty
        without a live doctor. Takes :attr:`lock` (another thread may be reading too)."""
        if self.diagnosis is None:
            return []
        meta = self.meta if meta is None else meta
        if finished is None:
            finished = meta.get("end_time") is not None
        with self.lock:
            return self.diagnosis.findings(self.state, meta, finished)
