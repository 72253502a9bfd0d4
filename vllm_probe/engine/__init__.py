"""The part of vllm-probe that runs inside vLLM's engine core.

:mod:`.patches` (which scheduler methods are wrapped, install and uninstall),
:mod:`.hooks` (what each hook records), :mod:`.sink` (the bounded queue and the writer
thread), :mod:`.signals` (the stop-signal checkpoint) and :mod:`.compat` (what differs
between vLLM releases). It imports only :mod:`vllm_probe.schema`,
:mod:`vllm_probe.settings`, :mod:`vllm_probe.envvars`, vLLM and its own dependencies
(structlog, msgspec): never the readers, the exporters, the live view or the test
harness (``tests/test_layout.py`` checks it).

The names below are what the plugin, the benchmarks and the tests use.
"""

from .hooks import Runtime, attached_probe, default_run_dir, file_sink_factory
from .patches import PATCHES, install, uninstall

__all__ = ["PATCHES", "Runtime", "attached_probe", "default_run_dir", "file_sink_factory",
           "install", "uninstall"]
