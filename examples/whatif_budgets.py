"""The seed notes' §4.4 done by prediction: record once, predict other budgets, then check.

    python examples/whatif_budgets.py                        # record at 3072, predict 768 and 6144
    python examples/whatif_budgets.py --record 1024 --predict 768,6144
    python examples/whatif_budgets.py -- --num-kv-blocks 128 # extra args for long_prompts.py

The seed ran its 4K-token burst at ``max_num_batched_tokens`` 8,192 and asked what 2,048
and 16,384 would do (half a prompt, two prompts, four prompts per step). Scaled to this
CPU's 1,536-token prompts as ``examples/compare_budgets.py`` does, that is 3,072 →
768 / 6,144. This script

1. records ``examples/long_prompts.py`` once at the recorded budget (``vllm-probe run``);
2. predicts the other budgets with ``vllm-probe whatif``'s Python API
   (:func:`vllm_probe.sim.whatif.predict`: vLLM's own scheduler replays the recorded
   requests; a step-time model fitted on the recording gives the times);
3. runs each predicted budget for real;
4. prints predicted against measured, figure by figure, with the relative error.

Scheduling figures (steps, chunks, preemptions, TTFT in steps) are exact when the real
run's burst arrived as the recorded one did (``LLM.generate`` races its engine core:
the script says which pattern each run had). Figures in seconds also carry the machine's
load during each run: on a shared 2-core box two runs of the same setting differ by more
than the model's error (docs/whatif.md).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE / "long_prompts.py"

#: (label, compare's figure label) of the rows printed.
ROWS = (("steps", "steps"), ("chunks/prompt mean", "chunks/prompt mean"), ("preemptions", "preemptions"),
        ("discarded tokens", "discarded tokens"), ("TTFT median (steps)", "TTFT median (steps)"),
        ("TTFT median", "TTFT median"), ("TTFT p90", "TTFT p90"), ("duration", "duration"),
        ("output tokens/s", "output tokens/s"))


def record(run_dir: Path, budget: int, extra: list[str]) -> None:
    cmd = [sys.executable, "-m", "vllm_probe", "run", "--out", str(run_dir), "--", sys.executable, str(EXAMPLE),
           "--max-num-batched-tokens", str(budget), *extra]
    print(f"=== recording max_num_batched_tokens={budget}: {run_dir}", flush=True)
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"whatif_budgets: the run at budget {budget} failed:\n{proc.stderr[-3000:]}")
    done = [line for line in proc.stderr.splitlines() if line.startswith("vllm-probe: ") and "steps" in line]
    print(f"=== done in {time.perf_counter() - t:.0f} s; {done[-1] if done else ''}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--record", type=int, default=3072, help="the budget recorded (default 3072)")
    p.add_argument("--predict", default="768,6144", help="budgets predicted, then run (default 768,6144)")
    p.add_argument("--out", type=Path, help="parent directory (default vllm-probe-runs/whatif-budgets-<time>)")
    p.add_argument("example_args", nargs=argparse.REMAINDER, help="after --: arguments for long_prompts.py")
    args = p.parse_args(argv)
    budgets = [int(b) for b in args.predict.split(",") if b.strip()]
    extra = [a for a in args.example_args if a != "--"]
    parent = args.out or Path("vllm-probe-runs") / time.strftime("whatif-budgets-%Y%m%d-%H%M%S")

    from vllm_probe.analysis.compare import FIGURE
    from vllm_probe.analysis.summary import summarize
    from vllm_probe.analysis.workload import load_workload
    from vllm_probe.sim.stepmodel import decode_period_s
    from vllm_probe.sim.whatif import predict
    from vllm_probe.tui.format import figure

    source = parent / f"budget-{args.record}"
    record(source, args.record, extra)
    print(f"=== predicting {', '.join(map(str, budgets))} from the recording", flush=True)
    t = time.perf_counter()
    result = predict(source, [{"max_num_batched_tokens": b} for b in budgets], out=parent / "whatif")
    print(f"=== predicted in {time.perf_counter() - t:.0f} s (vLLM's import included)", flush=True)
    measured = {}
    for b in budgets:
        run = parent / f"budget-{b}"
        record(run, b, extra)
        measured[b] = run

    def pattern(run: Path) -> str:
        steps = [r.add_before_step for r in load_workload(run).requests]
        return ", ".join(f"{steps.count(k)} before step {k}" for k in sorted(set(steps)))

    print()
    print(f"recorded at {args.record}: {source}  (burst: {pattern(source)})")
    err = result.error

    def rel(row: dict) -> str:
        if row["value"] == row["reference"]:
            return "="
        return "-" if row["error"] is None else f"{row['error'] * 100:+.1f}%"

    print("baseline replay against the recording: " + "; ".join(
        f"{label} {rel(row)}" for label, row in err["figures"].items())
        + ("" if err["within"] else "  (off by more than its threshold)"))
    recorded_speed = decode_period_s(load_workload(source))
    for b, config in zip(budgets, result.configs):
        real = summarize(measured[b])
        print(f"\nmax_num_batched_tokens={b}  (measured burst: {pattern(measured[b])})")
        speed = decode_period_s(load_workload(measured[b]))
        if speed and recorded_speed:
            print(f"  decode-only steps took {speed * 1e3:.1f} ms (median) in this run, {recorded_speed * 1e3:.1f} ms "
                  f"in the recording: the machine ran x{recorded_speed / speed:.2f} as fast")
        print(f"  {'':22s} {'predicted':>12s} {'measured':>12s} {'error':>8s}")
        for label, key in ROWS:
            f = FIGURE[key]
            pv, mv = f.get(config.summary), f.get(real)
            if isinstance(pv, (int, float)) and isinstance(mv, (int, float)) and mv:
                e = f"{(pv - mv) / mv * 100:+.1f}%" if pv != mv else "="
            else:
                e = "=" if pv == mv else "-"
            print(f"  {label:22s} {figure(pv, f.unit):>12s} {figure(mv, f.unit):>12s} {e:>8s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
