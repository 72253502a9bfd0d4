"""The seed notes' §4.4 experiment: the same long-prompt burst at three token budgets.

    python examples/compare_budgets.py                       # budgets 768, 3072, 6144
    python examples/compare_budgets.py --budgets 512,1024,2048
    python examples/compare_budgets.py -- --num-prompts 8    # extra args for long_prompts.py

Runs ``examples/long_prompts.py`` under ``vllm-probe run --out DIR`` once per budget
(``--max-num-batched-tokens``; everything else, the KV cache included, stays the same),
then prints ``vllm-probe compare`` of the runs: config differences on top, then steps,
chunks per prompt, preemptions, recomputed tokens and time to first token side by side.

The seed ran 4K-token prompts at 2,048 / 8,192 / 16,384, i.e. a budget of half a prompt,
two prompts and four prompts. The default workload here has 1,536-token prompts, so the
same ratios are 768 / 3,072 / 6,144. About 30-90 s per run on 2 CPU cores (engine start
included; more when the machine is busy).

Reading the table: figures in steps (time to first token in steps, chunks per prompt,
KV tokens re-read) depend only on the scheduler's decisions; figures in seconds also
depend on how busy the CPU was during each run. With the default KV cache (64 blocks of
128 tokens: about 5 requests at a time) the runs are KV-bound ("bound by: kv_cache"), so
a larger budget removes chunking but barely changes the number of steps; give a larger
``--num-kv-blocks`` after ``--`` to see the budget bind instead.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE / "long_prompts.py"
DEFAULT_BUDGETS = "768,3072,6144"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budgets", default=DEFAULT_BUDGETS,
                   help=f"comma-separated max_num_batched_tokens values (default {DEFAULT_BUDGETS})")
    p.add_argument("--out", type=Path,
                   help="parent directory of the runs (default: vllm-probe-runs/compare-budgets-<time>)")
    p.add_argument("example_args", nargs=argparse.REMAINDER,
                   help="after --: arguments for examples/long_prompts.py (not --max-num-batched-tokens)")
    args = p.parse_args(argv)
    try:
        budgets = [int(b) for b in args.budgets.split(",") if b.strip()]
    except ValueError:
        p.error(f"--budgets must be integers, got {args.budgets!r}")
    if len(budgets) < 2:
        p.error("give at least two budgets")
    extra = [a for a in args.example_args if a != "--"]
    if "--max-num-batched-tokens" in extra:
        p.error("the budget comes from --budgets, not from the example's arguments")
    parent = args.out or Path("vllm-probe-runs") / time.strftime("compare-budgets-%Y%m%d-%H%M%S")
    probe = [sys.executable, "-m", "vllm_probe"]
    run_dirs = []
    for budget in budgets:
        run_dir = parent / f"budget-{budget}"
        cmd = [*probe, "run", "--out", str(run_dir), "--", sys.executable, str(EXAMPLE),
               "--max-num-batched-tokens", str(budget), *extra]
        print(f"\n=== max_num_batched_tokens={budget}: {run_dir}", flush=True)
        t = time.perf_counter()
        rc = subprocess.call(cmd)
        if rc != 0:
            print(f"compare_budgets: the run at budget {budget} failed (exit {rc})", file=sys.stderr)
            return rc
        print(f"=== done in {time.perf_counter() - t:.0f} s", flush=True)
        run_dirs.append(str(run_dir))
    print(flush=True)
    return subprocess.call([*probe, "compare", *run_dirs])


if __name__ == "__main__":
    sys.exit(main())
