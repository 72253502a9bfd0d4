"""Clients as they are: closed loops sent back to back and with a think time, open Poisson
streams, an offline burst and a sequential stream beside a burst, each recorded on vLLM's
real scheduler by the replay's own clients with known step costs (tests/sim/_hand.py),
detected exactly; a sequential stream replayed by its own model beside the burst; and a
declared closed loop replayed within 2 % of the recording's steps and 10 % of its
preemptions."""

from __future__ import annotations

import statistics

import pytest

from tests.conftest import requires_vllm
from tests.sim._hand import burst, nonlinear_cost, poisson, record, with_think, workload

pytestmark = requires_vllm


def _turnaround(rng):
    """A fast client's turnaround: 0.3-3 ms, no think time."""
    return rng.uniform(0.0003, 0.003)


def _tailed(rng):
    """A loaded front end: 70 % of turnarounds 0.5-3 ms, the others 50-150 ms."""
    return rng.uniform(0.0005, 0.003) if rng.random() < 0.7 else rng.uniform(0.05, 0.15)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The hand-made recordings, once per module: ``{name: (run_dir, source requests)}``."""
    root = tmp_path_factory.mktemp("clients")
    out = {}
    b2b = with_think(poisson(n=96, rate=1000.0, seed=3), _turnaround)
    out["b2b"] = (record(root / "b2b", workload(b2b), nonlinear_cost, replay_kw={"closed": (8, 0.0)}), b2b)
    think = with_think(poisson(n=96, rate=1000.0, seed=3), lambda rng: rng.uniform(0.045, 0.055))
    out["think"] = (record(root / "think", workload(think), nonlinear_cost, replay_kw={"closed": (8, 0.05)}), think)
    for name, rate, seed in (("light", 40.0, 5), ("saturated", 400.0, 7)):
        reqs = poisson(n=60, rate=rate, seed=seed)
        out[name] = (record(root / name, workload(reqs), nonlinear_cost), reqs)
    offline = burst(40, 1000.0, seed=9, prefix="h")
    out["offline"] = (record(root / "offline", workload(offline), nonlinear_cost), offline)
    # one user sending 30 requests one after another (think 18-22 ms), and a batch job's 40
    # requests sent at once 0.3 s in: a client's sequential stream beside a burst
    stream = with_think(poisson(n=30, rate=1000.0, seed=4), lambda rng: rng.uniform(0.018, 0.022))
    for r in stream:
        r.client = 0
    w = workload(stream + burst(40, 1000.3, first_order=30))
    w.clients = {0: (1, 0.02)}
    out["mix"] = (record(root / "mix", w, nonlinear_cost), stream)
    return out


def _detect(run_dir):
    from vllm_probe.analysis.workload import load_workload
    from vllm_probe.sim.arrivals import detect

    w = load_workload(run_dir)
    return w, detect(w)


def test_a_closed_loop_sent_back_to_back_is_detected(runs):
    """8 clients that send again 0.3-3 ms after each finish: the first 8 reach the engine
    before step 1 together (read as an offline burst before), every later one right after
    a finish."""
    run, sent = runs["b2b"]
    w, a = _detect(run)
    assert sum(r.anchored for r in w.requests) == 8
    assert (a.kind, a.concurrency, a.how) == ("closed", 8, "detected"), a.describe()
    # the paired gaps are the clients' own turnarounds: their median, less the 8 of the
    # wind-down, within the few that arrive in another order than they were sent
    assert a.think_s == pytest.approx(statistics.median(r.think_s for r in sent[8:-8]), abs=2e-4)
    assert a.think_s < 0.003 and "0 % before it" in a.evidence
    assert a.describe().startswith(f"arrivals: closed loop, 8 in flight, think time {a.think_s * 1e3:.1f} ms")


def test_a_closed_loop_with_a_think_time_and_jitter_is_detected(runs):
    """8 clients thinking 45-55 ms, finishes 13 ms apart: the gaps spread ±2.4 ms around
    their median, far within the spacing of finishes (a window of ±25 % of the spacing
    held 76 % of them: no loop before)."""
    _, a = _detect(runs["think"][0])
    assert (a.kind, a.concurrency) == ("closed", 8), a.describe()
    assert a.think_s == pytest.approx(0.050, abs=0.001)
    assert a.to_dict() == {"kind": "closed", "concurrency": 8, "think_s": a.think_s, "how": "detected",
                           "evidence": a.evidence, "groups": []}


@pytest.mark.parametrize("name", ["light", "saturated"])
def test_an_open_poisson_stream_stays_open_and_is_no_offline_burst(runs, name):
    """Poisson arrivals at 40/s and 400/s: open. At 400/s the first 19 requests reach the
    engine before step 1, the rest across the run: a server run, whose first requests are
    not anchored to steps, and no "offline burst" note."""
    from vllm_probe.sim.arrivals import resolve
    from vllm_probe.sim.plan import notes_of

    w, a = _detect(runs[name][0])
    assert (a.kind, a.concurrency, a.think_s, a.groups) == ("open", None, None, [])
    anchored = sum(r.anchored for r in w.requests)
    assert anchored == {"light": 1, "saturated": 19}[name]
    assert ("no offline burst" in a.evidence) == (anchored > 1)
    assert resolve(w, None).kind == "open"
    assert not any(r.anchored for r in w.requests) and w.clients == {}
    assert not any(n.startswith("offline burst") for n in notes_of(w))


def test_an_offline_burst_is_one(runs):
    from vllm_probe.sim.arrivals import resolve
    from vllm_probe.sim.plan import notes_of

    w, a = _detect(runs["offline"][0])
    assert (a.kind, a.concurrency) == ("burst", None)
    assert a.evidence == ("40 requests reached the engine before steps 0-1, during its first step, and none "
                          "arrived after a request finished")
    resolve(w, None)
    assert sum(r.anchored for r in w.requests) == 40  # kept anchored to their steps
    assert any(n.startswith("offline burst: 40 requests") for n in notes_of(w))


def test_a_sequential_stream_beside_a_burst_is_told_apart(runs):
    """The 40-request burst is set apart; the user's 30 requests are a closed loop of one,
    each sent 18-22 ms after the previous one finished."""
    from vllm_probe.sim.arrivals import resolve

    run, stream = runs["mix"]
    w, a = _detect(run)
    assert (a.kind, a.concurrency) == ("mixed", 1), a.describe()
    loop, batch = a.groups
    assert (loop.kind, loop.concurrency, loop.requests, loop.first_s) == ("closed", 1, 30, 0.0)
    assert loop.think_s == pytest.approx(statistics.median(r.think_s for r in stream[1:-1]), abs=2e-4)
    assert (batch.kind, batch.requests, batch.concurrency) == ("burst", 40, None)
    assert batch.first_s == pytest.approx(1000.3 - stream[0].stamp, abs=1e-9)  # s after the first arrival
    assert a.describe().startswith(
        f"arrivals: per client stream: a closed loop of 1 in flight, think time {loop.think_s * 1e3:.1f} ms "
        "(30 requests); a burst of 40 requests at 0.30 s, at its recorded times (detected: 1 burst(s) set apart; "
        "the other 30 requests with 1 in flight")
    assert [g["kind"] for g in a.to_dict()["groups"]] == ["closed", "burst"]
    resolve(w, None)
    assert w.clients == {0: (1, a.think_s)}
    assert {r.req_id for r in w.requests if r.client == 0} == {r.req_id for r in stream}
    assert all(r.client is None for r in w.requests if r.req_id.startswith("b"))


def _overlaps(run_dir, prefix="h"):
    """How often a request of the stream (ids ``prefix…``) arrived before the one before it
    finished, in a (replayed) run."""
    from vllm_probe.analysis.workload import load_workload

    s = sorted((r for r in load_workload(run_dir).requests if r.req_id.startswith(prefix)), key=lambda r: r.stamp)
    return sum(1 for a, b in zip(s, s[1:]) if b.stamp < a.finish_ts - 1e-9)


def test_the_stream_replays_by_its_own_model_beside_the_burst(runs, tmp_path):
    """At max_num_seqs 4 and 1.5× slower steps, the user still waits for each answer before
    sending the next (never two in flight); replayed at recorded times, its requests pile
    up behind the burst. The baseline at the recorded settings is within the whatif
    tolerances."""
    from vllm_probe.sim.whatif import predict

    run = runs["mix"][0]
    same = predict(run, [], out=tmp_path / "same")
    assert same.arrivals.kind == "mixed" and same.error["within"], same.error
    assert any(n.startswith("arrivals: per client stream: a closed loop of 1") for n in same.notes)
    slow = predict(run, [{"max_num_seqs": 4}], out=tmp_path / "slow", step_time_scale=1.5)
    assert _overlaps(slow.baseline.run_dir) == 0 and _overlaps(slow.configs[0].run_dir) == 0
    fixed = predict(run, [{"max_num_seqs": 4}], out=tmp_path / "fixed", step_time_scale=1.5, arrivals="open")
    assert _overlaps(fixed.configs[0].run_dir) > 10


def test_a_declared_closed_loop_keeps_steps_and_preemptions(tmp_path):
    """8 threads sending back to back through a loaded front end (30 % of turnarounds
    50-150 ms), 140 KV blocks: the detector cannot pair it (the slow turnarounds reorder
    arrivals), so the loop is declared. Each request keeps its own recorded gap: steps
    within 2 % and preemptions within 10 % of the recording. One think time for all (the
    median gap) would leave the slow turnarounds out: more requests in flight, 2.6 % fewer
    steps."""
    from vllm_probe.analysis.workload import load_workload
    from vllm_probe.sim.whatif import predict

    reqs = with_think(poisson(n=120, rate=1000.0, seed=12, prompts=(150, 500), outputs=(20, 100)), _tailed, seed=2)
    run = record(tmp_path / "run", workload(reqs), nonlinear_cost, replay_kw={"closed": (8, 0.0)}, num_blocks=140)
    w = load_workload(run)
    steps, preempts = len(w.steps), len(w.preempts)
    assert (steps, preempts) == (1369, 20)
    declared = predict(run, [], out=tmp_path / "declared", arrivals="closed:8")
    assert (declared.arrivals.kind, declared.arrivals.how, declared.arrivals.concurrency) == ("closed", "declared", 8)
    base = declared.baseline.summary
    assert abs(base.steps / steps - 1) <= 0.02, base.steps
    assert abs(base.preemptions.count / preempts - 1) <= 0.10, base.preemptions.count
    assert declared.baseline.summary.queues.running.max <= 8
    one = predict(run, [], out=tmp_path / "one", arrivals=f"closed:8:{declared.arrivals.think_s * 1e3:.3f}")
    assert one.baseline.summary.steps / steps - 1 < -0.02, one.baseline.summary.steps


def test_a_stretch_cut_around_the_burst_keeps_the_streams_model(runs, tmp_path):
    """The stretch the remedy search replays around the burst (recorded steps 67-184, idle
    before and after) holds only 4 of the user's requests, too few to find the stream by
    themselves: it takes the recording's model, kept to its requests, and its replay at
    max_num_seqs 4 and 1.5× slower steps still sends them one after another."""
    from vllm_probe.analysis.workload import load_workload
    from vllm_probe.sim.arrivals import detect, resolve
    from vllm_probe.sim.cut import stretch_for, write_cut
    from vllm_probe.sim.whatif import predict

    run = runs["mix"][0]
    w = load_workload(run)
    batch = [r for r in w.requests if r.req_id.startswith("b")]
    st = stretch_for(w, min(r.add_before_step for r in batch), max(r.finish_step for r in batch), max_share=1.0)
    assert (st.first_step, st.last_step, st.requests) == (67, 184, 44)
    cut = load_workload(write_cut(run, st, tmp_path / "cut"))
    assert detect(cut).kind == "open"  # by itself
    a = resolve(cut, None)
    assert (a.kind, a.concurrency, [(g.kind, g.requests) for g in a.groups]) == (
        "mixed", 1, [("closed", 4), ("burst", 40)])
    assert a.evidence.startswith("the recording this stretch was cut from: per client stream: a closed loop of 1")
    assert sorted(r.req_id for r in cut.requests if r.client == 0) == ["h4", "h5", "h6", "h7"]
    slow = predict(tmp_path / "cut", [{"max_num_seqs": 4}], out=tmp_path / "slow", step_time_scale=1.5)
    assert slow.arrivals.kind == "mixed" and _overlaps(slow.configs[0].run_dir) == 0
