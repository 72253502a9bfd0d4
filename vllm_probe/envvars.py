"""Every environment variable vllm-probe reads, in one place.

None starts with ``VLLM_``: vLLM warns about (and can reject) unknown ``VLLM_*`` names.
``vllm-probe run`` sets them for the command it starts; users who start vLLM by other
means can set them by hand.
"""

#: "1" enables the plugin in this process tree; anything else leaves vLLM untouched.
ENABLE = "VLLMPROBE_ENABLE"
#: Directory the engine cores write their ``events-<pid>.jsonl`` files into.
RUN_DIR = "VLLMPROBE_RUN_DIR"
#: Path of a settings file (JSON, YAML or TOML) whose ``scheduler_probe`` section is used.
SETTINGS = "VLLMPROBE_SETTINGS"
#: "1" lets ``vllm-probe`` show the traceback of an internal error instead of one line.
DEBUG = "VLLMPROBE_DEBUG"

#: vLLM's own allow-list of plugin entry-point names (comma-separated), which we extend.
VLLM_PLUGINS = "VLLM_PLUGINS"
#: Name of our entry point in the ``vllm.general_plugins`` group.
PLUGIN_NAME = "vllm_probe"
#: Run directory used when the plugin is enabled by hand without ``RUN_DIR``.
DEFAULT_MANUAL_RUN_DIR = "vllm-probe-runs/manual"
