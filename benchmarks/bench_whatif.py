"""How right and how fast ``vllm-probe whatif`` is: predictions against real runs, and replay speed.

    python -m benchmarks.bench_whatif                   # accuracy on 3 workloads + speed (~25 min here)
    python -m benchmarks.bench_whatif --speed-only      # replay speed at 8, 32, 256 running requests
    python -m benchmarks.bench_whatif --workloads timed # one workload's accuracy
    python -m benchmarks.bench_whatif --quick           # checks that it runs (speed at 8, tiny)

**Accuracy.** Per workload: record it on the real CPU engine (tiny model, ``vllm-probe
run``) at one setting; predict four others with :func:`vllm_probe.sim.whatif.predict`
(token budget halved and doubled, KV cache smaller and larger); run those four for real;
print each figure's relative error, prediction against measurement, and the baseline's
(the recorded settings replayed) against the recording. Workloads:

* ``burst``: ``examples/long_prompts.py`` as ``make demo`` runs it: 16 × 1,536-token
  prompts at once (an offline ``LLM.generate``), 256 output tokens each;
* ``timed``: ``examples/timed_arrivals.py``: 40 requests at Poisson times (4/s: below
  saturation), prompts 64–1,200 tokens, outputs 16–200 (``AsyncLLM``, the server's engine);
* ``prefix``: the same at 10/s (near saturation), 80 % of prompts behind one of three
  shared system prefixes (300 / 700 / 1,100 tokens), 30 % second turns, prefix caching on.

Each real run also reports how fast the machine ran during it: the median period of
its decode-only steps against the recording's (``speed``; 1.00: as fast, 0.65: its steps
took 1 / 0.65 as long). On this shared 2-core machine that ratio moves 0.6–1.6x between
runs, and every figure in seconds moves with it (with timed arrivals the scheduling
figures too: a slower engine batches more requests per step); the row "adjusted for
speed" is the same prediction with every step time scaled by 1 / speed
(``predict(step_time_scale=...)``), which separates the model's error from the
machine's drift as far as one median can measure it. ``burst``: whether the
measured run's requests reached the engine before the same steps as the recording's
(``same``) or not (``other``: an offline burst's arrival race; blank for timed arrivals).
docs/whatif.md discusses
what the errors mean.

**Speed.** vLLM's real scheduler with the probe writing a file, replaying N requests
(256-token prompts, long outputs, all running) in one process per N: replayed steps per
second of the process's CPU time (``time.process_time``: the replay and the sink's
writer thread, immune to waiting for a core: "per core") and of wall time, after the
prefill steps, and the process's peak resident memory; N = 32 twice, 2,000 and 8,000
steps, to show memory does not grow with the step count.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LONG = ROOT / "examples" / "long_prompts.py"
TIMED = ROOT / "examples" / "timed_arrivals.py"

#: name -> (example, its arguments, description, grid of four predictions)
WORKLOADS = {
    "burst": (LONG, [], "16 x 1,536-token prompts at once, 256 out; budget 1,024, KV 64 blocks",
              [{"max_num_batched_tokens": 512}, {"max_num_batched_tokens": 2048},
               {"num_kv_blocks": 48}, {"num_kv_blocks": 96}]),
    "timed": (TIMED, ["--rate", "4"], "40 requests, Poisson 4/s, prompts 64-1,200, out 16-200; budget 512, KV 64",
              [{"max_num_batched_tokens": 256}, {"max_num_batched_tokens": 1024},
               {"num_kv_blocks": 24}, {"num_kv_blocks": 128}]),
    "prefix": (TIMED, ["--rate", "10", "--enable-prefix-caching", "--prefix-groups", "300,700,1100",
                       "--second-turns", "0.3", "--num-kv-blocks", "48"],
               "40 requests, Poisson 10/s, 3 shared prefixes + 30 % second turns, prefix caching; budget 512, KV 48",
               [{"max_num_batched_tokens": 256}, {"max_num_batched_tokens": 1024},
                {"num_kv_blocks": 24}, {"num_kv_blocks": 96}]),
}
#: Scheduling figures (target: within 2 %, exact for bursts) and time figures (5 %), by
#: the labels of vllm_probe.analysis.compare.FIGURES, with their short column names.
SCHEDULING = (("steps", "steps"), ("preemptions", "preempt"), ("discarded tokens", "discard"),
              ("chunks/prompt mean", "chunks/p"))
TIMING = (("output tokens/s", "tok/s"), ("TTFT median", "TTFT med"), ("TTFT p90", "TTFT p90"))
#: CLI flag of each setting in the examples.
FLAGS = {"max_num_batched_tokens": "--max-num-batched-tokens", "num_kv_blocks": "--num-kv-blocks"}


def _record(run_dir: Path, example: Path, args: list[str]) -> None:
    cmd = [sys.executable, "-m", "vllm_probe", "run", "--out", str(run_dir), "--", sys.executable, str(example), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"bench_whatif: {' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")


def _with(args: list[str], overrides: dict) -> list[str]:
    args = list(args)
    for key, value in overrides.items():
        flag = FLAGS[key]
        if flag in args:
            args[args.index(flag) + 1] = str(value)
        else:
            args += [flag, str(value)]
    return args


def _rel(pred, real) -> str:
    if pred is None or real is None:
        return "-"
    if pred == real:
        return "="
    if not real:
        return f"{pred:+g}"
    return f"{(pred - real) / real * 100:+.1f}%"


def accuracy(name: str, parent: Path, jobs: int) -> dict:
    """Record, predict, measure one workload; print its table; return the numbers."""
    from vllm_probe.analysis.compare import FIGURE
    from vllm_probe.analysis.summary import summarize
    from vllm_probe.analysis.workload import load_workload
    from vllm_probe.sim.stepmodel import decode_period_s
    from vllm_probe.sim.whatif import predict

    example, args, text, grid = WORKLOADS[name]
    base_dir = parent / name / "recorded"
    print(f"\n[{time.strftime('%H:%M:%S')}] {name}: {text}", flush=True)
    _record(base_dir, example, args)
    t = time.perf_counter()
    result = predict(base_dir, grid, out=parent / name / "whatif", jobs=jobs)
    predict_s = time.perf_counter() - t
    real_dirs = []
    for overrides in grid:
        run = parent / name / ("measured-" + "-".join(f"{k}={v}" for k, v in overrides.items()))
        _record(run, example, _with(args, overrides))
        real_dirs.append(run)
    q = result.model.quality
    print(f"  model: {len(result.model.terms)} terms, R² {q.r2:.2f} ({q.r2_trimmed:.2f} trimmed), per-step error "
          f"median {q.median_abs_ms:.2f} ms, p90 {q.p90_abs_ms:.2f} ms; predict() {predict_s:.0f} s for 5 replays")
    figures = SCHEDULING + (("prefix-hit tokens", "hits"),) + TIMING if name == "prefix" else SCHEDULING + TIMING
    head = f"  {'setting':28s}" + "".join(f"{short:>10s}" for _, short in figures) + f"{'speed':>8s}  burst"
    print(head)
    rec_speed = decode_period_s(load_workload(base_dir))

    def value(summary, label):
        if label == "prefix-hit tokens":
            return summary.chunking.prefix_hit_tokens
        return FIGURE[label].get(summary)

    recorded = summarize(base_dir)
    rows = []
    cells = [_rel(value(result.baseline.summary, label), value(recorded, label)) for label, _ in figures]
    print(f"  {'baseline (self-replay)':28s}" + "".join(f"{c:>10s}" for c in cells) + f"{'1.00':>8s}")
    rows.append({"setting": "baseline", "errors": dict(zip([f for f, _ in figures], cells))})
    recorded_w = load_workload(base_dir)
    pattern = [r.add_before_step for r in recorded_w.requests]
    is_burst = sum(r.anchored for r in recorded_w.requests) > 1  # arrivals by step: the race matters
    for config, run in zip(result.configs, real_dirs):
        real = summarize(run)
        cells = [_rel(value(config.summary, label), value(real, label)) for label, _ in figures]
        speed = decode_period_s(load_workload(run))
        ratio = rec_speed / speed if rec_speed and speed else None
        same_burst = [r.add_before_step for r in load_workload(run).requests] == pattern if is_burst else None
        label = ",".join(f"{k}={v}" for k, v in config.overrides.items())
        burst = "" if same_burst is None else ("same" if same_burst else "other")
        print(f"  {label:28s}" + "".join(f"{c:>10s}" for c in cells)
              + f"{(f'{ratio:.2f}' if ratio else '-'):>8s}  {burst}", flush=True)
        adjusted = {}
        if ratio:  # the same prediction on a machine as fast as during the measured run
            again = predict(base_dir, [config.overrides], out=parent / name / "whatif-adjusted",
                            step_time_scale=1 / ratio).configs[0].summary
            adjusted = {f: _rel(value(again, f), value(real, f)) for f, _ in figures}
            print(f"  {'  adjusted for speed':28s}" + "".join(
                f"{adjusted.get(f, ''):>10s}" for f, _ in figures), flush=True)
        rows.append({"setting": label, "errors": dict(zip([f for f, _ in figures], cells)), "speed": ratio,
                     "same_burst": same_burst, "speed_adjusted_errors": adjusted,
                     "predicted": {f: value(config.summary, f) for f, _ in figures},
                     "measured": {f: value(real, f) for f, _ in figures}})
    return {"workload": name, "description": text, "rows": rows,
            "model": result.model.to_dict(), "baseline_within": result.error["within"]}


def speed_one(n: int, steps: int) -> dict:
    """Replay speed at ``n`` running requests over ``steps`` steps (one process)."""
    from vllm_probe.analysis.workload import Workload, WorkloadRequest
    from vllm_probe.engine.sink import EventSink
    from vllm_probe.sim.harness import SchedulerSpec
    from vllm_probe.sim.replay import replay

    reqs = [WorkloadRequest(order=i, req_id=f"r{i}", prompt_len=256, max_tokens=100_000, output_tokens=100_000,
                            arrival_ts=1000.0, added_ts=1000.0, finish_reason="length") for i in range(n)]
    w = Workload("synthetic", {"scheduler_class": "Scheduler"}, reqs)
    spec = SchedulerSpec(max_num_batched_tokens=max(8192, n * 256), max_num_seqs=n, num_blocks=n * 900 + 8,
                         block_size=128, max_model_len=110_000)
    skip = 10  # the prefill steps: the clocks start after them
    start: list[float] = []
    calls = [0]

    def step_time(features) -> float:
        calls[0] += 1
        if calls[0] == skip:
            start.extend((time.process_time(), time.perf_counter()))
        return 0.005

    with tempfile.TemporaryDirectory() as d:
        sink = EventSink(Path(d) / "events-bench.jsonl", capacity=1 << 20)
        stats = replay(w, spec, step_time, sink, max_steps=steps, lag_s=0.0)
        cpu, wall = time.process_time() - start[0], time.perf_counter() - start[1]
        sink.close()
        written, dropped = sink.written, sink.dropped
    return {"running": n, "steps": stats.steps, "steps_per_cpu_s": (stats.steps - skip) / cpu,
            "steps_per_wall_s": (stats.steps - skip) / wall,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "events": written, "dropped": dropped}


def speed(cases: list[tuple[int, int]]) -> list[dict]:
    print("\nreplay speed: vLLM's Scheduler + the probe writing a file, one process per case", flush=True)
    print(f"  {'running':>8s} {'steps':>7s} {'steps/CPU-s':>12s} {'steps/wall-s':>13s} {'peak RSS':>10s}")
    rows = []
    for n, steps in cases:
        proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_whatif", "--speed-one", f"{n},{steps}"],
                              capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        line = [x for x in proc.stdout.splitlines() if x.startswith("{")]
        if proc.returncode != 0 or not line:
            sys.exit(f"bench_whatif: speed case {n} failed:\n{proc.stderr[-3000:]}")
        r = json.loads(line[-1])
        rows.append(r)
        print(f"  {r['running']:8d} {r['steps']:7d} {r['steps_per_cpu_s']:12,.0f} {r['steps_per_wall_s']:13,.0f} "
              f"{r['peak_rss_mib']:7.0f} MiB", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="only check that it runs (speed at 8, 200 steps)")
    p.add_argument("--speed-only", action="store_true")
    p.add_argument("--workloads", default="burst,timed,prefix", help="comma list of " + ", ".join(WORKLOADS))
    p.add_argument("--jobs", type=int, default=2, help="predict()'s processes (default 2)")
    p.add_argument("--out", type=Path, help="where runs go (default: a temporary directory)")
    p.add_argument("--json", type=Path, help="also write the results as JSON here")
    p.add_argument("--speed-one", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    logging.getLogger("vllm").setLevel(logging.ERROR)  # its backend warnings, in every replay
    if args.speed_one:
        n, steps = (int(x) for x in args.speed_one.split(","))
        print(json.dumps(speed_one(n, steps)))
        return 0
    print(f"machine: {os.cpu_count()} cores; load avg {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    report: dict = {}
    if args.quick:
        report["speed"] = speed([(8, 200)])
    else:
        if not args.speed_only:
            parent = args.out or Path(tempfile.mkdtemp(prefix="bench-whatif-"))
            report["accuracy"] = [accuracy(name, parent, args.jobs) for name in args.workloads.split(",") if name]
        report["speed"] = speed([(8, 3000), (32, 2000), (32, 8000), (256, 600)])
    print(f"\nload avg at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
