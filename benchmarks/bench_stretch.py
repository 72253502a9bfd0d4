"""How much replaying only a finding's stretch saves doctor's remedy search, and whether
it changes the answer.

Records a long hand-made run on vLLM's real scheduler (a virtual clock prices each step,
benchmarks/_hand.py): ``--bursts`` light bursts (4 requests of 32 + 32 tokens, 2 s apart)
with one preemption storm in the middle (16 requests of 64 + 100 tokens in 40 KV blocks).
Then searches the storm's remedy (or, when the long run dilutes the storm's rate below its
threshold, the preemption-thrash finding's) twice, on the whole run (``--whole-run``) and on the
stretch between idle moments that holds its preemptions, and prints, for each: steps
replayed per replay, replays, seconds, the remedy, and whether both searches tried the same
changes with the same predictions.

    python benchmarks/bench_stretch.py [--bursts 200] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from vllm_probe.analysis.doctor.findings import Finding, known

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build(run_dir: Path, bursts: int) -> Path:
    from benchmarks._hand import nonlinear_cost, record, workload
    from vllm_probe.analysis.workload import WorkloadRequest

    reqs: list[WorkloadRequest] = []

    def add(name: str, t: float, prompt: int, out: int) -> None:
        reqs.append(WorkloadRequest(order=len(reqs), req_id=name, prompt_len=prompt, max_tokens=out,
                                    output_tokens=out, arrival_ts=t, added_ts=t, finish_reason="length"))

    t = 1000.0
    for b in range(bursts):
        if b == bursts // 2:
            for i in range(16):
                add(f"S{i}", t + 0.0001 * i, 64, 100)
            t += 4.0
        for i in range(4):
            add(f"L{b}-{i}", t + 0.001 * i, 32, 32)
        t += 2.0
    return record(run_dir, workload(reqs), nonlinear_cost, num_blocks=40, max_model_len=512)


def search(run: Path, whole_run: bool) -> tuple[Finding, float, int, float]:
    from vllm_probe.advice import remedies
    from vllm_probe.advice.evaluate import Evaluator
    from vllm_probe.analysis.doctor import examine

    report = examine(run)
    # a long run dilutes the storm's rate below its threshold; the thrash finding stays
    storm = [f for f in report.findings if f.id == "preemption-storm"] or \
        [f for f in report.findings if f.id == "preemption-thrash"]
    if not storm:
        raise SystemExit("no preemption finding in the built run")
    start = time.perf_counter()
    with Evaluator(run, lazy=True) as ev:
        (s,) = remedies.search(storm, ev, budget_s=3600, whole_run=whole_run)
        replays = ev.all_replays
        replay_s = sum(t.evaluation.replay_s for t in s.tried)
    return storm[0], time.perf_counter() - start, replays, replay_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bursts", type=int, default=200)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-stretch-"))
    t = time.perf_counter()
    run = build(out / "run", args.bursts)
    from vllm_probe.analysis.workload import load_workload

    w = load_workload(run)
    print(f"built {run}: {w.last_step + 1:,} steps, {len(w.requests):,} requests, {len(w.preempts)} preemptions "
          f"in {time.perf_counter() - t:.1f} s; load average {os.getloadavg()[0]:.1f}")
    rows = {}
    for whole in (True, False):
        f, wall, replays, replay_s = search(run, whole)
        st = known(f.predicted.stretch) if f.predicted is not None else None
        steps = st["steps"] if st else w.last_step + 1
        rows[whole] = f
        where = "whole run" if whole else "stretch  "
        print(f"{f.id} on the {where}: {steps:>7,} steps per replay, {replays:>3} replays "
              f"(baseline included), search {wall:6.1f} s, replays {replay_s:6.1f} s; remedy "
              f"{f.remedy.whatif if f.remedy else None}"
              + (f"; stretch {st['first_step']:,}-{st['last_step']:,}" if st else ""))
    tried = {whole: known(f.predicted.tried) or [] if f.predicted is not None else [] for whole, f in rows.items()}
    same = [(t.settings, t.predicted, t.met) for t in tried[True]] == \
        [(t.settings, t.predicted, t.met) for t in tried[False]]
    print(f"same changes tried with the same predictions: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
