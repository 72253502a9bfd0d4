"""A model with sliding-window layers on vLLM 0.32's CPU engine: the tiny hybrid model
(``python -m vllm_probe.sim.tiny_model --hybrid``: 3 layers of a 256-token window, 1 of full
attention, dummy weights). vLLM's hybrid allocator gives it 4 KV-cache groups on one pool; the
probe records them, ``doctor``'s ``max-concurrency`` finding gives the figure vLLM's own
start-up log printed ("Maximum concurrency for 1,024 tokens per request: 1.74x"), worked out
from the groups, and ``whatif`` replays the run at its recorded settings step for step
(measured: 1,211 steps, every one as recorded; before, the replay built one full-attention
group)."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import requires_vllm

pytestmark = [requires_vllm, pytest.mark.engine]


def _workload() -> list[str]:
    from vllm_probe.sim.tiny_model import write_hybrid_model

    return ["--model", str(write_hybrid_model()), "--num-prompts", "8", "--prompt-tokens", "600", "--max-tokens",
            "300", "--num-kv-blocks", "40", "--max-num-batched-tokens", "256", "--max-model-len", "1024"]


def _steps(run_dir) -> list[tuple]:
    evs = [json.loads(line) for p in sorted(run_dir.glob("events-*.jsonl")) for line in p.read_text().splitlines()]
    return [(e["scheduled_tokens"], e["running"], e["waiting"], e["free_blocks"], e["preempted"]) for e in evs
            if e["event"] == "step"]


def test_the_finding_gives_the_concurrency_vllm_printed(probe_run):
    from vllm_probe.analysis.doctor import diagnose
    from vllm_probe.analysis.doctor.rules import RULES
    from vllm_probe.runs.rundir import event_streams
    from vllm_probe.runs.reader import ReadStats, iter_stream
    from vllm_probe.analysis.episodes import Episodes
    from vllm_probe.analysis.state import RunState

    run, proc = probe_run(*_workload(), with_output=True)
    printed = re.findall(r"Maximum concurrency for 1,024 tokens per request: ([0-9.]+)x", proc.stdout + proc.stderr)
    assert printed, (proc.stdout + proc.stderr)[-2000:]
    cfg = json.loads(next(run.glob("events-*.jsonl")).open().readline())
    assert [g["kind"] for g in cfg["kv_cache_group_specs"]] == ["SlidingWindowSpec"] * 3 + ["FullAttentionSpec"]
    assert [g["blocks_per_request"] for g in cfg["kv_cache_group_specs"]] == [5, 5, 5, 8]

    records = list(iter_stream(event_streams(run)[0], ReadStats()))
    for drop_recorded in (False, True):  # vLLM's recorded figure, then the groups' arithmetic alone
        if drop_recorded:
            records[0].kv_max_concurrency = None
            for g in records[0].kv_cache_group_specs:
                g.pop("blocks_per_request")
        ep = Episodes()
        state = RunState(listener=ep).apply_all(records)
        (f,) = [f for f in diagnose(state, ep) if f.id == "max-concurrency"]
        assert isinstance(f.evidence, RULES["max-concurrency"].evidence)
        assert f"{f.evidence.vllm_max_concurrency:.2f}" == printed[0] == "1.74"
        assert f.evidence.running_max == f.evidence.concurrency_decoding == 2


def test_a_hybrid_run_replays_step_for_step(probe_run, tmp_path):
    from vllm_probe.sim.whatif import predict

    run = probe_run(*_workload())
    r = predict(run, [], out=tmp_path / "w")
    assert _steps(r.baseline.run_dir) == _steps(run)
