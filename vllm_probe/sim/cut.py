"""The stretch of a recording a finding needs, cut out as a recording of its own.

A replay of a whole 1-hour recording takes tens of minutes (docs/tune.md); a finding is
often about one stretch of it (a burst that preempted, two short requests behind long
prompts). Between two moments when the engine core held no request at all (an *idle
boundary*: every request added before step ``b`` had finished by step ``b - 1``), the
scheduler's state is a function of what arrives after: vLLM's ``Scheduler`` keeps no
request, no running or waiting queue and no allocated block across it (its free-block
count is the whole cache, cached blocks included: ``BlockPool.get_num_free_blocks``,
vllm/v1/core/block_pool.py, 0.32). So the stretch between two idle boundaries replays on
its own as it does inside the whole run, with two exceptions this module checks:

* **The prefix cache.** Blocks cached before the stretch stay hit-able across an idle
  boundary. The cut is exact only when no request of the stretch shares a block digest
  with a request before it (``request_added.block_digests``, and the answer's blocks of
  ``request_finished.output_block_digests``); otherwise the stretch starts at an earlier
  boundary. Without digests the replay cannot rebuild hits at all, so the
  cut loses nothing the whole run's replay had.
* **Later arrivals.** At the recorded settings the stretch ends idle before the next
  arrival. A change that makes it run longer would meet requests the cut left out:
  :attr:`Stretch.horizon_s` is the time to the next arrival, and a replay that runs past
  it is not exact (:mod:`vllm_probe.advice.remedies` does not judge a goal on it).

:func:`stretch_for` finds the stretch around a range of steps; :func:`write_cut` writes it
as a run directory (the lines as recorded, ``step`` counted from the stretch's first
step), which every reading command and the replay take as they take a recording.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from pathlib import Path

import msgspec

from ..analysis.workload import Workload, WorkloadRequest
from ..runs.reader import ReadStats, iter_run_lines
from ..runs.rundir import META_FILE, event_streams

#: A cut is used only when it holds at most this share of the run's steps: a longer
#: stretch saves too little to be worth a second baseline replay.
CUT_MAX_SHARE = 0.5
#: Idle boundaries tried, walking back from the first, for one whose earlier requests share
#: no cached block with the stretch's (a bound on the search's cost on long runs).
PREFIX_WALK_MAX = 64


@dataclass(frozen=True)
class Stretch:
    """Recorded steps ``first_step``..``last_step`` (inclusive), bounded by idle moments.

    Attributes:
        first_step, last_step: recorded step indices of the engine core.
        requests: how many requests were added in it (every one finished in it).
        total_steps: the run's steps (``last_step + 1`` of the whole recording).
        horizon_s: seconds from the stretch's first arrival stamp to the first arrival
            after the stretch (None: nothing arrived after it).
    """

    first_step: int
    last_step: int
    requests: int
    total_steps: int
    horizon_s: float | None

    @property
    def steps(self) -> int:
        return self.last_step - self.first_step + 1

    def to_dict(self) -> dict[str, int | float | None]:
        """``{"first_step", "last_step", "steps", "of_steps", "requests", "horizon_s"}``."""
        return {"first_step": self.first_step, "last_step": self.last_step, "steps": self.steps,
                "of_steps": self.total_steps, "requests": self.requests, "horizon_s": self.horizon_s}


def idle_boundaries(w: Workload) -> list[int]:
    """Step indices ``b`` (0..``w.last_step + 1``) before which the engine core held no
    request: every request added before step ``b`` had finished by step ``b - 1``.
    Ascending; 0 is always one, and ``last_step + 1`` when every request finished."""
    ends: dict[int, int] = {}  # add step -> latest finish step of the requests added then
    open_ended = None
    for r in w.requests:
        if r.finish_step is None:
            open_ended = r.add_before_step if open_ended is None else min(open_ended, r.add_before_step)
            continue
        ends[r.add_before_step] = max(ends.get(r.add_before_step, -1), r.finish_step)
    out = [0]
    busy_until = -1  # the latest finish step of the requests added so far
    for b in range(1, w.last_step + 2):
        busy_until = max(busy_until, ends.get(b - 1, -1))
        if open_ended is not None and open_ended <= b - 1:
            break
        if busy_until <= b - 1:
            out.append(b)
    return out


def stretch_for(w: Workload, first: int, last: int, max_share: float = CUT_MAX_SHARE) -> Stretch | None:
    """The shortest exact stretch holding recorded steps ``first``..``last``; None when it
    would hold more than ``max_share`` of the run's steps (the whole run is replayed then),
    when the run has no idle boundary around them, or when the recording does not start at
    the engine core's first step (retention removed its first segments: requests added
    before are unknown, so an idle moment cannot be told)."""
    if not w.steps or w.steps[0].step != 0:
        return None
    total = w.last_step + 1
    bounds = idle_boundaries(w)
    starts = [b for b in bounds if b <= first]
    ends = [b for b in bounds if b > last]
    if not starts or not ends:
        return None
    end = _past_empty_steps(w, ends[0], set(bounds))
    start = _prefix_exact_start(w, starts, end)
    if start is None or (end - start) > max_share * total:
        return None
    inside = [r for r in w.requests if start <= r.add_before_step < end]
    if not inside:
        return None
    t0 = min(r.stamp for r in inside)
    later = [r.stamp for r in w.requests if r.add_before_step >= end]
    return Stretch(start, end - 1, len(inside), total, (min(later) - t0) if later else None)


def widen(w: Workload, stretch: Stretch, until_s: float) -> Stretch | None:
    """The stretch from ``stretch``'s start to the first idle boundary after which nothing
    arrives within ``until_s`` seconds of the stretch's first arrival (a replay of
    ``stretch`` ran that long: :attr:`Stretch.horizon_s` exceeded); None when that is the
    whole run (replay it whole)."""
    t0 = min(r.stamp for r in w.requests if stretch.first_step <= r.add_before_step <= stretch.last_step)
    by_step = sorted((r.add_before_step, r.stamp) for r in w.requests)
    steps = [s for s, _ in by_step]
    earliest = [ts for _, ts in by_step]  # becomes: the earliest stamp from each index on
    for i in range(len(earliest) - 2, -1, -1):
        earliest[i] = min(earliest[i], earliest[i + 1])
    for end in idle_boundaries(w):
        if end <= stretch.last_step + 1:
            continue
        i = bisect.bisect_left(steps, end)  # the first request added at or after the boundary
        if i < len(steps) and earliest[i] - t0 <= until_s:
            continue
        wider = stretch_for(w, stretch.first_step, end - 1, max_share=1.0)
        if wider is None or (wider.first_step == 0 and wider.last_step >= w.last_step):
            return None
        return wider
    return None


def _past_empty_steps(w: Workload, end: int, bounds: set[int]) -> int:
    """``end`` moved past the steps that schedule nothing right after it: the engine core
    runs one more step after a stretch's last request finishes (0 tokens, its ``finished``
    list), and the replay of the stretch runs it too, so the cut keeps it (measured on the
    hand-made bursts: without it the cut's baseline had one step more than the stretch)."""
    tokens = {s.step: s.scheduled_tokens for s in w.steps}
    while end <= w.last_step and tokens.get(end) == 0 and end + 1 in bounds:
        end += 1
    return end


def _prefix_exact_start(w: Workload, starts: list[int], end: int) -> int | None:
    """The latest of ``starts`` before which no request shares a block digest with the
    requests from it to ``end`` (prefix caching on and digests recorded); else the latest.
    A request's digests are its prompt's and its answer's (``output_digests``): a prompt
    that repeats an earlier answer hits that answer's cached blocks."""
    if not w.config.get("prefix_caching") or not w.has_digests:  # engine_config's field (schema/events.py)
        return starts[-1]

    def digests(r: WorkloadRequest) -> list[str]:
        return (r.block_digests or []) + (r.output_digests or [])

    for start in list(reversed(starts))[:PREFIX_WALK_MAX]:
        inside = {d for r in w.requests if start <= r.add_before_step < end for d in digests(r)}
        before = any(d in inside for r in w.requests if r.add_before_step < start for d in digests(r))
        if not before:
            return start
    return None


def write_cut(run_dir: str | Path, stretch: Stretch, out: str | Path) -> Path:
    """Write recorded steps ``stretch.first_step``..``last_step`` of ``run_dir`` (one engine
    core) to the run directory ``out``: its ``engine_config`` line, every event of those
    steps (step-less events by the step the engine core ran next, as ``vllm-probe export
    --from-step`` keeps them) with ``step`` counted from the stretch's first step, and
    ``meta.json`` with a ``cut`` entry (``from``, ``first_step``, ``last_step``).

    Raises:
        OSError: ``out`` cannot be written.
    """
    run_dir, out = Path(run_dir), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lo, hi = stretch.first_step, stretch.last_step
    decode = msgspec.json.decode
    encode = msgspec.json.encode
    last = -1
    streams = event_streams(run_dir)
    name = (streams[0].name if streams else "events-cut") + ".jsonl"
    with open(out / name, "wb") as f:
        for ev, raw in iter_run_lines(run_dir, ReadStats()):
            kind = ev.kind
            step = getattr(ev, "step", None)
            if kind == "step" and step is not None:
                last = max(last, step)
            if kind == "engine_config":
                f.write(raw)
                continue
            at = step if step is not None else last + 1
            if not lo <= at <= hi:
                continue
            if step is None:
                f.write(raw)
                continue
            rec = decode(raw)
            rec["step"] = step - lo
            f.write(encode(rec) + b"\n")
    meta_in = run_dir / META_FILE
    meta = json.loads(meta_in.read_text()) if meta_in.exists() else {}
    meta["cut"] = {"from": str(run_dir), "first_step": lo, "last_step": hi}
    (out / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return out


__all__ = ["CUT_MAX_SHARE", "Stretch", "idle_boundaries", "stretch_for", "widen", "write_cut"]
