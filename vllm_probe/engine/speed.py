"""The machine-speed mark: how fast this engine core's host ran a fixed computation.

A run's seconds measure the machine as much as the settings: on a shared host the same
workload's steps took 2.4 ms in one run and 5.1 ms in the next (docs/whatif.md). So the
probe times a tiny fixed computation (:func:`reference_work`, the same work on every
machine and in every run) twice per engine core and writes it to the run:

* when the probe starts, as the scheduler is built (before its first step):
  ``engine_config.speed_mark_us``;
* at the end, where the sink writes its last lines (the stop signal's checkpoint, or the
  exit's close): ``probe_stats.speed_mark_us``.

Readers compare two runs' marks: a run whose mark is 1.3× another's had a host that ran
Python code 1.3× slower, and its seconds may be up to that much longer for that reason
alone (:mod:`vllm_probe.analysis.compare`).

Cost: :data:`REPEATS` × about 1 ms (measured: 1.1 ms per pass on the 2-core test
machine), off the hot path (never inside a step). Never raises: a failure reads as no
mark.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: Iterations of the reference loop: about 1 ms of one CPU core here (1.1 ms measured on
#: the 2-core test machine, Python 3.11). Changing it changes the mark's meaning (bump the
#: event schema's version).
REFERENCE_LOOPS = 10_000
#: Passes timed per mark; the mark is their median, so one pass cut by a context switch
#: does not make the mark.
REPEATS = 5


def reference_work(loops: int = REFERENCE_LOOPS) -> int:
    """The fixed computation: ``loops`` rounds of a linear congruential generator on
    Python integers (no allocation that the garbage collector tracks, no I/O, no
    randomness: the same instructions on every run). Returns the final state (38,717,241
    for the default ``loops`` on any machine), so the work cannot be skipped."""
    x = 1
    for i in range(loops):
        x = (x * 1103515245 + i) & 0x7FFFFFFF
    return x


def measure(repeats: int = REPEATS, timer: Callable[[], float] = time.perf_counter) -> float | None:
    """The speed mark: the median wall-clock time of one :func:`reference_work` pass over
    ``repeats`` passes, in µs (rounded to 0.1 µs; lower is faster). ``timer`` gives
    monotonic seconds. None when timing failed (never raises)."""
    try:
        passes = []
        for _ in range(max(1, repeats)):
            t0 = timer()
            reference_work()
            passes.append(timer() - t0)
        passes.sort()
        return round(passes[len(passes) // 2] * 1e6, 1)
    except Exception:  # the probe never raises into vLLM: no mark instead
        return None


__all__ = ["REFERENCE_LOOPS", "REPEATS", "measure", "reference_work"]
