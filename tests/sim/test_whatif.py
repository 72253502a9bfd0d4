"""``vllm-probe whatif`` without a real engine: hand-made runs written by vLLM's real
scheduler on a clock whose step times are known, the settings and their checks, the
timed-trace format, bad input. Real-engine runs: tests/e2e/test_whatif_e2e.py."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.conftest import requires_vllm, run_cli
from vllm_probe.analysis.workload import Workload, WorkloadError, WorkloadRequest, load_workload
from vllm_probe.sim import engine_args
from vllm_probe.sim.engine_args import SettingError

#: A known linear cost (s): what the fit must recover.
TRUE_COST = {"intercept": 0.002, "prefill_tokens": 1e-5, "attn_prefill": 2e-8, "decode_reqs": 4e-4,
             "attn_decode": 1e-7, "new_shape": 0.003, "first_step": 0.02}
#: The scheduler the hand-made runs are recorded on (tokens, blocks of 16).
SPEC = dict(max_num_batched_tokens=256, max_num_seqs=16, num_blocks=60, block_size=16, max_model_len=900)


def known_cost(features) -> float:
    from vllm_probe.sim.stepmodel import _INDEX

    return TRUE_COST["intercept"] + sum(c * features[_INDEX[t]] for t, c in TRUE_COST.items() if t != "intercept")


def hand_workload(n: int = 12, seed: int = 5, t0: float = 1000.0, gap_at: int | None = 6) -> Workload:
    """``n`` requests at Poisson times (40/s), prompts 50-700, outputs 5-60; an idle gap of
    2 s before request ``gap_at``. Times start at ``t0`` = 1000 s, not at an epoch of 1.7e9 s
    whose float spacing (0.24 µs) would blur the known step times."""
    rng = random.Random(seed)
    t, reqs = t0, []
    for i in range(n):
        t += rng.expovariate(40.0) + (2.0 if i == gap_at else 0.0)
        out = rng.randint(5, 60)
        reqs.append(WorkloadRequest(order=i, req_id=f"h{i}", prompt_len=rng.randint(50, 700), max_tokens=out,
                                    output_tokens=out, arrival_ts=t, added_ts=t, finish_reason="length"))
    return Workload("hand-made", {"scheduler_class": "Scheduler", "hash_block_size": 16}, reqs)


def record(tmp: Path, w: Workload, step_time=known_cost, flags=None, **spec) -> Path:
    """A run directory written by the probe on vLLM's real scheduler, replaying ``w`` on
    a virtual clock whose steps last ``step_time(features)``: a run whose costs are known."""
    from vllm_probe.engine.sink import EventSink
    from vllm_probe.runs.rundir import write_meta
    from vllm_probe.sim.harness import SchedulerSpec
    from vllm_probe.sim.replay import replay

    tmp.mkdir(parents=True, exist_ok=True)
    sink = EventSink(tmp / "events-1.jsonl")
    try:
        replay(w, SchedulerSpec(**{**SPEC, **spec}), step_time, sink, lag_s=0.0, flags=flags)
    finally:
        sink.close()
    write_meta(tmp, {"command": ["hand-made"], "start_time": 1.0})
    return tmp


# -- the step-time model --------------------------------------------------------------------


@requires_vllm
def test_step_time_model_recovers_a_known_linear_cost(tmp_path):
    from vllm_probe.sim.stepmodel import fit

    w = load_workload(record(tmp_path / "run", hand_workload()))
    assert len(w.chunks) > len(w.requests) and w.preempts  # chunked, preempted: every term varies
    m = fit(w)
    assert m.terms == ("prefill_tokens", "attn_prefill", "decode_reqs", "attn_decode", "new_shape", "first_step")
    assert m.intercept == pytest.approx(TRUE_COST["intercept"], rel=1e-6)
    for term, c in zip(m.terms, m.coef):
        assert c == pytest.approx(TRUE_COST[term], rel=1e-6), term
    q = m.quality
    assert q.r2 == pytest.approx(1.0) and q.median_abs_ms < 1e-6 and q.predicted_s == pytest.approx(q.measured_s)
    # no period where the engine went idle: the step that finished the last request and
    # the empty step that flushed it (before the 2 s gap, and at the end)
    import numpy as np

    from vllm_probe.sim.stepmodel import recorded_features

    _, periods = recorded_features(w)
    flushes = [s.step for s in w.steps if s.scheduled_tokens == 0]
    assert len(flushes) >= 2 and w.steps[-1].step in flushes
    assert sorted(s.step for s, p in zip(w.steps, periods) if np.isnan(p)) == sorted(
        k - d for k in flushes for d in (1, 0))


@requires_vllm
def test_features_from_events_equal_the_replays_own(tmp_path):
    """The model is fitted on features read from events and used on features read from
    the SchedulerOutput: they must be the same numbers, step for step."""
    import numpy as np

    from vllm_probe.sim.stepmodel import recorded_features

    seen = []

    def cost(features):
        seen.append(list(features))
        return known_cost(features)

    w = load_workload(record(tmp_path / "run", hand_workload(), step_time=cost))
    rows, periods = recorded_features(w)
    assert rows.tolist() == seen
    ok = np.isfinite(periods)
    assert np.allclose(periods[ok], [known_cost(r) for r in rows[ok]], rtol=1e-9)


def test_nnls_matches_an_exhaustive_search():
    """Non-negative least squares: the best of every subset of free columns."""
    import itertools

    import numpy as np

    from vllm_probe.sim.stepmodel import nnls

    rng = np.random.default_rng(0)
    for _ in range(20):
        a = rng.normal(size=(30, 4))
        b = a @ np.array([1.0, -2.0, 0.5, 0.0]) + rng.normal(scale=0.1, size=30)
        got = nnls(a, b)
        best = min((np.linalg.norm(a[:, list(c)] @ np.linalg.lstsq(a[:, list(c)], b, rcond=None)[0] - b), c)
                   for k in range(5) for c in itertools.combinations(range(4), k)
                   if k == 0 or (np.linalg.lstsq(a[:, list(c)], b, rcond=None)[0] >= 0).all())
        assert (got >= 0).all() and np.linalg.norm(a @ got - b) == pytest.approx(best[0], rel=1e-9)


# -- replays of hand-made runs ----------------------------------------------------------------


@requires_vllm
def test_baseline_of_a_run_with_known_costs_is_exact(tmp_path):
    """Timed arrivals, an idle gap, chunking and preemptions: the self-replay with the
    fitted model reproduces every figure (the model is exact here, so any error would be
    the replay's)."""
    from vllm_probe.sim.whatif import predict

    run = record(tmp_path / "run", hand_workload())
    cfg = load_workload(run).config  # the harness's scheduler: 0.3 of this machine's memory, 8 KiB blocks
    assert (cfg["gpu_memory_utilization"], cfg["kv_block_bytes"]) == (0.3, 8192) and cfg["device_memory_bytes"] > 0
    utilization = 0.3 + 340.5 * 8192 / cfg["device_memory_bytes"]  # 340.5 blocks more: 340
    r = predict(run, [{"num_kv_blocks": 400}, {"gpu_memory_utilization": utilization}], out=tmp_path / "out")
    assert r.error["within"], r.error
    by_memory = r.configs[1]
    assert by_memory.settings["num_kv_blocks"] == 400 and by_memory.summary.config["num_kv_blocks"] == 400
    sim_config = load_workload(by_memory.run_dir).config
    assert sim_config["gpu_memory_utilization"] == utilization and sim_config["kv_block_bytes"] == 8192
    assert by_memory.summary.preemptions.count == r.configs[0].summary.preemptions.count == 0
    for label, row in r.error["figures"].items():
        assert row["value"] == pytest.approx(row["reference"], rel=1e-6), label
    rec, base = r.recorded, r.baseline.summary
    assert (base.steps, base.preemptions.count, base.chunking.chunks) == (rec.steps, rec.preemptions.count,
                                                                         rec.chunking.chunks)
    assert base.latency.queue_s.p90 == pytest.approx(rec.latency.queue_s.p90, abs=1e-9)
    assert r.configs[0].settings["num_kv_blocks"] == 400 and r.configs[0].summary.preemptions.count == 0
    assert r.baseline.settings["num_kv_blocks"] == 60
    meta = json.loads((r.configs[0].run_dir / "meta.json").read_text())
    assert meta["simulated"] is True and meta["overrides"] == {"num_kv_blocks": 400}
    assert meta["source"] == str(run) and meta["settings"]["max_num_batched_tokens"] == 256


@requires_vllm
def test_unfinished_requests_are_replayed_up_to_what_they_produced(tmp_path):
    """A log cut mid-run (the server was killed): requests still running are served the
    tokens they had produced (the lifecycle model's estimate), counted in a note."""
    from vllm_probe.sim.whatif import predict

    run = record(tmp_path / "run", hand_workload(gap_at=None))
    path = run / "events-1.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if b'"event": "step", ' in line and b'"step": 200,' in line)
    path.write_bytes(b"".join(lines[:cut + 1]))
    w = load_workload(run)
    running = [r for r in w.requests if r.unfinished]
    assert w.unfinished == len(running) > 0
    decoding = [r for r in running if r.output_tokens > 0]
    assert decoding and all(r.output_tokens < r.max_tokens for r in decoding)
    r = predict(run, [], out=tmp_path / "out")
    assert any(f"{len(running)} request(s) were still running" in n for n in r.notes)
    base = r.baseline.summary
    assert base.requests_finished == len(w.requests) and base.requests_unfinished == 0
    assert base.output_tokens == sum(max(x.output_tokens, 1) for x in w.requests)


@requires_vllm
def test_aborted_requests_leave_at_their_recorded_step(tmp_path):
    from vllm_probe.sim.harness import MemorySink, SchedulerSpec
    from vllm_probe.sim.replay import replay

    w = hand_workload(n=4, gap_at=None)
    w.requests[1].finish_reason, w.requests[1].finish_step = "abort", 30
    w.requests[1].max_tokens = 500
    for r in w.requests:
        r.add_before_step = 0
    sink = MemorySink()
    replay(w, SchedulerSpec(**SPEC), known_cost, sink, mode="steps")
    finished = {e["req_id"]: e for e in sink.of("request_finished")}
    assert finished["h1"]["reason"] == "abort" and finished["h1"]["step"] == 30
    assert {rid: e["output_tokens"] for rid, e in finished.items() if rid != "h1"} == {
        r.req_id: r.output_tokens for r in w.requests if r.req_id != "h1"}


@requires_vllm
def test_async_scheduler_runs_are_replayed_with_a_batch_queue(tmp_path):
    """An AsyncScheduler run replays with EngineCore's batch queue of two: every request
    gets exactly its tokens and each step schedules before the previous output is in."""
    from vllm_probe.sim.harness import MemorySink, SchedulerSpec
    from vllm_probe.sim.replay import replay

    w = hand_workload(n=6, gap_at=None)
    w.config["scheduler_class"] = "AsyncScheduler"
    sink = MemorySink()
    replay(w, SchedulerSpec(**SPEC, async_scheduling=True), known_cost, sink)
    assert sink.of("engine_config")[0]["scheduler_class"] == "AsyncScheduler"
    finished = {e["req_id"]: e["output_tokens"] for e in sink.of("request_finished")}
    assert finished == {r.req_id: r.output_tokens for r in w.requests}


@requires_vllm
def test_stop_requests_stop_at_their_recorded_token(tmp_path):
    from vllm_probe.sim.harness import MemorySink, SchedulerSpec
    from vllm_probe.sim.replay import replay

    w = hand_workload(n=3, gap_at=None)
    w.requests[0].finish_reason, w.requests[0].max_tokens, w.requests[0].output_tokens = "stop", 200, 17
    sink = MemorySink()
    replay(w, SchedulerSpec(**SPEC), known_cost, sink)
    finished = {e["req_id"]: e for e in sink.of("request_finished")}
    assert (finished["h0"]["reason"], finished["h0"]["output_tokens"]) == ("stop", 17)


# -- prompts rebuilt from digests and trace ids ---------------------------------------------


def test_prompt_builder_shares_exactly_the_blocks_with_equal_ids():
    from vllm_probe.sim.tokens import PromptBuilder

    b = PromptBuilder(16)
    a = b.tokens(0, 50, ["x", "y", "z"])
    c = b.tokens(1, 40, ["x", "y", "q"])
    assert len(a) == 50 and len(c) == 40
    assert a[:32] == c[:32] and a[32] != c[32]
    assert not set(a[48:]) & set(c)  # a's tail is its own
    d = b.tokens(2, 40, ["x", "y", "z"])  # z covers only 8 tokens here: another (z, 8) block
    assert d[:32] == a[:32] and d[32:40] != a[32:40]
    assert b.tokens(3, 20, None) != b.tokens(4, 20, None)


# -- settings ---------------------------------------------------------------------------------

CONFIG = {"max_num_batched_tokens": 1024, "max_num_seqs": 64, "num_kv_blocks": 64, "block_size": 128,
          "max_model_len": 2048, "enable_chunked_prefill": True, "long_prefill_token_threshold": 0,
          "scheduling_policy": "fcfs", "prefix_caching": False, "max_num_scheduled_tokens": 1024,
          "scheduler_reserve_full_isl": True, "watermark": 0.0, "gpu_memory_utilization": 0.3,
          "kv_block_bytes": 131072, "device_memory_bytes": 12 * 2**30, "hash_block_size": 128}


def test_sets_give_the_cartesian_product_in_order():
    grid = engine_args.parse_sets(["max_num_batched_tokens=2048,16384", "num_kv_blocks=64,128",
                                   "enable-prefix-caching=on"])
    assert grid == [
        {"max_num_batched_tokens": 2048, "num_kv_blocks": 64, "enable_prefix_caching": True},
        {"max_num_batched_tokens": 2048, "num_kv_blocks": 128, "enable_prefix_caching": True},
        {"max_num_batched_tokens": 16384, "num_kv_blocks": 64, "enable_prefix_caching": True},
        {"max_num_batched_tokens": 16384, "num_kv_blocks": 128, "enable_prefix_caching": True},
    ]
    assert engine_args.parse_sets([]) == [{}]


@pytest.mark.parametrize("sets,message", [
    (["max_num_batched_token=2048"], "unknown setting 'max_num_batched_token' (did you mean max_num_batched_tokens?)"),
    (["max_num_seqs=lots"], "max_num_seqs=lots: expected an integer (requests)"),
    (["enable_chunked_prefill=maybe"], "enable_chunked_prefill=maybe: expected true or false"),
    (["scheduling_policy=lifo"], "scheduling_policy=lifo: expected fcfs or priority"),
    (["max_num_seqs"], "--set 'max_num_seqs': expected KEY=VALUE[,VALUE...]"),
    (["max_num_seqs=8", "max_num_seqs=9"], "--set max_num_seqs given twice; list its values once: max_num_seqs=A,B"),
])
def test_bad_sets_are_one_line(sets, message):
    with pytest.raises(SettingError) as e:
        engine_args.parse_sets(sets)
    assert str(e.value) == message


def test_resolve_keeps_derived_budgets_derived():
    """max_num_scheduled_tokens equal to the budget was vLLM's derived value: a new budget
    must not be capped by the old one."""
    settings, spec = engine_args.resolve(CONFIG, {"max_num_batched_tokens": 4096})
    assert settings["max_num_batched_tokens"] == 4096 and settings["max_num_scheduled_tokens"] is None
    assert spec.max_num_batched_tokens == 4096 and "max_num_scheduled_tokens" not in spec.extra
    assert spec.extra == {"scheduler_reserve_full_isl": True, "watermark": 0.0}
    assert (spec.num_blocks, spec.block_size, spec.max_model_len) == (64, 128, 2048)
    _, spec = engine_args.resolve({**CONFIG, "max_num_scheduled_tokens": 512}, {})
    assert spec.extra["max_num_scheduled_tokens"] == 512
    _, spec = engine_args.resolve(CONFIG, {"scheduling_policy": "priority"})
    assert spec.extra["policy"] == "priority"


def test_gpu_memory_utilization_moves_the_kv_blocks_by_memory_over_block_bytes():
    cfg = dict(CONFIG)
    cfg["num_kv_blocks"] = 20000
    # +0.05 of 12 GiB = 644,245,094 bytes = 4,915.2 blocks of 128 KiB: 4,915 more
    assert engine_args.kv_blocks_for_utilization(cfg, 0.35) == 20000 + 4915
    assert engine_args.kv_blocks_for_utilization(cfg, 0.25) == 20000 - 4916  # rounded down
    settings, spec = engine_args.resolve(cfg, {"gpu_memory_utilization": 0.35})
    assert settings["num_kv_blocks"] == spec.num_blocks == 24915 and settings["gpu_memory_utilization"] == 0.35
    with pytest.raises(SettingError, match="num_gpu_blocks_override=64, so vLLM ignored gpu_memory_utilization"):
        engine_args.kv_blocks_for_utilization({**cfg, "num_gpu_blocks_override": 64}, 0.4)
    with pytest.raises(SettingError, match="engine_config lacks device_memory_bytes"):
        engine_args.kv_blocks_for_utilization({k: v for k, v in cfg.items() if k != "device_memory_bytes"}, 0.4)
    with pytest.raises(SettingError, match="not both"):
        engine_args.resolve(cfg, {"gpu_memory_utilization": 0.4, "num_kv_blocks": 10})


@requires_vllm
@pytest.mark.parametrize("overrides,message", [
    ({"max_num_batched_tokens": 8}, "max_num_batched_tokens=8: vLLM: max_num_batched_tokens (8) must be greater than "
                                    "or equal to max_num_seqs (64)."),
    ({"max_num_seqs": 0}, "max_num_seqs=0: vLLM: max_num_seqs: Input should be greater than or equal to 1"),
    ({"num_kv_blocks": 16}, "num_kv_blocks=16 cannot hold one request of max_model_len 2048: vLLM needs 16 blocks of "
                            "128 tokens besides the reserved one and refuses to start (check_enough_kv_cache_memory); "
                            "this cache holds at most 1920 tokens"),
    ({"long_prefill_token_threshold": 4096}, "long_prefill_token_threshold=4096: vLLM: long_prefill_token_threshold "
                                             "(4096) cannot be greater than the max_model_len (2048)."),
])
def test_impossible_settings_get_vllms_own_message(overrides, message):
    _, spec = engine_args.resolve(CONFIG, overrides)
    with pytest.raises(SettingError) as e:
        engine_args.check(spec, overrides)
    assert str(e.value) == message


@requires_vllm
def test_a_setting_this_vllm_lacks_is_named():
    import vllm

    from vllm.config import SchedulerConfig

    if "max_num_partial_prefills" in SchedulerConfig.__dataclass_fields__:
        pytest.skip("this vLLM still accepts max_num_partial_prefills")
    _, spec = engine_args.resolve(CONFIG, {"max_num_partial_prefills": 2})
    with pytest.raises(SettingError) as e:
        engine_args.check(spec, {"max_num_partial_prefills": 2})
    assert str(e.value) == f"max_num_partial_prefills: you set it, but vLLM {vllm.__version__} here has no such setting"


# -- bad input through the command ------------------------------------------------------------


def _events_run(tmp: Path, events: list[dict]) -> Path:
    from vllm_probe.runs.rundir import write_meta

    tmp.mkdir()
    (tmp / "events-1.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    write_meta(tmp, {"command": ["x"]})
    return tmp


def test_a_run_without_request_events_names_the_flag(tmp_path):
    from tests._events import scenario_chunked

    s = scenario_chunked()
    s.events[0]["flags"] = {"log_request_events": False}
    events = [e for e in s.events if e["event"] not in ("request_added", "request_finished")]
    run = _events_run(tmp_path / "run", events)
    with pytest.raises(WorkloadError) as e:
        load_workload(run)
    assert str(e.value) == (f"{run}: no request_added events (scheduler_probe.log_request_events was off); "
                            "whatif needs them")
    r = run_cli("whatif", str(run), timeout=120)
    if r.returncode == 1 and "needs vLLM" in r.stderr:
        pytest.skip("vLLM is not installed")
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == f"vllm-probe: error: {e.value}"


def test_whatif_without_vllm_says_so_in_one_line(tmp_path):
    """In a process where ``import vllm`` fails, the reading commands (the trace export
    included) work and whatif says in one line that it needs vLLM."""
    import subprocess
    import sys

    from tests._events import scenario_chunked
    from tests.conftest import ROOT

    run = tmp_path / "run"
    scenario_chunked().write(run)
    no_vllm = ("import sys; sys.modules['vllm'] = None; from vllm_probe.cli import main; "
               "sys.exit(main(sys.argv[1:]))")

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", no_vllm, *args], capture_output=True, text=True, cwd=ROOT,
                              timeout=120)

    assert cli("summary", str(run)).returncode == 0
    assert cli("export", str(run), "--format", "trace", "-o", str(tmp_path / "t.jsonl")).returncode == 0
    r = cli("whatif", str(run), "--set", "max_num_seqs=8")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        "vllm-probe: error: whatif replays vLLM's own scheduler and needs vLLM installed in this environment "
        "(pip install vllm); summary, compare, tail and export work without it"]


def test_whatif_usage_errors(tmp_path):
    from vllm_probe.cli import main

    assert main(["whatif", "--trace", "t.jsonl"]) == 2
    assert main(["whatif", "--like", str(tmp_path)]) == 2
    assert main(["whatif", "--set", "max_num_seqs=0x"]) == 2
    assert main(["whatif", str(tmp_path), "--jobs", "0"]) == 2


# -- the timed trace ------------------------------------------------------------------------


def test_trace_lines_share_hash_ids_exactly_where_blocks_are_equal():
    from vllm_probe.exporters.trace import trace_entries

    cfg = {"hash_block_size": 128, "block_size": 128}
    reqs = [
        WorkloadRequest(order=0, req_id="a", prompt_len=300, max_tokens=9, output_tokens=9, arrival_ts=10.5,
                        finish_reason="length", block_digests=["d1", "d2"]),
        WorkloadRequest(order=1, req_id="b", prompt_len=260, max_tokens=20, output_tokens=7, arrival_ts=10.0,
                        finish_reason="stop", block_digests=["d1", "d3"]),
        WorkloadRequest(order=2, req_id="c", prompt_len=17, max_tokens=5, output_tokens=5, arrival_ts=11.0,
                        finish_reason="length"),
    ]
    entries, size = trace_entries(Workload("x", cfg, reqs))
    assert size == 16
    b, a, c = entries  # in arrival order
    assert [e["timestamp"] for e in entries] == [0.0, 0.5, 1.0]
    assert (a["input_length"], a["output_length"], b["output_length"]) == (300, 9, 7)
    assert len(a["hash_ids"]) == 19 and len(b["hash_ids"]) == 17 and len(c["hash_ids"]) == 2  # ceil(len / 16)
    assert a["hash_ids"][:8] == b["hash_ids"][:8] == list(range(8))  # d1: 8 ids of 16 tokens
    shared = set(a["hash_ids"]) & set(b["hash_ids"])
    assert shared == set(range(8))  # d2 / d3 and the tails are their own
    assert not set(c["hash_ids"]) & (set(a["hash_ids"]) | set(b["hash_ids"]))


def test_a_trace_read_back_is_the_same_workload(tmp_path):
    from vllm_probe.exporters.trace import TraceError, read_trace, trace_workload

    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 1500, "input_length": 600, "output_length": 30, "hash_ids": [4, 5]}\n\n'
                    '{"timestamp": 0, "input_length": 700, "output_length": 10, "hash_ids": [4, 6]}\n')
    like = hand_workload(n=2)
    w = trace_workload(path, like, hash_size=512, sec_multiplier=0.001)
    first, second = w.requests
    assert (first.prompt_len, first.arrival_ts - like.t0, second.arrival_ts - like.t0) == (700, 0.0, 1.5)
    assert first.block_digests == [4, 6] and w.block_tokens == 512
    assert (second.max_tokens, second.output_tokens, second.finish_reason) == (30, 30, "length")
    path.write_text('{"timestamp": 0, "input_length": 600}\n')
    with pytest.raises(TraceError, match=r"t.jsonl:1: output_length missing or not a number"):
        read_trace(path)


@requires_vllm
def test_trace_export_round_trip_replays_the_same_prefix_hits(tmp_path):
    """A run with shared prefixes exported as a timed trace and replayed with --trace
    --like: each request hits the prefix cache for the same tokens."""
    from vllm_probe.analysis.summary import summarize
    from vllm_probe.exporters.trace import TraceExporter
    from vllm_probe.runs.reader import ReadStats
    from vllm_probe.sim.whatif import predict

    from vllm_probe.sim.harness import SchedulerSpec

    w = hand_workload(n=10, gap_at=None)
    shared = [f"p{i}" for i in range(20)]
    for r in w.requests:  # 6 blocks of 16 shared by every prompt: digests as the probe would write them
        r.block_digests = shared[:6] + [f"{r.req_id}-{i}" for i in range(r.prompt_len // 16 - 6)]
    from vllm_probe.sim import replay as replay_mod

    run = tmp_path / "run"
    run.mkdir()
    from vllm_probe.engine.sink import EventSink
    from vllm_probe.runs.rundir import write_meta

    sink = EventSink(run / "events-1.jsonl")
    replay_mod.replay(w, SchedulerSpec(**SPEC, enable_prefix_caching=True), known_cost, sink, lag_s=0.0)
    sink.close()
    write_meta(run, {"command": ["x"]})
    recorded = load_workload(run)
    assert all(len(r.block_digests) == r.prompt_len // 16 for r in recorded.requests)
    TraceExporter().export(run, tmp_path / "trace.jsonl", None, ReadStats())
    lines = [json.loads(x) for x in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert [x["input_length"] for x in lines] == [r.prompt_len for r in w.requests]
    result = predict(run, [], out=tmp_path / "out", trace=tmp_path / "trace.jsonl")
    hits_recorded = summarize(run).chunking.prefix_hit_tokens
    assert hits_recorded > 0
    assert result.baseline.summary.chunking.prefix_hit_tokens == hits_recorded


def test_latest_run_skips_simulated_runs(tmp_path):
    from vllm_probe.runs.rundir import latest_run, write_meta

    (tmp_path / "real").mkdir()
    write_meta(tmp_path / "real", {"start_time": 1.0})
    (tmp_path / "real-whatif" / "baseline").mkdir(parents=True)
    write_meta(tmp_path / "real-whatif" / "baseline", {"start_time": 2.0, "simulated": True})
    assert latest_run(tmp_path) == tmp_path / "real"


@requires_vllm
def test_a_replay_puts_a_probe_installed_before_it_back():
    """A replay inside a process where the plugin's probe is installed (a script run
    under ``vllm-probe run``): its events go to the replay's sink, and the plugin's
    probe is back on the scheduler afterwards."""
    import vllm
    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_probe.engine import hooks, patches
    from vllm_probe.settings import ProbeFlags
    from vllm_probe.sim.harness import MemorySink, SchedulerSpec, make_request, make_scheduler, run_until_idle
    from vllm_probe.sim.replay import replay

    plugin_sink, replay_sink = MemorySink(), MemorySink()
    plugin = hooks.Runtime(ProbeFlags(), lambda _rt: plugin_sink)
    patches.install(Scheduler, plugin, vllm.__version__)
    try:
        replay(hand_workload(n=3, gap_at=None), SchedulerSpec(**SPEC), known_cost, replay_sink)
        assert len(replay_sink.of("request_finished")) == 3 and plugin_sink.events == []
        sched = make_scheduler(SchedulerSpec(**SPEC))
        sched.add_request(make_request(40, 3))
        run_until_idle(sched)
        assert len(plugin_sink.of("request_finished")) == 1
    finally:
        assert patches.uninstall(Scheduler) is plugin
