"""The overhead benchmark still runs: its micro part in quick mode (no engine, seconds).

Only that it produces rows is checked, not the timings (docs/performance.md has those).
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import requires_vllm


@requires_vllm
def test_micro_quick_produces_rows_and_leaves_scheduler_unpatched(capsys, tmp_path):
    from vllm.v1.core.sched.scheduler import Scheduler

    from benchmarks import bench_overhead
    from vllm_probe.engine import hooks as probe

    report = tmp_path / "bench.json"
    assert bench_overhead.main(["--quick", "--micro-only", "--json", str(report)]) == 0
    out = capsys.readouterr().out
    printed = [line.split()[:2] for line in out.splitlines() if line.startswith(("decode ", "prefill "))]
    assert printed == [["decode", "16"], ["prefill", "16"]]
    assert "memory bound: sink queue full (1000 events" in out

    rows = json.loads(report.read_text())["micro"]
    assert [r["case"] for r in rows] == ["decode 16", "prefill 16"]
    for r in rows:
        assert r["steps"] == 10
        assert r["sched_a"] > 0 and r["sched_b"] > 0 and r["step_a"] > 0 and r["writer"] >= 0
        assert r["events"] >= r["steps"] and r["dropped"] == 0  # a step event per probed step
    assert rows[1]["events"] > rows[1]["steps"]  # prefill mix: chunks and request events too
    assert getattr(Scheduler.schedule, probe.WRAPPED_ATTR, None) is None


def test_micro_and_e2e_only_exclude_each_other():
    from benchmarks import bench_overhead

    with pytest.raises(SystemExit) as e:
        bench_overhead.main(["--quick", "--micro-only", "--e2e-only"])
    assert e.value.code == 2


def test_metrics_benchmark_quick_prints_its_figures(capsys):
    from benchmarks import bench_metrics

    assert bench_metrics.main(["--quick"]) == 0
    out = capsys.readouterr().out
    for start in ("follower: 2,000 steps", "live, 1 engine", "scrape of a finished run, 8 engines' series",
                  "scrape CPU in the server",
                  "scrape while following 8",
                  "memory over 4,000 steps", "verdict:"):
        assert any(line.startswith(start) for line in out.splitlines()), (start, out)
@requires_vllm
def test_whatif_bench_quick_replays_at_8_running(capsys, tmp_path):
    """bench_whatif --quick: one replay-speed case in its own process, no engine."""
    from benchmarks import bench_whatif

    report = tmp_path / "whatif.json"
    assert bench_whatif.main(["--quick", "--json", str(report)]) == 0
    (row,) = json.loads(report.read_text())["speed"]
    assert row["running"] == 8 and row["steps"] == 200 and row["dropped"] == 0
    assert row["events"] >= row["steps"] and row["steps_per_cpu_s"] > 0 and row["peak_rss_mib"] > 0
    assert "steps/CPU-s" in capsys.readouterr().out


def test_closed_loop_plan_is_seeded_within_the_tiny_model_and_its_lengths():
    """server-closed sends the same requests in every run: lengths in range, ids below the vocabulary."""
    from benchmarks import bench_whatif, closed_loop
    from vllm_probe.sim.tiny_model import VOCAB_SIZE

    loop = closed_loop.ClosedLoop()
    plan = loop.plan()
    assert plan == closed_loop.ClosedLoop().plan() and len(plan) == 96
    assert all(64 <= len(p) <= 1200 and 16 <= m <= 200 and max(p) < VOCAB_SIZE for p, m in plan)
    assert len({p[0] for p, _ in plan}) == len(plan)  # no two prompts share a first token
    assert max(len(p) + m for p, m in plan) <= 2048  # --max-model-len
    args = bench_whatif._with(list(closed_loop.ENGINE_ARGS), {"num_kv_blocks": 32, "max_num_seqs": 4},
                              closed_loop.FLAGS)
    assert args[args.index("--num-gpu-blocks-override") + 1] == "32" and args.count("--max-num-seqs") == 1
    assert args[args.index("--max-num-seqs") + 1] == "4"


@pytest.mark.parametrize("argv", [["--workloads", "nope"], ["--settings", "0"], ["--settings", "x"],
                                  ["--requests", "0"], ["--think-ms", "-1"]])
def test_whatif_bench_refuses_bad_options(argv):
    from benchmarks import bench_whatif

    with pytest.raises(SystemExit) as e:
        bench_whatif.main(argv)
    assert e.value.code == 2


def test_closed_loop_client_keeps_n_in_flight_in_per_thread_order():
    """drive() against a stand-in server (stdlib HTTP, 20 ms per answer): every request once,
    thread k's in plan order k, k + N, ..., never more than N in flight, usage counted."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from benchmarks import closed_loop

    loop = closed_loop.ClosedLoop(threads=3, requests=9, think_s=0.01, max_tokens=(16, 20))
    plan = loop.plan()
    seen: list[tuple[int, int]] = []  # (first token id, thread's order) as answered
    state = {"in_flight": 0, "peak": 0}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                state["in_flight"] += 1
                state["peak"] = max(state["peak"], state["in_flight"])
            time.sleep(0.02)
            with lock:
                state["in_flight"] -= 1
                seen.append((body["prompt"][0], body["max_tokens"]))
            assert body["ignore_eos"] is True and body["model"] == "m"
            out = json.dumps({"usage": {"prompt_tokens": len(body["prompt"]),
                                        "completion_tokens": body["max_tokens"]}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        r = closed_loop.drive(f"http://127.0.0.1:{server.server_address[1]}", "m", loop)
    finally:
        server.shutdown()
    assert (r.ok, r.failed) == (9, 0) and r.output_tokens == sum(m for _, m in plan)
    assert r.prompt_tokens == sum(len(p) for p, _ in plan) and state["peak"] <= 3
    order = [p[0] for p, _ in plan]
    answered = [first for first, _ in seen]
    assert sorted(answered) == sorted(order)
    for k in range(3):  # each thread's requests answered in its plan order
        mine = order[k::3]
        assert [a for a in answered if a in mine] == mine
