"""What ``vllm-probe report`` shows, computed in analysis/: the page's step series (every
extreme and every preempting step kept however the buckets merge), the longest prompts'
chunks, one read giving the summary's and the doctor's own figures, the finding
stretches, the latency curves, and the whatif / tune results read back."""

from __future__ import annotations

import json
import random
import shutil

import msgspec
import pytest

from tests._events import Stream, records, scenario_chunked, scenario_preempt
from vllm_probe.analysis.doctor import Finding, examine
from vllm_probe.analysis.doctor.evidence import Evidence
from vllm_probe.analysis.report import (
    CURVE_POINTS, ReportInputError, _step_ranges, finding_stretch, read_run, read_tune, read_whatif,
)
from vllm_probe.analysis.series import FIGURES, PageSeries
from vllm_probe.analysis.state import Listeners, RunState, StateListener
from vllm_probe.analysis.summary import analyze_story, summarize


def follow(events, **kw) -> PageSeries:
    series = PageSeries(**kw)
    state = RunState(step_window=0, listener=series)
    for rec in records(events):
        state.apply(rec)
    series.finish()
    return series


def step_rows(events):
    """(step, scheduled, prefill, decode, budget, running, waiting, kv) of each step event, by hand."""
    return [(e["step"], e["scheduled_tokens"], e["prefill_tokens"], e["decode_tokens"], e["token_budget"],
             e["running"], e["waiting"], e["kv_usage"]) for e in events if e["event"] == "step"]


def test_a_short_run_keeps_every_step_and_marks_each_preemption_with_its_victim():
    s = scenario_preempt()
    series = follow(s.events)
    eng = series.engines[0]
    assert eng.width == 1 and eng.first_step == list(range(9)) and eng.steps == [1] * 9
    assert eng.hi["scheduled"] == eng.lo["scheduled"] == [100, 100, 31, 51, 82, 1, 82, 1, 0]
    assert eng.hi["waiting"] == [2, 1, 1, 1, 0, 1, 0, 0, 0]
    assert eng.preemptions == [0, 0, 0, 1, 0, 1, 0, 0, 0]
    assert [(m.step, [(v.req_id, v.discarded_tokens, v.num_preemptions) for v in m.victims], m.running, m.waiting)
            for m in series.marks] == [(3, [("B", 80, 1)], 2, 1), (5, [("B", 81, 2)], 1, 1)]


@pytest.mark.parametrize("max_buckets", [2, 3, 5, 16])
def test_merged_buckets_keep_every_extreme_and_every_sum(max_buckets):
    """A 500-step random stream: each bucket's least, largest and sum equal those of its
    steps, the buckets tile the run, and every preempting step is still a mark."""
    rng = random.Random(max_buckets)
    s = Stream()
    s.config(1.0, budget=512, max_num_seqs=8)
    preempting = []
    for i in range(500):
        pre, dec = rng.randint(0, 400), rng.randint(0, 8)
        victims = [f"r{i}"] if rng.random() < 0.03 else []
        if victims:
            preempting.append(i)
            s.preempt(2.0 + i * 0.01, i, victims[0], 10 + i, 100, 0, 1, running=3, waiting=2)
        s.step(2.0 + i * 0.01 + 0.005, i, 512, prefill=pre, decode=dec, running=rng.randint(0, 8),
               waiting=rng.randint(0, 30), kv=round(rng.random(), 4), preempted=victims)
    series = follow(s.events, max_buckets=max_buckets)
    eng = series.engines[0]
    assert len(eng) <= max_buckets and sum(eng.steps) == 500
    assert eng.first_step[0] == 0 and eng.last_step[-1] == 499
    assert all(b == a + 1 for a, b in zip(eng.last_step, eng.first_step[1:]))
    rows = step_rows(s.events)
    for i in range(len(eng)):
        inside = [r[1:] for r in rows if eng.first_step[i] <= r[0] <= eng.last_step[i]]
        assert eng.steps[i] == len(inside)
        for k, name in enumerate(FIGURES):
            col = [r[k] for r in inside]
            assert (eng.lo[name][i], eng.hi[name][i]) == (min(col), max(col)), (i, name)
            assert eng.total[name][i] == pytest.approx(sum(col))
    assert sum(eng.preemptions) == len(preempting)
    assert [m.step for m in series.marks] == preempting
    assert [m.victims[0].discarded_tokens for m in series.marks] == [10 + i for i in preempting]


def test_the_longest_prompts_are_followed_chunk_by_chunk_and_shorter_ones_dropped():
    s = Stream()
    s.config(1.0, budget=256, max_num_seqs=8)
    lengths = {"a": 10, "b": 500, "c": 30, "d": 700, "e": 600}
    for i, (rid, n) in enumerate(lengths.items()):
        s.added(1.1 + i * 0.01, rid, n, 2, arrival=1.1 + i * 0.01)
    step = 0
    for rid, n in lengths.items():
        start, k = 0, 0
        while start < n:
            end = min(start + 256, n)
            s.chunk(2.0 + step * 0.1, step, rid, k, start, end, n, last=end == n)
            s.step(2.0 + step * 0.1 + 0.01, step, 256, prefill=end - start, running=1, waiting=0)
            start, k, step = end, k + 1, step + 1
    series = follow(s.events, longest=2)
    tracks = series.longest()
    assert [(t.req_id, t.prompt_len) for t in tracks] == [("d", 700), ("e", 600)]
    # a: step 0, b: 1-2, c: 3, d: 4-6, e: 7-9
    assert [(c[0], c[2], c[3], c[4]) for c in tracks[0].chunks] == [(4, 0, 256, False), (5, 256, 512, False),
                                                                     (6, 512, 700, False)]
    assert tracks[0].arrival_step == 0 and tracks[0].first_token_step == 6
    assert [(c[0], c[2], c[3]) for c in tracks[1].chunks] == [(7, 0, 256), (8, 256, 512), (9, 512, 600)]


def test_listeners_pass_every_transition_to_each_in_order():
    seen = []

    class Tap(StateListener):
        def __init__(self, name):
            self.name = name

        def on_step(self, eng, ev):
            seen.append((self.name, "step", ev.step))

        def on_preempt(self, eng, req, ev):
            seen.append((self.name, "preempt", req.req_id))

    state = RunState(step_window=0, listener=Listeners(Tap("a"), Tap("b")))
    for rec in scenario_preempt().records:
        state.apply(rec)
    assert seen[:2] == [("a", "step", 0), ("b", "step", 0)]
    assert [x for x in seen if x[1] == "preempt"] == [("a", "preempt", "B"), ("b", "preempt", "B")] * 2


@pytest.fixture
def preempt_run(tmp_path):
    run = tmp_path / "run"
    scenario_preempt().write(run)
    (run / "meta.json").write_text(json.dumps({"command": ["python", "x.py"], "start_time": 199.0}))
    return run


def test_one_read_gives_summarys_and_doctors_own_figures(preempt_run):
    page = read_run(preempt_run)
    _, story = analyze_story(preempt_run)
    assert page.summary.to_dict() == story.to_dict()
    assert [f.finding.to_dict() for f in page.findings] == [f.to_dict() for f in examine(preempt_run).findings]
    assert page.doctor.all_clear == examine(preempt_run).all_clear
    assert page.t0 == pytest.approx(200.1 - 1000e-6)  # the first step's ts minus its schedule_us
    assert page.label == "run" and page.meta["command"] == ["python", "x.py"]


def test_latency_curves_by_class_hold_the_summarys_requests_and_quantiles(tmp_path):
    run = tmp_path / "run"
    s = scenario_preempt()
    s.write(run)
    page = read_run(run, boundaries=[60, 100])  # C (50) short, B (80) medium, A (150) long
    summary = summarize(run, boundaries=[60, 100])
    by = {(c.figure, c.cls): c for c in page.latency}
    assert [by[("ttft_s", c.name)].n for c in summary.latency_classes.classes] == [1, 1, 1]
    for c in summary.latency_classes.classes:
        assert by[("ttft_s", c.name)].dist.median == pytest.approx(c.ttft_s.median)
        assert by[("queue_s", c.name)].dist.p90 == pytest.approx(c.queue_s.p90)
    assert by[("ttft_s", "all")].n == 3 and by[("ttft_s", "all")].shares == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert by[("itl_s", "all")].dist.median == pytest.approx(summary.latency.itl_s.median)
    assert by[("ttft_s", "all")].values == sorted(by[("ttft_s", "all")].values)


def test_a_long_class_is_drawn_through_its_quantiles_with_both_ends():
    from vllm_probe.analysis.report import _curve

    values = [float(i) for i in range(1000, 0, -1)]
    c = _curve("ttft_s", "all", None, None, values)
    assert len(c.values) == CURVE_POINTS and c.values[0] == 1.0 and c.values[-1] == 1000.0
    assert c.shares[0] == 0.0 and c.shares[-1] == 1.0 and c.dist.median == 500.5


class _Ev(Evidence, kw_only=True):
    steps: int  # a count: never a stretch
    step_range: list[int]
    busiest: list[dict]
    longest: list[int] | None = None


def test_a_findings_stretch_is_the_cited_range_holding_its_step():
    ev = _Ev(steps=999, step_range=[40, 90], busiest=[{"step": 50, "n": 2}, {"step": 70, "n": 1}], longest=[3, 4])
    # a record with a ``step`` is a step wherever it is; a count named "steps" is not
    assert list(_step_ranges(msgspec.to_builtins(ev), "")) == [(40, 90), (50, 50), (70, 70), (3, 4)]
    f = Finding("no-such-rule", "warning", "m", ev)
    fs = finding_stretch(f)
    assert (fs.step, fs.first_step, fs.last_step) == (None, 40, 90)
    cited = {"busiest_steps": [{"step": 50}, {"step": 70}], "first_step": 7}
    assert list(_step_ranges(cited, "")) == [(7, 7), (50, 70)]
    lone = finding_stretch(Finding("no-such-rule", "info", "m", _Ev(steps=1, step_range=[5, 5], busiest=[])))
    assert (lone.first_step, lone.last_step) == (0, 13)  # one step, widened either side
    assert finding_stretch(Finding("no-such-rule", "info", "m", Evidence())).first_step is None


def _replay_dir(parent, name, stream, settings, overrides, source, intervals=None):
    d = parent / name
    stream.write(d)
    meta = {"simulated": True, "source": str(source), "settings": settings, "overrides": overrides,
            "command": ["vllm-probe", "whatif"], "start_time": 1.0}
    if intervals is not None:
        meta["whatif"] = {"intervals": intervals}
    (d / "meta.json").write_text(json.dumps(meta))
    return d


def test_a_whatif_folder_reads_back_with_intervals_recorded_and_real_points(tmp_path):
    rec = tmp_path / "rec"
    scenario_preempt().write(rec)
    real = tmp_path / "real"  # recorded for real at max_num_seqs 4: the changed setting
    s = scenario_chunked()
    s.events[0]["max_num_seqs"] = 4
    s.events[0]["max_num_batched_tokens"] = 100
    s.write(real)
    other = tmp_path / "other"  # another token budget: not a rerun of a point
    s2 = scenario_chunked()
    s2.events[0]["max_num_seqs"] = 4
    s2.events[0]["max_num_batched_tokens"] = 4096
    s2.write(other)
    out = tmp_path / "whatif"
    base_settings = {"max_num_seqs": 2, "max_num_batched_tokens": 100, "num_kv_blocks": 64}
    _replay_dir(out, "baseline", scenario_preempt(), base_settings, {}, rec)
    for speed in ("baseline-recorded-speed", "baseline-slowest-speed", "baseline-fastest-speed"):
        _replay_dir(out, speed, scenario_chunked(), base_settings, {}, rec)  # the intervals' replays: no setting
    iv = {"ttft_p90": {"lo": 0.1, "hi": 0.4, "from": "drift"}, "bad": {"lo": "x"}}
    _replay_dir(out, "max_num_seqs=4", scenario_chunked(), {**base_settings, "max_num_seqs": 4}, {"max_num_seqs": 4},
                rec, iv)
    runs = [read_run(rec), read_run(real), read_run(other)]
    sweep = read_whatif(out, runs)
    assert sweep.tool == "whatif" and sweep.keys == ["max_num_seqs"] and sweep.source == str(rec)
    kinds = [(p.kind, p.label, p.settings) for p in sweep.points]
    assert kinds == [("recorded", "rec", {"max_num_seqs": 2}), ("baseline", "baseline", {"max_num_seqs": 2}),
                     ("predicted", "max_num_seqs=4", {"max_num_seqs": 4}), ("real", "real", {"max_num_seqs": 4})]
    pred = sweep.points[2]
    assert pred.figures["ttft_p90"] == pytest.approx(summarize(out / "max_num_seqs=4").latency.ttft_s.p90)
    assert list(pred.intervals) == ["ttft_p90"] and (pred.intervals["ttft_p90"].lo, pred.intervals["ttft_p90"].hi,
                                                      pred.intervals["ttft_p90"].source) == (0.1, 0.4, "drift")
    assert sweep.points[0].figures["preemptions"] == 2 and sweep.points[3].figures["preemptions"] == 0


def test_whatif_json_and_tune_json_read_back_and_missing_keys_are_no_error(tmp_path):
    rec = tmp_path / "rec"
    scenario_preempt().write(rec)
    summary = summarize(rec).to_dict()
    wj = tmp_path / "whatif.json"
    wj.write_text(json.dumps({"source": str(rec), "recorded": summary,
                              "baseline": {"settings": {"max_num_seqs": 2}, "summary": summary,
                                           "intervals": {"ttft_p90": {"lo": 1, "hi": 2}}},
                              "configs": [{"settings": {"max_num_seqs": 8}, "overrides": {"max_num_seqs": 8},
                                           "summary": summary}]}))
    sweep = read_whatif(wj)
    assert [(p.kind, p.settings) for p in sweep.points] == [("recorded", {"max_num_seqs": 2}),
                                                            ("baseline", {"max_num_seqs": 2}),
                                                            ("predicted", {"max_num_seqs": 8})]
    assert sweep.points[1].intervals["ttft_p90"].hi == 2.0 and sweep.points[1].intervals["ttft_p90"].source == ""
    tune_dir = tmp_path / "tune"
    tune_dir.mkdir()
    (tune_dir / "tune.json").write_text(json.dumps({
        "source": str(rec), "slo": [{"figure": "ttft_p90", "op": "<=", "value": 2.0, "unit": "s"}],
        "knobs": [{"setting": "max_num_seqs", "values": [2, 4, 8]}],
        "objective": {"figure": "output_tokens_per_s", "direction": "maximize"},
        "baseline": {"settings": {"max_num_seqs": 64}, "recorded": {"ttft_p90": 3.0}, "replayed": {"ttft_p90": 2.9}},
        "evaluated": [{"settings": {"max_num_seqs": 4}, "summary": {"ttft_p90": 1.5, "output_tokens_per_s": 900},
                       "meets": True, "intervals": {"ttft_p90": {"lo": 1.2, "hi": 1.9, "from": ["drift"]}}},
                      {"settings": {}, "summary": {"ttft_p90": 2.9}, "meets": False}],
        "recommended": {"settings": {"max_num_seqs": 4}}}))
    tune = read_tune(tune_dir)
    assert tune.figures == ["ttft_p90", "output_tokens_per_s", "preemptions"]
    assert [(p.kind, p.settings, p.figures["ttft_p90"], p.meets, p.recommended) for p in tune.points] == [
        ("recorded", {"max_num_seqs": 64}, 3.0, None, False), ("baseline", {"max_num_seqs": 64}, 2.9, None, False),
        ("predicted", {"max_num_seqs": 4}, 1.5, True, True), ("predicted", {"max_num_seqs": 64}, 2.9, False, False)]
    assert tune.points[2].intervals["ttft_p90"].source == '["drift"]'
    assert tune.slos[0]["value"] == 2.0


def test_a_path_without_a_result_is_a_one_line_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportInputError, match="no replayed run directory"):
        read_whatif(tmp_path / "empty")
    with pytest.raises(ReportInputError, match=r"no tune\.json"):
        read_tune(tmp_path / "empty")
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ReportInputError, match="not a JSON object"):
        read_tune(tmp_path / "bad.json")
    shutil.rmtree(tmp_path / "empty")
    with pytest.raises(ReportInputError, match="no such file"):
        read_whatif(tmp_path / "empty")
