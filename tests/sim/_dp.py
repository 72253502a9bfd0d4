"""A data-parallel recording made of two real schedulers: vLLM's ``Scheduler`` driven once per
rank on a virtual clock from the same start (so the two ranks' events overlap in time as two
engine cores' do), each with the probe writing its own event file (``events-<pid>.jsonl``,
every event tagged with the rank, as an engine core of that rank tags them) into one run
directory. The front end's balancing is the workloads given per rank.

Rank 0 gets twelve long prompts on a KV cache that cannot hold them (it preempts); rank 1 four
short ones (it never waits for KV). The step time is a known linear cost, so the replay's
step-time fit recovers it and the replay at the recorded settings is exact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_probe.analysis.workload import Workload, WorkloadRequest

BLOCK = 16
#: The engine cores' settings (every rank runs the same): 29 usable blocks of 16 tokens.
SPEC: dict[str, Any] = dict(max_num_batched_tokens=256, max_num_seqs=16, num_blocks=30, block_size=BLOCK,
                            max_model_len=448)
T0 = 1000.0


def linear_cost(features) -> float:
    """A known step time (s) the fit recovers exactly."""
    from vllm_probe.sim.stepmodel import _INDEX

    cost = {"prefill_tokens": 1e-5, "attn_prefill": 2e-8, "decode_reqs": 4e-4, "attn_decode": 1e-7,
            "new_shape": 0.003, "first_step": 0.02}
    return 0.002 + sum(c * features[_INDEX[name]] for name, c in cost.items())


def rank_requests() -> dict[int, list[WorkloadRequest]]:
    """Each rank's requests as the front end sent them: ``r0-*`` (12 × 180-290 tokens, 40
    out, 50 ms apart) to rank 0, ``r1-*`` (4 × 60 tokens, 20 out, 200 ms apart) to rank 1."""
    out: dict[int, list[WorkloadRequest]] = {0: [], 1: []}
    for k in range(12):
        t = T0 + 0.05 * k
        out[0].append(WorkloadRequest(order=k, req_id=f"r0-{k}", prompt_len=180 + 10 * k, max_tokens=40,
                                      output_tokens=40, arrival_ts=t, added_ts=t, finish_reason="length"))
    for k in range(4):
        t = T0 + 0.2 * k
        out[1].append(WorkloadRequest(order=k, req_id=f"r1-{k}", prompt_len=60, max_tokens=20, output_tokens=20,
                                      arrival_ts=t, added_ts=t, finish_reason="length"))
    return out


def record_ranks(run_dir: Path, requests: dict[int, list[WorkloadRequest]] | None = None,
                 engine_of: dict[int, int] | None = None) -> Path:
    """Write the two-rank run into ``run_dir``: one event file per rank (``events-<100 + rank>``).

    ``engine_of``: the ``engine`` each rank's events carry (default: its rank); ``{0: 0, 1: 0}``
    writes what a probe that read ``data_parallel_rank`` wrote for a dense model's ranks.
    """
    from vllm_probe.engine.sink import EventSink
    from vllm_probe.runs.rundir import write_meta
    from vllm_probe.sim.harness import SchedulerSpec
    from vllm_probe.sim.plan import RankSink
    from vllm_probe.sim.replay import replay

    run_dir.mkdir(parents=True, exist_ok=True)
    for rank, reqs in (requests or rank_requests()).items():
        sink = EventSink(run_dir / f"events-{100 + rank}.jsonl")
        target = RankSink(sink, (engine_of or {}).get(rank, rank))
        try:
            replay(Workload("hand-made", {"scheduler_class": "Scheduler", "hash_block_size": BLOCK}, reqs),
                   SchedulerSpec(**SPEC), linear_cost, target, lag_s=0.0, config_overlay={"data_parallel_size": 2})
        finally:
            target.close()
    write_meta(run_dir, {"command": ["vllm", "serve", "tiny", "--data-parallel-size", "2"], "start_time": T0})
    return run_dir
