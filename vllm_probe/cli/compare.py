"""``vllm-probe compare RUN_DIR RUN_DIR [...] [--json]``: runs side by side.

The differences and deltas come from :mod:`vllm_probe.analysis.compare`, the table from
:mod:`vllm_probe.tui.compare_view`.

Exit codes: 0 shown; 1 a run holds no readable event; 2 fewer than two runs, or a
RUN_DIR is missing.
"""

from __future__ import annotations

import argparse

from ..analysis.compare import comparison
from ..analysis.summary import summarize
from . import CliError, by_arg, path_arg, print_json, print_report, run_dir_arg


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", type=path_arg,
                   help="two or more run directories; the first is the baseline")
    p.add_argument("--json", action="store_true", help="print the runs' summaries and differences as JSON")
    p.add_argument("--by", type=by_arg, metavar="prompt_len:A,B",
                   help="latency classes by prompt length with these boundaries in tokens "
                        "(default: from the baseline's token budget, the same for every run)")


def main(args: argparse.Namespace) -> int:
    if len(args.run_dirs) < 2:
        raise CliError("compare needs at least two run directories")
    dirs = [run_dir_arg(d) for d in args.run_dirs]
    # every run is split at the same prompt lengths: the baseline's (or the given) boundaries
    base = summarize(dirs[0], boundaries=args.by or None)
    summaries = [base] + [summarize(d, boundaries=base.latency_classes.boundaries) for d in dirs[1:]]
    if args.json:
        print_json(comparison(summaries))
    else:
        from ..tui.compare_view import render

        print_report(lambda _width: render(summaries))
    return 0
