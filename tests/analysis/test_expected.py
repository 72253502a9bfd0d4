"""analysis/expected.py: a user's expected engine arguments against engine_config."""

from __future__ import annotations

from tests.schema.test_settings import SEED_CONFIG_TOML
from vllm_probe.analysis.expected import DIFFERS, MATCHES, NOT_RECORDED, NOT_V1, check_expected
from vllm_probe.schema.records import EngineConfigEvent
from vllm_probe.settings import load_expected


def test_the_seed_config_against_a_run_started_with_other_flags(tmp_path):
    (tmp_path / "config.toml").write_text(SEED_CONFIG_TOML)
    expected = load_expected(tmp_path / "config.toml")
    config = EngineConfigEvent(ts=0.0, max_num_batched_tokens=1024, max_num_seqs=64, enable_chunked_prefill=True)
    checks = check_expected(expected.engine, config)
    assert [(c.setting, c.expected, c.effective, c.status) for c in checks] == [
        ("max_num_batched_tokens", 8192, 1024, DIFFERS),
        ("max_num_seqs", 64, 64, MATCHES),
        ("enable_chunked_prefill", True, True, MATCHES),
        ("gpu_memory_utilization", 0.9, None, NOT_RECORDED),
        ("preemption_mode", "recompute", None, NOT_V1),
    ]
    assert "recompute" in checks[-1].note


def test_values_compare_as_settings():
    config = EngineConfigEvent(ts=0.0, scheduling_policy="fcfs", prefix_caching=False, max_num_seqs=1,
                               num_kv_blocks=64)
    checks = check_expected({"scheduling_policy": "FCFS", "enable_prefix_caching": 0, "max_num_seqs": True,
                             "num_gpu_blocks_override": 64.0}, config)
    assert [c.status for c in checks] == [MATCHES, DIFFERS, DIFFERS, MATCHES]
    assert check_expected({"max_num_seqs": 8}, None)[0].note == "no engine_config"


def test_a_misspelt_engine_argument_is_named_with_vllms_closest(tmp_path):
    """Issue 17 item 7 (the seed's §5 question): ``max_num_batched_token = 2048`` is not an
    engine argument, so vLLM never saw it; it is not "no difference"."""
    from vllm_probe.analysis.expected import UNKNOWN, closest_engine_arg, engine_arg_names

    assert {"max_num_batched_tokens", "tensor_parallel_size", "async_scheduling"} <= engine_arg_names()
    (tmp_path / "config.toml").write_text("[scheduler]\nmax_num_batched_token = 2048\nmax_num_seqs = 64\n"
                                          "tensor_parallel_size = 1\nzzz_qqq = 3\n")
    expected = load_expected(tmp_path / "config.toml")
    config = EngineConfigEvent(ts=0.0, max_num_batched_tokens=1024, max_num_seqs=64)
    checks = check_expected(expected.engine, config)
    assert [(c.setting, c.expected, c.status, c.suggestion) for c in checks] == [
        ("max_num_batched_token", 2048, UNKNOWN, "max_num_batched_tokens"),
        ("max_num_seqs", 64, MATCHES, None),
        ("tensor_parallel_size", 1, NOT_RECORDED, None),  # a real argument that engine_config does not record
        ("zzz_qqq", 3, UNKNOWN, None),
    ]
    assert checks[0].note == "not an engine argument of vLLM: did you mean max_num_batched_tokens?"
    assert checks[3].note == "not an engine argument of vLLM"
    assert closest_engine_arg("max_num_seq") == "max_num_seqs"


def test_summary_and_doctor_expect_name_the_misspelt_key(tmp_path):
    import json

    from rich.console import Console

    from tests._events import scenario_chunked
    from vllm_probe.analysis.doctor import examine
    from vllm_probe.analysis.summary import summarize
    from vllm_probe.tui.summary_view import expected_table

    run = tmp_path / "run"
    scenario_chunked().write(run)
    (tmp_path / "config.toml").write_text("[scheduler]\nmax_num_batched_token = 2048\n")
    expected = load_expected(tmp_path / "config.toml")
    meta = json.loads((run / "meta.json").read_text()) if (run / "meta.json").exists() else {}
    meta["expected"] = {"source": expected.source, "engine": expected.engine}
    (run / "meta.json").write_text(json.dumps(meta))
    s = summarize(run)
    (check,) = s.expected["checks"]
    assert (check["status"], check["suggestion"]) == ("unknown", "max_num_batched_tokens")
    console = Console(width=400, record=True)
    console.print(expected_table(s))
    text = " ".join(console.export_text().split())  # the title wraps at the table's width
    assert "vs this run: 1 not an engine argument of vLLM" in text and "no difference" not in text
    assert "did you mean max_num_batched_tokens?" in text
    (f,) = [f for f in examine(run, expected).findings if f.id == "config-not-applied"]
    assert f.message.startswith(f"1 setting of {expected.source} did not take effect: max_num_batched_token is not "
                                "an engine argument of vLLM (did you mean max_num_batched_tokens?)")
    assert f.to_dict()["evidence"]["unknown"] == [{"setting": "max_num_batched_token", "expected": 2048,
                                                      "did_you_mean": "max_num_batched_tokens"}]
    assert (f.remedy.setting, f.remedy.value) == ("max_num_batched_tokens", 2048)
    assert f.remedy.whatif == {"max_num_batched_tokens": 2048}


def test_run_names_a_misspelt_engine_argument_before_it_starts(tmp_path):
    import sys

    from tests.conftest import run_cli

    f = tmp_path / "config.toml"
    f.write_text("[scheduler]\nmax_num_batched_token = 2048\nmax_num_seqs = 8\n")
    r = run_cli("run", "--settings", str(f), "--out", str(tmp_path / "run"), "--", sys.executable, "-c", "pass")
    assert r.returncode == 0
    assert (f"vllm-probe: {f}: max_num_batched_token is not an engine argument of vLLM (did you mean "
            "max_num_batched_tokens?); the run goes on without it") in r.stderr
    assert "max_num_seqs is not" not in r.stderr
