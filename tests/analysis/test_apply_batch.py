"""``RunState.apply_batch`` (summary's and doctor's hot loop, fed by
``reader.iter_file_batches``) leaves the state exactly as ``RunState.apply`` on each
record does: the same summary, the same doctor findings, the same per-engine figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.bench_analysis import generate_run
from vllm_probe.analysis.doctor import diagnose
from vllm_probe.analysis.episodes import Episodes
from vllm_probe.analysis.state import RunState
from vllm_probe.analysis.summary import analyze, analyze_events
from vllm_probe.runs.reader import ReadStats, iter_file_batches, iter_run
from vllm_probe.runs.rundir import event_files


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("gen") / "run"
    generate_run(run_dir, 6_000)  # two engine cores: chunks, preemptions, arrivals, finishes
    return run_dir


def _engine_figures(state: RunState) -> dict:
    out = {}
    for idx, e in state.engines.items():
        out[idx] = (e.first_ts, e.last_ts, sorted(e.pids), e.steps, e.last_step, e.scheduled_tokens,
                    e.budget_total, e.kv_total, e.running_total, e.waiting_total, e.idle_waiting_steps,
                    dict(e.bound_counts), dict(e.head_blocked_counts), dict(e.queue_steps), dict(e.step_tokens),
                    dict(e.preempted_steps), e.schedule_us_total, e.schedule_us_max, e.stepping_since,
                    e.last_step_ts, e.chunks, e.preemptions, e.requests_added, e.requests_finished,
                    [(s.first_step, s.last_step, s.steps, s.scheduled, s.kv_sum, s.waiting_max, s.bound)
                     for s in e.timeline.spans], sorted(e.requests))
    return out


def test_batched_state_equals_event_by_event(run):
    stats = ReadStats()
    one = RunState(step_window=0)
    one.apply_all(iter_run(run, stats))  # merged by time: the engine cores interleave
    many = RunState(step_window=0, buckets=False)
    for path in event_files(run):
        for batch in iter_file_batches(path, ReadStats(), 512):
            many.apply_batch(batch)
    assert many.events == one.events == stats.events > 5_000
    assert sorted(many.engines) == [0, 1]
    assert _engine_figures(many) == _engine_figures(one)
    # buckets=False keeps no schedule-time buckets; the default keeps one per step
    assert sum(many.engines[0].schedule_s.counts) == 0
    assert sum(one.engines[0].schedule_s.counts) == one.engines[0].steps


def test_summary_and_findings_equal_event_by_event(run):
    ep_one, ep_many = Episodes(), Episodes()
    state_one, s_one = analyze_events(iter_run(run, ReadStats()), run_dir=str(run), listener=ep_one)
    state_many, s_many = analyze(run, listener=ep_many)  # the batched path
    assert s_one is not None and s_many is not None
    d_one, d_many = s_one.to_dict(), s_many.to_dict()
    d_one.pop("read"), d_many.pop("read"), d_one.pop("command"), d_many.pop("command")
    assert json.dumps(d_many, sort_keys=True) == json.dumps(d_one, sort_keys=True)
    assert s_many.steps == state_one.total("steps") > 1_000
    f_one = [f.to_dict() for f in diagnose(state_one, ep_one)]
    f_many = [f.to_dict() for f in diagnose(state_many, ep_many)]
    assert f_one  # the generated run preempts: there are findings to compare
    assert json.dumps(f_many, sort_keys=True, default=str) == json.dumps(f_one, sort_keys=True, default=str)
