"""A real vLLM ``Scheduler`` built by the harness with the probe installed on it, its events in
a :class:`~vllm_probe.sim.harness.MemorySink` (the speculative-decoding and KV-cache-group tests)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def probed_scheduler(spec: dict[str, Any]) -> Iterator[tuple[Any, Any]]:
    """``(scheduler, sink)`` for ``harness.SchedulerSpec(**spec)``, the probe on it (every flag);
    vLLM's originals back afterwards."""
    import vllm
    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_probe import engine as probe
    from vllm_probe.settings import ProbeFlags
    from vllm_probe.sim import harness

    sink = harness.MemorySink()
    rt = probe.Runtime(ProbeFlags(), lambda _rt: sink, speed_mark=None)
    assert "Scheduler.update_from_output" in probe.install(Scheduler, rt, vllm.__version__)
    try:
        yield harness.make_scheduler(harness.SchedulerSpec(**spec)), sink
    finally:
        probe.uninstall(Scheduler)
