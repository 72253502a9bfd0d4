"""``vllm-probe summary RUN_DIR [--json]``: one screen on a finished (or running) run.

The figures come from :func:`vllm_probe.analysis.summary.analyze_story` (definitions
there; the notable moments are the doctor's analysis) and are drawn by
:mod:`vllm_probe.tui.summary_view`, with the whole-run overview; ``--json`` prints
:meth:`~vllm_probe.analysis.summary.Summary.to_dict` instead.

Exit codes: 0 shown; 1 the run holds no readable event; 2 RUN_DIR missing.
Skipped lines (partial last line, not JSON, unknown kind) are reported, not fatal.
"""

from __future__ import annotations

import argparse
import sys

from ..analysis.summary import analyze_story
from . import by_arg, path_arg, print_json, print_report, run_dir_arg


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR", type=path_arg,
                   help="run directory (default: the latest under ./vllm-probe-runs/)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--by", type=by_arg, metavar="prompt_len:A,B",
                   help="latency classes by prompt length with these boundaries in tokens "
                        "(default: a quarter of the token budget and the token budget)")


def main(args: argparse.Namespace) -> int:
    state, s = analyze_story(run_dir_arg(args.run_dir), boundaries=args.by or None)
    if args.json:
        print_json(s.to_dict())
    else:
        from ..tui.summary_view import render

        engines = [state.engines[i] for i in state.engine_ids()]
        print_report(lambda width: render(s, width, engines))
    if s.read.get("malformed") or s.read.get("partial") or s.read.get("unknown_kind"):
        print(f"vllm-probe: note: {s.read['text']}", file=sys.stderr)
    return 0
