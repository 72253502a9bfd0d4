"""``vllm-probe compare``: two real runs of the tiny model that differ only in the token
budget (seed notes §4.4), plus the difference logic on hand-made runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests._events import scenario_chunked
from tests.conftest import QUICK_WORKLOAD, ROOT, requires_vllm
from vllm_probe.analysis.compare import command_differences, comparison, config_differences, delta
from vllm_probe.runs.rundir import write_meta
from vllm_probe.analysis.compare import FIGURES
from vllm_probe.analysis.summary import summarize

LARGE_BUDGET = "1024"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_probe", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env={**os.environ, "COLUMNS": "160"})


def with_budget(budget: str) -> list[str]:
    args = list(QUICK_WORKLOAD)
    args[args.index("--max-num-batched-tokens") + 1] = budget
    return args


def _hand_run(path, budget: int, cmd_budget: str):
    s = scenario_chunked()
    s.events[0]["max_num_batched_tokens"] = budget
    s.write(path)
    write_meta(path, {"command": ["python", "examples/long_prompts.py", "--max-num-batched-tokens", cmd_budget]})


def test_differences_and_deltas_on_hand_made_runs(tmp_path):
    _hand_run(tmp_path / "a", 2048, "2048")
    _hand_run(tmp_path / "b", 4096, "4096")
    a, b = summarize(tmp_path / "a"), summarize(tmp_path / "b")
    assert config_differences([a, b]) == {"max_num_batched_tokens": [2048, 4096]}
    assert command_differences([a, b]) == ["--max-num-batched-tokens 2048", "--max-num-batched-tokens 4096"]
    assert command_differences([a, a]) is None
    steps = next(f for f in FIGURES if f.path == "steps")
    assert delta(steps, 10, 7) == (-3, -0.3, "better")
    assert delta(steps, 10, 12) == (2, 0.2, "worse")
    assert delta(steps, 10, 10) == (0, 0.0, "same")
    share = next(f for f in FIGURES if f.path == "prefill_share")
    assert delta(share, 0.5, 0.75)[2] is None  # neither direction is better
    data = comparison([a, b])
    row = next(r for r in data["figures"] if r["path"] == "chunking.reread_kv_tokens")
    assert row["values"] == [6144, 6144] and row["deltas"][0]["verdict"] == "same"
    r = cli("compare", str(tmp_path / "a"), str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
    assert "max_num_batched_tokens" in r.stdout and "--max-num-batched-tokens 4096" in r.stdout
    r = cli("compare", str(tmp_path / "a"))
    assert r.returncode == 2 and "at least two" in r.stderr
    r = cli("compare", str(tmp_path / "a"), str(tmp_path / "nope"))
    assert r.returncode == 2 and "run directory not found" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "empty").mkdir()
    r = cli("compare", str(tmp_path / "a"), str(tmp_path / "empty"))
    assert r.returncode == 1 and "no event files" in r.stderr


@requires_vllm
@pytest.mark.engine
def test_larger_budget_means_fewer_steps_and_chunks(quick_run, probe_run):
    small = quick_run  # QUICK_WORKLOAD: budget 256
    large = probe_run(*with_budget(LARGE_BUDGET))
    s, l = summarize(small), summarize(large)
    assert (s.config["max_num_batched_tokens"], l.config["max_num_batched_tokens"]) == (256, 1024)
    assert s.requests_finished == l.requests_finished == 8
    assert s.output_tokens == l.output_tokens == 8 * 300  # same workload
    # the seed's §4.4 expectations, in the direction they must go
    assert l.steps < s.steps
    assert l.chunking.chunks_per_prompt.mean < s.chunking.chunks_per_prompt.mean
    assert s.chunking.chunks_per_prompt.max >= 3  # a 600-token prompt needs 3 steps at 256
    assert l.chunking.reread_kv_tokens < s.chunking.reread_kv_tokens
    assert l.tokens_per_step.max > 256 >= s.tokens_per_step.max
    assert l.latency.ttft_steps.median < s.latency.ttft_steps.median
    diffs = config_differences([s, l])
    assert diffs == {"max_num_batched_tokens": [256, 1024]}
    assert command_differences([s, l]) == ["--max-num-batched-tokens 256", f"--max-num-batched-tokens {LARGE_BUDGET}"]

    r = cli("compare", str(small), str(large))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "max_num_batched_tokens" in out and "1,024" in out and "Traceback" not in r.stderr
    steps_line = next(line for line in out.splitlines() if line.strip().startswith("steps "))
    assert f"{s.steps:,}" in steps_line and f"{l.steps:,}" in steps_line and "−" in steps_line
    r = cli("compare", str(small), str(large), "--json")
    data = json.loads(r.stdout)
    row = next(x for x in data["figures"] if x["path"] == "steps")
    assert row["values"] == [s.steps, l.steps] and row["deltas"][0]["verdict"] == "better"
