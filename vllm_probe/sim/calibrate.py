"""``vllm-probe calibrate``: measure an engine's step time over a designed space of steps
and write a step-time profile (:mod:`vllm_probe.sim.profile`).

**What runs.** The engine the recorded run used (model, dtype, ``max_model_len``, block
size, ``max_num_seqs``, the KV cache as recorded; the vLLM installed here must be the
recorded release) is started in a child process with the probe enabled
(:func:`vllm_probe.runs.launcher.probe_env`), into a temporary run directory, with a
token budget of :data:`BUDGET_FACTOR` × the recorded one (capped at ``max_model_len``)
so prefills of that size happen unchunked. The child sends :func:`design`'s groups one
after another (``LLM.generate`` per group: a group runs alone, from an idle engine):

* **prefill sweep**: one request of ``P`` prompt tokens and 2 output tokens, ``P`` on a
  geometric grid of 20 from 1 to the largest prefill (twice each: the first of a size pays
  the eager CPU backend's new-shape cost, ``new_shape``);
* **decode sweep**: ``B`` requests of ``L`` prompt tokens and :data:`DECODE_STEPS`
  output tokens, ``B`` on a geometric grid from 1 to ``max_num_seqs`` and every power of two, ``L`` across the
  context the KV cache holds for ``B`` requests (up to ``max_model_len``);
* **mixed steps**: ``B`` short requests decoding while long prompts are chunked beside
  them (one group: the scheduler mixes them itself).

The probe records every step; :func:`fit_profile` reads the run as any recording
(:func:`vllm_probe.sim.stepmodel.recorded_features`), fits the terms of
:data:`PROFILE_TERMS` plus hinges chosen by measurement (:func:`choose_hinges`), by
non-negative least squares on *relative* error (step times span 1 ms to seconds), and
reports its error per region. The profile is written under a temporary name and renamed
when complete; the temporary run directory is removed (Ctrl-C leaves neither).

**Time** (measured here, docs/whatif.md): the engine's start-up (30-60 s on this CPU for
the tiny model) plus the steps; on a GPU, start-up (weights, CUDA graphs, the KV cache
profile run: 1-3 min for a 7-8B model) dominates, and the steps take seconds.

The stand-in (:class:`StandIn`) drives the same design through vLLM's real scheduler on
a virtual clock whose steps cost what a given function says: a known engine, for tests.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable, Sequence

import numpy as np

from ..analysis.workload import Workload, WorkloadRequest, load_workload
from ..runs.rundir import read_meta, write_meta
from . import profile as profiles
from .profile import Identity, Profile, ProfileError, RegionFit
from .stepmodel import FEATURES, fit_rows, recorded_features, region_of, term_columns

#: Column of each feature in a :data:`~vllm_probe.sim.stepmodel.FEATURES` row.
_COLUMN = {name: i for i, name in enumerate(FEATURES)}

#: Calibration budget: this many times the recorded ``max_num_batched_tokens`` (capped at
#: ``max_model_len``): the issue asks prefills of at least 4× the recorded budget.
BUDGET_FACTOR = 4
#: Output tokens of each decode-sweep request (decode steps per group ≈ this − 1).
DECODE_STEPS = 16
#: Points of the prefill grid and of the decode-batch grid.
PREFILL_POINTS = 20
BATCH_POINTS = 6
#: Contexts per decode batch.
CONTEXT_POINTS = 3
#: The profile's terms before hinges (features of :mod:`vllm_probe.sim.stepmodel`).
PROFILE_TERMS = ("prefill_tokens", "prefill_reqs", "attn_prefill", "decode_reqs", "attn_decode", "new_shape",
                 "first_step")
#: A hinge is kept when it lowers the relative squared error by at least this share (5 %).
HINGE_GAIN = 0.05
#: Most hinges per feature.
MAX_HINGES = 2
#: The default time limit of the child's step sweep (s; start-up not included).
DEFAULT_MAX_SECONDS = 150.0

Group = list[tuple[int, int]]  # (prompt tokens, output tokens) per request, sent together


class CalibrateError(Exception):
    """Calibration cannot run or failed; the message is one line."""


def _geom(lo: int, hi: int, n: int) -> list[int]:
    """About ``n`` integers from ``lo`` to ``hi`` (both included), geometrically spaced."""
    if hi <= lo:
        return [max(lo, 1)]
    return sorted({round(v) for v in np.geomspace(max(lo, 1), hi, n)})


@dataclass
class Plan:
    """The calibration engine's settings and the groups it is driven through.

    Attributes:
        budget: the calibration engine's ``max_num_batched_tokens`` (tokens).
        max_num_seqs, max_model_len, block_size, num_blocks: as recorded.
        groups: :data:`Group` s in the order they are sent.
    """

    budget: int
    max_num_seqs: int
    max_model_len: int
    block_size: int
    num_blocks: int
    groups: list[Group] = field(default_factory=list)


def design(config: dict[str, Any]) -> Plan:
    """The designed space for a recorded ``engine_config`` (see the module docstring).

    Prefill sizes go to ``min(4 × budget, max_model_len − 2, KV capacity − 2 blocks)``;
    a decode group of ``B`` requests of ``L`` prompt tokens keeps ``B × (L + 16 + a block)``
    within 97 % of the KV capacity (a KV-bound recording decodes near a full cache).
    """
    budget = int(config.get("max_num_batched_tokens") or 2048)
    seqs = int(config.get("max_num_seqs") or 16)
    mml = int(config.get("max_model_len") or 2048)
    bs = int(config.get("block_size") or 16)
    blocks = int(config.get("num_kv_blocks") or 0)
    capacity = (blocks - 1) * bs if blocks > 1 else BUDGET_FACTOR * budget * seqs
    cal_budget = max(min(BUDGET_FACTOR * budget, mml), seqs, budget)
    pmax = max(1, min(BUDGET_FACTOR * budget, mml - 2, capacity - 2 * bs))
    plan = Plan(cal_budget, seqs, mml, bs, blocks)
    prefills = _geom(1, pmax, PREFILL_POINTS)
    # powers of two too: batch regimes change there (kernel tiles, CUDA-graph batch sizes)
    batches = sorted(set(_geom(1, seqs, BATCH_POINTS)) | {1 << k for k in range(seqs.bit_length()) if 1 << k <= seqs})
    decodes: list[Group] = []
    for b in batches:
        lmax = min(mml - DECODE_STEPS - 1, int(0.97 * capacity / b) - DECODE_STEPS - bs)
        if lmax < 1:
            continue
        for length in _geom(min(16, lmax), lmax, CONTEXT_POINTS):
            decodes.append([(length, DECODE_STEPS)] * b)
    mixed: list[Group] = []
    long_len = max(1, min(2 * budget, pmax))
    for b in batches[1::2] or batches:
        short = min(16, max(1, mml - 66))
        n_long = max(1, min(4, int(0.5 * capacity / max(long_len, 1))))
        if b * (short + 64 + bs) + n_long * (long_len + bs) <= 0.9 * capacity:
            mixed.append([(short, 64)] * b + [(long_len, 1)] * n_long)
    # interleaved so that a time limit cuts every part of the space, not the last one
    for i in range(max(len(prefills), len(decodes), len(mixed))):
        if i < len(prefills):
            plan.groups += [[(prefills[i], 2)], [(prefills[-1 - i], 2)]]
        if i < len(decodes):
            plan.groups.append(decodes[i])
        if i < len(mixed):
            plan.groups.append(mixed[i])
    return plan


def describe_group(group: Group) -> str:
    """A group's shape in words, for the progress lines: ``prefill 1,024 tokens``,
    ``decode 8 × 300-token contexts``, ``mixed: 4 decoding beside 2 × 2,048-token prefills``."""
    if len(group) == 1 and group[0][1] <= 2:
        return f"prefill {group[0][0]:,} tokens"
    if len(set(group)) == 1:
        return f"decode {len(group)} × {group[0][0]:,}-token contexts"
    longs = [p for p, n in group if n == 1]
    return (f"mixed: {len(group) - len(longs)} decoding beside {len(longs)} × {max(longs, default=0):,}-token "
            "prefills")


def choose_hinges(rows: np.ndarray, periods: np.ndarray, terms: Sequence[str]) -> tuple[str, ...]:
    """``terms`` plus the hinges (``prefill_tokens>k``, ``decode_reqs>k``) that measurably
    improve the fit: greedily, the candidate knot of either feature (a value seen in the
    data, between its 10th and 90th percentile) that lowers the relative squared error
    most, kept when it lowers it by :data:`HINGE_GAIN` or more; at most
    :data:`MAX_HINGES` per feature."""
    ok = np.isfinite(periods) & (periods > 0)
    r, y = rows[ok], periods[ok]

    def sse(ts: Sequence[str]) -> float:
        x = term_columns(r, ts)
        w = 1.0 / y
        a = np.column_stack([np.ones(len(y)), x]) * w[:, None]
        from .stepmodel import nnls

        b = nnls(a, y * w)
        return float(np.sum((a @ b - y * w) ** 2))

    chosen = list(terms)
    best = sse(chosen)
    cands: dict[str, list[float]] = {}
    for name in ("prefill_tokens", "decode_reqs"):
        col = r[:, _COLUMN[name]]
        vals = np.unique(col[col > 0])
        if len(vals) < 4:
            continue
        lo, hi = np.quantile(vals, 0.1), np.quantile(vals, 0.9)
        found = [float(v) for v in vals if lo <= v <= hi]
        if len(found) > 24:
            found = [found[int(i)] for i in np.linspace(0, len(found) - 1, 24)]
        cands[name] = found
    while True:  # each round: the best hinge of any feature
        trials = [(sse(chosen + [f"{name}>{k:g}"]), f"{name}>{k:g}") for name, ks in cands.items()
                  if sum(t.startswith(name + ">") for t in chosen) < MAX_HINGES
                  for k in ks if f"{name}>{k:g}" not in chosen]
        if not trials:
            break
        err, term = min(trials)
        if err > best * (1 - HINGE_GAIN):
            break
        chosen.append(term)
        best = err
    return tuple(chosen)


def region_fits(rows: np.ndarray, periods: np.ndarray, predict: Callable[[Sequence[float]], float]) -> list[RegionFit]:
    """The error per region: prefill-only steps by prefill tokens, decode-only steps by
    decode batch and by context tokens (4 geometric bins each)."""
    ok = np.isfinite(periods) & (periods > 0)
    out = []
    pre = ok & (rows[:, _COLUMN["prefill_tokens"]] > 0) & (rows[:, _COLUMN["decode_reqs"]] == 0)
    dec = ok & (rows[:, _COLUMN["prefill_tokens"]] == 0) & (rows[:, _COLUMN["decode_reqs"]] > 0)
    for quantity, mask in (("prefill_tokens", pre), ("decode_reqs", dec), ("attn_decode", dec)):
        if not mask.any():
            continue
        v = rows[mask, _COLUMN[quantity]]
        y = periods[mask]
        rel = np.abs(np.array([predict(x) for x in rows[mask]]) - y) / y
        edges = np.unique(np.geomspace(max(v.min(), 1), max(v.max(), 1), 5))
        for lo, hi in zip(edges[:-1], edges[1:]):
            m = (v >= lo) & ((v <= hi) if hi == edges[-1] else (v < hi))
            if m.any():
                out.append(RegionFit(quantity=quantity, lo=float(lo), hi=float(hi), steps=int(m.sum()),
                                     median_rel_err=float(np.median(rel[m])),
                                     p90_rel_err=float(np.quantile(rel[m], 0.9))))
    return out


def fit_profile(run_dir: Path, ident: Identity, seconds: float = 0.0, command: list[str] | None = None) -> Profile:
    """Fit a profile on a calibration run directory (see the module docstring).

    Raises:
        CalibrateError: the run holds too few measured steps.
    """
    w = load_workload(run_dir)
    rows, periods = recorded_features(w)
    if int(np.isfinite(periods).sum()) < len(PROFILE_TERMS) + 8:
        raise CalibrateError(f"the calibration run recorded only {int(np.isfinite(periods).sum())} measured steps; "
                             "too few to fit (raise --max-seconds)")
    terms = choose_hinges(rows, periods, PROFILE_TERMS)
    model = fit_rows(rows, periods, terms, source=str(run_dir), relative=True)
    model.level = 1.0  # the shape only: a recording gives the level
    ok = np.isfinite(periods)
    return Profile(terms=list(model.terms), intercept_s=model.intercept, coef_s=list(model.coef),
                   region=region_of(rows[ok]), fit=region_fits(rows, periods, model.raw), measured_on=ident,
                   steps=int(ok.sum()), seconds=seconds, created=time.time(), command=list(command or []))


# -- drivers -------------------------------------------------------------------------------


class StandIn:
    """A known engine: the plan's groups replayed through vLLM's real scheduler (the
    probe installed) on a virtual clock whose steps last ``cost(features)`` seconds
    (features: :data:`~vllm_probe.sim.stepmodel.FEATURES`). Each group starts 1,000 s
    after the previous one (always from an idle engine)."""

    def __init__(self, cost: Callable[[Sequence[float]], float]) -> None:
        self.cost = cost

    def __call__(self, plan: Plan, run_dir: Path, max_seconds: float) -> None:
        from ..engine.sink import EventSink
        from .harness import SchedulerSpec
        from .replay import replay

        reqs: list[WorkloadRequest] = []
        t = 1000.0
        for group in plan.groups:
            for p, n in group:
                reqs.append(WorkloadRequest(order=len(reqs), req_id=f"cal{len(reqs)}", prompt_len=p, max_tokens=n,
                                            output_tokens=n, arrival_ts=t, added_ts=t, finish_reason="length"))
            t += 1000.0
        w = Workload("calibration", {"scheduler_class": "Scheduler", "hash_block_size": plan.block_size}, reqs)
        spec = SchedulerSpec(max_num_batched_tokens=plan.budget, max_num_seqs=plan.max_num_seqs,
                             num_blocks=plan.num_blocks or 4096, block_size=plan.block_size,
                             max_model_len=plan.max_model_len)
        sink = EventSink(run_dir / "events-1.jsonl")
        try:
            replay(w, spec, self.cost, sink, lag_s=0.0)
        finally:
            sink.close()
        write_meta(run_dir, {"command": ["calibrate", "stand-in"], "start_time": 1.0})


def engine_kwargs(config: dict[str, Any], found: dict[str, str], plan: Plan) -> dict[str, Any]:
    """``vllm.LLM`` arguments of the calibration engine: the recorded engine at the
    calibration budget, prefix caching off (every prompt is unique anyway)."""
    kw: dict[str, Any] = dict(model=found["model"], dtype=found.get("dtype", "auto"), seed=0,
                              max_model_len=plan.max_model_len, block_size=plan.block_size,
                              max_num_seqs=plan.max_num_seqs, max_num_batched_tokens=plan.budget,
                              enable_chunked_prefill=True, enable_prefix_caching=False,
                              tensor_parallel_size=int(found.get("tensor_parallel_size", 1)),
                              pipeline_parallel_size=int(found.get("pipeline_parallel_size", 1)))
    if found.get("load_format"):
        kw["load_format"] = found["load_format"]
    if found.get("load_format") == "dummy":
        kw["enforce_eager"] = True  # the examples' engines (tiny model, CPU)
    if config.get("num_gpu_blocks_override"):
        kw["num_gpu_blocks_override"] = int(config["num_gpu_blocks_override"])
    if config.get("gpu_memory_utilization"):
        kw["gpu_memory_utilization"] = float(config["gpu_memory_utilization"])
    return kw


#: How often the parent relays the child's progress lines (s).
PROGRESS_POLL_S = 0.5


class ProgressRelay:
    """Relays the calibration child's progress file to ``log``, one call per complete line
    (the child appends a line when the engine has started and after each group)."""

    def __init__(self, path: Path, log: Callable[[str], None]) -> None:
        self.path = path
        self.log = log
        self.offset = 0

    def poll(self) -> int:
        """Relay the lines completed since the last poll; returns how many."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:  # not written yet
            return 0
        end = data.rfind(b"\n") + 1
        self.offset += end
        lines = [ln for ln in data[:end].decode(errors="replace").splitlines() if ln.strip()]
        for line in lines:
            self.log(line)
        return len(lines)


class RealEngine:
    """Drives the plan through a real vLLM engine in a child process under the probe; the
    child's progress (engine start, then each shape group) goes to ``log`` as it happens."""

    def __init__(self, kwargs: dict[str, Any], log: Callable[[str], None] | None = None) -> None:
        self.kwargs = kwargs
        self.log = log or (lambda _s: None)

    def __call__(self, plan: Plan, run_dir: Path, max_seconds: float) -> None:
        from ..runs.launcher import probe_env
        from ..settings import load_settings

        spec = run_dir.parent / "calibrate-plan.json"
        progress = run_dir.parent / "progress.txt"
        spec.write_text(json.dumps({"engine": self.kwargs, "groups": plan.groups, "max_seconds": max_seconds,
                                    "progress": str(progress)}))
        log_path = run_dir.parent / "engine.log"
        env = probe_env(run_dir, load_settings(None))
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        relay = ProgressRelay(progress, self.log)
        self.log("starting the engine (the groups follow once it is up)")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "vllm_probe.sim.calibrate", str(spec)], env=env,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                while True:
                    try:
                        code = proc.wait(timeout=PROGRESS_POLL_S)
                        break
                    except subprocess.TimeoutExpired:
                        relay.poll()
                relay.poll()
            except BaseException:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise
        if code != 0:
            text = log_path.read_text(errors="replace")
            raise CalibrateError("the engine did not start or failed: " + last_error(text))


def last_error(text: str) -> str:
    """The last ``SomethingError: ...`` line of a log (the engine's failure in one line)."""
    lines = [ln.strip() for ln in text.splitlines() if re.match(r"^\s*(\w+\.)*\w*(Error|Exception)\b.*:", ln)]
    if lines:
        return lines[-1][:300]
    tail = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return tail[-1][:300] if tail else "no output (see the engine's log)"


def _child(spec_path: str) -> int:
    """The child: start the engine, send each group, stop at the time limit."""
    spec = json.loads(Path(spec_path).read_text())
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    progress = spec.get("progress")

    def tell(line: str) -> None:  # one whole line per write: the parent relays complete lines
        if progress:
            with open(progress, "a") as f:
                f.write(line + "\n")

    t0 = time.time()
    llm = LLM(**spec["engine"])
    groups = spec["groups"]
    tell(f"engine started in {time.time() - t0:.0f} s; {len(groups)} groups, up to {spec['max_seconds']:.0f} s")
    start = time.time()
    deadline = start + float(spec["max_seconds"])
    for g, group in enumerate(groups):
        if time.time() > deadline:
            print(f"calibrate: time limit reached after {g} of {len(groups)} groups", flush=True)
            tell(f"time limit reached after {g} of {len(groups)} groups")
            break
        prompts = [TokensPrompt(prompt_token_ids=[3 + (g * 7919 + i * 131 + j * 31) % 500 for j in range(p)])
                   for i, (p, _) in enumerate(group)]
        params = [SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0) for _, n in group]
        llm.generate(prompts, params, use_tqdm=False)
        tell(f"group {g + 1}/{len(groups)}: {describe_group([tuple(r) for r in group])} "
             f"({time.time() - start:.0f} s)")
    return 0


def calibrate(like: str | Path, out: str | Path | None, max_seconds: float = DEFAULT_MAX_SECONDS, *,
              model: str | None = None, dtype: str | None = None, driver: Any = None,
              cache: bool = True, log: Callable[[str], None] | None = None,
              force: bool = False) -> tuple[Profile, list[Path]]:
    """Calibrate the engine ``like`` recorded; write the profile to ``out`` (and to the
    cache directory when ``cache``); returns the profile and the paths written.

    Args:
        like: a recorded run (its ``engine_config`` and ``meta.json`` name the engine).
        out: the profile's path (None: the cache only).
        max_seconds: time limit of the step sweep (s; the engine's start-up excluded).
        model, dtype: override what the run's command line says.
        driver: ``driver(plan, run_dir, max_seconds)`` (default :class:`RealEngine`).
        log: gets the progress, one line at a time (the engine's start, each group,
            a cached profile replaced).
        force: replace an existing ``out`` (without it an existing file is refused
            before anything runs). The cache's profile of the same engine is replaced
            either way, and ``log`` says which.

    Raises:
        CalibrateError: ``out`` exists (without ``force``), the run names no engine, the
            model folder is gone, vLLM is not the recorded release, the engine failed, too
            few steps (one line each).
    """
    log = log or (lambda _s: None)
    if out is not None and Path(out).exists() and not force:
        raise CalibrateError(f"{out} exists; pass --force to replace it, or choose another --out")
    like = Path(like)
    w = load_workload(like)
    config = w.config
    ident, found, assumed = profiles.identity_of_run(config, read_meta(like), model, dtype)
    if assumed:
        log(f"the run's command names no model; assuming the tiny local model {found['model']} "
            "(dummy weights, float32), as the examples use (pass --model otherwise)")
    plan = design(config)
    if driver is None:
        mpath = found["model"]
        if (mpath.startswith(("/", "./", "~")) or (os.sep in mpath and not re.match(r"^[\w.-]+/[\w.-]+$", mpath))) \
                and not Path(os.path.expanduser(mpath)).exists():
            raise CalibrateError(f"the model folder {mpath} is gone; pass --model PATH to calibrate that engine")
        try:
            import vllm
        except ImportError:
            raise CalibrateError("calibrate starts a vLLM engine and needs vLLM installed here") from None
        if ident.vllm not in ("?", vllm.__version__):
            raise CalibrateError(f"the run was recorded on vLLM {ident.vllm}, this is {vllm.__version__}: "
                                 "calibrate with the recorded release")
        driver = RealEngine(engine_kwargs(config, found, plan), log)
    start = time.time()
    work = Path(tempfile.mkdtemp(prefix="vllm-probe-calibrate-"))
    try:
        run_dir = work / "run"
        run_dir.mkdir()
        log(f"calibrating {ident.model} on {ident.hardware}: {len(plan.groups)} groups of requests, budget "
            f"{plan.budget}, up to {max_seconds:.0f} s of steps")
        driver(plan, run_dir, max_seconds)
        seconds = time.time() - start
        prof = fit_profile(run_dir, ident, seconds, ["vllm-probe", "calibrate", "--like", str(like)])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    written = []
    target = profiles.cache_path(ident)
    replaced = _replaced(target) if cache else None  # read before --out could be that very file
    if out is not None:
        written.append(profiles.save(prof, out))
    if cache:
        try:
            written.append(profiles.save(prof, target))
        except OSError as e:
            log(f"could not store the profile in {profiles.cache_dir()}: {e}")
        else:
            if replaced:
                log(f"replaced the profile cache's {target} ({replaced})")
    return prof, written


def _replaced(path: Path) -> str | None:
    """What the cache file about to be replaced held, in words (None: no file there)."""
    if not path.exists():
        return None
    try:
        old = profiles.load(path)
    except ProfileError:
        return "an unreadable file"
    return f"measured {time.strftime('%Y-%m-%d %H:%M', time.localtime(old.created))}, {old.steps} steps"


if __name__ == "__main__":  # the calibration engine's child process
    sys.exit(_child(sys.argv[1]))


__all__ = ["CalibrateError", "Plan", "ProfileError", "ProgressRelay", "RealEngine", "StandIn", "calibrate",
           "choose_hinges", "describe_group", "design", "fit_profile", "region_fits"]
