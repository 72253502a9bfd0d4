"""``vllm-probe doctor``: the ``--json`` shape, exit codes, ``--expect``, the expectations
``run --settings`` recorded, and the remedies without a replay (the search: tests/advice/)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli
from tests.analysis.test_doctor_rules import Run, _stall, _storm
from tests.schema.test_settings import SEED_CONFIG_TOML
from vllm_probe import cli


def _write(run: Run, path, meta: dict | None = None):
    run.s.write(path)
    if meta is not None:
        (path / "meta.json").write_text(json.dumps(meta))
    return path


def test_json_shape_and_exit_codes(tmp_path, capsys):
    ok = _write(_storm(200, (1, 1)), tmp_path / "storm")
    assert cli.main(["doctor", str(ok), "--json", "--no-replay"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data) == ["run_dir", "plan", "findings"] and data["run_dir"] == str(ok)
    # --no-replay: the plan is the rules' arithmetic, said so
    assert data["plan"]["checked"] is False and data["plan"]["left_because"]["preemption-storm"] == (
        "arithmetic, not checked by the replay: --no-replay")
    (f,) = [f for f in data["findings"] if f["id"] == "preemption-storm"]
    assert list(f) == ["id", "severity", "message", "evidence", "remedy", "predicted"]
    assert f["severity"] == "warning" and f["predicted"] is None
    assert f["evidence"]["preemptions"] == 2
    critical = _write(_stall(60, at_end=True), tmp_path / "stalled")
    assert cli.main(["doctor", str(critical), "--json", "--no-replay"]) == 3
    data = json.loads(capsys.readouterr().out)
    assert data["findings"][0]["id"] == "stall" and data["findings"][0]["severity"] == "critical"


def test_report_text(tmp_path):
    run = _write(_stall(60, at_end=True), tmp_path / "stalled")
    r = run_cli("doctor", str(run), "--no-replay", env={**__import__("os").environ, "COLUMNS": "200"})
    assert r.returncode == 3, r.stderr
    out = " ".join(r.stdout.split())  # the report wraps at the terminal's width
    assert " CRITICAL stall" in out
    assert "the head BIG needs 13 blocks for its 200-token prompt and the KV cache has 7: it can never fit" in out
    assert "remedy num_kv_blocks = 14 (--num-gpu-blocks-override 14)" in out
    assert f"see vllm-probe tail {run} --replay --from-step 4" in out


def test_no_finding_above_info_says_so_in_one_line(tmp_path, capsys):
    r = Run()
    r.step(decode=4, times=60)
    assert cli.main(["doctor", str(_write(r, tmp_path / "light")), "--no-replay"]) == 0
    out = capsys.readouterr().out
    # earned: every request admitted within ADMIT_WITHIN_STEPS (here none arrived)
    assert ("No finding above info: every request was admitted within 32 steps (the longest waited 0); nothing held "
            "this run back.") in out


def test_expect_the_seed_config_against_a_run_started_with_other_flags(tmp_path, capsys):
    (tmp_path / "config.toml").write_text(SEED_CONFIG_TOML)
    run = _write(_storm(200, (1, 1)), tmp_path / "run")  # budget 1,024, max_num_seqs 8
    assert cli.main(["doctor", str(run), "--json", "--no-replay", "--expect", str(tmp_path / "config.toml")]) == 0
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
    cli.main(["doctor", str(run), "--json", "--no-replay"])
    (f,) = [f for f in json.loads(capsys.readouterr().out)["findings"] if f["id"] == "config-not-applied"]
    assert f["message"].startswith(
        "1 setting of configs/config.toml did not take effect: max_num_seqs 64 expected, 8 in force")


def _no_vllm(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name, *a))


def test_whatif_without_vllm_is_one_line(tmp_path, monkeypatch, capsys):
    _no_vllm(monkeypatch)
    run = _write(_storm(200, (1, 1)), tmp_path / "run")
    assert cli.main(["doctor", str(run), "--whatif"]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith("vllm-probe: error: doctor --whatif replays through vLLM's own scheduler: vLLM is not "
                          "installed in this environment")


def test_without_vllm_the_remedy_is_the_arithmetic_unchecked(tmp_path, monkeypatch, capsys):
    """No vLLM (or --no-replay): the rule's arithmetic stays the remedy, ``checked`` false,
    and one line on stderr says so."""
    _no_vllm(monkeypatch)
    run = _write(_storm(200, (1, 1)), tmp_path / "run")
    assert cli.main(["doctor", str(run), "--json"]) == 0
    out, err = capsys.readouterr()
    (f,) = [f for f in json.loads(out)["findings"] if f["id"] == "preemption-storm"]
    assert f["remedy"]["checked"] is False and f["remedy"]["predicted"] is None and f["predicted"] is None
    assert "(arithmetic, not checked by the replay)" in f["remedy"]["arithmetic"]
    assert err.strip().splitlines() == ["vllm-probe: note: vLLM is not installed here: remedies are the rules' "
                                        "arithmetic, not checked by the replay"]
    assert cli.main(["doctor", str(run), "--json", "--no-replay"]) == 0
    (g,) = [f for f in json.loads(capsys.readouterr().out)["findings"] if f["id"] == "preemption-storm"]
    assert g["remedy"] == f["remedy"]


@pytest.mark.parametrize("args,code,msg", [
    (["doctor", "/nonexistent/run"], 2, "vllm-probe: error: run directory not found: /nonexistent/run"),
    (["doctor", "--jobs", "0", "."], 2, "--jobs must be >= 1"),
    (["doctor", "--no-replay", "--whatif", "."], 2, "--no-replay and --whatif contradict each other"),
    (["doctor", "--budget", "nan", "."], 2, "--budget must be positive, got nan"),
    (["doctor", "--out", "/proc/vllm-probe-nope", "."], 2, "vllm-probe: error: --out /proc/vllm-probe-nope: "),
])
def test_bad_usage(args, code, msg, capsys):
    assert cli.main(args) == code
    assert msg in capsys.readouterr().err
