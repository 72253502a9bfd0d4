"""``vllm-probe run [--settings FILE] [--out DIR] [--live] -- COMMAND [ARGS...]``."""

from __future__ import annotations

import argparse
import sys

from ..runs.launcher import LaunchError, resolve_command, run_foreground
from ..settings import load_settings
from . import CliError, path_arg


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--settings", metavar="FILE", type=path_arg,
                   help="settings.json (or .yaml/.toml) whose scheduler_probe flags choose the events")
    p.add_argument("--out", metavar="DIR", type=path_arg,
                   help="run directory to create (default: a new one under ./vllm-probe-runs/)")
    p.add_argument("--live", action="store_true",
                   help="show the live dashboard; the command's output goes to command.log")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]",
                   help="the command that starts vLLM")


def main(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    settings = load_settings(args.settings)  # errors before anything starts
    if settings.ignored:
        print(f"vllm-probe: {settings.source}: section{'s' if len(settings.ignored) > 1 else ''} "
              f"{', '.join(settings.ignored)} left alone (not the probe's)", file=sys.stderr)
    try:
        resolve_command(command)
        if args.live:
            from ..tui.watch import run_live

            return run_live(command, settings, args.out)
        return run_foreground(command, settings, args.out)
    except LaunchError as e:
        raise CliError(str(e), e.code) from None
