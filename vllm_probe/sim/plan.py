"""One door to the replay: a recorded run prepared once for any number of replays.

:func:`prepare` reads a run's workload, decides how its client sent requests
(:mod:`vllm_probe.sim.arrivals`), chooses the step-time model (a profile's shape at the
recording's level, or the recording-only fit: :func:`step_time_model`) and measures how the
machine's speed moved while the run ran (:func:`vllm_probe.sim.stepmodel.drift_factors`).
A data-parallel run is replayed one rank at a time (``rank``): that engine core's own
requests, as the front end sent them to it, through one scheduler, with a step-time model
fitted on that rank's steps; the front end's balancing across ranks is kept as recorded,
not replayed. The replay's events carry the rank (:class:`RankSink`), so its run
directory reads as that rank's.
The :class:`ReplayPlan` it returns makes the replay tasks (:meth:`ReplayPlan.task`) that
``vllm-probe whatif`` (:func:`vllm_probe.sim.whatif.predict`), the doctor's remedy search and
``tune`` (:class:`vllm_probe.advice.evaluate.Evaluator`) run: every replay of one plan, the
baseline at the recorded settings included, uses the same workload, arrivals and step-time
model at the same speed, so a setting that changes no scheduling decision gives the
baseline's figures exactly.

:func:`run_task` replays one task into an ordinary run directory (``meta.json`` says
``simulated``), written whole, and summarizes it.
"""

from __future__ import annotations

import concurrent.futures
import copy
import functools
import importlib.util
import multiprocessing
import os
import re
import time
from dataclasses import asdict, dataclass, field
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import __version__, envvars
from ..analysis.compare import relative_errors
from ..analysis.reading import read
from ..analysis.summary import analyze_story
from ..analysis.summary_types import Summary
from ..analysis.workload import Workload, load_workload
from ..engine.sink import EventSink
from ..runs.rundir import META_FILE, atomic_dir, read_meta, write_meta
from . import arrivals as arrival_models
from . import engine_args, model_shape
from . import profile as profiles
from .arrivals import Arrivals, ArrivalsError
from .profile import Profile, ProfileError
from .stepmodel import DriftModel, StepTimeModel, drift_factors, fit, fit_level

#: The baseline replay's largest accepted relative error per figure (names of
#: :mod:`vllm_probe.analysis.catalogue`): 2 % for scheduling figures, 5 % for throughput
#: and time to first token.
BASELINE_TOLERANCES = {
    "steps": 0.02,
    "preemptions": 0.02,
    "chunks_per_prompt_mean": 0.02,
    "output_tokens_per_s": 0.05,
    "ttft_p50": 0.05,
    "ttft_p90": 0.05,
}

#: Above this drift of the recorded run's speed (:attr:`~vllm_probe.sim.stepmodel.Quality.drift`)
#: a note says the model cannot follow it (±25 %: runs on the quiet machine drift 10-20 %).
DRIFT_NOTE = 0.25
#: Above this drift of the recorded run's speed ``whatif`` also replays the recording's
#: speed over time (:class:`~vllm_probe.sim.stepmodel.DriftModel`, speed per tenth of the
#: run), to say how much of the baseline's error is the machine's (±10 %).
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
        intervals: each figure in seconds (objective names) with its
            :class:`~vllm_probe.sim.intervals.Interval` (filled by ``whatif``).
    """

    settings: dict[str, Any]
    overrides: dict[str, Any]
    run_dir: Path
    summary: Summary
    replay: dict[str, Any] = field(default_factory=dict)
    intervals: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"settings": self.settings, "overrides": self.overrides, "run_dir": str(self.run_dir),
                "summary": self.summary.to_dict(), "replay": self.replay,
                "intervals": {k: v.to_dict() for k, v in self.intervals.items()}}


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


def _requests_copied(w: Workload) -> Workload:
    """A shallow copy of ``w`` whose requests may be changed without changing ``w``'s."""
    w = copy.copy(w)
    w.requests = [copy.copy(r) for r in w.requests]
    return w


def unanchored(w: Workload) -> Workload:
    """``w`` with no request anchored to a step index (a closed-loop client's first
    requests are not an offline burst)."""
    w = _requests_copied(w)
    for r in w.requests:
        r.anchored = False
    return w


def burst_at_once(w: Workload) -> Workload | None:
    """``w`` with its offline burst added before one step: every request anchored to steps
    0-1 (:func:`~vllm_probe.analysis.workload.availability_windows`) added before the first,
    as another run of the same ``LLM.generate`` call can find them (its race with the front
    end split the recorded burst, e.g. 1 request before step 0 and 5 before step 1; a rerun
    may see all 6 before step 0). None when the burst was added before one step already."""
    anchored = [r for r in w.requests if r.anchored]
    first = min((r.add_before_step for r in anchored), default=0)
    if len({r.add_before_step for r in anchored}) < 2:
        return None
    w = _requests_copied(w)
    for r in w.requests:
        if r.anchored:
            r.add_before_step = first
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
            else:  # the cache: only a profile of this engine that covers the run's steps
                cached = profiles.choose_cached(ident, w, run_dir)
                notes += cached.notes
                if cached.found is not None:
                    path, prof = str(cached.found[0]), cached.found[1]
                    notes.append(f"profile: using {path} from the profile cache (measured on {ident.model}, "
                                 f"{ident.hardware}, vLLM {ident.vllm}); --profile FILE picks another")
            forced = profiles.check(prof, ident, path or "", force) if prof is not None else None
            if prof is not None and profile is not None:
                covered = profiles.coverage_note(prof, w, path or "", run_dir)
                if covered:
                    notes.append(covered)
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


def recorded_summary(run_dir: Path, rank: int | None = None) -> Summary:
    """The run's summary as ``vllm-probe summary --json`` has it (notable moments included);
    of data-parallel rank ``rank`` alone when given (``summary --rank N``)."""
    if rank is None:
        return analyze_story(run_dir)[1]
    from ..analysis.ranks import analyze_rank_story

    return analyze_rank_story(run_dir, rank)[1]


class RankSink:
    """The sink of a replay of one data-parallel rank: every event is written with
    ``engine`` = the recorded rank (the harness's scheduler is rank 0), ``probe_stats``
    too (``EventSink.engine``); everything else is passed through."""

    def __init__(self, sink: Any, rank: int) -> None:
        self.sink = sink
        self.rank = rank
        if hasattr(sink, "engine"):
            sink.engine = rank

    def emit(self, kind: Any, ts: float, engine: int, values: Any) -> None:
        self.sink.emit(kind, ts, self.rank, values)

    def close(self) -> None:
        self.sink.close()


def notes_of(w: Workload) -> list[str]:
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
    elif cfg.get("prefix_caching") and w.block_tokens is None and not any(r.output_digests for r in w.requests):
        hbs = int(cfg.get("hash_block_size") or cfg.get("block_size") or 0)
        if hbs and any(r.finish_reason and r.block_digests is not None
                       and (r.prompt_len + r.output_tokens) // hbs > r.prompt_len // hbs for r in w.requests):
            notes.append("request_finished has no output_block_digests (an older probe): a prompt that repeats "
                         "an earlier answer hits the prefix cache only up to that answer in the replay")
    notes += model_shape.notes(w)  # KV-cache groups, speculative decoding
    if cfg.get("scheduler_class") == "AsyncScheduler":
        notes.append("AsyncScheduler: replayed with EngineCore's batch queue of two (real async runs of the CPU "
                     "engine, re-enabled after its platform hook, replayed step for step: docs/whatif.md, Coverage)")
    if not w.chunk_events:
        notes.append("no chunk events (scheduler_probe.log_chunk_boundaries off): the step-time model uses "
                     "scheduled tokens only")
    return notes


def baseline_error(recorded: Summary, baseline: Summary) -> dict[str, Any]:
    """The replay at the recorded settings against the recording
    (:func:`~vllm_probe.analysis.compare.relative_errors` with :data:`BASELINE_TOLERANCES`):
    the one judgement of a baseline that ``whatif``, ``doctor`` and ``tune`` share
    (``["within"]``: every figure within its tolerance)."""
    return relative_errors(recorded, baseline, BASELINE_TOLERANCES)


def setting_text(v: Any) -> str:
    """A setting's value as ``--set`` writes it (booleans lower-case)."""
    return str(v).lower() if isinstance(v, bool) else str(v)


def slug(overrides: dict[str, Any]) -> str:
    """A directory name for a grid point, e.g. ``max_num_batched_tokens=2048,num_kv_blocks=128``."""
    text = ",".join(f"{k}={setting_text(v)}" for k, v in overrides.items())
    return re.sub(r"[^A-Za-z0-9_.=,-]+", "_", text)[:200] or "config"


@dataclass
class ReplayTask:
    """One replay for a worker process (picklable): the workload, the model pricing its
    steps, the settings, where its run directory goes, how arrivals are replayed."""

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
    #: ``time.time()`` after which the replay stops (:class:`~vllm_probe.sim.replay.ReplayTimeLimit`);
    #: a time, not a duration, so that tasks run one after another share one deadline. None: no limit.
    stop_at: float | None = None
    #: the data-parallel rank replayed (its events carry it); None: a run of one rank
    rank: int | None = None


def run_all(tasks: list[ReplayTask], jobs: int,
            progress: Callable[[str], None] | None = None) -> list[ConfigResult]:
    """Replay ``tasks``, ``jobs`` processes at a time (forked: they inherit vLLM's imports),
    results in order. ``progress`` gets one line as each replay ends (in the order they end):
    ``replayed 2/4: max_num_seqs=4 (1,035 steps in 1.2 s)``."""
    if jobs <= 1 or len(tasks) == 1:
        results = []
        for t in tasks:
            results.append(run_task(t))
            _replayed(progress, len(results), len(tasks), t, results[-1])
        return results
    ctx = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=ctx) as pool:
        futures = {pool.submit(run_task, t): t for t in tasks}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            if future.exception() is None:
                _replayed(progress, done, len(tasks), futures[future], future.result())
        return [f.result() for f in futures]


def _replayed(progress: Callable[[str], None] | None, done: int, total: int, task: ReplayTask,
              result: ConfigResult) -> None:
    """One line of :func:`run_all`'s ``progress``: which replay ended, its steps and wall time."""
    if progress is not None:
        r = result.replay
        progress(f"replayed {done}/{total}: {task.run_dir.name} ({r.get('steps', 0):,} steps in "
                 f"{r.get('wall_s', 0.0):.1f} s)")


def run_task(task: ReplayTask) -> ConfigResult:
    """Replay one task into its run directory (written whole, :func:`atomic_dir`) and
    summarize it."""
    run_dir = task.run_dir
    if run_dir.exists() and not read_meta(run_dir).get("simulated") and any(run_dir.iterdir()) \
            and not _interrupted(run_dir):
        raise WhatifError(f"{run_dir} exists and is not a simulated run; choose another --out")
    with atomic_dir(run_dir) as tmp:  # written whole: an interrupted replay leaves no half folder
        _replay_into(task, tmp)
    read(run_dir, "summary", "rows")  # one pass: the summary below, the figures a search measures next
    return ConfigResult(task.settings, task.overrides, run_dir, recorded_summary(run_dir),
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


def _replay_into(task: ReplayTask, run_dir: Path) -> None:
    """Replay one task into the (temporary) directory ``run_dir``: events and meta.json."""
    from .replay import replay

    start = time.time()
    sink = EventSink(run_dir / f"events-{os.getpid()}.jsonl", capacity=SINK_CAPACITY)
    target: Any = sink if task.rank is None else RankSink(sink, task.rank)
    cfg = task.workload.config
    overlay = {k: cfg.get(k) for k in _RECORDED_FIELDS}
    if "gpu_memory_utilization" in task.overrides:
        overlay["gpu_memory_utilization"] = task.overrides["gpu_memory_utilization"]
    task.model.reset_counts()
    try:
        stats = replay(task.workload, task.spec, task.model.predict, target, mode=task.mode, config_overlay=overlay,
                       closed=task.closed,
                       time_limit_s=None if task.stop_at is None else max(0.0, task.stop_at - time.time()))
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
        **({"rank": task.rank} if task.rank is not None else {}),
    })


@dataclass
class ReplayPlan:
    """A recorded run prepared for replays (:func:`prepare`).

    Attributes:
        run_dir: the recorded run.
        workload: its requests as every replay adds them (a closed-loop client's are not
            anchored to recorded steps).
        arrivals: how the client's arrivals are replayed.
        choice: the step-time model and where its shape came from.
        notes: what the replays assume or cannot reproduce, one line each.
        drift: the recording's speed over time, ``[(first step, factor), ...]``
            (:func:`~vllm_probe.sim.stepmodel.drift_factors`; empty when not measured).
        speed_drift: the largest departure of a tenth of the run from the model's speed
            (:attr:`~vllm_probe.sim.stepmodel.Quality.drift`; 0.1: ±10 %).
        rank: the data-parallel rank replayed (its requests, its steps, its recorded
            figures); None: the run has one rank.
    """

    run_dir: Path
    workload: Workload
    arrivals: Arrivals
    choice: StepTimeChoice
    notes: list[str]
    drift: list[tuple[int, float]] = field(default_factory=list)
    speed_drift: float = 0.0
    rank: int | None = None

    @property
    def model(self) -> StepTimeModel:
        """The step-time model every replay of this plan uses."""
        return self.choice.model

    @functools.cached_property
    def recorded(self) -> Summary:
        """The recording's summary, of :attr:`rank` alone when set (read on first use)."""
        return recorded_summary(self.run_dir, self.rank)

    def check(self, overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], Any]:
        """``(overrides, every setting in force, the harness spec)`` for a point, checked as
        vLLM would at start-up.

        Raises:
            SettingError: what vLLM would refuse (:mod:`vllm_probe.sim.engine_args`).
        """
        settings, spec = engine_args.resolve(self.workload.config, overrides)
        return overrides, settings, engine_args.check(spec, overrides)

    def task(self, overrides: dict[str, Any], run_dir: Path, *, mode: str = "timed", source: str | None = None,
             command: list[str] | None = None, model: StepTimeModel | DriftModel | None = None,
             workload: Workload | None = None, checked: tuple[dict[str, Any], dict[str, Any], Any] | None = None,
             ) -> ReplayTask:
        """The replay of ``overrides`` into ``run_dir`` (``checked``: :meth:`check`'s result
        when the caller has it; ``model``/``workload``: another model or workload than the
        plan's, e.g. the recording's speed over time or a trace's requests).

        Raises:
            SettingError: see :meth:`check`.
        """
        overrides, settings, spec = checked if checked is not None else self.check(overrides)
        command = command if command is not None else ["vllm-probe", "whatif", str(self.run_dir)] + self.rank_args() + [
            a for k, v in overrides.items() for a in ("--set", f"{k}={setting_text(v)}")]
        return ReplayTask(workload if workload is not None else self.workload,
                          model if model is not None else self.model, overrides, settings, spec, run_dir, mode,
                          source or str(self.run_dir), command, self.arrivals.closed if workload is None else None,
                          rank=self.rank)

    def default_out(self) -> Path:
        """Where ``whatif`` puts its replays by default: ``<run_dir>-whatif`` next to the run,
        ``<run_dir>-whatif-rank<N>`` for one rank of a data-parallel run."""
        suffix = "" if self.rank is None else f"-rank{self.rank}"
        return self.run_dir.parent / f"{self.run_dir.name}-whatif{suffix}"

    def rank_args(self) -> list[str]:
        """``["--rank", "N"]`` when the plan replays one rank of a data-parallel run, else []."""
        return [] if self.rank is None else ["--rank", str(self.rank)]


def prepare(run_dir: str | Path, *, profile: str | Path | Profile | bool | None = None, force: bool = False,
            arrivals: str | Arrivals | None = None, step_time_scale: float = 1.0,
            rank: int | None = None) -> ReplayPlan:
    """Prepare the run in ``run_dir`` for replays.

    Args:
        profile: a step-time profile (``vllm-probe calibrate``; a path or a
            :class:`~vllm_probe.sim.profile.Profile`) whose shape is used, its level fitted
            on the recording; None: a matching profile from the cache when there is one (a
            note says so), else the recording-only fit; False: never a profile.
        force: use a profile measured on another engine (the choice's ``forced`` says so).
        arrivals: ``auto``/None (detected), ``open``, ``closed:N[:THINK_MS]`` or an
            :class:`~vllm_probe.sim.arrivals.Arrivals`.
        step_time_scale: multiplies every predicted step time (1.25: an engine 25 % slower
            than during the recording).
        rank: the data-parallel rank to replay (its own requests; the front end's balancing
            across ranks is kept as recorded); None: the run's one rank.

    Raises:
        WhatifError: no vLLM, a model that cannot be fitted, a bad arrivals spec or scale.
        ProfileRefused: the profile is unreadable or another engine's without ``force``.
        WorkloadError: a run without request or step events; a run of several ranks
            without ``rank``, or without that rank.
    """
    require_vllm()
    run_dir = Path(run_dir)
    w = load_workload(run_dir, rank=rank)
    try:
        spec = arrival_models.parse(arrivals) if isinstance(arrivals, str) or arrivals is None else arrivals
        arrival = arrival_models.resolve(w, spec)
    except ArrivalsError as e:
        raise WhatifError(str(e)) from None
    if arrival.kind == "closed":  # a closed-loop client is no offline burst
        w = unanchored(w)
    notes = notes_of(w)
    if rank is not None:
        notes.insert(0, rank_note(run_dir, rank, len(w.requests)))
    choice = step_time_model(run_dir, w, profile, force)
    notes += choice.notes
    notes.append(arrival.describe())
    if step_time_scale <= 0:
        raise WhatifError(f"the step-time scale must be positive, not {step_time_scale}")
    choice.model.scale = step_time_scale
    if step_time_scale != 1.0:
        notes.append(f"every step time is scaled by {step_time_scale:g}, the baseline's too")
    speed_drift = choice.model.quality.drift if choice.model.quality else 0.0
    factors = drift_factors(choice.model, w) if speed_drift else []
    return ReplayPlan(run_dir, w, arrival, choice, notes, factors, speed_drift, rank)


def rank_note(run_dir: Path, rank: int, requests: int) -> str:
    """What a replay of one rank of a data-parallel run keeps and leaves out, one line."""
    from ..runs.ranks import layout

    ranks = layout(run_dir).ids
    return (f"data parallel: rank {rank} of ranks {', '.join(str(r) for r in ranks)}, replayed alone with its own "
            f"{requests} request(s) as the front end sent them to it; the balancing across ranks is kept as "
            "recorded, not replayed (a setting that changes how fast this rank drains does not move requests "
            "to or from the other ranks)")


__all__ = ["BASELINE_TOLERANCES", "MODEL_SOURCES", "ConfigResult", "ProfileRefused", "RankSink", "ReplayPlan",
           "ReplayTask", "StepTimeChoice", "WhatifError", "baseline_error", "notes_of", "prepare", "quiet_vllm",
           "rank_note", "recorded_summary", "require_vllm", "run_all", "run_task", "setting_text", "slug",
           "step_time_model", "unanchored"]
