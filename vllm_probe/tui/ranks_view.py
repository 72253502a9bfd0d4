"""A data-parallel run's ranks, drawn: ``summary``'s per-rank table and the line heading
each rank's section of ``summary --rank``, ``doctor`` and ``whatif``. No computation here:
each rank's figures are its summary (:mod:`vllm_probe.analysis.ranks`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from ..analysis.recompute import VLLM_METRIC
from ..analysis.summary_types import Summary
from .format import count, duration, pct


def rank_heading(rank: int | None, ranks: Sequence[int], what: str, width: int = 120) -> RenderableType:
    """``data-parallel rank 1 of ranks 0, 1 · WHAT``: the head of one rank's section."""
    if rank is None:
        return Text("")
    return Text.assemble(("data-parallel rank ", "bold"), (str(rank), "bold cyan"),
                         (f" of ranks {', '.join(str(r) for r in ranks)}", "dim"), (f" · {what}", "dim"))


def ranks_table(rows: Sequence[Any], width: int = 120) -> RenderableType:
    """One row per rank (:class:`~vllm_probe.analysis.ranks.RankSummary`): its share of the
    run's requests and scheduled tokens (the front end's balancing), steps, requests,
    preemptions, recomputed tokens, queues and latency."""
    t = Table(title="Data-parallel ranks (each rank's own events; the run's figures above are every rank together)",
              title_justify="left", title_style="bold underline", box=box.SIMPLE, pad_edge=False)
    for name in ("rank", "requests", "share", "tokens share", "steps", "preemptions", "recomputed tok",
                 "most running", "most waiting", "budget use p50", "TTFT p50", "TTFT p90", "bound by"):
        t.add_column(name, justify="left" if name in ("rank", "bound by") else "right", no_wrap=True)
    for row in rows:
        s = row.summary
        t.add_row(str(row.rank), f"{count(s.requests_added)} ({count(s.requests_finished)} done)",
                  pct(row.share.requests_share), pct(row.share.scheduled_tokens_share), count(s.steps),
                  count(s.preemptions.count), count(s.preemptions.recomputed_tokens),
                  count(s.queues.running.max), count(s.queues.waiting.max), pct(s.budget_use.median),
                  duration(s.latency.ttft_s.median), duration(s.latency.ttft_s.p90), s.bound_most or "-")
    return t


def recompute_line(s: Summary) -> RenderableType:
    """vLLM's own recompute counter beside the probe's count of the same positions (the
    summary's ``recompute_counter``, :class:`~vllm_probe.analysis.recompute.RecomputeCheck`)
    and the summary's recomputed tokens (every token of the resumed passes)."""
    check = s.recompute_counter or {}
    agree = check.get("agree")
    return Text.assemble(
        ("vLLM's recompute counter ", "bold"), (f"({VLLM_METRIC}) ", "dim"),
        (f"{count(check.get('engine_tokens'))} tok", "bold"), " · the probe's count of the same positions ",
        (f"{count(check.get('probe_tokens'))} tok", "bold"),
        (" (equal)" if agree else " (DIFFER: docs/reading.md, Recompute counter)", "green" if agree else "bold red"),
        (f" · recomputed tokens {count(s.preemptions.recomputed_tokens)} (whole re-prefills, the last sampled "
         "token of each included)", "dim"))


__all__ = ["rank_heading", "ranks_table", "recompute_line"]
