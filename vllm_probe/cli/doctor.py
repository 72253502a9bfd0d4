"""``vllm-probe doctor [RUN_DIR] [--json] [--whatif] [--expect FILE]``: what went wrong in
a run, the evidence, and what to change.

The findings come from :mod:`vllm_probe.analysis.doctor` (the catalogue of rules, docs/doctor.md),
the report from :mod:`vllm_probe.tui.doctor_view`. ``--json`` prints ``{"run_dir",
"findings": [{"id", "severity", "message", "evidence", "remedy", "predicted"}]}``.
``--expect FILE`` checks the settings a ``config.toml`` (``[scheduler]``), a
``settings.json`` or a YAML of engine arguments expected (default: what ``vllm-probe run
--settings`` recorded in ``meta.json``). ``--whatif`` replays each remedy's settings
through the what-if replay (``vllm-probe whatif``) and shows predicted against recorded
figures.

Exit codes: 0 no critical finding; 3 a critical finding (so it can gate a CI job or a
canary); 1 the run holds no readable event; 2 RUN_DIR or FILE missing, bad usage.
"""

from __future__ import annotations

import argparse
import sys

from ..analysis.doctor import examine
from ..analysis.doctor import predict as predicting
from ..runs.rundir import resolve_run_dir
from ..settings import load_expected
from . import CliError, print_json, print_report

#: Exit code when a finding is critical.
EXIT_CRITICAL = 3


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR",
                   help="run directory, recorded or simulated (default: the latest under ./vllm-probe-runs/)")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument("--expect", metavar="FILE",
                   help="settings the engine should have run with: config.toml ([scheduler]), settings.json, "
                        "or a YAML of vLLM engine arguments (default: what `run --settings` recorded)")
    p.add_argument("--whatif", action="store_true",
                   help="replay each remedy's settings (vllm-probe whatif) and show predicted against recorded figures")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="--whatif: replays in parallel (default 1)")
    p.add_argument("--out", metavar="DIR", help="--whatif: where the replayed run directories go")


def _predict_function():
    """The what-if replay's ``predict``, or a one-line error when vLLM is missing."""
    from ..sim.whatif import WhatifError, predict, quiet_vllm, require_vllm

    try:
        require_vllm()
    except WhatifError as e:
        raise CliError(f"doctor --whatif replays through vLLM's own scheduler: {e}") from None
    quiet_vllm()
    return predict


def _replay(predict, run_dir, settings, out, jobs):
    """``predict(run_dir, settings)``, or the replay's error as one line (a run it cannot
    replay, settings vLLM's checks refuse): the findings are reported all the same."""
    from ..analysis.workload import WorkloadError
    from ..sim.engine_args import SettingError
    from ..sim.whatif import WhatifError

    try:
        return predict(str(run_dir), settings, out=out, jobs=jobs), None
    except (SettingError, WorkloadError, WhatifError) as e:
        return None, str(e)


def main(args: argparse.Namespace) -> int:
    run_dir = resolve_run_dir(args.run_dir)
    if args.jobs < 1:
        raise CliError(f"--jobs must be >= 1, got {args.jobs}")
    expected = load_expected(args.expect) if args.expect else None
    if expected is not None and not expected.engine:
        print(f"vllm-probe: {expected.source}: no engine setting in it ([scheduler] section or engine arguments): "
              f"nothing to check against the run", file=sys.stderr)
    predict = _predict_function() if args.whatif else None
    report = examine(run_dir, expected)
    if predict is not None:
        settings = predicting.grid(report.findings)
        if settings:
            print(f"vllm-probe: replaying {len(settings)} remedy setting(s) with the what-if replay …",
                  file=sys.stderr, flush=True)
            result, error = _replay(predict, run_dir, settings, args.out, args.jobs)
            if error is None:
                # the replay summarized the recorded run already (its baseline's reference)
                predicting.attach(report.findings, predicting.figure_of(result, "recorded"), settings, result)
            else:
                predicting.attach_error(report.findings, f"the replay could not run: {error}")
                print(f"vllm-probe: doctor --whatif: {error}", file=sys.stderr)
    if args.json:
        print_json(report.to_dict())
    else:
        from ..tui.doctor_view import render_report

        print_report(lambda width: render_report(report, width))
    if report.stats.malformed or report.stats.partial or report.stats.unknown_kind:
        print(f"vllm-probe: note: {report.stats.describe()}", file=sys.stderr)
    from ..analysis.window import retention_note

    retention = retention_note(report.state) if getattr(report, "state", None) is not None else None
    if retention:
        print(f"vllm-probe: note: {retention}", file=sys.stderr)
    return EXIT_CRITICAL if report.critical else 0
