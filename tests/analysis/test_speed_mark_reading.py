"""The machine-speed mark read back: per engine core in the state, the run's in the
summary, and in ``compare`` how much of a wall-clock difference is the machine's; a run
without the field (an older probe) reads as unknown everywhere."""

from __future__ import annotations

import copy
import io
import math
import re

import pytest
from rich.console import Console

from tests._events import scenario_chunked
from vllm_probe.analysis.summary import analyze_events, summarize_events
from vllm_probe.analysis.summary_types import SpeedMark


def _marked(engine: int, pid: int, start: float | None, ends: list[float | None]):
    """scenario_chunked of one engine core with ``start`` on its engine_config and one
    probe_stats line per value of ``ends`` (None: a line without the mark)."""
    s = scenario_chunked(engine=engine, pid=pid)
    if start is not None:
        s.events[0]["speed_mark_us"] = start
    s.events.pop()  # its probe_stats: replaced below
    for i, end in enumerate(ends):
        ev = s.add("probe_stats", 101.0 + i, events_written=len(s.events), events_dropped=0, hook_errors={},
                   hooks_disabled=[])
        if end is not None:
            ev["speed_mark_us"] = end
    return s


def _render(renderable, width: int = 200) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(renderable)
    return out.getvalue()


def test_each_engine_core_keeps_its_marks_and_the_summary_takes_their_medians():
    """Engine 0: 1,000 µs at the start; its stop signal wrote a probe_stats line before the
    end's mark (none), then 1,210 µs, then the exit repeated it. Engine 1: 1,200 µs at the
    start, killed before its end's mark."""
    a = _marked(0, 10, 1000.0, [None, 1210.0, 1210.0])
    b = _marked(1, 11, 1200.0, [None])
    state, summary = analyze_events(a.records + b.records)
    assert (state.engines[0].speed_mark_start_us, state.engines[0].speed_mark_end_us) == (1000.0, 1210.0)
    assert (state.engines[1].speed_mark_start_us, state.engines[1].speed_mark_end_us) == (1200.0, None)
    assert summary.speed_mark == SpeedMark(start_us=1100.0, end_us=1210.0, mark_us=math.sqrt(1100.0 * 1210.0),
                                           change=1210.0 / 1100.0 - 1.0, engines=2)
    assert summary.to_dict()["speed_mark"]["start_us"] == 1100.0


def test_a_run_from_an_older_probe_reads_as_unknown():
    from vllm_probe.tui.summary_view import render

    s = summarize_events(scenario_chunked().records)
    assert s.speed_mark == SpeedMark(start_us=None, end_us=None, mark_us=None, change=None, engines=0)
    assert re.search(r"machine mark +not recorded", _render(render(s, 200)))
    one_end = summarize_events(_marked(0, 10, None, [950.0]).records)
    assert one_end.speed_mark == SpeedMark(start_us=None, end_us=950.0, mark_us=950.0, change=None, engines=1)
    assert re.search(r"machine mark +- → 950 µs\s", _render(render(one_end, 200)))


def test_the_summary_shows_the_start_and_end_marks():
    from vllm_probe.tui.summary_view import render

    s = summarize_events(_marked(0, 10, 1000.0, [1210.0]).records)
    assert re.search(r"machine mark +1\.00 → 1\.21 ms\s", _render(render(s, 200)))


def _pair(ratio_marks: tuple[float | None, float | None]):
    """Two summaries of the same run, the second with TTFT median × 1.43, output tokens/s
    ÷ 1.3 and ``ratio_marks`` as the two runs' marks."""
    base = summarize_events(scenario_chunked().records)
    other = copy.deepcopy(base)
    other.run_dir = "other"
    other.latency.ttft_s.median = base.latency.ttft_s.median * 1.43
    other.output_tokens_per_s = base.output_tokens_per_s / 1.3
    base.speed_mark = SpeedMark.of([ratio_marks[0]], [ratio_marks[0]])
    other.speed_mark = SpeedMark.of([ratio_marks[1]], [ratio_marks[1]])
    return base, other


def test_compare_says_how_much_of_a_wall_clock_difference_is_the_machine():
    """The second host ran the fixed computation 1.3× slower: a seconds figure +43 % is
    +30 % machine and +10 % beyond it; throughput ÷ 1.3 is all machine; step figures carry
    no machine share."""
    from vllm_probe.analysis.compare import comparison
    from vllm_probe.tui.compare_view import render

    data = comparison(list(_pair((1000.0, 1300.0))))
    assert data["machine"] == {"speed_mark_us": [1000.0, 1300.0], "ratio": [1.3], "decode_ratio": [None]}
    rows = {r["figure"]: r for r in data["figures"]}
    ttft = rows["TTFT median"]["deltas"][0]
    assert ttft["rel"] == pytest.approx(0.43, abs=1e-12)
    assert ttft["machine"] == pytest.approx(0.3, abs=1e-12)
    assert ttft["beyond_machine"] == pytest.approx(1.43 / 1.3 - 1.0, abs=1e-12)  # +10 %
    tps = rows["output tokens/s"]["deltas"][0]
    assert tps["machine"] == pytest.approx(1 / 1.3 - 1.0, abs=1e-12)
    assert tps["beyond_machine"] == pytest.approx(0.0, abs=1e-12)
    assert rows["steps"]["deltas"][0]["machine"] is None
    text = _render(render(list(_pair((1000.0, 1300.0)))), 220)
    assert "[1] 1.00 ms, [2] 1.30 ms; [2] ×1.30 of [1]'s (+30% seconds for the same work)" in text
    assert text.count("machine ×1.30") == 2  # beside the two groups of seconds


def test_compare_without_marks_says_the_machine_is_unknown():
    from vllm_probe.analysis.compare import comparison
    from vllm_probe.tui.compare_view import render

    for marks in ((None, None), (1000.0, None)):
        data = comparison(list(_pair(marks)))
        assert data["machine"]["ratio"] == [None]
        rows = {r["figure"]: r for r in data["figures"]}
        assert rows["TTFT median"]["deltas"][0]["machine"] is None
        assert rows["TTFT median"]["deltas"][0]["beyond_machine"] is None
    text = _render(render(list(_pair((None, None)))), 220)
    assert "Machine-speed mark: not recorded in these runs" in text and "machine ×" not in text
    for marks, which in (((1000.0, None), "[2]"), ((None, 1000.0), "[1]")):
        text = " ".join(_render(render(list(_pair(marks))), 220).split())
        assert f"[2] against [1] unknown ({which} has none)." in text and "is the host's" not in text
