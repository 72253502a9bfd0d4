"""The stretch of a recording a finding needs (:mod:`vllm_probe.sim.cut`): idle boundaries,
the prefix cache's exactness check, widening; a cut replayed through vLLM's real
scheduler gives the recorded stretch step for step, and doctor's search on the stretch
tries and finds what it finds on the whole run."""

from __future__ import annotations

import msgspec
import pytest

from tests.conftest import HAVE_VLLM, requires_vllm
from vllm_probe.analysis.workload import Workload, WorkloadRequest
from vllm_probe.sim.cut import idle_boundaries, stretch_for, widen


def _req(order, add, finish, t, digests=None):
    return WorkloadRequest(order=order, req_id=f"r{order}", prompt_len=16, max_tokens=4, output_tokens=4,
                           arrival_ts=t, added_ts=t, add_before_step=add, finish_step=finish,
                           finish_reason=None if finish is None else "length", block_digests=digests)


def _hand(reqs, last_step, prefix=False):
    from vllm_probe.analysis.workload import StepRow

    steps = [StepRow(s, 0.0, 0.0, 0.0, 16, 0) for s in range(last_step + 1)]
    return Workload("hand-made", {"prefix_caching": prefix}, reqs, steps=steps, last_step=last_step)


def test_idle_boundaries_are_where_every_earlier_request_had_finished():
    """r0 runs steps 0-3 and r1 2-5 (overlapping): idle before 6; r2 6-8: idle before 9;
    r3 9-10: idle before 11, the end."""
    w = _hand([_req(0, 0, 3, 0.0), _req(1, 2, 5, 0.1), _req(2, 6, 8, 5.0), _req(3, 9, 10, 9.0)], last_step=10)
    assert idle_boundaries(w) == [0, 6, 9, 11]
    # an unfinished request: no boundary after its arrival
    w = _hand([_req(0, 0, 3, 0.0), _req(1, 4, None, 1.0)], last_step=10)
    assert idle_boundaries(w) == [0, 4]


def test_the_stretch_around_steps_is_bounded_by_idle_moments_and_half_the_run():
    reqs = [_req(0, 0, 3, 0.0), _req(1, 2, 5, 0.1), _req(2, 6, 8, 5.0), _req(3, 9, 10, 9.0)]
    st = stretch_for(_hand(reqs, 10), 7, 7)
    assert (st.first_step, st.last_step, st.steps, st.requests, st.total_steps) == (6, 8, 3, 1, 11)
    assert st.horizon_s == pytest.approx(4.0)  # r2 arrived at 5.0, r3 at 9.0
    assert stretch_for(_hand(reqs, 10), 2, 4) is None  # steps 0-5: more than half of 11
    assert stretch_for(_hand(reqs, 10), 2, 4, max_share=1.0).to_dict() == {
        "first_step": 0, "last_step": 5, "steps": 6, "of_steps": 11, "requests": 2, "horizon_s": 5.0}


def test_a_stretch_that_could_hit_blocks_cached_before_it_starts_earlier():
    """Prefix caching on: r2 shares block "b" with r0, so the stretch of step 7 starts at
    step 0, not 6 (the cache held r0's block across the idle moment); without prefix
    caching, or without the shared block, it starts at 6."""
    reqs = [_req(0, 0, 3, 0.0, ["a", "b"]), _req(1, 2, 5, 0.1, ["c"]), _req(2, 6, 8, 5.0, ["b", "d"]),
            _req(3, 9, 10, 9.0, ["e"])]
    assert stretch_for(_hand(reqs, 10, prefix=True), 7, 7, max_share=1.0).first_step == 0
    assert stretch_for(_hand(reqs, 10, prefix=False), 7, 7).first_step == 6
    reqs[2].block_digests = ["d"]
    assert stretch_for(_hand(reqs, 10, prefix=True), 7, 7).first_step == 6


def test_widening_reaches_past_the_arrivals_a_longer_replay_would_meet():
    """The stretch 6-8 (r2, arrived at 5.0); r3 arrives at 9.0, r4 at 30.0. A replay of 6 s
    meets r3: widen to 6-10; one of 30 s would meet r4 as well: the whole run's tail, 6-12.
    The stretch 0-5 replayed for 6 s meets r2 (at 5.0): widen to 0-8; for 30 s it would
    take every request, the whole run (None)."""
    reqs = [_req(0, 0, 3, 0.0), _req(1, 2, 5, 0.1), _req(2, 6, 8, 5.0), _req(3, 9, 10, 9.0), _req(4, 11, 12, 30.0)]
    w = _hand(reqs, 12)
    st = stretch_for(w, 7, 7)
    assert (widen(w, st, 6.0).first_step, widen(w, st, 6.0).last_step) == (6, 10)
    assert (widen(w, st, 30.0).first_step, widen(w, st, 30.0).last_step) == (6, 12)
    first = stretch_for(w, 1, 1, max_share=1.0)
    assert (widen(w, first, 6.0).first_step, widen(w, first, 6.0).last_step) == (0, 8)
    assert widen(w, first, 30.0) is None


# -- on vLLM's real scheduler ----------------------------------------------------------------------


def _three_bursts(tmp_path):
    """A hand-made run on a virtual clock (tests/sim/_hand.py): 2 long requests at t=1000,
    a storm of 16 requests of 64 + 100 tokens in 40 blocks at t=1010, 2 more at t=1012 (the
    storm took 1.28 s: the engine is idle in between)."""
    from tests.sim._hand import nonlinear_cost, record, workload

    def req(i, name, t, prompt, out):
        return WorkloadRequest(order=i, req_id=name, prompt_len=prompt, max_tokens=out, output_tokens=out,
                               arrival_ts=t, added_ts=t, finish_reason="length")

    reqs = [req(i, f"A{i}", 1000.0 + 0.001 * i, 16, 250) for i in range(2)]
    reqs += [req(2 + i, f"S{i}", 1010.0 + 0.0001 * i, 64, 100) for i in range(16)]
    reqs += [req(18 + i, f"B{i}", 1012.0 + 0.001 * i, 16, 250) for i in range(2)]
    return record(tmp_path / "bursts", workload(reqs), nonlinear_cost, num_blocks=40, max_model_len=512)


@pytest.fixture(scope="module")
def bursts(tmp_path_factory):
    if not HAVE_VLLM:
        pytest.skip("vLLM is not installed")
    return _three_bursts(tmp_path_factory.mktemp("cut"))


@requires_vllm
def test_the_cut_replays_its_stretch_step_for_step(bursts, tmp_path):
    """The storm's preemptions (steps 254-517) lie in the idle-bounded stretch 252-621 (621:
    the engine core's empty step after the last finish); cut out, it holds the 16 storm
    requests, its steps count from 0, its 17 preemptions are the recording's shifted by
    252, and its baseline replay schedules exactly the recorded tokens of each of those 370
    steps, no more and no fewer (the whole run's replay is not needed)."""
    from vllm_probe.advice.evaluate import Evaluator
    from vllm_probe.analysis.workload import load_workload
    from vllm_probe.sim.cut import write_cut

    w = load_workload(bursts)
    assert idle_boundaries(w) == [0, 251, 252, 621, 622, 873, 874]
    ps = [p.step for p in w.preempts]
    st = stretch_for(w, min(ps), max(ps))
    assert (st.first_step, st.last_step, st.requests, st.total_steps) == (252, 621, 16, 874)
    assert st.horizon_s == pytest.approx(2.0)
    cut = load_workload(write_cut(bursts, st, tmp_path / "cut"))
    assert [r.req_id for r in cut.requests] == [f"S{i}" for i in range(16)]
    assert (cut.steps[0].step, cut.last_step) == (0, 369)
    assert [(p.step, p.discarded_tokens) for p in cut.preempts] == [(p.step - 252, p.discarded_tokens)
                                                                    for p in w.preempts]
    recorded = [s.scheduled_tokens for s in w.steps if 252 <= s.step <= 621]
    with Evaluator(bursts, lazy=True, out=tmp_path / "ev") as ev:
        base = ev.cut(st).baseline
        replayed = [s.scheduled_tokens for s in load_workload(base.run_dir).steps]
    assert replayed == recorded and len(recorded) == 370
    assert base.figures["preemptions"] == 17.0
    assert ev.cut(st).error["figures"]["steps"]["error"] == 0.0


@requires_vllm
def test_doctor_searches_the_storm_on_its_stretch_and_widens_what_runs_past_it(bursts):
    """The storm's remedy search on its stretch tries the same changes, predicts the same
    preemptions and picks the same remedy as on the whole run; max_num_seqs 2 runs the
    storm past the next arrival (2 s later), so it is replayed again on the stretch that
    includes it (steps 252-873) before it is judged. (The rule's arithmetic, max_num_seqs 3,
    is left out of the candidates here: it reaches the goal within the stretch, and the
    search would stop there before trying 2.)"""
    from vllm_probe.advice import remedies
    from vllm_probe.advice.evaluate import Evaluator
    from vllm_probe.analysis.doctor import examine

    def storm(whole_run):
        report = examine(bursts)
        for f in report.findings:
            f.remedy = None
        with Evaluator(bursts, lazy=True) as ev:
            remedies.search(report.findings, ev, whole_run=whole_run)
        return next(f for f in report.findings if f.id == "preemption-storm")

    whole, cut = storm(True), storm(False)
    assert whole.predicted.stretch is msgspec.UNSET
    assert cut.predicted.stretch == {"first_step": 252, "last_step": 621, "steps": 370, "of_steps": 874,
                                     "requests": 16, "horizon_s": pytest.approx(2.0)}
    assert [(t.settings, t.predicted, t.met) for t in cut.predicted.tried] == [
        (t.settings, t.predicted, t.met) for t in whole.predicted.tried]
    assert cut.remedy.whatif == whole.remedy.whatif
    seqs2 = next(t for t in cut.predicted.tried if t.settings == {"max_num_seqs": 2})
    assert (seqs2.predicted, seqs2.met) == (0.0, True)
    assert (seqs2.replayed_on["first_step"], seqs2.replayed_on["last_step"]) == (252, 873)
    assert "on steps 252-621 of 874" in cut.remedy.arithmetic


@requires_vllm
def test_a_budget_too_small_for_the_baseline_leaves_the_arithmetic_unchecked(bursts):
    """A search budget no replay fits: each replay is stopped at its time limit, every
    finding with a goal keeps its rule's arithmetic marked unchecked, and says why."""
    from vllm_probe.advice import remedies
    from vllm_probe.advice.evaluate import Evaluator
    from vllm_probe.analysis.doctor import examine

    report = examine(bursts)
    with Evaluator(bursts, lazy=True) as ev:
        searches = remedies.search(report.findings, ev, budget_s=1e-6)
    assert searches and all(s.complete is False for s in searches)
    for s in searches:
        p = s.finding.predicted
        assert p.complete is False and p.error.startswith("replaying ")
        assert "did not fit the search's budget of 1e-06 s" in p.error
        assert s.finding.remedy is None or s.finding.remedy.checked is False



def test_the_requests_that_waited_in_steps():
    """r0 starts at once; r1 waits steps 0-2, r2 5-8, r3 step 10 (added before step 10, first
    chunk at 11): in steps 2-6 r1 and r2 waited; in 9-20 only r3; without chunk events the
    first scheduled step is unknown: none."""
    from vllm_probe.analysis.workload import ChunkRow

    reqs = [_req(0, 0, 4, 0.0), _req(1, 0, 6, 0.0), _req(2, 5, 10, 1.0), _req(3, 10, 12, 2.0)]
    chunks = [ChunkRow(0, 0, 0, 0, 16, True, False), ChunkRow(3, 1, 0, 0, 8, False, False),
              ChunkRow(4, 1, 1, 8, 16, True, False), ChunkRow(9, 2, 0, 0, 16, True, False),
              ChunkRow(11, 3, 0, 0, 16, True, False)]
    w = Workload("hand-made", {}, reqs, chunks=chunks, last_step=12)
    assert w.waited_in(2, 6) == ("r1", "r2")
    assert w.waited_in(9, 20) == ("r3",)
    w.chunk_events = False
    assert w.waited_in(2, 6) == ()


@requires_vllm
def test_a_limits_goal_is_over_the_requests_that_waited_and_searched_on_their_stretch(bursts):
    """kv-bound's goal is queue p90 over the requests that waited in its steps (the storm's,
    not the light bursts'), so it is searched on the storm's stretch; its remedy's
    prediction is over those requests."""
    from vllm_probe.advice import remedies
    from vllm_probe.advice.evaluate import Evaluator
    from vllm_probe.analysis.doctor import examine
    from vllm_probe.analysis.objectives import measure

    report = examine(bursts)
    kv = next(f for f in report.findings if f.id == "kv-bound")
    with Evaluator(bursts, lazy=True) as ev:
        remedies.search([kv], ev)
        first, last = kv.evidence.step_range
        waited = ev.workload.waited_in(first, last)
    assert waited and all(r.startswith("S") for r in waited)  # the storm's requests only
    p = kv.predicted
    assert p.goal.requests == list(waited)
    assert (p.stretch["first_step"], p.stretch["last_step"]) == (252, 621)
    assert p.recorded == measure(bursts, ["queue_p90"], requests=waited)["queue_p90"]


def test_no_stretch_when_the_recording_lost_its_start():
    """Retention removed the first segments (the first step recorded is 4): requests added
    before are unknown, so no moment can be called idle."""
    reqs = [_req(0, 0, 3, 0.0), _req(1, 2, 5, 0.1), _req(2, 6, 8, 5.0), _req(3, 9, 10, 9.0)]
    w = _hand(reqs, 10)
    assert stretch_for(w, 7, 7) is not None
    w.steps = w.steps[4:]
    assert stretch_for(w, 7, 7) is None
