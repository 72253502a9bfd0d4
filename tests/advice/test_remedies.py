"""doctor's remedy search (:mod:`vllm_probe.advice.remedies`): the smallest change that
reaches the goal, pairs only when no single knob does, a failing replay never offered,
the time budget; one search on a real replay of vLLM's Scheduler."""

from __future__ import annotations

import json
from types import SimpleNamespace

import msgspec

from tests.conftest import requires_vllm
from vllm_probe.advice import bounds, goals, remedies
from vllm_probe.advice.evaluate import Evaluation
from vllm_probe.analysis.doctor.findings import Finding, Remedy


def predicted(f: Finding) -> dict:
    """A finding's search as ``doctor --json`` writes it (its ``predicted``)."""
    return msgspec.to_builtins(f.predicted)


class FakeEvaluator:
    """Stands in for :class:`~vllm_probe.advice.evaluate.Evaluator`: ``figure(overrides)``
    gives the replay's preemptions (or raises ValueError: the replay fails)."""

    def __init__(self, figure, config=None):
        self.figure = figure
        self.workload = SimpleNamespace(config=config or {"max_num_seqs": 16, "num_kv_blocks": 40,
                                                          "max_num_batched_tokens": 256},
                                        requests=[], preempts=[], last_step=-1)
        self.stretch = None
        self.run_dir = "/nonexistent"
        self.requests = ()
        self.keep = False
        self.recorded_figures = {"preemptions": 20.0, "worst_request_preemptions": 3.0}
        self.baseline = self._one({})
        self.error = {"figures": {"steps": {"error": 0.0, "within": True}}, "within": True}
        self.points: list[list[dict]] = []
        self.replays = 0

    def _one(self, p):
        try:
            v = self.figure(p)
        except ValueError as e:
            return Evaluation(dict(p), error=str(e))
        return Evaluation(dict(p), figures={"preemptions": float(v), "itl_p90": 0.01})

    def evaluate(self, points, requests=None, subsets=()):
        self.points.append([dict(p) for p in points])
        self.replays += len(points)
        return [self._one(p) for p in points]

    def intervals(self, ev, requests=()):
        return {}  # a stand-in with no speed spread: every direction by the values


def storm():
    return Finding("preemption-storm", "warning", "", {},
                   Remedy("num_kv_blocks", 177, "the running requests needed 176 blocks", "", "tuning guide",
                          whatif={"num_kv_blocks": 177}))


def settings(p, key, default):
    return p.get(key, default)


def test_the_smallest_change_that_reaches_the_goal_is_the_remedy():
    """max_num_seqs 16 → 12, 8 do not end the storm; 4 does (≤ 10 % of 20 preemptions):
    4 is the remedy, 2 is never replayed; more blocks never help and are listed as tried,
    not offered (the rule's knobs: seqs × 0.75, 0.5, 0.25, 0.125; blocks × 1.25 … 4, then the
    rule's arithmetic, 177 blocks, tried in its place by the size of the change)."""
    ev = FakeEvaluator(lambda p: 0 if settings(p, "max_num_seqs", 16) <= 6 else 20)
    f = storm()
    (_s,) = remedies.search([f], ev)
    assert [list(map(dict.items, batch)) for batch in ev.points] == [
        [{"max_num_seqs": 12}.items(), {"num_kv_blocks": 50}.items()],
        [{"max_num_seqs": 8}.items(), {"num_kv_blocks": 60}.items()],
        [{"max_num_seqs": 4}.items(), {"num_kv_blocks": 80}.items()],
        [{"num_kv_blocks": 120}.items()], [{"num_kv_blocks": 160}.items()], [{"num_kv_blocks": 177}.items()]]
    r = f.remedy
    assert (r.setting, r.value, r.whatif, r.checked, r.alternatives) == ("max_num_seqs", 4, {"max_num_seqs": 4},
                                                                         True, [])
    assert r.began_at == {"setting": "num_kv_blocks", "value": 177, "whatif": {"num_kv_blocks": 177},
                          "arithmetic": "the running requests needed 176 blocks"}
    assert (r.predicted["baseline"], r.predicted["predicted"]) == (20.0, 0.0)
    assert predicted(f)["resolved"] is True and len(predicted(f)["tried"]) == 9
    assert all(t["met"] is False for t in predicted(f)["tried"] if "num_kv_blocks" in t["settings"])
    json.dumps(f.to_dict())  # the --json shape stays serializable


def test_several_knobs_reach_the_goal_ranked_by_the_size_of_the_change():
    """Blocks 40 → 60 (×1.5) and seqs 16 → 4 (×0.25) both work: the smaller relative
    change leads, the other is the alternative with its own prediction."""
    ev = FakeEvaluator(lambda p: 1 if settings(p, "max_num_seqs", 16) <= 6 or settings(p, "num_kv_blocks", 40) >= 60
                       else 20)
    f = storm()
    remedies.search([f], ev)
    assert (f.remedy.setting, f.remedy.value) == ("num_kv_blocks", 60)
    (alt,) = f.remedy.alternatives
    assert (alt["setting"], alt["value"], alt["checked"]) == ("max_num_seqs", 4, True)
    assert alt["predicted"]["predicted"] == 1.0


def test_a_goal_is_reached_against_the_recording_too_when_the_replay_reads_higher():
    """The replay at the recorded settings reads 40 preemptions where 20 were recorded: seqs
    12 (4 preemptions) is 90 % below the replay but not below the recording (≤ 2 needed);
    the remedy is seqs 8 (2), and 12 is listed as tried, not met (stop 22: a head-of-line
    remedy passed against a baseline replay 2× the recording and missed for real)."""
    ev = FakeEvaluator(lambda p: {16: 40, 12: 4}.get(settings(p, "max_num_seqs", 16), 2)
                       if "num_kv_blocks" not in p else 40)
    f = storm()
    remedies.search([f], ev)
    assert (f.remedy.setting, f.remedy.value) == ("max_num_seqs", 8)
    assert (predicted(f)["recorded"], predicted(f)["baseline"]) == (20.0, 40.0)
    met = {t["settings"].get("max_num_seqs"): t["met"]
           for t in predicted(f)["tried"] if "max_num_seqs" in t["settings"]}
    assert met == {12: False, 8: True}


def test_the_reference_is_the_lower_of_baseline_and_recorded():
    assert goals.reference(0.687, 0.323) == 0.323
    assert goals.reference(0.3, 0.4) == 0.3
    assert goals.reference(None, 0.4) == 0.4 and goals.reference(0.3, None) == 0.3
    assert goals.reference(None, None) is None


def test_a_remedy_whose_replay_fails_is_never_offered():
    """The replay of every block count fails (vLLM refuses it) and max_num_seqs never gets
    below 10 % of the preemptions: no remedy; the closest is named and every try listed
    with its error."""
    def figure(p):
        if "num_kv_blocks" in p:
            raise ValueError("vLLM: refused")
        return 5 if settings(p, "max_num_seqs", 16) <= 4 else 20
    ev = FakeEvaluator(figure)
    f = storm()
    remedies.search([f], ev)
    assert f.remedy is None and predicted(f)["resolved"] is False
    # of the tie (4 and 2 both give 5), the smaller change
    assert predicted(f)["closest"] == {"settings": {"max_num_seqs": 4}, "predicted": 5.0, "met": False,
                                     "outside_region": None}
    errors = [t for t in predicted(f)["tried"] if "error" in t]
    assert errors and all(t["met"] is False and t["error"] == "vLLM: refused" for t in errors)


def test_pairs_only_when_no_single_knob_reaches_the_goal():
    ev = FakeEvaluator(lambda p: 0 if settings(p, "max_num_seqs", 16) <= 8 and settings(p, "num_kv_blocks", 40) >= 60
                       else 20)
    f = storm()
    remedies.search([f], ev)
    singles = [b for b in ev.points if all(len(p) == 1 for p in b)]
    pairs = [b for b in ev.points if all(len(p) == 2 for p in b)]
    assert len(singles) + len(pairs) == len(ev.points) and len(singles) == 6  # the arithmetic's 177 blocks too
    assert pairs[0] == [{"max_num_seqs": 12, "num_kv_blocks": 50}]  # the smallest pair first
    assert f.remedy.whatif == {"max_num_seqs": 8, "num_kv_blocks": 60} and f.remedy.checked is True


def test_a_single_knob_that_works_means_no_pair_is_tried():
    ev = FakeEvaluator(lambda p: 0 if settings(p, "max_num_seqs", 16) <= 2 else 20)
    remedies.search([storm()], ev)
    assert all(len(p) == 1 for b in ev.points for p in b)


def test_the_time_budget_stops_the_search_and_says_so():
    """No round fits the budget: the search is incomplete, and the rule's arithmetic (177
    blocks), which no replay tried, stays as the remedy marked unchecked; the view says the
    budget stopped it."""
    from vllm_probe.tui.doctor_view import unmet_goal_text

    ev = FakeEvaluator(lambda p: 20)
    f = storm()
    (s,) = remedies.search([f], ev, budget_s=0)
    assert ev.points == [] and s.complete is False and predicted(f)["complete"] is False
    assert (f.remedy.whatif, f.remedy.checked) == ({"num_kv_blocks": 177}, False)
    assert unmet_goal_text(f.predicted).startswith("the search stopped at its --budget after 0 replayed change(s)")


def test_a_stopped_search_drops_an_arithmetic_its_replay_tried_and_failed(monkeypatch):
    """The arithmetic's value was replayed (20 preemptions still) before the budget ran
    out: no remedy, not the failed arithmetic."""
    ev = FakeEvaluator(lambda p: 20)
    f = storm()
    f.remedy.whatif = {"max_num_seqs": 12}  # the first value the search replays
    clock = iter([0.0, 0.0] + [1e9] * 100)  # the deadline, the first round, then past the deadline
    monkeypatch.setattr(remedies, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    (s,) = remedies.search([f], ev, budget_s=1.0)
    assert s.complete is False and {"max_num_seqs": 12} in [t["settings"] for t in predicted(f)["tried"]]
    assert f.remedy is None


def test_bounds_release_platform_and_budget():
    recorded = {"max_num_batched_tokens": 512}
    assert bounds.allowed("max_num_batched_tokens", 4096, recorded, {}) is None
    assert "more than 8× the recorded 512" in bounds.allowed("max_num_batched_tokens", 4097, recorded, {})
    assert "CPU platform" in bounds.allowed("gpu_memory_utilization", 0.95, recorded, {"platform": "cpu"})
    assert "not a setting" in bounds.allowed("max_num_partial_prefills_x", 2, recorded, {})


def test_a_finding_without_a_goal_keeps_its_arithmetic_unchecked():
    ev = FakeEvaluator(lambda p: 0)
    f = Finding("config-not-applied", "warning", "", {}, Remedy("max_num_seqs", 64, "expected 64", "", ""))
    assert remedies.search([f], ev) == []
    assert f.remedy.checked is False and ev.points == []


@requires_vllm
def test_the_search_on_a_real_replay_picks_the_smallest_sufficient_change(tmp_path):
    """16 requests of 64 + 100 tokens in 39 usable blocks of 16 (vLLM's real Scheduler,
    no model): they preempt each other. Every value the search tried below the chosen one
    of the same knob missed the goal in its replay, the chosen one met it, and whatif's
    own replay at the chosen settings gives the same goal figure."""
    from tests._simrun import record
    from vllm_probe.advice.evaluate import Evaluator
    from vllm_probe.analysis.doctor import examine
    from vllm_probe.sim.whatif import predict

    run = record(tmp_path / "storm", dict(max_num_batched_tokens=256, max_num_seqs=16, num_blocks=40, block_size=16,
                                          max_model_len=256), [(f"R{i}", 64, 100) for i in range(16)], max_steps=5000)
    report = examine(run)
    found = {f.id: f for f in report.findings}
    assert {"preemption-thrash", "preemption-storm"} <= set(found)
    with Evaluator(run) as ev:
        searches = remedies.search(report.findings, ev)
    for s in searches:
        f = s.finding
        if f.remedy is None:
            assert predicted(f)["resolved"] is False
            continue
        assert f.remedy.checked is True
        key, value = next(iter(f.remedy.whatif.items()))
        same_knob = [t for t in s.tried if list(t.overrides) == [key]]
        before = same_knob[:[t.overrides[key] for t in same_knob].index(value)]
        assert all(t.met is False for t in before)
        assert next(t for t in same_knob if t.overrides[key] == value).met is True
        result = predict(run, [f.remedy.whatif], out=tmp_path / "check")
        from vllm_probe.analysis.objectives import from_summary

        if s.goal.requests:  # a goal over some requests (a limit's waiting ones): measured over them
            from vllm_probe.analysis.objectives import measure

            figure = measure(result.configs[0].run_dir, [s.goal.figure], requests=s.goal.requests)[s.goal.figure]
        else:
            figure = from_summary(result.configs[0].summary, s.goal.figure)
        assert figure == f.remedy.predicted["predicted"]


@requires_vllm
def test_the_held_slot_remedy_is_replayed_with_async_scheduling_off(tmp_path):
    """AsyncScheduler, max_num_seqs 4, 120 one-token requests (vLLM #45257 scaled down):
    held-slots' remedy is async_scheduling=False, chosen by its replay (29 held-slot steps
    → 0); more max_num_seqs (6 … 16) leaves 19 … 7 and is listed as tried."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from tests._simrun import record
    from vllm_probe.advice.evaluate import Evaluator
    from vllm_probe.analysis.doctor import examine

    run = record(tmp_path / "async", dict(max_num_batched_tokens=256, max_num_seqs=4, num_blocks=64, max_model_len=256,
                                          async_scheduling=True),
                 [(f"R{i}", 8, 1) for i in range(120)], scheduler_cls=AsyncScheduler, async_drive=True)
    report = examine(run)
    with Evaluator(run) as ev:
        remedies.search(report.findings, ev)
    f = next(f for f in report.findings if f.id == "held-slots")
    assert (f.remedy.whatif, f.remedy.checked) == ({"async_scheduling": False}, True)
    assert (f.remedy.predicted["recorded"], f.remedy.predicted["predicted"]) == (29.0, 0.0)
    assert [(t["settings"], t["predicted"], t["met"]) for t in predicted(f)["tried"]] == [
        ({"async_scheduling": False}, 0.0, True), ({"max_num_seqs": 6}, 19.0, False),
        ({"max_num_seqs": 8}, 14.0, False), ({"max_num_seqs": 12}, 9.0, False), ({"max_num_seqs": 16}, 7.0, False)]


class TimedEvaluator(FakeEvaluator):
    """A FakeEvaluator whose figure is queue p90 (s) and whose replays price ``outside(p)``
    of their steps outside the step-time model's fitted region."""

    def __init__(self, figure, outside):
        self.outside = outside
        super().__init__(figure)
        self.recorded_figures = {"queue_p90": 0.142}

    def _one(self, p):
        return Evaluation(dict(p), figures={"queue_p90": self.figure(p), "itl_p90": 0.01},
                          outside_region=self.outside(p), extrapolated_share=self.outside(p))


def _seqs_up_rule():
    from vllm_probe.analysis.doctor.rule import Goal, Knob, Rule

    return Rule("seqs-bound", "", lambda ctx: [], goal=lambda f: Goal("queue_p90", reduce_by=0.3),
                knobs=(Knob("max_num_seqs", "up", lambda s, f: [24, 32, 48, 64]),))


# held-slots on a quiet machine (bench_remedies, 2026-12-02): the replay's queue p90 per max_num_seqs
HELD_SLOTS_QUEUE = {16: 0.1354, 24: 0.1204, 32: 0.1111, 48: 0.0980, 64: 0.0875}


def test_a_time_goal_reached_only_outside_the_fitted_region_is_not_a_remedy(monkeypatch):
    """max_num_seqs 64 is the only value the replay says takes 30 % off queue p90 (0.0875 ≤
    0.7 × 0.1354 = 0.0948), but a third of its predicted seconds come from beyond the
    model's fitted region (the baseline: none): counted double, 0.0875 × 4/3 = 0.117 does
    not reach it; the finding gets no remedy and names 64 as extrapolated. Run for real, 64
    made queue p90 worse (0.142 → 0.160 s)."""
    monkeypatch.setattr(remedies, "rule_for", lambda fid: _seqs_up_rule())
    ev = TimedEvaluator(lambda p: HELD_SLOTS_QUEUE[p.get("max_num_seqs", 16)],
                        lambda p: {48: 0.36, 64: 1 / 3}.get(p.get("max_num_seqs", 16), 0.0))
    f = Finding("seqs-bound", "warning", "", {})
    remedies.search([f], ev)
    assert f.remedy is None and predicted(f)["resolved"] is False
    assert [(t["settings"]["max_num_seqs"], t["met"], t.get("extrapolated", False)) for t in predicted(f)["tried"]] == [
        (24, False, False), (32, False, False), (48, False, False), (64, False, True)]
    assert [t["settings"] for t in predicted(f)["extrapolated"]] == [{"max_num_seqs": 64}]
    from vllm_probe.tui.doctor_view import unmet_goal_text

    assert unmet_goal_text(f.predicted).startswith("not checked: the replay reaches queue_p90's goal only at "
                                                   "max_num_seqs=64, with up to 33 % of its predicted time from beyond")


def test_inside_the_fitted_region_the_same_replay_is_the_remedy(monkeypatch):
    """The same figures with 64's replay only 5 points beyond the baseline's extrapolated
    share: 0.0875 × 1.05 = 0.0919 ≤ 0.0948, 64 is the remedy."""
    monkeypatch.setattr(remedies, "rule_for", lambda fid: _seqs_up_rule())
    ev = TimedEvaluator(lambda p: HELD_SLOTS_QUEUE[p.get("max_num_seqs", 16)],
                        lambda p: 0.30 if p.get("max_num_seqs", 16) == 64 else 0.25)
    f = Finding("seqs-bound", "warning", "", {})
    remedies.search([f], ev)
    assert (f.remedy.setting, f.remedy.value, f.remedy.checked) == ("max_num_seqs", 64, True)
    assert "extrapolated" not in predicted(f)


def test_counts_are_judged_whatever_the_region():
    """Preemptions and held-slot steps do not depend on the step time: judged as replayed;
    seconds are raised by the extrapolated share beyond the baseline's."""
    import pytest

    assert goals.judged("preemptions", 5.0, 0.9, 0.0) == 5.0
    assert goals.judged("held_slot_steps", 5.0, 0.9, 0.0) == 5.0
    assert goals.judged("ttft_p90", 2.0, 0.25, 0.0) == pytest.approx(2.5)
    assert goals.judged("ttft_p90", 2.0, 0.30, 0.25) == pytest.approx(2.1)
    assert goals.judged("ttft_p90", 2.0, 0.10, 0.25) == 2.0
    assert goals.judged("ttft_p90", 2.0, None, 0.0) == 2.0
