"""What a finding's remedy search says: the goal judged against the recorded and baseline
figures of the stretch each point was replayed on, the prediction of a change with its
trade-offs (better, worse, unchanged, unclear), and the remedy and ``predicted`` record a
search leaves on its finding (:class:`CheckedRemedy`, :class:`~vllm_probe.analysis.doctor.findings.Prediction`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..analysis.doctor.findings import (
    BaselineError, FigureChange, Finding, GoalRecord, Prediction, Remedy,
)
from ..analysis.objectives import objective
from .evaluate import Evaluation, Evaluator, raise_failed
from .goals import figure_of, goal_dict, goal_label, goal_text, reference

if TYPE_CHECKING:
    from .remedies import Search, Tried

#: Figures reported as trade-offs beside the goal's (objectives names).
TRADEOFFS = ("itl_p90", "output_tokens_per_s", "ttft_p90", "num_kv_blocks", "preemptions")


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


def references(s: Search, evaluator: Evaluator) -> tuple[float | None, float | None, Evaluation]:
    """The goal figure recorded and replayed at the recorded settings by ``evaluator`` (the
    whole run's or a stretch's), and that baseline replay; kept per evaluator."""
    key = id(evaluator)
    if key not in s.references:
        g = s.goal
        if g.requests:
            rec = evaluator.recorded_measure([g.figure], g.requests)[g.figure]
            same = g.requests == evaluator.requests
            base = evaluator.baseline if same else raise_failed(evaluator.evaluate([{}], requests=g.requests)[0])
        else:
            rec, base = evaluator.recorded_figures.get(g.figure), evaluator.baseline
        s.references[key] = (rec, figure_of(base, g), base)
    return s.references[key]


def measure_reference(s: Search, evaluator: Evaluator) -> None:
    s.recorded, s.baseline, _ = references(s, evaluator)


def goal_met(s: Search, value: float | None, evaluator: Evaluator) -> bool | None:
    """Whether ``value`` reaches the goal, against ``evaluator``'s references (the search's
    evaluator's, or the wider stretch's a point was replayed on)."""
    recorded_value, baseline_value, _ = references(s, evaluator)
    return s.goal.met(reference(baseline_value, recorded_value), value)


def prediction(s: Search, t: Tried, evaluator: Evaluator) -> dict[str, Any]:
    """The prediction of ``t`` against the recorded and baseline figures of the stretch it
    was replayed on (``evaluator``'s, or the wider one it spilled into)."""
    o = objective(s.goal.figure)
    ev = t.evaluation
    on = t.on or evaluator
    recorded_value, baseline_value, _ = references(s, on)
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
            "recorded": on.recorded_measure([name], ids)[name], "baseline": b,
            "predicted": p, "unit": objective(name).unit, "direction": direction(name, b, p, biv, iv),
            "interval": iv.to_dict() if iv is not None else None}
    out = {"goal": goal_dict(s.goal), "figure": s.goal.figure, "unit": o.unit, "recorded": recorded_value,
           "baseline": baseline_value, "predicted": t.value, "tradeoffs": trade, "settings": dict(t.overrides),
           "outside_region": ev.outside_region}
    if t.widened:
        out["replayed_on"] = t.widened
    return out


def describe_tradeoffs(pred: dict[str, Any]) -> str:
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


def conclude(s: Search, evaluator: Evaluator, recorded: dict[str, Any]) -> None:
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
        recorded=s.recorded, baseline=s.baseline, baseline_error=baseline_error_record(evaluator),
        tried=[t.record() for t in s.tried], complete=s.complete, skipped=s.skipped, resolved=bool(good),
        baseline_outside_region=evaluator.baseline.outside_region, outside_region=None)
    if evaluator.stretch is not None:
        record.stretch = evaluator.stretch.to_dict()
    sign = 1.0 if objective(s.goal.figure).better == "lower" else -1.0
    shown = good[0] if good else min(
        (t for t in s.tried if t.evaluation.ok and t.value is not None),
        key=lambda t: sign * float(t.value or 0.0), default=None)
    if shown is not None:
        pred = prediction(s, shown, evaluator)
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
        f.remedy = unchecked_remedy(f.remedy) if not s.complete and untried else None
        f.predicted = record
        return
    top, rest = good[0], good[1:]
    pred = prediction(s, top, evaluator)
    setting, value = next(iter(top.overrides.items()))
    alternatives = []
    for t in rest:
        k, v = next(iter(t.overrides.items()))
        alternatives.append({"setting": k, "value": v, "whatif": dict(t.overrides), "checked": True,
                             "predicted": prediction(s, t, evaluator),
                             "arithmetic": f"replayed: {s.goal.figure} {fmt_value(s.baseline)} → {fmt_value(t.value)}"})
    source = f.remedy.source if f.remedy is not None else "the replay of this run (vllm-probe whatif)"
    f.remedy = CheckedRemedy(
        setting, value,
        f"replayed {len(s.tried)} change(s) of {', '.join(s.candidates) or 'no knob'}{stretch_text(evaluator)}: "
        f"the smallest that reaches the goal ({goal_text(s.goal)}) is {overrides_text(top.overrides)}: "
        f"{s.goal.figure} {fmt_value(pred['baseline'])} (replay at the recorded settings; "
        f"recorded {fmt_value(pred['recorded'])}) → {fmt_value(top.value)}",
        describe_tradeoffs(pred), source, whatif=dict(top.overrides), alternatives=alternatives,
        checked=True, predicted=pred, began_at=began)
    f.predicted = record


def stretch_text(evaluator: Evaluator) -> str:
    st = evaluator.stretch
    if st is None:
        return ""
    return (f" (on steps {st.first_step:,}-{st.last_step:,} of {st.total_steps:,}, the stretch between idle moments "
            "that holds what the goal counts)")


def fmt_value(v: float | None) -> str:
    """A figure in a remedy's arithmetic: counts with thousands separators (20,403, not
    2.04e+04), other values to 4 significant digits."""
    if v is None:
        return "?"
    if float(v).is_integer() or abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.4g}"


def baseline_error_record(evaluator: Evaluator) -> BaselineError:
    e = evaluator.error
    rows = e.get("figures", {})
    return BaselineError(bool(e.get("within")), {k: r.get("error") for k, r in rows.items()},
                         [k for k, r in rows.items() if not r.get("within")])


def unchecked_remedy(r: Remedy | None) -> CheckedRemedy | None:
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


def overrides_text(p: dict[str, Any]) -> str:
    return ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in p.items())


__all__ = ["TRADEOFFS", "CheckedRemedy", "conclude", "describe_tradeoffs", "goal_met", "measure_reference",
           "overrides_text", "prediction", "references", "unchecked", "unchecked_remedy"]
