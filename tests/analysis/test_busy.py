"""Busy time (issue 20 item 7): on a server, ``duration`` counts the idle time between
bursts; busy time is defined once (``RunState.busy_s``) and shown beside it by the
summary and the dashboard."""

from __future__ import annotations

import pytest
from rich.console import Console

from tests._events import Stream
from vllm_probe.analysis.state import RunState
from vllm_probe.analysis.summary import summarize
from vllm_probe.runs.reader import ReadStats, iter_run
from vllm_probe.tui.dashboard import View
from vllm_probe.tui.layout import render_dashboard
from vllm_probe.tui.summary_view import render


def two_bursts(t: float = 1000.0) -> Stream:
    """Burst 1: request A from t to t+5 (100 output tokens, steps every 0.05 s); idle for
    31.8 s; burst 2: B and C from t+36.8 to t+53.8 (17 s; 200 output tokens each, C
    finishes first). Steps start at t (the first step's ts minus its 1 ms schedule())."""
    s = Stream()
    s.config(t - 1.0, budget=256, max_num_seqs=4)
    s.added(t, "A", 50, 100, arrival=t)
    step = 0
    for i in range(100):
        s.step(t + 0.001 + i * 0.05, step, 256, decode=1, running=1, waiting=0, decode_reqs=1)
        step += 1
    s.finished(t + 5.0, step - 1, "A", 50, 100)
    t2 = t + 36.8
    s.added(t2, "B", 50, 200, arrival=t2)
    s.added(t2, "C", 50, 200, arrival=t2)
    for i in range(170):
        s.step(t2 + 0.001 + i * 0.1, step, 256, decode=2, running=2, waiting=0, decode_reqs=2)
        step += 1
    s.finished(t2 + 16.0, step - 1, "C", 50, 200)
    s.step(t2 + 17.0, step, 256, decode=1, running=1, waiting=0, decode_reqs=1)
    s.finished(t2 + 17.0, step, "B", 50, 200)
    return s


def test_two_bursts_read_as_53_8_s_duration_and_22_s_busy(tmp_path):
    run = tmp_path / "run"
    two_bursts().write(run)
    s = summarize(run)
    assert s.duration_s == pytest.approx(53.8)
    assert s.busy_s == pytest.approx(22.0)  # 5 s + 17 s: the 31.8 s between the bursts left out
    assert s.output_tokens == 500
    assert s.output_tokens_per_s == pytest.approx(500 / 53.8)  # 9.29: diluted by the idle gap
    assert s.output_tokens_per_busy_s == pytest.approx(500 / 22.0)  # 22.7
    text = _text(lambda c: c.print(render(s, width=160)))
    assert "duration · busy 53.80 s · 22.00 s" in text
    assert "output tokens/s · per busy s 9.29 · 22.7" in text


def test_busy_time_grows_while_a_burst_is_open_and_stops_when_idle():
    state = RunState()
    recs = list(iter_run_of(two_bursts()))
    added_b = next(i for i, r in enumerate(recs) if getattr(r, "req_id", None) == "B")
    state.apply_all(recs[:added_b])  # burst 1 done, nothing in flight
    assert state.busy_s() == pytest.approx(5.0)
    state.apply_all(recs[added_b:added_b + 12])  # B and C added, 10 steps: open period up to the last event
    assert state.busy_s() == pytest.approx(5.0 + 0.001 + 9 * 0.1)
    assert RunState().busy_s() is None


def test_the_dashboard_shows_busy_beside_the_stepping_time(tmp_path):
    run = tmp_path / "run"
    two_bursts().write(run)
    state = RunState().apply_all(iter_run(run, ReadStats()))
    view = View(status="finished", status_style="bold", run_dir=str(run), finished=True)
    text = _text(lambda c: c.print(render_dashboard(state, {}, None, width=160, height=None, now=1054.0,
                                                    view=view)))
    assert "271 steps in 53.80 s, busy 22.00 s" in text


def iter_run_of(stream: Stream):
    import json

    from vllm_probe.schema import records

    return (records.from_dict(json.loads(line)) for line in stream.lines())


def _text(draw) -> str:
    console = Console(width=160, record=True, color_system=None)
    draw(console)
    return " ".join(console.export_text().split())
