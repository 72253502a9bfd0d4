"""pytest plugin: the probe on every ``Scheduler`` vLLM's own tests build (``python -m tests.peer``).

Loaded into the run of vLLM's ``tests/v1/core/test_scheduler.py`` with ``-p _peer_plugin``
(``tests/`` of this project on ``PYTHONPATH``). At configure time it installs the probe
on vLLM's ``Scheduler`` through the project's patch table (:func:`vllm_probe.engine.install`,
every flag on: :class:`~vllm_probe.settings.ProbeFlags` defaults) and wraps, outside the
probe's wrappers:

* ``Scheduler.__init__``: each scheduler gets its own in-memory sink
  (:class:`vllm_probe.sim.harness.MemorySink`), so events of two schedulers of one test
  never mix;
* ``Scheduler.schedule``: what vLLM returned, per call: ``total_num_scheduled_tokens``,
  ``num_scheduled_tokens`` and the requests with draft tokens
  (``scheduled_spec_decode_tokens``): the oracle the events are checked against.

After each test, :func:`violations` checks every scheduler's events and one JSON line
per test goes to ``$VLLMPROBE_PEER_OUT``: the test id, schedulers built and probed,
steps, events, hook errors and the violations. The plugin never fails a test: vLLM's
verdicts stay vLLM's, the runner compares them with a run without the plugin.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from typing import Any

import pytest

ATTR = "_vllm_probe_peer"


class _Sched:
    """One scheduler built during a test: its sink and what its schedule() calls returned."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink
        self.outputs: list[tuple[int, dict[str, int], dict[str, int]]] = []  # (total, per request, drafts)


class _State:
    def __init__(self, rt: Any) -> None:
        self.rt = rt
        self.current: list[_Sched] = []
        self.out = os.environ.get("VLLMPROBE_PEER_OUT")
        self.errors_before = 0


def pytest_configure(config: pytest.Config) -> None:
    import vllm
    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_probe import engine as probe
    from vllm_probe.settings import ProbeFlags
    from vllm_probe.sim.harness import MemorySink

    flags = ProbeFlags()
    assert all(v for k, v in flags.to_dict().items() if k.startswith("log_")), "every event flag on"
    rt = probe.Runtime(flags, lambda _rt: MemorySink())
    patched = probe.install(Scheduler, rt, vllm.__version__)
    assert "Scheduler.schedule" in patched, patched
    state = _State(rt)
    config._vllm_probe_peer = state  # type: ignore[attr-defined]

    probed_init = Scheduler.__init__
    probed_schedule = Scheduler.schedule

    def __init__(self, *args, **kwargs):
        rec = _Sched(MemorySink())
        rt._sink = rec.sink  # this scheduler's probe binds its own sink at construction
        setattr(self, ATTR, rec)
        state.current.append(rec)
        probed_init(self, *args, **kwargs)

    def schedule(self, *args, **kwargs):
        out = probed_schedule(self, *args, **kwargs)
        rec = getattr(self, ATTR, None)
        if rec is not None:
            try:
                drafts = getattr(out, "scheduled_spec_decode_tokens", None) or {}
                rec.outputs.append((out.total_num_scheduled_tokens, dict(out.num_scheduled_tokens),
                                    {r: len(d) for r, d in drafts.items()}))
            except Exception:  # a test's Mock output: no oracle for this step
                rec.outputs.append((-1, {}, {}))
        return out

    Scheduler.__init__ = __init__
    Scheduler.schedule = schedule


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    state: _State = item.config._vllm_probe_peer  # type: ignore[attr-defined]
    state.current = []
    state.errors_before = sum(state.rt.health.errors.values())
    yield
    scheds = state.current
    state.current = []
    found: list[str] = []
    steps = events = 0
    probed = 0
    for rec in scheds:
        evs = rec.sink.events
        probed += any(k == "engine_config" for k, _ in evs)
        steps += sum(1 for k, _ in evs if k == "step")
        events += len(evs)
        found += violations(evs, rec.outputs)
    row = {"test": item.nodeid, "schedulers": len(scheds), "probed": probed, "steps": steps, "events": events,
           "hook_errors": sum(state.rt.health.errors.values()) - state.errors_before, "violations": found[:20],
           "n_violations": len(found)}
    if state.out:
        with open(state.out, "a") as f:
            f.write(json.dumps(row) + "\n")


def violations(events: list[tuple[str, dict]], outputs: list[tuple[int, dict, set]]) -> list[str]:
    """The invariants one scheduler's events break (empty: none). ``outputs``: what each
    ``schedule()`` call returned, in order (the oracle).

    * every event is valid as its record (types, non-negative counts, shares in 0..1);
    * one ``engine_config`` first; step indices 0, 1, 2, … one per ``schedule()`` call,
      each with vLLM's ``total_num_scheduled_tokens``;
    * prefill + decode tokens = scheduled tokens;
    * each request's chunks: a pass starts at chunk 0, chunks are contiguous
      (``start`` = previous ``end``), non-empty, within ``prefill_len``, ``last`` exactly
      when ``end`` reaches it, of the size vLLM scheduled for that request in that step
      less its draft tokens (speculative decoding: drafts are decode work);
    * every preempted request was running (scheduled since it was last added or resumed,
      not finished), and its next chunk, if any, starts a resumed pass at chunk 0;
    * a request added through ``add_request`` finishes at most as often as it was added
      (a test that puts requests into the scheduler's queues itself, as
      ``test_stop_via_update_from_output`` does, finishes requests never added: not
      checked).
    """
    from vllm_probe.schema.records import from_dict

    bad: list[str] = []
    if not events:
        return bad
    if events[0][0] != "engine_config":
        bad.append(f"first event is {events[0][0]}, not engine_config")
    step = -1
    chunks_at: dict[str, dict] = {}  # req -> last chunk of its current pass
    running: set[str] = set()  # scheduled since added/resumed, not finished or preempted
    preempted: set[str] = set()
    added: dict[str, int] = defaultdict(int)
    finished: dict[str, int] = defaultdict(int)
    step_chunks: list[dict] = []
    for kind, ev in events:
        if from_dict({"event": kind, "ts": 0.0, **{k: v for k, v in ev.items() if v is not None}}) is None:
            bad.append(f"{kind} not valid as its record: {ev}")
        if kind == "step":
            step += 1
            if ev["step"] != step:
                bad.append(f"step {ev['step']} where {step} was due")
            if step < len(outputs):
                total, per_req, drafts = outputs[step]
                if total >= 0:
                    if ev["scheduled_tokens"] != total:
                        bad.append(f"step {step}: scheduled_tokens {ev['scheduled_tokens']} != vLLM's {total}")
                    for c in step_chunks:
                        n = per_req.get(c["req_id"])
                        n = None if n is None else n - drafts.get(c["req_id"], 0)
                        if n != c["end"] - c["start"]:
                            bad.append(f"step {step}: chunk of {c['req_id']} is {c['end'] - c['start']} tokens, "
                                       f"vLLM scheduled {n} besides draft tokens")
                    running.update(per_req)
            else:
                bad.append(f"step {step} without a schedule() call")
            prefill = ev["prefill_tokens"]
            if prefill is not None and prefill + ev["decode_tokens"] != ev["scheduled_tokens"]:
                bad.append(f"step {step}: prefill {ev['prefill_tokens']} + decode {ev['decode_tokens']} != "
                           f"{ev['scheduled_tokens']}")
            step_chunks = []
        elif kind == "chunk":
            rid = ev["req_id"]
            step_chunks.append(ev)
            prev = chunks_at.get(rid)
            if ev["step"] != step + 1:
                bad.append(f"chunk of {rid} stamped step {ev['step']} during step {step + 1}")
            if ev["chunk_index"] == 0:
                if rid in preempted and not ev["resumed"]:
                    bad.append(f"{rid}: first chunk after a preemption not marked resumed")
                preempted.discard(rid)
            elif prev is None or ev["chunk_index"] != prev["chunk_index"] + 1 or ev["start"] != prev["end"]:
                bad.append(f"{rid}: chunk {ev['chunk_index']} [{ev['start']}, {ev['end']}) does not continue "
                           f"{None if prev is None else (prev['chunk_index'], prev['end'])}")
            if not ev["start"] < ev["end"] <= ev["prefill_len"]:
                bad.append(f"{rid}: chunk [{ev['start']}, {ev['end']}) outside prefill_len {ev['prefill_len']}")
            if bool(ev["last"]) != (ev["end"] >= ev["prefill_len"]):
                bad.append(f"{rid}: chunk ending at {ev['end']} of {ev['prefill_len']} has last={ev['last']}")
            chunks_at[rid] = ev
        elif kind == "preempt":
            rid = ev["req_id"]
            if rid not in running:
                bad.append(f"step {ev['step']}: preempted {rid}, which was not running")
            running.discard(rid)
            preempted.add(rid)
            chunks_at.pop(rid, None)
        elif kind == "request_added":
            added[ev["req_id"]] += 1
        elif kind == "request_finished":
            rid = ev["req_id"]
            finished[rid] += 1
            running.discard(rid)
            if added[rid] and finished[rid] > added[rid]:
                bad.append(f"{rid} finished {finished[rid]} times, added {added[rid]}")
    if step + 1 != len(outputs):
        bad.append(f"{step + 1} step events for {len(outputs)} schedule() calls")
    return bad
