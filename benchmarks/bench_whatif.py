"""How right and how fast ``vllm-probe whatif`` is: predictions against real runs, and replay speed.

    python -m benchmarks.bench_whatif                   # accuracy on 6 workloads + speed (the first 5: ~60 min here)
    python -m benchmarks.bench_whatif --workloads light --profile P.json   # reuse a calibrated profile
    python -m benchmarks.bench_whatif --speed-only      # replay speed at 8, 32, 256 running requests
    python -m benchmarks.bench_whatif --workloads light --no-speed   # one workload's accuracy
    python -m benchmarks.bench_whatif --workloads server-closed --requests 24 --settings 5 --no-speed
                                                        # a smaller check: 24 requests, max_num_seqs ÷ 4 only
    python -m benchmarks.bench_whatif --quick           # checks that it runs (speed at 8, tiny)

**Accuracy.** Per workload: record it on the real CPU engine (tiny model, ``vllm-probe
run``) at one setting; predict five others with :func:`vllm_probe.sim.whatif.predict`
(token budget ×¼ and ×4, KV blocks ×½ and ×2, ``max_num_seqs`` ÷ 4), once with a
calibrated step-time profile (``vllm-probe calibrate``, once per session, or
``--profile FILE``) and once with the recording-only model (``profile=False``); run the
five for real; print each figure's relative error, prediction against measurement, the
profile's row above the recording-only one, and the baseline's (the recorded settings
replayed) against the recording. Targets (issue 18): TTFT p50/p90 within 10 % (or 3 ms
where TTFT is a few ms), throughput and duration within 5 %, steps within 2 %.
Workloads (``examples/timed_arrivals.py``, ``AsyncLLM``: the server's engine, mixed
lengths: prompts 64–1,200 tokens, outputs 16–200, Poisson arrivals; then an offline burst
and a real server):

* ``light``: 40 requests at 4/s (below saturation on any machine here);
* ``saturated``: 96 requests at 32/s (saturates a quiet machine too, design.md §7);
* ``prefix-light`` / ``prefix-saturated``: the same, 80 % of prompts behind one of three
  shared system prefixes (300 / 700 / 1,100 tokens), 30 % second turns, prefix caching on;
* ``burst``: ``examples/long_prompts.py`` as ``make demo`` runs it: 16 × 1,536-token
  prompts at once (an offline ``LLM.generate``), 256 output tokens each.
* ``server-closed``: vLLM's OpenAI server (``benchmarks/closed_loop.py``: the tiny model,
  budget 512, KV 64 blocks, ``max_num_seqs`` 16, prefix caching off) under a closed-loop
  client, as ``vllm bench serve --max-concurrency 8`` drives one: 8 client threads, each
  sending its next completion (prompt token ids of 64–1,200 tokens, 16–200 output tokens,
  ``ignore_eos``; one seed, the same per-thread order in every run) 50 ms after its previous
  one was answered (``--think-ms``), 96 requests (``--requests N``); the server stopped
  with SIGTERM after the last answer. Each setting's real run is a server started at that
  setting with the same client. :func:`~vllm_probe.sim.whatif.predict` is left to detect
  the closed loop by itself (:mod:`vllm_probe.sim.arrivals`); the line ``arrivals: ...``
  says which model the replays used, and a warning follows when it is not the closed
  loop (the detector reads the gap from the latest finish to each arrival: finishes
  closer together than think time + the client's turn-around hide the loop).

``--settings 1,5`` keeps those of the five predictions (1-based, in the order above);
``--no-speed`` leaves the replay-speed part out.

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
#: The example of a workload recorded as a server under a closed-loop client
#: (benchmarks/closed_loop.py) instead of an example script.
SERVER = None

#: The five predictions of a recording at budget B, KV blocks K and max_num_seqs S.
def _grid(budget: int, blocks: int, seqs: int) -> list[dict]:
    return [{"max_num_batched_tokens": budget // 4}, {"max_num_batched_tokens": budget * 4},
            {"num_kv_blocks": blocks // 2}, {"num_kv_blocks": blocks * 2}, {"max_num_seqs": max(1, seqs // 4)}]


_PREFIX = ["--enable-prefix-caching", "--prefix-groups", "300,700,1100", "--second-turns", "0.3"]
#: name -> (example, its arguments, description, grid of predictions)
WORKLOADS = {
    "light": (TIMED, ["--rate", "4", "--max-num-seqs", "16"],
              "40 requests, Poisson 4/s, prompts 64-1,200, out 16-200; budget 512, KV 64, seqs 16",
              _grid(512, 64, 16)),
    "saturated": (TIMED, ["--num-requests", "96", "--rate", "32", "--max-num-seqs", "16"],
                  "96 requests, Poisson 32/s, prompts 64-1,200, out 16-200; budget 512, KV 64, seqs 16",
                  _grid(512, 64, 16)),
    "prefix-light": (TIMED, ["--rate", "4", "--max-num-seqs", "16", "--num-kv-blocks", "48", *_PREFIX],
                     "40 requests, Poisson 4/s, 3 shared prefixes + 30 % second turns, prefix caching; budget 512, "
                     "KV 48, seqs 16", _grid(512, 48, 16)),
    "prefix-saturated": (TIMED, ["--num-requests", "96", "--rate", "32", "--max-num-seqs", "16", "--num-kv-blocks",
                                 "48", *_PREFIX],
                         "96 requests, Poisson 32/s, 3 shared prefixes + 30 % second turns, prefix caching; budget "
                         "512, KV 48, seqs 16", _grid(512, 48, 16)),
    "burst": (LONG, [], "16 x 1,536-token prompts at once, 256 out; budget 1,024, KV 64 blocks, seqs 16",
              _grid(1024, 64, 16)),
    # its args: the server's engine arguments, closed_loop.ENGINE_ARGS (accuracy() fills them in)
    "server-closed": (SERVER, [], "OpenAI server, closed loop: 8 client threads, 50 ms think time, 96 requests, "
                                  "prompts 64-1,200, out 16-200; budget 512, KV 64, seqs 16", _grid(512, 64, 16)),
}
#: Scheduling figures (target: within 2 %, exact for bursts) and time figures (5 %), by
#: the labels of vllm_probe.analysis.compare.FIGURES, with their short column names.
SCHEDULING = (("steps", "steps"), ("preemptions", "preempt"), ("discarded tokens", "discard"),
              ("chunks/prompt mean", "chunks/p"))
TIMING = (("output tokens/s", "tok/s"), ("TTFT median", "TTFT med"), ("TTFT p90", "TTFT p90"))
#: CLI flag of each setting in the examples.
FLAGS = {"max_num_batched_tokens": "--max-num-batched-tokens", "num_kv_blocks": "--num-kv-blocks",
         "max_num_seqs": "--max-num-seqs"}


def _record(run_dir: Path, example: Path | None, args: list[str], requests: int | None = None,
            think_ms: float | None = None) -> None:
    """Record one run into ``run_dir``: ``example`` with ``args`` under ``vllm-probe run``, or
    (``example`` is :data:`SERVER`) the server with engine arguments ``args`` under a
    closed-loop client of ``requests`` requests and ``think_ms`` milliseconds of think time
    (None: the client's defaults, 96 and 50)."""
    if example is SERVER:
        from benchmarks import closed_loop

        loop = closed_loop.ClosedLoop()
        loop.requests = loop.requests if requests is None else requests
        loop.think_s = loop.think_s if think_ms is None else think_ms / 1e3
        try:
            r = closed_loop.record(run_dir, args, loop, run_dir.parent / f"{run_dir.name}.server.log")
        except RuntimeError as e:
            sys.exit(f"bench_whatif: the server run {run_dir} failed: {e}")
        print(f"  recorded {run_dir.name}: {r.ok} requests, {r.output_tokens:,} output tokens in "
              f"{r.elapsed_s:.1f} s", flush=True)
        return
    cmd = [sys.executable, "-m", "vllm_probe", "run", "--out", str(run_dir), "--", sys.executable, str(example), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"bench_whatif: {' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")


def _with(args: list[str], overrides: dict, flags: dict[str, str] = FLAGS) -> list[str]:
    """``args`` with each setting of ``overrides`` set through its flag in ``flags``."""
    args = list(args)
    for key, value in overrides.items():
        flag = flags[key]
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


def calibrated(like: Path, out: Path, max_seconds: float) -> Path:
    """A profile of ``like``'s engine (``vllm-probe calibrate``), timed."""
    t = time.perf_counter()
    cmd = [sys.executable, "-m", "vllm_probe", "calibrate", "--like", str(like), "--out", str(out),
           "--max-seconds", str(max_seconds)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"bench_whatif: {' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    print(f"  calibrate: {time.perf_counter() - t:.0f} s, load avg {os.getloadavg()[0]:.1f}: "
          f"{proc.stderr.strip().splitlines()[-1]}", flush=True)
    return out


def accuracy(name: str, parent: Path, jobs: int, profile: Path | None, max_seconds: float,
             requests: int | None = None, settings: list[int] | None = None,
             think_ms: float | None = None) -> tuple[dict, Path]:
    """Record, predict (with the profile and without), measure one workload; print its
    table; return the numbers and the profile used (calibrated here when None).
    ``requests``, ``think_ms``: the closed-loop client's request count and think time in
    milliseconds (``server-closed`` only; None: 96 and 50);
    ``settings``: 1-based indexes of the grid's predictions to keep (None: all five)."""
    from vllm_probe.analysis.compare import FIGURE
    from vllm_probe.analysis.summary import summarize
    from vllm_probe.analysis.workload import load_workload
    from vllm_probe.sim.stepmodel import decode_period_s
    from vllm_probe.sim.whatif import predict

    example, args, text, grid = WORKLOADS[name]
    flags = FLAGS
    if example is SERVER:
        from benchmarks import closed_loop

        args, flags = list(closed_loop.ENGINE_ARGS), closed_loop.FLAGS
        if requests is not None:
            text = text.replace("96 requests", f"{requests} requests")
        if think_ms is not None:
            text = text.replace("50 ms think time", f"{think_ms:g} ms think time")
    if settings is not None:
        grid = [grid[i - 1] for i in settings]
    base_dir = parent / name / "recorded"
    print(f"\n[{time.strftime('%H:%M:%S')}] {name}: {text}; load avg {os.getloadavg()[0]:.1f}", flush=True)
    _record(base_dir, example, args, requests, think_ms)
    if profile is None:
        profile = calibrated(base_dir, parent / "profile.json", max_seconds)
    t = time.perf_counter()
    with_profile = predict(base_dir, grid, out=parent / name / "whatif-profile", jobs=jobs, profile=profile,
                           force=True)
    recording_only = predict(base_dir, grid, out=parent / name / "whatif-recording", jobs=jobs, profile=False)
    predict_s = time.perf_counter() - t
    real_dirs = []
    for overrides in grid:
        run = parent / name / ("measured-" + "-".join(f"{k}={v}" for k, v in overrides.items()))
        _record(run, example, _with(args, overrides, flags), requests, think_ms)
        real_dirs.append(run)
    for tag, result in (("profile", with_profile), ("recording-only", recording_only)):
        q = result.model.quality
        print(f"  {tag} model: {len(result.model.terms)} terms, R² {q.r2:.2f}, per-step error median "
              f"{q.median_abs_ms:.2f} ms, p90 {q.p90_abs_ms:.2f} ms", flush=True)
    print(f"  predict(): {predict_s:.0f} s for 2 × {len(grid) + 1} replays; {with_profile.arrivals.describe()}")
    if example is SERVER and (with_profile.arrivals is None or with_profile.arrivals.kind != "closed"):
        print("  warning: the closed loop was not detected; the replays used the model above", flush=True)
    figures = SCHEDULING + (("prefix-hit tokens", "hits"),) + TIMING if name.startswith("prefix") else (
        SCHEDULING + TIMING)
    head = f"  {'setting':34s}" + "".join(f"{short:>10s}" for _, short in figures) + f"{'speed':>8s}{'outside':>9s}"
    print(head)
    rec_speed = decode_period_s(load_workload(base_dir))

    def value(summary, label):
        if label == "prefix-hit tokens":
            return summary.chunking.prefix_hit_tokens
        return FIGURE[label].get(summary)

    recorded = summarize(base_dir)
    rows = []
    for tag, result in (("profile", with_profile), ("rec-only", recording_only)):
        cells = [_rel(value(result.baseline.summary, label), value(recorded, label)) for label, _ in figures]
        print(f"  {'baseline (self-replay) ' + tag:34s}" + "".join(f"{c:>10s}" for c in cells) + f"{'1.00':>8s}")
        rows.append({"setting": "baseline", "model": tag, "errors": dict(zip([f for f, _ in figures], cells))})
    for k, run in enumerate(real_dirs):
        real = summarize(run)
        speed = decode_period_s(load_workload(run))
        ratio = rec_speed / speed if rec_speed and speed else None
        for tag, result in (("profile", with_profile), ("rec-only", recording_only)):
            config = result.configs[k]
            cells = [_rel(value(config.summary, label), value(real, label)) for label, _ in figures]
            label = ",".join(f"{k2}={v}" for k2, v in config.overrides.items()) + " " + tag
            out_share = config.replay.get("outside_region")
            print(f"  {label:34s}" + "".join(f"{c:>10s}" for c in cells)
                  + f"{(f'{ratio:.2f}' if ratio else '-'):>8s}"
                  + f"{(f'{out_share * 100:.0f}%' if out_share is not None else '-'):>9s}", flush=True)
            rows.append({"setting": label, "model": tag, "errors": dict(zip([f for f, _ in figures], cells)),
                         "speed": ratio, "outside_region": out_share,
                         "predicted": {f: value(config.summary, f) for f, _ in figures},
                         "measured": {f: value(real, f) for f, _ in figures}})
    arrivals = with_profile.arrivals.to_dict() if with_profile.arrivals else None
    return {"workload": name, "description": text, "rows": rows, "load_avg": os.getloadavg()[0], "arrivals": arrivals,
            "model": with_profile.model.to_dict(), "baseline_within": with_profile.error["within"]}, profile


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
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma list of " + ", ".join(WORKLOADS))
    p.add_argument("--profile", type=Path, help="a calibrated profile to use (default: calibrate on the first "
                                                "workload's recording)")
    p.add_argument("--calibrate-seconds", type=float, default=120, help="calibrate's --max-seconds")
    p.add_argument("--jobs", type=int, default=2, help="predict()'s processes (default 2)")
    p.add_argument("--out", type=Path, help="where runs go (default: a temporary directory)")
    p.add_argument("--json", type=Path, help="also write the results as JSON here")
    p.add_argument("--requests", type=int, help="server-closed: the closed-loop client's requests (default 96)")
    p.add_argument("--think-ms", type=float, help="server-closed: the client's think time in ms (default 50)")
    p.add_argument("--settings", help="comma list of the predictions to keep, 1-based: 1 budget ÷ 4, 2 budget × 4, "
                                      "3 KV ÷ 2, 4 KV × 2, 5 max_num_seqs ÷ 4 (default: all)")
    p.add_argument("--no-speed", action="store_true", help="leave the replay-speed part out")
    p.add_argument("--speed-one", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    names = [n for n in args.workloads.split(",") if n]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        p.error(f"--workloads: unknown {', '.join(unknown)} (known: {', '.join(WORKLOADS)})")
    try:
        settings = [int(x) for x in args.settings.split(",")] if args.settings else None
    except ValueError:
        settings = [0]
    if settings is not None and not all(1 <= i <= 5 for i in settings):
        p.error(f"--settings {args.settings!r}: comma list of 1..5")
    if args.requests is not None and args.requests < 1:
        p.error("--requests: at least 1")
    if args.think_ms is not None and args.think_ms < 0:
        p.error("--think-ms: 0 or more")
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
            report["accuracy"] = []
            profile = args.profile
            for name in names:
                row, profile = accuracy(name, parent, args.jobs, profile, args.calibrate_seconds, args.requests,
                                        settings, args.think_ms)
                report["accuracy"].append(row)
        if not args.no_speed:
            report["speed"] = speed([(8, 3000), (32, 2000), (32, 8000), (256, 600)])
    print(f"\nload avg at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
