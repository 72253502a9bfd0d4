"""How the recorded client sent its requests: open loop (at times of its own), closed loop
(a request sent when an earlier one finished: a benchmark's ``--max-concurrency``, a chat
user, a batch job with N in flight) or an offline burst (``LLM.generate``).

A closed-loop client cannot be replayed with fixed arrival times: once the replay's
timing differs even slightly, requests arrive before the slot they waited for is free,
queues build that never existed (issue 18: a 15-minute server recording replayed with
fixed times gave TTFT p90 5.94 s against 1.20 s recorded). The replay
(:func:`vllm_probe.sim.replay.replay`, ``closed=(N, think_s)``) instead sends the first
``N`` requests as recorded and each later one ``think_s`` after a request finishes.

**Detection** (:func:`detect`), from the recorded front-end stamps (``arrival_ts``) and
finish times (``finish_ts``). In a closed loop of ``N`` clients every finish sends one
request, so, with the finishes in time order, request ``i + N`` (in arrival order) is the
one finish ``i`` sent: its gap ``arrival[i + N] - finish[i]`` is the client's think time
plus its turnaround, the same for every ``i``, never negative. Pairing by order, not by
"the latest earlier finish", holds when finishes come closer together than the think
time (8 clients thinking 80 ms with finishes 64 ms apart: the latest earlier finish is
mostly another client's). For each candidate ``N`` (the in-flight counts seen at
arrivals, itself included, and one above the largest) the gaps are measured; the ``N``
whose gaps agree best is taken, and the run is a closed loop when

* :data:`AFTER_FINISH_SHARE` of those gaps or more are the same gap: within ±25 % of
  their median and of the median time between finishes, plus 0.5 ms (:data:`GAP_SHARE`,
  :data:`GAP_SLACK_S`). An open-loop client's arrivals fall anywhere between finishes:
  paired this way, a steady open-loop run's gaps wander by the spacing of its arrivals
  (Poisson at 40/s, finishes 14 ms apart: a window of ±25 % of the median gap, 39 ms,
  held 80 % of them; ±25 % of the spacing does not);
* at most :data:`NEGATIVE_SHARE` of them are negative (a request sent before the finish
  that would have sent it: not caused by it);
* at least :data:`MIN_REQUESTS` requests come after the first ``N``.

The last ``N`` gaps are left out when enough remain: a client winding down (a thread that
sent its last request) leaves finishes that send nothing, after which pairing by order
is off by one each.

The think time is the median of those gaps (0 or more). ``--arrivals closed:N`` or
``open`` declares the model instead (:func:`parse`).
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from ..analysis.workload import Workload

#: Share of the paired gaps (finish i -> request i + N) that are the same gap, for a closed
#: loop (80 %).
AFTER_FINISH_SHARE = 0.8
#: Most paired gaps that may be negative (a few ms of clock skew between the front end's
#: stamp and the engine core's finish, 5 %).
NEGATIVE_SHARE = 0.05
#: Most candidate concurrencies tried (the in-flight counts seen at arrivals).
MAX_CANDIDATES = 64
#: "The same gap": within this share of the median gap, plus :data:`GAP_SLACK_S`.
GAP_SHARE = 0.25
GAP_SLACK_S = 0.5e-3
#: Fewest requests after the first N for a detection.
MIN_REQUESTS = 8


class ArrivalsError(ValueError):
    """A bad ``--arrivals`` value; one line."""


@dataclass
class Arrivals:
    """The arrival model of a replay.

    Attributes:
        kind: ``open`` (recorded times), ``closed`` (N in flight) or ``burst`` (an
            offline burst, anchored to step indexes; the rest open).
        concurrency: N (closed), else None.
        think_s: seconds from a finish to the next request (closed), else None.
        how: ``detected`` or ``declared``.
        evidence: the figures that decided it, one phrase.
    """

    kind: str
    concurrency: int | None = None
    think_s: float | None = None
    how: str = "detected"
    evidence: str = ""

    @property
    def closed(self) -> tuple[int, float] | None:
        """``(N, think_s)`` for the replay, or None."""
        if self.kind != "closed" or not self.concurrency:
            return None
        return self.concurrency, self.think_s or 0.0

    def describe(self) -> str:
        """One line for the report: which model the replays used, and why."""
        if self.kind == "closed":
            text = (f"arrivals: closed loop, {self.concurrency} in flight, think time "
                    f"{(self.think_s or 0) * 1e3:.1f} ms ({self.how}")
        elif self.kind == "burst":
            text = f"arrivals: an offline burst anchored to its recorded steps, the rest at recorded times ({self.how}"
        else:
            text = f"arrivals: open loop, at the recorded times ({self.how}"
        return text + (f": {self.evidence})" if self.evidence else ")")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse(text: str | None) -> Arrivals | None:
    """``--arrivals``: ``auto`` / None (detect), ``open``, ``closed:N`` or ``closed:N:THINK_MS``.

    Raises:
        ArrivalsError: anything else (one line).
    """
    if text is None or text == "auto":
        return None
    if text == "open":
        return Arrivals("open", how="declared")
    kind, _, rest = text.partition(":")
    if kind == "closed" and rest:
        n, _, think = rest.partition(":")
        try:
            concurrency = int(n)
            think_s = float(think) / 1e3 if think else None
        except ValueError:
            concurrency, think_s = 0, None
        if concurrency >= 1 and (think_s is None or think_s >= 0):
            return Arrivals("closed", concurrency, think_s, how="declared")
    raise ArrivalsError(f"--arrivals {text!r}: use auto, open, closed:N (N requests in flight) or "
                        "closed:N:THINK_MS")


def _measure(w: Workload) -> tuple[int, float, list[float], float, int] | None:
    """``(N, share of negative gaps, the gaps finish i -> request i + N, median time
    between finishes, requests after the first N)`` for the ``N`` whose gaps agree best,
    or None without enough requests."""
    import bisect

    reqs = sorted((r for r in w.requests if r.arrival_ts is not None), key=lambda r: (r.stamp, r.order))
    finishes = sorted(r.finish_ts for r in w.requests if r.finish_ts is not None)
    if len(reqs) < MIN_REQUESTS + 1 or len(finishes) < 2:
        return None
    stamps = [r.stamp for r in reqs]
    # in flight when r arrived, itself included: sent by then, less finished by then
    counts = Counter(bisect.bisect_right(stamps, t) - bisect.bisect_right(finishes, t) for t in stamps)
    candidates = sorted({n for n in counts if n >= 1} | {max(counts) + 1})
    candidates = sorted(candidates, key=lambda n: -counts.get(n, 0))[:MAX_CANDIDATES]
    spacing = statistics.median(b - a for a, b in zip(finishes, finishes[1:]))
    best: tuple[float, int, list[float]] | None = None
    for n in candidates:
        gaps = [a - f for a, f in zip(stamps[n:], finishes)]
        # the wind-down: a client that sent its last request leaves finishes that send
        # nothing, and pairing by order shifts after each; the last N are left out
        if len(gaps) - n >= MIN_REQUESTS:
            gaps = gaps[:len(gaps) - n]
        if len(gaps) < MIN_REQUESTS:
            continue
        agree = len(_same_gap(gaps, spacing)) / len(gaps)
        if best is None or agree > best[0]:
            best = (agree, n, gaps)
    if best is None:
        return None
    _, n, gaps = best
    negative = sum(g < -GAP_SLACK_S for g in gaps) / len(gaps)
    return n, negative, gaps, spacing, len(stamps) - n


def detect(w: Workload) -> Arrivals:
    """The arrival model of a recorded run (see the module docstring)."""
    anchored = sum(r.anchored for r in w.requests)
    fallback = Arrivals("burst" if anchored > 1 else "open")
    if anchored > 1:
        fallback.evidence = f"{anchored} requests reached the engine before steps 0-1, during its first step"
    m = _measure(w)
    if m is None or m[4] < MIN_REQUESTS:
        return fallback
    n, negative, gaps, spacing, _ = m
    close = _same_gap(gaps, spacing)
    after = len(close) / len(gaps)
    med = max(statistics.median(gaps), 0.0) if gaps else 0.0
    window = _window(med, spacing) * 1e3
    evidence = (f"with {n} in flight, {after * 100:.0f} % of requests arrived {med * 1e3:.1f} ± {window:.1f} ms "
                f"after the finish that sent them, {negative * 100:.0f} % before it (finishes "
                f"{spacing * 1e3:.1f} ms apart)")
    if after >= AFTER_FINISH_SHARE and negative <= NEGATIVE_SHARE:
        return Arrivals("closed", n, float(statistics.median(close)) if close else 0.0, evidence=evidence)
    if fallback.kind == "open":
        fallback.evidence = evidence
    return fallback


def _window(med: float, spacing: float) -> float:
    """Half-width (s) of "the same gap" around a median gap ``med`` (s) with finishes
    ``spacing`` s apart."""
    return min(GAP_SHARE * med, GAP_SHARE * spacing) + GAP_SLACK_S


def _same_gap(gaps: list[float], spacing: float) -> list[float]:
    """The gaps within :func:`_window` of their median (taken as 0 when negative): a
    request sent before its finish is never the same gap as one sent after it."""
    if not gaps:
        return []
    med = max(statistics.median(gaps), 0.0)
    w = _window(med, spacing)
    return [g for g in gaps if abs(g - med) <= w]


def resolve(w: Workload, declared: Arrivals | None) -> Arrivals:
    """The model the replays use: the declared one (a declared closed loop without a think
    time gets the recording's: the median gap from a finish to the next arrival), else :func:`detect`'s."""
    if declared is None:
        return detect(w)
    if declared.kind == "closed" and declared.think_s is None:
        m = _measure(w)
        close = _same_gap(m[2], m[3]) if m is not None else []
        declared.think_s = float(statistics.median(close)) if close else 0.0
    return declared


__all__ = ["Arrivals", "ArrivalsError", "detect", "parse", "resolve"]
