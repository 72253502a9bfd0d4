"""The step-time model: how long one engine-core step lasts, from what the step holds.

**Target.** For recorded step ``k``, the period from its start to the next step's start,
``start[k+1] - start[k]`` with ``start = ts - schedule_us`` of the ``step`` event (s):
the whole engine-core loop (``schedule()``, the model in the workers,
``update_from_output``, input processing). Summed over a busy period it telescopes to
that period's wall time, so a virtual clock advanced by predicted periods reproduces
durations and request timestamps with no separate overhead model. A step followed by
an idle gap (nothing unfinished after it) has no measurable period and is left out.

**Features** (:data:`FEATURES`), defined once and computed both from the recorded
events (:func:`recorded_features`) and from a ``SchedulerOutput`` in the replay
(:func:`output_features`):

* ``prefill_tokens``, ``prefill_reqs``: tokens and number of prefill chunks;
* ``decode_reqs``: requests that got one decode token;
* ``attn_prefill``: causal query-key pairs of the chunks, ``Σ n·start + n(n+1)/2`` for a
  chunk ``[start, start + n)`` (what chunking costs attention);
* ``attn_decode``: context tokens read by the decodes, ``Σ (context + 1)``;
* ``tokens``, ``reqs``: scheduled tokens and requests;
* ``new_shape``: 1 when the step's token count was not seen before in this engine core
  (vLLM's eager CPU backend builds kernels per batch shape: 2–6 ms here);
* ``first_step``: 1 on the first step (warm-up: 10–45 ms here).

From events, a request decodes in every step after the one holding its ``last`` chunk
until its ``request_finished`` step (inclusive) or a ``preempt``; its context is its
prefill length plus the decode steps so far. On the runs measured (docs/whatif.md) this
derived count equals the step event's ``decode_reqs`` in every step.

**Terms** (:data:`DEFAULT_TERMS`): intercept + prefill tokens + attention pairs + decode
requests + decode context + new shape + first step, chosen by measurement on real runs
of this machine (docs/whatif.md, "The step-time model"). Without chunk events only
``tokens``, ``new_shape`` and ``first_step`` are known (:data:`COARSE_TERMS`).

**Fit** (:func:`fit`, :func:`fit_rows`): non-negative least squares over the intercept
and the terms (a step never gets faster with more work, and a step of no work never
takes negative time: an earlier free intercept printed ``period = -5.37 ms + …``), then
``rounds`` times the ``trim`` share of rows with the largest residual is dropped and the
fit redone (stalls from other processes, GC, IPC), then a **level** (Σ measured / Σ
predicted over *all* rows) multiplies every prediction: stalls are part of the wall time
that TTFT and duration must reproduce. :attr:`Quality.drift` says how much the machine's
speed moved during the run; :func:`drift_factors` and :class:`DriftModel` replay it.

**Profiles** (:mod:`vllm_probe.sim.profile`, written by ``vllm-probe calibrate``): the
shape (terms, hinges ``name>knot`` where the hardware changes regime, coefficients)
measured over a designed space of steps; :func:`fit_level` fits only its level on a
recording. :attr:`StepTimeModel.region` is the space fitted; every prediction counts the
steps outside it (:attr:`StepTimeModel.outside_share`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any
from collections.abc import Iterable, Sequence

import numpy as np

from ..analysis.workload import Workload

FEATURES = ("prefill_tokens", "prefill_reqs", "decode_reqs", "attn_prefill", "attn_decode",
            "tokens", "reqs", "new_shape", "first_step")
_INDEX = {name: i for i, name in enumerate(FEATURES)}
#: The model's terms (besides the intercept), see the module docstring.
DEFAULT_TERMS = ("prefill_tokens", "attn_prefill", "decode_reqs", "attn_decode", "new_shape", "first_step")
#: Terms when the run has no chunk events (the prefill / decode split is unknown).
COARSE_TERMS = ("tokens", "new_shape", "first_step")
#: Units of each term's coefficient as shown to users: (scale, unit).
_UNITS = {"prefill_tokens": (1e6, "µs/token"), "prefill_reqs": (1e3, "ms/chunk"),
          "decode_reqs": (1e3, "ms/request"), "attn_prefill": (1e9, "ns/pair"),
          "attn_decode": (1e9, "ns/token"), "tokens": (1e6, "µs/token"), "reqs": (1e3, "ms/request"),
          "new_shape": (1e3, "ms"), "first_step": (1e3, "ms")}


class ShapeTracker:
    """The warm-up features of one engine core: ``new_shape`` (a token count not seen
    before) and ``first_step``."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.steps = 0

    def warmup(self, tokens: int) -> tuple[int, int]:
        """``(new_shape, first_step)`` of the next step, which schedules ``tokens``."""
        new = tokens not in self.seen
        if new:
            self.seen.add(tokens)
        first = self.steps == 0
        self.steps += 1
        return int(new), int(first)


def output_features(sched: Any, out: Any, shapes: ShapeTracker) -> list[float]:
    """The :data:`FEATURES` of a step the replay just scheduled (``out``: vLLM's
    ``SchedulerOutput``; positions at schedule time come from its new and cached
    request data)."""
    nst = out.num_scheduled_tokens
    requests = sched.requests
    pre_t = pre_r = dec = attn_p = attn_d = 0
    items = [(r.req_id, r.num_computed_tokens) for r in out.scheduled_new_reqs]
    cached = out.scheduled_cached_reqs
    items += zip(cached.req_ids, cached.num_computed_tokens)
    for rid, start in items:
        n = nst[rid]
        req = requests[rid]
        if n == 1 and start >= req.num_prompt_tokens and start + 1 >= req.num_tokens:
            dec += 1
            attn_d += start + 1
        else:
            pre_t += n
            pre_r += 1
            attn_p += n * start + n * (n + 1) // 2
    tokens = out.total_num_scheduled_tokens
    new, first = shapes.warmup(tokens)
    return [pre_t, pre_r, dec, attn_p, attn_d, tokens, len(nst), new, first]


def recorded_features(w: Workload) -> tuple[np.ndarray, np.ndarray]:
    """Per recorded step: the :data:`FEATURES` (rows) and the measured period (s; NaN
    where an idle gap follows or the next step is missing)."""
    chunks_by_step: dict[int, list] = {}
    for c in w.chunks:
        chunks_by_step.setdefault(c.step, []).append(c)
    preempted_at: dict[int, list[int]] = {}
    for p in w.preempts:
        preempted_at.setdefault(p.step, []).append(p.order)
    finish_step = {r.order: r.finish_step for r in w.requests}
    added_by: dict[int, int] = {}
    finished_by: dict[int, int] = {}
    for r in w.requests:
        added_by[r.add_before_step] = added_by.get(r.add_before_step, 0) + 1
        if r.finish_step is not None:
            finished_by[r.finish_step] = finished_by.get(r.finish_step, 0) + 1
    ctx: dict[int, int] = {}  # decoding request (order) -> computed tokens
    shapes = ShapeTracker()
    rows = np.zeros((len(w.steps), len(FEATURES)))
    for i, st in enumerate(w.steps):
        k = st.step
        for o in preempted_at.get(k, ()):
            ctx.pop(o, None)
        row = rows[i]
        dec = attn_d = 0
        for o, n_ctx in ctx.items():
            dec += 1
            attn_d += n_ctx + 1
            ctx[o] = n_ctx + 1
        pre_t = pre_r = attn_p = 0
        for c in chunks_by_step.get(k, ()):
            n = c.end - c.start
            pre_t += n
            pre_r += 1
            attn_p += n * c.start + n * (n + 1) // 2
            if c.last:
                ctx[c.order] = c.end
        for o in [o for o in ctx if (end := finish_step.get(o)) is not None and end <= k]:
            del ctx[o]
        new, first = shapes.warmup(st.scheduled_tokens)
        row[:] = (pre_t, pre_r, dec, attn_p, attn_d, st.scheduled_tokens, pre_r + dec, new, first)
    periods = np.full(len(w.steps), np.nan)
    unfinished = 0
    for i, st in enumerate(w.steps):
        unfinished += added_by.get(st.step, 0) - finished_by.get(st.step, 0)
        nxt = w.steps[i + 1] if i + 1 < len(w.steps) else None
        if nxt is not None and nxt.step == st.step + 1 and unfinished > 0:
            periods[i] = nxt.start - st.start
    return rows, periods


def decode_period_s(w: Workload) -> float | None:
    """The median period of the run's decode-only steps with its most common decode count
    (s): a gauge of how fast the machine ran, comparable between runs of one workload
    (on the tiny CPU model these steps are nearly all fixed cost). None without such steps."""
    rows, periods = recorded_features(w)
    ok = np.isfinite(periods) & (rows[:, _INDEX["prefill_tokens"]] == 0) & (rows[:, _INDEX["decode_reqs"]] > 0)
    if not ok.any():
        return None
    counts = rows[ok, _INDEX["decode_reqs"]]
    values, n = np.unique(counts, return_counts=True)
    common = values[np.argmax(n)]
    return float(np.median(periods[ok][counts == common]))


@dataclass
class Quality:
    """How well the model fits the run it was fitted on (per step; ms)."""

    r2: float | None  # over every measured step
    r2_trimmed: float | None  # over the steps kept after trimming
    median_abs_ms: float
    p90_abs_ms: float
    steps: int  # steps with a measured period
    kept: int  # of those, kept after trimming
    predicted_s: float  # sum of the predicted periods
    measured_s: float  # sum of the measured periods
    #: how much the machine's speed moved while the run ran: the largest |measured /
    #: predicted − 1| of the summed periods of the run's tenths (steps in order; 0.1: ±10 %)
    drift: float = 0.0


def parse_term(term: str) -> tuple[int, float | None]:
    """``(feature index, knot)`` of a term: a feature name of :data:`FEATURES`, or a hinge
    ``"name>knot"`` whose value is ``max(0, feature - knot)`` (a regime change at
    ``knot``, e.g. ``prefill_tokens>512``: the cost per token changes above 512).

    Raises:
        KeyError: an unknown feature name.
    """
    name, sep, knot = term.partition(">")
    return _INDEX[name], (float(knot) if sep else None)


def term_columns(rows: np.ndarray, terms: Sequence[str]) -> np.ndarray:
    """The design matrix of ``terms`` (one column per term, hinges applied) for
    :data:`FEATURES` rows (shape ``(steps, len(FEATURES))``)."""
    cols = []
    for t in terms:
        i, knot = parse_term(t)
        col = rows[:, i]
        cols.append(col if knot is None else np.maximum(col - knot, 0.0))
    return np.stack(cols, axis=1) if cols else np.zeros((len(rows), 0))


#: The quantities a model's fitted region is given in (:attr:`StepTimeModel.region`):
#: prefill tokens of a step, decode requests of a step, and attention context (tokens
#: read by the step's decodes, ``attn_decode``).
REGION_FEATURES = ("prefill_tokens", "decode_reqs", "attn_decode")
#: A predicted step is outside the fitted region when one of :data:`REGION_FEATURES`
#: exceeds the largest fitted value by more than this share (5 %).
REGION_SLACK = 0.05


@dataclass
class StepTimeModel:
    """``period (s) = (intercept + Σ coef[t] · term[t]) · level · scale``, clamped at 0.

    Attributes:
        terms: feature names of :data:`FEATURES`, or hinges ``name>knot``
            (:func:`parse_term`), besides the intercept.
        intercept: s per step, ≥ 0.
        coef: s per unit of each term, ≥ 0.
        quality: the fit's quality on the recorded run.
        scale: multiplies every prediction (1.0 as fitted; ``--step-time-scale``).
        level: the recording's speed against the shape (1.0 for a recording-only fit; a
            profile's model fitted to a recording: measured / predicted of its steps).
        region: per :data:`REGION_FEATURES` the largest value fitted (``{}``: unknown).
        profile: the profile's path when the shape came from one (else None).
    """

    terms: tuple[str, ...]
    intercept: float
    coef: tuple[float, ...]
    quality: Quality | None = None
    scale: float = 1.0
    level: float = 1.0
    region: dict[str, float] = field(default_factory=dict)
    profile: str | None = None
    _index: tuple[tuple[int, float | None], ...] = field(default=(), repr=False, compare=False)
    _region: tuple[tuple[int, float], ...] = field(default=(), repr=False, compare=False)
    _top: tuple[tuple[int, float], ...] = field(default=(), repr=False, compare=False)
    predicted: int = field(default=0, repr=False, compare=False)
    outside: int = field(default=0, repr=False, compare=False)
    raw_s: float = field(default=0.0, repr=False, compare=False)
    extrapolated_s: float = field(default=0.0, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._index = tuple(parse_term(t) for t in self.terms)
        self._region = tuple((_INDEX[k], v * (1 + REGION_SLACK)) for k, v in self.region.items())
        self._top = tuple((_INDEX[k], v) for k, v in self.region.items())

    def raw(self, features: Sequence[float]) -> float:
        """The shape's seconds for a :data:`FEATURES` row, before ``level`` and ``scale``."""
        s = self.intercept
        for c, (i, knot) in zip(self.coef, self._index):
            x = features[i]
            s += c * (x if knot is None else (x - knot if x > knot else 0.0))
        return max(s, 0.0)

    def predict(self, features: Sequence[float]) -> float:
        """Seconds from this step's start to the next's, for a :data:`FEATURES` row;
        counts the steps predicted, those outside :attr:`region`, and the seconds that come
        from feature values beyond it (:attr:`extrapolated_share`)."""
        self.predicted += 1
        raw = self.raw(features)
        self.raw_s += raw
        for i, hi in self._region:
            if features[i] > hi:
                self.outside += 1
                inside = list(features)
                for j, top in self._top:
                    inside[j] = min(inside[j], top)
                self.extrapolated_s += raw - self.raw(inside)
                break
        return raw * self.level * self.scale

    def reset_counts(self) -> None:
        self.predicted = self.outside = 0
        self.raw_s = self.extrapolated_s = 0.0

    @property
    def outside_share(self) -> float | None:
        """Share of the steps predicted since :meth:`reset_counts` outside the fitted
        region (None: no step predicted, or no region known)."""
        if not self.predicted or not self.region:
            return None
        return self.outside / self.predicted

    @property
    def extrapolated_share(self) -> float | None:
        """Share (0..1) of the seconds predicted since :meth:`reset_counts` that comes from
        feature values beyond the fitted region: per step outside it, its time less the
        time of the same step with each of :data:`REGION_FEATURES` capped at the largest
        fitted value. A step 3× beyond in a term that costs little (decode attention on a
        tiny model) adds little; one whose prefill tokens are 2× the fitted adds half its
        time (None: nothing predicted, or no region known)."""
        if not self.predicted or not self.region or self.raw_s <= 0:
            return None
        return self.extrapolated_s / self.raw_s

    def describe(self) -> list[tuple[str, float, str]]:
        """``(term, value, unit)`` per coefficient, intercept first, in readable units."""
        out = [("intercept", self.intercept * 1e3, "ms")]
        for t, c in zip(self.terms, self.coef):
            scale, unit = _UNITS[t.partition(">")[0]]
            out.append((t, c * scale, unit))
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: terms with their coefficients (s per unit), the level, the region,
        the profile used and the fit quality."""
        return {"terms": list(self.terms), "intercept_s": self.intercept,
                "coef_s": dict(zip(self.terms, self.coef)), "scale": self.scale, "level": self.level,
                "region": dict(self.region), "profile": self.profile,
                "quality": asdict(self.quality) if self.quality else None}


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int = 500) -> np.ndarray:
    """``argmin ||a x - b||`` subject to ``x >= 0`` (Lawson & Hanson, *Solving Least
    Squares Problems*, 1974, ch. 23; the algorithm behind ``scipy.optimize.nnls``).
    Columns are scaled to unit norm for conditioning."""
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    a = a / scale
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, bool)
    for _ in range(max_iter):
        w = a.T @ (b - a @ x)
        w[passive] = -np.inf
        j = int(np.argmax(w)) if n else 0
        if not n or w[j] <= 1e-12:
            break
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            gap = x[neg] - z[neg]
            alpha = float(np.min(np.where(gap > 0, x[neg] / np.where(gap > 0, gap, 1.0), 0.0)))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
            x[~passive] = 0.0
    return x / scale


def _solve(x: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> tuple[float, np.ndarray]:
    """Least squares with a non-negative intercept and non-negative slopes (the intercept
    is one more column of :func:`nnls`: a step of no work never takes negative time);
    ``w``: row weights (``1 / y``: relative error)."""
    a = np.column_stack([np.ones(len(y)), x])
    b = nnls(a, y) if w is None else nnls(a * w[:, None], y * w)
    return float(b[0]), b[1:]


def region_of(rows: np.ndarray) -> dict[str, float]:
    """The largest value of each :data:`REGION_FEATURES` among ``rows``."""
    return {k: float(rows[:, _INDEX[k]].max()) if len(rows) else 0.0 for k in REGION_FEATURES}


def fit_rows(rows: np.ndarray, periods: np.ndarray, terms: Sequence[str], trim: float = 0.05,
             rounds: int = 3, source: str = "", relative: bool = False, windows: int = 0) -> StepTimeModel:
    """Fit ``terms`` on :data:`FEATURES` ``rows`` and their measured ``periods`` (s; NaN
    rows are left out); see :func:`fit`. ``relative``: minimise relative rather than
    absolute error (calibration, whose steps span 1 ms to seconds). ``windows``: fit the
    shape jointly with a speed factor per window of that many equal shares of the steps
    (alternating :data:`DRIFT_ROUNDS` times: shape on the periods divided by the speed,
    speed from the periods over the shape), so a machine that slowed down mid-run does
    not bend the coefficients.

    Raises:
        ValueError: fewer than ``len(terms) + 2`` measured rows.
    """
    terms = tuple(terms)
    ok = np.isfinite(periods)
    y = periods[ok]
    x = term_columns(rows[ok], terms)
    if len(y) < len(terms) + 2:
        raise ValueError(f"{source}: only {len(y)} steps with a measured period; "
                         "too few to fit the step-time model")
    keep = np.ones(len(y), bool)
    wt = 1.0 / np.maximum(y, 1e-9) if relative else np.ones(len(y))
    speed = np.ones(len(y))
    parts = np.array_split(np.arange(len(y)), max(1, min(windows, len(y)))) if windows else []
    for _ in range(DRIFT_ROUNDS if windows else 1):
        yy = y / speed
        b0, b = _solve(x, yy, wt if relative else None)
        for _ in range(rounds):
            res = np.abs(yy - b0 - x @ b) * wt
            keep = res <= np.quantile(res, 1 - trim)
            b0, b = _solve(x[keep], yy[keep], wt[keep] if relative else None)
        raw = np.maximum(b0 + x @ b, 0.0)
        total = y.sum() / raw.sum() if raw.sum() > 0 else 1.0
        for idx in parts:
            r = raw[idx].sum()
            speed[idx] = (y[idx].sum() / r) / total if r > 0 else 1.0
    raw = np.maximum(b0 + x @ b, 0.0)
    # stalls are part of the wall time: the level spreads them over every step
    level = float(y.sum() / raw.sum()) if raw.sum() > 0 else 1.0
    pred = raw * level
    err = np.abs(y - pred)

    def r2(mask: np.ndarray) -> float | None:
        ss = float(np.sum((y[mask] - y[mask].mean()) ** 2))
        return 1.0 - float(np.sum((y[mask] - pred[mask]) ** 2)) / ss if ss > 0 else None

    quality = Quality(r2=r2(np.ones(len(y), bool)), r2_trimmed=r2(keep),
                      median_abs_ms=float(np.median(err) * 1e3), p90_abs_ms=float(np.quantile(err, 0.9) * 1e3),
                      steps=len(y), kept=int(keep.sum()), predicted_s=float(pred.sum()),
                      measured_s=float(y.sum()), drift=_drift(y, pred))
    return StepTimeModel(terms, b0, tuple(float(c) for c in b), quality, level=level, region=region_of(rows[ok]))


#: Alternations of shape and speed in :func:`fit_rows` with ``windows``.
DRIFT_ROUNDS = 6


def _drift(y: np.ndarray, pred: np.ndarray) -> float:
    """The largest |measured / predicted − 1| of the summed periods of the run's tenths."""
    tenths = [float(a.sum() / b.sum()) - 1.0 for a, b in zip(np.array_split(y, 10), np.array_split(pred, 10))
              if len(a) and b.sum() > 0]
    return max((abs(t) for t in tenths), default=0.0)


#: Windows of the recording-only fit's speed over time (tenths of the measured steps).
DRIFT_WINDOWS = 10


def fit(w: Workload, terms: Iterable[str] | None = None, trim: float = 0.05, rounds: int = 3) -> StepTimeModel:
    """Fit the model on a recorded run (see the module docstring): the recording-only
    model, whose region is what the run holds.

    Raises:
        ValueError: fewer than ``len(terms) + 2`` steps with a measured period.
    """
    terms = tuple(terms or (DEFAULT_TERMS if w.chunk_events else COARSE_TERMS))
    rows, periods = recorded_features(w)
    model = fit_rows(rows, periods, terms, trim, rounds, w.source, windows=DRIFT_WINDOWS)
    if not w.chunk_events:  # prefill and decode are not told apart in the recording: no region
        model.region = {}
        model.__post_init__()
    return model


def fit_level(model: StepTimeModel, w: Workload) -> StepTimeModel:
    """A copy of ``model`` (a profile's shape) whose :attr:`~StepTimeModel.level` is the
    recording's speed: Σ measured / Σ predicted periods of ``w``'s measured steps (a ratio
    of sums, so the run's busy time is reproduced), with the fit quality on ``w``.

    Raises:
        ValueError: no step of ``w`` has a measured period.
    """
    rows, periods = recorded_features(w)
    ok = np.isfinite(periods)
    if not ok.any():
        raise ValueError(f"{w.source}: no step with a measured period; the profile's level cannot be fitted")
    y = periods[ok]
    raw = np.array([model.raw(r) for r in rows[ok]])
    level = float(y.sum() / raw.sum()) if raw.sum() > 0 else 1.0
    pred = raw * level
    err = np.abs(y - pred)
    ss = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum((y - pred) ** 2)) / ss if ss > 0 else None
    quality = Quality(r2=r2, r2_trimmed=r2, median_abs_ms=float(np.median(err) * 1e3),
                      p90_abs_ms=float(np.quantile(err, 0.9) * 1e3), steps=len(y), kept=len(y),
                      predicted_s=float(pred.sum()), measured_s=float(y.sum()), drift=_drift(y, pred))
    return StepTimeModel(model.terms, model.intercept, model.coef, quality, level=level,
                         region=dict(model.region), profile=model.profile)


def drift_factors(model: StepTimeModel, w: Workload, windows: int = 10) -> list[tuple[int, float]]:
    """The recording's speed over time: ``[(first step, factor), ...]`` per window of
    ``windows`` equal shares of the measured steps (in step order), ``factor`` = Σ
    measured / Σ predicted there (1.0: the model's level; 1.3: that stretch ran 30 %
    slower). The windows' factors weighted by their predicted time average 1."""
    rows, periods = recorded_features(w)
    ok = np.isfinite(periods)
    steps = np.array([s.step for s in w.steps])[ok]
    y = periods[ok]
    pred = np.array([model.raw(r) for r in rows[ok]]) * model.level
    out: list[tuple[int, float]] = []
    for idx in np.array_split(np.arange(len(y)), max(1, min(windows, len(y)))):
        if not len(idx):
            continue
        p = float(pred[idx].sum())
        out.append((int(steps[idx[0]]) if out else 0, float(y[idx].sum()) / p if p > 0 else 1.0))
    return out


class DriftModel:
    """A model whose speed follows the recording's over step index
    (:func:`drift_factors`): step ``k`` of the replay is priced by ``base`` times the
    factor of the window holding recorded step ``k`` (the baseline replays the recorded
    schedule within 0.3 % of its steps, so step indexes line up)."""

    def __init__(self, base: StepTimeModel, factors: list[tuple[int, float]]) -> None:
        self.base = base
        self.starts = [s for s, _ in factors]
        self.factors = [f for _, f in factors]
        self.step = 0

    def predict(self, features: Sequence[float]) -> float:
        import bisect

        k = bisect.bisect_right(self.starts, self.step) - 1
        self.step += 1
        return self.base.predict(features) * (self.factors[k] if k >= 0 else 1.0)

    def reset_counts(self) -> None:
        self.step = 0
        self.base.reset_counts()

    @property
    def outside_share(self) -> float | None:
        return self.base.outside_share

    @property
    def extrapolated_share(self) -> float | None:
        return self.base.extrapolated_share

    @property
    def quality(self) -> Quality | None:
        return self.base.quality

    def to_dict(self) -> dict[str, Any]:
        """The base model's :meth:`StepTimeModel.to_dict` with ``drift``: ``[[first step,
        factor], ...]``."""
        return {**self.base.to_dict(), "drift": [[s, f] for s, f in zip(self.starts, self.factors)]}
