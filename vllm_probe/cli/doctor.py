"""``vllm-probe doctor [RUN_DIR] [--json] [--no-replay] [--expect FILE] [--jobs N] [--ray ADDRESS]
[--budget S] [--whole-run] [--profile PROFILE.json | --no-profile] [--force]``: what went wrong in a run,
the evidence, and what to change.

The findings come from :mod:`vllm_probe.analysis.doctor` (the catalogue of rules, docs/doctor.md),
the report from :mod:`vllm_probe.tui.doctor_view`. ``--json`` prints ``{"run_dir",
"findings": [{"id", "severity", "message", "evidence", "remedy", "predicted"}]}``:
``remedy`` is the top choice (``setting``, ``value``, ``whatif``, ``arithmetic``,
``tradeoff``, ``source``, ``checked``, ``predicted``, ``began_at``, ``alternatives``
each with its own ``predicted``), ``predicted`` the search (goal, recorded and baseline
figures, what was tried; :mod:`vllm_probe.advice.remedies`).
``--expect FILE`` checks the settings a ``config.toml`` (``[scheduler]``), a
``settings.json`` or a YAML of engine arguments expected (default: what ``vllm-probe run
--settings`` recorded in ``meta.json``).

With vLLM installed each remedy is chosen by replaying the run through vLLM's own
scheduler (the smallest change that reaches the finding's goal; ``--budget`` seconds of
replays, default 60; a goal whose figure lies in one stretch of the run between idle
moments is searched on that stretch alone, ``predicted["stretch"]``, unless
``--whole-run``); ``--no-replay`` (or no vLLM) gives the rules' arithmetic, marked
``"checked": false``. ``--whatif`` is an accepted alias of the default. ``--profile``/
``--no-profile``/``--force``: the replay's step-time model, as ``whatif``'s
(:mod:`vllm_probe.cli.profile_args`); ``--json`` then has ``step_time_model`` (``source``:
``profile``, ``cache`` or ``recording``; ``profile``; ``forced``) and each prediction its
``outside_region`` (the share of its replay's steps outside the model's fitted region).

Data parallel: on a run of several ranks the findings are every rank's, each naming its
rank (``evidence.engine``), and the report has one section per rank; they are not
replayed (the replay runs one engine core). ``--rank N`` examines rank N alone (its own
events) and searches its remedies by replaying its own requests, as the front end sent
them to it (the balancing across ranks kept as recorded). ``--json`` then has ``ranks``
(the run's ranks) and ``rank`` (the one examined, null for all together).

Exit codes: 0 no critical finding; 3 a critical finding (so it can gate a CI job or a
canary); 1 the run holds no readable event; 2 RUN_DIR or FILE missing, bad usage, a
profile that cannot be read or of another engine without ``--force``.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from ..analysis.doctor import examine
from ..runs.rundir import resolve_run_dir
from ..settings import load_expected
from . import CliError, add_rank_argument, print_json, print_report, profile_args

#: Exit code when a finding is critical.
EXIT_CRITICAL = 3


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR",
                   help="run directory, recorded or simulated (default: the latest under ./vllm-probe-runs/)")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument("--expect", metavar="FILE",
                   help="settings the engine should have run with: config.toml ([scheduler]), settings.json, "
                        "or a YAML of vLLM engine arguments (default: what `run --settings` recorded)")
    p.add_argument("--no-replay", action="store_true",
                   help="do not choose the remedies by replaying the run; give the rules' arithmetic, unchecked")
    p.add_argument("--whatif", action="store_true", help="choose the remedies by the replay (the default with vLLM)")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="replays in parallel (default 1)")
    p.add_argument("--ray", metavar="ADDRESS", help="run the replays as tasks of this Ray cluster")
    p.add_argument("--budget", type=float, default=None, metavar="S",
                   help="seconds of replays for the remedy search, every finding together (default 60)")
    p.add_argument("--out", metavar="DIR", help="keep the replayed run directories here")
    p.add_argument("--whole-run", action="store_true",
                   help="replay the whole run for every remedy, not only the stretch between idle moments "
                        "that holds what a finding's goal counts")
    profile_args.add_arguments(p)
    add_rank_argument(p, "its findings alone, its remedies replayed on its own requests")


def vllm_available() -> bool:
    """Whether vLLM can be imported here (the replay runs its scheduler)."""
    return importlib.util.find_spec("vllm") is not None


def main(args: argparse.Namespace) -> int:
    run_dir = resolve_run_dir(args.run_dir)
    if args.jobs < 1:
        raise CliError(f"--jobs must be >= 1, got {args.jobs}")
    if args.no_replay and args.whatif:
        raise CliError("--no-replay and --whatif contradict each other")
    if args.budget is not None and not args.budget > 0:  # nan too
        raise CliError(f"--budget must be positive, got {args.budget:g}")
    if args.out:
        try:
            Path(args.out).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CliError(f"--out {args.out}: {e.strerror or e}") from None
    profile_args.check(args)
    if args.no_replay and (args.profile or args.no_profile or args.force):
        raise CliError("--profile, --no-profile and --force choose the replay's step-time model: not with --no-replay")
    expected = load_expected(args.expect) if args.expect else None
    if expected is not None and not expected.engine:
        print(f"vllm-probe: {expected.source}: no engine setting in it ([scheduler] section or engine arguments): "
              f"nothing to check against the run", file=sys.stderr)
    replay = not args.no_replay
    if replay and not vllm_available():
        if args.whatif:
            raise CliError("doctor --whatif replays through vLLM's own scheduler: vLLM is not installed in this "
                           "environment (pip install vllm); without --whatif doctor gives the arithmetic, unchecked")
        print("vllm-probe: note: vLLM is not installed here: remedies are the rules' arithmetic, not checked by the "
              "replay", file=sys.stderr)
        replay = False
    if replay and args.rank is None:  # the replays read the run's workload and rows next: one pass for all
        from ..analysis.reading import read

        read(run_dir, "summary", "rows", "workload")
    report = examine(run_dir, expected, rank=args.rank)
    from ..advice import plan, remedies
    from ..advice.verdict import unchecked

    if replay and args.rank is None and len(report.ranks) > 1:
        why = (f"data-parallel ranks {', '.join(str(r) for r in report.ranks)}: the replay runs one engine core, "
               "so doctor --rank N replays rank N's remedies on its own requests")
        print(f"vllm-probe: note: {why}; here the remedies are the rules' arithmetic, unchecked", file=sys.stderr)
        report.plan = plan.unchecked_plan(report.findings, why)
        replay = False
    if replay and any(f.remedy is not None or remedies.rule_for(f.id) is not None for f in report.findings):
        _prescribe(report, args)
    unchecked(report.findings)
    if report.plan is None:
        report.plan = plan.unchecked_plan(report.findings, "--no-replay" if args.no_replay else "vLLM is not installed")
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


def _prescribe(report, args) -> None:
    """Each finding's remedy and the run's plan, chosen by the replay
    (:func:`vllm_probe.advice.prescribe.prescribe`); on a run the replay cannot take, the
    arithmetic, unchecked, and one line saying why."""
    from ..advice import remedies
    from ..advice.evaluate import ProfileRefused
    from ..advice.prescribe import prescribe

    budget = args.budget if args.budget is not None else remedies.DEFAULT_BUDGET_S
    print(f"vllm-probe: choosing remedies and one plan by replaying the run through vLLM's scheduler (up to "
          f"{budget:g} s; --no-replay skips) …", file=sys.stderr, flush=True)
    try:
        notes = prescribe(report, budget, jobs=args.jobs, ray_address=args.ray, out=args.out,
                          profile=profile_args.choice(args), force=args.force, whole_run=args.whole_run)
    except ProfileRefused as e:  # the user's choice, not the run: an error, not a fallback
        raise profile_args.refused(e) from None
    for note in notes:
        print(f"vllm-probe: note: {note}", file=sys.stderr)
