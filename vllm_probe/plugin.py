"""The vLLM general plugin (entry point ``vllm_probe`` in ``vllm.general_plugins``).

vLLM calls :func:`register` in every process it starts (API server, engine core,
workers). It does nothing unless ``VLLMPROBE_ENABLE=1``; then it patches the scheduler
class once per process. Files appear only where a scheduler is built (the engine
core). Nothing here may raise into vLLM: vLLM's loader does not catch exceptions from
a plugin's function.
"""

from __future__ import annotations

import logging
import os

from . import envvars

logger = logging.getLogger("vllm_probe")
_registered = False


def _log_info(msg: str, *args: object) -> None:
    # vLLM configures the "vllm" logger; reuse its handler so our line looks like its own.
    target = logging.getLogger("vllm")
    (target if target.handlers else logger).info(msg, *args)


def register() -> None:
    """Install the probe if enabled; safe to call any number of times, never raises."""
    global _registered  # noqa: PLW0603 - one registration per process
    if _registered or os.environ.get(envvars.ENABLE) != "1":
        return
    _registered = True
    try:
        _install_from_env()
    except Exception as e:  # a broken probe must not take the engine down
        logger.warning("vllm-probe: not installed (%s: %s); vLLM runs without it", type(e).__name__, e)


def _install_from_env() -> None:
    import vllm

    from .engine import compat, patches
    from .engine.hooks import Runtime, default_run_dir, file_sink_factory
    from .settings import ProbeFlags, SettingsError, load_settings

    version = getattr(vllm, "__version__", "unknown")
    if compat.parse_version(version) < compat.MIN_SUPPORTED:
        logger.warning(
            "vllm-probe: vLLM %s is older than %d.%d (no Scheduler._preempt_request); "
            "the probe patches nothing; see docs/compatibility.md", version, *compat.MIN_SUPPORTED,
        )
        return
    try:
        flags = load_settings(os.environ.get(envvars.SETTINGS)).flags
    except SettingsError as e:
        logger.warning("vllm-probe: %s; using default flags", e)
        flags = ProbeFlags()

    from importlib import import_module

    module = import_module(patches.SCHEDULER_MODULE)
    scheduler_cls = getattr(module, patches.SCHEDULER_CLASS)
    rt = Runtime(flags, file_sink_factory(default_run_dir()))
    patched = patches.install(scheduler_cls, rt, version)
    if not patched:
        return
    tested = compat.is_tested(version)

    def announce() -> None:
        _log_info("vllm-probe: patched %s for vLLM %s; events -> %s",
                  ", ".join(patched), version, default_run_dir())
        if not tested:
            logger.warning("vllm-probe: vLLM %s has not been tested with this probe; "
                           "see docs/compatibility.md", version)

    rt.on_first_scheduler = announce
