"""``vllm-probe tune [RUN_DIR] --slo FIGURE<=VALUE [...] --knob NAME=LO..HI|V1,V2,... [...]
[--maximize FIGURE | --minimize FIGURE] [--jobs N] [--ray ADDRESS] [--out DIR] [--json]
[--profile PROFILE.json | --no-profile] [--force]``.

Searches settings against service-level objectives by replaying the recorded run through
vLLM's own scheduler (:mod:`vllm_probe.advice.tune`; docs/tune.md). Prints the baseline's
error (how far to trust the replay), what was evaluated, and the recommendation with the
flags to apply and the ``vllm serve`` line; when nothing in range meets the SLOs, the
closest setting and what it would take. ``--json``: one object (``source``, ``slo``,
``knobs``, ``baseline``, ``evaluated``, ``recommended``). ``--out DIR``: the replayed
run directories and ``tune.json``, written under a temporary name and renamed when the
search is complete (Ctrl-C leaves nothing half-written). ``--profile``/``--no-profile``/
``--force``: the step-time model of every replay, as ``whatif``'s
(:mod:`vllm_probe.cli.profile_args`); the report says which was used and the share of
each replay's steps outside its fitted region. ``--rank N``: one data-parallel rank of the
run, replayed with its own requests (a run of several ranks needs it).

Exit codes: 0 a recommendation; 3 nothing in range meets the SLOs; 1 vLLM is not
installed, or the run cannot be replayed; 2 bad usage (``--slo``/``--knob`` syntax, a
knob value out of range or refused by vLLM, a profile that cannot be read or of another
engine without ``--force``); 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from ..runs.rundir import resolve_run_dir
from . import EXIT_NO_EVENTS, CliError, add_rank_argument, path_arg, print_json, print_report, profile_args

#: Exit code when no setting in range meets the SLOs.
EXIT_INFEASIBLE = 3


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR",
                   help="the recorded run (default: the latest under ./vllm-probe-runs/)")
    p.add_argument("--slo", action="append", default=[], metavar="FIGURE<=VALUE",
                   help="a service-level objective, e.g. ttft_p90<=0.6s, itl_p90<=50ms, preemptions<=0 "
                        "(figures: ttft_p50, ttft_p90, ttft_p99, itl_p90, e2e_p90, queue_p90, preemptions, ...)")
    p.add_argument("--knob", action="append", default=[], metavar="NAME=LO..HI|V1,V2,...",
                   help="a setting to search, by whatif --set names, e.g. max_num_batched_tokens=512..4096")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--maximize", metavar="FIGURE", help="objective to maximize (default: output_tokens_per_s)")
    g.add_argument("--minimize", metavar="FIGURE", help="objective to minimize, e.g. num_kv_blocks")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="replays at once, one process each (default 1)")
    p.add_argument("--ray", metavar="ADDRESS", help="run the replays as tasks of this Ray cluster")
    p.add_argument("--budget", type=float, default=None, metavar="S",
                   help="seconds of replays before the search stops with the best so far (default 600)")
    p.add_argument("--out", type=path_arg, metavar="DIR", help="keep the replayed runs and tune.json here")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    profile_args.add_arguments(p)
    add_rank_argument(p, "search settings for that rank, replaying its own requests (needed on a data-parallel run)")


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def _rank_run(run_dir: Path, rank: int | None) -> tuple[Path, Any]:
    """The run the replays read: ``run_dir`` itself, or for ``--rank N`` of a data-parallel
    run rank N's own events as a run of one engine core (:func:`vllm_probe.runs.ranks.rank_view`,
    in a temporary directory returned to clean up; None when there is none).

    Raises:
        CliError: a run of several ranks without ``--rank``.
        RankError: a rank the run does not hold.
    """
    from ..analysis.reading import layout
    from ..runs.ranks import rank_view

    lay = layout(run_dir, "summary", "rows", "workload")  # one stream: the one pass the evaluator reads
    if rank is None and lay.multi:
        raise CliError(f"{run_dir} holds data-parallel ranks {', '.join(str(r) for r in lay.ids)}; tune replays one "
                       "engine core: --rank N searches rank N's settings on its own requests")
    if rank is None:
        return run_dir, None
    lay.streams(rank)
    if not lay.multi:
        return run_dir, None
    import tempfile

    view = tempfile.TemporaryDirectory(prefix="vllm-probe-rank-")
    return rank_view(run_dir, rank, Path(view.name) / f"rank{rank}", lay), view


def main(args: argparse.Namespace) -> int:
    from ..advice import tune as tuning
    from ..advice.evaluate import EvaluateError, Evaluator, ProfileRefused

    try:
        slos, knobs = tuning.parse_all(args.slo, args.knob)
        if not knobs:
            raise tuning.TuneError("give at least one --knob NAME=LO..HI or NAME=V1,V2,...")
        name = args.minimize or args.maximize or "output_tokens_per_s"
        tuning.objective(name)
    except (tuning.TuneError, ValueError) as e:
        raise CliError(str(e)) from None
    direction = "minimize" if args.minimize else "maximize"
    if args.jobs < 1:
        raise CliError(f"--jobs must be >= 1, got {args.jobs}")
    if args.budget is not None and args.budget <= 0:
        raise CliError(f"--budget must be positive, got {args.budget:g}")
    profile_args.check(args)
    if not vllm_available():
        raise CliError("tune replays the run through vLLM's own scheduler and needs vLLM installed here "
                       "(pip install vllm)", code=EXIT_NO_EVENTS)
    recorded = resolve_run_dir(args.run_dir)
    run_dir, view = _rank_run(recorded, args.rank)
    out = Path(args.out) if args.out else None
    tmp = None
    if out is not None:
        if out.exists() and any(out.iterdir()) and not (out / "tune.json").exists():
            raise CliError(f"--out {out} exists and is not a tune output; choose another")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"vllm-probe: tune {run_dir}: replaying through vLLM's scheduler ({args.jobs} at a time"
          + (f", on Ray {args.ray}" if args.ray else "") + ") …", file=sys.stderr, flush=True)
    try:
        try:
            evaluator = Evaluator(run_dir, jobs=args.jobs, ray_address=args.ray,
                                  out=None if tmp is None else tmp / "replays",
                                  profile=profile_args.choice(args), force=args.force)
        except ProfileRefused as e:
            raise profile_args.refused(e) from None
        except EvaluateError as e:
            raise CliError(str(e), code=EXIT_NO_EVENTS) from None
        try:
            result = tuning.tune(evaluator, slos, knobs, name, direction,
                                 args.budget if args.budget is not None else tuning.DEFAULT_BUDGET_S,
                                 progress=lambda line: print(f"vllm-probe: {line}", file=sys.stderr, flush=True))
        except tuning.TuneError as e:
            raise CliError(str(e)) from None
        finally:
            evaluator.close()
        d = result.to_dict()
        if view is not None:  # the rank's view is a temporary directory: name the run and the rank
            d["source"], d["rank"] = str(recorded), args.rank
        if tmp is not None and out is not None:
            (tmp / "tune.json").write_text(json.dumps(d, indent=2) + "\n")
            if out.exists():
                shutil.rmtree(out)
            os.replace(tmp, out)
            tmp = None
    finally:
        if tmp is not None:  # interrupted or failed: nothing half-written stays
            shutil.rmtree(tmp, ignore_errors=True)
        if view is not None:
            view.cleanup()
    if args.json:
        print_json(d)
    else:
        from ..tui.tune_view import render

        print_report(lambda _width: render(d))
    return 0 if result.recommended is not None else EXIT_INFEASIBLE
