"""One meaning per name (issue 20 item 2): one preemption total read by the dashboard,
the ``--plain`` lines and the summary whichever event kinds are on; one token budget per
view; what the preempt events alone say, for runs with step events off."""

from __future__ import annotations

from rich.console import Console

from tests._events import scenario_preempt
from vllm_probe.analysis.state import RunState
from vllm_probe.schema import records
from vllm_probe.tui.dashboard import View
from vllm_probe.tui.layout import render_dashboard
from vllm_probe.tui.plain import PlainFormatter


def recs(kinds: set[str] | None = None) -> list:
    """scenario_preempt's records (B preempted at steps 3 and 5), only ``kinds``."""
    return [records.from_dict(ev) for ev in scenario_preempt().events if kinds is None or ev["event"] in kinds]


ALL = {"engine_config", "request_added", "chunk", "step", "preempt", "request_finished", "probe_stats"}


def _state_and_plain(kinds: set[str]) -> tuple[RunState, list[str]]:
    state = RunState()
    plain = PlainFormatter(state)
    lines = []
    for r in recs(kinds):
        state.apply(r)
        line = plain.format(r)
        if line is not None:
            lines.append(line)
    return state, lines


def _dashboard(state: RunState) -> str:
    console = Console(width=200, record=True, color_system=None)
    view = View(status="finished", run_dir="r", finished=False)
    console.print(render_dashboard(state, {}, None, width=200, height=None, now=state.last_ts, view=view))
    return " ".join(console.export_text().split())


def test_one_preemption_total_whichever_event_kinds_are_on():
    for kinds, events, in_steps in ((ALL, 2, 2), (ALL - {"preempt"}, 0, 2), (ALL - {"step"}, 2, 0)):
        state, lines = _state_and_plain(kinds)
        eng = state.engines[0]
        assert (eng.preemptions, eng.step_preemptions) == (events, in_steps)
        assert eng.preemptions_total == 2, kinds
        assert state.total("preemptions_total") == 2
        assert "total 2 " in _dashboard(state)  # the preemptions panel
        if "step" in kinds:  # the --plain step line's running total: the same figure
            assert lines[-1].endswith("preempted 0 (total 2)")


def test_the_preempt_events_alone_say_where_and_under_which_load():
    state, _ = _state_and_plain({"engine_config", "preempt"})
    eng = state.engines[0]
    assert eng.steps == 0 and eng.preemptions_total == 2 and eng.requests_preempted == 1
    seen = eng.preempt_seen
    assert (seen.first_step, seen.last_step) == (3, 5)
    assert (seen.running_max, seen.waiting_max, seen.kv_usage_max) == (1, 2, 0.99)
    assert eng.discarded_tokens == 80 + 81


def test_one_budget_per_view():
    state = RunState()
    r = recs()
    state.apply(r[0])  # engine_config: budget 100, no step yet
    eng = state.engines[0]
    assert eng.step_budget == 100
    for ev in r[1:]:
        state.apply(ev)
    assert eng.step_budget == eng.latest.token_budget == 100
    assert "0 prefill + 0 decode = 0 / 100 tok (0%)" in _dashboard(state)  # the current step's panel
    before = RunState()
    before.apply(r[0])
    assert "0 / 100 tok" in _dashboard(before)  # before the first step: the engine's budget, not 0
