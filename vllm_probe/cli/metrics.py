"""``vllm-probe metrics [RUN_DIR] --port PORT [--host HOST]``: a run's Prometheus metrics.

Serves ``http://HOST:PORT/metrics`` for a run directory written by a server started
elsewhere: a sidecar next to a vLLM pod that shares the run directory's volume, or a
finished run (its totals). It follows the directory as ``tail`` does, files that appear
later included, until SIGTERM or Ctrl-C (exit 0). The metrics and their sources:
docs/metrics.md; the server: :mod:`vllm_probe.exporters.prometheus` (the extra
``vllm-probe[metrics]`` installs prometheus_client).

Exit codes: 0 stopped by SIGTERM/SIGINT; 2 RUN_DIR missing, or the address cannot be
served (port in use, not allowed, unknown host), or prometheus_client missing.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import TYPE_CHECKING

from ..runs.rundir import resolve_run_dir
from . import CliError

if TYPE_CHECKING:
    from ..exporters.prometheus import MetricsServer

#: Default address (loopback; a sidecar serving a pod's network passes --host 0.0.0.0).
DEFAULT_HOST = "127.0.0.1"


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0..65535 (0: any free port)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0..65535, got {port}")
    return port


def start_server(host: str, port: int) -> MetricsServer:
    """Bind the metrics server (shared by ``run --metrics-port``).

    Raises:
        CliError: prometheus_client is missing, or the address cannot be bound.
    """
    try:
        from ..exporters.prometheus import MetricsServer
    except ImportError as e:
        raise CliError(f"serving metrics needs prometheus_client ({e}); "
                       "install it with: pip install 'vllm-probe[metrics]'") from None
    try:
        return MetricsServer(host, port)
    except OSError as e:  # in use, not allowed, unknown host: one line, before anything starts
        raise CliError(f"cannot serve metrics on {host}:{port}: {e.strerror or e}") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR",
                   help="run directory (default: the newest under ./vllm-probe-runs/)")
    p.add_argument("--port", type=port_number, required=True, metavar="PORT",
                   help="TCP port of the /metrics endpoint (0: any free port, printed)")
    p.add_argument("--host", default=DEFAULT_HOST, metavar="HOST",
                   help=f"address to listen on (default {DEFAULT_HOST}; 0.0.0.0 for a pod's network)")


def main(args: argparse.Namespace) -> int:
    run_dir = resolve_run_dir(args.run_dir)
    stop = threading.Event()
    handlers = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with start_server(args.host, args.port) as server:
            server.follow(run_dir)
            print(f"vllm-probe: metrics of {run_dir} -> {server.url} (Ctrl-C stops)", file=sys.stderr, flush=True)
            while not stop.wait(0.5):
                pass
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return 0
