"""What ``vllm-probe report`` shows, computed once: a run read in one pass, and the
``whatif`` / ``tune`` results it is set against.

:func:`read_run` reads a run once through the shared state with the doctor's
:class:`~vllm_probe.analysis.episodes.Episodes` and a page's
:class:`~vllm_probe.analysis.series.PageSeries` attached, and returns a
:class:`RunPage`: the :class:`~vllm_probe.analysis.summary.Summary` (the same as
``summary --json``, notable moments included), the doctor's
:class:`~vllm_probe.analysis.doctor.Report` (the same findings as ``doctor``: the
catalogue applied by :func:`~vllm_probe.analysis.doctor.diagnose` to the same state),
each finding with the stretch of steps it cites, the bounded step series, the longest
prompts' chunks and the latency distributions by prompt-length class. Reading the run
once is what keeps the report within twice the summary's time: ``doctor`` alone reads it
again.

:func:`read_whatif` and :func:`read_tune` read what those commands wrote (``whatif
--out DIR``'s replayed run directories, or the object of ``whatif --json`` saved to a
file; ``tune --out DIR``'s ``tune.json``, or ``tune --json`` saved) into a
:class:`Sweep`: one point per replayed setting with its figures (the names of
:mod:`vllm_probe.analysis.objectives`), the interval of each figure when the result has
one (``intervals: {figure: {lo, hi, from}}``), and the real runs among the report's
that were recorded at a point's settings. Keys a result lacks are left out, never an
error.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from ..runs.reader import ReadStats
from ..runs.rundir import META_FILE, read_meta
from ..schema.engine_settings import ENGINE_SETTINGS
from .doctor import Finding, Report, all_clear, diagnose, expected_of_meta
from .doctor.context import Context
from .doctor.rules import RULES
from .episodes import Episodes
from .moments import notable_moments
from .figures import Distribution, quantile
from .objectives import from_summary
from .series import LATENCY_FIELDS, MAX_BUCKETS, PageSeries
from .state import Listeners, RunState
from .summary import analyze, summarize
from .summary_types import Summary, class_names

#: Points of a latency distribution's curve (an empirical CDF): a class with more
#: finished requests is drawn through this many quantiles, its least and largest value
#: included.
CURVE_POINTS = 200
#: The latency figures drawn by class: per finished request, seconds.
LATENCY_FIGURES = ("ttft_s", "itl_s", "queue_s", "e2e_s")
#: The figures a ``whatif`` result is drawn by (:mod:`vllm_probe.analysis.objectives` names).
WHATIF_FIGURES = ("ttft_p90", "ttft_p50", "queue_p90", "itl_p90", "e2e_p90", "preemptions",
                  "output_tokens_per_s", "duration_s")
#: A finding's stretch when its evidence cites one step only: steps shown either side.
STRETCH_MARGIN = 8


class ReportInputError(ValueError):
    """A ``--whatif`` / ``--tune`` path that holds no result; one line."""


# -- one run -----------------------------------------------------------------------------


@dataclass
class FindingStretch:
    """A doctor's finding and the steps it cites.

    Attributes:
        finding: the finding (``id``, ``severity``, ``message``, ``evidence``, ``remedy``).
        step: the step its rule names to look at first (``RULES[id].step``); None: none.
        first_step, last_step: the stretch of steps its evidence cites (inclusive; the
            range holding ``step`` where several are cited); None: none cited.
        engine: the engine core it is about (None: the run's only one, or all).
    """

    finding: Finding
    step: int | None
    first_step: int | None
    last_step: int | None
    engine: int | None


@dataclass
class LatencyCurve:
    """One latency figure of one request class: an empirical CDF and its quantiles.

    Attributes:
        figure: one of :data:`LATENCY_FIGURES` (seconds).
        cls: the class name (``short``, ``medium``, ``long``, or ``all``).
        low, high: its prompt lengths (tokens, inclusive; None: unbounded).
        n: finished requests with the figure known.
        values, shares: the curve: ``shares[i]`` of the requests took at most
            ``values[i]`` seconds (0..1), at most :data:`CURVE_POINTS` points.
        dist: count, mean, median, p90 and max (the summary's definitions).
    """

    figure: str
    cls: str
    low: int | None
    high: int | None
    n: int
    values: list[float]
    shares: list[float]
    dist: Distribution


@dataclass
class RunPage:
    """Everything the report shows of one run (:func:`read_run`).

    Attributes:
        run_dir: the run directory; ``label``: its name.
        meta: its ``meta.json`` (``{}`` when absent).
        summary: :class:`~vllm_probe.analysis.summary.Summary`, as ``summary --json``.
        doctor: the doctor's :class:`~vllm_probe.analysis.doctor.Report`.
        findings: each finding with its stretch, worst first.
        series: the steps in bounded buckets and every preemption
            (:class:`~vllm_probe.analysis.series.PageSeries`).
        t0: the start of the first step (epoch s): the time axes count seconds from it.
        latency: by class and figure (:class:`LatencyCurve`).
        stats: what was read and skipped.
    """

    run_dir: str
    label: str
    meta: dict[str, Any]
    summary: Summary
    doctor: Report
    findings: list[FindingStretch]
    series: PageSeries
    t0: float
    latency: list[LatencyCurve]
    stats: ReadStats

    @property
    def state(self) -> RunState:
        return self.doctor.state


def read_run(run_dir: str | Path, boundaries: list[int] | None = None,
             max_buckets: int = MAX_BUCKETS) -> RunPage:
    """Read the run in ``run_dir`` once: its summary, the doctor's findings, the page's
    series (``max_buckets`` per engine core) and latency curves. ``boundaries``:
    prompt-length class boundaries in tokens (None: the summary's defaults).

    Raises:
        NoEventsError: no event file, or no readable event in them.
    """
    run_dir = Path(run_dir)
    episodes = Episodes()
    series = PageSeries(max_buckets)
    stats = ReadStats()
    state, summary = analyze(run_dir, stats, listener=Listeners(episodes, series), boundaries=boundaries)
    assert summary is not None
    summary.moments = [asdict(m) for m in notable_moments(state, episodes)]
    series.finish()
    series.fill_first_tokens(state.engines)
    meta = read_meta(run_dir)
    expected = expected_of_meta(meta)
    findings = diagnose(state, episodes, expected)
    doctor = Report(str(run_dir), findings, state, episodes, stats, meta,
                    expected.source if expected is not None else None,
                    all_clear(Context(state, episodes), findings))
    starts = [e.stepping_since for e in state.engines.values() if e.stepping_since is not None]
    firsts = [s.first_ts[0] for s in series.engines.values() if len(s)]
    t0 = min(starts or firsts or [0.0])
    return RunPage(str(run_dir), run_dir.name, meta, summary, doctor, [finding_stretch(f) for f in findings],
                   series, t0, latency_curves(series.latencies, summary), stats)


def finding_stretch(f: Finding) -> FindingStretch:
    """The stretch of steps a finding cites: the step ranges of its evidence (fields that
    name steps: ``[first, last]`` pairs, lists of steps, records with a ``step``), the one
    holding the step its rule names first (``RULES[id].step``), else the first cited;
    a lone step is widened by :data:`STRETCH_MARGIN` either side."""
    rule = RULES.get(f.id)
    step = rule.step(f) if rule is not None else None
    ranges = list(_step_ranges(msgspec.to_builtins(f.evidence), ""))
    holding = [r for r in ranges if step is not None and r[0] <= step <= r[1]]
    if holding:
        lo, hi = min(holding, key=lambda r: r[1] - r[0])
    elif ranges:
        lo, hi = ranges[0]
    elif step is not None:
        lo, hi = step, step
    else:
        return FindingStretch(f, None, None, None, f.engine)
    if lo == hi:
        lo, hi = max(lo - STRETCH_MARGIN, 0), hi + STRETCH_MARGIN
    return FindingStretch(f, step, lo, hi, f.engine)


#: Evidence fields that hold step numbers though their names do not say "step".
_STEP_FIELDS = ("longest", "stalls")
#: Integer evidence fields that are a step (others named with "step" are counts).
_STEP_INTS = ("step", "first_step", "last_step")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _step_ranges(obj: Any, key: str) -> Any:
    """``(first, last)`` step ranges in a finding's evidence (as builtins), in field order."""
    named = "step" in key.lower() or key in _STEP_FIELDS
    if isinstance(obj, dict):
        points = [obj[k] for k in _STEP_INTS if _is_int(obj.get(k))]
        if "first_step" in obj and "last_step" in obj and _is_int(obj["first_step"]) and _is_int(obj["last_step"]):
            yield (obj["first_step"], obj["last_step"])
        elif _is_int(obj.get("step")):
            yield (obj["step"], obj["step"])
        elif points and not named:
            yield (min(points), max(points))
        for k, v in obj.items():
            if isinstance(v, (dict, list)):
                yield from _step_ranges(v, k)
        return
    if not isinstance(obj, list) or not obj:
        return
    if named and all(_is_int(v) for v in obj):
        if len(obj) == 2 and obj[0] <= obj[1]:
            yield (obj[0], obj[1])
        else:
            yield (min(obj), max(obj))
        return
    if named and all(isinstance(v, dict) and _is_int(v.get("step")) for v in obj):
        steps = [v["step"] for v in obj]
        yield (min(steps), max(steps))
        return
    for v in obj:
        yield from _step_ranges(v, key)


def latency_curves(rows: list[tuple[Any, ...]], summary: Summary) -> list[LatencyCurve]:
    """Per latency figure (:data:`LATENCY_FIGURES`), the curve of all finished requests
    (class ``all``) and of each prompt-length class of the summary
    (``summary.latency_classes``: a request of exactly a boundary's length is in the
    class below, as the summary counts it)."""
    col = {name: i for i, name in enumerate(LATENCY_FIELDS)}
    classes = summary.latency_classes
    bounds = list(classes.boundaries)
    names = [c.name for c in classes.classes] or class_names(len(bounds) + 1)
    by_class: list[list[tuple[Any, ...]]] = [[] for _ in names]
    for r in rows:
        if r[col["prompt_len"]] is not None:
            by_class[bisect.bisect_left(bounds, r[col["prompt_len"]])].append(r)
    lows: list[int | None] = [1, *(b + 1 for b in bounds)]
    highs: list[int | None] = [*bounds, None]
    out = []
    for figure in LATENCY_FIGURES:
        i = col[figure]
        out.append(_curve(figure, "all", None, None, [r[i] for r in rows]))
        for name, lo, hi, cls_rows in zip(names, lows, highs, by_class):
            out.append(_curve(figure, name, lo, hi, [r[i] for r in cls_rows]))
    return out


def _curve(figure: str, cls: str, low: int | None, high: int | None, values: list[Any]) -> LatencyCurve:
    vals = sorted(v for v in values if v is not None)
    n = len(vals)
    if n <= CURVE_POINTS:
        xs, ys = list(vals), [(k + 1) / n for k in range(n)]
    else:
        ys = [k / (CURVE_POINTS - 1) for k in range(CURVE_POINTS)]
        xs = [quantile(vals, q) or 0.0 for q in ys]
    return LatencyCurve(figure, cls, low, high, n, xs, ys, Distribution.of(vals))


# -- whatif and tune ---------------------------------------------------------------------


@dataclass
class Interval:
    """A predicted figure's interval: ``lo``..``hi`` (the figure's unit) and what it is
    made of (``from``; empty when the result does not say)."""

    lo: float
    hi: float
    source: str = ""


@dataclass
class SweepPoint:
    """One setting of a sweep and its figures.

    Attributes:
        label: how the report names it (``baseline``, ``max_num_seqs=8``, a run's name).
        kind: ``baseline`` (replayed at the recorded settings), ``predicted`` (a replay at
            a changed setting), ``recorded`` (the recorded run) or ``real`` (a run of the
            report recorded at the point's settings).
        settings: the value of each of the sweep's keys at this point.
        figures: figure name (:mod:`vllm_probe.analysis.objectives`) -> value, its unit.
        intervals: figure name -> :class:`Interval`, where the result gives one.
        meets: whether it meets every SLO (``tune`` only; None: not judged).
        recommended: ``tune``'s recommendation.
        run_dir: the replayed or recorded run directory, where known.
    """

    label: str
    kind: str
    settings: dict[str, Any]
    figures: dict[str, float | None]
    intervals: dict[str, Interval] = field(default_factory=dict)
    meets: bool | None = None
    recommended: bool = False
    run_dir: str | None = None


@dataclass
class Sweep:
    """A ``whatif`` or ``tune`` result, drawn figure by figure against its settings.

    Attributes:
        tool: ``whatif`` or ``tune``.
        path: what was read.
        source: the recorded run it replayed.
        keys: the settings it changed (``whatif --set`` names), in order.
        figures: the figures to draw, in order.
        points: every point: recorded, baseline, predicted, real.
        slos: ``tune``'s SLOs: ``{"figure", "op", "value"}``.
        notes: what the result says about itself, one line each.
    """

    tool: str
    path: str
    source: str | None
    keys: list[str]
    figures: list[str]
    points: list[SweepPoint]
    slos: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _intervals(raw: Any) -> dict[str, Interval]:
    """``{figure: {lo, hi, from}}`` as :class:`Interval` s; entries without two finite
    numbers are left out."""
    out: dict[str, Interval] = {}
    if not isinstance(raw, dict):
        return out
    for name, v in raw.items():
        if not isinstance(v, dict):
            continue
        lo, hi = _num(v.get("lo")), _num(v.get("hi"))
        if lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi):
            src = v.get("from")
            out[str(name)] = Interval(min(lo, hi), max(lo, hi),
                                      src if isinstance(src, str) else json.dumps(src) if src else "")
    return out


def _figures(summary: Any, names: tuple[str, ...] | list[str]) -> dict[str, float | None]:
    return {name: from_summary(summary, name) for name in names}


def _load_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ReportInputError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    if not isinstance(data, dict):
        raise ReportInputError(f"{path} is not a JSON object")
    return data


def _settings_value(settings: Any, key: str) -> Any:
    return settings.get(key) if isinstance(settings, dict) else None


#: Folders of ``whatif --out`` that replay the baseline at another speed (the recording's own
#: speed over time, its slowest and fastest tenth: :mod:`vllm_probe.sim.whatif`), not a setting.
SPEED_VARIANTS = ("baseline-recorded-speed", "baseline-slowest-speed", "baseline-fastest-speed")


def read_whatif(path: str | Path, runs: list[RunPage] | None = None) -> Sweep:
    """A ``whatif`` result: ``whatif --out DIR``'s directory (the ``whatif.json`` whatif
    writes in it, its ``--json`` object; in a folder without one, ``baseline/`` and one
    replayed run directory per setting, each summarized here, without intervals) or a file
    holding the ``--json`` object. ``runs``: the report's runs; the one ``whatif`` replayed is the recorded
    point, the others recorded at a point's changed settings are its real points.

    Raises:
        ReportInputError: nothing readable as a whatif result at ``path``.
    """
    path = Path(path)
    if path.is_file():
        return _whatif_from_json(path, _load_json(path), runs or [])
    if path.is_dir() and (path / "whatif.json").is_file():
        return _whatif_from_json(path, _load_json(path / "whatif.json"), runs or [])
    if not path.is_dir():
        raise ReportInputError(f"--whatif {path}: no such file or directory")
    entries: list[tuple[str, dict[str, Any], Path]] = []
    for sub in sorted(p for p in path.iterdir() if p.is_dir() and (p / META_FILE).is_file()):
        meta = read_meta(sub)
        if not meta.get("simulated") or sub.name.startswith(SPEED_VARIANTS):
            continue  # the baseline at other speeds measures the intervals and the drift, not a setting
        entries.append((sub.name, meta, sub))
    if not entries:
        raise ReportInputError(f"--whatif {path}: no replayed run directory (whatif --out DIR writes them)")
    configs: list[dict[str, Any]] = []
    source = None
    for name, meta, sub in entries:
        source = source or meta.get("source")
        whatif: dict[str, Any] = meta["whatif"] if isinstance(meta.get("whatif"), dict) else {}
        configs.append({"label": name, "settings": meta.get("settings") or {},
                        "overrides": meta.get("overrides") or {},
                        "summary": summarize(sub).to_dict(), "run_dir": str(sub),
                        "intervals": meta.get("intervals") or whatif.get("intervals")})
    base = next((c for c in configs if not c["overrides"]), None)
    data: dict[str, Any] = {"source": source, "baseline": base, "notes": [],
                            "configs": [c for c in configs if c is not base]}
    return _whatif_from_json(path, data, runs or [])


def _whatif_from_json(path: Path, data: dict[str, Any], runs: list[RunPage]) -> Sweep:
    configs = [c for c in data.get("configs") or [] if isinstance(c, dict)]
    keys: list[str] = []
    for c in configs:
        for k in (c.get("overrides") or {}):
            if k not in keys:
                keys.append(k)
    base = data.get("baseline") if isinstance(data.get("baseline"), dict) else None
    points: list[SweepPoint] = []
    base_settings = (base or {}).get("settings") or {}
    figures = list(WHATIF_FIGURES)
    source = data.get("source") if isinstance(data.get("source"), str) else None
    recorded_run = _source_run(source, runs)
    if recorded_run is not None:
        s = recorded_run.summary
        points.append(SweepPoint(recorded_run.label, "recorded", {k: _config_value(s.config, k) for k in keys},
                                 _figures(s, figures), run_dir=recorded_run.run_dir))
    elif isinstance(data.get("recorded"), dict):
        points.append(SweepPoint("recorded", "recorded", {k: _settings_value(base_settings, k) for k in keys},
                                 _figures(data["recorded"], figures)))
    if base is not None:
        points.append(SweepPoint(str(base.get("label") or "baseline"), "baseline",
                                 {k: _settings_value(base_settings, k) for k in keys},
                                 _figures(base.get("summary") or {}, figures), _intervals(base.get("intervals")),
                                 run_dir=base.get("run_dir")))
    for c in configs:
        overrides = c.get("overrides") or {}
        settings = {k: overrides.get(k, _settings_value(c.get("settings"), k)) for k in keys}
        label = c.get("label") or ",".join(f"{k}={v}" for k, v in overrides.items()) or "baseline"
        points.append(SweepPoint(str(label), "predicted", settings, _figures(c.get("summary") or {}, figures),
                                 _intervals(c.get("intervals")), run_dir=c.get("run_dir")))
    points += _real_points(keys, figures, runs, recorded_run, base_settings)
    notes = [n for n in data.get("notes") or [] if isinstance(n, str)]
    return Sweep("whatif", str(path), source, keys, figures, points, notes=notes)


def read_tune(path: str | Path, runs: list[RunPage] | None = None) -> Sweep:
    """A ``tune`` result: ``tune --out DIR``'s ``tune.json``, or a file holding ``tune
    --json``'s object. ``runs`` as in :func:`read_whatif`.

    Raises:
        ReportInputError: nothing readable as a tune result at ``path``.
    """
    path = Path(path)
    file = path / "tune.json" if path.is_dir() else path
    if not file.is_file():
        raise ReportInputError(f"--tune {path}: no tune.json (tune --out DIR writes it)")
    data = _load_json(file)
    runs = runs or []
    keys = [k["setting"] for k in data.get("knobs") or [] if isinstance(k, dict) and isinstance(k.get("setting"), str)]
    slos = [s for s in data.get("slo") or [] if isinstance(s, dict) and isinstance(s.get("figure"), str)]
    objective: dict[str, Any] = data["objective"] if isinstance(data.get("objective"), dict) else {}
    figures: list[str] = []
    for name in [s["figure"] for s in slos] + [objective.get("figure"), "preemptions"]:
        if isinstance(name, str) and name not in figures:
            figures.append(name)
    base: dict[str, Any] = data["baseline"] if isinstance(data.get("baseline"), dict) else {}
    base_settings = base.get("settings") or {}
    source = data.get("source") if isinstance(data.get("source"), str) else None
    recorded_run = _source_run(source, runs)
    points: list[SweepPoint] = []
    if isinstance(base.get("recorded"), dict):
        points.append(SweepPoint(recorded_run.label if recorded_run else "recorded", "recorded",
                                 {k: _settings_value(base_settings, k) for k in keys},
                                 {f: _num(base["recorded"].get(f)) for f in figures},
                                 run_dir=recorded_run.run_dir if recorded_run else None))
    if isinstance(base.get("replayed"), dict):
        points.append(SweepPoint("baseline", "baseline", {k: _settings_value(base_settings, k) for k in keys},
                                 {f: _num(base["replayed"].get(f)) for f in figures},
                                 _intervals(base.get("intervals"))))
    rec: dict[str, Any] | None = data["recommended"] if isinstance(data.get("recommended"), dict) else None
    rec_settings = rec.get("settings") if rec else None
    for p in data.get("evaluated") or []:
        if not isinstance(p, dict):
            continue
        overrides = p.get("settings") or {}
        settings = {k: overrides.get(k, _settings_value(base_settings, k)) for k in keys}
        summary: dict[str, Any] = p["summary"] if isinstance(p.get("summary"), dict) else {}
        label = ",".join(f"{k}={v}" for k, v in overrides.items()) or "baseline"
        meets = p.get("meets") if isinstance(p.get("meets"), bool) else None
        points.append(SweepPoint(label, "predicted", settings, {f: _num(summary.get(f)) for f in figures},
                                 _intervals(p.get("intervals")), meets, recommended=settings == rec_settings,
                                 run_dir=p.get("run_dir")))
    points += _real_points(keys, figures, runs, recorded_run, base_settings)
    notes = [n for n in data.get("notes") or [] if isinstance(n, str)]
    return Sweep("tune", str(file), source, keys, figures, points, slos, notes)


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


#: ``whatif`` setting name -> the ``engine_config`` field that records it.
_CONFIG_KEY = {s.name: s.config_key for s in ENGINE_SETTINGS if s.config_key}


def _config_value(config: dict[str, Any], key: str) -> Any:
    return config.get(_CONFIG_KEY.get(key, key))


def _source_run(source: str | None, runs: list[RunPage]) -> RunPage | None:
    """The report's run a result replayed (same directory, or same name)."""
    if not source:
        return None
    for run in runs:
        try:
            if Path(run.run_dir).resolve() == Path(source).resolve():
                return run
        except OSError:
            continue
    return next((r for r in runs if r.label == Path(source).name), None)


def _real_points(keys: list[str], figures: list[str], runs: list[RunPage], recorded: RunPage | None,
                 base_settings: dict[str, Any]) -> list[SweepPoint]:
    """The report's other runs recorded at settings of the sweep: every setting the
    sweep did not change as the recorded run had it (where both recorded it), and the
    changed ones read from their ``engine_config``."""
    out = []
    for run in runs:
        if run is recorded or not keys:
            continue
        config = run.summary.config
        settings = {k: _config_value(config, k) for k in keys}
        if any(v is None for v in settings.values()):
            continue
        same = all(_config_value(config, k) == v for k, v in base_settings.items()
                   if k not in keys and v is not None and _config_value(config, k) is not None)
        if same:
            out.append(SweepPoint(run.label, "real", settings, _figures(run.summary, figures), run_dir=run.run_dir))
    return out
