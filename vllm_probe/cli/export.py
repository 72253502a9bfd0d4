"""``vllm-probe export RUN_DIR [-o FILE|-] [--format FORMAT] [filters]``.

The formats are the registry of :mod:`vllm_probe.exporters.base`: ``jsonl`` (default;
every engine core's events merged into one stream ordered by ``ts``, verbatim, filtered,
see :mod:`vllm_probe.exporters.jsonl`), ``perfetto`` (a Chrome/Perfetto timeline,
:mod:`vllm_probe.exporters.perfetto`) and ``trace`` (the workload as vLLM's timed trace
for ``vllm bench serve --dataset-name timed_trace``, :mod:`vllm_probe.exporters.trace`) and
``parquet`` (one Parquet table per record type in the folder ``-o DIR``, for SQL over many
runs, :mod:`vllm_probe.exporters.parquet`); the filters apply to ``jsonl`` only. A ``.gz``
output name is gzip-compressed. Without
``-o`` the output is the format's file in RUN_DIR (``events.jsonl``, ``trace.json``,
``trace.jsonl``); ``-o -`` writes to stdout.

What was read and skipped goes to stderr (one line), so stdout stays clean for pipes.

Exit codes: 0 written; 1 no readable event in the run, or no event matched the filters
(the output is still written, empty); 2 bad usage (unknown kind, bad step range,
missing RUN_DIR, output not writable).
"""

from __future__ import annotations

import argparse
import sys

from ..exporters import exporters
from ..exporters.base import ExportError
from ..exporters.jsonl import Filters
from ..runs.ids import resolve_request_id
from ..runs.reader import ReadStats
from ..runs.rundir import NoEventsError
from . import EXIT_NO_EVENTS, CliError, path_arg, run_dir_arg


def add_arguments(p: argparse.ArgumentParser) -> None:
    formats = exporters()
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR", type=path_arg,
                   help="run directory (default: the latest under ./vllm-probe-runs/)")
    p.add_argument("-o", "--output", metavar="FILE", type=path_arg,
                   help="output file (.gz: compressed; '-': stdout). Default: the format's file in RUN_DIR ("
                        + ", ".join(f.default_file for f in formats.values()) + ")")
    p.add_argument("--format", choices=tuple(formats), default="jsonl",
                   help="; ".join(f"{name}: {f.help}" for name, f in formats.items()))
    p.add_argument("--events", metavar="KINDS", help="comma-separated event kinds to keep, e.g. chunk,preempt")
    p.add_argument("--request", metavar="ID", help="keep only this request's events (the id, or a unique start of it)")
    p.add_argument("--from-step", type=int, metavar="N", help="first step to keep (per engine core)")
    p.add_argument("--to-step", type=int, metavar="N", help="last step to keep (inclusive)")


def main(args: argparse.Namespace) -> int:
    run_dir = run_dir_arg(args.run_dir)
    exporter = exporters()[args.format]
    out = args.output or str(run_dir / exporter.default_file)
    request = args.request
    if request is not None and exporter.takes_filters:
        request = resolve_request_id(run_dir, request)
        if request != args.request:
            print(f"vllm-probe: request {args.request} is {request}", file=sys.stderr)
    filters = Filters.make(args.events, request, args.from_step, args.to_step)
    if filters.active and not exporter.takes_filters:
        takers = " / ".join(name for name, f in exporters().items() if f.takes_filters)
        raise ExportError(f"--events/--request/--from-step/--to-step apply to --format {takers} only")
    stats = ReadStats()
    try:
        result = exporter.export(run_dir, out, filters, stats)
    except (NoEventsError, ExportError, BrokenPipeError):
        raise
    except OSError as e:
        raise CliError(f"cannot write {out}: {e.strerror or e}") from None
    where = "stdout" if out == "-" else out
    print(f"vllm-probe: {stats.describe()} read from {len(stats.files)} file(s); "
          f"{result.written} {result.unit} written to {where}", file=sys.stderr)
    if result.note:
        print(f"vllm-probe: {result.note}", file=sys.stderr)
    from ..analysis.window import retention_note_of

    retention = retention_note_of(run_dir)
    if retention:
        print(f"vllm-probe: note: {retention}", file=sys.stderr)
    if stats.events == 0:
        print(f"vllm-probe: error: no readable events in {run_dir}", file=sys.stderr)
        return EXIT_NO_EVENTS
    if result.matched == 0:
        context = " (only the engine_config context was written)" if result.written else ""
        print(f"vllm-probe: no event matched the filters{context}", file=sys.stderr)
        return EXIT_NO_EVENTS
    return 0
