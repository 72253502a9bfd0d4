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

#: The fixtures below that start a real vLLM engine. A test using one of them, directly or
#: through another fixture, is marked ``engine`` at collection (:func:`pytest_collection_modifyitems`),
#: so ``-m "not engine"`` leaves it out without a marker written in its file.
ENGINE_FIXTURES = frozenset({"probe_run", "quick_run", "server_run", "unprobed_quick_run"})


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection reads the markers
def pytest_collection_modifyitems(config, items) -> None:
    """Mark ``engine`` every collected test that uses a fixture of :data:`ENGINE_FIXTURES`."""
    for item in items:
        if ENGINE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engine)


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


#: The profile cache every test sees: none (a profile a user calibrated on this machine
#: would change a replay's step-time model).
NO_PROFILE_DIR = "/nonexistent/vllm-probe-test-profiles"


@pytest.fixture(scope="session", autouse=True)
def _no_cached_profiles():
    """No cached profile for the session-, module- and class-scoped fixtures either (they
    are set up before the function-scoped :func:`_no_probe_env`): an ``Evaluator`` made in
    a module fixture would otherwise pick this machine's profile on its own."""
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLMPROBE_PROFILE_DIR", NO_PROFILE_DIR)
    yield
    mp.undo()


@pytest.fixture(autouse=True)
def _no_probe_env(monkeypatch):
    """Tests start from an environment where the probe is off."""
    for name in ("VLLMPROBE_ENABLE", "VLLMPROBE_RUN_DIR", "VLLMPROBE_SETTINGS"):
        monkeypatch.delenv(name, raising=False)
    # an in-process replay (sim.whatif.quiet_vllm) sets VLLM_LOGGING_LEVEL=ERROR in os.environ;
    # monkeypatch puts the variable back as it was after each test, so no later test's vLLM
    # subprocess (the compat slice, the server) loses the INFO lines it reads
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    # no step-time profile a user calibrated on this machine leaks into a test's whatif
    monkeypatch.setenv("VLLMPROBE_PROFILE_DIR", NO_PROFILE_DIR)


#: Marker text inside every prompt the server fixture sends (privacy tests look for it).
SENTINEL = "SENTINEL-7f3a"
SERVER_REQUESTS = 4
SERVER_MAX_TOKENS = 12
#: The in-flight request's length: ~1,000 decode steps, seconds on any CPU (max-model-len 1024).
IN_FLIGHT_MAX_TOKENS = 1000
#: How long it runs before the stop signal (it is admitted within milliseconds).
IN_FLIGHT_LEAD_S = 0.5


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_under_probe(base: Path, stop, new_session: bool = False, in_flight: bool = False):
    """vLLM's OpenAI-compatible server under ``vllm-probe run --out base/run``, on loopback.

    Sends :data:`SERVER_REQUESTS` completions whose prompts contain :data:`SENTINEL`,
    then calls ``stop(proc)`` (``proc``: the ``vllm-probe`` process; ``new_session``
    puts it and the server in a process group of their own) and waits for the exit.
    ``in_flight``: first start one more completion of :data:`IN_FLIGHT_MAX_TOKENS`
    (seconds of decoding here) and stop while it runs, so that the engine core still
    schedules and aborts after the signal. Returns a namespace: ``run_dir``,
    ``responses`` (decoded JSON bodies), ``statuses`` (of the completed requests),
    ``returncode`` of ``vllm-probe``, ``log`` (its combined output).
    """
    import json
    import threading
    import time
    import types
    import urllib.request

    from benchmarks.soak import wait_ready  # the soak starts the same server
    from vllm_probe.sim.tiny_model import write_tiny_model

    run_dir, log_path = base / "run", base / "server.log"
    port = _free_port()
    cmd = vllm_probe_cmd(
        "run", "--out", str(run_dir), "--", sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(write_tiny_model()), "--load-format", "dummy", "--enforce-eager",
        "--dtype", "float32", "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "1024",
        "--num-gpu-blocks-override", "64", "--gpu-memory-utilization", "0.3",
    )
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        # the tests read vLLM's INFO lines ("(EngineCore pid=N)"): a test before this one that
        # replayed in-process (sim.whatif.quiet_vllm) left VLLM_LOGGING_LEVEL=ERROR in os.environ
        env = {**os.environ, "VLLM_LOGGING_LEVEL": "INFO"}
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                start_new_session=new_session, env=env)
        try:
            model = wait_ready(url, proc, log_path, 300)
            statuses, responses = [], []
            for i in range(SERVER_REQUESTS):
                body = json.dumps({
                    "model": model, "max_tokens": SERVER_MAX_TOKENS, "temperature": 0.0, "ignore_eos": True,
                    "prompt": f"{SENTINEL} request {i}: " + " ".join(f"w{j % 50}" for j in range(150)),
                }).encode()
                req = urllib.request.Request(f"{url}/v1/completions", data=body,
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=120) as r:
                    statuses.append(r.status)
                    responses.append(json.load(r))
            if in_flight:
                body = json.dumps({"model": model, "max_tokens": IN_FLIGHT_MAX_TOKENS, "ignore_eos": True,
                                   "prompt": f"{SENTINEL} in flight"}).encode()
                req = urllib.request.Request(f"{url}/v1/completions", data=body,
                                             headers={"Content-Type": "application/json"})

                def send() -> None:
                    # the server waits for open connections before it exits; when the
                    # engine core is killed before its abort goes out, this one hangs
                    try:
                        urllib.request.urlopen(req, timeout=IN_FLIGHT_LEAD_S + 5).read()
                    except OSError:
                        pass

                threading.Thread(target=send, daemon=True).start()
                time.sleep(IN_FLIGHT_LEAD_S)
            stop(proc)
            returncode = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                if new_session:  # the whole group: vllm-probe, the server, its engine core
                    os.killpg(proc.pid, 9)
                else:
                    proc.kill()
                proc.wait()
    return types.SimpleNamespace(run_dir=run_dir, responses=responses, statuses=statuses,
                                 returncode=returncode, log=log_path.read_text(errors="replace"))


@pytest.fixture(scope="session")
def server_run(tmp_path_factory):
    """:func:`serve_under_probe`, stopped with SIGTERM sent to ``vllm-probe`` (which
    passes it on)."""
    if not HAVE_VLLM:
        pytest.skip("vLLM is not installed")
    import signal

    return serve_under_probe(tmp_path_factory.mktemp("server"), lambda p: p.send_signal(signal.SIGTERM))


@pytest.fixture(scope="session")
def unprobed_quick_run(tmp_path_factory):
    """:data:`QUICK_WORKLOAD` run WITHOUT vllm-probe (plain ``python examples/...``).

    Runs in an empty directory with the probe's variables removed from the
    environment; returns ``(cwd, CompletedProcess)``. Used to show that an installed
    but not enabled plugin patches nothing, and that outputs match a probed run.
    """
    if not HAVE_VLLM:
        pytest.skip("vLLM is not installed")
    cwd = tmp_path_factory.mktemp("unprobed")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLMPROBE_")}
    proc = subprocess.run([sys.executable, str(EXAMPLE), *QUICK_WORKLOAD], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cwd, proc
