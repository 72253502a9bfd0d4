"""Shared fixtures.

Real-engine runs are expensive (~20 s engine start), so they are made once per test
session through :func:`probe_run` and cached by their arguments; every test that needs
"a real run of the long-prompt example" reuses the same directory.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "long_prompts.py"
HAVE_VLLM = importlib.util.find_spec("vllm") is not None

#: A small workload that chunks every prompt and preempts (measured: 4 preemptions,
#: 38 chunks, ~1,000 steps, ~30 s with engine start on 2 cores).
QUICK_WORKLOAD = [
    "--num-prompts", "8", "--prompt-tokens", "600", "--max-tokens", "300",
    "--num-kv-blocks", "20", "--max-num-batched-tokens", "256", "--max-model-len", "1024",
    "--print-token-ids",
]

requires_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed")


def vllm_probe_cmd(*args: str) -> list[str]:
    """The ``vllm-probe`` command line with this interpreter (works without PATH)."""
    return [sys.executable, "-m", "vllm_probe", *args]


def run_cli(*args: str, timeout: float = 600, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    """Run ``vllm-probe ARGS`` and capture its output (text)."""
    return subprocess.run(vllm_probe_cmd(*args), capture_output=True, text=True, timeout=timeout,
                          cwd=kw.pop("cwd", ROOT), env=env, **kw)


@pytest.fixture(scope="session")
def probe_run(tmp_path_factory):
    """Factory: ``probe_run(*example_args, settings=None)`` → run dir of a real run.

    Runs ``vllm-probe run --out DIR [--settings FILE] -- python examples/long_prompts.py
    ARGS`` once per distinct argument list in the session; asserts it exited 0.
    """
    cache: dict[tuple, tuple[Path, subprocess.CompletedProcess]] = {}

    def make(*example_args: str, settings: str | None = None, with_output: bool = False):
        key = (example_args, settings)
        if key not in cache:
            out = tmp_path_factory.mktemp("run") / "run"
            cli = ["run", "--out", str(out)]
            if settings:
                cli += ["--settings", settings]
            proc = run_cli(*cli, "--", sys.executable, str(EXAMPLE), *example_args)
            assert proc.returncode == 0, proc.stderr[-3000:]
            cache[key] = (out, proc)
        return cache[key] if with_output else cache[key][0]

    return make


@pytest.fixture(scope="session")
def quick_run(probe_run) -> Path:
    """The shared real run of :data:`QUICK_WORKLOAD` with every flag on."""
    if not HAVE_VLLM:
        pytest.skip("vLLM is not installed")
    return probe_run(*QUICK_WORKLOAD)


@pytest.fixture(autouse=True)
def _no_probe_env(monkeypatch):
    """Tests start from an environment where the probe is off."""
    for name in ("VLLMPROBE_ENABLE", "VLLMPROBE_RUN_DIR", "VLLMPROBE_SETTINGS"):
        monkeypatch.delenv(name, raising=False)
