"""The retention window: which part of a run the events read still cover.

With ``scheduler_probe.keep_mb`` / ``keep_hours`` the probe removes an engine core's
oldest closed segments, so a reader may start in the middle of a run: the stream's
first ``engine_config`` is then the copy heading segment n (``segment: n``,
:mod:`vllm_probe.engine.sink`), which the state records as
:attr:`~vllm_probe.analysis.engine_state.EngineState.window_segment`. Every view says
so in the one line :func:`retention_note` writes, e.g. ``retention removed segments
1–12: the window starts at step 48,112, 3 h 10 min after the start``; figures that need
a request's start (its ``request_added`` is gone) are unknown for those requests and
counted as ``requests_before_window``
(:attr:`~vllm_probe.analysis.engine_state.EngineState.requests_before_window`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RetentionWindow:
    """One engine core whose events start after the run's start.

    Attributes:
        engine: data-parallel rank.
        removed: segments 1 to ``removed`` were removed by retention.
        first_step: the first step of the window (its index since the engine core
            started; None: no step read).
        after_start_s: from the engine core's start (its ``engine_config``'s ``ts``) to
            the window's first step (s; None: no step read).
        requests_before_window: requests of the window whose ``request_added`` was
            removed (requests).
    """

    engine: int
    removed: int
    first_step: int | None
    after_start_s: float | None
    requests_before_window: int

    def text(self) -> str:
        """``retention removed segments 1–12: the window starts at step 48,112, 3 h 10 min
        after the start``."""
        what = "segment 1" if self.removed == 1 else f"segments 1–{self.removed}"
        if self.first_step is None:
            return f"retention removed {what}: the window holds no step"
        when = f", {span(self.after_start_s)} after the start" if self.after_start_s is not None else ""
        return f"retention removed {what}: the window starts at step {self.first_step:,}{when}"


def span(seconds: float) -> str:
    """A duration as the window line says it: ``3 h 10 min``, ``4 min 5 s``, ``12.5 s``."""
    s = max(float(seconds), 0.0)
    if s >= 3600:
        h, m = divmod(round(s / 60), 60)
        return f"{h} h {m} min" if m else f"{h} h"
    if s >= 60:
        m, sec = divmod(round(s), 60)
        return f"{m} min {sec} s" if sec else f"{m} min"
    return f"{s:.1f} s"


def retention_windows(state: Any) -> list[RetentionWindow]:
    """The engine cores of ``state`` (a :class:`~vllm_probe.analysis.state.RunState`)
    whose events start after their start, by rank. A window's steps are contiguous, so
    its first step is the last one read minus the steps read, plus one."""
    out = []
    for idx in sorted(state.engines):
        eng = state.engines[idx]
        if not eng.window_segment or eng.window_segment <= 1:
            continue
        first = eng.last_step - eng.steps + 1 if eng.steps else None
        after = (eng.stepping_since - eng.started_ts
                 if eng.steps and eng.started_ts is not None and eng.stepping_since is not None else None)
        out.append(RetentionWindow(idx, eng.window_segment - 1, first, after, eng.requests_before_window))
    return out


def retention_note(state: Any) -> str | None:
    """The one line every view shows when retention removed the start of the run (None
    when every engine core's events start at its start). Several engine cores: one
    clause each, ``engine N:`` first."""
    windows = retention_windows(state)
    if not windows:
        return None
    if len(windows) == 1 and len(state.engines) == 1:
        return windows[0].text()
    return "; ".join(f"engine {w.engine}: {w.text()}" for w in windows)


def retention_note_of(run_dir: Any) -> str | None:
    """:func:`retention_note` of a run directory, reading only the head of each engine
    core's stream that retention cut (its ``engine_config`` copy up to its first step):
    what ``export`` and ``whatif`` say without reading the whole run; the state of the
    command's pass over the run when it has one (:func:`vllm_probe.analysis.reading.cached`:
    nothing read again). Never raises (an unreadable run: None)."""
    from ..runs.reader import ReadStats, iter_stream
    from ..runs.rundir import event_streams
    from .reading import cached
    from .state import RunState

    reading = cached(run_dir)
    if reading is not None:
        return retention_note(reading.state)
    state = RunState(step_window=0)
    try:
        for stream in event_streams(run_dir):
            if not stream.removed:
                continue
            for rec in iter_stream(stream, ReadStats()):
                state.apply(rec)
                if rec.kind == "step":
                    break
    except Exception:
        return None
    return retention_note(state)
