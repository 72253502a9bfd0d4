"""``--profile PROFILE.json``, ``--no-profile`` and ``--force``: the step-time model of
the commands that replay a run (``whatif``, ``doctor``, ``tune``), parsed and checked
once here.

* ``--profile FILE``: a profile written by ``vllm-probe calibrate``; its shape, the
  recording's level (:func:`vllm_probe.sim.whatif.step_time_model`);
* neither: the newest profile in the cache (``$VLLMPROBE_PROFILE_DIR`` or
  ``~/.cache/vllm-probe/profiles/``) measured on this engine (model, release, dtype,
  parallelism, block size, machine) that covers the run's steps
  (:func:`vllm_probe.sim.profile.choose_cached`), a note says which; else the
  recording-only fit, and a note says why no cached profile was used;
* ``--no-profile``: the recording-only fit;
* ``--force``: use a profile measured on another model, vLLM release or hardware (the
  report says ``FORCED``); without it such a profile is refused in one line, exit 2.

Errors (:class:`~vllm_probe.cli.CliError`, one line, exit 2): ``--profile`` with
``--no-profile``, a profile that cannot be read or is not one (checked here, before
anything replays); a profile of another engine (:func:`refused`, raised where the
recording's identity is known).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from . import EXIT_USAGE, CliError


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add ``--profile``, ``--no-profile`` and ``--force`` to ``p``."""
    p.add_argument("--profile", metavar="PROFILE.json",
                   help="a step-time profile (vllm-probe calibrate): its shape, the recording's level "
                        "(default: a matching profile from the cache, else the recording-only fit)")
    p.add_argument("--no-profile", action="store_true", help="fit the step time on the recording only")
    p.add_argument("--force", action="store_true",
                   help="use a --profile measured on another model, release or hardware (the report says so)")


def check(args: argparse.Namespace) -> None:
    """Refuse ``--profile`` with ``--no-profile`` and a ``--profile`` that cannot be read
    or is not a profile of this format.

    Raises:
        CliError: one line, exit 2.
    """
    if args.profile and args.no_profile:
        raise CliError("--profile and --no-profile exclude each other")
    if args.profile:
        from ..sim.profile import ProfileError, load

        try:
            load(args.profile)
        except ProfileError as e:
            raise CliError(str(e)) from None


def choice(args: argparse.Namespace) -> str | Path | bool | None:
    """The ``profile`` argument of :func:`~vllm_probe.sim.whatif.predict` and
    :class:`~vllm_probe.advice.evaluate.Evaluator`: the path, False (``--no-profile``) or
    None (the cache, else the recording)."""
    return False if args.no_profile else args.profile


def refused(e: Exception) -> CliError:
    """The one-line error of a profile refused for this recording (another engine's
    without ``--force``), exit 2."""
    return CliError(str(e).splitlines()[0], code=EXIT_USAGE)


__all__ = ["add_arguments", "check", "choice", "refused"]
