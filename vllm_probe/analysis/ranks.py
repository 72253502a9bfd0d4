"""A run's figures per data-parallel rank, and how the front end spread the work over them.

Each rank of a data-parallel run is an engine core with its own scheduler, requests and KV
cache (:mod:`vllm_probe.runs.ranks`). A rank's figures are the run's figures computed on
that rank's records alone: :func:`analyze_rank` feeds them (:func:`~vllm_probe.runs.ranks.rank_batches`)
to the one analysis, :func:`vllm_probe.analysis.summary.analyze_events`, so a rank's
summary means field for field what the run's summary means, and the doctor's rules read a
rank's state as they read a run's. The run's own figures (every rank together) stay
those of :func:`vllm_probe.analysis.summary.analyze`.

:func:`balance` says how the front end balanced the ranks (vLLM's data-parallel
coordinator sends each request to one rank): each rank's share of the run's requests and
of its scheduled tokens.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from collections.abc import Iterable

from ..runs.ranks import Layout, RankError, layout, rank_batches
from ..runs.reader import ReadStats
from ..runs.rundir import NoEventsError, read_meta
from .figures import share
from .state import RunState, StateListener
from .summary import analyze_events
from .summary_types import Summary


def analyze_rank(run_dir: str | Path, rank: int, stats: ReadStats | None = None,
                 listener: StateListener | None = None, with_summary: bool = True,
                 boundaries: Iterable[int] | None = None, lay: Layout | None = None,
                 ) -> tuple[RunState, Summary | None]:
    """The state and the :class:`~vllm_probe.analysis.summary_types.Summary` of rank
    ``rank`` of the run in ``run_dir`` (its records only; ``listener``, ``with_summary``,
    ``boundaries`` as in :func:`~vllm_probe.analysis.summary.analyze_events`; ``lay``: the
    run's :func:`~vllm_probe.runs.ranks.layout` when the caller has it).

    Raises:
        RankError: the run has no such rank.
        NoEventsError: no readable event of that rank.
    """
    run_dir = Path(run_dir)
    stats = stats if stats is not None else ReadStats()
    streams = (lay or layout(run_dir)).streams(rank)
    result = analyze_events(rank_batches(streams, rank, stats), stats, str(run_dir), read_meta(run_dir), listener,
                            with_summary, boundaries, batched=True)
    if not result[0].engines:
        raise NoEventsError(f"no readable events of data-parallel rank {rank} in {run_dir} ({stats.describe()})")
    return result


def analyze_rank_story(run_dir: str | Path, rank: int, stats: ReadStats | None = None,
                       boundaries: Iterable[int] | None = None) -> tuple[RunState, Summary]:
    """:func:`analyze_rank` with the doctor's episodes following the state and the
    summary's ``moments`` filled, as :func:`vllm_probe.analysis.summary.analyze_story`
    does for the whole run. Raises like :func:`analyze_rank`."""
    return story(run_dir, rank, stats, boundaries)


def story(run_dir: str | Path, rank: int | None = None, stats: ReadStats | None = None,
          boundaries: Iterable[int] | None = None, lay: Layout | None = None,
          ) -> tuple[RunState, Summary]:
    """What ``vllm-probe summary`` shows, in one read: the state and the summary of the run
    (``rank`` None: every rank together) or of one rank, its ``moments`` and its
    ``recompute_counter`` filled. Raises like :func:`analyze_rank` (and
    :func:`~vllm_probe.analysis.summary.analyze` for the run)."""
    from .episodes import Episodes
    from .moments import notable_moments

    if rank is None:  # the command's one pass over the run (analysis/reading.py)
        from .reading import read

        reading = read(run_dir, "summary")
        return reading.state, reading.summary(stats, boundaries, moments=True)
    episodes = Episodes()
    state, summary = analyze_rank(run_dir, rank, stats, listener=episodes, boundaries=boundaries, lay=lay)
    assert summary is not None
    summary.moments = [asdict(m) for m in notable_moments(state, episodes)]
    return state, summary


@dataclass
class RankShare:
    """How much of the run one rank took (the front end's balancing, as recorded).

    Attributes:
        rank: the data-parallel rank (``engine``).
        requests_share: the rank's ``requests_added`` over the run's (0..1; None: no request).
        scheduled_tokens_share: the rank's scheduled tokens (every step's
            ``scheduled_tokens``) over the run's (0..1; None without step events).
    """

    rank: int
    requests_share: float | None
    scheduled_tokens_share: float | None


def balance(whole: Summary, ranks: list[tuple[int, Summary]]) -> list[RankShare]:
    """Each rank's share of the run (``whole``: the run's summary; ``ranks``: each rank's)."""
    out = []
    for rank, s in ranks:
        tokens = (share(s.scheduled_tokens, whole.scheduled_tokens)
                  if s.scheduled_tokens is not None and whole.scheduled_tokens else None)
        out.append(RankShare(rank, share(s.requests_added, whole.requests_added), tokens))
    return out


@dataclass
class RankSummary:
    """One rank's figures for ``summary``'s per-rank section."""

    rank: int
    share: RankShare
    summary: Summary

    def to_dict(self) -> dict[str, Any]:
        """``{"rank", "requests_share", "scheduled_tokens_share", "summary"}`` (docs/reading.md)."""
        return {"rank": self.rank, "requests_share": self.share.requests_share,
                "scheduled_tokens_share": self.share.scheduled_tokens_share, "summary": self.summary.to_dict()}


def rank_summaries(run_dir: str | Path, whole: Summary, boundaries: Iterable[int] | None = None,
                   lay: Layout | None = None) -> list[RankSummary]:
    """Every rank's summary and share of ``whole`` (the run's summary), ranks in order; []
    for a run of one rank. One read of each rank's streams."""
    lay = lay or layout(run_dir)
    if not lay.multi:
        return []
    bounds = list(boundaries) if boundaries is not None else None
    summaries: list[tuple[int, Summary]] = []
    for rank in lay.ids:
        s = analyze_rank(run_dir, rank, boundaries=bounds, lay=lay)[1]
        assert s is not None
        summaries.append((rank, s))
    return [RankSummary(r, sh, s) for (r, s), sh in zip(summaries, balance(whole, summaries))]


__all__ = ["RankError", "RankShare", "RankSummary", "analyze_rank", "analyze_rank_story", "balance",
           "rank_summaries", "story"]
