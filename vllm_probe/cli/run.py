"""``vllm-probe run [--settings FILE] [--out DIR] [--live] [--metrics-port PORT [--metrics-host HOST]]
-- COMMAND [ARGS...]``.

``--metrics-port`` serves the run's Prometheus metrics from this process (never from
the engine core) for as long as the command runs: the port is bound before the run
directory is made, so a port in use is one line and nothing starts; the command's exit
stops the server. With ``--live`` the server serves the dashboard's
:class:`~vllm_probe.analysis.follow.LiveRun` (every line read once, one state). See
:mod:`vllm_probe.cli.metrics` for the same as a sidecar.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..runs.launcher import LaunchError, resolve_command, run_foreground
from ..settings import load_settings
from . import CliError, path_arg
from .metrics import DEFAULT_HOST, port_number, start_server


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--settings", metavar="FILE", type=path_arg,
                   help="settings.json (or .yaml/.toml) whose scheduler_probe flags choose the events")
    p.add_argument("--out", metavar="DIR", type=path_arg,
                   help="run directory to create (default: a new one under ./vllm-probe-runs/)")
    p.add_argument("--live", action="store_true",
                   help="show the live dashboard; the command's output goes to command.log")
    p.add_argument("--metrics-port", type=port_number, metavar="PORT",
                   help="serve Prometheus metrics of the run on http://HOST:PORT/metrics while the command runs")
    p.add_argument("--metrics-host", metavar="HOST",
                   help=f"address of the metrics server (default {DEFAULT_HOST}; 0.0.0.0 for a pod's network)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]",
                   help="the command that starts vLLM")


def main(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    settings = load_settings(args.settings)  # errors before anything starts
    if settings.source is not None and settings.empty:
        print(f"vllm-probe: {settings.source}: no settings in it (every line a comment or blank): the probe's "
              f"defaults apply, and nothing is checked against the run", file=sys.stderr)
    if settings.expected is not None:  # a misspelt engine argument: vLLM will never see it
        from ..analysis.expected import ENGINE_ARG_FIELDS, closest_engine_arg, engine_arg_names

        for name in settings.expected.engine:
            if name not in ENGINE_ARG_FIELDS and name not in engine_arg_names():
                near = closest_engine_arg(name)
                print(f"vllm-probe: {settings.source}: {name} is not an engine argument of vLLM"
                      + (f" (did you mean {near}?)" if near else "") + "; the run goes on without it",
                      file=sys.stderr)
    if settings.ignored:
        print(f"vllm-probe: {settings.source}: section{'s' if len(settings.ignored) > 1 else ''} "
              f"{', '.join(settings.ignored)} left alone (not the probe's)", file=sys.stderr)
    if args.metrics_host is not None and args.metrics_port is None:
        raise CliError("--metrics-host needs --metrics-port")
    try:
        resolve_command(command)
    except LaunchError as e:
        raise CliError(str(e), e.code) from None
    server = None
    if args.metrics_port is not None:
        server = start_server(args.metrics_host or DEFAULT_HOST, args.metrics_port)
    try:
        on_start = None
        if server is not None:
            def on_start(run_dir: Path) -> None:
                if not args.live:  # with --live the server attaches to the dashboard's LiveRun: one read
                    server.follow(run_dir)
                print(f"vllm-probe: metrics -> {server.url}", file=sys.stderr, flush=True)
        if args.live:
            from ..tui.watch import run_live

            return run_live(command, settings, args.out, on_start=on_start,
                            on_live=server.attach if server is not None else None)
        return run_foreground(command, settings, args.out, on_start=on_start)
    except LaunchError as e:
        raise CliError(str(e), e.code) from None
    finally:
        if server is not None:
            server.close()
