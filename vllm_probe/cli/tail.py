"""``vllm-probe tail [RUN_DIR] [--plain] [--replay [SPEED] [--from-step N]]``: watch a run.

Follows a run directory live (the newest under ``./vllm-probe-runs/`` by default),
including event files that appear later (more engine cores, data-parallel ranks), and
shows the dashboard, or with ``--plain`` one text line per step and per preemption.
On a finished run it shows the final state (the whole-run overview, the notable
moments and the doctor's findings); ``--replay`` plays it back, ``--from-step N`` from
the step a finding or a moment names.
"""

from __future__ import annotations

import argparse

from . import CliError, path_arg, run_dir_arg, silence_stdout


def _positive(kind: type):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
        return value
    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR", type=path_arg,
                   help="run directory (default: the newest under ./vllm-probe-runs/)")
    p.add_argument("--plain", action="store_true",
                   help="one text line per step and per preemption, for pipes and logs")
    p.add_argument("--replay", nargs="?", const=1.0, type=_positive(float), metavar="SPEED",
                   help="play the run back at SPEED times its pace (default 1)")
    p.add_argument("--from-step", type=int, metavar="N",
                   help="with --replay: jump to step N at once and play from there")
    p.add_argument("--refresh", type=_positive(float), default=4.0, metavar="HZ",
                   help="dashboard redraws per second (default 4)")
    p.add_argument("--window", type=_positive(int), metavar="STEPS",
                   help="steps in the rolling chart (default: one per column of the terminal)")
    p.add_argument("--engine", type=int, metavar="RANK",
                   help="only this engine core (data-parallel rank)")
    p.add_argument("--no-follow", dest="follow", action="store_false",
                   help="show what the files hold now and exit, even if the run is still live")


def main(args: argparse.Namespace) -> int:
    run_dir = run_dir_arg(args.run_dir)
    from ..tui import watch

    if args.engine is not None and args.engine < 0:
        raise CliError(f"--engine must be >= 0, got {args.engine}")
    if args.from_step is not None and (args.replay is None or args.from_step < 0):
        raise CliError("--from-step N needs --replay and N >= 0 (e.g. tail RUN_DIR --replay --from-step 120)")
    kw = dict(plain=args.plain, refresh_hz=args.refresh, engine=args.engine, chart_steps=args.window)
    try:
        if args.replay is not None:
            return watch.replay(run_dir, args.replay, from_step=args.from_step, **kw)
        return watch.follow(run_dir, keep_following=args.follow, **kw)
    except BrokenPipeError:  # `vllm-probe tail --plain | head`: the reader went away
        silence_stdout()
        return 0
