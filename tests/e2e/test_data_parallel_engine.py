"""Data parallel for real: vLLM 0.32's OpenAI server with ``--data-parallel-size 2`` on the
CPU engine and the tiny (dense) model, under the probe; 16 requests, 8 in flight.

vLLM runs a dense model's ranks as independent engine cores and resets each one's
``parallel_config.data_parallel_rank`` to 0 (``reconfigure_for_independent_dp_rank``); the
rank survives as ``data_parallel_index``, which the probe's ``engine`` must carry, or both
ranks read as one engine core. Measured here: each engine core's file has one rank, the
front end sent the 16 requests to both, and each rank's figures add up to the run's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, _free_port, requires_vllm, run_cli, vllm_probe_cmd

pytestmark = [requires_vllm, pytest.mark.engine, pytest.mark.slow]

REQUESTS = 16


@pytest.fixture(scope="module")
def dp2_run(tmp_path_factory):
    from vllm_probe.sim.tiny_model import write_tiny_model

    base = tmp_path_factory.mktemp("dp2")
    port = _free_port()
    with open(base / "server.log", "wb") as log:
        server = subprocess.Popen(vllm_probe_cmd(
            "run", "--out", str(base / "run"), "--", sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(write_tiny_model()), "--load-format", "dummy", "--enforce-eager", "--dtype", "float32",
            "--host", "127.0.0.1", "--port", str(port), "--data-parallel-size", "2", "--max-model-len", "2048",
            "--max-num-batched-tokens", "512", "--num-gpu-blocks-override", "40", "--gpu-memory-utilization", "0.3"),
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            client = subprocess.run([sys.executable, str(ROOT / "examples" / "load_client.py"), "--base-url",
                                     f"http://127.0.0.1:{port}", "--requests", str(REQUESTS), "--concurrency", "8",
                                     "--prompt-words", "300", "--max-tokens", "64", "--wait", "240"],
                                    capture_output=True, text=True, timeout=400)
            assert client.returncode == 0, client.stdout[-2000:] + client.stderr[-2000:]
        finally:
            server.terminate()
            server.wait(timeout=120)
    return base / "run"


def test_each_rank_of_a_real_data_parallel_server_is_recorded_apart(dp2_run):
    from vllm_probe.analysis.workload import load_workload
    from vllm_probe.runs.ranks import layout
    from vllm_probe.runs.reader import ReadStats, iter_stream

    lay = layout(dp2_run)
    assert lay.ids == [0, 1] and lay.clashes == ()
    for rank in (0, 1):
        (stream,) = lay.ranks[rank]
        assert {rec.engine for rec in iter_stream(stream, ReadStats())} == {rank}
    ids = [{r.req_id for r in load_workload(dp2_run, rank=r).requests} for r in (0, 1)]
    assert ids[0] and ids[1] and not ids[0] & ids[1] and len(ids[0] | ids[1]) == REQUESTS
    whole = json.loads(run_cli("summary", str(dp2_run), "--json").stdout)
    assert whole["engines"] == 2 and whole["requests_finished"] == REQUESTS
    ranks = whole["ranks"]
    assert [r["summary"]["requests_added"] for r in ranks] == [len(ids[0]), len(ids[1])]
    assert sum(r["summary"]["steps"] for r in ranks) == whole["steps"]
    assert sum(r["summary"]["scheduled_tokens"] for r in ranks) == whole["scheduled_tokens"]
