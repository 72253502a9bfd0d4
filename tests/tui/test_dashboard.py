"""The rich view: render to a recording console and read the figures back."""

from __future__ import annotations

import json
import re

import pytest
from rich.console import Console

from tests._events import records
from tests.analysis.test_state import hand_stream, upto
from vllm_probe.schema.records import from_dict
from vllm_probe.tui.charts import bucket_steps, budget_bar, token_chart
from vllm_probe.tui.dashboard import View
from vllm_probe.tui.layout import render_dashboard
from vllm_probe.tui.plain import PlainFormatter
from vllm_probe.runs.reader import Follower, ReadStats, iter_run
from vllm_probe.analysis.state import RunState

META = {"command": ["python", "examples/long_prompts.py"], "start_time": 98.0, "end_time": None}


def render(state, width=160, height=50, stats=None, view=None, now=None, meta=META) -> str:
    console = Console(width=width, height=height or 200, record=True, color_system=None, force_terminal=True)
    console.print(render_dashboard(state, meta, stats, width=width, height=height, now=now,
                                   view=view or View(status="● live")))
    return console.export_text()


def squash(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_header_and_config_figures():
    state = RunState().apply_all(records(hand_stream()))
    # stepping: step 0 starts at 100.1 - 100 µs, step 7 ends at 100.8
    assert state.stepping_s() == pytest.approx(100.8 - (100.1 - 100e-6))
    text = render(state, now=100.8)
    flat = squash(text)
    assert "python examples/long_prompts.py" in flat
    assert "vLLM 0.32.0" in flat and "token budget 8 tok" in flat and "max_num_seqs 4" in flat
    assert "KV cache 40 tok (11 blocks × 4, 1 reserved)" in flat and "prefix caching off" in flat
    assert "8 steps in 700 ms" in flat and "10.0 steps/s recent" in flat  # 7 intervals in 0.7 s
    assert "schedule() 104 µs mean, 107 µs max" in flat  # 103.5 rounds to 104
    assert "elapsed 2.80 s" in flat  # meta start 98.0 -> now 100.8


def test_current_step_mid_prefill_and_prefills_in_flight():
    text = render(RunState().apply_all(records(upto(hand_stream(), "step", 0))), now=100.1)
    flat = squash(text)
    assert "step 0" in flat
    assert "8 prefill + 0 decode = 8 / 8 tok (100%)" in flat
    assert "running 1" in flat and "waiting 1" in flat
    assert "held back by token budget" in flat
    # A is 8 of 10 prompt tokens into its first pass, chunk 0 = [0, 8)
    assert "prefills in flight: 1" in flat
    row = next(line for line in text.splitlines() if re.search(r"│\s+A\s+0 \[0, 8\)", line))
    assert "8/10" in row
    stacked = render(RunState().apply_all(records(upto(hand_stream(), "step", 0))), width=100, height=None, now=100.1)
    row = next(line for line in stacked.splitlines() if re.search(r"│\s+A\s+first\s+0 \[0, 8\)", line))
    assert "8/10" in row


def test_preemption_panel_and_request_table():
    state = RunState().apply_all(records(upto(hand_stream(), "step", 3)))
    text = render(state, now=100.4)
    flat = squash(text)
    assert "total 1" in flat and "discarded 5 tok" in flat
    # latest preemption row: step 3, request B, 5 tok discarded, 2 output tokens, first time
    assert re.search(r"\b3\s+B\s+5 tok\s+2\s+×1\s+100%\s+1/1\b", text)
    # request table: B (preempted) comes before A (decoding)
    lines = text.splitlines()
    b_row = next(i for i, ln in enumerate(lines) if re.search(r"│\s+B\s+preempted ×1", ln))
    a_row = next(i for i, ln in enumerate(lines) if re.search(r"│\s+A\s+decode", ln))
    assert b_row < a_row
    # A: prompt 10, ~12 computed and ~3 output at step 3, 2 chunks, queue 199 ms, TTFT 400 ms in 2 steps
    assert re.search(r"A\s+decode\s+10\s+~12\s+~3\s+2\s+0\s+199 ms\s+400 ms\s+2", lines[a_row])


def test_finished_run_shows_final_totals():
    state = RunState().apply_all(records(hand_stream()))
    meta = {**META, "end_time": 101.0, "exit_code": 0}
    flat = squash(render(state, meta=meta, view=View(status="finished · exit 0")))
    assert "finished · exit 0" in flat
    assert "recomputed 6 tok" in flat  # one figure, one name: the summary's "recomputed"
    assert "0 preempted · 0 prefill · 0 waiting · 0 decode · 2 finished" in flat
    assert re.search(r"B\s+done \(length\)\s+4\s+-\s+5\s+2\s+1\s+199 ms\s+300 ms\s+2", flat)
    assert "elapsed 3.00 s" in flat


def test_several_engines_get_a_row_each():
    stream = sorted(hand_stream(0) + hand_stream(1), key=lambda ev: ev["ts"])
    text = render(RunState().apply_all(records(stream)), now=100.8)
    assert "2 engine cores (data-parallel ranks)" in text
    assert "dp 0" in text and "dp 1" in text
    only_one = render(RunState().apply_all(records(stream)), now=100.8, view=View(engine=1))
    assert "engine cores" not in only_one and "engine core 1" in only_one


@pytest.mark.parametrize("width", [20, 45, 60, 69, 70, 80, 100, 139, 140, 160, 220])
@pytest.mark.parametrize("height", [3, 8, 15, 19, 20, 24, 30, 50])
def test_never_taller_than_the_terminal(width, height):
    for cut in ("step 0", "step 3", "step 7"):
        state = RunState().apply_all(records(upto(hand_stream(), "step", int(cut.split()[1]))))
        text = render(state, width=width, height=height, now=100.8)
        lines = text.rstrip("\n").split("\n")
        assert len(lines) <= height, (width, height, cut)
        assert max(len(ln) for ln in lines) <= width


def test_small_terminal_says_so_and_keeps_key_figures():
    text = render(RunState().apply_all(records(upto(hand_stream(), "step", 3))), width=60, height=15, now=100.4)
    flat = squash(text)
    assert "terminal 60×15" in flat
    assert "step 3" in flat and "1/8 tok" in flat and "preempt 1" in flat
    assert "last preemption step 3 B 5 tok discarded ×1" in flat


def test_empty_state_and_no_events_notice():
    text = squash(render(RunState(), view=View(status="● live", notice="no events yet in /tmp/x")))
    assert "no events yet in /tmp/x" in text
    assert "no engine_config yet" in text


def test_bad_input_is_counted_and_shown(tmp_path):
    good = hand_stream()
    lines = [json.dumps(ev) for ev in good[:6]]
    lines.insert(2, "this is not json")
    lines.insert(3, json.dumps({"event": "from_the_future", "ts": 100.0}))
    lines.insert(4, json.dumps([1, 2, 3]))
    (tmp_path / "events-1.jsonl").write_text("\n".join(lines) + "\n" + json.dumps(good[6])[:25])  # cut mid-line
    stats = ReadStats()
    state = RunState().apply_all(records(iter_run(tmp_path, stats)))
    assert (stats.malformed, stats.unknown_kind, stats.partial, stats.events) == (2, 1, 1, 6)
    flat = squash(render(state, stats=stats, now=100.2))
    assert "4 lines skipped (2 malformed, 1 truncated, 1 unknown kind)" in flat
    assert "6 events" in flat

    # live following: a line still being written is not an error until the run ends
    stats2 = ReadStats()
    follower = Follower(tmp_path, stats2)
    state2 = RunState().apply_all(records(follower.poll()))
    assert follower.pending_partial() == 1 and stats2.partial == 0
    flat2 = squash(render(state2, stats=stats2, view=View(truncated=0), now=100.2))
    assert "3 lines skipped (2 malformed, 1 unknown kind)" in flat2


def test_event_missing_optional_fields_renders():
    ev = {"event": "step", "ts": 5.0, "engine": 0, "step": 3, "scheduled_tokens": 4, "token_budget": 0}
    text = squash(render(RunState().apply_all(records([ev])), now=5.0))
    assert "step 3" in text


def test_budget_bar_and_chart_pieces():
    bar = budget_bar(prefill=500, decode=12, scheduled=512, budget=1024, width=20)
    assert bar.plain == "█" * 10 + "█" + "░" * 9  # 10 prefill cells, 1 decode cell, rest unused
    assert bar.spans[0].end == 10
    from vllm_probe.analysis.engine_state import StepRecord

    recs = [StepRecord(i, float(i), 8, 8, 8, 0, 1, 0, 0.5, 1.0, 0, "token_budget") for i in range(3)]
    recs.append(StepRecord(3, 3.0, 2, 8, 0, 2, 1, 0, 0.5, 1.0, 0, "none"))
    rows = token_chart(recs, rows=2)
    # three full prefill columns; then 2 of 8 tokens decode = a quarter of 2 rows = half a row
    assert [r.plain for r in rows] == ["███ ", "███▄"]
    squeezed = bucket_steps(recs, 2)
    assert [(r.step, r.scheduled, r.prefill_tokens, r.decode_tokens) for r in squeezed] == [(1, 8, 8, 0), (3, 5, 4, 1)]


def test_plain_lines():
    state = RunState()
    fmt = PlainFormatter(state)
    out = []
    for ev in map(from_dict, hand_stream()):
        state.apply(ev)
        if (line := fmt.format(ev)) is not None:
            out.append(line)
    assert len(out) == 8 + 1  # 8 steps, 1 preemption
    assert out[0] == ("+1.100s step 0 | 8/8 tok 100% | prefill 8 tok 1 req | decode 0 tok 0 req | "
                      "run 1 wait 1 | kv 20% free 10 blk | preempted 0 (total 0)")
    pre = next(line for line in out if " preempt " in line)
    assert pre == ("+1.399s preempt step 3 | req B | discarded 5 tok | prompt 4 out 2 | x1 | kv 100% | "
                   "run 1 wait 1")
    assert out[-1].endswith("preempted 0 (total 1)")


def test_probe_losses_are_shown():
    stats = [{"event": "probe_stats", "ts": 101.0, "pid": 1, "engine": 0, "events_written": 10,
              "events_dropped": 4, "hook_errors": {"chunk": 3}, "hooks_disabled": ["chunk"]}]
    flat = squash(render(RunState().apply_all(records(hand_stream() + stats)), now=101.0))
    assert "the probe dropped 4 events" in flat
    assert "hooks switched off after errors: chunk" in flat


def test_priority_column_prefix_hits_and_longest_queues():
    from tests.analysis.test_run_figures import prefix_stream

    events = prefix_stream().events
    for ev in events:
        if ev["event"] == "request_added":
            ev["priority"] = {"P": 2, "Q": 0}[ev["req_id"]]
    text = render(RunState().apply_all(records(events)), now=0.5)
    flat = squash(text)
    # header: 384 of 600 first-pass prompt tokens hit; the longest queues of the run
    assert "prefix caching on (64% of prompt tok hit)" in flat
    assert "most running 2 waiting 1" in flat
    # preemption panel: Q re-admitted once, 256 of its 301 tokens to recompute were cached
    assert "re-admitted 1 · prefix-cache hits 256 of 301 tok (85%)" in flat
    header = next(line for line in text.splitlines() if " request " in line and " state " in line)
    assert re.search(r"request\s+state\s+prio\s+prompt", header)
    row = next(line for line in text.splitlines() if re.search(r"│\s+P\s+decode", line))
    assert re.search(r"│\s+P\s+decode\s+2\s+300\s", row)
    # one priority only, policy fcfs: no column
    plain = render(RunState().apply_all(records(prefix_stream().events)), now=0.5)
    assert not re.search(r"request\s+state\s+prio", plain)
