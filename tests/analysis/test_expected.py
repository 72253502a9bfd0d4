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
