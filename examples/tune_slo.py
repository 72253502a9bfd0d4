"""Tune for a TTFT target by replaying a recorded run, then check the recommendation for real.

    python examples/tune_slo.py [--target 0.5] [--out /tmp/tune_slo] [--jobs 2]

1. records ``examples/timed_arrivals.py`` (96 requests at 32/s: arrivals faster than the
   engine serves them on any 2-core machine measured) at one setting (budget 512,
   64 KV blocks) under the probe;
2. searches ``max_num_batched_tokens`` and ``num_kv_blocks`` with ``vllm-probe tune``'s
   search (:func:`vllm_probe.advice.tune.tune`) for TTFT p90 at most ``--target`` times
   the recorded one, maximizing output tokens/s;
3. runs the recommendation for real (the same requests at the same offsets: the plan
   depends only on the seed) and prints predicted against measured.

The seconds depend on the machine's load (a shared 2-core machine's speed varied 3× between
runs): the load average is printed beside the figures; steps and preemptions do not move
with it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ["--num-requests", "96", "--rate", "32", "--prompt-tokens", "64,1200", "--max-tokens", "16,200"]
RECORDED = {"max_num_batched_tokens": 512, "num_kv_blocks": 64}
FLAGS = {"max_num_batched_tokens": "--max-num-batched-tokens", "num_kv_blocks": "--num-kv-blocks",
         "max_num_seqs": "--max-num-seqs"}
SHOWN = ("ttft_p50", "ttft_p90", "queue_p90", "itl_p90", "output_tokens_per_s", "preemptions", "steps")


def record(out: Path, settings: dict) -> Path:
    args = [a for k, v in settings.items() for a in (FLAGS[k], str(v))]
    p = subprocess.run([sys.executable, "-m", "vllm_probe", "run", "--out", str(out), "--", sys.executable,
                        str(ROOT / "examples" / "timed_arrivals.py"), *WORKLOAD, *args],
                       capture_output=True, text=True, env=os.environ.copy())
    if p.returncode != 0:
        sys.exit(f"recording failed: {p.stderr[-800:]}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=float, default=0.5, help="TTFT p90 target as a share of the recorded one")
    ap.add_argument("--out", type=Path, default=Path("/tmp/tune_slo"))
    ap.add_argument("--jobs", type=int, default=1)
    a = ap.parse_args()
    from vllm_probe.advice import tune as tuning
    from vllm_probe.advice.evaluate import Evaluator
    from vllm_probe.analysis.objectives import OBJECTIVES, measure

    a.out.mkdir(parents=True, exist_ok=True)
    print(f"recording {RECORDED} …", flush=True)
    rec = record(a.out / "recorded", RECORDED)
    recorded = measure(rec, SHOWN)
    target = a.target * recorded["ttft_p90"]
    slos = [tuning.Slo("ttft_p90", "<=", target)]
    knobs = [tuning.parse_knob("max_num_batched_tokens=256..2048"), tuning.parse_knob("num_kv_blocks=32,64,96,128")]
    print(f"tuning for ttft_p90 <= {target:.3f} s (recorded {recorded['ttft_p90']:.3f} s) …", flush=True)
    with Evaluator(rec, jobs=a.jobs) as ev:
        result = tuning.tune(ev, slos, knobs)
    d = result.to_dict()
    within = d["baseline"]["error"]["within"]
    print(f"baseline replay {'within' if within else 'off'} its thresholds; {result.replays} replays in "
          f"{result.rounds} rounds, {result.seconds:.0f} s")
    if result.recommended is None:
        print("no setting in range meets the target; closest:", d["closest"]["settings"],
              *d["closest"]["would_take"], sep="\n  ")
        return 3
    settings = {**RECORDED, **d["recommended"]["settings"]}
    print("recommended:", " ".join(d["recommended"]["flags"]) or "(the recorded settings)")
    print(d["recommended"]["serve"])
    real_dir = record(a.out / "recommended", settings)
    real = measure(real_dir, SHOWN)
    predicted = result.recommended.evaluation.figures
    load = os.getloadavg()
    print(f"\nload average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    print(f"{'figure':22} {'recorded':>10} {'predicted':>10} {'measured':>10} {'error':>8}")
    for name in SHOWN:
        p, m = predicted.get(name), real.get(name)
        err = "-" if p is None or not m else f"{(p - m) / m * 100:+.0f} %"
        unit = OBJECTIVES[name].unit

        def fmt(v, unit=unit):
            return "-" if v is None else f"{v:.3f}" if unit == "s" else f"{v:.0f}"
        print(f"{name + ' (' + unit + ')':22} {fmt(recorded[name]):>10} {fmt(p):>10} {fmt(m):>10} {err:>8}")
    met = real["ttft_p90"] is not None and real["ttft_p90"] <= target * 1.15
    print(f"\nmeasured ttft_p90 {real['ttft_p90']:.3f} s against the target {target:.3f} s: "
          + ("met (within 15 %)" if met else "missed"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
