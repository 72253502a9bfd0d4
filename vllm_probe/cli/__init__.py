"""The ``vllm-probe`` command: argparse only — parse, call the analysis or the view,
turn the outcome into an exit code.

Each subcommand is a module with ``add_arguments(parser)`` and ``main(args) -> int``;
the modules are imported to build the parser and import their views (rich) and vLLM
only when they run, so reading commands work without vLLM installed::

    vllm-probe run [--settings FILE] [--out DIR] [--live] [--metrics-port PORT] -- COMMAND [ARGS...]
    vllm-probe COMMAND [ARGS...]          # shorthand for `run -- COMMAND ...`
    vllm-probe tail [RUN_DIR] [--plain] [--replay [SPEED]]
    vllm-probe export RUN_DIR [-o FILE|-] [--format jsonl|perfetto|trace] [filters]
    vllm-probe summary RUN_DIR [--json] [--rank N]
    vllm-probe compare RUN_DIR RUN_DIR [...]
    vllm-probe doctor [RUN_DIR] [--json] [--whatif] [--expect FILE] [--rank N]
    vllm-probe whatif [RUN_DIR] --set KEY=V[,V...] ... [--out DIR] [--json] [--jobs N] [--rank N]
    vllm-probe calibrate --like RUN_DIR [--out PROFILE.json] [--max-seconds N]
    vllm-probe tune [RUN_DIR] --slo FIGURE<=VALUE ... --knob NAME=LO..HI|V1,V2 ... [--json]
    vllm-probe metrics [RUN_DIR] --port PORT [--host HOST]
    vllm-probe report [RUN_DIR ...] [--whatif DIR] [--tune DIR] [-o FILE]
    vllm-probe tiny-model [DIR]

Exit codes: the command's own for ``run``; otherwise 0 success, 1 failure at work
(e.g. no events), 2 bad usage or input (bad settings, missing run directory),
3 ``doctor`` found something critical / ``tune`` found no setting meeting the SLOs,
126/127 command not executable / not found.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, NoReturn
from collections.abc import Callable

from .. import envvars
from ..exporters.base import ExportError
from ..runs.ids import RequestIdError
from ..runs.ranks import RankError
from ..runs.rundir import NoEventsError, RunDirError, resolve_run_dir
from ..settings import SettingsError

#: subcommand -> (module, one-line help). Each module has add_arguments(p) and main(args) -> int.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("vllm_probe.cli.run", "run a command with the probe enabled"),
    "tail": ("vllm_probe.cli.tail", "watch a run live (dashboard, or --plain lines)"),
    "export": ("vllm_probe.cli.export", "a run's events as JSONL, a Perfetto trace, or its workload as a timed trace"),
    "summary": ("vllm_probe.cli.summary", "one-screen summary of a run"),
    "compare": ("vllm_probe.cli.compare", "compare runs side by side"),
    "doctor": ("vllm_probe.cli.doctor", "what went wrong in a run, the evidence, and what to change"),
    "whatif": ("vllm_probe.cli.whatif", "replay a run through vLLM's scheduler at other settings"),
    "calibrate": ("vllm_probe.cli.calibrate", "measure the recorded engine's step time: a profile for whatif"),
    "tune": ("vllm_probe.cli.tune", "search settings that meet SLOs by replaying a run"),
    "metrics": ("vllm_probe.cli.metrics", "serve a run's Prometheus metrics (a sidecar for a fleet)"),
    "report": ("vllm_probe.cli.report", "one HTML page of charts: timelines, latency, findings, whatif/tune"),
    "tiny-model": ("vllm_probe.cli.tiny_model", "write the tiny local test model"),
}

#: Exit code of a failure at work: the run holds no readable event, nothing matched.
EXIT_NO_EVENTS = 1
#: Exit code of bad usage or input (bad settings, missing run directory, bad filters).
EXIT_USAGE = 2


class CliError(Exception):
    """A user-facing error: printed as one line, exit code ``code``."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def path_arg(text: str) -> str:
    """argparse ``type`` of every path argument: ``~`` expanded (the shell leaves
    ``--out=~/runs`` alone). ``-`` (stdout) stays as it is."""
    return os.path.expanduser(text)


def run_dir_arg(arg: str | None) -> Path:
    """A RUN_DIR argument resolved (None: the latest run that started an engine, with a
    note on stderr when newer runs were skipped; see :func:`vllm_probe.runs.rundir.resolve_run_dir`).

    Raises:
        RunDirError: the directory does not exist, or there is no run.
    """
    return resolve_run_dir(arg, note=lambda text: print(f"vllm-probe: note: {text}", file=sys.stderr))


def by_arg(text: str) -> list[int]:
    """argparse ``type`` of ``--by``: ``prompt_len:512,2048`` → the class boundaries in
    tokens (``prompt_len`` alone: ``[]``, the defaults)."""
    key, _, values = text.partition(":")
    if key.strip() != "prompt_len":
        raise argparse.ArgumentTypeError(f"{text!r}: only prompt_len classes, e.g. prompt_len:512,2048")
    try:
        bounds = [int(v) for v in values.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: boundaries are token counts, e.g. prompt_len:512,2048") from None
    if any(b <= 0 for b in bounds):
        raise argparse.ArgumentTypeError(f"{text!r}: boundaries must be > 0")
    return sorted(set(bounds))


def rank_arg(text: str) -> int:
    """argparse ``type`` of ``--rank``: a data-parallel rank (the events' ``engine``), ≥ 0."""
    try:
        rank = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a data-parallel rank is a number, e.g. --rank 1") from None
    if rank < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a data-parallel rank is 0 or more")
    return rank


def add_rank_argument(p: argparse.ArgumentParser, what: str) -> None:
    """The ``--rank N`` option of ``summary``, ``doctor``, ``whatif`` and ``tune``; ``what``
    ends its help (what the command does with one rank)."""
    p.add_argument("--rank", type=rank_arg, metavar="N",
                   help=f"one data-parallel rank of the run (its engine core's own events): {what}")


def mistyped_subcommand(word: str) -> str | None:
    """The subcommand ``word`` is a typo of, or None.

    ``vllm-probe COMMAND ...`` is short for ``run -- COMMAND``, so a word that is not a
    subcommand may be a command to run. It counts as a mistyped subcommand only when it
    cannot be run (no executable of that name on PATH, no path) and is close to a
    subcommand's name (difflib's ratio ≥ 0.7: ``summry``, ``tial``, ``comapre``): a
    command that exists always runs, whatever its name.
    """
    if os.sep in word or shutil.which(word):
        return None
    near = difflib.get_close_matches(word, list(SUBCOMMANDS), n=1, cutoff=0.7)
    return near[0] if near else None


def silence_stdout() -> None:
    """Point stdout at /dev/null: the reader of a pipe went away (``... | head``), and
    Python's final flush must not complain about it."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass


def print_json(obj: Any) -> None:
    """``obj`` as indented JSON on stdout (the ``--json`` outputs)."""
    json.dump(obj, sys.stdout, indent=2)
    sys.stdout.write("\n")
    sys.stdout.flush()


def print_report(render: Callable[[int], Any]) -> None:
    """Print a rich report made by ``render(width)`` (see :func:`vllm_probe.tui.format.report_console`)."""
    from ..tui.format import report_console

    console = report_console()
    console.print(render(console.width))


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``vllm-probe: error: ...``), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="vllm-probe",
        description="See what vLLM's V1 scheduler does: steps, prefill chunks, preemptions.",
        epilog="Shorthand: `vllm-probe COMMAND [ARGS...]` runs COMMAND with the probe, "
        "e.g. `vllm-probe python -m vllm.entrypoints.openai.api_server --model ...`.",
    )
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"vllm-probe {__version__}")
    sub = parser.add_subparsers(dest="subcommand", metavar="SUBCOMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-") and argv[0] not in SUBCOMMANDS:
        typo = mistyped_subcommand(argv[0])
        if typo is not None:
            print(f"vllm-probe: error: unknown subcommand {argv[0]!r} (did you mean {typo!r}?); "
                  f"subcommands: {', '.join(SUBCOMMANDS)}", file=sys.stderr)
            return EXIT_USAGE
        if argv[0] and os.sep not in argv[0] and not shutil.which(argv[0]):
            print(f"vllm-probe: error: command not found: {argv[0]} (nor a vllm-probe subcommand: "
                  f"{', '.join(SUBCOMMANDS)})", file=sys.stderr)
            return 127
        argv = ["run", "--", *argv]  # `vllm-probe COMMAND ...` shorthand
    if not argv:
        print("vllm-probe: error: no command given (usage: vllm-probe run -- COMMAND [ARGS...]; "
              "vllm-probe --help lists the subcommands)", file=sys.stderr)
        return EXIT_USAGE
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_module", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return importlib.import_module(args._module).main(args)
    except NoEventsError as e:
        print(f"vllm-probe: error: {e}", file=sys.stderr)
        return EXIT_NO_EVENTS
    except (CliError, SettingsError, RunDirError, ExportError, RequestIdError, RankError) as e:
        print(f"vllm-probe: error: {e}", file=sys.stderr)
        return getattr(e, "code", EXIT_USAGE)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `vllm-probe export ... | head`: the reader is gone; not an error
        silence_stdout()
        return 0
    except Exception as e:  # a bug of ours: one line, not a traceback (VLLMPROBE_DEBUG=1 shows it)
        if os.environ.get(envvars.DEBUG) == "1":
            raise
        print(f"vllm-probe: error: internal error ({type(e).__name__}: {e}); "
              f"set {envvars.DEBUG}=1 for the traceback", file=sys.stderr)
        return 1
