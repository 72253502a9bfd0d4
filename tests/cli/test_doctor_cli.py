"""``vllm-probe doctor``: the ``--json`` shape, exit codes, ``--expect``, the expectations
``run --settings`` recorded, and ``--whatif`` against the replay's ``predict``."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli
from tests.analysis.test_doctor_rules import Run, _stall, _storm
from tests.schema.test_settings import SEED_CONFIG_TOML
from vllm_probe import cli
from vllm_probe.analysis.summary import summarize


def _write(run: Run, path, meta: dict | None = None):
    run.s.write(path)
    if meta is not None:
        (path / "meta.json").write_text(json.dumps(meta))
    return path


def test_json_shape_and_exit_codes(tmp_path, capsys):
    ok = _write(_storm(200, (1, 1)), tmp_path / "storm")
    assert cli.main(["doctor", str(ok), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data) == ["run_dir", "findings"] and data["run_dir"] == str(ok)
    (f,) = [f for f in data["findings"] if f["id"] == "preemption-storm"]
    assert list(f) == ["id", "severity", "message", "evidence", "remedy", "predicted"]
    assert f["severity"] == "warning" and f["predicted"] is None
    assert f["evidence"]["preemptions"] == 2
    critical = _write(_stall(60, at_end=True), tmp_path / "stalled")
    assert cli.main(["doctor", str(critical), "--json"]) == 3
    data = json.loads(capsys.readouterr().out)
    assert data["findings"][0]["id"] == "stall" and data["findings"][0]["severity"] == "critical"


def test_report_text(tmp_path):
    run = _write(_stall(60, at_end=True), tmp_path / "stalled")
    r = run_cli("doctor", str(run), env={**__import__("os").environ, "COLUMNS": "200"})
    assert r.returncode == 3, r.stderr
    out = " ".join(r.stdout.split())  # the report wraps at the terminal's width
    assert " CRITICAL stall" in out
    assert "the head BIG needs 13 blocks for its 200-token prompt and the KV cache has 7: it can never fit" in out
    assert "remedy num_gpu_blocks_override = 14" in out
    assert f"see vllm-probe tail {run} --replay --from-step 4" in out


def test_no_finding_above_info_says_so_in_one_line(tmp_path, capsys):
    r = Run()
    r.step(decode=4, times=60)
    assert cli.main(["doctor", str(_write(r, tmp_path / "light"))]) == 0
    out = capsys.readouterr().out
    # earned: every request admitted within ADMIT_WITHIN_STEPS (here none arrived)
    assert ("No finding above info: every request was admitted within 32 steps (the longest waited 0); nothing held "
            "this run back.") in out


def test_expect_the_seed_config_against_a_run_started_with_other_flags(tmp_path, capsys):
    (tmp_path / "config.toml").write_text(SEED_CONFIG_TOML)
    run = _write(_storm(200, (1, 1)), tmp_path / "run")  # budget 1,024, max_num_seqs 8
    assert cli.main(["doctor", str(run), "--json", "--expect", str(tmp_path / "config.toml")]) == 0
    (f,) = [f for f in json.loads(capsys.readouterr().out)["findings"] if f["id"] == "config-not-applied"]
    assert f["evidence"]["differs"] == [{"setting": "max_num_batched_tokens", "expected": 8192, "effective": 1024},
                                        {"setting": "max_num_seqs", "expected": 64, "effective": 8}]
    assert f["evidence"]["not_recorded"] == ["gpu_memory_utilization"]
    assert f["remedy"]["whatif"] == {"max_num_batched_tokens": 8192, "max_num_seqs": 64}
    assert f["remedy"]["arithmetic"].startswith(
        "pass --max-num-batched-tokens 8192, --max-num-seqs 64 on the command line")
    assert f["evidence"]["not_in_v1"] == [{"setting": "preemption_mode",
                                           "note": "vLLM V1 always preempts by recompute (the swap mode was V0's)"}]


def test_the_expectations_recorded_by_run_settings_are_used(tmp_path, capsys):
    meta = {"command": ["python", "x.py"], "start_time": 99.0, "end_time": 200.0, "exit_code": 0,
            "expected": {"source": "configs/config.toml", "engine": {"max_num_seqs": 64}, "model": None,
                         "sampling": None}}
    run = _write(_storm(200, (1, 1)), tmp_path / "run", meta)
    cli.main(["doctor", str(run), "--json"])
    (f,) = [f for f in json.loads(capsys.readouterr().out)["findings"] if f["id"] == "config-not-applied"]
    assert f["message"].startswith(
        "1 setting of configs/config.toml did not take effect: max_num_seqs 64 expected, 8 in force")


def test_whatif_without_vllm_is_one_line(tmp_path, monkeypatch, capsys):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name, *a))
    run = _write(_storm(200, (1, 1)), tmp_path / "run")
    assert cli.main(["doctor", str(run), "--whatif"]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith("vllm-probe: error: doctor --whatif replays through vLLM's own scheduler: whatif replays "
                          "vLLM's own scheduler and needs vLLM installed")


def test_whatif_puts_predicted_against_recorded_figures(tmp_path, monkeypatch, capsys):
    """A stand-in for the replay with its signature (the real one: tests/e2e/test_whatif_e2e.py):
    it gets each remedy's settings once, in finding order, and its summaries become the
    predicted figures; the baseline's comparison reads as whatif's."""
    run = _write(_storm(200, (1, 1)), tmp_path / "run")
    recorded = summarize(run)
    calls = []

    def predict(run_dir, grid, out=None, jobs=1):
        calls.append((run_dir, grid, out, jobs))
        predicted = summarize(run)
        predicted.preemptions.count = 0
        return {"recorded": recorded,
                "error": {"figures": {"preemptions": {"error": 0.0, "within": True},
                                      "TTFT p90": {"error": -0.03, "within": True}}, "within": True},
                "configs": [{"settings": {**g, "max_num_seqs": 8}, "run_dir": str(tmp_path / f"sim{i}"),
                             "summary": predicted} for i, g in enumerate(grid)]}

    from vllm_probe.sim import whatif

    monkeypatch.setattr(whatif, "predict", predict)
    monkeypatch.setattr(whatif, "require_vllm", lambda: None)
    monkeypatch.setattr(whatif, "quiet_vllm", lambda: None)  # leaves this process's environment alone
    assert cli.main(["doctor", str(run), "--whatif", "--json", "--jobs", "2"]) == 0
    (f,) = [f for f in json.loads(capsys.readouterr().out)["findings"] if f["id"] == "preemption-storm"]
    assert calls == [(str(run), [f["remedy"]["whatif"]], None, 2)]
    assert f["predicted"]["settings"] == f["remedy"]["whatif"] and f["predicted"]["run_dir"] == str(tmp_path / "sim0")
    assert f["predicted"]["figures"]["preemptions"] == {"recorded": recorded.preemptions.count, "predicted": 0,
                                                        "unit": ""}
    assert f["predicted"]["baseline_error"] == {"within": True, "figures": {"preemptions": 0.0, "TTFT p90": -0.03},
                                                "off": []}
    assert f["predicted"]["resolved"] is True and f["predicted"]["goal"] == {"figure": "preemptions", "target": 0}
    cli.main(["doctor", str(run), "--whatif"])
    out = capsys.readouterr().out
    assert "predicted  preemptions 2 → 0" in out
    assert ("predictions: vLLM's own scheduler replayed at each remedy's settings; at the recorded settings it "
            "matched the run within its thresholds (preemptions =, TTFT p90 −3.0%)") in " ".join(out.split())


@pytest.mark.parametrize("args,code,msg", [
    (["doctor", "/nonexistent/run"], 2, "vllm-probe: error: run directory not found: /nonexistent/run"),
    (["doctor", "--jobs", "0", "."], 2, "--jobs must be >= 1"),
])
def test_bad_usage(args, code, msg, capsys):
    assert cli.main(args) == code
    assert msg in capsys.readouterr().err


def test_a_prediction_against_the_findings_goal():
    """``resolved`` compares the predicted figure with the goal: at most a value, or lower
    than recorded; the report says which way it fell short."""
    from vllm_probe.analysis.doctor import Finding, Remedy
    from vllm_probe.analysis.doctor.predict import attach
    from vllm_probe.tui.doctor_view import unmet_goal_text

    def finding(fid, setting):
        return Finding(fid, "warning", "", {}, Remedy(setting, 1, "", "", "", whatif={setting: 1}))

    recorded = {"preemptions": {"count": 4}, "chunking": {"reread_kv_tokens": 1000}}
    predicted = {"preemptions": {"count": 3}, "chunking": {"reread_kv_tokens": 1200}}
    storm, chunking = finding("preemption-storm", "num_kv_blocks"), finding("chunking-without-benefit",
                                                                             "max_num_batched_tokens")
    settings = [{"num_kv_blocks": 1}, {"max_num_batched_tokens": 1}]
    attach([storm, chunking], recorded, settings, {"configs": [{"summary": predicted}, {"summary": predicted}]})
    assert storm.predicted["resolved"] is False and chunking.predicted["resolved"] is False
    assert unmet_goal_text(storm.predicted) == "not enough on its own: the replay still preempts"
    assert unmet_goal_text(chunking.predicted) == ("the replay says it does not help: KV re-read tokens does not "
                                                   "go down")
    predicted["chunking"]["reread_kv_tokens"] = 999
    attach([chunking], recorded, settings[1:], {"configs": [{"summary": predicted}]})
    assert chunking.predicted["resolved"] is True
