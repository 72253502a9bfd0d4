"""The doctor's catalogue as rule objects: every rule one :class:`Rule` with typed, documented
evidence; docs/doctor.md's rule reference equals the generated text; goals name figures of
analysis/objectives; knobs stay within what operators run."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from tests.analysis.test_doctor_rules import Run, _storm
from vllm_probe.analysis.doctor import FINDING_IDS, RULES, diagnose
from vllm_probe.analysis.doctor.evidence import Evidence, field_docs
from vllm_probe.analysis.doctor.findings import Finding
from vllm_probe.analysis.doctor.rule import Rule
from vllm_probe.analysis.doctor.knobs import BUDGET_MAX_FACTOR
from vllm_probe.analysis.doctor.reference import REFERENCE_BEGIN, REFERENCE_END, reference
from vllm_probe.analysis.doctor.rules import CATALOGUE

DOC = Path(__file__).resolve().parents[2] / "docs" / "doctor.md"
#: The figure names goals may use (analysis/objectives.py implements them).
FIGURES = {"preemptions", "worst_request_preemptions", "ttft_p50", "ttft_p90", "ttft_p99", "queue_p90", "itl_p90",
           "e2e_p90", "held_slot_steps", "reread_kv_tokens", "output_tokens_per_s", "duration_s", "steps"}


def test_docs_rule_reference_is_the_generated_text():
    text = DOC.read_text()
    begin, end = text.index(REFERENCE_BEGIN), text.index(REFERENCE_END) + len(REFERENCE_END) + 1
    assert text[begin:end] == reference()


def test_catalogue_is_rule_objects_by_id():
    assert all(isinstance(r, Rule) for r in CATALOGUE)
    assert tuple(RULES) == FINDING_IDS == tuple(r.id for r in CATALOGUE)
    assert len(set(FINDING_IDS)) == len(FINDING_IDS)


@pytest.mark.parametrize("rule", CATALOGUE, ids=lambda r: r.id)
def test_every_rule_has_a_mechanism_thresholds_and_documented_evidence(rule):
    assert len(rule.mechanism) > 80
    assert issubclass(rule.evidence, Evidence)
    docs = field_docs(rule.evidence)
    for f in msgspec.structs.fields(rule.evidence):
        assert docs.get(f.name), f"{rule.evidence.__name__}.{f.name} has no description"
    for t in rule.thresholds:
        assert t.unit and t.source and isinstance(t.value, (int, float))


def _findings(run: Run) -> dict[str, Finding]:
    return {f.id: f for f in run.analyze()[2]}


def test_goals_name_known_figures_and_views_read_typed_evidence():
    found = _findings(_storm(100, (100, 100)))
    f = found["preemption-storm"]
    assert isinstance(f.evidence, RULES["preemption-storm"].evidence)
    goal = RULES["preemption-storm"].goal(f)
    assert (goal.figure, goal.reduce_by) == ("preemptions", 0.9)
    assert goal.met(10, 1) is True and goal.met(10, 2) is False and goal.met(None, 1) is None
    assert RULES["preemption-storm"].view(f)[0] == "busiest steps: 1 (V0), 2 (V1)"  # equal counts: earliest first
    for rid, rule in RULES.items():
        for fnd in found.values():
            if fnd.id == rid:
                g = rule.goal(fnd)
                assert g is None or g.figure in FIGURES


def test_budget_knob_stays_within_eight_times_the_recorded_budget():
    f = _findings(_storm(100, (100, 100)))["preemption-storm"]
    knob = next(k for k in RULES["head-of-line-blocking"].knobs if k.setting == "max_num_batched_tokens")
    values = knob.candidates({"max_num_batched_tokens": 512}, f)
    assert values == [768, 1024, 2048, 4096] and max(values) <= BUDGET_MAX_FACTOR * 512
    lp = next(k for k in RULES["head-of-line-blocking"].knobs if k.setting == "long_prefill_token_threshold")
    assert lp.candidates({"max_num_batched_tokens": 512, "long_prefill_token_threshold": 0}, f) == [256, 128, 64]
    assert knob.candidates({}, f) == []


def test_json_keeps_evidence_keys_in_order_and_engine_first():
    r = _storm(100, (100, 100))
    f = _findings(r)["preemption-storm"]
    ev = f.to_dict()["evidence"]
    assert list(ev)[:3] == ["preemptions", "requests", "per_100_steps"] and "engine" not in ev
    f.evidence.engine = 1
    assert next(iter(f.to_dict()["evidence"])) == "engine" and f.engine == 1


def test_every_finding_of_the_rule_tests_has_its_rules_evidence_type():
    for run in (_storm(100, (100, 100)),):
        state, ep, _ = run.analyze()
        for f in diagnose(state, ep):
            assert isinstance(f.evidence, RULES[f.id].evidence)


def test_every_rules_view_lays_out_its_evidence():
    """Each finding of the mechanism streams: its rule's view gives text lines, and a
    step to look at when the rule has one."""
    from tests.analysis import test_rules_mechanisms as m

    streams = [m._held_stream("quiet", 0.001), m._preempt_only(0.001), m._storm_with_cache(0.001),
               m._waits(40, 0.001), m._hol_queued(0.001, True), m._priority(0.001)]
    seen = set()
    for s in streams:
        for f in m._found(s).values():
            lines = RULES[f.id].view(f)
            assert all(isinstance(x, str) and x for x in lines)
            seen.add(f.id)
    assert {"held-slots", "preemption-storm", "preemption-thrash", "unexplained-wait", "head-of-line-blocking",
            "priority-slot-wait", "not-checked"} <= seen
    f = m._found(m._waits(40, 0.001))["unexplained-wait"]
    assert RULES["unexplained-wait"].view(f) == ["W waited 40 steps, 0–39: head blocked by deferred 100%",
                                                 "over all of them: deferred 100%"]
    assert RULES["unexplained-wait"].step(f) == 0


def test_the_long_prefill_threshold_leaves_room_for_a_short_request_beside_the_long_ones():
    """Eight long prompts under a 512-token budget and a 64-token short one: each long chunk
    may take at most (512 − 64) // 8 = 56 tokens, 48 in steps of 16; the shares of the budget
    (256, 128, 64) would let the long chunks fill it, so only 48 is offered. With one long
    prompt the bound, 448, is the smallest cap that leaves room, tried first, then the shares
    (all ≤ 448). With 40 long prompts nothing leaves room: no candidate."""
    from vllm_probe.analysis.doctor.rules.head_of_line_blocking import (
        HolBlocked, HolEvidence, HolTaker, long_prefill_candidates,
    )

    def finding(longs: int) -> Finding:
        ev = HolEvidence(blocked=[HolBlocked("S", 64, 9, [0, 8], 0.1, 0.2, 0.5, {}, 0)],
                         takers=[HolTaker(f"L{i}", 2048, 512, 0) for i in range(longs)],
                         taken_share=1.0, short_requests_blocked=1, complete=True)
        return Finding("head-of-line-blocking", "warning", "", ev)

    settings = {"max_num_batched_tokens": 512, "long_prefill_token_threshold": 0}
    assert long_prefill_candidates(settings, finding(8)) == [48]
    assert long_prefill_candidates(settings, finding(1)) == [448, 256, 128, 64]
    assert long_prefill_candidates(settings, finding(40)) == []
