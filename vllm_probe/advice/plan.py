"""The doctor's one plan per run: the smallest set of changes that reaches every finding's
goal together, found by the search ``tune`` uses and replayed.

Each finding's own search (:mod:`vllm_probe.advice.remedies`) answers its own question, and
one finding's remedy can defeat another's goal (more KV blocks end the worst request's
preemptions and let admission take more requests, which preempt more). :func:`build` asks
the question a user acts on: one set of settings for the whole run.

* **Goals** — every searched finding's :class:`~vllm_probe.analysis.doctor.rule.Goal`,
  judged on one replay as the remedy search judges it (against the lower of the replay at
  the recorded settings and the recording; seconds the step-time model extrapolates counted
  double: :func:`vllm_probe.advice.goals.judged`).
* **Knobs** — the union of the findings' knobs and candidate values (each finding's own
  remedy among them), at most :data:`MAX_VALUES` per setting, smallest change first.
* **Search** — :func:`vllm_probe.advice.descent.descend` from the recorded settings, the
  findings' replay-checked remedies (alone and together) replayed in its first round; a
  point is ranked by the goals it misses, then their total relative shortfall, then the
  settings it changes, then the memory it adds (KV blocks), then the size of the change.
* **Conflicts** — when no replayed point meets every goal, the plan is the one that meets
  most; its ``alternatives`` are up to two more points of the Pareto front (per-goal
  shortfalls, none dominated), and ``conflict`` names the goals no point met together.
* **Where** — on the stretch between idle moments that holds every goal's figure, when there
  is one (:mod:`vllm_probe.sim.cut`), else the whole run.

Without a replay (``--no-replay``, no vLLM, or a budget spent before it could start) the
plan is the rules' arithmetic, unchecked (:func:`unchecked_plan`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from ..analysis.doctor.findings import CRITICAL, WARNING, Finding
from ..analysis.doctor.kv import memory_advice
from ..analysis.doctor.plan import Plan, PlanFigure
from ..analysis.doctor.rule import Goal
from ..analysis.objectives import objective
from ..schema.engine_settings import BY_NAME, engine_arg_of, serve_flags
from .descent import descend, point_key
from .evaluate import BaselineStopped, EvaluateError, Evaluation, Evaluator, raise_failed
from .goals import change_size, goal_label, goal_steps, judged, reference
from .remedies import Search, cut_or_whole
from .verdict import TRADEOFFS, CheckedRemedy

#: Values per setting the plan's search tries (the findings' candidates, smallest change first).
MAX_VALUES = 6
#: At most this many plans are shown where goals conflict (the plan and its alternatives).
MAX_PLANS = 3
#: Settings whose increase takes memory (KV cache).
_MEMORY = tuple(s.name for s in BY_NAME.values() if s.memory)


@dataclass
class GoalCheck:
    """One finding's goal, judged on the plan's replays.

    Attributes:
        finding: the finding.
        goal: its goal (``requests`` resolved).
        label: the figure's label (``queue_p90 (11 requests)``).
        recorded: the figure in the recording (or its stretch).
        baseline: the figure replayed at the recorded settings.
    """

    finding: Finding
    goal: Goal
    label: str
    recorded: float | None
    baseline: float | None

    @property
    def reference(self) -> float | None:
        """What a ``reduce_by`` goal is taken from (:func:`vllm_probe.advice.goals.reference`)."""
        return reference(self.baseline, self.recorded)

    @property
    def target(self) -> float | None:
        """The value the figure must reach (its unit); None when the reference is unknown."""
        g = self.goal
        targets = [g.at_most] if g.at_most is not None else []
        if g.reduce_by is not None:
            ref = self.reference
            if ref is None:
                return None
            targets.append((1.0 - g.reduce_by) * ref)
        return min(targets) if targets else None

    def value(self, ev: Evaluation) -> float | None:
        """The goal's figure in a replay."""
        return ev.figure(self.goal.figure, self.goal.requests) if ev.ok else None

    def met(self, ev: Evaluation, baseline: Evaluation) -> bool:
        """Whether the replay reaches the goal, its extrapolated seconds counted double."""
        v = self.value(ev)
        if v is None:
            return False
        v = judged(self.goal.figure, v, ev.extrapolated_share, baseline.extrapolated_share)
        return bool(self.goal.met(self.reference, v))

    def shortfall(self, ev: Evaluation) -> float:
        """How far the replay's figure is from the target, relative (0: reached; inf: unknown)."""
        v, t = self.value(ev), self.target
        if v is None or t is None:
            return math.inf
        return max(0.0, v - t) / max(abs(t), abs(self.reference or 0.0), 1e-9)


def _memory(p: dict[str, Any], recorded: dict[str, Any]) -> float:
    """The memory a point adds: Σ log(new / recorded) of the settings that size the KV cache."""
    out = 0.0
    for k in _MEMORY:
        v, r = p.get(k), recorded.get(k)
        if isinstance(v, (int, float)) and isinstance(r, (int, float)) and r > 0 and v > r:
            out += math.log(v / r)
    return out


def _knobs(searches: Sequence[Search], recorded: dict[str, Any]) -> list[tuple[str, list[Any]]]:
    """The union of the searches' candidates, each setting's values ordered by the size of
    the change and cut at :data:`MAX_VALUES` (a finding's checked remedy always kept)."""
    by: dict[str, list[Any]] = {}
    keep: dict[str, set[Any]] = {}
    for s in searches:
        for k, vs in s.candidates.items():
            by.setdefault(k, [])
            by[k] += [v for v in vs if v not in by[k]]
        r = s.finding.remedy
        if isinstance(r, CheckedRemedy) and r.checked:
            for k, v in r.whatif.items():
                keep.setdefault(k, set()).add(v)
                by.setdefault(k, [])
                if v not in by[k]:
                    by[k].append(v)
    out = []
    for k, vs in by.items():
        def size(v: Any, k: str = k) -> float:
            return change_size({k: v}, recorded)

        ordered = sorted(vs, key=size)
        kept = [v for v in ordered if v in keep.get(k, set())]
        rest = [v for v in ordered if v not in kept][: max(MAX_VALUES - len(kept), 0)]
        out.append((k, sorted(kept + rest, key=size)))
    return out


def _seeds(searches: Sequence[Search]) -> list[dict[str, Any]]:
    """Each finding's checked remedy, and all of them together when they change different
    settings."""
    seeds: list[dict[str, Any]] = []
    for s in searches:
        r = s.finding.remedy
        if isinstance(r, CheckedRemedy) and r.checked and r.whatif and r.whatif not in seeds:
            seeds.append(dict(r.whatif))
    union: dict[str, Any] = {}
    for p in seeds:
        for k, v in p.items():
            union.setdefault(k, v)
    if len(seeds) > 1 and union not in seeds:
        seeds.append(union)
    return seeds


def _scope(searches: Sequence[Search], evaluator: Evaluator, whole_run: bool) -> Evaluator:
    """The stretch holding every goal's figure, else the whole run."""
    from ..sim.cut import stretch_for

    if whole_run:
        return evaluator
    spans = [goal_steps(s.goal, s.finding, evaluator.workload) for s in searches]
    if not spans or any(sp is None for sp in spans):
        return evaluator
    first, last = min(sp[0] for sp in spans if sp), max(sp[1] for sp in spans if sp)
    return cut_or_whole(evaluator, stretch_for(evaluator.workload, first, last))


def build(findings: list[Finding], searches: Sequence[Search], evaluator: Evaluator, deadline: float,
          whole_run: bool = False, progress: Callable[[str], None] | None = None) -> Plan:
    """The plan for ``findings`` (their remedy ``searches`` already run), replayed on
    ``evaluator``'s run; stops at ``deadline`` (``time.monotonic()``) with the best so far.

    Raises nothing a replay can raise: a run the replay cannot take gives the unchecked plan.
    """
    searched = [s for s in searches if s.goal is not None]
    if not searched:
        return unchecked_plan(findings, "no finding has a goal the replay can check")
    recorded_settings = _recorded(evaluator)
    scope = _scope(searched, evaluator, whole_run)
    subsets = {tuple(sorted(s.goal.requests)) for s in searched if s.goal.requests}
    subsets |= {tuple(sorted(ids)) for s in searched for _, ids in s.goal.watch if ids}
    evaluator.deadline = deadline
    try:
        # BaselineStopped when the budget stopped it: the plan is then incomplete
        base = raise_failed(scope.evaluate([{}], subsets=subsets)[0])
        goals = [GoalCheck(s.finding, s.goal, goal_label(s.goal), _recorded_figure(scope, s.goal),
                           base.figure(s.goal.figure, s.goal.requests)) for s in searched]

        def key(p: dict[str, Any], ev: Evaluation) -> tuple:
            if not ev.ok:
                return (math.inf,)
            missed = sum(not g.met(ev, base) for g in goals)
            return (missed, sum(g.shortfall(ev) for g in goals if not g.met(ev, base)), len(p),
                    _memory(p, recorded_settings), change_size(p, recorded_settings))

        start_replays = scope.all_replays
        found = descend(lambda pts: scope.evaluate(pts, subsets=subsets), _knobs(searched, recorded_settings), key,
                        recorded_settings, base, deadline, _seeds(searched), progress)
        replays = scope.all_replays - start_replays + 1
        points = [(p, ev) for p, ev in found.seen.values() if ev.ok]
        chosen, stopped = _verified(_front(points, goals, base, key), points, goals, base, key, scope, subsets)
        complete = found.complete and not stopped
        plans = [_plan(p, ev, goals, base, findings, scope, recorded_settings, replays, complete, still)
                 for p, ev, still in chosen]
    except EvaluateError as e:
        kept = unchecked_plan(findings, f"the plan could not be replayed ({e})")
        kept.complete = not isinstance(e, BaselineStopped)  # the budget stopped it
        return kept
    finally:
        evaluator.deadline = None
    plan = plans[0]
    if not complete and not plan.clears:  # the budget stopped it before it reached a goal
        kept = unchecked_plan(findings, f"the search's time budget ran out after {replays} replay(s)")
        kept.complete = False
        return kept
    if not plan.clears:  # nothing replayed reaches a goal: apply nothing, name the closest
        closest = plan
        plan = Plan(settings={}, flags=[], engine_args={}, checked=True, complete=plan.complete,
                    leaves=closest.leaves, left_because={k: f"no replayed setting reaches its goal; the closest, "
                                                            f"{_text(closest.settings)}: {v}"
                                                         for k, v in closest.left_because.items()},
                    predicted=closest.predicted, replays=replays, stretch=closest.stretch)
        plans = [plan, closest]
    plan.alternatives = plans[1:]
    conflict = _conflict(points, goals, base)
    if conflict:
        plan.conflict = conflict
    return plan


#: The best points re-diagnosed on their replayed run before one is the plan.
MAX_VERIFY = 3


def _still_found(scope: Evaluator, p: dict[str, Any]) -> dict[str, str] | None:
    """The warning and critical findings the doctor's rules raise on a replay of ``p``:
    ``{id: message}`` (None: it could not be replayed, or the replay keeps no run directory)."""
    import shutil

    from ..analysis.doctor import examine

    ev = scope.evaluate([p], keep=True)[0]
    if not ev.ok or not ev.run_dir:
        return None
    try:
        return {f.id: f.message for f in examine(ev.run_dir).findings if f.severity in (CRITICAL, WARNING)}
    finally:
        if not scope.keep:
            shutil.rmtree(ev.run_dir, ignore_errors=True)


def _verified(front: list[tuple[dict[str, Any], Evaluation]], points: list[tuple[dict[str, Any], Evaluation]],
              goals: list[GoalCheck], base: Evaluation, key: Callable[[dict[str, Any], Evaluation], tuple],
              scope: Evaluator, subsets: set[tuple[str, ...]] | None = None,
              ) -> tuple[list[tuple[dict[str, Any], Evaluation, dict[str, str] | None]], bool]:
    """The plans, each with the findings its replay still shows: a goal reached is not a
    finding cleared (the queue 30 % shorter, max_num_seqs may still hold the run back), so
    the best points by ``key`` (up to :data:`MAX_VERIFY`) are diagnosed on their replays and
    the one clearing the most findings leads. A run that is an offline burst split across
    steps 0 and 1 by ``LLM.generate``'s race is replayed again with the burst added at once
    (:func:`~vllm_probe.sim.plan.burst_at_once`): a goal met only at the recorded split is
    not cleared, since a rerun of the plan may split it either way. Returns the plans and
    whether the budget stopped one of those replays."""
    ranked = sorted(points, key=lambda pe: key(*pe))
    pool = [pe for pe in ranked[:MAX_VERIFY] if any(g.met(pe[1], base) for g in goals)]
    at_once, stopped = _at_once(pool, goals, base, scope, subsets or set())
    checked = []
    for (p, ev), race in zip(pool, at_once):
        still = _still_found(scope, p)
        if race:
            still = {**(still or {}), **race}
        cleared = sum(g.met(ev, base) and (still is None or g.finding.id not in still) for g in goals)
        checked.append((-cleared, key(p, ev), p, ev, still))
    checked.sort(key=lambda c: (c[0], c[1]))
    lead = [(c[2], c[3], c[4]) for c in checked[:1]] or [(*front[0], None)]
    verified: dict[tuple, tuple[int | None, dict[str, str] | None]] = {
        point_key(c[2]): (-c[0], c[4]) for c in checked}  # point -> (findings cleared, still shown)
    rest = []
    for p, ev in front:
        n_cleared, shown = verified.get(point_key(p), (None, None))
        if all(p != q for q, _, _ in lead) and n_cleared != 0:  # a point shown to clear nothing is no plan
            rest.append((p, ev, shown))
    return lead + rest[:MAX_PLANS - 1], stopped


def _at_once(pool: list[tuple[dict[str, Any], Evaluation]], goals: list[GoalCheck], base: Evaluation,
             scope: Evaluator, subsets: set[tuple[str, ...]]) -> tuple[list[dict[str, str]], bool]:
    """Per point of ``pool``, the goals it meets at the recorded split of an offline burst
    but not with the burst added at once, or not known to (that replay did not run):
    ``{finding id: why}`` (empty when the run is no split burst, or the point meets them
    both ways); and whether the budget stopped one of those replays."""
    from ..sim.plan import burst_at_once

    other = burst_at_once(scope.workload) if pool else None
    if other is None:
        return [{} for _ in pool], False
    recorded = sorted({r.add_before_step for r in scope.workload.requests if r.anchored})
    split = ", ".join(f"{sum(r.anchored and r.add_before_step == k for r in scope.workload.requests)} before step {k}"
                      for k in recorded)
    n = sum(r.anchored for r in other.requests)
    evs = scope.evaluate([p for p, _ in pool], subsets=subsets, workload=other)
    out = []
    at = (f"with the burst added at once ({n} requests before step {recorded[0]}, as another run of the same "
          f"LLM.generate call may add them; recorded: {split})")
    for (_, ev), alt in zip(pool, evs):
        if not alt.ok:  # not known to hold in a rerun: not claimed
            out.append({g.finding.id: f"not replayed {at}: {alt.error}" for g in goals if g.met(ev, base)})
            continue
        out.append({g.finding.id: f"{at}, {g.label} {_num(g.value(alt))} against the goal {_num(g.target)}"
                    for g in goals if g.met(ev, base) and not g.met(alt, base)})
    return out, any(alt.stopped_at is not None for alt in evs)


def _text(p: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in p.items()) or "the recorded settings"


def _recorded(evaluator: Evaluator) -> dict[str, Any]:
    from ..sim.engine_args import recorded_settings

    out = recorded_settings(evaluator.workload.config)
    if evaluator.workload.config.get("scheduler_class") == "AsyncScheduler":
        out["async_scheduling"] = True
    return out


def _recorded_figure(scope: Evaluator, g: Goal) -> float | None:
    if not g.requests:
        return scope.recorded_figures.get(g.figure)
    return scope.recorded_measure([g.figure], g.requests)[g.figure]


def _front(points: list[tuple[dict[str, Any], Evaluation]], goals: list[GoalCheck], base: Evaluation,
           key: Callable[[dict[str, Any], Evaluation], tuple]) -> list[tuple[dict[str, Any], Evaluation]]:
    """The plan (the point of least ``key``) and, when it misses a goal, up to two more
    points of the Pareto front of the goals' shortfalls that meet other goals."""
    ranked = sorted(points, key=lambda pe: key(*pe))
    best = ranked[0]
    if all(g.met(best[1], base) for g in goals):
        return [best]
    vec = {id(ev): tuple(g.shortfall(ev) for g in goals) for _, ev in points}

    def dominated(ev: Evaluation) -> bool:
        a = vec[id(ev)]
        return any(all(x <= y for x, y in zip(vec[id(o)], a)) and vec[id(o)] != a for _, o in points)

    out = [best]
    met_sets = [frozenset(i for i, g in enumerate(goals) if g.met(best[1], base))]
    for p, ev in ranked[1:]:
        if len(out) >= MAX_PLANS:
            break
        met = frozenset(i for i, g in enumerate(goals) if g.met(ev, base))
        if met and met not in met_sets and not dominated(ev):
            out.append((p, ev))
            met_sets.append(met)
    return out


def _conflict(points: list[tuple[dict[str, Any], Evaluation]], goals: list[GoalCheck], base: Evaluation) -> str | None:
    """The goals each met by some replayed point but never together, as a sentence."""
    met = [{i for i, g in enumerate(goals) if g.met(ev, base)} for _, ev in points]
    pairs = []
    for i in range(len(goals)):
        for j in range(i + 1, len(goals)):
            if any(i in m for m in met) and any(j in m for m in met) and not any({i, j} <= m for m in met):
                pairs.append(f"{goals[i].finding.id}'s goal ({goals[i].label}) and {goals[j].finding.id}'s "
                             f"({goals[j].label})")
    if not pairs:
        return None
    return ("no replayed setting reached " + "; nor ".join(pairs) + " together: the plans below trade one for the "
            "other")


def _plan(p: dict[str, Any], ev: Evaluation, goals: list[GoalCheck], base: Evaluation, findings: list[Finding],
          scope: Evaluator, recorded: dict[str, Any], replays: int, complete: bool,
          still: dict[str, str] | None = None) -> Plan:
    """The plan record of point ``p`` (replayed as ``ev``; ``still``: the findings its replay
    still shows, None when not diagnosed)."""
    ivs, base_ivs = scope.intervals(ev), scope.intervals(base)
    predicted: dict[str, PlanFigure] = {}
    cleared = {id(g.finding) for g in goals if g.met(ev, base) and (still is None or g.finding.id not in still)}
    for g in goals:
        name = g.goal.figure
        iv = scope.intervals(ev, g.goal.requests).get(name) if g.goal.requests else ivs.get(name)
        biv = scope.intervals(base, g.goal.requests).get(name) if g.goal.requests else base_ivs.get(name)
        predicted[g.label] = _figure(name, g.recorded, g.baseline, g.value(ev), iv, biv, goal=g.finding.id,
                                     met=id(g.finding) in cleared)
    for name in TRADEOFFS:
        if name not in predicted:
            predicted[name] = _figure(name, scope.recorded_figures.get(name), base.figures.get(name),
                                      ev.figures.get(name), ivs.get(name), base_ivs.get(name))
    for g in goals:
        for label, ids in g.goal.watch:
            key = f"{g.goal.figure} ({label})"
            rec = scope.recorded_measure([g.goal.figure], ids)[g.goal.figure]
            predicted[key] = _figure(g.goal.figure, rec, base.figure(g.goal.figure, ids), ev.figure(g.goal.figure, ids),
                                     scope.intervals(ev, ids).get(g.goal.figure),
                                     scope.intervals(base, ids).get(g.goal.figure))
    serious = [f for f in findings if f.severity in (CRITICAL, WARNING)]
    left: dict[str, str] = {}
    for f in serious:
        if id(f) in cleared:
            continue
        mine = next((g for g in goals if g.finding is f), None)
        if mine is None:
            left[f.id] = "no goal the replay can check"
        elif still is not None and f.id in still and mine.met(ev, base):
            left[f.id] = (f"{mine.label} reaches its goal ({_num(mine.value(ev))}), but the replay at these settings "
                          f"still shows the finding: {still[f.id]}")
        else:
            left[f.id] = (f"{mine.label} {_num(mine.value(ev))} against the goal {_num(mine.target)} (replayed at "
                          f"the recorded settings: {_num(mine.baseline)})")
    cfg = SimpleNamespace(**scope.workload.config)
    return Plan(
        settings=dict(p), flags=serve_flags(p), engine_args={engine_arg_of(k): v for k, v in p.items()},
        checked=True, complete=complete,
        clears=[f.id for f in findings if id(f) in cleared],
        leaves=list(left), left_because=left, predicted=predicted,
        mechanism=_mechanism(base, ev), cost=_cost(p, recorded, cfg), replays=replays,
        rerun=_rerun(scope, p), stretch=scope.stretch.to_dict() if scope.stretch is not None else None)


def _figure(name: str, recorded: float | None, baseline: float | None, predicted: float | None, iv: Any, biv: Any,
            goal: str | None = None, met: bool | None = None) -> PlanFigure:
    from ..sim.intervals import direction

    return PlanFigure(unit=objective(name).unit, recorded=recorded, baseline=baseline, predicted=predicted,
                      direction=direction(name, baseline, predicted, biv, iv),
                      interval=iv.to_dict() if iv is not None else None,
                      baseline_interval=biv.to_dict() if biv is not None else None, goal=goal, met=met)


def _mechanism(base: Evaluation, ev: Evaluation) -> dict[str, list[float | None]]:
    """Decodes per step, tokens per step and running requests (median), replayed at the
    recorded settings and at the plan's: why its seconds move."""
    def terms(s: Any) -> tuple[float | None, float | None, float | None]:
        if s is None or not s.steps:
            return (None, None, None)
        return (round(s.decode_tokens / s.steps, 2), round(s.scheduled_tokens / s.steps, 1),
                s.queues.running.median)

    b, p = terms(base.summary), terms(ev.summary)
    return {"decodes per step": [b[0], p[0]], "tokens per step": [b[1], p[1]], "running (median)": [b[2], p[2]]}


def _cost(p: dict[str, Any], recorded: dict[str, Any], cfg: Any) -> list[str]:
    """What the plan's settings cost, one line each (the figures it worsens are in its
    ``predicted``, labelled ``worse``)."""
    out = []
    for k, v in p.items():
        r = recorded.get(k)
        if k == "num_kv_blocks" and isinstance(r, int) and v > r:
            per = getattr(cfg, "kv_block_bytes", None)
            size = f" ({(v - r) * per / (1 << 20):,.0f} MiB of KV cache)" if per else ""
            out.append(f"num_kv_blocks {r:,} → {v:,}: +{v - r:,} blocks{size}; {memory_advice(cfg, v)}")
        elif k == "max_num_seqs" and isinstance(r, int) and v < r:
            out.append(f"max_num_seqs {r:,} → {v:,}: at most {v:,} requests run at once")
        elif k in ("max_num_batched_tokens", "max_num_scheduled_tokens") and isinstance(r, int) and v > r:
            out.append(f"{k} {r:,} → {v:,}: steps up to {v:,} tokens; a decode sharing a step with a long prefill "
                       "waits longer")
        elif k == "long_prefill_token_threshold":
            out.append(f"long_prefill_token_threshold → {v:,}: long prompts prefill in chunks of at most {v:,} tokens "
                       "when others wait (their own time to first token grows)")
        elif k == "async_scheduling" and v is False:
            out.append("async scheduling off: the next step is not prepared while the model runs this one")
    return out


def _rerun(scope: Evaluator, p: dict[str, Any]) -> list[str]:
    """The commands that record a rerun at the plan's settings and check it."""
    from ..runs.rundir import read_meta

    source = scope.parent.run_dir if scope.parent is not None else scope.run_dir
    meta = read_meta(source)
    rank = ""
    of = meta.get("rank_of")  # one rank of a data-parallel run (runs.ranks.rank_view): name the run itself
    if isinstance(of, dict) and isinstance(of.get("run"), str) and isinstance(of.get("rank"), int):
        source, rank = of["run"], f" --rank {of['rank']}"
    command = meta.get("command")
    flags = " ".join(serve_flags(p))
    if isinstance(command, list) and command and any("vllm" in c and ("serve" in command or "api_server" in c)
                                                      for c in command):
        run = f"vllm-probe run -- {' '.join(command)} {flags}"
    else:
        shown = " ".join(command) if isinstance(command, list) and command else "COMMAND"
        run = (f"vllm-probe run -- {shown}   # with LLM(..., "
               + ", ".join(f"{engine_arg_of(k)}={v!r}" for k, v in p.items()) + ") in the script")
    return [run, "vllm-probe doctor" + rank, f"vllm-probe compare {source} NEW_RUN_DIR"]


def _num(v: float | None) -> str:
    if v is None:
        return "?"
    return f"{v:,.0f}" if float(v).is_integer() or abs(v) >= 1000 else f"{v:.4g}"


def unchecked_plan(findings: list[Finding], why: str) -> Plan:
    """The rules' arithmetic as one plan, not replayed: each warning or critical finding's
    remedy in report order, a setting named twice taken from the first (``why``: why it was
    not replayed, said of every finding it leaves)."""
    settings: dict[str, Any] = {}
    for f in findings:
        if f.severity in (CRITICAL, WARNING) and f.remedy is not None:
            for k, v in f.remedy.whatif.items():
                settings.setdefault(k, v)
    serious = [f.id for f in findings if f.severity in (CRITICAL, WARNING)]
    return Plan(settings=settings, flags=serve_flags(settings),
                engine_args={engine_arg_of(k): v for k, v in settings.items()}, checked=False, leaves=serious,
                left_because=dict.fromkeys(serious, f"arithmetic, not checked by the replay: {why}"))


__all__ = ["MAX_PLANS", "MAX_VALUES", "GoalCheck", "build", "unchecked_plan"]
