"""``vllm-probe tune``: settings searched against service-level objectives by replaying a
recorded run through vLLM's own scheduler.

* **SLOs** (:func:`parse_slo`): ``FIGURE<=VALUE`` or ``FIGURE>=VALUE`` over a figure of
  :mod:`vllm_probe.analysis.objectives` (``ttft_p90<=0.6s``, ``itl_p90<=50ms``,
  ``preemptions<=0``, ``output_tokens_per_s>=900``); time values take ``s``, ``ms`` or
  ``us`` (seconds without a unit).
* **Knobs** (:func:`parse_knob`): ``NAME=LO..HI`` or ``NAME=V1,V2,...`` by ``whatif
  --set`` names (:data:`vllm_probe.sim.engine_args.SETTINGS`). An integer range is tried
  at ``LO``, doublings of it and ``HI`` (the tuning guide's settings move by powers of
  two); a fractional range at :data:`FLOAT_STEPS` even steps.
* **Objective**: maximize ``output_tokens_per_s`` unless ``--maximize``/``--minimize``
  names another figure (``--minimize num_kv_blocks``: the smallest cache that meets the
  SLOs).

**The search** (:func:`tune`) is the batched coordinate descent of
:mod:`vllm_probe.advice.descent` (the doctor's plan searches with it too): from the recorded
settings, each round replays every value of every knob with the other knobs held at the
current best, moves to the best point (meeting the SLOs first, then the objective; among
points that miss, the smallest total relative violation), and stops when a round finds
nothing better.

A point vLLM refuses at start-up (its own checks) or whose replay cannot finish is
listed with its error and never recommended.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..analysis.objectives import OBJECTIVES, ObjectiveError, objective
from ..schema.engine_settings import BY_NAME, serve_flags
from .descent import descend
from .evaluate import Evaluation, Evaluator

#: Values a fractional ``LO..HI`` range is tried at.
FLOAT_STEPS = 5
#: Most values one knob may take (a range or a list).
MAX_VALUES = 32
#: Default time budget of a search (s of replays).
DEFAULT_BUDGET_S = 600.0
#: Time units of SLO values: how many make one second (a value is divided by it).
TIME_UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6, "µs": 1e6}


class TuneError(ValueError):
    """Bad ``--slo``/``--knob``/objective, or a knob value out of range; one line."""


@dataclass(frozen=True)
class Slo:
    """``figure op value``: op ``<=`` or ``>=``; value in the figure's unit."""

    figure: str
    op: str
    value: float

    def violation(self, v: float | None) -> float:
        """0 when met; else the relative distance to the limit (inf: figure unknown)."""
        if v is None:
            return math.inf
        gap = v - self.value if self.op == "<=" else self.value - v
        if gap <= 0:
            return 0.0
        return gap / abs(self.value) if self.value else gap

    def text(self) -> str:
        return f"{self.figure}{self.op}{_fmt(self.value, objective(self.figure).unit)}"

    def to_dict(self) -> dict[str, Any]:
        return {"figure": self.figure, "op": self.op, "value": self.value, "unit": objective(self.figure).unit}


@dataclass(frozen=True)
class TuneKnob:
    """One setting and the values to try (in order), by ``whatif --set`` name."""

    setting: str
    values: tuple[Any, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"setting": self.setting, "values": list(self.values)}


_SLO = re.compile(r"^\s*([A-Za-z_0-9]+)\s*(<=|>=)\s*([-+0-9.eE]+)\s*([A-Za-zµ/]*)\s*$")


def parse_slo(text: str) -> Slo:
    """``ttft_p90<=0.6s`` → ``Slo("ttft_p90", "<=", 0.6)``.

    Raises:
        TuneError: not ``FIGURE<=VALUE``/``FIGURE>=VALUE``, an unknown figure, a unit that
            does not fit the figure, a value that is not a finite number.
    """
    m = _SLO.match(text)
    if not m:
        raise TuneError(f"--slo {text!r}: expected FIGURE<=VALUE or FIGURE>=VALUE, e.g. ttft_p90<=0.6s")
    name, op, number, unit = m.groups()
    try:
        o = objective(name)
    except ObjectiveError as e:
        raise TuneError(f"--slo {text!r}: {e}") from None
    try:
        value = float(number)
    except ValueError:
        raise TuneError(f"--slo {text!r}: {number!r} is not a number") from None
    if not math.isfinite(value):
        raise TuneError(f"--slo {text!r}: the value must be finite")
    if unit:
        if o.unit == "s" and unit in TIME_UNITS:
            value /= TIME_UNITS[unit]  # 18 / 1e3 is 0.018; 18 * 1e-3 is 0.018000000000000002
        elif unit != o.unit:
            raise TuneError(f"--slo {text!r}: {name} is in {o.unit}, not {unit}")
    return Slo(name, op, value)


def parse_knob(text: str) -> TuneKnob:
    """``max_num_batched_tokens=512..4096`` → values 512, 1024, 2048, 4096;
    ``num_kv_blocks=48,56,64`` → those; booleans and ``scheduling_policy`` as a list.

    Raises:
        TuneError: no ``=``, an unknown setting (with the closest), a value of the wrong
            type, ``LO > HI``, a value out of the setting's range (a count below 1, a share
            outside (0, 1]), more than :data:`MAX_VALUES` values.
    """
    from ..sim.engine_args import SETTINGS, SettingError, parse_value, unknown_key

    key, eq, spec = text.partition("=")
    key = key.strip().replace("-", "_")
    if not eq or not spec.strip():
        raise TuneError(f"--knob {text!r}: expected NAME=LO..HI or NAME=V1,V2,...")
    if key not in SETTINGS:
        raise TuneError(f"--knob {text!r}: {unknown_key(key)}")
    s = SETTINGS[key]
    try:
        if ".." in spec:
            lo_t, _, hi_t = spec.partition("..")
            if s.type not in (int, float):
                raise TuneError(f"--knob {text!r}: {key} takes a list of values, not a range")
            lo, hi = parse_value(s, lo_t), parse_value(s, hi_t)
            if lo > hi:
                raise TuneError(f"--knob {text!r}: LO {lo} is above HI {hi}")
            values = _ladder(lo, hi) if s.type is int else [lo + (hi - lo) * i / (FLOAT_STEPS - 1)
                                                              for i in range(FLOAT_STEPS)]
        else:
            values = [parse_value(s, v) for v in spec.split(",") if v.strip()]
    except SettingError as e:
        raise TuneError(f"--knob {text!r}: {e}") from None
    values = list(dict.fromkeys(values))
    for v in values:
        why = _out_of_range(key, v)
        if why:
            raise TuneError(f"--knob {text!r}: {why}")
    if not values or len(values) > MAX_VALUES:
        raise TuneError(f"--knob {text!r}: between 1 and {MAX_VALUES} values, not {len(values)}")
    return TuneKnob(key, tuple(values))


def _ladder(lo: int, hi: int) -> list[int]:
    out, v = [lo], lo
    while v > 0 and v * 2 < hi:
        v *= 2
        out.append(v)
    if hi != lo:
        out.append(hi)
    return out


def _out_of_range(key: str, v: Any) -> str | None:
    s = BY_NAME.get(key)
    return s.out_of_bounds(v) if s is not None else None


@dataclass
class Point:
    """One evaluated setting: ``overrides``, its :class:`Evaluation`, whether it meets
    every SLO, its total violation and objective value (``to_dict``'s ``outside_region``:
    the share of its replay's steps outside the step-time model's fitted region)."""

    overrides: dict[str, Any]
    evaluation: Evaluation
    meets: bool
    violation: float
    objective: float | None
    intervals: dict[str, Any] = field(default_factory=dict)

    def to_dict(self, slos: list[Slo]) -> dict[str, Any]:
        ev = self.evaluation
        summary = {name: ev.figures.get(name) for name in OBJECTIVES}
        out: dict[str, Any] = {"settings": dict(self.overrides), "summary": summary, "meets": self.meets,
                               "outside_region": ev.outside_region,
                               "intervals": {k: v.to_dict() for k, v in self.intervals.items()},
                               "meets_within_intervals": self.meets_surely(slos) if self.meets else False}
        if ev.error:
            out["error"] = ev.error
        return out

    def meets_surely(self, slos: list[Slo]) -> bool:
        """Whether every SLO holds across the whole interval of its figure (a figure without
        one: at its value)."""
        for s in slos:
            iv = self.intervals.get(s.figure)
            worst = self.evaluation.figures.get(s.figure) if iv is None else (iv.hi if s.op == "<=" else iv.lo)
            if s.violation(worst) > 0:
                return False
        return True


@dataclass
class TuneResult:
    """What :func:`tune` found (the ``--json`` object: :meth:`to_dict`).

    ``step_time_model``: the evaluator's
    :meth:`~vllm_probe.sim.whatif.StepTimeChoice.to_dict` (``source``: ``profile``,
    ``cache`` or ``recording``; ``profile``: its path; ``forced``: the note when another
    engine's profile was forced); ``baseline_outside``: the share of the baseline
    replay's steps outside the model's fitted region (None: no region known).
    """

    source: str
    slos: list[Slo]
    knobs: list[TuneKnob]
    objective: str
    direction: str
    recorded_settings: dict[str, Any]
    recorded: dict[str, float | None]
    baseline: dict[str, float | None]
    baseline_error: dict[str, Any]
    evaluated: list[Point] = field(default_factory=list)
    recommended: Point | None = None
    closest: Point | None = None
    rounds: int = 0
    replays: int = 0
    seconds: float = 0.0
    complete: bool = True
    notes: list[str] = field(default_factory=list)
    step_time_model: dict[str, Any] | None = None
    baseline_outside: float | None = None
    baseline_intervals: dict[str, Any] = field(default_factory=dict)

    def settings_of(self, p: Point) -> dict[str, Any]:
        """Every knob's value at ``p`` (recorded where it did not change), by whatif names."""
        return {k.setting: p.overrides.get(k.setting, self.recorded_settings.get(k.setting)) for k in self.knobs}

    def to_dict(self) -> dict[str, Any]:
        """``{"source", "slo", "knobs", "objective", "baseline", "evaluated": [{"settings",
        "summary", "meets", "outside_region"}], "recommended": {"settings", "summary",
        "flags", "serve", "outside_region"} | null, "closest", "search", "notes",
        "step_time_model": {"source", "profile", "forced"}}``; figures by
        :mod:`~vllm_probe.analysis.objectives` names, in their units; ``outside_region``
        (also in ``baseline``): the share (0..1) of that replay's steps outside the region
        the step-time model was fitted on (null: unknown)."""
        rec = None
        if self.recommended is not None:
            settings = self.settings_of(self.recommended)
            full = self.recommended.to_dict(self.slos)
            rec = {"settings": settings, "summary": full["summary"],
                   "flags": flags(self.recommended.overrides), "serve": serve_line(self.recommended.overrides),
                   "outside_region": self.recommended.evaluation.outside_region, "intervals": full["intervals"],
                   "meets_within_intervals": full["meets_within_intervals"]}
        closest = None
        if self.recommended is None and self.closest is not None:
            closest = {**self.closest.to_dict(self.slos), "would_take": self.would_take()}
        return {
            "source": self.source,
            "slo": [s.to_dict() for s in self.slos],
            "knobs": [k.to_dict() for k in self.knobs],
            "objective": {"figure": self.objective, "direction": self.direction},
            "baseline": {"settings": {k.setting: self.recorded_settings.get(k.setting) for k in self.knobs},
                         "recorded": self.recorded, "replayed": self.baseline, "error": self.baseline_error,
                         "outside_region": self.baseline_outside,
                         "intervals": {k: v.to_dict() for k, v in self.baseline_intervals.items()}},
            "evaluated": [p.to_dict(self.slos) for p in self.evaluated],
            "recommended": rec,
            "closest": closest,
            "search": {"method": "batched coordinate descent", "rounds": self.rounds, "replays": self.replays,
                       "seconds": round(self.seconds, 3), "complete": self.complete},
            "notes": self.notes,
            "step_time_model": self.step_time_model,
        }

    def would_take(self) -> list[str]:
        """For the closest point when nothing meets the SLOs: per missed SLO, how far off
        and what would take it further, one line each."""
        p = self.closest
        if p is None:
            return []
        out = []
        for s in self.slos:
            v = p.evaluation.figures.get(s.figure)
            if s.violation(v) == 0:
                continue
            unit = objective(s.figure).unit
            edge = [k.setting for k in self.knobs if p.overrides.get(k.setting, self.recorded_settings.get(k.setting))
                    in (k.values[0], k.values[-1]) and isinstance(k.values[-1], (int, float))
                    and not isinstance(k.values[-1], bool)]
            more = (f"; {', '.join(edge)} stood at the end of its range: widen --knob past it" if edge else
                    "; no value in range moves it further: another knob, or relax the SLO")
            out.append(f"{s.figure} {_fmt(v, unit)} against {s.op} {_fmt(s.value, unit)} "
                       f"(relax to {s.op} {_fmt(v, unit)} to accept it){more}")
        return out


def flags(overrides: dict[str, Any]) -> list[str]:
    """The ``vllm serve`` flags that apply ``overrides``
    (:func:`vllm_probe.schema.engine_settings.serve_flags`)."""
    return serve_flags(overrides)


def serve_line(overrides: dict[str, Any], model: str = "MODEL") -> str:
    """``vllm serve MODEL --max-num-batched-tokens 1024 ...``."""
    return " ".join(["vllm", "serve", model, *flags(overrides)])


def _key(p: Point, direction: str) -> tuple:
    o = p.objective
    if o is None:
        o_key = math.inf
    else:
        o_key = -o if direction == "maximize" else o
    return (0 if p.meets else 1, p.violation if not p.meets else 0.0, o_key, len(p.overrides))


def tune(evaluator: Evaluator, slos: list[Slo], knobs: list[TuneKnob], objective_name: str = "output_tokens_per_s",
         direction: str = "maximize", budget_s: float = DEFAULT_BUDGET_S,
         progress: Callable[[str], None] | None = None) -> TuneResult:
    """Search ``knobs`` for the best ``objective_name`` among settings that meet ``slos``.

    Raises:
        TuneError: a knob value vLLM refuses at the recorded settings (checked before any
            replay), an unknown objective, no knob.
    """
    from ..sim.engine_args import SettingError, recorded_settings

    if not knobs:
        raise TuneError("give at least one --knob NAME=LO..HI or NAME=V1,V2,...")
    try:
        objective(objective_name)
    except ObjectiveError as e:
        raise TuneError(str(e)) from None
    for k in knobs:  # what vLLM refuses for one value alone is a usage error, before any replay
        for v in k.values:
            try:
                evaluator.plan.check({k.setting: v})
            except SettingError as e:
                raise TuneError(f"--knob {k.setting}: {e}") from None
    config = evaluator.workload.config
    rec = recorded_settings(config)
    if config.get("scheduler_class") == "AsyncScheduler":
        rec["async_scheduling"] = True
    start = time.monotonic()
    result = TuneResult(str(evaluator.run_dir), slos, knobs, objective_name, direction, rec,
                        evaluator.recorded_figures, evaluator.baseline.figures, evaluator.error,
                        notes=list(evaluator.notes), **_model_fields(evaluator))

    def point(overrides: dict[str, Any], ev: Evaluation) -> Point:
        if not ev.ok:
            return Point(overrides, ev, False, math.inf, None)
        viol = sum(s.violation(ev.figures.get(s.figure)) for s in slos)
        return Point(overrides, ev, viol == 0, viol, ev.figures.get(objective_name))

    found = descend(evaluator.evaluate, [(k.setting, k.values) for k in knobs],
                    lambda o, ev: _key(point(o, ev), direction), rec, evaluator.baseline, start + budget_s,
                    progress=progress)
    seen = [point(o, ev) for o, ev in found.seen.values()]
    for p in seen:
        p.intervals = evaluator.intervals(p.evaluation)
    result.evaluated = seen[1:]
    result.baseline_intervals = seen[0].intervals
    result.rounds, result.complete = found.rounds, found.complete
    result.replays = len(result.evaluated)
    result.seconds = time.monotonic() - start
    ranked = sorted(seen, key=lambda p: _key(p, direction))
    if ranked and ranked[0].meets:
        result.recommended = ranked[0]
    else:
        result.closest = next((p for p in ranked if p.evaluation.ok), None)
    return result


def grid(evaluator: Evaluator, slos: list[Slo], knobs: list[TuneKnob], objective_name: str = "output_tokens_per_s",
         direction: str = "maximize") -> TuneResult:
    """Every combination of the knobs' values (the reference :func:`tune` is measured
    against in docs/tune.md; same result shape)."""
    import itertools

    from ..sim.engine_args import recorded_settings

    rec = recorded_settings(evaluator.workload.config)
    result = TuneResult(str(evaluator.run_dir), slos, knobs, objective_name, direction, rec,
                        evaluator.recorded_figures, evaluator.baseline.figures, evaluator.error,
                        **_model_fields(evaluator))
    points = [dict(zip([k.setting for k in knobs], vs)) for vs in itertools.product(*(k.values for k in knobs))]
    start = time.monotonic()
    evs = evaluator.evaluate(points)
    for o, ev in zip(points, evs):
        viol = sum(s.violation(ev.figures.get(s.figure)) for s in slos) if ev.ok else math.inf
        result.evaluated.append(Point(o, ev, ev.ok and viol == 0, viol, ev.figures.get(objective_name)))
    result.replays, result.seconds, result.rounds = len(points), time.monotonic() - start, 1
    ranked = sorted(result.evaluated, key=lambda p: _key(p, direction))
    if ranked and ranked[0].meets:
        result.recommended = ranked[0]
    else:
        result.closest = ranked[0] if ranked else None
    return result


def _model_fields(evaluator: Evaluator) -> dict[str, Any]:
    """:class:`TuneResult`'s ``step_time_model`` and ``baseline_outside`` from the
    evaluator."""
    return {"step_time_model": evaluator.step_time_model.to_dict(),
            "baseline_outside": evaluator.baseline.outside_region}


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "?"
    if unit == "s":
        return f"{v * 1000:.0f}ms" if abs(v) < 1 else f"{v:.3g}s"
    return f"{v:.4g}" + ("" if unit in ("preemptions", "steps", "blocks", "tokens") else f" {unit}")


def parse_all(slos: Iterable[str], knobs: Iterable[str]) -> tuple[list[Slo], list[TuneKnob]]:
    """Parse every ``--slo`` and ``--knob`` (a knob named twice is an error)."""
    s = [parse_slo(t) for t in slos]
    k = [parse_knob(t) for t in knobs]
    names = [x.setting for x in k]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise TuneError(f"--knob {sorted(dup)[0]} given twice; list its values once")
    return s, k


__all__ = ["DEFAULT_BUDGET_S", "Point", "Slo", "TuneError", "TuneKnob", "TuneResult", "flags", "grid", "parse_all",
           "parse_knob", "parse_slo", "serve_line", "tune"]
