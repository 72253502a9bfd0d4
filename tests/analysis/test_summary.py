"""Summary figures from hand-made event streams, worked out by hand (tests/_events.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests._events import Stream, scenario_chunked, scenario_preempt, records
from tests.conftest import ROOT, requires_vllm
from tests._events import as_dict
from vllm_probe.analysis.figures import Distribution, quantile, quantile_from_counts
from vllm_probe.analysis.summary import summarize, summarize_events
from vllm_probe.runs.reader import ReadStats
from vllm_probe.runs.rundir import NoEventsError

approx = pytest.approx


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_probe", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


# -- quantiles ---------------------------------------------------------------------------


def test_quantiles_interpolate_linearly():
    assert quantile([1, 2, 3, 4], 0.5) == 2.5
    assert quantile([1, 2, 3, 4], 0.9) == approx(3.7)  # pos 2.7: 3 + 0.7
    assert quantile([5], 0.9) == 5
    assert quantile([], 0.5) is None
    counts = {0: 1, 1: 3, 904: 1, 2048: 2}
    expanded = sorted(v for v, n in counts.items() for _ in range(n))
    for q in (0, 0.25, 0.5, 0.9, 1):
        assert quantile_from_counts(counts, q) == quantile(expanded, q)
    d = Distribution.of([3.0, 1.0, 2.0, None])
    assert (d.n, d.mean, d.median, d.p90, d.max) == (3, 2.0, 2.0, approx(2.8), 3.0)


# -- one chunked prompt --------------------------------------------------------------------


def test_chunked_prompt_figures_by_hand():
    s = summarize_events(records(scenario_chunked().events))
    assert s.steps == 7
    assert s.duration_s == approx(0.601)  # step 0's start (t+0.300) → step 6 (t+0.901)
    assert (s.requests_added, s.requests_finished, s.requests_unfinished) == (1, 1, 0)
    assert (s.prompt_tokens, s.output_tokens) == (5000, 4)
    # 5,000 tokens cut 2,048 / 2,048 / 904: 3 chunks; later chunks re-read 2,048 + 4,096 KV tokens
    c = s.chunking
    assert (c.prompts, c.chunked_prompts, c.chunks) == (1, 1, 3)
    assert (c.chunks_per_prompt.mean, c.chunks_per_prompt.max) == (3, 3)
    assert c.prefill_tokens == 5000
    assert c.reread_kv_tokens == 2048 + 4096 == 6144
    assert c.reread_per_prefill_token == approx(6144 / 5000)
    # steps: scheduled 2048, 2048, 904, 1, 1, 1, 0
    t = s.tokens_per_step
    assert (t.n, t.median, t.p90, t.max) == (7, 1, 2048, 2048)
    assert t.mean == approx(5003 / 7)
    assert s.budget_use.median == approx(1 / 2048)
    assert s.budget_use.max == 1.0
    assert (s.prefill_tokens, s.decode_tokens) == (5000, 3)
    assert s.prefill_share == approx(5000 / 5003)
    assert s.schedule_us.mean == approx(1000.0)
    # latency: arrival t+0.1, first chunk t+0.3, first token at step 3 (t+0.601), finish t+0.85
    L = s.latency
    assert L.queue_s.median == approx(0.2)
    assert L.ttft_s.median == approx(0.501)
    assert L.ttft_steps.median == 3
    assert L.decode_s.median == approx(0.249)
    assert L.itl_s.median == approx(0.249 / 3)
    # steps 0 and 1 used the whole budget; nothing waited afterwards
    assert s.bound_by == approx({"token_budget": 2 / 7, "max_num_seqs": 0, "kv_cache": 0, "none": 5 / 7})
    assert s.bound_most == "none"
    assert s.preemptions.count == 0 and s.preemptions.worst_request is None
    assert s.config["max_num_batched_tokens"] == 2048 and s.engines == 1


# -- preemptions, several requests -----------------------------------------------------------


def test_preemption_and_latency_figures_by_hand():
    s = summarize_events(records(scenario_preempt().events))
    assert s.steps == 9
    assert s.duration_s == approx(0.801)
    p = s.preemptions
    assert (p.count, p.requests) == (2, 1)
    assert p.discarded_tokens == 80 + 81
    assert p.recomputed_tokens == 81 + 82  # the two resumed passes
    assert (p.worst_request, p.worst_preemptions, p.worst_recomputed_tokens) == ("B", 2, 163)
    c = s.chunking
    # first complete passes: A 2 chunks, B 2 (its recompute passes do not count), C 1
    assert (c.prompts, c.chunked_prompts, c.chunks) == (3, 2, 7)
    assert c.chunks_per_prompt.mean == approx(5 / 3) and c.chunks_per_prompt.max == 2
    assert c.reread_kv_tokens == 100 + 50  # A's [100,150) and B's [50,80)
    assert c.prefill_tokens == 100 + 50 + 50 + 30 + 50 + 81 + 82
    # scheduled per step: 100 100 31 51 82 1 82 1 0
    assert (s.tokens_per_step.median, s.tokens_per_step.p90, s.tokens_per_step.max) == (51, 100, 100)
    assert (s.prefill_tokens, s.decode_tokens) == (443, 5)
    L = s.latency
    # queue: A 0.095, B 0.195, C 0.395
    assert (L.queue_s.median, L.queue_s.p90, L.queue_s.max) == (approx(0.195), approx(0.355), approx(0.395))
    # TTFT: A 0.3 (step 2), B 0.4 (step 3), C 0.5 (step 4)
    assert (L.ttft_s.median, L.ttft_s.p90, L.ttft_s.max) == (approx(0.4), approx(0.48), approx(0.5))
    assert (L.ttft_steps.median, L.ttft_steps.p90, L.ttft_steps.max) == (3, approx(3.8), 4)
    # decode: A 0.15, B 0.45, C 0.15; inter-token over 2 gaps each
    assert (L.decode_s.median, L.decode_s.p90, L.decode_s.max) == (approx(0.15), approx(0.39), approx(0.45))
    assert (L.itl_s.median, L.itl_s.max) == (approx(0.075), approx(0.225))
    # bound by: token_budget steps 0-1, max_num_seqs steps 2-3, kv_cache step 5, none 4-8 but 5
    assert s.bound_by == approx({"token_budget": 2 / 9, "max_num_seqs": 2 / 9, "kv_cache": 1 / 9, "none": 4 / 9})
    assert s.bound_most == "none"
    assert (s.prompt_tokens, s.output_tokens) == (280, 9)


def test_request_cut_short_by_a_preemption_counts_its_completing_pass():
    s = Stream()
    s.config(0.0, budget=1024, max_num_seqs=4)
    s.added(0.1, "X", 1536, 2, arrival=0.1)
    s.chunk(0.19, 0, "X", 0, 0, 1014, 1536)
    s.step(0.2, 0, 1024, prefill=1014, running=1, waiting=0)
    s.preempt(0.29, 1, "X", 1014, 1536, 0, 1, running=0, waiting=1)
    s.step(0.3, 1, 1024, running=0, waiting=1, preempted=["X"])
    s.chunk(0.39, 2, "X", 0, 0, 1021, 1536, resumed=True)
    s.step(0.4, 2, 1024, prefill=1021, running=1, waiting=0)
    s.chunk(0.49, 3, "X", 1, 1021, 1536, 1536, resumed=True, last=True)
    s.step(0.5, 3, 1024, prefill=515, running=1, waiting=0)
    sm = summarize_events(records(s.events))
    assert sm.chunking.prompts == 1 and sm.chunking.chunks_per_prompt.max == 2  # the resumed pass
    assert sm.chunking.reread_kv_tokens == 1021
    assert sm.preemptions.recomputed_tokens == 1536 and sm.preemptions.discarded_tokens == 1014
    assert sm.requests_unfinished == 1 and sm.preemptions.worst_request == "X"


# -- runs on disk: several engines, bad lines, empty dirs -------------------------------------------


def test_two_engine_cores_with_interleaved_timestamps(tmp_path):
    a = scenario_chunked(engine=0, pid=11, t=100.0, req="a")
    b = scenario_chunked(engine=1, pid=22, t=100.05, req="b")
    a.write(tmp_path)
    b.write(tmp_path)
    s = summarize(tmp_path)
    assert s.engines == 2 and s.steps == 14
    assert s.requests_finished == 2 and s.chunking.reread_kv_tokens == 2 * 6144
    assert s.latency.ttft_s.median == approx(0.501) and s.latency.ttft_steps.max == 3
    assert s.duration_s == approx(0.651)  # engine 0's first step start → engine 1's last step
    assert s.read["files"] == 2 and s.read["events"] == len(a.events) + len(b.events)


def test_bad_lines_are_counted_and_do_not_change_the_figures(tmp_path):
    clean = summarize_events(records(scenario_chunked().events))
    s = scenario_chunked()
    newer = json.dumps({"event": "probe_stats", "ts": 101.5, "pid": 4242, "engine": 0, "schema": 99,
                        "events_written": 0, "events_dropped": 0, "hook_errors": {}, "hooks_disabled": []})
    s.write(tmp_path, extra_lines=[
        "not json at all\n", "[1, 2]\n", '{"event": "frobnicate", "ts": 101.2}\n', "\n", newer + "\n",
    ], tail='{"event": "step", "ts": 101.9, "st')
    stats = ReadStats()
    got = summarize(tmp_path, stats)
    assert (stats.malformed, stats.unknown_kind, stats.partial, stats.newer_schema) == (2, 1, 1, 1)
    assert got.read["malformed"] == 2 and "lines skipped" in got.read["text"]
    for attr in ("steps", "tokens_per_step", "chunking", "latency", "preemptions", "bound_by"):
        assert getattr(got, attr) == getattr(clean, attr), attr


def test_no_events_raise_a_clear_error(tmp_path):
    with pytest.raises(NoEventsError, match="no event files"):
        summarize(tmp_path)
    (tmp_path / "events-1.jsonl").write_text("garbage\n{\"half\": ")
    with pytest.raises(NoEventsError, match="no readable events"):
        summarize(tmp_path)


def test_summary_cli_exit_codes_and_json(tmp_path):
    scenario_preempt().write(tmp_path / "run")
    r = cli("summary", str(tmp_path / "run"), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["preemptions"]["count"] == 2 and data["chunking"]["reread_kv_tokens"] == 150
    assert data["latency"]["ttft_steps"]["median"] == 3
    r = cli("summary", str(tmp_path / "run"))
    assert r.returncode == 0 and "Latency per finished request" in r.stdout and "Traceback" not in r.stderr
    r = cli("summary", str(tmp_path / "missing"))
    assert r.returncode == 2 and "run directory not found" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "empty").mkdir()
    r = cli("summary", str(tmp_path / "empty"))
    assert r.returncode == 1 and "no event files" in r.stderr and "Traceback" not in r.stderr


# -- a real run ------------------------------------------------------------------------------


@requires_vllm
@pytest.mark.engine
def test_summary_of_a_real_run_agrees_with_its_events(quick_run):
    from vllm_probe.runs.reader import iter_run

    evs = [as_dict(e) for e in iter_run(quick_run, ReadStats())]
    stats = ReadStats()
    s = summarize(quick_run, stats)
    assert stats.events == len(evs) and stats.skipped == 0  # every line the probe wrote validates typed
    # the file read by the reader and the same events as hand-made records (tests/_events.py) agree
    from_dicts = summarize_events(records(evs)).to_dict()
    assert {k: v for k, v in s.to_dict().items() if k not in ("run_dir", "command", "exit_code", "read")} == \
        {k: v for k, v in from_dicts.items() if k not in ("run_dir", "command", "exit_code", "read")}
    steps = [e for e in evs if e["event"] == "step"]
    chunks = [e for e in evs if e["event"] == "chunk"]
    preempts = [e for e in evs if e["event"] == "preempt"]
    assert s.steps == len(steps) and s.requests_finished == 8
    assert s.tokens_per_step.max == max(e["scheduled_tokens"] for e in steps) <= 256
    assert s.chunking.chunks == len(chunks)
    assert s.chunking.reread_kv_tokens == sum(c["start"] for c in chunks if c["chunk_index"] >= 1)
    assert s.chunking.chunked_prompts == 8  # 600-token prompts, budget 256
    assert s.preemptions.count == len(preempts) >= 1
    assert s.preemptions.requests == len({e["req_id"] for e in preempts})
    assert s.output_tokens == 8 * 300 and s.latency.ttft_steps.n == 8
    assert s.latency.ttft_steps.max >= 3  # at least ceil(600 / 256) steps of prefill
    assert s.config["max_num_batched_tokens"] == 256


def test_probe_losses_use_the_last_probe_stats_line_of_each_file():
    s = scenario_chunked()
    s.probe_stats(101.5, dropped=3)  # cumulative: the file's last line is final
    s.events[-1]["hook_errors"] = {"chunk": 2, "step": 0}
    s.events[-1]["hooks_disabled"] = ["chunk"]
    sm = summarize_events(records(s.events))
    assert (sm.probe_dropped_events, sm.probe_hook_errors, sm.probe_hooks_disabled) == (3, 2, ["chunk"])


def test_step_figures_are_unknown_without_step_events():
    """With step events off the per-step figures are unknown (None, "-"), not 0; what
    the other kinds say is still counted."""
    from tests._events import scenario_preempt

    events = [e for e in scenario_preempt().events if e["event"] != "step"]
    s = summarize_events(records(events))
    assert s.steps == 0 and s.preemptions.count == 2
    assert (s.scheduled_tokens, s.prefill_tokens, s.decode_tokens, s.prefill_share) == (None, None, None, None)
    p = s.preemptions
    assert (p.max_per_step, p.steps_with_several, p.steps_with_preemptions) == (None, None, None)
    with_steps = summarize_events(records(scenario_preempt().events))
    assert with_steps.prefill_tokens > 0 and with_steps.preemptions.max_per_step == 1
