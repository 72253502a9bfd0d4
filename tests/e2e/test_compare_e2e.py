"""``vllm-probe compare``: two real runs of the tiny model that differ only in the token
budget (seed notes §4.4), plus the difference logic on hand-made runs."""

from __future__ import annotations

import json
import os
import re
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
    s, lg = summarize(small), summarize(large)
    assert (s.config["max_num_batched_tokens"], lg.config["max_num_batched_tokens"]) == (256, 1024)
    assert s.requests_finished == lg.requests_finished == 8
    assert s.output_tokens == lg.output_tokens == 8 * 300  # same workload
    # the seed's §4.4 expectations, in the direction they must go
    assert lg.steps < s.steps
    assert lg.chunking.chunks_per_prompt.mean < s.chunking.chunks_per_prompt.mean
    assert s.chunking.chunks_per_prompt.max >= 3  # a 600-token prompt needs 3 steps at 256
    assert lg.chunking.reread_kv_tokens < s.chunking.reread_kv_tokens
    assert lg.tokens_per_step.max > 256 >= s.tokens_per_step.max
    assert lg.latency.ttft_steps.median < s.latency.ttft_steps.median
    diffs = config_differences([s, lg])
    assert diffs == {"max_num_batched_tokens": [256, 1024]}
    assert command_differences([s, lg]) == ["--max-num-batched-tokens 256", f"--max-num-batched-tokens {LARGE_BUDGET}"]

    r = cli("compare", str(small), str(large))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "max_num_batched_tokens" in out and "1,024" in out and "Traceback" not in r.stderr
    steps_line = next(line for line in out.splitlines() if re.match(r"\s+steps\s+[\d,]+ ", line))
    assert f"{s.steps:,}" in steps_line and f"{lg.steps:,}" in steps_line and "−" in steps_line
    r = cli("compare", str(small), str(large), "--json")
    data = json.loads(r.stdout)
    row = next(x for x in data["figures"] if x["path"] == "steps")
    assert row["values"] == [s.steps, lg.steps] and row["deltas"][0]["verdict"] == "better"


# -- what to trust: step figures first, seconds judged against the runs' own noise ------------


def _slowed(stream, factor: float):
    """The same events with every time after the first stretched by ``factor`` (a run
    that got less CPU: the same decisions, more seconds)."""
    t0 = stream.events[0]["ts"]
    for ev in stream.events:
        for key in ("ts", "arrival_ts"):
            if key in ev:
                ev[key] = t0 + (ev[key] - t0) * factor
    return stream


def test_same_decisions_slower_clock_reads_same_and_within_noise(tmp_path):
    from tests._events import scenario_preempt
    from vllm_probe.analysis.compare import GROUPS, itl_spread, noise_threshold

    scenario_preempt().write(tmp_path / "a")
    _slowed(scenario_preempt(), 1.1).write(tmp_path / "b")
    a, b = summarize(tmp_path / "a"), summarize(tmp_path / "b")
    # inter-token times A 0.075, B 0.225, C 0.075 s: p90 0.195 = 2.6x the median
    assert itl_spread(a) == pytest.approx(1.6) and noise_threshold(a, b) == pytest.approx(1.6)
    data = comparison([a, b])
    assert [g.name for g in GROUPS][:6] == ["steps", "preemptions", "chunking", "prefix cache", "queues",
                                              "latency in steps"]  # step figures lead
    clocks = [r["clock"] for r in data["figures"]]
    assert clocks.index("wall") > max(i for i, c in enumerate(clocks[:clocks.index("wall")]) if c == "steps")
    ttft = next(r for r in data["figures"] if r["path"] == "latency.ttft_s.median")
    assert ttft["deltas"][0]["rel"] == pytest.approx(0.1) and ttft["deltas"][0]["noisy"] is True
    verdicts = {v["group"]: v["verdict"] for v in data["verdicts"]}
    assert verdicts == {"steps": "same", "preemptions": "same", "chunking": "same", "prefix cache": "same",
                        "queues": "same", "latency in steps": "same", "latency in seconds": "noise",
                        "run time": "noise", "bound": "same"}
    r = cli("compare", str(tmp_path / "a"), str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    verdict_lines = lines[lines.index("Verdicts") + 1:]
    assert [line.split(":")[0] for line in verdict_lines] == [g.name for g in GROUPS]
    assert verdict_lines[6].startswith("latency in seconds: within noise (noise ±160%) — ")
    assert "≈ +" in next(line for line in lines if line.strip().startswith("TTFT median  "))
    # three times slower, far beyond the 160 % spread: still the machine, as every decision is the same
    _slowed(scenario_preempt(), 3.0).write(tmp_path / "c")
    data = comparison([a, summarize(tmp_path / "c")])
    ttft = next(r for r in data["figures"] if r["path"] == "latency.ttft_s.median")
    assert ttft["deltas"][0]["rel"] == pytest.approx(2.0) and ttft["deltas"][0]["noisy"] is True
    assert data["noise"]["same_decisions"] == [True]
    assert {v["group"]: v["verdict"] for v in data["verdicts"]}["latency in seconds"] == "noise"


def test_group_verdicts_weigh_directions_and_noise():
    from vllm_probe.analysis.compare import verdicts

    def row(section, figure, better, d, rel, verdict, noisy=None, clock="steps"):
        return {"section": section, "figure": figure, "unit": "", "better": better, "clock": clock,
                "values": [1, 1 + d], "deltas": [{"abs": d, "rel": rel, "verdict": verdict, "noisy": noisy,
                                                   "threshold": 0.2 if clock == "wall" else None}]}
    rows = [
        row("preemptions", "preemptions", "lower", -12, -0.8, "better"),
        row("preemptions", "discarded tokens", "lower", -900, -0.5, "better"),
        row("chunking", "chunks/prompt mean", "lower", -1, -0.3, "better"),
        row("chunking", "KV tokens re-read", "lower", 500, 0.1, "worse"),
        row("latency in seconds", "TTFT median", "lower", 0.3, 0.15, "worse", True, "wall"),
        row("run time", "duration", "lower", 2.0, 0.5, "worse", False, "wall"),
        row("run time", "output tokens/s", "higher", -10, -0.05, "worse", True, "wall"),
    ]
    got = {v.group: v for v in verdicts(rows, 2)}
    assert got["preemptions"].verdict == "better"
    assert [c["figure"] for c in got["preemptions"].changes] == ["preemptions", "discarded tokens"]
    assert got["chunking"].verdict == "mixed"
    assert got["latency in seconds"].verdict == "noise" and got["latency in seconds"].noise == 0.2
    assert got["run time"].verdict == "worse"  # the duration moved beyond noise; tokens/s did not
    assert [c["figure"] for c in got["run time"].changes] == ["duration"]
    assert got["steps"].verdict == "unknown"
    assert got["run time"].contradicted_by is None  # no step figure moved
    rows += [row("latency in steps", "TTFT median (steps)", "lower", 3, 0.5, "worse"),
             row("latency in seconds", "queue time median", "lower", -0.4, -0.4, "better", False, "wall")]
    got = {v.group: v for v in verdicts(rows, 2)}
    assert (got["latency in seconds"].verdict, got["latency in seconds"].contradicted_by) == \
        ("better", "latency in steps")  # seconds better, steps worse: the steps hold


@requires_vllm
@pytest.mark.engine
def test_compare_verdicts_on_two_real_runs(quick_run, probe_run):
    from vllm_probe.analysis.compare import itl_spread

    small, large = summarize(quick_run), summarize(probe_run(*with_budget(LARGE_BUDGET)))
    r = cli("compare", str(quick_run), str(probe_run(*with_budget(LARGE_BUDGET))), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    got = {v["group"]: v for v in data["verdicts"]}
    # a 600-token prompt takes 3 chunks at 256 and 1 at 1,024: fewer chunks, nothing re-read
    assert got["chunking"]["verdict"] == "better"
    assert {c["figure"] for c in got["chunking"]["changes"]} >= {"chunks/prompt mean", "KV tokens re-read"}
    median = next(r for r in data["figures"] if r["path"] == "latency.ttft_steps.median")
    assert median["deltas"][0]["verdict"] == "better"
    assert got["latency in steps"]["verdict"] in ("better", "mixed")
    # seconds are judged against the larger inter-token spread of the two runs
    threshold = max(x for x in (itl_spread(small), itl_spread(large)) if x is not None)
    assert data["noise"]["threshold"] == [pytest.approx(threshold)]
    for row in data["figures"]:
        d = row["deltas"][0]
        if row["clock"] == "wall" and d["rel"] is not None and d["abs"]:
            assert d["noisy"] == (abs(d["rel"]) <= threshold), row["figure"]
        if row["clock"] == "steps":
            assert d["noisy"] is None
    assert got["latency in seconds"]["noise"] == pytest.approx(threshold)
    text = cli("compare", str(quick_run), str(probe_run(*with_budget(LARGE_BUDGET)))).stdout
    assert "chunking: better — " in text and "step figures: reliable on any machine" in text


def test_compare_splits_every_run_at_the_same_prompt_lengths(tmp_path):
    from tests._events import scenario_preempt

    scenario_preempt().write(tmp_path / "a")  # token budget 100: classes at 25 and 100
    b = scenario_preempt()
    b.events[0]["max_num_batched_tokens"] = 400  # its own default would split at 100 and 400
    b.write(tmp_path / "b")
    data = json.loads(cli("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json").stdout)
    assert [s["latency_classes"]["boundaries"] for s in data["summaries"]] == [[25, 100], [25, 100]]
    rows = [r["figure"] for r in data["figures"] if r["path"].startswith("latency_classes.")]
    assert rows == ["TTFT median (steps) · medium prompts", "TTFT median (steps) · long prompts",
                    "TTFT median · medium prompts", "end-to-end median · medium prompts",
                    "TTFT median · long prompts", "end-to-end median · long prompts"]
    data = json.loads(cli("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json", "--by",
                          "prompt_len:60").stdout)
    assert [[c["n"] for c in s["latency_classes"]["classes"]] for s in data["summaries"]] == [[1, 2], [1, 2]]
