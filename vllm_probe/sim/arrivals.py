"""How the recorded client sent its requests: open loop (at times of its own), closed loop
(a request sent when an earlier one finished: a benchmark's ``--max-concurrency``, threads
sending back to back, a chat user, a batch job with N in flight), an offline burst
(``LLM.generate``), or a mix: closed-loop streams beside bursts sent at times of their own.

A closed-loop client cannot be replayed with fixed arrival times: once the replay's
timing differs even slightly, requests arrive before the slot they waited for is free,
queues build that never existed (a 15-minute server recording replayed with fixed times
gave TTFT p90 5.94 s against 1.20 s recorded). The replay
(:func:`vllm_probe.sim.replay.replay`) instead sends a client's first ``N`` requests as
recorded and each later one when one of its requests finishes, after that request's own
recorded think time (:func:`resolve` marks them on the workload).

**Detection** (:func:`detect`), from the recorded front-end stamps (``arrival_ts``) and
finish times (``finish_ts``). In a closed loop of ``N`` clients every finish sends one
request, so, with the finishes in time order, request ``i + N`` (in arrival order) is the
one finish ``i`` sent: its gap ``arrival[i + N] - finish[i]`` is the client's think time
plus its turnaround, never negative (no more than ``N`` are ever in flight). Pairing by
order, not by "the latest earlier finish", holds when finishes come closer together than
the think time (8 clients thinking 80 ms with finishes 64 ms apart: the latest earlier
finish is mostly another client's).

The gaps of a closed loop spread by the client's own jitter only (its turnaround, its
think time's variation); an open-loop client's arrivals fall anywhere between finishes,
so paired this way its gaps spread by about the spacing of the finishes at any ``N``. For
each candidate ``N`` (the in-flight counts seen at arrivals, itself included, and one
above the largest) the gaps are measured; among those with at most
:data:`NEGATIVE_SHARE` negative, the ``N`` whose gaps spread least is taken (one too few
adds the spacing of finishes to every gap, one too many too). The run is a closed loop when

* the median absolute deviation of those gaps is within :data:`SPREAD_SHARE` of the
  median time between finishes, plus :data:`GAP_SLACK_S`: this holds with a think time
  (8 clients thinking 50 ± 5 ms, finishes 13 ms apart: 2.4 ms) and back to back (8
  clients whose turnaround is 0.3-3 ms: 0.7 ms, finishes 12 ms apart), not for Poisson
  arrivals (7-17 ms, finishes 11-14 ms apart, at every ``N``);
* at most :data:`NEGATIVE_SHARE` of them are negative (a request sent before the finish
  that would have sent it: not caused by it);
* at least :data:`MIN_REQUESTS` requests come after the first ``N``.

The last ``N`` gaps are left out when enough remain: a client winding down (a thread that
sent its last request) leaves finishes that send nothing, after which pairing by order
is off by one each. The think time is the median of the gaps (0 or more); each request
keeps its own gap (its think time and turnaround as recorded), which the replay uses, so
the loop keeps the recording's mean time between a finish and the next request (the
median alone would leave a skewed turnaround's tail out, and more requests in flight).

**Streams and bursts.** When the whole run is no closed loop, bursts are set apart: at
least :data:`BURST_MIN` requests whose stamps follow each other within
:data:`BURST_GAP_S` and raise the count in flight by :data:`BURST_MIN` or more (more of
them than requests finished in the :data:`BURST_LOOKBACK_S` before: a closed loop refilling
after several finishes is no burst). The other requests are measured again as above; when
they are a closed loop (one sequential stream: ``N`` = 1), the run is ``mixed``: that
stream replays as a closed loop, each burst at its recorded times. The run's first
arrivals are tried both as a burst and as the loop's first ``N``.

**Stretches.** A stretch cut from a recording (the remedy search's cut and widened
stretches, :mod:`vllm_probe.sim.cut`) takes the recording's loop or streams, kept to its
own requests (:func:`resolve`): it may hold too few of a stream's requests to find it.

**Offline burst**: more than one request reached the engine before step 1
(``anchored``: :func:`~vllm_probe.analysis.workload.availability_windows`) and every
request arrived before the first one finished. A server run (requests arriving across
the run) is never one: its first requests are not anchored to steps (:func:`resolve`).

``--arrivals closed:N`` or ``open`` declares the model instead (:func:`parse`).
"""

from __future__ import annotations

import bisect
import statistics
from pathlib import Path
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..analysis.workload import Workload, WorkloadError, WorkloadRequest, load_workload
from ..runs.rundir import read_meta

#: Most paired gaps that may be negative (a few ms of clock skew between the front end's
#: stamp and the engine core's finish, 5 %).
NEGATIVE_SHARE = 0.05
#: Most candidate concurrencies tried (the in-flight counts seen at arrivals).
MAX_CANDIDATES = 64
#: A closed loop's paired gaps: median absolute deviation at most this share of the median
#: time between finishes (30 %), plus :data:`GAP_SLACK_S`.
SPREAD_SHARE = 0.3
GAP_SLACK_S = 0.5e-3
#: Fewest requests after the first N for a detection.
MIN_REQUESTS = 8
#: A burst: at least this many requests (4) ...
BURST_MIN = 4
#: ... each stamped within this many seconds of the one before (5 ms) ...
BURST_GAP_S = 5e-3
#: ... and this many more than finished in the 50 ms before it.
BURST_LOOKBACK_S = 0.05


class ArrivalsError(ValueError):
    """A bad ``--arrivals`` value; one line."""


@dataclass
class Group:
    """One client stream of a ``mixed`` run.

    Attributes:
        kind: ``closed`` (a closed loop: replayed per finish) or ``burst`` (at its
            recorded times).
        requests: how many requests it sent.
        first_s: its first stamp, s after the run's first arrival.
        concurrency: N in flight (closed), else None.
        think_s: median s from a finish to the request it sent (closed), else None.
        orders: its requests (``order`` in the workload); not in :meth:`to_dict`.
    """

    kind: str
    requests: int
    first_s: float
    concurrency: int | None = None
    think_s: float | None = None
    orders: tuple[int, ...] = field(default=(), repr=False)

    def describe(self) -> str:
        """A few words: ``a closed loop of 1 in flight, think time 20.0 ms (30 requests)``."""
        if self.kind == "closed":
            return (f"a closed loop of {self.concurrency} in flight, think time {(self.think_s or 0) * 1e3:.1f} ms "
                    f"({self.requests} requests)")
        return f"a burst of {self.requests} requests at {self.first_s:.2f} s, at its recorded times"

    def to_dict(self) -> dict[str, Any]:
        """``{"kind", "requests", "first_s", "concurrency", "think_s"}``."""
        return {"kind": self.kind, "requests": self.requests, "first_s": self.first_s,
                "concurrency": self.concurrency, "think_s": self.think_s}


@dataclass
class Arrivals:
    """The arrival model of a replay.

    Attributes:
        kind: ``open`` (recorded times), ``closed`` (N in flight), ``burst`` (an
            offline burst, anchored to step indexes; the rest open) or ``mixed`` (a
            closed loop beside bursts: ``groups``).
        concurrency: N (closed, and a mixed run's loop), else None.
        think_s: median seconds from a finish to the next request (closed, mixed), else None.
        how: ``detected`` or ``declared``.
        evidence: the figures that decided it, one phrase.
        groups: the client streams of a ``mixed`` run (empty otherwise).
        thinks: each closed-loop request's own recorded think time, ``{order: s}`` (what
            :func:`resolve` marks on the workload; not in :meth:`to_dict`).
    """

    kind: str
    concurrency: int | None = None
    think_s: float | None = None
    how: str = "detected"
    evidence: str = ""
    groups: list[Group] = field(default_factory=list)
    thinks: dict[int, float] = field(default_factory=dict, repr=False)

    @property
    def closed(self) -> tuple[int, float] | None:
        """``(N, think_s)`` when every request is one closed loop's, or None (a mixed run's
        loop is marked on the workload's requests instead: :func:`resolve`)."""
        if self.kind != "closed" or not self.concurrency:
            return None
        return self.concurrency, self.think_s or 0.0

    def describe(self) -> str:
        """One line for the report: which model the replays used, and why."""
        if self.kind == "closed":
            text = (f"arrivals: closed loop, {self.concurrency} in flight, think time "
                    f"{(self.think_s or 0) * 1e3:.1f} ms ({self.how}")
        elif self.kind == "mixed":
            text = "arrivals: per client stream: " + "; ".join(g.describe() for g in self.groups) + f" ({self.how}"
        elif self.kind == "burst":
            text = f"arrivals: an offline burst anchored to its recorded steps, the rest at recorded times ({self.how}"
        else:
            text = f"arrivals: open loop, at the recorded times ({self.how}"
        return text + (f": {self.evidence})" if self.evidence else ")")

    def to_dict(self) -> dict[str, Any]:
        """``{"kind", "concurrency", "think_s", "how", "evidence", "groups"}`` (``whatif --json``'s
        ``arrivals``)."""
        return {"kind": self.kind, "concurrency": self.concurrency, "think_s": self.think_s, "how": self.how,
                "evidence": self.evidence, "groups": [g.to_dict() for g in self.groups]}


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


class Loop(NamedTuple):
    """A set of requests measured as a closed loop of ``n`` (:func:`measure`).

    Attributes:
        n: requests in flight.
        gaps: s from finish ``i`` to request ``i + n`` (arrival order), the wind-down left out.
        orders: the request (``order``) each gap belongs to.
        spacing: median s between two finishes.
        after: requests after the first ``n``.
        negative: share of the gaps below ``-GAP_SLACK_S``.
        spread: median absolute deviation of the gaps (s).
        pinned: share of the arrivals (after the first ``n``, before the last ``n``) that
            left exactly ``n`` in flight.
    """

    n: int
    gaps: list[float]
    orders: list[int]
    spacing: float
    after: int
    negative: float
    spread: float
    pinned: float

    @property
    def think_s(self) -> float:
        """The median gap, 0 or more (s)."""
        return max(statistics.median(self.gaps), 0.0)

    @property
    def is_closed(self) -> bool:
        """Whether these gaps make a closed loop (see the module docstring)."""
        return (self.after >= MIN_REQUESTS and self.negative <= NEGATIVE_SHARE
                and self.spread <= SPREAD_SHARE * self.spacing + GAP_SLACK_S)

    def thinks(self) -> dict[int, float]:
        """Each paired request's own think time, ``{order: s}`` (negative gaps left out:
        the pairing is off there; those requests get the median)."""
        return {o: max(g, 0.0) for o, g in zip(self.orders, self.gaps) if g >= -GAP_SLACK_S}

    def evidence(self) -> str:
        """The figures, one phrase."""
        return (f"with {self.n} in flight, requests arrived {statistics.median(self.gaps) * 1e3:.1f} ± "
                f"{self.spread * 1e3:.1f} ms (median ± median deviation) after the finish that sent them, "
                f"{self.negative * 100:.0f} % before it; finishes {self.spacing * 1e3:.1f} ms apart; "
                f"{self.pinned * 100:.0f} % of arrivals left {self.n} in flight")


def _mad(xs: list[float]) -> float:
    m = statistics.median(xs)
    return float(statistics.median(abs(x - m) for x in xs))


def measure(reqs: list[WorkloadRequest], n: int | None = None) -> Loop | None:
    """``reqs`` (stamped, in arrival order) measured as a closed loop: of ``n`` in flight,
    or of the candidate ``N`` whose paired gaps spread least among those with at most
    :data:`NEGATIVE_SHARE` negative (see the module docstring); None without enough
    requests or finishes."""
    finishes = sorted(r.finish_ts for r in reqs if r.finish_ts is not None)
    if len(reqs) < MIN_REQUESTS + 1 or len(finishes) < 2:
        return None
    stamps = [r.stamp for r in reqs]
    # in flight when r arrived, itself included: sent by then, less finished by then
    inflight = [bisect.bisect_right(stamps, t) - bisect.bisect_right(finishes, t) for t in stamps]
    if n is None:
        counts = Counter(inflight)
        candidates = sorted({c for c in counts if c >= 1} | {max(counts) + 1})
        candidates = sorted(candidates, key=lambda c: -counts.get(c, 0))[:MAX_CANDIDATES]
    else:
        candidates = [n]
    spacing = statistics.median(b - a for a, b in zip(finishes, finishes[1:]))
    best: tuple[tuple[bool, float, int], Loop] | None = None
    for c in candidates:
        gaps = [a - f for a, f in zip(stamps[c:], finishes)]
        # the wind-down: a client that sent its last request leaves finishes that send
        # nothing, and pairing by order shifts after each; the last N are left out
        if len(gaps) - c >= MIN_REQUESTS:
            gaps = gaps[:len(gaps) - c]
        if len(gaps) < MIN_REQUESTS and n is None:
            continue
        if not gaps:
            return None
        negative = sum(g < -GAP_SLACK_S for g in gaps) / len(gaps)
        middle = inflight[c:len(inflight) - c] or inflight[c:]
        pinned = sum(x == c for x in middle) / len(middle) if middle else 0.0
        loop = Loop(c, gaps, [r.order for r in reqs[c:c + len(gaps)]], spacing, len(stamps) - c, negative,
                    _mad(gaps), pinned)
        key = (negative > NEGATIVE_SHARE, loop.spread, c)
        if best is None or key < best[0]:
            best = (key, loop)
    return best[1] if best is not None else None


def bursts(reqs: list[WorkloadRequest]) -> list[list[WorkloadRequest]]:
    """The bursts among ``reqs`` (stamped, in arrival order): at least :data:`BURST_MIN`
    requests stamped within :data:`BURST_GAP_S` of each other, :data:`BURST_MIN` or more
    of them beyond the requests that finished in the :data:`BURST_LOOKBACK_S` before the
    burst or during it."""
    finishes = sorted(r.finish_ts for r in reqs if r.finish_ts is not None)
    runs: list[list[WorkloadRequest]] = []
    for r in reqs:
        if runs and r.stamp - runs[-1][-1].stamp <= BURST_GAP_S:
            runs[-1].append(r)
        else:
            runs.append([r])
    out = []
    for run in runs:
        if len(run) < BURST_MIN:
            continue
        lo, hi = run[0].stamp - BURST_LOOKBACK_S, run[-1].stamp
        refilled = bisect.bisect_right(finishes, hi) - bisect.bisect_left(finishes, lo)
        if len(run) - refilled >= BURST_MIN:
            out.append(run)
    return out


def _streams(reqs: list[WorkloadRequest]) -> tuple[Loop, list[WorkloadRequest], list[list[WorkloadRequest]]] | None:
    """``(the loop, its requests, the bursts)`` when the requests outside the bursts are a
    closed loop; None otherwise. The run's first arrivals are tried as a burst, then as the
    loop's first ``N``."""
    found = bursts(reqs)
    if not found:
        return None
    tries = [found]
    if found[0][0] is reqs[0]:
        tries.append(found[1:])
    for bs in tries:
        if not bs:
            continue
        apart = {r.order for b in bs for r in b}
        rest = [r for r in reqs if r.order not in apart]
        loop = measure(rest)
        if loop is not None and loop.is_closed:
            return loop, rest, bs
    return None


def _stamped(w: Workload) -> list[WorkloadRequest]:
    return sorted((r for r in w.requests if r.arrival_ts is not None), key=lambda r: (r.stamp, r.order))


def detect(w: Workload) -> Arrivals:
    """The arrival model of a recorded run (see the module docstring)."""
    reqs = _stamped(w)
    whole = measure(reqs)
    if whole is not None and whole.is_closed:
        return Arrivals("closed", whole.n, whole.think_s, evidence=whole.evidence(), thinks=whole.thinks())
    streams = _streams(reqs) if len(reqs) > MIN_REQUESTS else None
    if streams is not None:
        loop, members, bs = streams
        t0 = reqs[0].stamp
        groups = [Group("closed", len(members), members[0].stamp - t0, loop.n, loop.think_s,
                        tuple(r.order for r in members))]
        groups += [Group("burst", len(b), b[0].stamp - t0, orders=tuple(r.order for r in b)) for b in bs]
        groups.sort(key=lambda g: g.first_s)
        return Arrivals("mixed", loop.n, loop.think_s, evidence=f"{len(bs)} burst(s) set apart; the other "
                        f"{len(members)} requests {loop.evidence()}", groups=groups, thinks=loop.thinks())
    anchored = sum(r.anchored for r in w.requests)
    finishes = [r.finish_ts for r in w.requests if r.finish_ts is not None]
    first_finish = min(finishes) if finishes else None
    later = sum(1 for r in reqs if first_finish is not None and r.stamp > first_finish)
    if anchored > 1 and not later:
        return Arrivals("burst", evidence=f"{anchored} requests reached the engine before steps 0-1, during its "
                        "first step, and none arrived after a request finished")
    text = whole.evidence() if whole is not None else ""
    if anchored > 1:  # a server run whose first requests came together: not an offline burst
        text += (("; " if text else "") + f"its first {anchored} requests came before step 1, {later} more "
                 "after requests had finished: a server run, no offline burst")
    return Arrivals("open", evidence=text)


def _from_whole_run(w: Workload) -> Arrivals | None:
    """When ``w`` is a stretch cut from a recording (:func:`vllm_probe.sim.cut.write_cut`:
    ``meta.json``'s ``cut.from``), the recording's closed loop or streams, kept to the
    stretch's requests (matched by id): a stretch holds too few of a stream's requests to
    find it by itself. None otherwise."""
    parent = (read_meta(Path(w.source)).get("cut") or {}).get("from") if w.source else None
    if not parent:
        return None
    try:
        whole = load_workload(parent)
    except (WorkloadError, OSError, ValueError):
        return None
    a = detect(whole)
    if a.kind not in ("closed", "mixed") or not a.concurrency:
        return None
    here = {r.req_id: r.order for r in w.requests}
    ids = {r.order: r.req_id for r in whole.requests}
    stamps = {r.order: r.stamp for r in w.requests}
    t0 = min(stamps.values())
    whole_groups = a.groups if a.kind == "mixed" else [
        Group("closed", len(ids), 0.0, a.concurrency, a.think_s, tuple(ids))]
    groups = []
    for g in whole_groups:
        mine = tuple(sorted(here[ids[o]] for o in g.orders if ids[o] in here))
        if mine:
            groups.append(Group(g.kind, len(mine), min(stamps[o] for o in mine) - t0, g.concurrency, g.think_s, mine))
    if not any(g.kind == "closed" for g in groups):
        return None
    groups.sort(key=lambda g: g.first_s)
    thinks = {here[ids[o]]: t for o, t in a.thinks.items() if ids[o] in here}
    text = f"the recording this stretch was cut from: {a.describe().removeprefix('arrivals: ')}"
    if len(groups) == 1:
        return Arrivals("closed", a.concurrency, a.think_s, evidence=text, thinks=thinks)
    return Arrivals("mixed", a.concurrency, a.think_s, evidence=text, groups=groups, thinks=thinks)


def resolve(w: Workload, declared: Arrivals | None) -> Arrivals:
    """The model the replays use, and ``w`` marked for it.

    The declared one (a declared closed loop without a think time gets the recording's:
    the median gap from a finish to the request it sent, paired at the declared ``N``,
    and each request its own), else :func:`detect`'s (for a stretch cut from a recording,
    the recording's loop or streams kept to the stretch's requests, where it has one). On
    ``w``: the closed loop's requests
    get ``client`` 0 and their own ``think_s`` (``w.clients`` = ``{0: (N, think_s)}``);
    a detected model other than an offline burst leaves no request anchored to a step.
    """
    if declared is None:
        arrivals = _from_whole_run(w) or detect(w)
    else:
        arrivals = declared
        if declared.kind == "closed" and declared.think_s is None and declared.concurrency:
            loop = measure(_stamped(w), declared.concurrency)
            declared.think_s = loop.think_s if loop is not None else 0.0
            declared.thinks = loop.thinks() if loop is not None else {}
    for r in w.requests:
        r.client = r.think_s = None
    w.clients = {}
    if arrivals.kind in ("closed", "mixed") and arrivals.concurrency:
        members = ({o for g in arrivals.groups if g.kind == "closed" for o in g.orders} if arrivals.kind == "mixed"
                   else {r.order for r in w.requests})
        for r in w.requests:
            if r.order in members:
                r.client = 0
                r.think_s = arrivals.thinks.get(r.order)
        w.clients = {0: (arrivals.concurrency, arrivals.think_s or 0.0)}
    if arrivals.how == "detected" and arrivals.kind != "burst":
        for r in w.requests:
            r.anchored = False
    return arrivals


__all__ = ["Arrivals", "ArrivalsError", "Group", "Loop", "bursts", "detect", "measure", "parse", "resolve"]
