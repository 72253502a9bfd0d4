"""Closed-loop arrivals (detected on hand-made runs, replayed per finish) and drift (a
recording whose machine slowed down while it ran)."""

from __future__ import annotations

import pytest

from tests.conftest import requires_vllm
from tests.sim._hand import nonlinear_cost, poisson, record, workload


def closed_run(tmp_path, n_flight=4, think=0.005, n=40):
    """A run recorded from a closed-loop client: ``n_flight`` requests in flight, each
    next one sent ``think`` s after a finish (the replay's own closed loop writes it)."""
    return record(tmp_path / "closed", workload(poisson(n=n, rate=1000.0, seed=3)), nonlinear_cost,
                  replay_kw={"closed": (n_flight, think)})


@requires_vllm
def test_closed_loop_is_detected_with_its_concurrency_and_think_time(tmp_path):
    from vllm_probe.analysis.workload import load_workload
    from vllm_probe.sim.arrivals import detect

    w = load_workload(closed_run(tmp_path))
    running = max(s.scheduled_tokens for s in w.steps)
    assert running > 0
    a = detect(w)
    assert (a.kind, a.concurrency, a.how) == ("closed", 4, "detected"), a
    assert a.think_s == pytest.approx(0.005, abs=0.0015)
    assert "closed loop, 4 in flight, think time 5" in a.describe()


@requires_vllm
def test_open_loop_stays_open(tmp_path):
    from vllm_probe.analysis.workload import load_workload
    from vllm_probe.sim.arrivals import detect

    for rate, seed in ((40.0, 5), (400.0, 7)):  # light, and saturated
        w = load_workload(record(tmp_path / f"open{seed}", workload(poisson(n=40, rate=rate, seed=seed)),
                                 nonlinear_cost))
        a = detect(w)  # open (its first requests may form a burst anchored to steps 0-1)
        assert a.kind in ("open", "burst") and a.closed is None, (rate, a.evidence)


def test_arrivals_parse():
    from vllm_probe.sim.arrivals import ArrivalsError, parse

    assert parse("auto") is None and parse("open").kind == "open"
    c = parse("closed:12")
    assert (c.kind, c.concurrency, c.think_s, c.how) == ("closed", 12, None, "declared")
    assert parse("closed:3:250").think_s == 0.25
    for bad in ("closed", "closed:0", "closed:x", "poisson"):
        with pytest.raises(ArrivalsError, match="use auto, open, closed:N"):
            parse(bad)


@requires_vllm
def test_closed_loop_replay_keeps_n_in_flight_when_the_engine_is_slower(tmp_path):
    """At 1.5× slower steps, the closed-loop client still has 4 requests in flight (no
    queue builds); fixed arrival times queue up behind the slower engine."""
    from vllm_probe.sim.whatif import predict

    run = closed_run(tmp_path)
    closed = predict(run, [], out=tmp_path / "c", step_time_scale=1.5)
    assert closed.arrivals.kind == "closed" and not any(n.startswith("offline burst") for n in closed.notes)
    assert any(n.startswith("arrivals: closed loop, 4 in flight") for n in closed.notes)
    assert closed.baseline.summary.queues.running.max == 4
    opened = predict(run, [], out=tmp_path / "o", step_time_scale=1.5, arrivals="open")
    assert opened.arrivals.kind == "open" and any(n.startswith("arrivals: open loop") for n in opened.notes)
    assert opened.baseline.summary.queues.running.max > 4
    same = predict(run, [], out=tmp_path / "s")  # at the recorded speed the closed loop is exact
    assert same.error["within"], same.error
    assert same.baseline.summary.steps == same.recorded.steps


@requires_vllm
def test_drift_factor_is_recovered_and_replayed(tmp_path):
    """The machine runs 1.6× slower from step 150 on: the drift factors recover the
    ratio; the baseline replays the run's average speed (as every prediction does), and
    replaying the recording's speed over time comes closer, which the drift note says."""
    from vllm_probe.analysis.workload import load_workload
    from vllm_probe.sim.stepmodel import drift_factors, fit
    from vllm_probe.sim.whatif import predict

    calls = []

    def drifting(f):
        calls.append(1)
        return nonlinear_cost(f) * (1.6 if len(calls) > 150 else 1.0)

    run = record(tmp_path / "run", workload(poisson(n=60, rate=30.0, seed=11, outputs=(5, 20))), drifting)
    w = load_workload(run)
    assert len(w.steps) > 250
    m = fit(w)
    factors = drift_factors(m, w)
    first, last = factors[0][1], factors[-1][1]
    assert last / first == pytest.approx(1.6, rel=0.08), factors
    r = predict(run, [], out=tmp_path / "out")
    assert r.drift is not None and r.drift["range"][1] / r.drift["range"][0] == pytest.approx(1.6, rel=0.1)
    note = next(n for n in r.notes if n.startswith("drift: "))
    assert "at one speed" in note and "with the drift" in note
    with_drift = abs(r.drift["replayed_error"]["figures"]["ttft_p90"]["error"])
    constant = abs(r.error["figures"]["ttft_p90"]["error"])
    assert with_drift < constant, (with_drift, constant)


def test_a_closed_loop_whose_think_time_outlasts_the_spacing_of_finishes_is_detected(tmp_path):
    """8 clients whose think time is longer than the time between two finishes: the latest
    finish before a request is mostly another client's, so only pairing finish i with
    request i + N finds the loop (a real server run with 8 threads thinking 80 ms, finishes
    64 ms apart, read as open loop before)."""
    from vllm_probe.sim.arrivals import detect, measure

    from vllm_probe.analysis.workload import load_workload

    w = load_workload(closed_run(tmp_path, n_flight=8, think=0.05, n=96))
    loop = measure(sorted(w.requests, key=lambda r: (r.stamp, r.order)))
    assert loop.spacing < 0.05 / 2, loop.spacing  # two finishes or more during one think time
    a = detect(w)
    assert (a.kind, a.concurrency) == ("closed", 8), a.describe()
    assert a.think_s == pytest.approx(0.05, abs=0.002) and loop.negative == 0 and loop.n == 8


def test_a_setting_that_changes_no_decision_reads_exactly_as_the_baseline(tmp_path):
    """On a run whose speed drifted 1.6× (the drift replay is on), ``--set`` of the recorded
    values replays with the baseline's model and speed: every figure equal, to the bit, and
    the Evaluator of doctor and tune gives the same baseline as whatif."""
    from vllm_probe.advice.evaluate import Evaluator
    from vllm_probe.analysis.compare import FIGURES
    from vllm_probe.sim.whatif import predict

    calls = []

    def drifting(f):
        calls.append(1)
        return nonlinear_cost(f) * (1.6 if len(calls) > 150 else 1.0)

    run = record(tmp_path / "run", workload(poisson(n=60, rate=30.0, seed=11, outputs=(5, 20))), drifting)
    recorded_seqs = run_seqs(run)
    r = predict(run, [{"max_num_seqs": recorded_seqs}], out=tmp_path / "out")
    assert r.drift is not None  # the recording's speed over time was replayed beside the baseline
    same, base = r.configs[0].summary, r.baseline.summary
    for f in FIGURES:
        assert f.get(same) == f.get(base), f.label
    with Evaluator(run, out=tmp_path / "ev") as ev:
        assert ev.baseline.figures["ttft_p90"] == base.latency.ttft_s.p90
        assert ev.error["within"] == r.error["within"]
    assert recorded_seqs == r.baseline.settings["max_num_seqs"]


def run_seqs(run) -> int:
    from vllm_probe.analysis.workload import load_workload

    return int(load_workload(run).config["max_num_seqs"])
