"""How right and how fast ``vllm-probe whatif`` is: predictions against real runs, and replay speed.

    python -m benchmarks.bench_whatif                   # accuracy on 6 workloads + speed (the first 5: ~60 min here)
    python -m benchmarks.bench_whatif --workloads light --profile P.json   # reuse a calibrated profile
    python -m benchmarks.bench_whatif --speed-only      # replay speed at 8, 32, 256 running requests
    python -m benchmarks.bench_whatif --workloads light --no-speed   # one workload's accuracy
    python -m benchmarks.bench_whatif --workloads server-closed --requests 24 --settings 5 --no-speed
                                                        # a smaller check: 24 requests, max_num_seqs ÷ 4 only
    python -m benchmarks.bench_whatif --quick           # checks that it runs (speed at 8, tiny)
    python -m benchmarks.bench_whatif --repeats 3 --workloads light,saturated --write-doc
                                                        # each setting run for real 3 times, A B A B ...
    python -m benchmarks.bench_whatif --repeats 2 --stand-in   # the same on a virtual-clock stand-in (seconds)
    python -m benchmarks.bench_whatif --coverage --write-doc    # per configuration: the replay at the recorded
                                                        # settings against the recording (benchmarks/coverage.py)

**Accuracy.** Per workload: record it on the real CPU engine (tiny model, ``vllm-probe
run``) at one setting; predict five others with :func:`vllm_probe.sim.whatif.predict`
(token budget ×¼ and ×4, KV blocks ×½ and ×2, ``max_num_seqs`` ÷ 4), once with a
calibrated step-time profile (``vllm-probe calibrate``, once per session, or
``--profile FILE``) and once with the recording-only model (``profile=False``); run the
five for real; print each figure's relative error, prediction against measurement, the
profile's row above the recording-only one, and the baseline's (the recorded settings
replayed) against the recording. Targets: TTFT p50/p90 within 10 % (or 3 ms
where TTFT is a few ms), throughput and duration within 5 %, steps within 2 %.
Workloads (``examples/timed_arrivals.py``, ``AsyncLLM``: the server's engine, mixed
lengths: prompts 64–1,200 tokens, outputs 16–200, Poisson arrivals; then an offline burst
and a real server):

* ``light``: 40 requests at 4/s (below saturation on any machine here);
* ``saturated``: 96 requests at 32/s (saturates a quiet machine too, measured);
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
took 1 / 0.65 as long), and its machine-speed mark against the recording's (``mark``:
:func:`vllm_probe.analysis.compare.machine_ratio`; 1.20: its host ran the probe's fixed
computation 20 % slower; ``-`` for a run recorded by a probe without the mark). On this
shared 2-core machine the speed moves 0.6–1.6x between runs, and every figure in
seconds moves with it (with timed arrivals the scheduling figures too: a slower engine
batches more requests per step); the row "adjusted for speed" is the same prediction
with every step time scaled by 1 / speed
(``predict(step_time_scale=...)``), which separates the model's error from the
machine's drift as far as one median can measure it. ``burst``: whether the
measured run's requests reached the engine before the same steps as the recording's
(``same``) or not (``other``: an offline burst's arrival race; blank for timed arrivals).
docs/whatif.md discusses
what the errors mean.

**Repeats** (``--repeats K``): one real run cannot confirm a prediction in seconds on a
machine whose speed moves between runs (measured: the same setting's TTFT p90 was
5.93 s and 3.18 s twenty minutes apart). Per workload: record it once, predict the grid
(:func:`~vllm_probe.sim.whatif.predict`, with each figure's interval, as ``whatif --json``'s
``intervals`` gives it), then run the recorded setting and each changed setting for real,
alternating ``A B C … A B C …``, K rounds, so a drift of the machine falls on every setting
alike. Beside every run: the load average before and after it (``os.getloadavg``, 1 min)
and its machine-speed mark (``summary``'s ``speed_mark``, with its ratio to the
recording's). Per setting and figure (:data:`REPEAT_FIGURES`): the real runs' spread
(min–max, coefficient of variation), the prediction's error against their median, how
many real runs its interval covers, and whether it meets the target (:func:`judge`).
``--write-doc`` writes the tables into docs/whatif.md's accuracy section (between its
``repeats`` markers). ``--stand-in``: the same on a scheduler-level stand-in
(:class:`StandInEngine`: vLLM's real Scheduler on a virtual clock of a known step cost),
whose repeats are identical — zero spread — a check of the procedure in seconds.
Run the real measurement with nothing else on the machine.

**Coverage** (``--coverage``, :mod:`benchmarks.coverage`): per configuration (prefix caching
over idle gaps, async scheduling, timed arrivals, speculative decoding, a sliding-window
model, data-parallel ranks), a real recording replayed at its recorded settings, counts
against counts (target: exact, steps within 2 %), and one changed setting run for real where
the CPU engine can; ``--coverage-rows`` picks rows, ``--write-doc`` writes docs/whatif.md's
Coverage tables.

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
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._doc import replace_section

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
    cmd = [sys.executable, "-m", "vllm_probe", "calibrate", "--like", str(like), "--out", str(out), "--force",
           "--max-seconds", str(max_seconds)]  # --force: a rerun into the same --out folder replaces its own
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
    from vllm_probe.analysis.compare import FIGURE, machine_ratio
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
        assert q is not None  # a fitted model has its quality
        print(f"  {tag} model: {len(result.model.terms)} terms, R² {q.r2:.2f}, per-step error median "
              f"{q.median_abs_ms:.2f} ms, p90 {q.p90_abs_ms:.2f} ms", flush=True)
    arrivals = with_profile.arrivals.describe() if with_profile.arrivals is not None else "arrivals as recorded"
    print(f"  predict(): {predict_s:.0f} s for 2 × {len(grid) + 1} replays; {arrivals}")
    if example is SERVER and (with_profile.arrivals is None or with_profile.arrivals.kind != "closed"):
        print("  warning: the closed loop was not detected; the replays used the model above", flush=True)
    figures = SCHEDULING + (("prefix-hit tokens", "hits"),) + TIMING if name.startswith("prefix") else (
        SCHEDULING + TIMING)
    head = (f"  {'setting':34s}" + "".join(f"{short:>10s}" for _, short in figures) + f"{'speed':>8s}{'mark':>7s}"
            f"{'outside':>9s}")
    print(head)
    rec_speed = decode_period_s(load_workload(base_dir))

    def value(summary, label):
        if label == "prefix-hit tokens":
            return summary.chunking.prefix_hit_tokens
        return FIGURE[label].get(summary)

    recorded = summarize(base_dir)
    rows: list[dict[str, Any]] = []
    for tag, result in (("profile", with_profile), ("rec-only", recording_only)):
        cells = [_rel(value(result.baseline.summary, label), value(recorded, label)) for label, _ in figures]
        print(f"  {'baseline (self-replay) ' + tag:34s}" + "".join(f"{c:>10s}" for c in cells) + f"{'1.00':>8s}")
        rows.append({"setting": "baseline", "model": tag, "errors": dict(zip([f for f, _ in figures], cells))})
    for k, run in enumerate(real_dirs):
        real = summarize(run)
        speed = decode_period_s(load_workload(run))
        ratio = rec_speed / speed if rec_speed and speed else None
        machine = machine_ratio(recorded, real)  # the run's host against the recording's: 1.2 = 20 % slower
        for tag, result in (("profile", with_profile), ("rec-only", recording_only)):
            config = result.configs[k]
            cells = [_rel(value(config.summary, label), value(real, label)) for label, _ in figures]
            label = ",".join(f"{k2}={v}" for k2, v in config.overrides.items()) + " " + tag
            out_share = config.replay.get("outside_region")
            print(f"  {label:34s}" + "".join(f"{c:>10s}" for c in cells)
                  + f"{(f'{ratio:.2f}' if ratio else '-'):>8s}" + f"{(f'{machine:.2f}' if machine else '-'):>7s}"
                  + f"{(f'{out_share * 100:.0f}%' if out_share is not None else '-'):>9s}", flush=True)
            rows.append({"setting": label, "model": tag, "errors": dict(zip([f for f, _ in figures], cells)),
                         "speed": ratio, "machine_ratio": machine, "outside_region": out_share,
                         "predicted": {f: value(config.summary, f) for f, _ in figures},
                         "measured": {f: value(real, f) for f, _ in figures}})
    arrivals_dict = with_profile.arrivals.to_dict() if with_profile.arrivals else None
    return {"workload": name, "description": text, "rows": rows, "load_avg": os.getloadavg()[0],
            "arrivals": arrivals_dict,
            "model": with_profile.model.to_dict(), "baseline_within": with_profile.error["within"]}, profile


# -- repeats: every setting run for real K times, alternated ---------------------------------

#: The figures ``--repeats`` reports: (objective name of vllm_probe.analysis.objectives, short
#: column name, unit, largest relative error of the target, absolute error always accepted).
#: Targets (the issue's): TTFT p50/p90 and ITL p90 within 10 % (or 3 ms where they are a few
#: ms), throughput and duration within 5 %, steps within 2 %; preemptions are reported, with
#: no target of their own.
REPEAT_FIGURES = (
    ("steps", "steps", "", 0.02, 0.0),
    ("preemptions", "preempt", "", None, 0.0),
    ("ttft_p50", "TTFT p50", "s", 0.10, 0.003),
    ("ttft_p90", "TTFT p90", "s", 0.10, 0.003),
    ("itl_p90", "ITL p90", "s", 0.10, 0.003),
    ("output_tokens_per_s", "tok/s", "", 0.05, 0.0),
    ("duration_s", "duration", "s", 0.05, 0.0),
)
#: The figures in seconds or per second: those a replay at another engine speed moves.
TIMED_FIGURES = frozenset(f[0] for f in REPEAT_FIGURES if f[2] == "s") | {"output_tokens_per_s"}
#: An interval should cover at least this share of the real runs (80 %) ...
COVERAGE_TARGET = 0.8
#: ... and be no wider than this many times the real runs' own spread (max − min).
WIDTH_TARGET = 2.0
#: Relative differences below this are float noise (a replay's seconds summed in another
#: order), not errors: equal for the table, covered by a zero-width interval.
FLOAT_SLACK = 1e-9
#: The markers of docs/whatif.md's section that ``--write-doc`` fills.
DOC = ROOT / "docs" / "whatif.md"
DOC_BEGIN = ("<!-- repeats: generated by `python -m benchmarks.bench_whatif --repeats K --write-doc`; "
             "do not edit by hand -->")
DOC_END = "<!-- end of the repeats tables -->"


def spread(values: list[float]) -> dict:
    """The real runs' spread of one figure: ``min``, ``max``, ``median``, ``range`` (max − min,
    the figure's unit), ``rel_range`` (range / median) and ``cv`` (population standard
    deviation / mean); None where there are no values (or a zero median / mean)."""
    if not values:
        return {"min": None, "max": None, "median": None, "range": None, "rel_range": None, "cv": None}
    lo, hi, med = min(values), max(values), statistics.median(values)
    mean = statistics.fmean(values)
    return {"min": lo, "max": hi, "median": med, "range": hi - lo, "rel_range": (hi - lo) / med if med else None,
            "cv": statistics.pstdev(values) / mean if mean else None}


def judge(name: str, predicted: float | None, interval: dict | None, reals: list[float],
          engine: float | None = None, at_engine: float | None = None) -> dict:
    """One figure of one setting: the real runs' :func:`spread`, the prediction's error
    against their median (``error``: relative; ``error_abs``: in the figure's unit), how many
    real runs the interval ``{lo, hi}`` covers, its width against the real spread, and
    whether each target of :data:`REPEAT_FIGURES` is met (None: not judged).

    ``engine``: the real runs' median decode ratio to the recording
    (:func:`~vllm_probe.analysis.compare.decode_ratio`: 1.30, their engine's decode steps
    took 30 % longer at the same batch); ``at_engine``: the figure replayed with every step
    time scaled by it (:func:`at_engine_speed`). ``error_at_engine`` is its error against
    the real median: what is left once the engine's own speed change is taken out (None
    for a count, or without a ratio)."""
    _, _, _, rel_target, abs_target = next(f for f in REPEAT_FIGURES if f[0] == name)
    out = {"figure": name, "predicted": predicted, "reals": list(reals), **spread(reals)}
    med = out["median"]
    out["error_abs"] = predicted - med if predicted is not None and med is not None else None
    out["error"] = out["error_abs"] / med if out["error_abs"] is not None and med else (
        0.0 if out["error_abs"] == 0 else None)
    out["engine_ratio"] = engine
    out["at_engine"] = at_engine
    out["error_at_engine"] = at_engine / med - 1.0 if at_engine is not None and med else None
    out["meets"] = None
    if rel_target is not None and out["error_abs"] is not None:
        allowed = max(rel_target * abs(med), abs_target, out["range"] or 0.0)  # or the runs' own spread
        out["meets"] = abs(out["error_abs"]) <= allowed
    out["interval"] = interval
    out["covered"] = out["interval_width_ratio"] = out["interval_ok"] = None
    if interval is not None and reals:
        lo, hi = interval["lo"], interval["hi"]
        slack = FLOAT_SLACK * max(abs(lo), abs(hi))  # a zero-width interval still covers its own value
        out["covered"] = sum(1 for v in reals if lo - slack <= v <= hi + slack)
        width = hi - lo
        rng = out["range"] or 0.0
        out["interval_width_ratio"] = width / rng if rng else (0.0 if width <= slack else math.inf)
        out["interval_ok"] = (out["covered"] >= COVERAGE_TARGET * len(reals)
                              and width <= WIDTH_TARGET * rng + 2 * slack)
    return out


class RealEngine:
    """A workload of :data:`WORKLOADS` recorded for real (``vllm-probe run`` on the CPU
    engine; ``server-closed``: the server under its closed-loop client) at a setting."""

    def __init__(self, name: str, requests: int | None = None, think_ms: float | None = None) -> None:
        example, args, text, grid = WORKLOADS[name]
        self.example, self.args, self.flags = example, list(args), FLAGS
        if example is SERVER:
            from benchmarks import closed_loop

            self.args, self.flags = list(closed_loop.ENGINE_ARGS), closed_loop.FLAGS
        self.name, self.text, self.grid = name, text, grid
        self.requests, self.think_ms = requests, think_ms
        self.profile: Path | bool | None = None  # set by repeats(): a profile, or False (recording only)

    def record(self, run_dir: Path, overrides: dict) -> None:
        """Record the workload into ``run_dir`` with ``overrides`` (whatif names) set."""
        _record(run_dir, self.example, _with(self.args, overrides, self.flags), self.requests, self.think_ms)


#: The stand-in's engine: budget 256, 16 sequences, 64 KV blocks of 16 tokens (tight:
#: it preempts), max_model_len 480 (a request of it fits the grid's 32 blocks too).
STAND_IN_SPEC: dict[str, Any] = dict(max_num_batched_tokens=256, max_num_seqs=16, num_blocks=64, block_size=16,
                                     max_model_len=480)
#: Whatif names of the grid's settings → SchedulerSpec fields.
_SPEC_FIELDS = {"max_num_batched_tokens": "max_num_batched_tokens", "max_num_seqs": "max_num_seqs",
                "num_kv_blocks": "num_blocks"}


def stand_in_cost(features) -> float:
    """The stand-in's step (s): 2 ms + 4 µs per prefill token + 0.3 ms per decoding request +
    50 ns per decode context token + 20 ms on the first step."""
    from vllm_probe.sim.stepmodel import FEATURES

    def f(name: str) -> float:
        return features[FEATURES.index(name)]

    return (0.002 + 4e-6 * f("prefill_tokens") + 3e-4 * f("decode_reqs") + 5e-8 * f("attn_decode")
            + 0.02 * f("first_step"))


class StandInEngine:
    """A scheduler-level stand-in for a real engine: 40 seeded requests (Poisson 40/s, prompts
    50–400 tokens, outputs 5–40) through vLLM's real Scheduler with the probe writing a run
    directory (:func:`vllm_probe.sim.replay.replay`), on a virtual clock whose steps cost
    :func:`stand_in_cost`. Deterministic: every repeat of a setting is the same run, so
    ``--repeats`` on it must report zero spread."""

    name = "stand-in"
    text = ("40 requests, Poisson 40/s, prompts 50-400, out 5-40; vLLM's Scheduler on a virtual clock of a known "
            "step cost; budget 256, KV 64 blocks of 16, seqs 16")
    grid = _grid(256, 64, 16)
    profile: Path | bool | None = False

    def workload(self):
        import random

        from vllm_probe.analysis.workload import Workload, WorkloadRequest

        rng = random.Random(7)
        t, reqs = 1000.0, []
        for i in range(40):
            t += rng.expovariate(40.0)
            out = rng.randint(5, 40)
            reqs.append(WorkloadRequest(order=i, req_id=f"s{i}", prompt_len=rng.randint(50, 400), max_tokens=out,
                                        output_tokens=out, arrival_ts=t, added_ts=t, finish_reason="length"))
        return Workload("stand-in", {"scheduler_class": "Scheduler", "hash_block_size": 16}, reqs)

    def record(self, run_dir: Path, overrides: dict) -> None:
        from vllm_probe.engine.sink import EventSink
        from vllm_probe.runs.rundir import write_meta
        from vllm_probe.sim.harness import SchedulerSpec
        from vllm_probe.sim.replay import replay

        spec = dict(STAND_IN_SPEC)
        spec.update({_SPEC_FIELDS[k]: v for k, v in overrides.items()})
        run_dir.mkdir(parents=True, exist_ok=False)
        sink = EventSink(run_dir / "events-1.jsonl")
        try:
            replay(self.workload(), SchedulerSpec(**spec), stand_in_cost, sink, lag_s=0.0)
        finally:
            sink.close()
        write_meta(run_dir, {"command": ["bench_whatif", "stand-in"], "start_time": 1.0})


def _label(overrides: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in overrides.items()) or "recorded setting"


def _fmt(name: str, v: float | None, like: float | None = None) -> str:
    """A figure for the table: seconds as ms below 1 s, counts with separators; ``like``:
    the number alone, in the scale ``like`` would be written in (an interval's ends)."""
    if v is None:
        return "-"
    unit = next(f[2] for f in REPEAT_FIGURES if f[0] == name)
    if unit == "s":
        ms = abs(like if like is not None else v) < 1
        text = f"{v * 1e3:,.1f}" if ms else f"{v:,.2f}"
        return text if like is not None else text + (" ms" if ms else " s")
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.1f}"


def repeats(engine, parent: Path, k: int, jobs: int, settings: list[int] | None = None,
            calibrate_seconds: float = 120) -> dict:
    """Record ``engine``'s workload once, predict its grid, then run the recorded setting and
    each changed setting for real, alternated, ``k`` rounds; print and return the runs and
    each figure's :func:`judge`. ``engine.profile`` None: calibrate one on the recording
    (``calibrate_seconds`` of sweep) and keep it there."""
    from vllm_probe.analysis.compare import decode_ratio, machine_ratio
    from vllm_probe.analysis.objectives import measure
    from vllm_probe.analysis.summary import summarize
    from vllm_probe.sim.whatif import predict

    grid = engine.grid if settings is None else [engine.grid[i - 1] for i in settings]
    names = [f[0] for f in REPEAT_FIGURES]
    base = parent / engine.name
    print(f"\n[{time.strftime('%H:%M:%S')}] {engine.name}: {engine.text}; {k} rounds of "
          f"{1 + len(grid)} runs, alternated; load avg {os.getloadavg()[0]:.2f}", flush=True)
    engine.record(base / "recorded", {})
    recorded = summarize(base / "recorded")
    if engine.profile is None:
        engine.profile = calibrated(base / "recorded", parent / "profile.json", calibrate_seconds)
    t = time.perf_counter()
    result = predict(base / "recorded", grid, out=base / "whatif", jobs=jobs, profile=engine.profile,
                     force=engine.profile not in (None, False))
    data = result.to_dict()  # intervals exactly as `whatif --json` gives them
    print(f"  predict(): {time.perf_counter() - t:.1f} s for {len(grid) + 1} settings; step-time model "
          f"{result.step_time_model.describe() if result.step_time_model else '-'}; recording's machine mark "
          f"{_mark(recorded.speed_mark.mark_us)}", flush=True)
    points = [({}, data["baseline"])] + list(zip(grid, data["configs"]))
    runs: list[dict] = []
    for rnd in range(1, k + 1):
        for overrides, _ in points:
            label = _label(overrides)
            run_dir = base / (f"run{rnd}-" + ("recorded" if not overrides else slug_of(overrides)))
            load_before = os.getloadavg()[0]
            t = time.perf_counter()
            engine.record(run_dir, overrides)
            wall = time.perf_counter() - t
            load_after = os.getloadavg()[0]
            s = summarize(run_dir)
            figs = measure(None, names, summary=s)
            ratio = machine_ratio(recorded, s)
            runs.append({"round": rnd, "setting": label, "run_dir": str(run_dir), "wall_s": wall,
                         "load_before": load_before, "load_after": load_after, "speed_mark_us": s.speed_mark.mark_us,
                         "machine_ratio": ratio, "decode_ratio": decode_ratio(recorded, s), "figures": figs})
            print(f"  [{time.strftime('%H:%M:%S')}] round {rnd} {label:32s} {wall:6.1f} s  load {load_before:5.2f} "
                  f"→ {load_after:5.2f}  mark {_mark(s.speed_mark.mark_us)}"
                  + (f" (×{ratio:.2f})" if ratio else "") + f"  steps {_fmt('steps', figs['steps'])}  "
                  f"TTFT p90 {_fmt('ttft_p90', figs['ttft_p90'])}", flush=True)
    judged = []
    for overrides, point in points:
        predicted = measure(None, names, summary=point["summary"])
        for name in names:
            judged.append({"setting": _label(overrides), "figure": name, "predicted": predicted[name],
                           "interval": point["intervals"].get(name)})
    at_engine = at_engine_speed(base / "recorded", [o for o, _ in points], runs, base / "at-engine-speed",
                                engine.profile, force=engine.profile not in (None, False))
    report = {"workload": engine.name, "description": engine.text, "k": k, "runs": runs,
              "figures": rejudge(runs, judged, at_engine), "recorded_speed_mark_us": recorded.speed_mark.mark_us,
              "step_time_model": data["step_time_model"], "baseline_within": result.error["within"]}
    print_repeats(report)
    return report


def _engine_ratio(runs: list[dict], setting: str) -> float | None:
    """The median ``decode_ratio`` of ``setting``'s real runs (None: none has one)."""
    ratios = [r["decode_ratio"] for r in runs if r["setting"] == setting and r.get("decode_ratio")]
    return statistics.median(ratios) if ratios else None


def at_engine_speed(recorded: Path, settings: list[dict], runs: list[dict], out: Path,
                    profile: Path | bool | None, force: bool = False) -> dict[str, dict]:
    """Per setting (label → figure → value): the recording replayed at that setting with every
    step time scaled by its real runs' median decode ratio (``predict(step_time_scale=…)``):
    the prediction had it known the engine's speed during those runs. Settings whose runs
    have no ratio are left out."""
    from vllm_probe.analysis.objectives import measure
    from vllm_probe.sim.whatif import predict

    names = [f[0] for f in REPEAT_FIGURES]
    out_figures: dict[str, dict] = {}
    for overrides in settings:
        label = _label(overrides)
        ratio = _engine_ratio(runs, label)
        if ratio is None:
            continue
        data = predict(recorded, [overrides] if overrides else [], out=out / (slug_of(overrides) or "recorded"),
                       step_time_scale=ratio, profile=profile, force=force).to_dict()
        point = data["configs"][0] if overrides else data["baseline"]
        out_figures[label] = measure(None, names, summary=point["summary"])
    return out_figures


def rejudge(runs: list[dict], figures: list[dict], at_engine: dict[str, dict] | None = None) -> list[dict]:
    """Each figure of each setting (``{setting, figure, predicted, interval}``, as
    :func:`repeats` lists them) judged (:func:`judge`) against its setting's real ``runs``,
    with the median of their ``decode_ratio`` as the engine's speed and, for a figure in
    seconds (or per second), its value replayed at that speed (``at_engine``,
    :func:`at_engine_speed`)."""
    out = []
    for f in figures:
        mine = [r for r in runs if r["setting"] == f["setting"]]
        reals = [r["figures"][f["figure"]] for r in mine if r["figures"][f["figure"]] is not None]
        timed = f["figure"] in TIMED_FIGURES
        value = (at_engine or {}).get(f["setting"], {}).get(f["figure"]) if timed else None
        out.append({"setting": f["setting"], **judge(f["figure"], f["predicted"], f["interval"], reals,
                                                      _engine_ratio(runs, f["setting"]), value)})
    return out


def with_engine_speed(report: dict, out: Path) -> dict:
    """A saved ``--repeats`` report (``--json``) with each run's ``decode_ratio`` read again
    from its run directory against the recording's (``<workload>/recorded`` beside it), the
    recording replayed at each setting's engine speed into ``out`` (:func:`at_engine_speed`,
    with the recording's own step-time model as the report used) and its figures judged
    again (:func:`rejudge`); the runs' seconds are not touched.

    Raises:
        NoEventsError: a run directory is gone.
    """
    from vllm_probe.analysis.compare import decode_ratio
    from vllm_probe.analysis.summary import summarize
    from vllm_probe.sim.engine_args import parse_sets

    runs = report["runs"]
    if not runs:
        return report
    recorded_dir = Path(runs[0]["run_dir"]).parent / "recorded"
    recorded = summarize(recorded_dir)
    for r in runs:
        r["decode_ratio"] = decode_ratio(recorded, summarize(r["run_dir"]))
    labels = dict.fromkeys(r["setting"] for r in runs)  # _label's text back to its overrides
    settings = [{} if label == _label({}) else parse_sets(label.split(","))[0] for label in labels]
    profile = False if (report.get("step_time_model") or {}).get("source") == "recording" else None
    at_engine = at_engine_speed(recorded_dir, settings, runs, out / report["workload"], profile)
    return {**report, "figures": rejudge(runs, report["figures"], at_engine)}


def slug_of(overrides: dict) -> str:
    return "-".join(f"{k}={v}" for k, v in overrides.items())


def _mark(us: float | None) -> str:
    return "-" if us is None else (f"{us:.0f} µs" if us < 1000 else f"{us / 1000:.2f} ms")


def _pct(x: float | None) -> str:
    return "-" if x is None else ("=" if abs(x) < FLOAT_SLACK else f"{x * 100:+.1f}%")


def repeat_rows(report: dict) -> list[list[str]]:
    """The table's rows, one per setting and figure: setting, figure, predicted (interval),
    real median (min–max), CV, error, covered, width ÷ spread, target met."""
    rows: list[list[str]] = []
    k = report["k"]
    for f in report["figures"]:
        name = f["figure"]
        iv = f["interval"]
        p = f["predicted"]
        pred = _fmt(name, p) + (f" ({_fmt(name, iv['lo'], p)}–{_fmt(name, iv['hi'], p)})" if iv else "")
        m = f["median"]
        real = f"{_fmt(name, m)} ({_fmt(name, f['min'], m)}–{_fmt(name, f['max'], m)})" if m is not None else "-"
        cv = "-" if f["cv"] is None else f"{f['cv'] * 100:.1f}%"
        covered = "-" if f["covered"] is None else f"{f['covered']}/{len(f['reals']) or k}"
        ratio = f["interval_width_ratio"]
        width = "-" if ratio is None else ("∞ (no real spread)" if ratio == math.inf else f"{ratio:.1f}×")
        meets = {True: "yes", False: "NO", None: "-"}[f["meets"]]
        if f["interval_ok"] is not None:
            meets += " · interval " + ("ok" if f["interval_ok"] else "NO")
        engine = "-" if f.get("error_at_engine") is None else (
            f"{_pct(f['error_at_engine'])} (×{f['engine_ratio']:.2f})")
        rows.append([f["setting"], name, pred, real, cv, _pct(f["error"]), engine, covered, width, meets])
    return rows


REPEAT_COLUMNS = ["setting", "figure", "predicted (interval)", "real median (min–max)", "CV", "error",
                  "error at the engine's speed", "covered", "width ÷ spread", "target"]


def print_repeats(report: dict) -> None:
    rows = repeat_rows(report)
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(REPEAT_COLUMNS)]
    print(f"  {report['workload']}: {report['k']} real runs per setting; error = predicted − real median, "
          "÷ the median; covered = real runs inside the interval")
    print("  " + "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(REPEAT_COLUMNS, widths))))
    for r in rows:
        print("  " + "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))


def repeats_markdown(reports: list[dict], when: str, load: tuple[float, float] | None) -> str:
    """docs/whatif.md's generated section: the method line, then per workload its runs (load
    average and machine mark beside each) and the figures' table. ``load``: the 1-minute
    load average at the start and the end (None: ``when`` says it, for saved reports)."""
    loads = "" if load is None else (f", load average (1 min) {load[0]:.2f} at the start and {load[1]:.2f} "
                                     "at the end")
    out = [f"Measured {when}: {os.cpu_count()} cores{loads}; each setting run {reports[0]['k'] if reports else 0} "
           "times, alternated (recorded setting, then each changed one, round after round).", ""]
    for rep in reports:
        out += [f"**{rep['workload']}** ({rep['description']}); step-time model: "
                f"{(rep.get('step_time_model') or {}).get('source', '-')}; the recording's machine mark "
                f"{_mark(rep['recorded_speed_mark_us'])}.", "",
                "| round | setting | wall | load before → after | machine mark (× the recording's) "
                "| engine's decode steps (× the recording's) |",
                "|---|---|---|---|---|---|"]
        for r in rep["runs"]:
            ratio = f" (×{r['machine_ratio']:.2f})" if r["machine_ratio"] else ""
            engine = f"×{r['decode_ratio']:.2f}" if r.get("decode_ratio") else "-"
            out.append(f"| {r['round']} | {r['setting']} | {r['wall_s']:.0f} s | {r['load_before']:.2f} → "
                       f"{r['load_after']:.2f} | {_mark(r['speed_mark_us'])}{ratio} | {engine} |")
        shorts = [f[1] for f in REPEAT_FIGURES]
        out += ["", "Per setting and figure: the prediction's error against the real runs' median, how many "
                "real runs its interval covers, the real runs' spread ((max − min) / median); ✓ / ✗ before the "
                "error: its target met or missed; after the count: the interval's (≥ 80 % of the runs covered, no "
                "wider than 2× their spread); `engine` (seconds): the error left once the prediction is carried to "
                "the real runs' engine speed (their median decode-step ratio to the recording's).", "",
                "| setting | " + " | ".join(shorts) + " |", "|---|" + "---|" * len(shorts)]
        for setting in dict.fromkeys(f["setting"] for f in rep["figures"]):
            cells = [_cell(f) for f in rep["figures"] if f["setting"] == setting]
            out.append(f"| {setting} | " + " | ".join(cells) + " |")
        out += ["", "<details><summary>every figure: predicted (interval), real median (min–max), coefficient of "
                "variation</summary>", "", "| " + " | ".join(REPEAT_COLUMNS) + " |", "|" + "---|" * len(REPEAT_COLUMNS)]
        out += ["| " + " | ".join(row) + " |" for row in repeat_rows(rep)]
        out += ["", "</details>", ""]
    return "\n".join(out).rstrip() + "\n"


def _cell(f: dict) -> str:
    """One figure of one setting in the doc's table: ``✓ +3.1% · 3/3 ✓ · spread 12%``."""
    mark = {True: "✓ ", False: "✗ ", None: ""}[f["meets"]]
    text = mark + _pct(f["error"])
    if f["covered"] is not None:
        text += f" · {f['covered']}/{len(f['reals'])}" + {True: " ✓", False: " ✗", None: ""}[f["interval_ok"]]
    if f["rel_range"] is not None:
        text += f" · spread {f['rel_range'] * 100:.0f}%"
    if f.get("error_at_engine") is not None:
        text += f" · engine {_pct(f['error_at_engine'])}"
    return text


def write_doc(path: Path, text: str) -> None:
    """Replace what lies between :data:`DOC_BEGIN` and :data:`DOC_END` in ``path`` with ``text``.

    Raises:
        SystemExit: the markers are missing.
    """
    replace_section(path, DOC_BEGIN, DOC_END, lambda _old: text, "repeats")


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
    rows: list[dict[str, Any]] = []
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
    p.add_argument("--repeats", type=int, metavar="K",
                   help="run the recorded setting and each changed one for real K times each, alternated, and "
                        "report the real spread beside each prediction (no replay-speed part)")
    p.add_argument("--rejudge", type=Path, nargs="+", metavar="JSON",
                   help="judge saved --repeats reports (--json files) again, each run's engine speed read from "
                        "its run directory; with --write-doc, the tables from them (--when: when they were run)")
    p.add_argument("--when", help="with --rejudge: when the saved runs were measured, for the doc's first line")
    p.add_argument("--stand-in", action="store_true",
                   help="with --repeats: a virtual-clock stand-in (vLLM's Scheduler, a known step cost) instead of "
                        "real engines; deterministic, zero spread")
    p.add_argument("--no-profile", action="store_true",
                   help="with --repeats: predict with the recording-only model (no calibration)")
    p.add_argument("--write-doc", nargs="?", const=DOC, type=Path, metavar="PATH",
                   help="with --repeats or --coverage: write the tables into docs/whatif.md's accuracy or coverage "
                        "section (or PATH)")
    p.add_argument("--coverage", action="store_true",
                   help="per configuration (prefix caching, async, spec decode, sliding window, DP ranks): the "
                        "replay at the recorded settings against the recording (benchmarks/coverage.py)")
    p.add_argument("--coverage-rows", metavar="NAMES", help="with --coverage: a comma list of the rows to run "
                                                            "(default: all)")
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
    if args.repeats is not None and args.repeats < 1:
        p.error("--repeats: at least 1")
    if (args.stand_in or args.no_profile) and args.repeats is None:
        p.error("--stand-in and --no-profile go with --repeats K")
    if args.write_doc and args.repeats is None and not args.coverage and not args.rejudge:
        p.error("--write-doc goes with --repeats K, --rejudge or --coverage")
    if args.rejudge and (args.repeats is not None or args.coverage or args.quick or args.speed_only):
        p.error("--rejudge excludes --repeats, --coverage, --quick and --speed-only")
    if args.when and not args.rejudge:
        p.error("--when goes with --rejudge")
    if args.coverage and (args.repeats is not None or args.quick or args.speed_only):
        p.error("--coverage excludes --repeats, --quick and --speed-only")
    if args.coverage_rows is not None and not args.coverage:
        p.error("--coverage-rows goes with --coverage")
    if args.repeats is not None and (args.quick or args.speed_only):
        p.error("--repeats excludes --quick and --speed-only")
    logging.getLogger("vllm").setLevel(logging.ERROR)  # its backend warnings, in every replay
    if args.speed_one:
        n, steps = (int(x) for x in args.speed_one.split(","))
        print(json.dumps(speed_one(n, steps)))
        return 0
    print(f"machine: {os.cpu_count()} cores; load avg {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    report: dict = {}
    if args.coverage:
        from benchmarks import coverage

        try:
            rows = coverage.parse_rows(args.coverage_rows)
        except ValueError as e:
            p.error(f"--coverage-rows: {e}")
        parent = args.out or Path(tempfile.mkdtemp(prefix="bench-whatif-coverage-"))
        report["coverage"] = [r.to_dict() for r in coverage.run(rows, parent, args.write_doc)]
    elif args.rejudge:
        saved = [r for path in args.rejudge for r in json.loads(path.read_text())["repeats"]]
        parent = args.out or Path(tempfile.mkdtemp(prefix="bench-whatif-rejudge-"))
        report["repeats"] = [with_engine_speed(r, parent) for r in saved]
        for r in report["repeats"]:
            print_repeats(r)
        if args.write_doc:
            write_doc(args.write_doc, repeats_markdown(report["repeats"], args.when or "(when: not given)", None))
            print(f"\nwrote the repeats tables into {args.write_doc}")
    elif args.repeats is not None:
        parent = args.out or Path(tempfile.mkdtemp(prefix="bench-whatif-repeats-"))
        load_start = os.getloadavg()[0]
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        engines: list = [StandInEngine()] if args.stand_in else [RealEngine(n, args.requests, args.think_ms)
                                                                for n in names]
        profile: Path | bool | None = False if args.no_profile else args.profile
        report["repeats"] = []
        for engine in engines:
            if not args.stand_in:
                engine.profile = profile
            report["repeats"].append(repeats(engine, parent, args.repeats, args.jobs, settings,
                                             args.calibrate_seconds))
            if not args.stand_in and profile is None:
                profile = engine.profile  # calibrated on the first workload's recording: reused
        if args.write_doc:
            write_doc(args.write_doc, repeats_markdown(report["repeats"], when, (load_start, os.getloadavg()[0])))
            print(f"\nwrote the repeats tables into {args.write_doc}")
    elif args.quick:
        report["speed"] = speed([(8, 200)])
    else:
        if not args.speed_only:
            parent = args.out or Path(tempfile.mkdtemp(prefix="bench-whatif-"))
            report["accuracy"] = []
            acc_profile: Path | None = args.profile
            for name in names:
                row, acc_profile = accuracy(name, parent, args.jobs, acc_profile, args.calibrate_seconds,
                                            args.requests, settings, args.think_ms)
                report["accuracy"].append(row)
        if not args.no_speed:
            report["speed"] = speed([(8, 3000), (32, 2000), (32, 8000), (256, 600)])
    print(f"\nload avg at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
