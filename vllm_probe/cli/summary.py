"""``vllm-probe summary RUN_DIR [--json] [--rank N]``: one screen on a finished (or running) run.

The figures come from :func:`vllm_probe.analysis.ranks.story` (the summary of
:mod:`vllm_probe.analysis.summary`, definitions there; the notable moments are the
doctor's analysis; vLLM's own recompute counter beside the probe's count,
:mod:`vllm_probe.analysis.recompute`) and are drawn by
:mod:`vllm_probe.tui.summary_view`, with the whole-run overview; ``--json`` prints
:meth:`~vllm_probe.analysis.summary.Summary.to_dict` instead.

Data parallel (:mod:`vllm_probe.analysis.ranks`): on a run of several ranks the figures
are every rank's together, followed by one row per rank (its own events: steps,
requests, its share of the run's requests and scheduled tokens, preemptions, queues,
latency); ``--json`` adds ``ranks``, one object per rank with its shares and its whole
summary (docs/reading.md, Data-parallel ranks). ``--rank N`` shows rank N alone, the
same screen and the same JSON object as a run of one engine core, with ``rank`` added.

``--json`` has ``recompute_counter``: the recomputed token positions by the probe's count
and by vLLM's own ``vllm:recomputed_token_executions_total`` where the engine exposed it
(``engine_tokens`` null otherwise), and whether they agree; the screen shows them when the
engine exposed it.

Exit codes: 0 shown; 1 the run holds no readable event; 2 RUN_DIR missing, or no such rank.
Skipped lines (partial last line, not JSON, unknown kind) are reported, not fatal.
"""

from __future__ import annotations

import argparse
import sys

from . import add_rank_argument, by_arg, path_arg, print_json, print_report, run_dir_arg


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR", type=path_arg,
                   help="run directory (default: the latest under ./vllm-probe-runs/)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--by", type=by_arg, metavar="prompt_len:A,B",
                   help="latency classes by prompt length with these boundaries in tokens "
                        "(default: a quarter of the token budget and the token budget)")
    add_rank_argument(p, "its figures alone")


def main(args: argparse.Namespace) -> int:
    from ..analysis.ranks import rank_summaries, story
    from ..runs.ranks import layout

    run_dir = run_dir_arg(args.run_dir)
    if args.rank is None:  # the whole run: its layout from the one pass that story() reads
        from ..analysis.reading import read

        lay = read(run_dir, "summary").layout
    else:
        lay = layout(run_dir)
    boundaries = args.by or None
    state, s = story(run_dir, args.rank, boundaries=boundaries, lay=lay)
    ranks = rank_summaries(run_dir, s, boundaries, lay) if args.rank is None else []
    if args.json:
        out = s.to_dict()
        if args.rank is not None:
            out["rank"] = args.rank
        elif ranks:
            out["ranks"] = [r.to_dict() for r in ranks]
        print_json(out)
    else:
        from ..tui.ranks_view import rank_heading, ranks_table, recompute_line
        from ..tui.summary_view import render

        engines = [state.engines[i] for i in state.engine_ids()]
        if args.rank is not None and lay.multi:
            print_report(lambda width: rank_heading(args.rank, lay.ids, "its own events only", width))
        print_report(lambda width: render(s, width, engines))
        if s.recompute_counter and s.recompute_counter["engine_tokens"] is not None:
            print_report(lambda width: recompute_line(s))
        if ranks:
            print_report(lambda width: ranks_table(ranks, width))
    if s.read.get("malformed") or s.read.get("partial") or s.read.get("unknown_kind"):
        print(f"vllm-probe: note: {s.read['text']}", file=sys.stderr)
    clash = lay.clash_note()
    if clash:
        print(f"vllm-probe: note: {clash}", file=sys.stderr)
    return 0
