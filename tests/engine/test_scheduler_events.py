"""The hooks on vLLM's real Scheduler, driven without a model (vllm_probe.sim.harness).

Oracles are independent of the probe: the test loop snapshots the scheduler (computed
tokens of every running request before each step; queue lengths and scheduled tokens
after) and the events must agree with those snapshots exactly.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from tests.conftest import requires_vllm

pytestmark = requires_vllm


@pytest.fixture(scope="module")
def vllm_mod():
    from vllm.v1.core.sched.scheduler import Scheduler

    return Scheduler


@pytest.fixture
def probed(vllm_mod):
    """Install the probe with all flags on into a MemorySink; uninstall afterwards."""
    import vllm

    from vllm_probe import engine as probe

    from vllm_probe.sim import harness as testing
    from vllm_probe.settings import ProbeFlags

    def make(flags: ProbeFlags | None = None):
        sink = testing.MemorySink()
        rt = probe.Runtime(flags or ProbeFlags(), lambda _rt: sink)
        patched = probe.install(vllm_mod, rt, vllm.__version__)  # the release under test
        assert "Scheduler.schedule" in patched
        return sink, rt

    yield make
    probe.uninstall(vllm_mod)


def drive(sched, requests, max_steps=5000):
    """Run to idle, recording independent snapshots per step index."""
    from vllm_probe.sim import harness as testing

    for r in requests:
        sched.add_request(r)
    before, after = [], []
    for _ in range(max_steps):
        if not sched.has_requests():
            break
        before.append({r.request_id: r.num_computed_tokens for r in sched.running})
        out = testing.step(sched)
        after.append({
            "scheduled": out.total_num_scheduled_tokens,
            "n_reqs": len(out.num_scheduled_tokens),
        })
    else:
        raise AssertionError("workload did not finish")
    return before, after


def chunks_by_request(sink):
    by_req = defaultdict(list)
    for c in sink.of("chunk"):
        by_req[c["req_id"]].append(c)
    return by_req


def split_passes(chunks):
    """Split a request's chunk events into prefill passes (chunk_index restarts at 0)."""
    passes = []
    for c in chunks:
        if c["chunk_index"] == 0:
            passes.append([])
        passes[-1].append(c)
    return passes


def assert_tiles(pass_chunks, complete=True):
    """A pass's chunks tile [prefix hit, prefill_len) with `last` only on the final one.

    ``complete=False``: a pass cut short by a preemption; its chunks tile
    [prefix hit, end of the last chunk) and none is `last`.
    """
    first = pass_chunks[0]
    assert first["prefix_hit_tokens"] == first["start"]
    pos = first["start"]
    for i, c in enumerate(pass_chunks):
        assert c["chunk_index"] == i
        assert c["start"] == pos, (c, pos)
        assert c["end"] > c["start"]
        pos = c["end"]
        assert c["last"] == (complete and i == len(pass_chunks) - 1)
        if i:
            assert c["prefix_hit_tokens"] is None
    if complete:
        assert pos == first["prefill_len"]
    else:
        assert pos < first["prefill_len"]


def assert_step_invariants(sink, after, budget):
    steps = sink.of("step")
    assert [s["step"] for s in steps] == list(range(len(after)))
    chunk_tokens = defaultdict(int)
    chunk_count = defaultdict(int)
    for c in sink.of("chunk"):
        chunk_tokens[c["step"]] += c["end"] - c["start"]
        chunk_count[c["step"]] += 1
    for s, snap in zip(steps, after):
        assert s["scheduled_tokens"] == snap["scheduled"]
        assert s["token_budget"] == budget
        assert s["scheduled_tokens"] <= budget
        assert s["prefill_tokens"] == chunk_tokens[s["step"]]
        assert s["prefill_reqs"] == chunk_count[s["step"]]
        assert s["scheduled_tokens"] == s["prefill_tokens"] + s["decode_tokens"]
        assert s["prefill_reqs"] + s["decode_reqs"] == snap["n_reqs"]


def test_exact_chunk_boundaries_two_requests(probed):
    """Budget 128: a 300-token prompt is cut 128/128/44; the 50-token one fits beside the 44."""
    from vllm_probe.sim import harness as testing

    sink, _ = probed()
    sched = testing.make_scheduler(testing.SchedulerSpec(max_num_batched_tokens=128, num_blocks=200))
    a = testing.make_request(300, 3, req_id="A")
    b = testing.make_request(50, 3, req_id="B")
    _, after = drive(sched, [a, b])
    got = [(c["step"], c["req_id"], c["chunk_index"], c["start"], c["end"], c["last"]) for c in sink.of("chunk")]
    assert got == [
        (0, "A", 0, 0, 128, False),
        (1, "A", 1, 128, 256, False),
        (2, "A", 2, 256, 300, True),
        (2, "B", 0, 0, 50, True),
    ]
    assert all(c["prompt_len"] == c["prefill_len"] for c in sink.of("chunk"))
    steps = sink.of("step")
    assert (steps[2]["prefill_reqs"], steps[2]["prefill_tokens"], steps[2]["new_reqs"]) == (2, 94, 1)
    # A samples its first token at step 2; at step 3 both decode.
    assert (steps[3]["decode_reqs"], steps[3]["decode_tokens"], steps[3]["prefill_reqs"]) == (2, 2, 0)
    assert_step_invariants(sink, after, 128)
    finished = {e["req_id"]: e for e in sink.of("request_finished")}
    assert finished["A"]["output_tokens"] == 3 and finished["A"]["reason"] == "length"
    added = sink.of("request_added")
    assert [(e["req_id"], e["prompt_len"], e["max_tokens"]) for e in added] == [("A", 300, 3), ("B", 50, 3)]


def test_chunks_tile_prompts_and_steps_add_up(probed):
    from vllm_probe.sim import harness as testing

    sink, _ = probed()
    sched = testing.make_scheduler(testing.SchedulerSpec(max_num_batched_tokens=96, num_blocks=300))
    lens = [300, 50, 129, 700, 17, 96]
    reqs = [testing.make_request(n, 4) for n in lens]
    _, after = drive(sched, reqs)
    by_req = chunks_by_request(sink)
    assert set(by_req) == {r.request_id for r in reqs}
    for r, n in zip(reqs, lens):
        (only_pass,) = split_passes(by_req[r.request_id])
        assert only_pass[0]["start"] == 0 and only_pass[-1]["end"] == n
        assert_tiles(only_pass)
        assert not any(c["resumed"] for c in only_pass)
    assert len(by_req[reqs[3].request_id]) >= 700 // 96 + 1
    assert_step_invariants(sink, after, 96)
    assert sink.of("preempt") == []


def test_prefix_cache_hit_on_first_chunk(probed):
    """With prefix caching, a prompt sharing 64 tokens (4 blocks of 16) starts at 64."""
    from vllm_probe.sim import harness as testing

    sink, _ = probed()
    sched = testing.make_scheduler(testing.SchedulerSpec(
        max_num_batched_tokens=64, num_blocks=100, enable_prefix_caching=True))
    prefix = list(range(10, 74))
    drive(sched, [testing.make_request(100, 2, req_id="first", prefix=prefix)])
    drive(sched, [testing.make_request(100, 2, req_id="second", prefix=prefix)])
    second = chunks_by_request(sink)["second"]
    assert [(c["start"], c["end"], c["prefix_hit_tokens"]) for c in second] == [(64, 100, 64)]
    assert second[0]["last"] is True


def test_preemptions_name_victim_and_discarded_tokens(probed):
    """KV of 11 usable blocks, 3 requests growing to 7 blocks each: vLLM must preempt."""
    from vllm_probe.sim import harness as testing

    sink, _ = probed()
    sched = testing.make_scheduler(testing.SchedulerSpec(max_num_batched_tokens=64, num_blocks=12))
    reqs = [testing.make_request(40, 60, req_id=f"r{i}") for i in range(3)]
    before, after = drive(sched, reqs)
    preempts = sink.of("preempt")
    assert preempts, "workload was meant to preempt"
    steps = sink.of("step")
    by_req = chunks_by_request(sink)
    count = defaultdict(int)
    for p in preempts:
        # the victim's computed tokens at the start of that step, seen by the test loop
        assert p["discarded_tokens"] == before[p["step"]][p["req_id"]]
        assert p["req_id"] in steps[p["step"]]["preempted"]
        count[p["req_id"]] += 1
        assert p["num_preemptions"] == count[p["req_id"]]
        assert p["prompt_len"] == 40 and p["reason"] == "kv_cache"
        last_chunk = [c for c in by_req[p["req_id"]] if c["step"] < p["step"]][-1]
        if last_chunk["last"]:
            # a decoding victim has computed its prompt and all outputs but the last sampled one
            assert p["discarded_tokens"] == p["prompt_len"] + p["output_tokens"] - 1
        else:
            # preempted in the middle of a (re-)prefill: it loses what its chunks computed
            assert p["discarded_tokens"] == last_chunk["end"]
    assert sum(len(s["preempted"]) for s in steps) == len(preempts)
    # every preempted request re-prefills: a resumed pass per preemption, which tiles up to
    # prompt + outputs, or up to the tokens discarded by the preemption that cut it short
    for rid in count:
        passes = split_passes(by_req[rid])
        resumed = [p for p in passes if p[0]["resumed"]]
        assert len(resumed) == count[rid]
        victims = [p for p in preempts if p["req_id"] == rid]
        for ps in passes:
            cut = next((p for p in victims if p["step"] > ps[-1]["step"]), None)
            complete = ps[-1]["last"]
            assert_tiles(ps, complete=complete)
            if not complete:
                assert cut is not None and cut["discarded_tokens"] == ps[-1]["end"]
        for ps, victim in zip(resumed, victims):
            assert victim["step"] < ps[0]["step"]
            assert ps[0]["prefill_len"] == victim["prompt_len"] + victim["output_tokens"]
    assert_step_invariants(sink, after, 64)
    finished = sink.of("request_finished")
    assert sorted(e["req_id"] for e in finished) == ["r0", "r1", "r2"]
    assert all(e["output_tokens"] == 60 for e in finished)
    assert {e["req_id"]: e["num_preemptions"] for e in finished} == {r: count.get(r, 0) for r in ("r0", "r1", "r2")}


def test_engine_config_reports_effective_settings(probed):
    from vllm_probe.sim import harness as testing

    sink, _ = probed()
    testing.make_scheduler(testing.SchedulerSpec(max_num_batched_tokens=80, max_num_seqs=7, num_blocks=33,
                                                 block_size=16))
    (cfg,) = sink.of("engine_config")
    assert cfg["max_num_batched_tokens"] == 80
    assert cfg["max_num_seqs"] == 7
    assert cfg["num_kv_blocks"] == 33 and cfg["block_size"] == 16
    assert cfg["kv_capacity_tokens"] == 32 * 16
    assert cfg["enable_chunked_prefill"] is True and cfg["prefix_caching"] is False
    assert cfg["scheduling_policy"] == "fcfs"
    assert cfg["scheduler_class"] == "Scheduler"
    assert "Scheduler._preempt_request" in cfg["patched"]


def test_engine_config_records_the_scheduler_inputs_a_replay_needs(probed):
    """The optional fields ``whatif`` rebuilds a scheduler from: the values the harness
    configured where the release has the setting, absent (None) where it has not."""
    from vllm.config import SchedulerConfig

    from vllm_probe.sim import harness as testing

    sink, _ = probed()
    sched = testing.make_scheduler(testing.SchedulerSpec(max_num_batched_tokens=96, num_blocks=33, block_size=16))
    (cfg,) = sink.of("engine_config")
    fields = SchedulerConfig.__dataclass_fields__
    assert cfg["max_num_scheduled_tokens"] == (96 if hasattr(sched, "max_num_scheduled_tokens") else None)
    assert cfg["scheduler_reserve_full_isl"] == (True if "scheduler_reserve_full_isl" in fields else None)
    assert cfg["watermark"] == (0.0 if "watermark" in fields else None)
    assert cfg["long_prefill_token_threshold_adaptive"] == (
        False if "long_prefill_token_threshold_adaptive" in fields else None)
    assert cfg["max_num_active_seqs"] is None  # not set below max_num_seqs
    assert cfg["hash_block_size"] == 16
    assert cfg["kv_cache_groups"] == ["FullAttentionSpec"]
    # one layer, 1 KV head of 64 float32 values, K and V, 16 tokens a block
    assert cfg["kv_block_bytes"] == 2 * 16 * 64 * 4
    assert cfg["gpu_memory_utilization"] == 0.3
    assert cfg["num_gpu_blocks_override"] is None and cfg["num_speculative_tokens"] is None


def test_block_digests_equal_exactly_on_shared_prompt_blocks(probed):
    """With prefix caching, a prompt's full blocks get salted digests: two prompts sharing
    their first 48 tokens (3 blocks of 16) share exactly their first 3 digests; the
    partial last block has none; no token id appears; the salt differs per scheduler."""
    from vllm_probe.sim import harness as testing

    sink, _ = probed()
    spec = testing.SchedulerSpec(max_num_batched_tokens=256, num_blocks=100, enable_prefix_caching=True)
    sched = testing.make_scheduler(spec)
    prefix = list(range(10, 58))
    sched.add_request(testing.make_request(100, 2, req_id="a", prefix=prefix))
    sched.add_request(testing.make_request(90, 2, req_id="b", prefix=prefix))
    a, b = (e["block_digests"] for e in sink.of("request_added"))
    assert len(a) == 100 // 16 and len(b) == 90 // 16
    assert a[:3] == b[:3] and not set(a[3:]) & set(b[3:])
    assert all(len(d) == 16 and int(d, 16) >= 0 for d in a + b)
    testing.make_scheduler(spec).add_request(testing.make_request(100, 2, req_id="c", prefix=prefix))
    (c,) = [e["block_digests"] for e in sink.of("request_added") if e["req_id"] == "c"]
    assert not set(c) & set(a)  # another scheduler, another salt: nothing compares across


@pytest.mark.parametrize("caching,digests", [(False, True), (True, False)])
def test_block_digests_only_with_prefix_caching_and_their_flag(probed, caching, digests):
    from vllm_probe.settings import ProbeFlags
    from vllm_probe.sim import harness as testing

    sink, _ = probed(ProbeFlags(log_block_digests=digests))
    sched = testing.make_scheduler(testing.SchedulerSpec(enable_prefix_caching=caching))
    sched.add_request(testing.make_request(100, 2, req_id="a"))
    (added,) = sink.of("request_added")
    assert added["block_digests"] is None and added["prompt_len"] == 100


@pytest.mark.parametrize("flag,kind", [
    ("log_schedule_each_step", "step"),
    ("log_preempt_events", "preempt"),
    ("log_chunk_boundaries", "chunk"),
    ("log_request_events", "request_added"),
])
def test_each_flag_off_removes_only_its_events(probed, flag, kind):
    from vllm_probe.sim import harness as testing
    from vllm_probe.settings import ProbeFlags

    sink, _ = probed(ProbeFlags(**{flag: False}))
    sched = testing.make_scheduler(testing.SchedulerSpec(max_num_batched_tokens=64, num_blocks=12))
    drive(sched, [testing.make_request(40, 60) for _ in range(3)])
    kinds = {k for k, _ in sink.events}
    assert kind not in kinds
    expected = {"engine_config", "step", "preempt", "chunk", "request_added", "request_finished"}
    if kind == "request_added":
        expected.discard("request_finished")
    assert kinds == expected - {kind}


def test_async_scheduler_wrapped_once(probed):
    """AsyncScheduler calls super(): one step event per schedule(), no duplicate chunks."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from vllm_probe.sim import harness as testing

    sink, _ = probed()
    sched = testing.make_scheduler(
        testing.SchedulerSpec(max_num_batched_tokens=64, num_blocks=200), scheduler_cls=AsyncScheduler)
    assert "schedule" not in AsyncScheduler.__dict__  # reached through the base class
    sched.add_request(testing.make_request(150, 2, req_id="x"))
    calls = 0
    while sched.has_requests() and calls < 50:
        testing.step(sched)
        calls += 1
    assert len(sink.of("step")) == calls
    chunks = [(c["start"], c["end"]) for c in sink.of("chunk")]
    assert chunks == [(0, 64), (64, 128), (128, 150)]
    assert sink.of("engine_config")[0]["scheduler_class"] == "AsyncScheduler"


def test_install_is_idempotent(probed, vllm_mod):
    from vllm_probe.engine import hooks as probe, patches

    _, rt = probed()
    wrapped = vllm_mod.schedule
    original = getattr(wrapped, probe.WRAPPED_ATTR)
    assert patches.install(vllm_mod, rt, rt.vllm_version) == rt.patched
    assert vllm_mod.schedule is wrapped
    assert getattr(vllm_mod.schedule, probe.WRAPPED_ATTR) is original
    assert not hasattr(original, probe.WRAPPED_ATTR)


# -- emit by name: the schema evolves without breaking the hooks ----------------------------

HOOK_KINDS = ("ENGINE_CONFIG", "STEP", "CHUNK", "PREEMPT", "REQUEST_ADDED", "REQUEST_FINISHED")


def _appended(monkeypatch, field, names=HOOK_KINDS):
    """Each kind in ``names`` as a later schema might have it: ``field`` appended (after
    ``flags`` for engine_config: the place a positional slice broke). The hooks and the
    sink read their kinds at call time, so they get these."""
    import dataclasses

    from vllm_probe.engine import hooks, sink
    from vllm_probe.schema import events

    for name in names:
        kind = getattr(events, name)
        monkeypatch.setattr(hooks, name, dataclasses.replace(kind, fields=kind.fields + (field,)))
    monkeypatch.setattr(sink, "PROBE_STATS", dataclasses.replace(
        events.PROBE_STATS, fields=events.PROBE_STATS.fields + (field,)))


def _run_into_file(vllm_mod, path):
    """The preempting workload, probed into an EventSink file; returns its masked lines."""
    from tests._workload import SPEC, trace, workload
    from tests.engine.test_event_bytes import mask
    from vllm_probe.engine import hooks, patches
    from vllm_probe.engine.sink import EventSink
    from vllm_probe.settings import ProbeFlags
    from vllm_probe.sim import harness as testing

    rt = hooks.Runtime(ProbeFlags(), lambda rt: EventSink(path, stats_extra=rt.health.snapshot))
    patches.install(vllm_mod, rt, "0.32.0")
    try:
        trace(testing.make_scheduler(testing.SchedulerSpec(**SPEC)), workload())
    finally:
        patches.uninstall(vllm_mod)
        rt.close()
    return rt, mask(path.read_bytes()).splitlines()


def test_an_optional_field_appended_to_every_kind_breaks_no_hook(vllm_mod, monkeypatch, tmp_path):
    """Every hook still emits, no hook counts an error, and the lines are the same bytes:
    a field no emit site passes yet is None, and an optional None is left out."""
    from vllm_probe.schema.events import Field

    _, before = _run_into_file(vllm_mod, tmp_path / "before.jsonl")
    _appended(monkeypatch, Field("added_later", "int", "-", "A field a later schema adds.", optional=True))
    rt, after = _run_into_file(vllm_mod, tmp_path / "after.jsonl")
    assert rt.health.errors == dict.fromkeys(rt.health.errors, 0) and not rt.health.disabled
    kinds = {line.split(b'"event": "')[1].split(b'"')[0].decode() for line in after}
    assert kinds == {"engine_config", "step", "chunk", "preempt", "request_added", "request_finished",
                     "probe_stats"}
    assert after == before


def test_an_optional_field_appended_reaches_every_event_as_none(probed, monkeypatch):
    """The same schema change through the MemorySink: every kind is emitted, each event
    carries the new field as None and engine_config's fields keep their values."""
    from tests._workload import SPEC, trace, workload
    from vllm_probe.schema.events import Field
    from vllm_probe.settings import ProbeFlags
    from vllm_probe.sim import harness as testing

    _appended(monkeypatch, Field("added_later", "int", "-", "A field a later schema adds.", optional=True))
    sink, rt = probed()
    trace(testing.make_scheduler(testing.SchedulerSpec(**SPEC)), workload())
    assert {k for k, _ in sink.events} == {"engine_config", "step", "chunk", "preempt", "request_added",
                                          "request_finished"}
    assert not rt.health.disabled
    assert all(e["added_later"] is None for _, e in sink.events)
    config = sink.of("engine_config")[0]
    assert config["flags"] == ProbeFlags().to_dict() and config["data_parallel_size"] == 1


@pytest.mark.parametrize("name", HOOK_KINDS)
def test_a_required_field_appended_fails_at_the_emit_site(probed, monkeypatch, name, caplog):
    """A required field no emit site passes is a TypeError naming it, in that hook only
    (counted, switched off with one warning): never a line with the field missing."""
    import logging

    from tests._workload import SPEC, probe_warnings, trace, workload
    from vllm_probe.schema.events import Field
    from vllm_probe.sim import harness as testing

    hook = name.lower()
    caplog.set_level(logging.WARNING, logger="vllm_probe")
    _appended(monkeypatch, Field("added_later", "int", "-", "A required field.", optional=False), names=(name,))
    sink, rt = probed()
    trace(testing.make_scheduler(testing.SchedulerSpec(**SPEC)), workload())
    assert rt.health.disabled == {hook}
    assert hook not in {k for k, _ in sink.events}
    (warning,) = probe_warnings(caplog)
    assert f"hook '{hook}' disabled" in warning and "Missing required argument 'added_later'" in warning
