"""The notable moments of a finished run (the dashboard's end, ``summary``, the report):
the steps with the most preemptions, the longest waits and who took the budget meanwhile,
the longest run of full-budget prefill steps while others waited, the longest stall.
Read from the state, its timeline and the run's :class:`~vllm_probe.analysis.episodes.Episodes`."""

from __future__ import annotations

from dataclasses import dataclass, field

from .episodes import Episodes
from .state import RunState

@dataclass
class Moment:
    """A step range worth looking at, with what happened (``tail --replay --from-step``).

    Attributes:
        kind: ``preemptions`` (the steps with the most preemptions), ``wait`` (a longest
            wait and who caused it), ``prefill_block`` (the longest run of full-budget
            prefill steps while others waited), ``stall`` (steps that scheduled nothing
            while requests waited).
        engine: data-parallel rank.
        first_step, last_step: the steps (inclusive).
        text: one line with the run's numbers.
        req_ids: the requests named.
    """

    kind: str
    engine: int
    first_step: int
    last_step: int
    text: str
    req_ids: list[str] = field(default_factory=list)


#: Moments of each kind listed (at most).
MOMENTS_PER_KIND = {"preemptions": 2, "wait": 2, "prefill_block": 1, "stall": 1}


def _reasons_text(reasons: dict[str, int]) -> str:
    total = sum(reasons.values())
    if not total:
        return ""
    top = sorted(reasons.items(), key=lambda kv: -kv[1])[:2]
    return ", ".join(f"{k} {round(100 * n / total)}%" for k, n in top)


def notable_moments(state: RunState, episodes: Episodes) -> list[Moment]:
    """The notable moments of a run, in step order within each engine core: the steps
    with the most preemptions, the longest waits and who took the budget meanwhile, the
    longest run of full-budget prefill steps while others waited, the longest stall.
    Counts per kind: :data:`MOMENTS_PER_KIND`."""
    out: list[Moment] = []
    for idx in sorted(episodes.engines):
        ep = episodes.engines[idx]
        for step, victims in ep.preempting_steps.items()[:MOMENTS_PER_KIND["preemptions"]]:
            n = len(victims)
            who = ", ".join(victims[:3]) + (f" +{n - 3}" if n > 3 else "")
            out.append(Moment("preemptions", idx, step, step, f"{n} preemption{'s' if n != 1 else ''}: {who}",
                              list(victims)))
        for w in ep.all_waits()[:MOMENTS_PER_KIND["wait"]]:
            if w.steps <= 0:
                continue
            takers, _, _ = ep.takers(w.arrival_step, w.first_step, exclude=w.req_id)
            by = "; budget to " + ", ".join(f"{rid} {t:,} tok" for rid, t, _ in takers) if takers else ""
            why = _reasons_text(w.reasons)
            admitted = f"admitted at step {w.first_step}" if w.first_step <= state.engines[idx].last_step \
                else "still waiting"
            out.append(Moment("wait", idx, w.arrival_step, w.first_step,
                              f"{w.req_id} waited {w.steps:,} steps ({admitted}"
                              + (f"; head blocked by {why}" if why else "") + by + ")",
                              [w.req_id] + [rid for rid, _, _ in takers]))
        tl = state.engines[idx].timeline
        for b in tl.prefill_blocks.all()[:MOMENTS_PER_KIND["prefill_block"]]:
            takers = ep.block_takers(b)
            out.append(Moment("prefill_block", idx, b.first_step, b.last_step,
                              f"{b.steps:,} full-budget prefill step{'s' if b.steps != 1 else ''} while up to "
                              f"{b.waiting_max:,} waited" + (": " if takers else "")
                              + ", ".join(f"{rid} {t:,} tok" for rid, t, _ in takers),
                              [rid for rid, _, _ in takers]))
        for st in tl.stalls.all()[:MOMENTS_PER_KIND["stall"]]:
            why = _reasons_text(st.reasons)
            out.append(Moment("stall", idx, st.first_step, st.last_step,
                              f"{st.steps:,} steps scheduled nothing while up to {st.waiting_max:,} waited"
                              + (f" (head blocked by {why})" if why else "")
                              + (f"; head {st.head}" if st.head else ""),
                              [st.head] if st.head else []))
    out.sort(key=lambda m: (m.engine, m.first_step, m.kind))
    return out
