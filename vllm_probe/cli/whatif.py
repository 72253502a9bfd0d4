"""``vllm-probe whatif [RUN_DIR] --set KEY=V[,V...] ... [--out DIR] [--json] [--jobs N]``.

Replays a recorded run through vLLM's own scheduler at other settings
(:func:`vllm_probe.sim.whatif.predict`) and shows the recorded run, the replay at its
own settings (the baseline, with its error against the recording) and each setting side
by side (:mod:`vllm_probe.tui.whatif_view`). ``--profile PROFILE.json`` (``vllm-probe calibrate``; default: a
matching profile from the cache) gives the step time's shape, ``--arrivals`` the client's
arrival model (detected by default). ``--trace FILE --like RUN_DIR`` replays a
timed trace (vLLM's ``timed_trace`` JSONL) with a recorded run's settings and
step-time model instead. Progress goes to stderr, one line as each replay ends.

A data-parallel run is replayed one rank at a time, each rank with its own requests and
against its own recorded figures (the front end's balancing across ranks is kept as
recorded, not replayed): ``--rank N`` replays rank N; without it every rank in turn, one
section each (``--json``: ``{"source", "ranks": [one whatif object per rank, each with
its "rank"]}``; docs/whatif.md, Data parallel).

Exit codes: 0 shown (also when the baseline is off by more than its threshold: the
report says so); 1 vLLM is not installed, or a replay failed; 2 bad usage or input (an
unknown or impossible setting, a run without request or step events, a bad trace, a
profile that cannot be read or of another engine without ``--force``:
:mod:`vllm_probe.cli.profile_args`).
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Any

from ..runs.rundir import resolve_run_dir
from ..schema.engine_settings import ENGINE_SETTINGS
from . import EXIT_NO_EVENTS, CliError, add_rank_argument, print_json, print_report, profile_args


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR",
                   help="the recorded run (default: the latest under ./vllm-probe-runs/)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=V[,V...]",
                   help="a setting and its values; several --set give their cartesian product. Keys: "
                        + ", ".join(s.name for s in ENGINE_SETTINGS if s.replayable))
    p.add_argument("--out", metavar="DIR", help="parent of the simulated run directories "
                                                "(default: RUN_DIR-whatif next to the run)")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="replays at once, one process each (default 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object: source, model, baseline, configs")
    p.add_argument("--trace", metavar="FILE", help="replay this timed trace (vllm bench serve's timed_trace JSONL) "
                                                   "instead of the run's own requests; needs --like")
    p.add_argument("--like", metavar="RUN_DIR", help="with --trace: the recorded run whose settings and "
                                                     "step-time model the trace is replayed with")
    p.add_argument("--trace-hash-size", type=int, default=16, metavar="N",
                   help="tokens per hash id in --trace (vLLM's --timed-trace-chunk-hash-size; default 16, "
                        "Mooncake traces 512)")
    p.add_argument("--trace-sec-multiplier", type=float, default=1.0, metavar="X",
                   help="multiplies --trace timestamps into seconds (0.001 for milliseconds)")
    profile_args.add_arguments(p)
    p.add_argument("--arrivals", default="auto", metavar="auto|open|closed:N[:THINK_MS]",
                   help="how the client sent requests: detected (auto, default), open (recorded times) or a "
                        "closed loop of N in flight (each sent when one finishes)")
    p.add_argument("--step-time-scale", type=float, default=1.0, metavar="X",
                   help="multiplies every predicted step time (1.25: the engine 25%% slower than when recorded)")
    add_rank_argument(p, "replay that rank's own requests (default: every rank in turn)")


def main(args: argparse.Namespace) -> int:
    from ..analysis.workload import WorkloadError
    from ..exporters.trace import TraceError
    from ..sim.engine_args import SettingError, parse_sets
    from ..sim.whatif import ProfileRefused, WhatifError, predict, quiet_vllm, require_vllm

    if args.trace and args.run_dir:
        raise CliError("with --trace, name the recorded run with --like, not as RUN_DIR")
    if args.like and not args.trace:
        raise CliError("--like goes with --trace")
    if args.trace and not args.like:
        raise CliError("--trace needs --like RUN_DIR: the recorded run whose settings and step-time model it uses")
    if args.jobs < 1:
        raise CliError("--jobs must be at least 1")
    profile_args.check(args)
    from ..sim.arrivals import ArrivalsError, parse

    try:
        parse(args.arrivals)
    except ArrivalsError as e:
        raise CliError(str(e)) from None
    try:
        grid = parse_sets(args.sets)
        require_vllm()
    except SettingError as e:
        raise CliError(str(e)) from None
    except WhatifError as e:
        raise CliError(str(e), code=EXIT_NO_EVENTS) from None
    run_dir = resolve_run_dir(args.like or args.run_dir)
    quiet_vllm()
    from ..analysis.reading import layout

    lay = layout(run_dir, "summary", "workload")  # one stream: the one pass the replays' preparation reads
    ranks = _ranks(args, run_dir, lay)
    print(f"vllm-probe: replaying {run_dir}" + (f" with the requests of {args.trace}" if args.trace else "")
          + (f", data-parallel rank{'s' if len(ranks) > 1 else ''} {', '.join(str(r) for r in ranks)} (each with its "
             "own requests; the balancing across ranks kept as recorded)" if ranks != [None] else "")
          + f": baseline and {len([g for g in grid if g])} setting(s), {args.jobs} at a time", file=sys.stderr)
    from ..analysis.window import retention_note_of

    retention = retention_note_of(run_dir)
    if retention:
        print(f"vllm-probe: note: {retention} (the replay starts there)", file=sys.stderr)
    results = []
    for rank in ranks:
        if len(ranks) > 1:
            print(f"vllm-probe: data-parallel rank {rank}:", file=sys.stderr, flush=True)
        # one parent per rank under --out: the ranks' baselines must not overwrite one another
        out = f"{args.out}/rank{rank}" if args.out and len(ranks) > 1 else args.out
        try:
            results.append(predict(run_dir, grid, out=out, jobs=args.jobs, trace=args.trace,
                                   trace_hash_size=args.trace_hash_size,
                                   trace_sec_multiplier=args.trace_sec_multiplier,
                                   step_time_scale=args.step_time_scale,
                                   profile=profile_args.choice(args), force=args.force, arrivals=args.arrivals,
                                   progress=lambda line: print(f"vllm-probe: {line}", file=sys.stderr, flush=True),
                                   rank=rank))
        except (SettingError, WorkloadError, TraceError) as e:
            raise CliError(str(e)) from None
        except ProfileRefused as e:
            raise profile_args.refused(e) from None
        except WhatifError as e:
            raise CliError(str(e), code=EXIT_NO_EVENTS) from None
    objects = [r.to_dict() for r in results]  # the --json object of each: saved, and printed with --json
    _save(results, objects)
    _show(args, run_dir, lay.ids, results, objects)
    return 0


#: The ``--json`` object of each result, written beside its replayed runs (what
#: ``vllm-probe report --whatif DIR`` reads: the intervals and notes as whatif gave them).
RESULT_FILE = "whatif.json"


def _save(results: list[Any], objects: list[dict[str, Any]]) -> None:
    """Each result's ``--json`` object (``objects``, in order) as ``RESULT_FILE`` in the folder
    its replays went to (``--out``, its ``rank<N>`` folder, or the default ``RUN_DIR-whatif``),
    written whole, 0600."""
    import json
    from pathlib import Path

    from ..runs.rundir import atomic_file

    for result, obj in zip(results, objects):
        path = Path(result.baseline.run_dir).parent / RESULT_FILE
        try:
            with atomic_file(path, binary=False) as f:
                json.dump(obj, f, indent=2)
        except OSError as e:
            raise CliError(f"cannot write {path}: {e.strerror or e}") from None


def _ranks(args: argparse.Namespace, run_dir: Any, lay: Any) -> list[int | None]:
    """The data-parallel ranks to replay: ``--rank N``'s, every rank of a run of several, or
    ``[None]`` (a run of one rank). Raises RankError for a rank the run does not hold."""
    if args.rank is not None:
        lay.streams(args.rank)
        return [args.rank]
    if not lay.multi:
        return [None]
    if args.trace:
        raise CliError(f"{run_dir} holds data-parallel ranks {', '.join(str(r) for r in lay.ids)}: name the one "
                       "whose settings and step-time model the trace is replayed with (--rank N)")
    return list(lay.ids)


def _show(args: argparse.Namespace, run_dir: Any, ranks: list[int], results: list[Any],
          objects: list[dict[str, Any]]) -> None:
    """The results on stdout: one report (or ``--json`` object: ``objects``), or a section per rank."""
    if args.json:
        print_json(objects[0] if len(objects) == 1 else {"source": str(run_dir), "ranks": objects})
        return
    from ..tui.ranks_view import rank_heading

    for result in results:
        if len(results) > 1:
            head = rank_heading(result.rank, ranks, "replayed with its own requests; the balancing across ranks "
                                "as recorded")
            print_report(functools.partial(_same, head))
        print_report(functools.partial(_render, result))


def _same(renderable: Any, _width: int) -> Any:
    """``renderable`` at any width (a line that does not depend on it)."""
    return renderable


def _render(result: Any, width: int) -> Any:
    """``whatif``'s report of one result (:mod:`vllm_probe.tui.whatif_view`)."""
    from ..tui.whatif_view import render

    return render(result, width)
