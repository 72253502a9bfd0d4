"""The soak's 3-minute CI mode (benchmarks/soak.py, issue 19 item 3).

vLLM's OpenAI server on the tiny model under ``vllm-probe run --metrics-port`` with
small segment limits (0.25 MiB segments, gzip, keep 0.25 MiB), a bounded loopback load with
bursts that preempt, for 3 minutes (about 6 with the server start here). Asserts what
the soak promises: no event dropped, no hook error, the summary's request and
output-token counts equal to the client's, steps contiguous across every segment, and
the run directory's segments never above ``keep_mb`` + one segment (plus, while the
keeper gzips a closed segment, that segment and its partial ``.gz.tmp``).
"""

from __future__ import annotations

import pytest

from tests.conftest import requires_vllm

pytestmark = [requires_vllm, pytest.mark.engine, pytest.mark.slow]


def test_the_vocabulary_of_the_load_is_the_tiny_models():
    from benchmarks import soak
    from vllm_probe.sim.tiny_model import VOCAB_SIZE

    assert soak.VOCAB == VOCAB_SIZE
    assert max(p for p, _ in soak.PROMPT_MIX) + max(o for o, _ in soak.OUTPUT_MIX) < 1024  # --max-model-len


def test_three_minute_soak(tmp_path):
    from benchmarks import soak

    cfg = soak.SoakConfig(minutes=3, out=tmp_path / "soak", sample_s=5)
    r = soak.run_soak(cfg, progress=lambda _line: None)
    print(soak.table(r))
    c, a, s = r["client"], r["archive"], r["summary"]
    assert c["ok"] > 50 and c["failed"] == 0, c
    assert a["probe_stats_seen"] and a["events_dropped"] == 0 and a["hook_errors"] == 0
    assert (s["requests_finished"], s["output_tokens"]) == (c["ok"], c["output_tokens"])
    assert (a["requests_finished"], a["output_tokens"]) == (c["ok"], c["output_tokens"])
    assert a["step_gaps"] == 0 and a["first_step"] == 0 and a["lines_skipped"] == 0
    assert r["disk"]["segments_missed"] == []
    assert r["disk"]["segments_seen"] > 1 and r["disk"]["segments_removed"] > 0  # it rotated, retention ran
    d = r["disk"]
    assert d["bound_bytes"] == (cfg.keep_mb + cfg.max_segment_mb) * soak.MIB
    assert d["max_settled_bytes"] <= d["bound_bytes"]  # gzipped closed segments + the open one
    # closed segments may wait for the keeper's gzip (as many as the CPU it gets allows), but it
    # catches up: none is left uncompressed at the end but the one open at exit
    assert d["final_in_transit_bytes"] == 0 and d["max_event_files"], d
    assert r["ok"], soak.table(r)
