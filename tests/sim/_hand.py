"""Hand-made runs for the calibration, profile, arrival and drift tests: vLLM's real
scheduler driven on a virtual clock whose step times a given function sets (the probe
writes an ordinary run directory)."""

from __future__ import annotations

import random
from collections.abc import Callable

from benchmarks._hand import SPEC, feature, nonlinear_cost, record, workload
from vllm_probe.analysis.workload import WorkloadRequest

__all__ = ["SPEC", "burst", "feature", "nonlinear_cost", "poisson", "record", "with_think", "workload"]


def poisson(n: int = 40, rate: float = 40.0, seed: int = 5, t0: float = 1000.0, prompts=(50, 240),
            outputs=(5, 40)) -> list[WorkloadRequest]:
    rng = random.Random(seed)
    t, reqs = t0, []
    for i in range(n):
        t += rng.expovariate(rate)
        out = rng.randint(*outputs)
        reqs.append(WorkloadRequest(order=i, req_id=f"h{i}", prompt_len=rng.randint(*prompts), max_tokens=out,
                                    output_tokens=out, arrival_ts=t, added_ts=t, finish_reason="length"))
    return reqs


def with_think(reqs: list[WorkloadRequest], think: Callable[[random.Random], float], seed: int = 1
               ) -> list[WorkloadRequest]:
    """``reqs`` whose client waits ``think(rng)`` s (its think time and turnaround) between a
    finish and the request it sends, request by request (a recording's closed loop uses it)."""
    rng = random.Random(seed)
    for r in reqs:
        r.think_s = think(rng)
    return reqs


def burst(n: int, at: float, seed: int = 8, first_order: int = 0, prefix: str = "b") -> list[WorkloadRequest]:
    """``n`` requests all stamped at ``at`` (epoch s), numbered from ``first_order``."""
    reqs = poisson(n=n, rate=1e6, seed=seed, t0=at)
    for k, r in enumerate(reqs):
        r.order, r.req_id = first_order + k, f"{prefix}{k}"
        r.arrival_ts = r.added_ts = at
    return reqs
