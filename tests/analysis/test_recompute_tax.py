"""The recompute tax (vLLM RFC #54644; issue 19 item 5): tokens recomputed after
preemptions over every token computed, per run and over the rolling window, in the
summary, compare, the storm finding and the metrics. Figures by hand on
tests/_events.scenario_preempt: 9 steps scheduling 100 100 31 51 82 1 82 1 0 tokens
(448), B recomputed twice (81 at step 4, 82 at step 6)."""

from __future__ import annotations

import pytest

from tests._events import records, scenario_preempt
from vllm_probe.analysis.state import RunState
from vllm_probe.analysis.summary import summarize_events

TAX = (81 + 82) / 448


def test_per_run_and_over_the_rolling_window():
    eng = RunState().apply_all(scenario_preempt().records).engines[0]
    assert eng.recompute_tax == pytest.approx(TAX)
    assert eng.recent_recompute_tax() == pytest.approx(TAX)  # the default window holds every step
    last3 = RunState(step_window=3).apply_all(scenario_preempt().records).engines[0]
    assert last3.recent_recompute_tax() == pytest.approx(82 / (82 + 1 + 0))  # steps 6, 7, 8
    last2 = RunState(step_window=2).apply_all(scenario_preempt().records).engines[0]
    assert last2.recent_recompute_tax() == 0.0  # steps 7, 8: no recompute
    assert last2.recompute_tax == pytest.approx(TAX)


def test_summary_json_and_compare():
    from vllm_probe.analysis.compare import comparison

    s = summarize_events(scenario_preempt().records)
    assert s.preemptions.recompute_tax == pytest.approx(TAX)
    assert s.to_dict()["preemptions"]["recompute_tax"] == pytest.approx(TAX)
    rows = [r for r in comparison([s, s])["figures"] if r["figure"] == "recompute tax"]
    assert len(rows) == 1 and rows[0]["values"][0] == pytest.approx(TAX)


def test_without_step_events_it_is_unknown_not_zero():
    events = records([e for e in scenario_preempt().events if e["event"] != "step"])
    assert summarize_events(events).preemptions.recompute_tax is None
    assert RunState().apply_all(events).engines[0].recompute_tax is None


def test_the_gauges():
    from tests.exporters.test_metrics import collect

    m = collect(scenario_preempt().events)
    assert m("vllm_probe_recompute_tax", engine="0") == pytest.approx(TAX)
    assert m("vllm_probe_recompute_tax_recent", engine="0") == pytest.approx(TAX)
    assert m.types["vllm_probe_recompute_tax"] == "gauge"
