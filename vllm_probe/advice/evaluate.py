"""Replays of one recorded run at many settings: in this process, in ``--jobs`` local
processes, or as tasks of an existing Ray cluster (``--ray ADDRESS``); the same results
either way.

:class:`Evaluator` prepares the run once (its workload, the step-time model fitted on
it, the replay at the recorded settings: the *baseline*, with its error against the
recording) and then evaluates batches of settings, each a dict by ``whatif --set``
names (:data:`vllm_probe.sim.engine_args.SETTINGS`). Each replay is a task of the run's
:class:`~vllm_probe.sim.plan.ReplayPlan`, the one ``vllm-probe whatif`` replays too (the same
workload, arrivals, step-time model and speed, the same checks at start-up, the same run
directory, the same summary), and its figures
(:mod:`vllm_probe.analysis.objectives`) are measured where the replay ran, so a Ray
worker on another machine returns numbers, not paths. A point vLLM refuses, or whose
replay cannot finish (a request that never fits), comes back with ``error`` set and no
figures, never as an exception: a search goes on past it.

Local processes are forked from this one (they inherit vLLM's imports; about 650 MiB
each). Ray tasks need ``vllm_probe`` and vLLM importable on the cluster's workers (the
``[ray]`` extra installs Ray; ``ray.init(address=ADDRESS)`` joins the cluster).
"""

from __future__ import annotations

import concurrent.futures
import functools
import multiprocessing
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..analysis.objectives import OBJECTIVES, from_rows, measure, request_rows
from ..analysis.reading import read
from ..runs.rundir import NoEventsError


class EvaluateError(Exception):
    """The runs cannot be evaluated at all (no vLLM, no Ray, a run that is not
    replayable); the message is one line."""


class BaselineStopped(EvaluateError):
    """The replay at the recorded settings ran past the search's deadline: ``step`` steps
    replayed in ``elapsed_s`` wall seconds."""

    def __init__(self, message: str, step: int, elapsed_s: float) -> None:
        super().__init__(message)
        self.step = step
        self.elapsed_s = elapsed_s


class ProfileRefused(EvaluateError):
    """The ``profile`` given cannot be used: unreadable, or measured on another model,
    vLLM release or hardware than the recording without ``force`` (the message is
    :func:`vllm_probe.sim.profile.check`'s one line). A usage error, not a run the replay
    cannot take."""


@dataclass
class Evaluation:
    """One replay's outcome.

    Attributes:
        overrides: what this point changed (by ``whatif --set`` names; empty: the baseline).
        settings: every setting in force (None where the release has none).
        figures: every figure of :data:`~vllm_probe.analysis.objectives.OBJECTIVES` over all
            requests, plus ``figures_subset`` over the evaluator's ``requests`` (units there).
        summary: the replay's :class:`~vllm_probe.analysis.summary.Summary` (None: not replayed).
        run_dir: the simulated run directory (on the machine that ran it).
        error: why the point could not be replayed (one line); None when it was.
        replay_s: wall seconds of the replay and its summary.
        outside_region: share (0..1) of the replay's steps outside the region the
            step-time model was fitted on (None: not replayed, or no region known).
        virtual_s: the replay's simulated seconds, from the workload's first arrival to
            the end of its last step (None: not replayed).
        stopped_at: ``(step, elapsed_s)`` when the replay was stopped at its time limit
            (:class:`vllm_probe.sim.replay.ReplayTimeLimit`; ``error`` says so too).
        figures_by: per-request figures over each subset of request ids asked for
            (``evaluate(..., subsets=...)``), keyed by the subset (a sorted tuple of ids).
        extrapolated_share: share (0..1) of the replay's predicted seconds that comes from
            feature values beyond the fitted region
            (:attr:`vllm_probe.sim.stepmodel.StepTimeModel.extrapolated_share`; None: as
            outside_region).
    """

    overrides: dict[str, Any]
    settings: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, float | None] = field(default_factory=dict)
    figures_subset: dict[str, float | None] = field(default_factory=dict)
    summary: Any = None
    run_dir: str = ""
    error: str | None = None
    replay_s: float = 0.0
    outside_region: float | None = None
    virtual_s: float | None = None
    extrapolated_share: float | None = None
    stopped_at: tuple[int, float] | None = None
    figures_by: dict[tuple[str, ...], dict[str, float | None]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None

    def figure(self, name: str, requests: Iterable[str] = ()) -> float | None:
        """Figure ``name`` over ``requests`` (a subset asked for when replaying), or over
        every request when ``requests`` is empty."""
        if not requests:
            return self.figures.get(name)
        return self.figures_by.get(tuple(sorted(requests)), {}).get(name)


#: Figures measured per replay over all requests (run-wide and per-request).
ALL_FIGURES = tuple(OBJECTIVES)
#: Per-request figures measured over a subset of requests.
SUBSET_FIGURES = tuple(n for n, o in OBJECTIVES.items() if o.request_field is not None)


def _evaluate_task(task: Any, subset: tuple[str, ...], keep: bool,
                   subsets: tuple[tuple[str, ...], ...] = ()) -> Evaluation:
    """Replay one :class:`vllm_probe.sim.plan.ReplayTask` and measure it (runs in a worker:
    a forked process or a Ray task)."""
    import shutil

    from ..sim.plan import WhatifError, run_task
    from ..sim.replay import ReplayError, ReplayTimeLimit

    start = time.perf_counter()
    try:
        result = run_task(task)
    except ReplayTimeLimit as e:
        return Evaluation(dict(task.overrides), dict(task.settings), error=str(e), replay_s=time.perf_counter() - start,
                          stopped_at=(e.step, e.elapsed_s))
    except (ReplayError, WhatifError) as e:
        return Evaluation(dict(task.overrides), dict(task.settings), error=str(e).splitlines()[0],
                          replay_s=time.perf_counter() - start)
    figures = measure(result.run_dir, ALL_FIGURES, summary=result.summary)
    sub = measure(result.run_dir, SUBSET_FIGURES, summary=result.summary, requests=subset) if subset else {}
    ev = Evaluation(dict(task.overrides), dict(result.settings), figures, sub, result.summary,
                    str(result.run_dir), None, time.perf_counter() - start,
                    result.replay.get("outside_region"), result.replay.get("virtual_s"),
                    result.replay.get("extrapolated_share"))
    if subsets:
        rows = request_rows(result.run_dir)  # one read for every subset
        ev.figures_by = {ids: {n: from_rows(rows, n, ids) for n in SUBSET_FIGURES} for ids in subsets}
    if not keep:
        shutil.rmtree(result.run_dir, ignore_errors=True)
    return ev


def _evaluate_star(args: tuple) -> Evaluation:
    return _evaluate_task(*args)


class Evaluator:
    """A recorded run ready to be replayed at many settings.

    Args:
        run_dir: the recorded run.
        jobs: local processes replaying at once (1: in this process).
        ray_address: evaluate as Ray tasks on this cluster (``auto``, ``ray://host:10001``,
            ``host:6379``, or ``local`` to start one here); None: local.
        out: parent of the simulated run directories (default: a temporary directory,
            removed by :meth:`close`).
        requests: request ids whose per-request figures are measured apart
            (:attr:`Evaluation.figures_subset`).
        keep: keep each replay's run directory (default: only with ``out``).
        profile: the step-time profile every replay uses (``vllm-probe calibrate``; a
            path or a :class:`~vllm_probe.sim.profile.Profile`): its shape, the
            recording's level; None: a matching profile from the cache when there is one
            (a note says so), else the recording-only fit; False: never a profile
            (:func:`vllm_probe.sim.whatif.step_time_model`).
        force: use a profile measured on another engine (:attr:`step_time_model`'s
            ``forced`` says so).
        lazy: replay the baseline on first use of :attr:`baseline` (default: now, so a
            run the replay cannot take fails here).

    Attributes:
        step_time_model: the :class:`~vllm_probe.sim.whatif.StepTimeChoice` every replay
            uses (the model, its source, the profile's path, the forced note).
        arrivals: the :class:`~vllm_probe.sim.arrivals.Arrivals` every replay uses, as
            ``whatif``'s default detects them (a closed-loop client replays per finish).
        baseline: the replay at the recorded settings (replayed on first use).
        error: the baseline's relative errors against the recording
            (:func:`vllm_probe.analysis.compare.relative_errors`; on first use).
        stretch: the :class:`~vllm_probe.sim.cut.Stretch` of the recording this evaluator
            replays (:meth:`cut`); None: the whole run.
        parent: the whole run's evaluator of a stretch's (None: this is the whole run's).
        deadline: ``time.monotonic()`` after which replays stop (a replay still running is
            stopped: its :class:`Evaluation` has an ``error`` starting with
            :data:`vllm_probe.sim.replay.TIME_LIMIT_STOP`); a stretch's evaluator follows
            its parent's. None: no limit.

    Raises:
        ProfileRefused: ``profile`` unreadable, or another engine's without ``force``.
        EvaluateError: no vLLM, no Ray with ``ray_address``, or a run the replay cannot take
            (no request or step events, a step-time model that cannot be fitted).
    """

    def __init__(self, run_dir: str | Path, jobs: int = 1, ray_address: str | None = None,
                 out: str | Path | None = None, requests: Iterable[str] = (), keep: bool | None = None,
                 profile: Any = None, force: bool = False, lazy: bool = False) -> None:
        from ..analysis.workload import WorkloadError
        from ..sim.engine_args import SettingError
        from ..sim.plan import ProfileRefused as Refused
        from ..sim.plan import WhatifError, prepare, quiet_vllm

        self.run_dir = Path(run_dir)
        self.jobs = max(1, int(jobs))
        self.requests = tuple(requests)
        self.stretch: Any = None
        self.parent: Evaluator | None = None
        self.deadline: float | None = None
        self._options = {"jobs": jobs, "ray_address": ray_address, "profile": profile, "force": force}
        self._cuts: dict[tuple[int, int], Evaluator] = {}
        self._tmp = None
        if out is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="vllm-probe-advice-")
            out = self._tmp.name
        self.out = Path(out)
        self.keep = keep if keep is not None else self._tmp is None
        self._ray: Any = None
        try:  # one pass over the recording: its workload, its summary and the rows its figures need
            read(self.run_dir, "summary", "rows", "workload")
        except NoEventsError:
            pass  # prepare() says why the replay cannot take it
        try:  # the arrivals whatif replays by default: a detected closed-loop client replays per finish
            self.plan = prepare(self.run_dir, profile=profile, force=force)
        except Refused as e:
            raise ProfileRefused(str(e)) from None
        except (WorkloadError, WhatifError, ValueError) as e:
            raise EvaluateError(str(e).splitlines()[0]) from None
        quiet_vllm()
        if ray_address:  # after the profile's check: a refused profile starts no cluster
            self._ray = _connect_ray(ray_address)
        self.workload = self.plan.workload
        self.arrivals = self.plan.arrivals
        self.step_time_model = self.plan.choice
        self.model = self.plan.model
        self.notes = list(self.plan.notes)
        self.recorded = self.plan.recorded
        self._count = 0
        try:  # vLLM's checks import its config modules (seconds, once): here, not in a search's budget
            self.plan.check({})
        except SettingError:
            pass  # the baseline's replay reports it
        self.replays = 0
        # kept for the whole search: the goals' subsets are measured on it after many replays were read
        self.recorded_rows = request_rows(self.run_dir)
        self.recorded_figures = self.recorded_measure(ALL_FIGURES)
        self.recorded_subset = self.recorded_measure(SUBSET_FIGURES, self.requests) if self.requests else {}
        if not lazy:
            _ = self.error

    def recorded_measure(self, names: Iterable[str], requests: Iterable[str] = ()) -> dict[str, float | None]:
        """The figures ``names`` of the recording (over ``requests`` when given): its
        summary and the per-request rows this evaluator holds, nothing read again
        (:func:`vllm_probe.analysis.objectives.measure`)."""
        return measure(self.run_dir, names, summary=self.recorded, requests=tuple(requests) or None,
                       rows=self.recorded_rows)

    @functools.cached_property
    def baseline(self) -> Evaluation:
        """The replay at the recorded settings.

        Raises:
            EvaluateError: it failed (the run cannot be replayed).
        """
        return raise_failed(self.evaluate([{}])[0])

    @functools.cached_property
    def error(self) -> dict[str, Any]:
        """The baseline against the recording, judged as ``whatif`` judges it
        (:func:`vllm_probe.sim.plan.baseline_error`)."""
        from ..sim.plan import baseline_error

        return baseline_error(self.recorded, self.baseline.summary)

    @functools.cached_property
    def spread(self) -> Any:
        """The :class:`~vllm_probe.sim.intervals.Spread` of this recording's replays: the
        baseline replayed again at the recording's slowest and fastest speed (two replays,
        on first use)."""
        from ..sim.intervals import TIMED, measure_spread

        def replay_at(factor: float) -> dict[str, float | None] | None:
            import dataclasses

            checked = self.plan.check({})
            task = self.plan.task({}, self.out / f"speed-{factor:.3f}", checked=checked,
                                  model=dataclasses.replace(self.model, scale=self.model.scale * factor))
            task.stop_at = self._stop_at()
            ev = _evaluate_task(task, (), False)
            self.replays += 1
            return ev.figures if ev.ok else None

        base = self.baseline
        return measure_spread(self.plan.drift, base.figures, {n: self.recorded_figures.get(n) for n in TIMED},
                              base.extrapolated_share, replay_at)

    def intervals(self, ev: Evaluation, requests: Iterable[str] = ()) -> dict[str, Any]:
        """The :class:`~vllm_probe.sim.intervals.Interval` of each timed figure of ``ev``
        (over ``requests`` when given: the response to speed is the whole run's)."""
        if not ev.ok:
            return {}
        figures = ev.figures if not requests else ev.figures_by.get(tuple(sorted(requests)), ev.figures_subset)
        return self.spread.intervals(figures, ev.extrapolated_share)

    def cut(self, stretch: Any) -> Evaluator:
        """An evaluator of the :class:`~vllm_probe.sim.cut.Stretch` ``stretch`` of this
        recording alone (written once under :attr:`out`, kept for later calls), with this
        evaluator's jobs, Ray cluster and step-time choice; its baseline is replayed on
        first use.

        Raises:
            EvaluateError: the stretch cannot be replayed (what :class:`Evaluator` raises).
        """
        from ..sim.cut import write_cut

        key = (stretch.first_step, stretch.last_step)
        if key not in self._cuts:
            where = self.out / f"cut-{key[0]}-{key[1]}"
            write_cut(self.run_dir, stretch, where / "recorded")
            child = Evaluator(where / "recorded", out=where, requests=self.requests, keep=self.keep, lazy=True,
                              **self._options)
            child.stretch = stretch
            child.parent = self
            self._cuts[key] = child
        return self._cuts[key]

    def _stop_at(self) -> float | None:
        """The deadline (this evaluator's, else its parent's) as a ``time.time()``, the clock a
        replay task reads when it starts, in this process or a worker; None: none."""
        e: Evaluator | None = self
        while e is not None and e.deadline is None:
            e = e.parent
        return None if e is None or e.deadline is None else time.time() + (e.deadline - time.monotonic())

    def _tasks(self, points: Sequence[dict[str, Any]], workload: Any = None,
               ) -> list[tuple[Any, dict[str, Any]] | tuple[None, str]]:
        from ..sim.engine_args import SettingError
        from ..sim.plan import slug

        out: list[Any] = []
        for point in points:
            try:
                checked = self.plan.check(dict(point))
            except SettingError as e:
                out.append((None, str(e)))
                continue
            self._count += 1
            name = "baseline" if not point else f"{self._count:04d}-{slug(point)}"
            out.append((self.plan.task(checked[0], self.out / name, checked=checked, workload=workload), dict(point)))
        return out

    def evaluate(self, points: Sequence[dict[str, Any]], requests: Iterable[str] | None = None,
                 subsets: Iterable[Iterable[str]] = (), keep: bool | None = None,
                 workload: Any = None) -> list[Evaluation]:
        """One :class:`Evaluation` per point, in order (a point vLLM refuses: ``error``);
        ``requests``: the subset for :attr:`Evaluation.figures_subset` (default: the
        evaluator's); ``subsets``: more subsets, each measured into
        :attr:`Evaluation.figures_by`; ``keep``: keep these replays' run directories (default:
        the evaluator's choice); ``workload``: the requests to replay instead of the
        recording's (e.g. :func:`vllm_probe.sim.plan.burst_at_once`'s), same step-time model."""
        subset = tuple(requests) if requests is not None else self.requests
        more = tuple(tuple(sorted(x)) for x in subsets if x)
        planned = self._tasks(points, workload)
        runnable = [t for t, _ in planned if t is not None]
        stop_at = self._stop_at()
        for t in runnable:  # each replay's limit is what is left when it starts, not when the batch was planned
            t.stop_at = stop_at
        args = [(t, subset, self.keep if keep is None else keep, more) for t in runnable]
        if self._ray is not None:
            results = self._ray_map(args)
        elif self.jobs > 1 and len(args) > 1:
            ctx = multiprocessing.get_context("fork")  # workers inherit vLLM's imports
            with concurrent.futures.ProcessPoolExecutor(max_workers=min(self.jobs, len(args)), mp_context=ctx) as pool:
                results = list(pool.map(_evaluate_star, args))
        else:
            results = [_evaluate_star(a) for a in args]
        self.replays += len(results)
        it = iter(results)
        return [next(it) if t is not None else Evaluation(dict(points[i]), error=str(msg))
                for i, (t, msg) in enumerate(planned)]

    def _ray_map(self, args: list[tuple]) -> list[Evaluation]:
        ray = self._ray
        remote = ray.remote(num_cpus=1)(_evaluate_star)
        return list(ray.get([remote.remote(a) for a in args]))

    @property
    def all_replays(self) -> int:
        """Replays run by this evaluator and its stretches' (:meth:`cut`)."""
        return self.replays + sum(c.all_replays for c in self._cuts.values())

    def close(self) -> None:
        """Remove the temporary run directories (when no ``out`` was given)."""
        for child in self._cuts.values():
            child.close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def raise_failed(base: Evaluation) -> Evaluation:
    """``base`` (a replay at the recorded settings) when it ran.

    Raises:
        BaselineStopped: it was stopped at its time limit.
        EvaluateError: it failed.
    """
    message = f"the replay at the recorded settings failed: {base.error}"
    if base.stopped_at is not None:
        raise BaselineStopped(message, *base.stopped_at)
    if base.error:
        raise EvaluateError(message)
    return base


def _connect_ray(address: str) -> Any:
    """``ray`` joined to ``address``; :class:`EvaluateError` when Ray is not installed or
    the cluster cannot be reached."""
    try:
        import ray
    except ImportError:
        raise EvaluateError("--ray needs Ray installed (pip install 'vllm-probe[ray]')") from None
    if not ray.is_initialized():
        try:  # a local head's workers inherit this process's environment (PYTHONPATH included)
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        except Exception as e:  # ConnectionError, ValueError: Ray's own message
            raise EvaluateError(f"--ray {address}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return ray


__all__ = ["ALL_FIGURES", "BaselineStopped", "EvaluateError", "Evaluation", "Evaluator", "ProfileRefused",
           "SUBSET_FIGURES", "raise_failed"]

