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


@requires_vllm
def test_a_closed_loop_client_is_replayed_per_finish_as_whatif_does(tmp_path):
    """A run recorded from a closed-loop client (4 in flight, 5 ms think time): the
    evaluator detects it as whatif does, and its baseline equals whatif's baseline replay
    (steps and TTFT p90 exactly: the same arrivals, model and scheduler)."""
    from tests.sim.test_arrivals_drift import closed_run
    from vllm_probe.advice.evaluate import Evaluator
    from vllm_probe.sim.whatif import predict

    run = closed_run(tmp_path)
    with Evaluator(run) as ev:
        assert (ev.arrivals.kind, ev.arrivals.concurrency) == ("closed", 4)
        base = ev.baseline.summary
    w = predict(run, [], out=tmp_path / "whatif").baseline.summary
    assert (base.steps, base.latency.ttft_s.p90) == (w.steps, w.latency.ttft_s.p90)


def test_replays_run_one_after_another_share_one_deadline(run, monkeypatch):
    """A round of three points replayed in this process: each replay's time limit is what is
    left of the deadline when it starts, not what was left when the round was planned (three
    replays each given the whole remainder overran a 30 s doctor budget by half)."""
    import time

    import vllm_probe.sim.replay as replay_mod
    from vllm_probe.advice.evaluate import Evaluator
    from vllm_probe.sim.replay import TIME_LIMIT_STOP, ReplayTimeLimit

    clock = [1_000_000.0]
    limits = []

    def thirty_seconds_each(*args, time_limit_s=None, **kwargs):
        limits.append(time_limit_s)
        clock[0] += 30.0
        raise ReplayTimeLimit(0, 30.0)

    with Evaluator(run) as ev:
        monkeypatch.setattr(time, "time", lambda: clock[0])
        monkeypatch.setattr(replay_mod, "replay", thirty_seconds_each)
        ev.deadline = time.monotonic() + 100.0
        evs = ev.evaluate(POINTS[:2] + [{"max_num_seqs": 8}])
    assert [round(x) for x in limits] == [100, 70, 40]
    assert all(e.error.startswith(TIME_LIMIT_STOP) for e in evs)
