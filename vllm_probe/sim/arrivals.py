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
finish times (``finish_ts``) of the requests after the first ``N``:

* *in flight*: at each arrival, the requests already sent and not finished, itself
  included; a closed loop keeps it at ``N`` (:data:`STEADY_SHARE` of arrivals or more
  at the most common count, ``N ≥ 2`` or a serial client with ``N = 1``);
* *right after a completion*: the gap from the latest earlier finish to the arrival is
  the same for :data:`AFTER_FINISH_SHARE` of arrivals or more: within ±25 % + 0.5 ms
  (:data:`GAP_SHARE`, :data:`GAP_SLACK_S`) of the median gap — the client's think time.
  An open-loop client lands anywhere between finishes (for uniform arrivals between
  finishes spaced ``S`` apart, 25 % + 0.5 ms / ``S`` of the gaps fall in that window);
* at least :data:`MIN_REQUESTS` requests after the first ``N``.

The think time is the median of those gaps (0 or more). ``--arrivals closed:N`` or
``open`` declares the model instead (:func:`parse`).
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from ..analysis.workload import Workload

#: Share of arrivals at the most common in-flight count for a steady concurrency (70 %).
STEADY_SHARE = 0.7
#: Share of arrivals right after a completion for a closed loop (80 %).
AFTER_FINISH_SHARE = 0.8
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
    """``(N, steady share, gaps of the requests after the first N, median time between
    finishes, requests after the first N)``, or None without enough requests."""
    import bisect

    reqs = sorted((r for r in w.requests if r.arrival_ts is not None), key=lambda r: (r.stamp, r.order))
    finishes = sorted(r.finish_ts for r in w.requests if r.finish_ts is not None)
    if len(reqs) < MIN_REQUESTS + 1 or len(finishes) < 2:
        return None
    stamps = [r.stamp for r in reqs]
    # in flight when r arrived, itself included: sent by then, less finished by then
    counts = [bisect.bisect_right(stamps, t) - bisect.bisect_right(finishes, t) for t in stamps]
    n, at_n = Counter(counts).most_common(1)[0]
    later = stamps[n:]
    spacing = statistics.median(b - a for a, b in zip(finishes, finishes[1:]))
    gaps = []
    for t in later:
        k = bisect.bisect_right(finishes, t + 1e-3)
        if k:
            gaps.append(max(t - finishes[k - 1], 0.0))
    return n, at_n / len(counts), gaps, spacing, len(later)


def detect(w: Workload) -> Arrivals:
    """The arrival model of a recorded run (see the module docstring)."""
    anchored = sum(r.anchored for r in w.requests)
    fallback = Arrivals("burst" if anchored > 1 else "open")
    if anchored > 1:
        fallback.evidence = f"{anchored} requests reached the engine before steps 0-1, during its first step"
    m = _measure(w)
    if m is None or m[4] < MIN_REQUESTS:
        return fallback
    n, steady, gaps, spacing, later = m
    close = _same_gap(gaps)
    after = len(close) / later
    med = statistics.median(gaps) if gaps else 0.0
    window = (GAP_SHARE * med + GAP_SLACK_S) * 1e3
    evidence = (f"{after * 100:.0f} % of requests arrived {med * 1e3:.1f} ± {window:.1f} "
                f"ms after a finish (finishes {spacing * 1e3:.1f} ms apart), {steady * 100:.0f} % with {n} in flight")
    if steady >= STEADY_SHARE and after >= AFTER_FINISH_SHARE:
        return Arrivals("closed", n, float(statistics.median(close)) if close else 0.0, evidence=evidence)
    if fallback.kind == "open":
        fallback.evidence = evidence
    return fallback


def _same_gap(gaps: list[float]) -> list[float]:
    """The gaps within ±:data:`GAP_SHARE` of their median, plus :data:`GAP_SLACK_S`."""
    if not gaps:
        return []
    med = statistics.median(gaps)
    return [g for g in gaps if abs(g - med) <= GAP_SHARE * med + GAP_SLACK_S]


def resolve(w: Workload, declared: Arrivals | None) -> Arrivals:
    """The model the replays use: the declared one (a declared closed loop without a think
    time gets the recording's: the median gap from a finish to the next arrival), else :func:`detect`'s."""
    if declared is None:
        return detect(w)
    if declared.kind == "closed" and declared.think_s is None:
        m = _measure(w)
        close = _same_gap(m[2]) if m is not None else []
        declared.think_s = float(statistics.median(close)) if close else 0.0
    return declared


__all__ = ["Arrivals", "ArrivalsError", "detect", "parse", "resolve"]
