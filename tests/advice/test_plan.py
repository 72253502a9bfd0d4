"""The doctor's one plan per run (:mod:`vllm_probe.advice.plan`), on a stand-in evaluator whose
replay figures are known functions of the settings: findings that share a knob get one plan
that clears them all; goals that conflict get the Pareto plans and the sentence naming
them; a budget spent before the search keeps the arithmetic, unchecked; the text and
``--json`` say the same."""

from __future__ import annotations

import io
import time
from types import SimpleNamespace

import msgspec
from rich.console import Console

from vllm_probe.advice import plan as plans
from vllm_probe.advice.evaluate import Evaluation
from vllm_probe.advice.remedies import Search
from vllm_probe.analysis.doctor.findings import Finding, Remedy
from vllm_probe.analysis.doctor.rule import Goal
from vllm_probe.sim.intervals import Spread

CONFIG = {"max_num_seqs": 16, "num_kv_blocks": 40, "max_num_batched_tokens": 256, "platform": "cpu",
          "kv_block_bytes": 1 << 20}


class StandIn:
    """What :func:`plans.build` reads of an Evaluator; ``figures(point) -> dict`` gives each
    replay's figures."""

    def __init__(self, figures):
        self.figures = figures
        self.workload = SimpleNamespace(config=dict(CONFIG), requests=[], preempts=[], last_step=-1)
        self.stretch = self.parent = None
        self.run_dir = "/nonexistent"
        self.recorded_figures = figures({})
        self.recorded = None
        self.deadline = None
        self.keep = False
        self.all_replays = 0
        self.spread = Spread()

    def evaluate(self, points, requests=None, subsets=(), keep=None):
        self.all_replays += len(points)
        return [Evaluation(dict(p), figures=self.figures(p)) for p in points]

    def intervals(self, ev, requests=()):
        return self.spread.intervals(ev.figures, ev.extrapolated_share)


def storm_and_thrash() -> tuple[list[Finding], list[Search]]:
    storm = Finding("preemption-storm", "warning", "")
    thrash = Finding("preemption-thrash", "warning", "")
    cands = {"max_num_seqs": [12, 8, 4], "num_kv_blocks": [50, 60, 80, 120]}
    return [thrash, storm], [Search(thrash, Goal("worst_request_preemptions", at_most=1), [], dict(cands)),
                             Search(storm, Goal("preemptions", reduce_by=0.9), [], dict(cands))]


def test_findings_that_share_a_knob_get_one_plan_that_clears_them_all():
    """max_num_seqs 4 ends both the storm (20 → 0) and the worst request's preemptions (3 →
    0); more blocks end neither: the plan is max_num_seqs = 4, one setting, clearing both."""
    def figures(p):
        seqs = p.get("max_num_seqs", 16)
        return {"preemptions": 0.0 if seqs <= 4 else 20.0, "worst_request_preemptions": 0.0 if seqs <= 8 else 3.0}

    findings, searches = storm_and_thrash()
    ev = StandIn(figures)
    p = plans.build(findings, searches, ev, time.monotonic() + 60)
    assert p.checked and p.settings == {"max_num_seqs": 4}
    assert p.clears == ["preemption-thrash", "preemption-storm"] and p.leaves == [] and p.conflict is None
    assert p.flags == ["--max-num-seqs", "4"] and p.engine_args == {"max_num_seqs": 4}
    goal = p.predicted["preemptions"]
    assert (goal.baseline, goal.predicted, goal.direction, goal.goal, goal.met) == (20.0, 0.0, "better",
                                                                                   "preemption-storm", True)
    assert "max_num_seqs 16 → 4: at most 4 requests run at once" in p.cost
    assert p.alternatives == []


def test_goals_that_conflict_get_the_pareto_plans_and_the_sentence():
    """A storm ends only with max_num_seqs ≤ 4 and fewer than 80 blocks; the worst request's
    preemptions end only with 80 blocks or more and max_num_seqs above 4 (the storm case of a
    real server: more blocks admit more requests). No point meets both: the plan meets one,
    an alternative the other, and the conflict is said."""
    def figures(p):
        seqs, blocks = p.get("max_num_seqs", 16), p.get("num_kv_blocks", 40)
        storm_ends = seqs <= 4 and blocks < 80
        worst_ends = blocks >= 80 and seqs > 4
        return {"preemptions": 0.0 if storm_ends else 20.0, "worst_request_preemptions": 0.0 if worst_ends else 3.0}

    findings, searches = storm_and_thrash()
    p = plans.build(findings, searches, StandIn(figures), time.monotonic() + 60)
    assert p.conflict is not None
    assert "preemption-thrash's goal (worst_request_preemptions)" in p.conflict
    assert "preemption-storm's (preemptions)" in p.conflict and "together" in p.conflict
    met = [set(x.clears) for x in (p, *p.alternatives)]
    assert {"preemption-storm"} in met and {"preemption-thrash"} in met
    assert all(len(x.leaves) == 1 for x in (p, *p.alternatives))
    left = p.leaves[0]
    assert "against the goal" in p.left_because[left]


def test_a_budget_spent_before_the_plan_keeps_the_arithmetic_unchecked():
    """A deadline already past: no round runs, so the plan is the rules' arithmetic (the
    storm's max_num_seqs 3), marked unchecked and incomplete, saying why."""
    findings, searches = storm_and_thrash()
    findings[1].remedy = Remedy("max_num_seqs", 3, "the first preemption left 3 running", "", "",
                                whatif={"max_num_seqs": 3})
    p = plans.build(findings, searches, StandIn(lambda p: {"preemptions": 20.0, "worst_request_preemptions": 3.0}),
                    time.monotonic() - 1)
    assert (p.complete, p.checked, p.settings) == (False, False, {"max_num_seqs": 3})
    assert p.left_because["preemption-storm"] == ("arithmetic, not checked by the replay: the search's time budget "
                                                  "ran out after 1 replay(s)")
    u = plans.unchecked_plan(findings, "--no-replay")
    assert (u.checked, u.settings, u.flags) == (False, {"max_num_seqs": 3}, ["--max-num-seqs", "3"])
    assert u.left_because["preemption-storm"] == "arithmetic, not checked by the replay: --no-replay"


def test_the_text_says_what_the_json_says():
    """The plan's block shows the settings, flags and engine arguments of the ``--json`` plan,
    each cleared finding, the memory advice in the CPU backend's terms, and the rerun."""
    from vllm_probe.tui.doctor_view import plan_block

    def figures(p):
        blocks = p.get("num_kv_blocks", 40)
        return {"preemptions": 0.0 if blocks >= 80 else 20.0, "worst_request_preemptions": 0.0 if blocks >= 60
                else 3.0}

    findings, searches = storm_and_thrash()
    p = plans.build(findings, searches, StandIn(figures), time.monotonic() + 60)
    d = msgspec.to_builtins(p)
    assert d["settings"] == {"num_kv_blocks": 80} and d["clears"] == ["preemption-thrash", "preemption-storm"]
    out = io.StringIO()
    Console(file=out, width=200).print(plan_block(p, "RUN"))
    text = out.getvalue()
    assert "num_kv_blocks = 80" in text and "--num-gpu-blocks-override 80" in text
    assert "LLM(MODEL, num_gpu_blocks_override=80)" in text
    assert "clears     preemption-thrash" in text and "clears     preemption-storm" in text
    assert "VLLM_CPU_KVCACHE_SPACE=1 (GiB: 80 blocks × 1,048,576 bytes)" in text
    assert "gpu_memory_utilization" not in text
    assert any("+40 blocks (40 MiB of KV cache)" in c for c in d["cost"])


def test_a_goal_reached_is_not_a_finding_cleared(monkeypatch):
    """max_num_seqs 4 and 80 KV blocks both reach both goals in the figures, and 4 is the
    smaller change; but the doctor's rules, run on max_num_seqs 4's replay, still raise the
    storm (its queue is shorter, its preemptions are not gone): the plan is 80 blocks, which
    clears both on its replay, and max_num_seqs 4 would have left the storm with that reason."""
    def figures(p):
        ok = p.get("max_num_seqs", 16) <= 4 or p.get("num_kv_blocks", 40) >= 80
        return {"preemptions": 0.0 if ok else 20.0, "worst_request_preemptions": 0.0 if ok else 3.0}

    def still(scope, p):
        return {"preemption-storm": "2 preemptions in 900 steps"} if p.get("max_num_seqs") == 4 else {}

    monkeypatch.setattr(plans, "_still_found", still)
    findings, searches = storm_and_thrash()
    p = plans.build(findings, searches, StandIn(figures), time.monotonic() + 60)
    assert p.settings == {"num_kv_blocks": 80} and p.clears == ["preemption-thrash", "preemption-storm"]


def test_when_nothing_reaches_a_goal_the_plan_applies_nothing_and_names_the_closest():
    """Every replayed point leaves the storm at 20 preemptions and the worst request at 3:
    the plan applies nothing, leaves both, and its one alternative is the closest point."""
    findings, searches = storm_and_thrash()
    p = plans.build(findings, searches, StandIn(lambda p: {"preemptions": 20.0, "worst_request_preemptions": 3.0}),
                    time.monotonic() + 60)
    assert (p.settings, p.clears, p.checked) == ({}, [], True)
    assert sorted(p.leaves) == ["preemption-storm", "preemption-thrash"]
    assert p.left_because["preemption-storm"].startswith("no replayed setting reaches its goal; the closest, ")
    assert len(p.alternatives) == 1 and p.alternatives[0].clears == []


def test_a_goal_met_only_at_the_recorded_split_of_an_offline_burst_is_not_cleared():
    """LLM.generate's burst was recorded 1 request before step 0 and 5 before step 1; a rerun
    may add all 6 before step 0. long_prefill_token_threshold 512 halves the short requests'
    TTFT at the recorded split only (four long prompts starting together fill the budget with
    512-token chunks); 256 halves it either way. The plan is 256, and 512 is no alternative."""
    hol = Finding("head-of-line-blocking", "warning", "")
    searches = [Search(hol, Goal("ttft_p90", reduce_by=0.5), [], {"long_prefill_token_threshold": [512, 256]})]
    seen = []

    class Burst(StandIn):
        def evaluate(self, points, requests=None, subsets=(), keep=None, workload=None):
            seen.append((workload is not None, [dict(p) for p in points]))
            at_once = workload is not None and {r.add_before_step for r in workload.requests} == {0}
            self.all_replays += len(points)

            def ttft(p):
                cap = p.get("long_prefill_token_threshold")
                return 0.45 if cap is None else 0.2 if cap <= 256 or not at_once else 0.44
            return [Evaluation(dict(p), figures={"ttft_p90": ttft(p)}) for p in points]

    ev = Burst(lambda p: {"ttft_p90": 0.45})
    ev.workload.requests = [SimpleNamespace(anchored=True, add_before_step=0 if i == 0 else 1) for i in range(6)]
    p = plans.build([hol], searches, ev, time.monotonic() + 60)
    assert p.settings == {"long_prefill_token_threshold": 256} and p.clears == ["head-of-line-blocking"]
    assert p.alternatives == []
    assert (True, [{"long_prefill_token_threshold": 512}, {"long_prefill_token_threshold": 256}]) in seen

    one_step = Burst(lambda p: {"ttft_p90": 0.45})  # a burst recorded before one step: nothing else to try
    one_step.workload.requests = [SimpleNamespace(anchored=True, add_before_step=0) for _ in range(6)]
    seen.clear()
    p = plans.build([hol], searches, one_step, time.monotonic() + 60)
    assert p.settings == {"long_prefill_token_threshold": 512} and not any(w for w, _ in seen)
