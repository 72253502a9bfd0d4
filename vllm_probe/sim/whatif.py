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

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..analysis.catalogue import BY_NAME
from ..analysis.objectives import measure
from ..analysis.summary_types import Summary
from ..analysis.workload import Workload, WorkloadError
from .arrivals import Arrivals
from .engine_args import SettingError
from .intervals import MIN_SPEED_SPREAD, TIMED, Spread, measure_spread, speed_range
from .plan import (
    BASELINE_TOLERANCES, DRIFT_NOTE, DRIFT_REPLAY, MODEL_SOURCES, ConfigResult, ProfileRefused, ReplayPlan,
    ReplayTask, StepTimeChoice,
    WhatifError, baseline_error, notes_of, prepare, quiet_vllm, require_vllm, run_all, setting_text, slug,
    step_time_model,
)
from .profile import Profile
from .stepmodel import DriftModel, StepTimeModel

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
    spread: Spread | None = None
    #: the data-parallel rank replayed (``recorded`` is that rank's); None: a run of one rank
    rank: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``whatif --json`` object: ``source``, ``model``, ``baseline`` (``summary``,
        ``error``, ``settings``, ``run_dir``), ``configs`` and ``notes``; ``rank`` when one
        rank of a data-parallel run was replayed."""
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
            "spread": self.spread.to_dict() if self.spread else None,
            **({"rank": self.rank} if self.rank is not None else {}),
        }


def predict(run_dir: str | Path, grid: list[dict[str, Any]], out: str | Path | None = None, jobs: int = 1,
            *, trace: str | Path | None = None, trace_hash_size: int = 16,
            trace_sec_multiplier: float = 1.0, mode: str = "timed", step_time_scale: float = 1.0,
            profile: str | Path | Profile | bool | None = None, force: bool = False,
            arrivals: str | Arrivals | None = None, drift: bool = True,
            progress: Callable[[str], None] | None = None, rank: int | None = None) -> WhatifResult:
    """Replay the run in ``run_dir`` at its own settings and at each point of ``grid``.

    The baseline and every point are replayed by one :class:`~vllm_probe.sim.plan.ReplayPlan`:
    the same workload, arrivals and step-time model at the recording's average speed, so a
    point that changes no scheduling decision reads exactly as the baseline.

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
        profile, force, arrivals: as :func:`vllm_probe.sim.plan.prepare`.
        drift: when the recording's speed moved by more than :data:`DRIFT_REPLAY`, also
            replay the recording's speed over time (``drift``: how much of the baseline's
            error that explains).
        progress: gets one line as each replay ends (:func:`~vllm_probe.sim.plan.run_all`),
            e.g. for ``whatif``'s progress on stderr; None: silent.
        rank: the data-parallel rank replayed, its own requests against its own figures (default out ``-rankN``).

    Raises:
        WhatifError, SettingError, WorkloadError: see the module docstring.
    """
    plan = prepare(run_dir, profile=profile, force=force, arrivals=arrivals, step_time_scale=step_time_scale,
                   rank=rank)
    run_dir = plan.run_dir
    notes = list(plan.notes)
    factors = plan.drift if drift and trace is None else []
    drift_on = bool(factors) and max(abs(f - 1) for _, f in factors) > DRIFT_REPLAY and mode == "timed"
    if plan.speed_drift > DRIFT_NOTE and not drift_on:
        notes.append(_DRIFT_NOT_REPLAYED.format(drift=plan.speed_drift * 100))
    w = None
    if trace is not None:
        from ..exporters.trace import trace_workload

        w = trace_workload(Path(trace), plan.workload, trace_hash_size, trace_sec_multiplier)
        mode = "timed"
        notes = notes_of(w) + plan.choice.notes
    grid = [dict(point) for point in grid if point] or []
    checked = [plan.check({})] + [plan.check(point) for point in grid]  # every point first
    out = Path(out) if out is not None else plan.default_out()
    tasks, at_speed = _tasks(plan, grid, checked, out, mode, trace, w, factors if drift_on else [])
    results = run_all(tasks, jobs, progress)
    speeds = [results.pop(-2), results.pop()] if at_speed else []
    recorded = plan.recorded
    drift_info: dict[str, Any] | None = None
    error = baseline_error(recorded, results[0].summary)
    spread = _spread(plan.drift, recorded, results[0], speeds)
    for r in results:
        r.intervals = spread.intervals(measure(None, TIMED, summary=r.summary), r.replay.get("extrapolated_share"))
    if drift_on:
        replayed = results.pop()
        drift_info = {"factors": [[s, f] for s, f in factors], "range": [min(f for _, f in factors),
                                                                         max(f for _, f in factors)],
                      "replayed_error": baseline_error(recorded, replayed.summary),
                      "replayed_run_dir": str(replayed.run_dir)}
        notes.append(_drift_note(plan.speed_drift, error, drift_info["replayed_error"]))
    if trace is not None:
        results = results[1:]
    return WhatifResult(str(trace or run_dir), plan.model, recorded, results[0], error, results[1:], notes,
                        like=str(run_dir) if trace is not None else None, arrivals=plan.arrivals,
                        profile=plan.choice.profile, forced=plan.choice.forced, drift=drift_info,
                        step_time_model=plan.choice, spread=spread, rank=rank)


#: The note when the recording's speed moved but its drift is not replayed.
_DRIFT_NOT_REPLAYED = ("the recorded run's step times drifted by up to ±{drift:.0f} % between tenths of the run "
                       "(the machine's speed changed while it ran); the model assumes one speed, so queues that "
                       "built up in slow stretches are not replayed (docs/whatif.md)")


def _tasks(plan: ReplayPlan, grid: list[dict[str, Any]], checked: list[Any], out: Path, mode: str,
           trace: str | Path | None, w: Workload | None,
           factors: list[tuple[int, float]]) -> tuple[list[ReplayTask], bool]:
    """The replays of one ``whatif``, in the order :func:`predict` reads their results:
    [the like run's own replay (``trace``)], the baseline (or the trace), each grid point,
    [the recording's speed over time (``factors``)], [the baseline at the slowest and
    fastest speed]; and whether those last two are there."""
    run_dir = plan.run_dir
    names = ["baseline" if trace is None else "trace"] + [slug(p) for p in grid]
    command = ["vllm-probe", "whatif", str(run_dir)] + plan.rank_args()
    if trace is not None:
        command = ["vllm-probe", "whatif", "--trace", str(trace), "--like", str(run_dir)] + plan.rank_args()
    tasks = [plan.task(c[0], out / name, mode=mode, source=str(trace or run_dir), workload=w, checked=c,
                       command=command + [a for k, v in c[0].items() for a in ("--set", f"{k}={setting_text(v)}")])
             for name, c in zip(names, checked)]
    if factors:  # the recording's speed over time: how much of the baseline's error is the machine's
        tasks.append(plan.task({}, out / "baseline-recorded-speed", mode=mode, checked=checked[0],
                               model=DriftModel(plan.model, factors)))
    if trace is not None:  # the model's credibility: the like run against its own replay
        tasks.insert(0, plan.task({}, out / "baseline", workload=plan.workload, checked=checked[0]))
    slow, fast = speed_range(plan.drift)
    at_speed = slow - fast > MIN_SPEED_SPREAD  # the baseline at the recording's slowest and fastest tenths
    if at_speed:
        tasks += [plan.task({}, out / name, workload=plan.workload if trace is not None else None, checked=checked[0],
                            model=dataclasses.replace(plan.model, scale=plan.model.scale * f))
                  for name, f in (("baseline-slowest-speed", slow), ("baseline-fastest-speed", fast))]
    return tasks, at_speed


def _spread(drift: list[tuple[int, float]], recorded: Summary, baseline: ConfigResult,
            speeds: list[ConfigResult]) -> Spread:
    """The intervals' spread from the baseline and its replays at the slowest and fastest
    speed (``speeds``; empty: the speed did not move)."""
    figures = {id(c): measure(None, TIMED, summary=c.summary) for c in (baseline, *speeds)}
    at = dict(zip(speed_range(drift), speeds)) if speeds else {}
    return measure_spread(drift, figures[id(baseline)], measure(None, TIMED, summary=recorded),
                          baseline.replay.get("extrapolated_share"),
                          lambda f: figures[id(at[f])] if f in at else None)


def _drift_note(drift: float, error: dict[str, Any], replayed: dict[str, Any]) -> str:
    """How much of the baseline's error is drift: the TTFT errors at the run's average speed
    (the baseline's) and with the recording's speed over time."""
    parts = []
    for name in ("ttft_p50", "ttft_p90", "output_tokens_per_s"):
        a, b = replayed["figures"][name]["error"], error["figures"][name]["error"]
        if a is not None and b is not None:
            parts.append(f"{BY_NAME[name].label} {b * 100:+.1f} % at one speed, {a * 100:+.1f} % with the drift")
    return (f"drift: the recording's speed moved by up to ±{drift * 100:.0f} % over the run; the baseline and every "
            "prediction replay its average speed, and the recording's speed per tenth of the run replayed gives: "
            + "; ".join(parts) + " — the difference is the drift's share of the baseline error")


__all__ = ["BASELINE_TOLERANCES", "MODEL_SOURCES", "ConfigResult", "ProfileRefused", "SettingError",
           "StepTimeChoice", "WhatifError", "WhatifResult", "WorkloadError", "predict", "quiet_vllm", "require_vllm",
           "step_time_model"]
