"""Every environment variable vllm-probe reads or sets, in one place.

Ours start with ``VLLMPROBE_``, none with ``VLLM_``: vLLM warns about (and can reject)
unknown ``VLLM_*`` names; two of vLLM's own are set (:data:`VLLM_PLUGINS`,
:data:`VLLM_LOGGING_LEVEL`). ``vllm-probe run`` sets ``ENABLE``, ``RUN_DIR`` and
``SETTINGS`` for the command it starts (and extends vLLM's ``VLLM_PLUGINS``); users who
start vLLM by other means can set them by hand. Beside these, the reports honour
``COLUMNS`` (the terminal width, as any console program does).
"""

#: "1" enables the plugin in this process tree; anything else leaves vLLM untouched.
ENABLE = "VLLMPROBE_ENABLE"
#: Directory the engine cores write their ``events-<pid>.jsonl`` files into.
RUN_DIR = "VLLMPROBE_RUN_DIR"
#: Path of a settings file (JSON, YAML or TOML) whose ``scheduler_probe`` section is used.
SETTINGS = "VLLMPROBE_SETTINGS"
#: "1" lets ``vllm-probe`` show the traceback of an internal error instead of one line.
DEBUG = "VLLMPROBE_DEBUG"
#: Folder of the tiny local test model (:mod:`vllm_probe.sim.tiny_model`); default
#: ``~/.cache/vllm-probe/tiny-llama``. Read by tests, examples and benchmarks, never by
#: the plugin (the engine core loads whatever model it is given).
TINY_MODEL = "VLLMPROBE_TINY_MODEL"
#: Where the compatibility suite (``python -m tests.compat``) caches each vLLM release's
#: sources; default ``~/.cache/vllm-probe/compat``.
COMPAT_CACHE = "VLLMPROBE_COMPAT_CACHE"
#: Where ``vllm-probe calibrate`` stores step-time profiles and ``whatif`` looks for a
#: matching one (:mod:`vllm_probe.sim.profile`); default ``~/.cache/vllm-probe/profiles``.
PROFILE_DIR = "VLLMPROBE_PROFILE_DIR"
#: "1" makes the test suite fail, not skip, the tests that need Debian's ``chromium`` (the
#: report opened in a real browser) when it is missing; ``.ci/run`` installs it and sets this.
#: Read by tests only.
TEST_REQUIRE_CHROMIUM = "VLLMPROBE_TEST_REQUIRE_CHROMIUM"
#: The terminal's width in columns (set by shells); reports written to a pipe use it
#: when set (:func:`vllm_probe.tui.format.report_console`).
COLUMNS = "COLUMNS"

#: vLLM's own allow-list of plugin entry-point names (comma-separated), which we extend.
VLLM_PLUGINS = "VLLM_PLUGINS"
#: vLLM's log level. ``whatif`` (and ``doctor --whatif``) set it to ``ERROR`` for the
#: processes that replay, unless the user set it: vLLM's start-up warnings there are
#: about this machine's backend, not about the replay.
VLLM_LOGGING_LEVEL = "VLLM_LOGGING_LEVEL"
#: Name of our entry point in the ``vllm.general_plugins`` group.
PLUGIN_NAME = "vllm_probe"
#: Run directory used when the plugin is enabled by hand without ``RUN_DIR``.
DEFAULT_MANUAL_RUN_DIR = "vllm-probe-runs/manual"
