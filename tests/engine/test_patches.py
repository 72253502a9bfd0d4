"""The patch table (vllm_probe/engine/patches.py): one entry per hook, checked against the
vLLM imported here; which entries the flags install; install and uninstall."""

from __future__ import annotations

import itertools

import pytest

from tests.conftest import requires_vllm
from vllm_probe.engine import compat, hooks, patches
from vllm_probe.settings import ProbeFlags

EVENT_FLAGS = ("log_schedule_each_step", "log_preempt_events", "log_chunk_boundaries", "log_request_events")


def test_one_entry_per_hook_and_per_method():
    hook_names = [p.hook for p in patches.PATCHES]
    methods = [p.method for p in patches.PATCHES]
    assert len(set(hook_names)) == len(hook_names) and len(set(methods)) == len(methods)
    flag_fields = set(ProbeFlags().to_dict())
    for p in patches.PATCHES:
        assert set(p.flags) <= flag_fields & set(EVENT_FLAGS), p.hook
        assert p.why and callable(p.wrap)
        assert not (p.required and p.flags), f"{p.hook}: a required hook is installed whatever the flags"


@pytest.mark.parametrize("on", [c for n in range(len(EVENT_FLAGS) + 1) for c in itertools.combinations(EVENT_FLAGS, n)])
def test_the_flags_choose_the_hooks(on):
    """The rule the table encodes: engine_config and step always (the step index feeds every
    event); chunk for chunk or step events (the prefill/decode split); preempt for preempt,
    chunk or step events (a preempted request re-prefills; step.preempted); the request
    hooks for request events; spec_decode (update_from_output) for step or request events
    (step.accepted_tokens, request_finished.draft_verifications)."""
    flags = ProbeFlags(**{f: f in on for f in EVENT_FLAGS})
    wanted = {p.hook for p in patches.PATCHES if p.wanted(flags)}
    expected = {"engine_config", "step"}
    if {"log_chunk_boundaries", "log_schedule_each_step"} & set(on):
        expected |= {"chunk", "preempt"}
    if "log_preempt_events" in on:
        expected.add("preempt")
    if "log_request_events" in on:
        expected |= {"request_added", "request_finished"}
    if {"log_schedule_each_step", "log_request_events"} & set(on):
        expected.add("spec_decode")
    assert wanted == expected


@requires_vllm
def test_every_entry_fits_this_releases_scheduler():
    """Each method exists on vLLM's Scheduler with the leading parameters its wrapper uses."""
    from importlib import import_module

    cls = getattr(import_module(patches.SCHEDULER_MODULE), patches.SCHEDULER_CLASS)
    for p in patches.PATCHES:
        original = cls.__dict__.get(p.method)
        assert original is not None, p.method
        assert compat.signature_problem(original, p.params) is None, p.method


@requires_vllm
def test_install_only_what_the_flags_need_and_uninstall_restores():
    from vllm.v1.core.sched.scheduler import Scheduler

    originals = {p.method: Scheduler.__dict__[p.method] for p in patches.PATCHES}
    flags = ProbeFlags(log_schedule_each_step=False, log_chunk_boundaries=False, log_request_events=False)
    rt = hooks.Runtime(flags, lambda _rt: None)
    try:
        assert patches.install(Scheduler, rt, "0.32.0") == [
            "Scheduler.__init__", "Scheduler.schedule", "Scheduler._preempt_request"]
        for p in patches.PATCHES:
            wrapped = getattr(Scheduler.__dict__[p.method], hooks.WRAPPED_ATTR, None)
            assert wrapped is (originals[p.method] if p.hook in ("engine_config", "step", "preempt") else None)
        # every hook of the table is counted, in table order, whether installed or not
        assert rt.health.snapshot() == ({p.hook: 0 for p in patches.PATCHES}, [])
    finally:
        assert patches.uninstall(Scheduler) is rt
    assert {p.method: Scheduler.__dict__[p.method] for p in patches.PATCHES} == originals
    assert patches.uninstall(Scheduler) is None  # nothing left to undo
