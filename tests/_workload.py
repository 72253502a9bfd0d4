"""The preempting workload the guarantee tests drive on vLLM's real Scheduler, and the
trace that serves as their oracle for "vLLM decided exactly as without the probe"."""

from __future__ import annotations

import logging

# KV of 11 usable blocks of 16 tokens; 3 requests growing to 100 tokens each: vLLM
# chunks nothing but preempts (measured: several preemptions per run).
SPEC = dict(max_num_batched_tokens=64, num_blocks=12)


def workload():
    """Three 40-token prompts generating 60 tokens each, ids r0..r2."""
    from vllm_probe.sim import harness as testing

    return [testing.make_request(40, 60, req_id=f"r{i}", seed=i) for i in range(3)]


def trace(sched, requests, steps=None, max_steps=5000):
    """Add ``requests``, run ``steps`` steps (None: until idle) and return what the
    scheduler itself decided at each: (tokens per request, preempted ids, finished ids)."""
    from vllm_probe.sim import harness as testing

    for r in requests:
        sched.add_request(r)
    out = []
    while sched.has_requests() and len(out) < (max_steps if steps is None else steps):
        so = testing.step(sched)
        out.append((dict(so.num_scheduled_tokens), sorted(so.preempted_req_ids or ()),
                    sorted(so.finished_req_ids)))
    assert steps is not None or not sched.has_requests(), "workload did not finish"
    return out


def probe_warnings(caplog) -> list[str]:
    """The probe's own warning lines captured by ``caplog``."""
    return [r.getMessage() for r in caplog.records
            if r.name == "vllm_probe" and r.levelno >= logging.WARNING]
