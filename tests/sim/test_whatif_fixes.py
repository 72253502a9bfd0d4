"""Issue 18 item 6, each fix with its test: gpu_memory_utilization outside (0, 1], TTFT in
steps in the whatif table, compare's comparability and prediction notes, a table of six
settings at 160 columns, no negative intercept."""

from __future__ import annotations

import io

import numpy as np
import pytest

from tests.conftest import requires_vllm, run_cli
from tests.sim._hand import nonlinear_cost, poisson, record, workload


@pytest.mark.parametrize("value", [2, 0, -0.5])
def test_gpu_memory_utilization_outside_0_1_is_refused(value):
    from vllm_probe.sim import engine_args
    from vllm_probe.sim.engine_args import SettingError

    config = {"gpu_memory_utilization": 0.3, "kv_block_bytes": 8192, "device_memory_bytes": 1 << 34,
              "num_kv_blocks": 100, "max_model_len": 512, "max_num_batched_tokens": 256, "max_num_seqs": 8,
              "block_size": 16}
    with pytest.raises(SettingError) as e:
        engine_args.kv_blocks_for_utilization(config, value)
    assert str(e.value) == (f"gpu_memory_utilization={value:g}: vLLM accepts a share of the device's memory above 0 "
                            "and at most 1")


@requires_vllm
def test_whatif_cli_refuses_utilization_2_in_one_line(tmp_path):
    run = record(tmp_path / "run", workload(poisson(n=6)), nonlinear_cost)
    r = run_cli("whatif", str(run), "--set", "gpu_memory_utilization=2", "--out", str(tmp_path / "o"))
    errors = [line for line in r.stderr.splitlines() if "error" in line.lower()]
    assert r.returncode == 2 and len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    assert errors[0] == ("vllm-probe: error: gpu_memory_utilization=2: vLLM accepts a share of the device's memory "
                         "above 0 and at most 1")
    assert not (tmp_path / "o").exists()


def test_no_negative_intercept():
    """Decode steps of 4-16 requests costing 1 ms each minus 3 ms: ordinary least squares
    gives a −3 ms intercept; the fit keeps it at 0 or above."""
    from vllm_probe.sim.stepmodel import FEATURES, _INDEX, fit_rows

    d = np.repeat(np.arange(4, 17), 5).astype(float)
    rows = np.zeros((len(d), len(FEATURES)))
    rows[:, _INDEX["decode_reqs"]] = d
    y = 1e-3 * d - 3e-3
    ols = np.linalg.lstsq(np.column_stack([np.ones(len(d)), d]), y, rcond=None)[0]
    assert ols[0] == pytest.approx(-3e-3)
    m = fit_rows(rows, y, ("decode_reqs",))
    assert m.intercept >= 0 and all(c >= 0 for c in m.coef)
    assert m.describe()[0][1] >= 0


def _summary(command, budget, ttft, ttft_steps):
    from vllm_probe.analysis.summary_types import Summary

    s = Summary(run_dir=f"/r/{command[0]}-{budget}", command=command, config={"max_num_batched_tokens": budget})
    s.latency.ttft_s.median = ttft
    s.latency.ttft_steps.median = ttft_steps
    s.latency.itl_s.median, s.latency.itl_s.p90 = 0.010, 0.011
    return s


def test_compare_says_when_steps_do_not_compare_and_a_prediction_gap_is_no_noise():
    from vllm_probe.analysis.compare import comparison

    real = _summary(["python", "x.py"], 2048, 1.00, 30)
    pred = _summary(["vllm-probe", "whatif", "run"], 2048, 1.14, 30)
    data = comparison([real, pred])  # same steps, yet the gap is the model's error
    assert data["noise"]["same_decisions"] == [False]
    assert data["predictions"] == [False, True] and data["noise"]["threshold"] == [None]
    row = next(r for r in data["figures"] if r["figure"] == "TTFT median")
    assert row["deltas"][0]["rel"] == pytest.approx(0.14) and row["deltas"][0]["noisy"] is None
    seconds = next(v for v in data["verdicts"] if v["group"] == "latency in seconds")
    assert seconds["verdict"] == "worse"
    real2 = _summary(["python", "x.py"], 2048, 1.10, 30)  # two real runs: 10 % is within a 10 % spread
    real2.latency.itl_s.p90 = 0.0111
    assert comparison([real, real2])["steps_comparable"] == [True]
    big = _summary(["vllm-probe", "whatif", "run"], 6144, 0.99, 90)  # better in seconds, worse in steps
    data = comparison([pred, big])
    assert data["steps_comparable"] == [False]
    seconds = next(v for v in data["verdicts"] if v["group"] == "latency in seconds")
    assert seconds["verdict"] == "better" and seconds["contradicted_by"] is None
    from rich.console import Console

    from vllm_probe.tui.compare_view import render

    out = io.StringIO()
    Console(file=out, width=200).print(render([real, big]))
    text = out.getvalue()
    assert "[2]: token budgets differ (2,048 vs 6,144)" in text and "trust the steps" not in text
    assert "a prediction against a real run" in text


@requires_vllm
def test_whatif_table_with_six_settings_at_160_columns_is_paged_not_cut(tmp_path):
    from rich.console import Console

    from vllm_probe.sim.whatif import predict
    from vllm_probe.tui.whatif_view import render

    run = record(tmp_path / "run", workload(poisson(n=10, prompts=(300, 900))), nonlinear_cost)
    grid = [{"max_num_batched_tokens": b} for b in (128, 192, 384, 512, 768, 1024)]
    r = predict(run, grid, out=tmp_path / "out")
    out = io.StringIO()
    Console(file=out, width=160).print(render(r, 160))
    text = out.getvalue()
    assert "…" not in text
    # each setting's cell carries its interval: two settings to a page of 160 columns
    assert "Predicted ([1]–[2] of 6)" in text and "Predicted ([5]–[6] of 6)" in text
    assert "TTFT median (steps)" in text and "TTFT p90 (steps)" in text
    assert "steps outside the model's fitted region: baseline 0 %" in text
    assert r.configs[-1].replay["outside_region"] > 0  # 1,024-token steps: never recorded at budget 256


def test_whatif_bad_arrivals_and_missing_profile_are_one_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    missing = tmp_path / "none.json"
    for args, words in ((["--arrivals", "closed:x"], "--arrivals 'closed:x': use auto, open, closed:N"),
                        (["--profile", str(missing)], f"cannot read the profile {missing}"),
                        (["--profile", "p.json", "--no-profile"], "--profile and --no-profile exclude each other")):
        r = run_cli("whatif", str(run), *args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and words in r.stderr, (args, r.stderr)
