"""``vllm-probe export RUN_DIR [-o FILE|-] [--format jsonl|perfetto] [filters]``.

``jsonl`` (default): every engine core's events merged into one stream ordered by
``ts``, verbatim, filtered (see :mod:`vllm_probe.exporters.jsonl`); a ``.gz`` output name is
gzip-compressed. ``perfetto``: a Chrome/Perfetto trace-event JSON timeline (see
:mod:`vllm_probe.exporters.perfetto`; the filters do not apply). Without ``-o`` the output is
``RUN_DIR/events.jsonl`` or ``RUN_DIR/trace.json``; ``-o -`` writes to stdout.

What was read and skipped goes to stderr (one line), so stdout stays clean for pipes.

Exit codes: 0 written; 1 no readable event in the run, or no event matched the filters
(the output is still written, empty); 2 bad usage (unknown kind, bad step range,
missing RUN_DIR, output not writable).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..exporters.jsonl import ExportError, Filters, export_jsonl
from ..runs.reader import ReadStats
from ..runs.rundir import resolve_run_dir
from . import CliError

EXIT_NO_EVENTS = 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR",
                   help="run directory (default: the latest under ./vllm-probe-runs/)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="output file (.gz: compressed; '-': stdout). Default: RUN_DIR/events.jsonl "
                        "or RUN_DIR/trace.json")
    p.add_argument("--format", choices=("jsonl", "perfetto"), default="jsonl",
                   help="jsonl: merged event lines (default); perfetto: trace-event JSON for "
                        "ui.perfetto.dev / chrome://tracing")
    p.add_argument("--events", metavar="KINDS", help="comma-separated event kinds to keep, e.g. chunk,preempt")
    p.add_argument("--request", metavar="ID", help="keep only this request's events")
    p.add_argument("--from-step", type=int, metavar="N", help="first step to keep (per engine core)")
    p.add_argument("--to-step", type=int, metavar="N", help="last step to keep (inclusive)")


def _silence_stdout() -> None:
    """Point stdout at /dev/null so Python's final flush does not complain about the pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass


def _default_output(run_dir: Path, fmt: str) -> Path:
    return run_dir / ("trace.json" if fmt == "perfetto" else "events.jsonl")


def main(args: argparse.Namespace) -> int:
    run_dir = resolve_run_dir(args.run_dir)
    out = args.output or str(_default_output(run_dir, args.format))
    stats = ReadStats()
    try:
        if args.format == "perfetto":
            if any(v is not None for v in (args.events, args.request, args.from_step, args.to_step)):
                raise CliError("--events/--request/--from-step/--to-step apply to --format jsonl only")
            from ..exporters.perfetto import export_perfetto

            result = export_perfetto(run_dir, out, stats=stats)
            written, what = result.trace_events, "trace events"
        else:
            filters = Filters.make(args.events, args.request, args.from_step, args.to_step)
            result = export_jsonl(run_dir, out, filters, stats)
            written, what = result.written, "events"
    except ExportError as e:
        code = EXIT_NO_EVENTS if str(e).startswith("no event") else 2
        raise CliError(str(e), code) from None
    except BrokenPipeError:  # `vllm-probe export RUN -o - | head`: the reader is gone; not an error
        _silence_stdout()
        return 0
    except OSError as e:
        raise CliError(f"cannot write {out}: {e.strerror or e}") from None
    where = "stdout" if out == "-" else out
    print(f"vllm-probe: {stats.describe()} read from {len(stats.files)} file(s); "
          f"{written} {what} written to {where}", file=sys.stderr)
    if stats.events == 0:
        print(f"vllm-probe: error: no readable events in {run_dir}", file=sys.stderr)
        return EXIT_NO_EVENTS
    if written == 0 or (args.format != "perfetto" and result.matched == 0):
        context = " (only the engine_config context was written)" if written else ""
        print(f"vllm-probe: no event matched the filters{context}", file=sys.stderr)
        return EXIT_NO_EVENTS
    return 0
