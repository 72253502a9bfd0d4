"""``vllm-probe report [RUN_DIR ...] [--whatif DIR] [--tune DIR] [-o FILE]``.

One self-contained HTML page of a run (or of several, side by side on the same axes):
its header and totals, the doctor's findings linked to the stretch of the timeline each
cites, the timelines over steps and over time, the longest prompts' prefill chunks, the
latency distributions by prompt-length class, and with ``--whatif``/``--tune`` each
figure against the changed setting (the replays' intervals where the result has them,
the report's other runs as real points where they were recorded at a replayed setting).
The figures are :mod:`vllm_probe.analysis.report`'s; the page is
:mod:`vllm_probe.html.report` (Bokeh, its scripts inside the page). Needs the ``report``
extra (``pip install 'vllm-probe[report]'``: Bokeh).

The page is written whole (a temporary renamed when complete, mode 0600): an
interrupted report leaves the previous page, or none. Default output:
``report.html`` in the first RUN_DIR.

Exit codes: 0 written; 1 a run holds no readable event, or Bokeh is not installed;
2 bad usage (a missing RUN_DIR, a --whatif/--tune path that holds no result, an output
that cannot be written); 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from . import EXIT_NO_EVENTS, CliError, by_arg, path_arg, run_dir_arg

#: The page's name in the first run's directory when ``-o`` is not given.
DEFAULT_FILE = "report.html"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="*", metavar="RUN_DIR", type=path_arg,
                   help="run directories (default: the latest under ./vllm-probe-runs/); several are drawn side by "
                        "side on the same axes")
    p.add_argument("--whatif", action="append", default=[], metavar="DIR", type=path_arg,
                   help="a whatif result: whatif --out DIR, or a file holding whatif --json")
    p.add_argument("--tune", action="append", default=[], metavar="DIR", type=path_arg,
                   help="a tune result: tune --out DIR (its tune.json), or a file holding tune --json")
    p.add_argument("-o", "--output", metavar="FILE", type=path_arg,
                   help=f"the page (default: {DEFAULT_FILE} in the first RUN_DIR; '-': stdout)")
    p.add_argument("--doctor", action="append", default=[], metavar="FILE", type=path_arg,
                   help="a saved `vllm-probe doctor RUN_DIR --json` of a run: the page shows its plan (replayed); "
                        "without it, the plan of the rules' arithmetic, labelled unchecked")
    p.add_argument("--by", type=by_arg, metavar="prompt_len:A,B",
                   help="latency classes by prompt length with these boundaries in tokens "
                        "(default: a quarter of the token budget and the token budget)")


def main(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("bokeh") is None:
        raise CliError("report draws its charts with Bokeh, which is not installed: pip install 'vllm-probe[report]'",
                       code=EXIT_NO_EVENTS)
    from ..analysis.report import ReportInputError, read_run, read_tune, read_whatif
    from ..html.report import render, write

    run_dirs = [run_dir_arg(d) for d in args.run_dirs] if args.run_dirs else [run_dir_arg(None)]
    for path in args.whatif + args.tune + args.doctor:
        if not Path(path).exists():
            raise CliError(f"{path}: no such file or directory")
    out = args.output or str(run_dirs[0] / DEFAULT_FILE)
    runs = [read_run(d, boundaries=args.by or None) for d in run_dirs]
    _attach_plans(runs, args.doctor)
    try:
        sweeps = [read_whatif(p, runs) for p in args.whatif] + [read_tune(p, runs) for p in args.tune]
    except ReportInputError as e:
        raise CliError(str(e)) from None
    command = ["vllm-probe", "report", *map(str, run_dirs)]
    command += [a for p in args.whatif for a in ("--whatif", p)] + [a for p in args.tune for a in ("--tune", p)]
    command += [a for p in args.doctor for a in ("--doctor", p)]
    if args.by:
        command += ["--by", "prompt_len:" + ",".join(map(str, args.by))]
    page = render(runs, sweeps, command)
    try:
        write(out, page)
    except OSError as e:
        raise CliError(f"cannot write {out}: {e.strerror or e}") from None
    if out != "-":
        findings = sum(len(r.findings) for r in runs)
        print(f"vllm-probe: report of {len(runs)} run(s), {findings} finding(s), {len(sweeps)} sweep(s) -> {out} "
              f"({len(page.encode()) / 1e6:.2f} MB)", file=sys.stderr)
    for r in runs:
        if r.summary.read.get("malformed") or r.summary.read.get("partial") or r.summary.read.get("unknown_kind"):
            print(f"vllm-probe: note: {r.label}: {r.summary.read['text']}", file=sys.stderr)
    return 0


def _attach_plans(runs: list, doctor_files: list[str]) -> None:
    """Each run's plan: from the saved ``doctor --json`` of that run, else the rules'
    arithmetic (:func:`vllm_probe.advice.plan.unchecked_plan`), labelled so. A file is the
    run's when its ``run_dir`` is the run's directory, or, written from another working
    directory, names a directory of the same name (run directories are named by their
    start time and command).

    Raises:
        CliError: a --doctor file that cannot be read, holds no plan, or is of none of the
            report's runs.
    """
    import json

    import msgspec

    from ..advice.plan import unchecked_plan
    from ..analysis.doctor.plan import Plan

    plans: dict[int, Plan] = {}
    for path in doctor_files:
        try:
            data = json.loads(Path(path).read_text())
            of, plan = Path(data["run_dir"]), msgspec.convert(data["plan"], Plan)
        except (OSError, ValueError, KeyError, TypeError, msgspec.ValidationError) as e:
            raise CliError(f"--doctor {path}: not the output of `vllm-probe doctor --json` ({e})") from None
        same = [i for i, r in enumerate(runs) if Path(r.run_dir).resolve() == of.resolve()] \
            or [i for i, r in enumerate(runs) if Path(r.run_dir).name == of.name]
        if len(same) != 1:
            raise CliError(f"--doctor {path}: a doctor of {data['run_dir']}, "
                           f"{'none' if not same else 'more than one'} of this report's runs")
        plans[same[0]] = plan
    for i, r in enumerate(runs):
        r.doctor.plan = plans.get(i) or unchecked_plan(
            r.doctor.findings, "vllm-probe report does not replay; `vllm-probe doctor --json` does (--doctor FILE)")
