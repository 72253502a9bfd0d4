"""The same replays in this process, in --jobs processes and as Ray tasks on a local head
started on loopback: equal figures; a setting vLLM refuses comes back as an error."""

from __future__ import annotations

import pytest

from tests.conftest import requires_vllm

pytestmark = requires_vllm

POINTS = [{"max_num_seqs": 4}, {"num_kv_blocks": 80}, {"max_num_seqs": 1000, "max_num_batched_tokens": 64}]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from tests._simrun import record

    return record(tmp_path_factory.mktemp("evaluate") / "storm",
                  dict(max_num_batched_tokens=256, max_num_seqs=16, num_blocks=40, block_size=16, max_model_len=256),
                  [(f"R{i}", 64, 100) for i in range(16)], max_steps=5000)


def _figures(evs):
    return [(e.overrides, e.error, dict(e.figures.items())) for e in evs]


@pytest.fixture(scope="module")
def in_process(run):
    from vllm_probe.advice.evaluate import Evaluator

    with Evaluator(run) as ev:
        return _figures(ev.evaluate(POINTS)), ev.baseline.figures


def test_in_process(in_process):
    figs, baseline = in_process
    assert baseline["preemptions"] == 17
    assert [f[2].get("preemptions") for f in figs[:2]] == [4, 9]
    assert figs[2][1].startswith("max_num_seqs=1000, max_num_batched_tokens=64: vLLM: ")
    assert figs[2][2] == {}


def test_jobs_give_the_same_results(run, in_process):
    from vllm_probe.advice.evaluate import Evaluator

    with Evaluator(run, jobs=2) as ev:
        assert _figures(ev.evaluate(POINTS)) == in_process[0]


@pytest.mark.slow
def test_ray_tasks_give_the_same_results(run, in_process):
    """A Ray head started here on loopback (ray.init(address="local")), one CPU."""
    ray = pytest.importorskip("ray")
    from vllm_probe.advice.evaluate import Evaluator

    ray.init(address="local", include_dashboard=False, num_cpus=1, log_to_driver=False,
             _node_ip_address="127.0.0.1")
    try:
        with Evaluator(run, ray_address="local") as ev:
            assert _figures(ev.evaluate(POINTS)) == in_process[0]
    finally:
        ray.shutdown()
