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

**Fit** (:func:`fit`): non-negative least squares with a free intercept (a step never
gets faster with more work; with a collinear term, e.g. a run whose decode steps all
hold 4 requests, ordinary least squares trades the slope against the intercept), then
``rounds`` times the ``trim`` share of rows with the largest residual is dropped and the
fit redone (stalls from other processes, GC, IPC), then the intercept is moved so the
residuals over *all* rows average zero: stalls are part of the wall time that TTFT and
duration must reproduce. :attr:`Quality.drift` says how much the machine's speed moved
during the run (the model assumes it did not).
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


@dataclass
class StepTimeModel:
    """``period (s) = intercept + Σ coef[t] · feature[t]``, clamped at 0.

    Attributes:
        terms: feature names of :data:`FEATURES` (besides the intercept).
        intercept: s per step.
        coef: s per unit of each term.
        quality: the fit's quality on the recorded run.
        scale: multiplies every prediction (1.0 as fitted).
    """

    terms: tuple[str, ...]
    intercept: float
    coef: tuple[float, ...]
    quality: Quality | None = None
    scale: float = 1.0
    _index: tuple[int, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        self._index = tuple(_INDEX[t] for t in self.terms)

    def predict(self, features: Sequence[float]) -> float:
        """Seconds from this step's start to the next's, for a :data:`FEATURES` row."""
        s = self.intercept
        for c, i in zip(self.coef, self._index):
            s += c * features[i]
        return max(s, 0.0) * self.scale

    def describe(self) -> list[tuple[str, float, str]]:
        """``(term, value, unit)`` per coefficient, intercept first, in readable units."""
        out = [("intercept", self.intercept * 1e3, "ms")]
        for t, c in zip(self.terms, self.coef):
            scale, unit = _UNITS[t]
            out.append((t, c * scale, unit))
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: terms with their coefficients (s per unit) and the fit quality."""
        return {"terms": list(self.terms), "intercept_s": self.intercept,
                "coef_s": dict(zip(self.terms, self.coef)), "scale": self.scale,
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


def _solve(x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Least squares with a free intercept and non-negative slopes: on centred columns the
    intercept drops out exactly (``b0 = ȳ - x̄·b``)."""
    xm, ym = x.mean(axis=0), y.mean()
    b = nnls(x - xm, y - ym)
    return float(ym - xm @ b), b


def fit(w: Workload, terms: Iterable[str] | None = None, trim: float = 0.05, rounds: int = 3) -> StepTimeModel:
    """Fit the model on a recorded run (see the module docstring).

    Raises:
        ValueError: fewer than ``len(terms) + 2`` steps with a measured period.
    """
    terms = tuple(terms or (DEFAULT_TERMS if w.chunk_events else COARSE_TERMS))
    rows, periods = recorded_features(w)
    ok = np.isfinite(periods)
    y = periods[ok]
    x = rows[ok][:, [_INDEX[t] for t in terms]]
    if len(y) < len(terms) + 2:
        raise ValueError(f"{w.source}: only {len(y)} steps with a measured period; "
                         "too few to fit the step-time model")
    keep = np.ones(len(y), bool)
    b0, b = _solve(x, y)
    for _ in range(rounds):
        res = np.abs(y - b0 - x @ b)
        keep = res <= np.quantile(res, 1 - trim)
        b0, b = _solve(x[keep], y[keep])
    b0 += float(np.mean(y - b0 - x @ b))  # stalls are part of the wall time: spread them
    pred = np.maximum(b0 + x @ b, 0.0)
    err = np.abs(y - pred)

    def r2(mask: np.ndarray) -> float | None:
        ss = float(np.sum((y[mask] - y[mask].mean()) ** 2))
        return 1.0 - float(np.sum((y[mask] - pred[mask]) ** 2)) / ss if ss > 0 else None

    tenths = [float(a.sum() / b.sum()) - 1.0 for a, b in zip(np.array_split(y, 10), np.array_split(pred, 10))
              if len(a) and b.sum() > 0]
    quality = Quality(r2=r2(np.ones(len(y), bool)), r2_trimmed=r2(keep),
                      median_abs_ms=float(np.median(err) * 1e3), p90_abs_ms=float(np.quantile(err, 0.9) * 1e3),
                      steps=len(y), kept=int(keep.sum()), predicted_s=float(pred.sum()),
                      measured_s=float(y.sum()), drift=max((abs(t) for t in tenths), default=0.0))
    return StepTimeModel(terms, b0, tuple(float(c) for c in b), quality)
