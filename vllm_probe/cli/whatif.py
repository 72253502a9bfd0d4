"""``vllm-probe whatif [RUN_DIR] --set KEY=V[,V...] ... [--out DIR] [--json] [--jobs N]``.

Replays a recorded run through vLLM's own scheduler at other settings
(:func:`vllm_probe.sim.whatif.predict`) and shows the recorded run, the replay at its
own settings (the baseline, with its error against the recording) and each setting side
by side (:mod:`vllm_probe.tui.whatif_view`). ``--profile PROFILE.json`` (``vllm-probe calibrate``; default: a
matching profile from the cache) gives the step time's shape, ``--arrivals`` the client's
arrival model (detected by default). ``--trace FILE --like RUN_DIR`` replays a
timed trace (vLLM's ``timed_trace`` JSONL) with a recorded run's settings and
step-time model instead. Progress goes to stderr, one line as each replay ends.

Exit codes: 0 shown (also when the baseline is off by more than its threshold: the
report says so); 1 vLLM is not installed, or a replay failed; 2 bad usage or input (an
unknown or impossible setting, a run without request or step events, a bad trace, a
profile that cannot be read or of another engine without ``--force``:
:mod:`vllm_probe.cli.profile_args`).
"""

from __future__ import annotations

import argparse
import sys

from ..runs.rundir import resolve_run_dir
from ..schema.engine_settings import ENGINE_SETTINGS
from . import EXIT_NO_EVENTS, CliError, print_json, print_report, profile_args


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
    print(f"vllm-probe: replaying {run_dir}" + (f" with the requests of {args.trace}" if args.trace else "")
          + f": baseline and {len([g for g in grid if g])} setting(s), {args.jobs} at a time", file=sys.stderr)
    from ..analysis.window import retention_note_of

    retention = retention_note_of(run_dir)
    if retention:
        print(f"vllm-probe: note: {retention} (the replay starts there)", file=sys.stderr)
    try:
        result = predict(run_dir, grid, out=args.out, jobs=args.jobs, trace=args.trace,
                         trace_hash_size=args.trace_hash_size, trace_sec_multiplier=args.trace_sec_multiplier,
                         step_time_scale=args.step_time_scale,
                         profile=profile_args.choice(args), force=args.force, arrivals=args.arrivals,
                         progress=lambda line: print(f"vllm-probe: {line}", file=sys.stderr, flush=True))
    except (SettingError, WorkloadError, TraceError) as e:
        raise CliError(str(e)) from None
    except ProfileRefused as e:
        raise profile_args.refused(e) from None
    except WhatifError as e:
        raise CliError(str(e), code=EXIT_NO_EVENTS) from None
    if args.json:
        print_json(result.to_dict())
    else:
        from ..tui.whatif_view import render

        print_report(lambda width: render(result, width))
    return 0
