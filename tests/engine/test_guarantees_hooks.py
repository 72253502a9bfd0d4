"""Guarantees 3, 4, 5 and 9 on vLLM's real Scheduler, driven without a model.

3. a fault inside a hook never reaches vLLM: the scheduler makes exactly the decisions
   it makes without the probe; after MAX_HOOK_ERRORS the hook switches itself off with
   one warning naming it, and the other hooks go on (with correct step indices);
4. a missing or changed target is a warning naming it, the other hooks still work; an
   untested vLLM release is said once;
5. register() any number of times, or a second copy of the probe, wraps once: no
   duplicate events; a process that builds no scheduler writes nothing;
9. no token ids in any event; the probe creates no socket.

The oracle for "vLLM is unaffected" is a trace of the scheduler's own outputs (tokens
scheduled per request, preempted and finished ids, every step) recorded without the
probe installed.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict

import pytest

from tests._workload import SPEC, probe_warnings, trace, workload
from tests.conftest import requires_vllm

pytestmark = requires_vllm

@pytest.fixture(scope="module")
def scheduler_cls():
    from vllm.v1.core.sched.scheduler import Scheduler

    return Scheduler


@pytest.fixture(scope="module")
def baseline(scheduler_cls):
    """The workload's trace with the probe not installed."""
    from vllm_probe.engine import hooks as probe
    from vllm_probe.sim import harness as testing

    assert not hasattr(scheduler_cls.schedule, probe.WRAPPED_ATTR)
    t = trace(testing.make_scheduler(testing.SchedulerSpec(**SPEC)), workload())
    assert any(p for _, p, _ in t), "the workload was meant to preempt"
    return t


@pytest.fixture
def installed(scheduler_cls):
    """install(cls=Scheduler, flags=all on) into a MemorySink; uninstalled afterwards."""
    from vllm_probe.engine import hooks as probe, patches
    from vllm_probe.sim import harness as testing
    from vllm_probe.settings import ProbeFlags

    classes = []

    def make(cls=None, flags=None, version="0.32.0"):
        cls = cls or scheduler_cls
        sink = testing.MemorySink()
        rt = probe.Runtime(flags or ProbeFlags(), lambda _rt: sink)
        patched = patches.install(cls, rt, version)
        classes.append(cls)
        return sink, rt, patched

    yield make
    for cls in classes:
        patches.uninstall(cls)


# -- 3. faults inside hooks ------------------------------------------------------------

#: hook -> SchedulerProbe method that builds its events, and the event kinds it owns
FAULTS = {
    "step": ("end_step", {"step"}),
    "chunk": ("on_chunks", {"chunk"}),
    "preempt": ("after_preempt", {"preempt"}),
    "request_added": ("on_added", {"request_added"}),
    "request_finished": ("on_finished", {"request_finished"}),
}


@pytest.mark.parametrize("hook", list(FAULTS))
def test_a_failing_hook_switches_off_alone(hook, installed, baseline, monkeypatch, caplog):
    from vllm_probe.engine import hooks as probe
    from vllm_probe.sim import harness as testing

    method, owned = FAULTS[hook]
    calls = []

    def broken(self, *args, **kwargs):
        calls.append(1)
        raise KeyError("unexpected SchedulerOutput shape")

    monkeypatch.setattr(probe.SchedulerProbe, method, broken)
    sink, rt, _ = installed()
    caplog.set_level(logging.DEBUG, logger="vllm_probe")
    sched = testing.make_scheduler(testing.SchedulerSpec(**SPEC))
    assert trace(sched, workload()) == baseline  # vLLM decided exactly as without the probe

    assert rt.health.disabled == {hook}
    assert rt.health.errors[hook] == probe.MAX_HOOK_ERRORS == len(calls)  # not called once off
    assert probe_warnings(caplog) == [
        f"vllm-probe: hook '{hook}' disabled after {probe.MAX_HOOK_ERRORS} errors "
        "(last: KeyError: 'unexpected SchedulerOutput shape'); vLLM is unaffected"
    ]
    kinds = {k for k, _ in sink.events}
    expected = {"engine_config", "step", "chunk", "preempt", "request_added", "request_finished"}
    assert kinds == expected - owned
    # the other hooks go on, with the right step indices: one step event per step,
    # every preemption in the step vLLM reported it
    steps = sink.of("step")
    if hook != "step":
        assert [s["step"] for s in steps] == list(range(len(baseline)))
    if hook != "preempt":
        got = [(p["step"], p["req_id"], p["reason"]) for p in sink.of("preempt")]
        want = [(i, rid, "kv_cache") for i, (_, pre, _) in enumerate(baseline) for rid in pre]
        assert sorted(got) == sorted(want)
    if hook != "chunk":
        # every chunk sits in a step where vLLM scheduled exactly that many tokens of it,
        # and every preemption is followed by a resumed prefill pass
        for c in sink.of("chunk"):
            assert baseline[c["step"]][0][c["req_id"]] == c["end"] - c["start"]
        resumed = [c for c in sink.of("chunk") if c["resumed"] and c["chunk_index"] == 0]
        assert len(resumed) == sum(len(p) for _, p, _ in baseline)
    if hook != "step":
        assert [sorted(s["preempted"]) for s in steps] == [p for _, p, _ in baseline]
    if hook != "request_finished":
        finished = {e["req_id"]: e["step"] for e in sink.of("request_finished")}
        assert sorted(finished) == ["r0", "r1", "r2"]
    if hook == "chunk":  # the split into prefill/decode is unknown, not wrong
        assert all(s.get("prefill_tokens") is None for s in steps[probe.MAX_HOOK_ERRORS:])


def test_a_failing_engine_config_hook_leaves_the_scheduler_untouched(installed, baseline, monkeypatch, caplog):
    """No probe can be attached: one warning at once (not silence), vLLM unaffected."""
    from vllm_probe.engine import hooks as probe
    from vllm_probe.sim import harness as testing

    def broken(self, rt, sched):
        raise AttributeError("'SchedulerConfig' object has no attribute 'max_num_seqs'")

    monkeypatch.setattr(probe.SchedulerProbe, "__init__", broken)
    sink, rt, _ = installed()
    caplog.set_level(logging.DEBUG, logger="vllm_probe")
    sched = testing.make_scheduler(testing.SchedulerSpec(**SPEC))
    assert trace(sched, workload()) == baseline
    assert sink.events == []
    assert rt.health.disabled == {"engine_config"}
    (warning,) = probe_warnings(caplog)
    assert "hook 'engine_config' disabled" in warning and "max_num_seqs" in warning


def test_hook_errors_reach_probe_stats(installed, baseline, monkeypatch, tmp_path):
    """The final statistics name the hook that failed and was switched off."""
    from vllm_probe.engine import hooks as probe
    from vllm_probe.sim import harness as testing
    from vllm_probe.engine.sink import EventSink

    monkeypatch.setattr(probe.SchedulerProbe, "on_added", lambda self, req: 1 / 0)
    _, rt, _ = installed()
    sink = EventSink(tmp_path / "events.jsonl", stats_extra=rt.health.snapshot)
    rt._sink = sink
    assert trace(testing.make_scheduler(testing.SchedulerSpec(**SPEC)), workload()) == baseline
    sink.close()
    stats = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()][-1]
    assert stats["event"] == "probe_stats"
    assert stats["hook_errors"]["request_added"] == probe.MAX_HOOK_ERRORS
    assert stats["hooks_disabled"] == ["request_added"]


# -- 4. missing or changed targets -------------------------------------------------------


def stand_in(scheduler_cls, name, drop=(), replace=None):
    """A class that looks to install() like a vLLM release's Scheduler.

    It holds copies of the real Scheduler's methods (so vLLM's code, including its
    ``super()`` calls, runs unchanged) minus ``drop`` and with ``replace`` swapped in.
    A dropped method is still inherited, unwrapped, so the engine keeps working:
    exactly what an older release without that method looks like to the probe.
    """
    ns = {k: v for k, v in scheduler_cls.__dict__.items()
          if k not in ("__dict__", "__weakref__") and k not in drop}
    ns.update(replace or {})
    return type(name, (scheduler_cls,), ns)


def test_missing_preempt_target_warns_and_other_hooks_work(installed, scheduler_cls, baseline, caplog):
    from vllm_probe.sim import harness as testing

    cls = stand_in(scheduler_cls, "OldScheduler", drop=("_preempt_request",))
    caplog.set_level(logging.WARNING, logger="vllm_probe")
    sink, _, patched = installed(cls, version="0.11.0")
    assert probe_warnings(caplog) == [
        "vllm-probe: OldScheduler._preempt_request missing in vLLM 0.11.0; "
        "preempt events are unavailable, other hooks still work"
    ]
    assert "OldScheduler._preempt_request" not in patched and "OldScheduler.schedule" in patched
    sched = testing.make_scheduler(testing.SchedulerSpec(**SPEC), scheduler_cls=cls)
    assert trace(sched, workload()) == baseline
    assert sink.of("preempt") == []
    assert len(sink.of("step")) == len(baseline)
    assert sorted(e["req_id"] for e in sink.of("request_finished")) == ["r0", "r1", "r2"]
    assert sink.of("engine_config")[0]["patched"] == patched


def test_changed_signature_warns_and_other_hooks_work(installed, scheduler_cls, baseline, caplog):
    from vllm_probe.sim import harness as testing

    real = scheduler_cls._preempt_request

    def _preempt_request(self, req, timestamp, drop_stale_output=False):  # renamed parameter
        return real(self, req, timestamp, drop_stale_output)

    cls = stand_in(scheduler_cls, "NewScheduler", replace={"_preempt_request": _preempt_request})
    caplog.set_level(logging.WARNING, logger="vllm_probe")
    sink, _, _ = installed(cls, version="0.40.0")
    assert probe_warnings(caplog) == [
        "vllm-probe: NewScheduler._preempt_request expected parameters (request), found "
        "(req, timestamp, drop_stale_output) in vLLM 0.40.0; preempt events are unavailable, "
        "other hooks still work"
    ]
    sched = testing.make_scheduler(testing.SchedulerSpec(**SPEC), scheduler_cls=cls)
    assert trace(sched, workload()) == baseline
    assert sink.of("preempt") == [] and sink.of("chunk")
    assert [s["step"] for s in sink.of("step")] == list(range(len(baseline)))


def test_required_target_changed_patches_nothing(installed, scheduler_cls, baseline, caplog):
    from vllm_probe.engine import hooks as probe
    from vllm_probe.sim import harness as testing

    real = scheduler_cls.__init__

    def __init__(self, *args, **kwargs):  # parameters no longer named
        real(self, *args, **kwargs)

    cls = stand_in(scheduler_cls, "OtherScheduler", replace={"__init__": __init__})
    caplog.set_level(logging.WARNING, logger="vllm_probe")
    sink, _, patched = installed(cls)
    assert patched == []
    (warning,) = probe_warnings(caplog)
    assert warning.startswith("vllm-probe: OtherScheduler.__init__ expected parameters (vllm_config, kv_cache_config)")
    assert warning.endswith("the probe patches nothing")
    assert not any(hasattr(v, probe.WRAPPED_ATTR) for v in cls.__dict__.values())
    sched = testing.make_scheduler(testing.SchedulerSpec(**SPEC), scheduler_cls=cls)
    assert trace(sched, workload()) == baseline and sink.events == []


@pytest.fixture
def plugin_env(monkeypatch, tmp_path, scheduler_cls):
    """VLLMPROBE_ENABLE=1 with a run dir under tmp_path; the plugin's patch undone after."""
    from vllm_probe import plugin
    from vllm_probe.engine import patches

    run_dir = tmp_path / "run"
    monkeypatch.setenv("VLLMPROBE_ENABLE", "1")
    monkeypatch.setenv("VLLMPROBE_RUN_DIR", str(run_dir))
    monkeypatch.setattr(plugin, "_registered", False)
    yield run_dir
    rt = patches.uninstall(scheduler_cls)
    if rt is not None:
        rt.close()


def test_untested_release_is_said_once(plugin_env, monkeypatch, caplog):
    import vllm

    from vllm_probe import plugin

    from vllm_probe.sim import harness as testing

    from vllm_probe.engine.compat import NEWEST_TESTED

    untested = f"{NEWEST_TESTED[0]}.{NEWEST_TESTED[1] + 1}.0"  # the minor after the matrix's newest
    monkeypatch.setattr(vllm, "__version__", untested)
    caplog.set_level(logging.WARNING, logger="vllm_probe")
    plugin.register()
    for _ in range(2):  # two schedulers in one process: still one line
        testing.make_scheduler(testing.SchedulerSpec(**SPEC))
    assert probe_warnings(caplog) == [
        f"vllm-probe: vLLM {untested} has not been tested with this probe; see docs/compatibility.md"
    ]


def test_too_old_release_patches_nothing(plugin_env, monkeypatch, caplog, scheduler_cls):
    import vllm

    from vllm_probe import plugin

    from vllm_probe.engine import hooks as probe

    monkeypatch.setattr(vllm, "__version__", "0.11.2")
    caplog.set_level(logging.WARNING, logger="vllm_probe")
    plugin.register()
    assert not hasattr(scheduler_cls.schedule, probe.WRAPPED_ATTR)
    (warning,) = probe_warnings(caplog)
    assert "vLLM 0.11.2 is older than 0.12" in warning and "patches nothing" in warning


# -- 5. loaded many times ------------------------------------------------------------------


def test_register_twice_and_a_second_copy_wrap_once(plugin_env, scheduler_cls, baseline, monkeypatch):
    from vllm_probe import plugin
    from vllm_probe.engine import hooks as probe, patches
    from vllm_probe.sim import harness as testing
    from vllm_probe.settings import ProbeFlags

    plugin.register()
    wrapped = scheduler_cls.schedule
    assert hasattr(wrapped, probe.WRAPPED_ATTR)
    plugin.register()  # vLLM calls it once per process, but a second call must be harmless
    monkeypatch.setattr(plugin, "_registered", False)
    plugin.register()  # even past the guard (e.g. a second copy of the plugin module)
    with monkeypatch.context() as m:  # a copy of the probe module with its own registry
        m.setattr(patches, "_installed", {})
        assert patches.install(scheduler_cls, probe.Runtime(ProbeFlags(), lambda rt: None), "0.32.0") == []
    assert scheduler_cls.schedule is wrapped
    assert not hasattr(getattr(wrapped, probe.WRAPPED_ATTR), probe.WRAPPED_ATTR)

    assert not plugin_env.exists()  # nothing is written before a scheduler exists
    sched = testing.make_scheduler(testing.SchedulerSpec(**SPEC))
    assert trace(sched, workload()) == baseline
    probe.attached_probe(sched).rt.sink.close()
    files = list(plugin_env.iterdir())
    assert [f.name for f in files] == [f"events-{__import__('os').getpid()}.jsonl"]
    events = [json.loads(line) for line in files[0].read_text().splitlines()]
    counts = defaultdict(int)
    for e in events:
        counts[e["event"]] += 1
    assert counts["engine_config"] == 1
    assert [e["step"] for e in events if e["event"] == "step"] == list(range(len(baseline)))
    assert counts["request_added"] == counts["request_finished"] == 3
    preempts = [(e["step"], e["req_id"]) for e in events if e["event"] == "preempt"]
    assert len(preempts) == len(set(preempts)) == sum(len(p) for _, p, _ in baseline)


def test_a_process_without_scheduler_writes_nothing(tmp_path):
    """API server and workers load the plugin too; they build no Scheduler: no file."""
    import os
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    env = {**os.environ, "VLLMPROBE_ENABLE": "1", "VLLMPROBE_RUN_DIR": str(run_dir)}
    code = ("from vllm_probe.plugin import register; register(); register(); "
            "from vllm.v1.core.sched.scheduler import Scheduler; "
            "assert hasattr(Scheduler.schedule, '__vllm_probe_original__')")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not run_dir.exists()


# -- 9. privacy ------------------------------------------------------------------------------


def test_events_hold_no_token_ids(installed):
    """Field names come from the schema only, and no value is a list of numbers."""
    from vllm_probe.sim import harness as testing
    from vllm_probe.schema.events import COMMON_FIELDS, KINDS

    sink, _, _ = installed()
    sched = testing.make_scheduler(testing.SchedulerSpec(max_num_batched_tokens=64, num_blocks=12))
    reqs = workload()
    prompt_ids = {tuple(r.prompt_token_ids) for r in reqs}
    trace(sched, reqs)
    assert sink.events
    for kind, fields in sink.events:
        assert set(fields) <= set(KINDS[kind].field_names)
        for value in fields.values():
            if isinstance(value, (list, tuple)):  # strings, or objects of single values (the KV-cache groups)
                assert all(isinstance(v, str) or (isinstance(v, dict) and not any(
                    isinstance(x, (list, tuple, dict)) for x in v.values())) for v in value), (kind, value)
    for kind in KINDS.values():
        for f in (*COMMON_FIELDS, *kind.fields):
            assert "token_ids" not in f.name and f.name != "prompt" and "text" not in f.name
            assert "list[int]" not in f.type
    assert all(len(ids) == 40 for ids in prompt_ids)


def test_the_probe_creates_no_socket(plugin_env, scheduler_cls):
    """Python's audit hooks see every socket created in the process (C level too):
    none while the plugin registers, the probe attaches, the scheduler runs with it
    and the sink writes and closes."""
    import sys

    from vllm_probe import plugin

    from vllm_probe.engine import hooks as probe

    from vllm_probe.sim import harness as testing

    sched0 = testing.make_scheduler(testing.SchedulerSpec(**SPEC))  # vLLM's own start-up, unprobed
    seen = []
    active = [True]

    def audit(event, args):
        if active[0] and event.startswith("socket."):
            seen.append(event)

    sys.addaudithook(audit)  # cannot be removed; `active` switches it off below
    try:
        plugin.register()
        sched = testing.make_scheduler(testing.SchedulerSpec(**SPEC))
        trace(sched, workload())
        probe.attached_probe(sched).rt.sink.close()
    finally:
        active[0] = False
    assert seen == []
    assert list(plugin_env.iterdir())  # the probe did run and write
    del sched0
