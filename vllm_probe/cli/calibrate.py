"""``vllm-probe calibrate --like RUN_DIR [--out PROFILE.json [--force]] [--max-seconds N] [--model PATH] [--dtype D]``.

Starts the engine ``RUN_DIR`` recorded (model, dtype, ``max_model_len``, block size,
``max_num_seqs``, its KV cache; the vLLM installed here must be the recorded release) in
a child process under the probe, drives it through a designed set of step shapes and
writes a step-time profile (:mod:`vllm_probe.sim.calibrate`, :mod:`vllm_probe.sim.profile`)
to ``--out`` and to the profile cache, where ``whatif`` finds it on its own. Progress goes
to stderr as it happens: the engine's start, then one line per shape group.

``--out`` never replaces an existing file unless ``--force`` (refused in one line before
anything runs); the cache's profile of the same engine is replaced, and a line on stderr
says which.

Exit codes: 0 written; 1 the engine failed or recorded too few steps; 2 bad usage or
input (no run, ``--out`` exists, the model folder gone, another vLLM release); 130
interrupted (nothing written).
"""

from __future__ import annotations

import argparse
import sys

from . import EXIT_NO_EVENTS, CliError, path_arg


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--like", required=True, metavar="RUN_DIR", type=path_arg,
                   help="the recorded run whose engine is calibrated")
    p.add_argument("--out", metavar="PROFILE.json", type=path_arg,
                   help="where the profile goes (it is also stored in the profile cache); an existing file is "
                        "refused unless --force")
    p.add_argument("--force", action="store_true", help="replace an existing --out file")
    p.add_argument("--max-seconds", type=float, default=None, metavar="N",
                   help="time limit of the step sweep, start-up excluded (default 150)")
    p.add_argument("--model", metavar="PATH", help="the model, when the run's command line does not name it")
    p.add_argument("--dtype", metavar="DTYPE", help="the dtype, when the run's command line does not name it")


def main(args: argparse.Namespace) -> int:
    from ..analysis.workload import WorkloadError
    from ..runs.rundir import resolve_run_dir
    from ..sim.calibrate import DEFAULT_MAX_SECONDS, CalibrateError, calibrate
    from ..sim.profile import cache_dir

    if args.max_seconds is not None and args.max_seconds <= 0:
        raise CliError("--max-seconds must be positive")
    run_dir = resolve_run_dir(args.like)

    def log(text: str) -> None:
        print(f"vllm-probe: {text}", file=sys.stderr, flush=True)

    try:
        prof, written = calibrate(run_dir, args.out, args.max_seconds or DEFAULT_MAX_SECONDS, model=args.model,
                                  dtype=args.dtype, log=log, force=args.force)
    except WorkloadError as e:
        raise CliError(str(e)) from None
    except CalibrateError as e:
        text = str(e)
        code = EXIT_NO_EVENTS if text.startswith(("the engine", "the calibration run")) else 2
        raise CliError(text, code=code) from None
    worst = max((r.median_rel_err for r in prof.fit), default=0.0)
    print(f"vllm-probe: profile of {prof.measured_on.model} on {prof.measured_on.hardware} (vLLM "
          f"{prof.measured_on.vllm}): {prof.steps} steps in {prof.seconds:.0f} s, terms {', '.join(prof.terms)}; "
          f"worst region median error {worst * 100:.1f} %", file=sys.stderr)
    for path in written:
        print(path)
    if not args.out:
        print(f"vllm-probe: stored in {cache_dir()}", file=sys.stderr)
    return 0
