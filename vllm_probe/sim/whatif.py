"""``vllm-probe whatif``: a recorded run replayed through vLLM's own scheduler at other settings.

The stable entry point (the ``whatif`` command and ``vllm-probe doctor --whatif`` use it)::

    from vllm_probe.sim.whatif import predict

    result = predict("vllm-probe-runs/20261201-long_prompts",
                     [{"max_num_batched_tokens": 2048}, {"num_kv_blocks": 128}], jobs=2)
    result.baseline.error["within"]            # the self-replay is credible
    for cfg in result.configs:                  # one per point of the grid, in order
        cfg.settings["max_num_batched_tokens"]  # every setting in force, by name
        cfg.summary.preemptions.count, cfg.summary.latency.ttft_s.p90, cfg.run_dir

What :func:`predict` does:

1. reads the run's workload (:func:`vllm_probe.analysis.workload.load_workload`: arrivals,
   prompt and output lengths, priorities, block digests) or a timed trace with a
   recorded run's settings (``trace=``);
2. fits the step-time model on the recorded steps (:func:`vllm_probe.sim.stepmodel.fit`);
3. resolves and checks every point of the grid as vLLM would at start-up
   (:mod:`vllm_probe.sim.engine_args`), before anything runs;
4. replays the recorded settings (the *baseline*) and each point of the grid
   (:func:`vllm_probe.sim.replay.replay`), ``jobs`` processes at a time, each into an
   ordinary run directory (``meta.json`` says ``simulated``, the source and the
   settings), summarized with the summary every other command uses;
5. measures the baseline against the recorded run (:data:`BASELINE_TOLERANCES`).

Errors: :class:`WhatifError` (one line: no vLLM, a run that is not replayable),
:class:`~vllm_probe.sim.engine_args.SettingError` (a setting vLLM would refuse),
:class:`~vllm_probe.analysis.workload.WorkloadError` (a run without request or step
events, the flag named).
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import multiprocessing
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__, envvars
from ..analysis.compare import relative_errors
from ..analysis.summary import Summary, analyze_story
from ..analysis.workload import Workload, WorkloadError, load_workload
from ..engine.sink import EventSink
from ..runs.rundir import META_FILE, atomic_dir, read_meta, write_meta
from . import engine_args
from .engine_args import SettingError
from . import arrivals as arrival_models
from . import profile as profiles
from .arrivals import Arrivals, ArrivalsError
from .profile import Profile, ProfileError
from .stepmodel import DriftModel, StepTimeModel, drift_factors, fit, fit_level

#: The baseline replay's largest accepted relative error per figure (labels of
#: :data:`vllm_probe.analysis.compare.FIGURES`): the issue's targets, 2 % for
#: scheduling figures and 5 % for throughput and time to first token.
BASELINE_TOLERANCES = {
    "steps": 0.02,
    "preemptions": 0.02,
    "chunks/prompt mean": 0.02,
    "output tokens/s": 0.05,
    "TTFT median": 0.05,
    "TTFT p90": 0.05,
}
#: Above this drift of the recorded run's speed (:attr:`~vllm_probe.sim.stepmodel.Quality.drift`)
#: a note says the model cannot follow it (±25 %: runs on the quiet machine drift 10-20 %).
DRIFT_NOTE = 0.25
#: Above this drift of the recorded run's speed the baseline replays it
#: (:class:`~vllm_probe.sim.stepmodel.DriftModel`, speed per tenth of the run) and a
#: second, constant-speed baseline says how much of its error is drift (±10 %).
DRIFT_REPLAY = 0.10
#: Events the replay's sink may hold before its writer drains them (the writer runs
#: every 0.1 s; a replay emits a few thousand events in that time).
SINK_CAPACITY = 1 << 20
#: Engine-config fields of the recorded engine a simulated run's ``engine_config`` keeps
#: (the harness scheduler cannot have them: its memory, its KV-cache layout).
_RECORDED_FIELDS = ("kv_cache_groups", "kv_block_bytes", "device_memory_bytes", "gpu_memory_utilization",
                    "num_gpu_blocks_override", "kv_cache_memory_bytes", "num_speculative_tokens",
                    "data_parallel_size")


class WhatifError(Exception):
    """``whatif`` cannot run; the message is one line."""


class ProfileRefused(WhatifError):
    """The step-time profile cannot be used: unreadable, or measured on another model,
    vLLM release or hardware (or dtype, parallelism) than the recording without ``force``;
    the message is one line (:func:`vllm_probe.sim.profile.check`)."""


#: :attr:`StepTimeChoice.source` values: a profile given by path (or object), a matching
#: profile found in the cache (:func:`vllm_probe.sim.profile.find_cached`), or the fit on
#: the recording alone.
MODEL_SOURCES = ("profile", "cache", "recording")


@dataclass
class StepTimeChoice:
    """The step-time model a set of replays uses and where its shape came from.

    Attributes:
        model: the :class:`~vllm_probe.sim.stepmodel.StepTimeModel` (level fitted on the
            recording; seconds per step).
        source: one of :data:`MODEL_SOURCES`.
        profile: the profile's path (``"(given)"`` for a :class:`Profile` object); None
            for the recording-only fit.
        forced: the ``FORCED: ...`` note when a profile of another engine was used with
            ``force``; else None.
        notes: what the report says about it, one line each.
    """

    model: StepTimeModel
    source: str
    profile: str | None = None
    forced: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """``{"source", "profile", "forced"}``: the ``step_time_model`` object of
        ``whatif``/``doctor``/``tune --json``."""
        return {"source": self.source, "profile": self.profile, "forced": self.forced}

    def describe(self) -> str:
        """One phrase: ``profile P.json``, ``profile P.json from the cache`` or
        ``fitted on the recording only``, with ``(FORCED: another engine's)``."""
        if self.source == "recording":
            return "fitted on the recording only"
        text = f"profile {self.profile}" + (" from the cache" if self.source == "cache" else "")
        return text + (" (FORCED: another engine's)" if self.forced else "")


@dataclass
class ConfigResult:
    """One replay.

    Attributes:
        settings: every setting of :data:`~vllm_probe.sim.engine_args.SETTINGS` in
            force, by name (None: not in this vLLM release / not recorded).
        overrides: what the grid point changed (empty for the baseline).
        run_dir: the simulated run directory.
        summary: its :class:`~vllm_probe.analysis.summary.Summary`.
        replay: ``steps``, ``wall_s``, ``cpu_s``, ``virtual_s`` of the replay loop.
    """

    settings: dict[str, Any]
    overrides: dict[str, Any]
    run_dir: Path
    summary: Summary
    replay: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"settings": self.settings, "overrides": self.overrides, "run_dir": str(self.run_dir),
                "summary": self.summary.to_dict(), "replay": self.replay}


@dataclass
class WhatifResult:
    """What :func:`predict` found.

    Attributes:
        source: the recorded run (or the trace file, with ``like`` the run whose
            settings and model it used).
        model: the step-time model fitted on the recorded run.
        recorded: the recorded run's summary (the ``like`` run's for a trace).
        baseline: the replay at the recorded settings (the trace's at the ``like``
            run's settings).
        error: :func:`~vllm_probe.analysis.compare.relative_errors` of the baseline
            against the recorded run (the ``like`` run's own self-replay for a trace),
            with :data:`BASELINE_TOLERANCES`.
        configs: one per point of the grid, in order.
        notes: what the replay assumed or could not reproduce, one line each.
    """

    source: str
    model: StepTimeModel
    recorded: Summary
    baseline: ConfigResult
    error: dict[str, Any]
    configs: list[ConfigResult]
    notes: list[str] = field(default_factory=list)
    like: str | None = None
    arrivals: Arrivals | None = None
    profile: str | None = None
    forced: str | None = None
    drift: dict[str, Any] | None = None
    step_time_model: StepTimeChoice | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``whatif --json`` object: ``source``, ``model``, ``baseline`` (``summary``,
        ``error``, ``settings``, ``run_dir``), ``configs`` and ``notes``."""
        base = self.baseline.to_dict()
        return {
            "source": self.source,
            "like": self.like,
            "model": self.model.to_dict(),
            "recorded": self.recorded.to_dict(),
            "baseline": {**base, "error": self.error},
            "configs": [c.to_dict() for c in self.configs],
            "notes": self.notes,
            "arrivals": self.arrivals.to_dict() if self.arrivals else None,
            "profile": self.profile,
            "forced": self.forced,
            "step_time_model": self.step_time_model.to_dict() if self.step_time_model else None,
            "drift": self.drift,
        }


def quiet_vllm() -> None:
    """vLLM's log at ``ERROR`` in this process and the replays it starts (unless the user
    set ``VLLM_LOGGING_LEVEL``): its start-up warnings here are about this machine's
    backend (Triton, the SSM cache type), not about the replay."""
    import logging

    if os.environ.setdefault(envvars.VLLM_LOGGING_LEVEL, "ERROR") == "ERROR":
        logging.getLogger("vllm").setLevel(logging.ERROR)


def require_vllm() -> None:
    """Raises :class:`WhatifError` when vLLM cannot be imported (reading commands do
    not need it; the replay runs vLLM's own scheduler)."""
    if importlib.util.find_spec("vllm") is None:
        raise WhatifError("whatif replays vLLM's own scheduler and needs vLLM installed in this "
                          "environment (pip install vllm); summary, compare, tail and export work without it")


def predict(run_dir: str | Path, grid: list[dict[str, Any]], out: str | Path | None = None, jobs: int = 1,
            *, trace: str | Path | None = None, trace_hash_size: int = 16,
            trace_sec_multiplier: float = 1.0, mode: str = "timed", step_time_scale: float = 1.0,
            profile: str | Path | Profile | bool | None = None, force: bool = False,
            arrivals: str | Arrivals | None = None, drift: bool = True) -> WhatifResult:
    """Replay the run in ``run_dir`` at its own settings and at each point of ``grid``.

    Args:
        run_dir: a recorded run (with ``trace``: the run whose engine settings and
            step-time model the trace is replayed with).
        grid: settings to change per replay, by the names of
            :data:`~vllm_probe.sim.engine_args.SETTINGS` (``[{}]`` or ``[]``: baseline only).
        out: parent of the simulated run directories (default: ``<run_dir>-whatif``
            next to the run); ``baseline/`` and one directory per grid point, replaced
            when they exist.
        jobs: processes replaying at once (each imports vLLM: ~650 MiB).
        trace: a timed-trace JSONL file (``vllm bench serve --dataset-name
            timed_trace``'s format) to replay instead of the run's own requests.
        trace_hash_size, trace_sec_multiplier: as vLLM's ``--timed-trace-chunk-hash-size``
            and ``--timed-trace-sec-multiplier``.
        mode: ``timed`` (arrivals by time) or ``steps`` (by recorded step index; the
            recorded schedule exactly, whatever the model).
        step_time_scale: multiplies every predicted step time, the baseline's too
            (1.25: an engine 25 % slower than during the recording).
        profile: a step-time profile (``vllm-probe calibrate``; a path or a
            :class:`~vllm_probe.sim.profile.Profile`) whose shape is used, its level
            fitted on the recording; None: a matching profile from the cache when there
            is one (a note says so), else the recording-only fit; False: never a profile.
        force: use a profile measured on another engine (the report marks it).
        arrivals: ``auto``/None (detected), ``open``, ``closed:N[:THINK_MS]`` or an
            :class:`~vllm_probe.sim.arrivals.Arrivals`.
        drift: replay the recording's speed changes in the baseline (above
            :data:`DRIFT_REPLAY`).

    Raises:
        WhatifError, SettingError, WorkloadError: see the module docstring.
    """
    require_vllm()
    run_dir = Path(run_dir)
    recorded_w = load_workload(run_dir)
    try:
        arrival = arrival_models.resolve(recorded_w, arrival_models.parse(arrivals) if isinstance(arrivals, str)
                                         or arrivals is None else arrivals)
    except ArrivalsError as e:
        raise WhatifError(str(e)) from None
    if arrival.kind == "closed":  # a closed-loop client is no offline burst
        recorded_w = _unanchored(recorded_w)
    notes = _notes(recorded_w)
    choice = step_time_model(run_dir, recorded_w, profile, force)
    model, prof_path, forced, prof_notes = choice.model, choice.profile, choice.forced, choice.notes
    notes += prof_notes
    notes.append(arrival.describe())
    speed_drift = model.quality.drift if model.quality else 0.0
    factors = drift_factors(model, recorded_w) if drift and speed_drift and trace is None else []
    drift_on = bool(factors) and max(abs(f - 1) for _, f in factors) > DRIFT_REPLAY and mode == "timed"
    if speed_drift > DRIFT_NOTE and not drift_on:
        notes.append(f"the recorded run's step times drifted by up to ±{speed_drift * 100:.0f} % between tenths of "
                     "the run (the machine's speed changed while it ran); the model assumes one speed, so queues "
                     "that built up in slow stretches are not replayed (docs/whatif.md)")
    if step_time_scale <= 0:
        raise WhatifError(f"the step-time scale must be positive, not {step_time_scale}")
    model.scale = step_time_scale
    if step_time_scale != 1.0:
        notes.append(f"every step time is scaled by {step_time_scale:g}, the baseline's too")
    w = recorded_w
    if trace is not None:
        from ..exporters.trace import trace_workload

        w = trace_workload(Path(trace), recorded_w, trace_hash_size, trace_sec_multiplier)
        mode = "timed"
        notes = _notes(w) + prof_notes
    grid = [dict(point) for point in grid if point] or []
    planned = [_plan(w, {})] + [_plan(w, point) for point in grid]  # checks every point first
    out = Path(out) if out is not None else run_dir.parent / f"{run_dir.name}-whatif"
    names = ["baseline" if trace is None else "trace"] + [_slug(p) for p in grid]
    command = ["vllm-probe", "whatif", str(run_dir)]
    if trace is not None:
        command = ["vllm-probe", "whatif", "--trace", str(trace), "--like", str(run_dir)]
    closed = arrival.closed if trace is None else None
    tasks = [_Task(w, model, overrides, settings, spec, out / name, mode, str(trace or run_dir),
                   command + [a for k, v in overrides.items() for a in ("--set", f"{k}={_text(v)}")], closed)
             for name, (overrides, settings, spec) in zip(names, planned)]
    if drift_on:  # the baseline follows the recording's speed; a constant-speed one measures the drift's share
        base = tasks[0]
        tasks[0] = _Task(base.workload, DriftModel(model, factors), base.overrides, base.settings, base.spec,
                         base.run_dir, base.mode, base.source, base.command, closed)
        tasks.append(_Task(base.workload, model, {}, base.settings, base.spec, out / "baseline-constant-speed",
                           base.mode, base.source, base.command, closed))
    if trace is not None:  # the model's credibility: the like run against its own replay
        settings, spec = planned[0][1], planned[0][2]
        tasks.insert(0, _Task(recorded_w, model, {}, settings, spec, out / "baseline", "timed",
                              str(run_dir), ["vllm-probe", "whatif", str(run_dir)]))
    results = _run_all(tasks, jobs)
    recorded = _summary(run_dir)
    drift_info: dict[str, Any] | None = None
    if drift_on:
        constant = results.pop()
        without = relative_errors(recorded, constant.summary, BASELINE_TOLERANCES)
        drift_info = {"factors": [[s, f] for s, f in factors], "range": [min(f for _, f in factors),
                                                                         max(f for _, f in factors)],
                      "constant_speed_error": without, "constant_speed_run_dir": str(constant.run_dir)}
    self_replay = results[0]
    error = relative_errors(recorded, self_replay.summary, BASELINE_TOLERANCES)
    if drift_info is not None:
        notes.append(_drift_note(speed_drift, error, drift_info["constant_speed_error"]))
    if trace is not None:
        results = results[1:]
    return WhatifResult(str(trace or run_dir), model, recorded, results[0], error, results[1:], notes,
                        like=str(run_dir) if trace is not None else None, arrivals=arrival, profile=prof_path,
                        forced=forced, drift=drift_info, step_time_model=choice)


def _drift_note(drift: float, error: dict[str, Any], without: dict[str, Any]) -> str:
    """How much of the baseline's error is drift: the TTFT errors with and without the
    recording's speed over time."""
    parts = []
    for label in ("TTFT median", "TTFT p90", "output tokens/s"):
        a, b = error["figures"][label]["error"], without["figures"][label]["error"]
        if a is not None and b is not None:
            parts.append(f"{label} {b * 100:+.1f} % at one speed, {a * 100:+.1f} % with the drift")
    return (f"drift: the recording's speed moved by up to ±{drift * 100:.0f} % over the run; the baseline replays "
            "its speed per tenth of the run (the predictions use its average): " + "; ".join(parts)
            + " — the difference is the drift's share of the baseline error")


def _unanchored(w: Workload) -> Workload:
    """``w`` with no request anchored to a step index (a closed-loop client's first
    requests are not an offline burst)."""
    import copy

    w = copy.copy(w)
    w.requests = [copy.copy(r) for r in w.requests]
    for r in w.requests:
        r.anchored = False
    return w


def step_time_model(run_dir: str | Path, w: Workload, profile: str | Path | Profile | bool | None = None,
                    force: bool = False) -> StepTimeChoice:
    """The step-time model of the replays of the run in ``run_dir`` (workload ``w``): a
    profile's shape at the recording's level, or the recording-only fit.

    Args:
        profile: a profile's path or a :class:`~vllm_probe.sim.profile.Profile`; None: the
            newest matching profile in the cache when there is one (a note says so), else
            the recording-only fit; False: the recording-only fit.
        force: use a profile measured on another engine (the choice's ``forced`` says so).

    Raises:
        ProfileRefused: the profile is unreadable or another engine's without ``force``.
        WhatifError: the model cannot be fitted (no step with a measured period).
    """
    run_dir = Path(run_dir)
    notes: list[str] = []
    prof: Profile | None = None
    path: str | None = None
    if profile is not False:
        ident, _, _ = profiles.identity_of_run(w.config, read_meta(run_dir))
        try:
            if isinstance(profile, Profile):
                prof, path = profile, "(given)"
            elif profile is not None:
                path = str(profile)
                prof = profiles.load(path)
            else:
                found = profiles.find_cached(ident)
                if found is not None:
                    path, prof = str(found[0]), found[1]
                    notes.append(f"profile: using {path} from the profile cache (measured on {ident.model}, "
                                 f"{ident.hardware}, vLLM {ident.vllm}); --profile FILE picks another")
            forced = profiles.check(prof, ident, path or "", force) if prof is not None else None
        except ProfileError as e:
            raise ProfileRefused(str(e)) from None
        if prof is not None:
            try:
                model = fit_level(prof.model(path), w)
            except ValueError as e:
                raise WhatifError(str(e)) from None
            if forced:
                notes.append(forced)
            notes.append(f"step-time shape from the profile ({prof.steps} calibration steps, region up to "
                         f"{prof.region.get('prefill_tokens', 0):,.0f} prefill tokens, "
                         f"{prof.region.get('decode_reqs', 0):,.0f} decodes); level ×{model.level:.3g} fitted on "
                         "this recording")
            return StepTimeChoice(model, "cache" if profile is None else "profile", path, forced, notes)
    try:
        model = fit(w)
    except ValueError as e:
        raise WhatifError(str(e)) from None
    notes.append("step-time model fitted on this recording only (no profile: vllm-probe calibrate --like RUN_DIR "
                 "measures one); predictions outside the recorded region extrapolate")
    return StepTimeChoice(model, "recording", None, None, notes)


def _summary(run_dir: Path) -> Summary:
    """The run's summary as ``vllm-probe summary --json`` has it (notable moments included)."""
    return analyze_story(run_dir)[1]


def _notes(w: Workload) -> list[str]:
    """What the replay assumes about this run, one line each."""
    notes = []
    cfg = w.config
    anchored = [r for r in w.requests if r.anchored]
    if len(anchored) > 1:
        by_step: dict[int, int] = {}
        for r in anchored:
            by_step[r.add_before_step] = by_step.get(r.add_before_step, 0) + 1
        pattern = ", ".join(f"{n} before step {k}" for k, n in sorted(by_step.items()))
        notes.append(f"offline burst: {len(anchored)} requests are added as recorded ({pattern}) at every "
                     "setting; the arrival race of LLM.generate can split a burst differently in another run")
    if w.unfinished:
        notes.append(f"{w.unfinished} request(s) were still running when the log ended; the replay serves them "
                     "the output tokens they had produced (estimated) and lets them finish")
    if cfg.get("prefix_caching") and not w.has_digests:
        notes.append("prefix caching was on but request_added has no block_digests (scheduler_probe."
                     "log_block_digests off, or an older probe): the replay assumes no prompt shares a block")
    groups = cfg.get("kv_cache_groups") or []
    if len(groups) > 1 or any(g != "FullAttentionSpec" for g in groups):
        notes.append(f"the model's KV cache has groups {groups}; the replay builds one full-attention group, "
                     "so KV accounting is approximate")
    if cfg.get("num_speculative_tokens"):
        notes.append("speculative decoding is not replayed (each step samples one token per request)")
    if cfg.get("scheduler_class") == "AsyncScheduler":
        notes.append("AsyncScheduler: replayed with EngineCore's batch queue of two; not verified against a "
                     "real async engine on this machine (the CPU backend forces synchronous scheduling)")
    if not w.chunk_events:
        notes.append("no chunk events (scheduler_probe.log_chunk_boundaries off): the step-time model uses "
                     "scheduled tokens only")
    return notes


def _plan(w: Workload, overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], Any]:
    settings, spec = engine_args.resolve(w.config, overrides)
    spec = engine_args.check(spec, overrides)
    return overrides, settings, spec


def _text(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _slug(overrides: dict[str, Any]) -> str:
    """A directory name for a grid point, e.g. ``max_num_batched_tokens=2048,num_kv_blocks=128``."""
    text = ",".join(f"{k}={_text(v)}" for k, v in overrides.items())
    return re.sub(r"[^A-Za-z0-9_.=,-]+", "_", text)[:200] or "config"


@dataclass
class _Task:
    """One replay for a worker process (picklable)."""

    workload: Workload
    model: StepTimeModel | DriftModel
    overrides: dict[str, Any]
    settings: dict[str, Any]
    spec: Any
    run_dir: Path
    mode: str
    source: str
    command: list[str]
    closed: tuple[int, float] | None = None
    time_limit_s: float | None = None


def _run_all(tasks: list[_Task], jobs: int) -> list[ConfigResult]:
    if jobs <= 1 or len(tasks) == 1:
        return [_run(t) for t in tasks]
    # fork: the workers inherit vLLM's imports (seconds each) from this process
    ctx = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=ctx) as pool:
        return list(pool.map(_run, tasks))


def _run(task: _Task) -> ConfigResult:
    """Replay one task into its run directory (written whole, :func:`atomic_dir`) and
    summarize it."""
    run_dir = task.run_dir
    if run_dir.exists() and not read_meta(run_dir).get("simulated") and any(run_dir.iterdir()) \
            and not _interrupted(run_dir):
        raise WhatifError(f"{run_dir} exists and is not a simulated run; choose another --out")
    with atomic_dir(run_dir) as tmp:  # written whole: an interrupted replay leaves no half folder
        _replay_into(task, tmp)
    return ConfigResult(task.settings, task.overrides, run_dir, _summary(run_dir),
                        read_meta(run_dir)["whatif"]["replay"])


def _interrupted(run_dir: Path) -> bool:
    """A folder an interrupted ``whatif`` of an earlier release left (before outputs were
    written whole): no ``meta.json``, nothing but event files. Replaced like a
    simulated run."""
    try:
        names = os.listdir(run_dir)
    except OSError:
        return False
    return META_FILE not in names and all(n.startswith("events-") for n in names)


def _replay_into(task: _Task, run_dir: Path) -> None:
    """Replay one task into the (temporary) directory ``run_dir``: events and meta.json."""
    from .replay import replay

    start = time.time()
    sink = EventSink(run_dir / f"events-{os.getpid()}.jsonl", capacity=SINK_CAPACITY)
    cfg = task.workload.config
    overlay = {k: cfg.get(k) for k in _RECORDED_FIELDS}
    if "gpu_memory_utilization" in task.overrides:
        overlay["gpu_memory_utilization"] = task.overrides["gpu_memory_utilization"]
    task.model.reset_counts()
    try:
        stats = replay(task.workload, task.spec, task.model.predict, sink, mode=task.mode, config_overlay=overlay,
                       closed=task.closed, time_limit_s=task.time_limit_s)
    finally:
        sink.close()
    if sink.dropped:
        raise WhatifError(f"the replay into {run_dir} dropped {sink.dropped} events (disk too slow or full)")
    replay_info = {"steps": stats.steps, "wall_s": stats.wall_s, "cpu_s": stats.cpu_s,
                   "virtual_s": stats.virtual_s, "steps_per_cpu_s": stats.steps_per_cpu_s,
                   "outside_region": task.model.outside_share,
                   "extrapolated_share": task.model.extrapolated_share}
    write_meta(run_dir, {
        "probe_version": __version__,
        "simulated": True,
        "source": task.source,
        "settings": task.settings,
        "overrides": task.overrides,
        "command": task.command,
        "start_time": start,
        "end_time": time.time(),
        "exit_code": 0,
        "whatif": {"mode": task.mode, "lag_s": task.workload.lag_s(), "model": task.model.to_dict(),
                   "replay": replay_info, "spec": asdict(task.spec) | {"model_dir": None}},
    })


__all__ = ["BASELINE_TOLERANCES", "MODEL_SOURCES", "ConfigResult", "ProfileRefused", "SettingError",
           "StepTimeChoice", "WhatifError", "WhatifResult", "WorkloadError", "predict", "require_vllm",
           "step_time_model"]
