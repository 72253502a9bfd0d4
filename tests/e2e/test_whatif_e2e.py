"""``vllm-probe whatif`` on real engine runs of the tiny model (the session's shared runs:
``quick_run``, the 1,024-budget run of tests/e2e/test_compare_e2e.py, plus a run with a
larger KV cache and a prefix-caching run).

Offline bursts replay exactly: the recorded chunk boundaries and preemptions come back
step for step, at the recorded settings and at others, given the burst's arrival
pattern (``LLM.generate`` races its engine core: usually one request comes before
step 0 and the rest before step 1, docs/whatif.md).
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import QUICK_WORKLOAD, requires_vllm, run_cli
from tests.e2e.test_compare_e2e import LARGE_BUDGET, with_budget
from vllm_probe.analysis.objectives import measure
from vllm_probe.analysis.summary import summarize
from vllm_probe.analysis.workload import load_workload

pytestmark = [requires_vllm, pytest.mark.engine, pytest.mark.slow]

#: QUICK_WORKLOAD with 30 KV blocks instead of 20.
MORE_KV = "30"
#: Eight 600-token prompts that share their first 300 tokens (two full KV blocks of 128),
#: prefix caching on, a KV cache small enough to evict cached blocks.
PREFIX_WORKLOAD = ["--num-prompts", "8", "--prompt-tokens", "600", "--max-tokens", "40",
                   "--num-kv-blocks", "20", "--max-num-batched-tokens", "256", "--max-model-len", "1024",
                   "--enable-prefix-caching", "--shared-prefix-tokens", "300"]


def with_kv(blocks: str) -> list[str]:
    args = list(QUICK_WORKLOAD)
    args[args.index("--num-kv-blocks") + 1] = blocks
    return args


def schedule(run_dir) -> tuple[list[tuple], list[tuple]]:
    """Chunks ``(step, request order, chunk_index, start, end)`` and preemptions ``(step,
    request order, discarded tokens)`` of a run: its ids and times aside."""
    w = load_workload(run_dir)
    return ([(c.step, c.order, c.chunk_index, c.start, c.end) for c in w.chunks],
            [(p.step, p.order, p.discarded_tokens) for p in w.preempts])


def burst_pattern(run_dir) -> list[int]:
    return [r.add_before_step for r in load_workload(run_dir).requests]


def test_offline_burst_replays_identically_and_reads_as_a_run(quick_run, tmp_path):
    """The issue's exactness test, through the command a user runs; then every reading
    command on the simulated run."""
    out = tmp_path / "whatif"
    r = run_cli("whatif", str(quick_run), "--out", str(out), "--json", timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads(r.stdout)  # exactly one JSON object
    assert set(data) >= {"source", "model", "baseline", "configs"} and data["configs"] == []
    baseline = out / "baseline"
    assert data["baseline"]["run_dir"] == str(baseline) and data["source"] == str(quick_run)
    rec_chunks, rec_preempts = schedule(quick_run)
    sim_chunks, sim_preempts = schedule(baseline)
    assert len(rec_chunks) == 38 and len(rec_preempts) == 4  # conftest: QUICK_WORKLOAD's measured schedule
    assert sim_chunks == rec_chunks
    assert sim_preempts == rec_preempts
    errors = data["baseline"]["error"]["figures"]
    for label in ("steps", "preemptions", "chunks_per_prompt_mean"):
        assert errors[label]["value"] == errors[label]["reference"], label
    summary_json = json.loads(run_cli("summary", str(baseline), "--json").stdout)
    assert data["baseline"]["summary"] == summary_json
    meta = json.loads((baseline / "meta.json").read_text())
    assert meta["simulated"] is True and meta["source"] == str(quick_run) and meta["overrides"] == {}
    q = data["model"]["quality"]
    assert 0 < q["median_abs_ms"] <= q["p90_abs_ms"] and q["steps"] > 900

    # an ordinary run directory: every reading command reads it unchanged
    assert run_cli("compare", str(quick_run), str(baseline)).returncode == 0
    tail = run_cli("tail", "--plain", str(baseline), timeout=120)
    assert tail.returncode == 0 and tail.stdout.strip()
    export = run_cli("export", str(baseline), "--format", "perfetto", "-o", str(tmp_path / "t.json"))
    assert export.returncode == 0 and json.loads((tmp_path / "t.json").read_text())["traceEvents"]

    # the table: the baseline's error comes before any prediction
    r = run_cli("whatif", str(quick_run), "--out", str(out), "--set", "max_num_seqs=4", timeout=600,
                env={**__import__("os").environ, "COLUMNS": "160"})
    assert r.returncode == 0, r.stderr[-2000:]
    text = r.stdout
    assert text.index("Baseline") < text.index("Predicted") and "max_num_seqs" in text


def test_prefix_cache_hits_replay_per_request(probe_run, tmp_path):
    """Prompts rebuilt from the block digests hit the prefix cache for the same tokens as
    recorded, request by request; without the digests they would not."""
    from vllm_probe.sim.whatif import predict

    run = probe_run(*PREFIX_WORKLOAD)
    w = load_workload(run)
    assert w.has_digests and all(len(r.block_digests) == 600 // 128 for r in w.requests)
    assert len({r.block_digests[0] for r in w.requests}) == 1  # the shared 300 tokens: 2 equal blocks
    assert len({r.block_digests[2] for r in w.requests}) == len(w.requests)

    def hits(run_dir) -> dict[int, int]:
        wl = load_workload(run_dir)
        return {c.order: c.start for c in wl.chunks if c.chunk_index == 0 and not c.resumed
                and c.order not in {p.order for p in wl.preempts if p.step < c.step}}

    recorded = hits(run)
    assert sum(recorded.values()) > 0
    result = predict(run, [], out=tmp_path / "out")
    assert hits(result.baseline.run_dir) == recorded
    assert schedule(result.baseline.run_dir) == schedule(run)
    assert result.baseline.summary.chunking.prefix_hit_tokens == summarize(run).chunking.prefix_hit_tokens

    # the same run without its digests: no prompt shares a block, no hit
    from vllm_probe.engine.sink import EventSink
    from vllm_probe.sim import engine_args
    from vllm_probe.sim.replay import replay
    from vllm_probe.sim.stepmodel import fit

    for r in w.requests:
        r.block_digests = None
    _, spec = engine_args.resolve(w.config, {})
    (tmp_path / "plain").mkdir()
    sink = EventSink(tmp_path / "plain" / "events-1.jsonl")
    replay(w, spec, fit(w).predict, sink)
    sink.close()
    assert sum(hits(tmp_path / "plain").values()) == 0

    # the timed trace of the run: one line per request, the shared blocks as shared ids
    export = run_cli("export", str(run), "--format", "trace", "-o", str(tmp_path / "trace.jsonl"))
    assert export.returncode == 0, export.stderr
    lines = [json.loads(x) for x in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert len(lines) == 8 and all(x["input_length"] == 600 and x["output_length"] == 40 for x in lines)
    assert all(x["hash_ids"][:16] == list(range(16)) for x in lines)  # 2 blocks of 128 = 16 ids of 16 tokens
    assert len(set().union(*(x["hash_ids"][16:] for x in lines))) == sum(len(x["hash_ids"]) - 16 for x in lines)


def test_predictions_move_as_measured(quick_run, probe_run, tmp_path):
    """More KV blocks → fewer preemptions, a larger budget → fewer chunks, as real runs at
    those settings measured; and exactly their schedule when the burst arrived alike."""
    from vllm_probe.sim.whatif import predict

    larger_budget = probe_run(*with_budget(LARGE_BUDGET))
    more_kv = probe_run(*with_kv(MORE_KV))
    result = predict(quick_run, [{"max_num_batched_tokens": int(LARGE_BUDGET)}, {"num_kv_blocks": int(MORE_KV)}],
                     out=tmp_path / "out", jobs=2)
    base = result.baseline.summary
    budget, kv = (c.summary for c in result.configs)
    measured = {"base": summarize(quick_run), "budget": summarize(larger_budget), "kv": summarize(more_kv)}
    assert base.chunking.chunks_per_prompt.mean > budget.chunking.chunks_per_prompt.mean
    assert (measured["base"].chunking.chunks_per_prompt.mean
            > measured["budget"].chunking.chunks_per_prompt.mean)
    assert base.preemptions.count > kv.preemptions.count
    assert measured["base"].preemptions.count > measured["kv"].preemptions.count
    for config, real in ((result.configs[0], larger_budget), (result.configs[1], more_kv)):
        if burst_pattern(real) == burst_pattern(quick_run):
            assert schedule(config.run_dir) == schedule(real), config.overrides


def test_with_the_recorded_step_times_the_replay_keeps_the_recorded_clock(quick_run):
    """An oracle in place of the model (each step lasts what the recorded one did): every
    simulated step starts when the recorded one did, so all remaining error in seconds is
    the step-time model's."""
    import math

    from vllm_probe.sim import engine_args
    from vllm_probe.sim.harness import MemorySink
    from vllm_probe.sim.replay import replay
    from vllm_probe.sim.stepmodel import fit, recorded_features

    w = load_workload(quick_run)
    _, periods = recorded_features(w)
    period = {s.step: p for s, p in zip(w.steps, periods) if not math.isnan(p)}
    model = fit(w)
    calls = iter(range(1 << 30))

    def oracle(features):
        return period.get(next(calls)) or model.predict(features)

    class StepTimes(MemorySink):
        """Keeps each step event's ``ts`` (the MemorySink keeps fields only)."""

        def __init__(self) -> None:
            super().__init__()
            self.times: list[float] = []

        def emit(self, kind, ts, engine, values) -> None:
            if kind.name == "step":
                self.times.append(ts)
            super().emit(kind, ts, engine, values)

    _, spec = engine_args.resolve(w.config, {})
    sink = StepTimes()
    replay(w, spec, oracle, sink)
    assert len(sink.times) == len(w.steps)
    # a simulated step's ts is its start (the clock stands still in schedule()); up to the
    # step that finished the last request (no period after it: the engine went idle)
    known = next(i for i, p in enumerate(periods) if math.isnan(p)) + 1
    assert known >= len(w.steps) - 1
    assert max(abs(t - s.start) for t, s in zip(sink.times[:known], w.steps[:known])) < 1e-5



def test_doctor_whatif_predicts_each_remedy_by_a_real_replay(quick_run, tmp_path):
    """``doctor --whatif`` on a real run: each remedy's settings go through vLLM's own
    scheduler (no stand-in), the predicted figures are those of the replayed run
    directories, and the baseline replay's step figures match the recording exactly."""
    out = tmp_path / "remedies"
    r = run_cli("doctor", str(quick_run), "--whatif", "--json", "--out", str(out), timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    findings = {f["id"]: f for f in json.loads(r.stdout)["findings"]}
    assert {"preemption-storm", "kv-bound"} <= set(findings)
    for f in findings.values():
        p = f.get("predicted")
        if not p:
            continue
        assert p["settings"] == f["remedy"]["whatif"]
        err = p["baseline_error"]
        assert err["figures"]["steps"] == 0 and err["figures"]["preemptions"] == 0
        replayed = summarize(p["run_dir"])
        assert json.loads((out / p["run_dir"].rsplit("/", 1)[1] / "meta.json").read_text())["simulated"] is True
        assert p["figures"]["preemptions"]["predicted"] == replayed.preemptions.count, f["id"]
        # every figure predicted is the replayed run directory's own (objectives' names)
        figs = {n: fig["predicted"] for n, fig in p["figures"].items() if " (" not in n}  # not a subset goal
        assert figs == measure(p["run_dir"], figs), f["id"]
    storm = findings["preemption-storm"]["predicted"]
    assert storm["figures"]["preemptions"]["recorded"] == 4
    assert storm["resolved"] is (storm["figures"]["preemptions"]["predicted"] == 0)
    # the kv-bound remedy is the smallest change whose replay cuts the queue-time p90 by 30 %
    # (its goal), no longer the arithmetic's cache for every request at full length, which
    # the search starts from: 8 requests × 8 blocks + 1
    kv = findings["kv-bound"]
    assert kv["remedy"]["began_at"]["whatif"] == {"num_kv_blocks": 65}
    # its goal is over the requests that waited in the limit's steps: the figure is labelled with their count
    waited = kv["predicted"]["goal"]["requests"]
    assert waited
    q = kv["predicted"]["figures"][f"queue_p90 ({len(waited)} requests)"]
    assert q["predicted"] <= 0.7 * kv["predicted"]["baseline"] and q["predicted"] < q["recorded"]
    assert q["recorded"] == measure(quick_run, ["queue_p90"], requests=waited)["queue_p90"]
