"""Hand-made runs for the benchmarks (and the tests): vLLM's real scheduler driven on a
virtual clock whose step times a given function sets; the probe writes an ordinary run
directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from collections.abc import Callable, Sequence

from vllm_probe.analysis.workload import Workload, WorkloadRequest

#: The scheduler the hand-made runs are recorded on (tokens, blocks of 16).
SPEC = dict(max_num_batched_tokens=256, max_num_seqs=16, num_blocks=200, block_size=16, max_model_len=2048)


def feature(features: Sequence[float], name: str) -> float:
    """The step-time feature ``name`` of one step's ``features`` (:mod:`vllm_probe.sim.stepmodel`)."""
    from vllm_probe.sim.stepmodel import _INDEX

    return features[_INDEX[name]]


def nonlinear_cost(f: Sequence[float]) -> float:
    """A known cost that changes regime: prefill tokens cost 4 µs up to 600 and 16 µs
    above, decode requests 0.3 ms up to 8 and 0.5 ms above (s)."""
    pt, d = feature(f, "prefill_tokens"), feature(f, "decode_reqs")
    return (0.002 + 4e-6 * pt + 12e-6 * max(0.0, pt - 600) + 3e-4 * d + 2e-4 * max(0.0, d - 8)
            + 5e-8 * feature(f, "attn_decode") + 1e-9 * feature(f, "attn_prefill")
            + 0.003 * feature(f, "new_shape") + 0.02 * feature(f, "first_step"))


def workload(reqs: list[WorkloadRequest]) -> Workload:
    """A workload of ``reqs`` as a recording of vLLM's ``Scheduler`` with blocks of 16 would hold."""
    return Workload("hand-made", {"scheduler_class": "Scheduler", "hash_block_size": 16}, reqs)


def record(run_dir: Path, w: Workload, step_time: Callable[[Sequence[float]], float],
           meta: dict[str, Any] | None = None, replay_kw: dict[str, Any] | None = None, **spec: Any) -> Path:
    """A run directory written by the probe on vLLM's real scheduler replaying ``w`` on a
    virtual clock whose steps last ``step_time(features)``."""
    from vllm_probe.engine.sink import EventSink
    from vllm_probe.runs.rundir import write_meta
    from vllm_probe.sim.harness import SchedulerSpec
    from vllm_probe.sim.replay import replay

    run_dir.mkdir(parents=True, exist_ok=True)
    sink = EventSink(run_dir / "events-1.jsonl")
    try:
        replay(w, SchedulerSpec(**{**SPEC, **spec}), step_time, sink, lag_s=0.0, **(replay_kw or {}))
    finally:
        sink.close()
    write_meta(run_dir, {"command": ["hand-made"], "start_time": 1.0, **(meta or {})})
    return run_dir
