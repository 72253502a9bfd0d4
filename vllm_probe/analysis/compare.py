"""Runs side by side (``vllm-probe compare``): what differs between their
effective configs, command lines and settings files, each figure with its delta against
the first run (the baseline), and a verdict per group of figures, told apart by what
they can be trusted for.

Two clocks. *Step* figures (steps, tokens per step, preemptions, chunks, prefix-cache
hits, queue lengths, time to first token in steps) count the scheduler's decisions: the
same workload and settings give the same numbers on a busy or an idle machine, so any
delta is real. *Wall-clock* figures (seconds, tokens per second, ``schedule()`` time)
also measure how much CPU the run got, which on a shared machine varies from run to run.

How much seconds move by chance is read off the runs themselves: within one run, every
request decodes on the same engine with the same settings, so the spread of the
requests' mean inter-token time (:func:`itl_spread`: p90 / median − 1) is what the
machine's noise and the batch's changes do to the same work. A wall-clock delta no
larger than the larger spread of the two runs is *within noise* (``noisy``); larger
ones are reported as they are. Two cases override that: when every step figure of the
two runs is equal (:func:`same_decisions`: the scheduler did the same thing), every
wall-clock difference is the machine's and is marked noisy; and when a wall-clock
group's verdict contradicts its step group's (TTFT in seconds better while TTFT in
steps is worse), the verdict says so (:data:`STEP_GROUP_OF`). The verdict of a group
(:func:`verdicts`) weighs only its figures with a better direction, and among
wall-clock figures only those beyond noise.

How much of a wall-clock difference is the machine is read off the runs' machine-speed
marks (:class:`~vllm_probe.analysis.summary.SpeedMark`: the host's time for the probe's
fixed computation): their ratio (:func:`machine_ratio`; 1.30: the other run's host was
30 % slower) is what the same work's seconds would do from the host alone, to first order
(:func:`machine_share`: a seconds figure by the ratio, a rate by its inverse); each
wall-clock delta carries that share and what is left beyond it. A queue that builds on a
slower host can move TTFT by more than the ratio: the share is the machine's direct part.

Pure: :class:`~vllm_probe.analysis.summary.Summary` objects in, plain data out; the
table is drawn by :mod:`vllm_probe.tui.compare_view`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from .expected import DIFFERS
from .catalogue import BY_NAME, CATALOGUE, STEPS, WALL, Figure
from .paths import S, FigurePath
from .summary_types import CONFIG_KEYS, Summary

@dataclass(frozen=True)
class Group:
    """A group of figures: its name, clock and what it says about the run."""

    name: str
    clock: str
    title: str


#: The groups in display order: step figures first (reliable on any machine), then seconds.
GROUPS: tuple[Group, ...] = (
    Group("steps", STEPS, "tokens per step and budget use"),
    Group("preemptions", STEPS, "KV-cache pressure: requests preempted and work thrown away"),
    Group("chunking", STEPS, "prompts cut into prefill chunks and the KV they re-read"),
    Group("prefix cache", STEPS, "prompt tokens served by cached KV blocks"),
    Group("queues", STEPS, "running and waiting queue lengths after each step"),
    Group("latency in steps", STEPS, "time to first token counted in scheduler steps"),
    Group("latency in seconds", WALL, "queue time, time to first token, end-to-end, decode"),
    Group("run time", WALL, "duration, throughput, time inside schedule()"),
    Group("bound", STEPS, "the limit that held most steps back"),
)
GROUP_CLOCK = {g.name: g.clock for g in GROUPS}
#: Step figures that are shares of a setting, not decisions: the same decisions under
#: another token budget give another budget use (:func:`same_decisions` skips them).
RELATIVE_TO_SETTINGS = (str(S.budget_use.median), str(S.budget_use.p90))
#: The step group each wall-clock group measures in seconds: when their verdicts are
#: opposite, the step group's holds (the seconds moved with the machine).
STEP_GROUP_OF = {"latency in seconds": "latency in steps", "run time": "steps"}

#: The figures ``compare`` lines up, in display order: the catalogue's with a section
#: (per-class latency figures are added per comparison: :func:`figures_for`).
FIGURES: tuple[Figure, ...] = tuple(f for f in CATALOGUE if f.section is not None)


def figures_for(summaries: list[Summary]) -> list[Figure]:
    """:data:`FIGURES` plus the latency of each prompt-length class (and priority) that
    holds finished requests in some run, when there are several: time to first token in
    steps with the step figures, seconds with the wall-clock ones. Classes are the
    baseline's (``compare`` summarizes every run with its boundaries)."""
    base = summaries[0]
    extra_steps: list[Figure] = []
    extra_wall: list[Figure] = []

    def add(path: FigurePath, name: str, key: str) -> None:
        extra_steps.append(Figure(f"ttft_steps_p50.{key}", f"TTFT median (steps) · {name}", "steps", "lower",
                                  section="latency in steps", path=path.ttft_steps.median))
        extra_wall.append(Figure(f"ttft_p50.{key}", f"TTFT median · {name}", "s", "lower", section="latency in seconds",
                                 clock=WALL, path=path.ttft_s.median))
        extra_wall.append(Figure(f"e2e_p50.{key}", f"end-to-end median · {name}", "s", "lower",
                                 section="latency in seconds", clock=WALL, path=path.e2e_s.median))

    used = [i for i, c in enumerate(base.latency_classes.classes)
            if any(i < len(s.latency_classes.classes) and s.latency_classes.classes[i].n for s in summaries)]
    if len(used) > 1:
        for i in used:
            add(S.latency_classes.classes[i], f"{base.latency_classes.classes[i].name} prompts", f"class{i}")
    for i, c in enumerate(base.latency_by_priority):
        add(S.latency_by_priority[i], c.name, f"priority{i}")
    out: list[Figure] = []
    for f in FIGURES:
        out.append(f)
        if f.path == S.latency.ttft_steps.p90:
            out += extra_steps
        elif f.path == S.latency.itl_s.median:
            out += extra_wall
    return out


#: The figures by label (``FIGURE["TTFT p90"]``).
FIGURE: dict[str, Figure] = {f.label: f for f in FIGURES}


def relative_errors(reference: Summary, other: Summary, tolerances: dict[str, float]) -> dict[str, Any]:
    """How far ``other`` is from ``reference`` on the figures named in ``tolerances``
    (catalogue name → largest relative error accepted, e.g. ``{"steps": 0.02}``).

    Returns ``{"figures": {name: {"reference", "value", "error", "tolerance",
    "within"}}, "within": all within}``; ``error`` is :func:`delta`'s relative delta
    (None when the reference is 0 or either value is unknown). A figure is within when
    ``|value - reference| <= tolerance × |reference|`` (so a reference of 0 needs an equal
    value); an unknown value on one side only is not within.
    """
    rows = {}
    for label, tol in tolerances.items():
        f = BY_NAME[label]
        ref, val = f.get(reference), f.get(other)
        d, rel, _ = delta(f, ref, val)
        if d is None:
            within = ref is None and val is None
        else:
            within = abs(d) <= tol * abs(ref)
        rows[label] = {"reference": ref, "value": val, "error": rel, "tolerance": tol, "within": within}
    return {"figures": rows, "within": all(r["within"] for r in rows.values())}


def config_differences(summaries: list[Summary]) -> dict[str, list[Any]]:
    """``engine_config`` keys whose values differ between runs → value per run."""
    out: dict[str, list[Any]] = {}
    for key in CONFIG_KEYS:
        values = [s.config.get(key) for s in summaries]
        if any(v != values[0] for v in values[1:]):
            out[key] = values
    return out


def expected_differences(summaries: list[Summary]) -> list[list[dict[str, Any]]] | None:
    """Per run, the settings its settings file expected and the run did not have
    (``Summary.expected`` checks with status ``differs``); None when no run recorded a
    settings file."""
    if not any(s.expected for s in summaries):
        return None
    return [[c for c in (s.expected or {}).get("checks", []) if c["status"] == DIFFERS] for s in summaries]


def command_differences(summaries: list[Summary]) -> list[str] | None:
    """Per run, the command-line arguments that differ from the other runs (None: same).

    Same-length commands are compared position by position and each differing value is
    shown with the option before it (``--max-num-batched-tokens 512``); otherwise the
    whole command lines are returned.
    """
    cmds = [list(s.command or []) for s in summaries]
    if all(c == cmds[0] for c in cmds[1:]):
        return None
    if len({len(c) for c in cmds}) == 1:
        diff_pos = [i for i in range(len(cmds[0])) if any(c[i] != cmds[0][i] for c in cmds[1:])]
        out = []
        for c in cmds:
            parts = []
            for i in diff_pos:
                if i > 0 and c[i - 1].startswith("-") and (i - 1) not in diff_pos:
                    parts.append(f"{c[i - 1]} {c[i]}")
                else:
                    parts.append(c[i])
            out.append(" ".join(parts))
        return out
    return [" ".join(c) for c in cmds]


def delta(figure: Figure, base: Any, value: Any) -> tuple[float | None, float | None, str | None]:
    """(absolute delta, relative delta, verdict) of ``value`` against ``base``.

    The verdict is ``better``/``worse`` for figures with a better direction, ``same``
    when equal, None when not comparable.
    """
    if not isinstance(base, (int, float)) or not isinstance(value, (int, float)) or isinstance(base, bool):
        return None, None, None
    d = value - base
    rel = d / base if base else None
    if d == 0:
        return 0, 0.0 if base else None, "same"
    if figure.better is None:
        return d, rel, None
    good = d < 0 if figure.better == "lower" else d > 0
    return d, rel, "better" if good else "worse"


def itl_spread(s: Summary) -> float | None:
    """How much the requests' mean inter-token time varies within one run: its p90 over
    its median, minus 1 (0.18: the slower tenth of requests decoded 18 % slower than the
    typical one). None without at least two requests that decoded."""
    d = s.latency.itl_s
    if d.n < 2 or not d.median or d.p90 is None:
        return None
    return max(d.p90 / d.median - 1.0, 0.0)


def is_prediction(s: Summary) -> bool:
    """Whether ``s`` is a replay written by ``vllm-probe whatif`` (its meta.json command)."""
    return s.command is not None and list(s.command[:2]) == ["vllm-probe", "whatif"]


def steps_comparable(base: Summary, other: Summary) -> bool:
    """Whether a step of ``other`` holds the same work as one of ``base``: equal token
    budgets (``max_num_batched_tokens``). At other budgets one step of 6,600 tokens does
    what three of 2,048 do, so figures counted in steps (TTFT in steps) do not compare."""
    a, b = base.config.get("max_num_batched_tokens"), other.config.get("max_num_batched_tokens")
    return a is None or b is None or a == b


def noise_threshold(base: Summary, other: Summary) -> float | None:
    """The relative delta below which a wall-clock figure of ``other`` against ``base`` is
    within noise: the larger :func:`itl_spread` of the two (None: neither run measured one,
    or one is a prediction and the other a real run: their gap is the model's error, not
    the machine's noise)."""
    if is_prediction(base) != is_prediction(other):
        return None
    spreads = [x for x in (itl_spread(base), itl_spread(other)) if x is not None]
    return max(spreads) if spreads else None


def machine_ratio(base: Summary, other: Summary) -> float | None:
    """How much slower ``other``'s host ran the probe's fixed computation than ``base``'s:
    ``other.speed_mark.mark_us / base.speed_mark.mark_us`` (1.30: 30 % slower, 0.80: 20 %
    faster); None when either run has no mark (an older probe, a simulated run)."""
    a, b = base.speed_mark.mark_us, other.speed_mark.mark_us
    return b / a if a and b else None


def decode_ratio(base: Summary, other: Summary) -> float | None:
    """How much slower ``other``'s engine ran its decode-only steps than ``base``'s, at the
    same decode batch (:attr:`~vllm_probe.analysis.summary_types.SpeedMark.decode_steps`):
    the geometric mean of the per-batch ratios of the median periods, each batch weighted
    by the fewer of its two step counts (1.30: 30 % slower). None when the runs share no
    batch (a simulated run has its model's steps; a run that never decoded alone has none).

    The engine's own speed, where :func:`machine_ratio` is a fixed computation beside it:
    on these 2-core hosts the two moved apart (reruns of one setting: decode steps 30–37 %
    slower than the recording's at the same batch while the fixed mark read ×0.99–1.16,
    docs/whatif.md). A decode step also grows with its requests' context: runs whose
    settings change the contexts at a batch compare less cleanly than reruns."""
    theirs = {d.batch: d for d in other.speed_mark.decode_steps}
    num = den = 0.0
    for mine in base.speed_mark.decode_steps:
        o = theirs.get(mine.batch)
        if o is None or mine.median_us <= 0 or o.median_us <= 0:
            continue
        w = min(mine.steps, o.steps)
        num += w * math.log(o.median_us / mine.median_us)
        den += w
    return math.exp(num / den) if den else None


#: Units of wall-clock figures that are rates (more per second): a slower host divides them.
RATE_UNITS = ("tokens/s",)


def machine_share(figure: Figure, ratio: float | None) -> float | None:
    """The relative change of a wall-clock figure that a host ``ratio`` times slower
    explains on its own, to first order: a time (s, µs) by ``ratio − 1``, a rate (tokens/s) by
    ``1 / ratio − 1`` (0.30: +30 %). None for a step figure or an unknown ratio."""
    if figure.clock != WALL or ratio is None:
        return None
    return 1.0 / ratio - 1.0 if figure.unit in RATE_UNITS else ratio - 1.0


def beyond_machine(rel: float | None, machine: float | None) -> float | None:
    """What is left of a relative delta ``rel`` once the machine's share ``machine`` is
    taken out (multiplicatively: ``(1 + rel) / (1 + machine) − 1``; +0.40 with a host 30 %
    slower leaves +7.7 %). None when either is unknown."""
    if rel is None or machine is None or machine <= -1.0:
        return None
    return (1.0 + rel) / (1.0 + machine) - 1.0


def is_noisy(figure: Figure, rel: float | None, threshold: float | None) -> bool | None:
    """Whether a delta of a wall-clock figure is within noise (None: not a wall-clock
    figure, no relative delta, or no threshold)."""
    if figure.clock != WALL or rel is None or threshold is None:
        return None
    return abs(rel) <= threshold


@dataclass
class GroupVerdict:
    """One group's verdict for one run against the baseline.

    Attributes:
        group: the group's name (:data:`GROUPS`).
        clock: :data:`STEPS` or :data:`WALL`.
        run: index of the run (1 = the second run given; the baseline is 0).
        verdict: ``better``, ``worse``, ``mixed`` (some figures better, others worse),
            ``same`` (no figure with a direction moved), ``noise`` (wall-clock figures
            moved, all within noise) or ``unknown`` (no figure to judge).
        changes: up to :data:`CHANGES_SHOWN` figures that moved most, largest relative
            change first: ``{"figure", "unit", "abs", "rel", "verdict", "noisy"}``.
        noise: the threshold used (wall-clock groups; relative, 0.18 = 18 %).
        contradicted_by: for a wall-clock group judged ``better`` or ``worse``, the step
            group (:data:`STEP_GROUP_OF`) whose verdict is the opposite (None: none is).
    """

    group: str
    clock: str
    run: int
    verdict: str
    changes: list[dict[str, Any]] = field(default_factory=list)
    noise: float | None = None
    contradicted_by: str | None = None


#: Figures named in a verdict's ``changes``.
CHANGES_SHOWN = 3


def verdicts(rows: list[dict[str, Any]], n_runs: int, comparable: list[bool] | None = None) -> list[GroupVerdict]:
    """A :class:`GroupVerdict` per group and per run after the baseline, from the rows of
    :func:`comparison` (``rows[i]["deltas"][run - 1]``); ``comparable[run - 1]`` False
    (:func:`steps_comparable`): no step group contradicts a wall-clock one."""
    out = []
    for run in range(1, n_runs):
        for g in GROUPS:
            grow = [r for r in rows if r["section"] == g.name]
            noise = None
            moved, judged, directed = [], [], 0
            for r in grow:
                d = r["deltas"][run - 1]
                if d["abs"] is None:
                    continue
                noise = d.get("threshold", noise)
                if r["better"] is not None:
                    directed += 1
                if d["abs"] == 0:
                    continue
                change = {"figure": r["figure"], "unit": r["unit"], "abs": d["abs"], "rel": d["rel"],
                          "verdict": d["verdict"], "noisy": d["noisy"]}
                moved.append(change)
                if d["verdict"] in ("better", "worse") and not d["noisy"]:
                    judged.append(change)
            if not directed:
                verdict = "unknown" if not moved else "same"
                if g.name == "bound":
                    verdict = "same" if all(r["values"][run] == r["values"][0] for r in grow) else "changed"
            elif judged:
                kinds = {c["verdict"] for c in judged}
                verdict = kinds.pop() if len(kinds) == 1 else "mixed"
            elif any(c["noisy"] for c in moved):
                verdict = "noise"
            else:
                verdict = "same"
            shown = judged or moved
            shown = sorted(shown, key=lambda c: -abs(c["rel"]) if c["rel"] is not None else 0.0)[:CHANGES_SHOWN]
            out.append(GroupVerdict(g.name, g.clock, run, verdict, shown, noise if g.clock == WALL else None))
        by_group = {v.group: v for v in out if v.run == run}
        opposite = {"better": "worse", "worse": "better"}
        for wall_group, step_group in STEP_GROUP_OF.items():
            v = by_group[wall_group]
            if (v.verdict in opposite and by_group[step_group].verdict == opposite[v.verdict]
                    and (comparable is None or comparable[run - 1])):
                v.contradicted_by = step_group
    return out


def same_decisions(rows: list[dict[str, Any]], run: int) -> bool:
    """Whether every step figure of run ``run`` equals the baseline's (the rows of
    :func:`comparison`): the scheduler made the same decisions, so the seconds can only
    differ because the machine did."""
    steps = [r for r in rows if r["clock"] == STEPS and r["section"] in GROUP_CLOCK
             and r["path"] not in RELATIVE_TO_SETTINGS]
    return bool(steps) and all(r["values"][run] == r["values"][0] for r in steps)


def comparison(summaries: list[Summary]) -> dict[str, Any]:
    """JSON-ready comparison: config, command and settings-file differences, the noise of
    each run, the machine (each run's speed mark and its ratio to the baseline's), figures
    with deltas (``noisy``, and for wall-clock ones the machine's share and what is left
    beyond it), verdicts per group."""
    base = summaries[0]
    thresholds = [noise_threshold(base, s) for s in summaries[1:]]
    ratios = [machine_ratio(base, s) for s in summaries[1:]]
    figures = []
    for f in figures_for(summaries):
        values = [f.get(s) for s in summaries]
        row: dict[str, Any] = {"section": f.section, "name": f.name, "figure": f.label, "path": str(f.path),
                               "unit": f.unit,
                               "better": f.better, "clock": f.clock, "values": values, "deltas": []}
        for v, threshold, ratio in zip(values[1:], thresholds, ratios):
            d, rel, verdict = delta(f, values[0], v)
            machine = machine_share(f, ratio) if d is not None else None
            row["deltas"].append({"abs": d, "rel": rel, "verdict": verdict,
                                  "noisy": is_noisy(f, rel, threshold) if d else None,
                                  "threshold": threshold if f.clock == WALL else None,
                                  "machine": machine, "beyond_machine": beyond_machine(rel, machine)})
        figures.append(row)
    # a prediction against a real run: equal steps do not make their seconds' gap the machine's
    same = [same_decisions(figures, run) and is_prediction(base) == is_prediction(summaries[run])
            for run in range(1, len(summaries))]
    comparable = [steps_comparable(base, s) for s in summaries[1:]]
    for row in figures:  # same decisions: every wall-clock difference is the machine's
        if row["clock"] == WALL:
            for d, is_same in zip(row["deltas"], same):
                if is_same and d["abs"]:
                    d["noisy"] = True
    return {
        "runs": [s.run_dir for s in summaries],
        "baseline": base.run_dir,
        "config_differences": config_differences(summaries),
        "command_differences": command_differences(summaries),
        "expected_differences": expected_differences(summaries),
        "noise": {"itl_spread": [itl_spread(s) for s in summaries], "threshold": thresholds, "same_decisions": same},
        "machine": {"speed_mark_us": [s.speed_mark.mark_us for s in summaries], "ratio": ratios,
                    "decode_ratio": [decode_ratio(base, s) for s in summaries[1:]]},
        "steps_comparable": comparable,
        "predictions": [is_prediction(s) for s in summaries],
        "figures": figures,
        "verdicts": [asdict(v) for v in verdicts(figures, len(summaries), comparable)],
        "summaries": [s.to_dict() for s in summaries],
    }
