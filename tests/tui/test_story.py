"""A finished run tells its story: the whole-run overview and the notable moments on the
dashboard, from the analysis the doctor shares; ``tail --replay --from-step N``."""

from __future__ import annotations

import io
import re

from rich.console import Console

from tests._events import records
from tests.analysis.test_doctor_rules import Run
from vllm_probe.analysis.doctor import diagnose
from vllm_probe.analysis.episodes import Episodes
from vllm_probe.analysis.moments import notable_moments
from vllm_probe.analysis.state import RunState
from vllm_probe.tui import watch
from vllm_probe.tui.dashboard import View
from vllm_probe.tui.layout import render_dashboard


def long_run(late: int = 6, every: int = 80) -> Run:
    """1,000 steps, budget 1,024. Steps 0-3: L's 4,096-token prompt takes the whole budget
    while A waits (an early prefill block); step 8: A is preempted (early); from step 500,
    ``late`` more preemptions (B1, B2 …) every ``every`` steps."""
    r = Run()
    r.add("L", 4096, 8)
    r.add("A", 1000, 8)
    for k in range(4):
        r.chunk("L", k, 1024 * k, 1024 * (k + 1), 4096, last=k == 3)
        r.step(prefill=1024, waiting=1, blocked="token_budget")
    r.chunk("A", 0, 0, 1000, 1000, last=True)
    r.step(prefill=1000, decode=1, running=2)
    r.step(decode=2, running=2, times=3)
    r.preempt("A", 1001, 1000, 1, output=1)
    r.step(decode=1, running=1, waiting=1, preempted=["A"], blocked="preemption")
    r.step(decode=1, running=1, times=491)
    for i in range(late):
        r.preempt(f"B{i + 1}", 10, 100, 1)
        r.step(decode=1, running=1, preempted=[f"B{i + 1}"])
        r.step(decode=1, running=1, times=every - 1)
    r.step(decode=1, running=1, times=1000 - r.n)
    return r


def _render(state, ep, finished: bool, width: int = 200, height: int = 60) -> str:
    view = View(status="finished" if finished else "● live", run_dir="RUN", findings=diagnose(state, ep),
                moments=notable_moments(state, ep) if finished else (), finished=finished)
    console = Console(width=width, height=height, record=True, color_system=None, force_terminal=True)
    console.print(render_dashboard(state, {}, None, width=width, height=height, view=view))
    return console.export_text()


def test_a_finished_run_shows_an_early_preemption_and_an_early_prefill_block():
    ep = Episodes()
    state = RunState(listener=ep).apply_all(records(long_run(late=55, every=8).s.events))
    moments = {(m.kind, m.first_step, m.last_step): m.text for m in notable_moments(state, ep)}
    assert moments[("prefill_block", 0, 3)] == "4 full-budget prefill steps while up to 1 waited: L 4,096 tok"
    assert moments[("preemptions", 8, 8)] == "1 preemption: A"
    finished, live = _render(state, ep, True), _render(state, ep, False)
    for text in ("step 0–3  4 full-budget prefill steps while up to 1 waited: L 4,096 tok", "step 8  1 preemption: A",
                 "the whole run: 1,000 steps", "notable moments", "--replay --from-step 0"):
        assert text in finished, text
        assert text not in live, text
    # today's view of the same state: the rolling chart holds the last steps and the
    # preemption table the latest ones, not A's at step 8
    assert "the whole run" not in live and not re.search(r"\b8\s+A\b", live)
    assert re.search(r"\b932\s+B55\b", live)  # 500 + 54 × 8
    assert "findings" in finished and "findings so far" in live


def test_the_overview_marks_every_preemption_column():
    from vllm_probe.tui.story import overview_panel

    ep = Episodes()
    state = RunState(listener=ep).apply_all(records(long_run().s.events))
    console = Console(width=110, record=True, color_system=None)
    panel, _ = overview_panel([state.engines[0]], 110, 16)
    console.print(panel)
    text = console.export_text()
    marks = next(line for line in text.splitlines() if "▼ 7 " in line)
    assert marks.count("▼") == 1 + 7  # the label, then 1,000 steps in 96 columns: each preemption in its own column
    assert "the whole run: 1,000 steps (~10.4 per column)" in text  # 110 - borders, padding, labels = 96 columns


def test_replay_from_a_step(tmp_path):
    """Steps before N are applied at once without lines; the lines start at step N."""
    run = long_run()
    run.s.write(tmp_path / "run")
    out = io.StringIO()
    code = watch.replay(tmp_path / "run", 1e9, plain=True, out=out, from_step=995)
    lines = out.getvalue().splitlines()
    assert code == 0
    assert [int(re.search(r" step (\d+) ", ln).group(1)) for ln in lines] == [995, 996, 997, 998, 999]
    assert "(total 7)" in lines[-1]  # the state took in every earlier event


def test_replay_from_a_step_past_the_end(tmp_path, capsys):
    Run().s.write(tmp_path / "run")
    r = Run()
    r.step(decode=1, times=5)
    r.s.write(tmp_path / "run2")
    out = io.StringIO()
    assert watch.replay(tmp_path / "run2", 1e9, plain=True, out=out, from_step=50) == 0
    assert out.getvalue() == ""
    assert "the run has no step 50 (its last step is 4)" in capsys.readouterr().err
