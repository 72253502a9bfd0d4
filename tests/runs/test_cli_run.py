"""`vllm-probe run` and the `vllm-probe COMMAND` shorthand, with commands that are not vLLM."""

from __future__ import annotations

import json
import os
import stat
import sys

from tests.conftest import ROOT, run_cli

SHOW_ENV = ("import os, json; print(json.dumps({k: v for k, v in os.environ.items() "
            "if k.startswith('VLLMPROBE_') or k == 'VLLM_PLUGINS'}))")


def test_exit_code_is_passed_on_and_recorded(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("run", "--out", str(out), "--", "sh", "-c", "exit 3")
    assert proc.returncode == 3
    assert f"vllm-probe: events -> {out}" in proc.stderr
    assert "0 steps, 0 chunks, 0 preemptions" in proc.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["exit_code"] == 3 and meta["command"] == ["sh", "-c", "exit 3"]
    assert meta["end_time"] >= meta["start_time"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o700


def test_environment_enables_the_plugin(tmp_path, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    for name in [k for k in os.environ if k.startswith("VLLMPROBE_")]:
        monkeypatch.delenv(name)  # CI's own VLLMPROBE_TEST_* switches are not the launcher's
    proc = run_cli("run", "--out", str(out), "--settings", "configs/settings.minimal.yaml",
                   "--", sys.executable, "-c", SHOW_ENV)
    assert proc.returncode == 0, proc.stderr
    env = json.loads(proc.stdout)
    assert env == {
        "VLLMPROBE_ENABLE": "1",
        "VLLMPROBE_RUN_DIR": str(out.resolve()),
        "VLLMPROBE_SETTINGS": str((ROOT / "configs/settings.minimal.yaml").resolve()),
    }
    meta = json.loads((out / "meta.json").read_text())
    assert meta["flags"]["log_schedule_each_step"] is False


def test_vllm_plugins_gets_ours_added(tmp_path):

    env = {**os.environ, "VLLM_PLUGINS": "other_plugin"}
    proc = run_cli("run", "--out", str(tmp_path / "r"), "--", sys.executable, "-c", SHOW_ENV, env=env)
    assert json.loads(proc.stdout)["VLLM_PLUGINS"] == "other_plugin,vllm_probe"
    env["VLLM_PLUGINS"] = "vllm_probe,other_plugin"
    proc = run_cli("run", "--out", str(tmp_path / "r2"), "--", sys.executable, "-c", SHOW_ENV, env=env)
    assert json.loads(proc.stdout)["VLLM_PLUGINS"] == "vllm_probe,other_plugin"


def test_shorthand_runs_the_command_in_a_new_run_dir(tmp_path):
    proc = run_cli(sys.executable, "-c", "print('hello')", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "hello"
    runs = list((tmp_path / "vllm-probe-runs").iterdir())
    assert len(runs) == 1 and (runs[0] / "meta.json").exists()
    assert f"events -> vllm-probe-runs/{runs[0].name}" in proc.stderr


def test_the_default_run_is_the_newest_started_nested_ones_included(tmp_path):
    from vllm_probe.runs.rundir import latest_run

    def run(path, start):
        path.mkdir(parents=True)
        (path / "meta.json").write_text(json.dumps({"command": ["x"], "start_time": start}))

    run(tmp_path / "20261130-010000-a", 1000.0)
    run(tmp_path / "compare-budgets-20261130-020000" / "budget-768", 2000.0)
    run(tmp_path / "compare-budgets-20261130-020000" / "budget-6144", 2100.0)
    run(tmp_path / "zzz-older", 500.0)  # a name that sorts last does not win
    assert latest_run(tmp_path) == tmp_path / "compare-budgets-20261130-020000" / "budget-6144"
    run(tmp_path / "20261130-030000-b", 3000.0)
    assert latest_run(tmp_path) == tmp_path / "20261130-030000-b"


def test_the_seed_config_toml_is_accepted_and_its_scheduler_section_recorded(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("run", "--out", str(out), "--settings", "configs/config.toml", "--", "true")
    assert proc.returncode == 0, proc.stderr
    assert "configs/config.toml: section server left alone (not the probe's)" in proc.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["expected"] == {
        "source": "configs/config.toml", "model": None, "sampling": None,
        "engine": {"max_num_batched_tokens": 8192, "max_num_seqs": 64, "enable_chunked_prefill": True,
                   "gpu_memory_utilization": 0.9, "preemption_mode": "recompute"},
    }
