"""Each doctor rule pinned to its mechanism on hand-made streams: the same mechanism at
different step times (1 ms and 50 ms per step) gives the same finding with the same
evidence; exact evidence values worked out by hand."""

from __future__ import annotations

import pytest

from tests._events import Stream
from vllm_probe.analysis.doctor import diagnose
from vllm_probe.analysis.episodes import Episodes
from vllm_probe.analysis.state import RunState

#: Step times compared: a fast and a slow machine (or a quiet and a busy one).
STEP_TIMES = (0.001, 0.05)


def _found(s: Stream) -> dict:
    ep = Episodes()
    state = RunState(listener=ep).apply_all(s.records)
    return {f.id: f for f in diagnose(state, ep)}


def _same(a, b) -> None:
    """The same finding: message, evidence and remedy as ``--json`` writes them."""
    da, db = a.to_dict(), b.to_dict()
    assert da == db


# -- held-slots ---------------------------------------------------------------------------------

SEQS = 16
PROMPT = 256


def _held_stream(shape: str, dt: float, pairs: int = 20, *, scheduler: str = "AsyncScheduler") -> Stream:
    """An AsyncScheduler engine core, max_num_seqs 16, 500 one-token requests of 256 tokens
    waiting from the start (vLLM #45257's case, design.md §7), ``dt`` seconds per step.

    ``busy``: 16 admitted (4,096 tokens), then a step of 0 tokens while all 16 slots are
    held by requests whose last token is in flight. ``quiet``: 15 admitted (3,840 tokens)
    beside 1 held slot, then 1 admitted (256 tokens) beside 15 held slots.
    """
    s = Stream()
    s.config(10.0, budget=4096, max_num_seqs=SEQS, scheduler_class=scheduler,
             async_scheduling=scheduler == "AsyncScheduler", num_kv_blocks=4096, block_size=16)
    waiting, n, t = 500, 0, 11.0
    pattern = {"busy": (16, 0), "quiet": (15, 1)}[shape]
    for _ in range(pairs):
        for admitted in pattern:
            waiting -= admitted
            ev = s.step(t, n, 4096, prefill=admitted * PROMPT, running=SEQS, waiting=waiting, kv=0.12,
                        prefill_reqs=admitted)
            ev["head_blocked_by"] = "token_budget" if admitted == 16 else "deferred"
            n += 1
            t += dt
    return s


@pytest.mark.parametrize("shape", ["busy", "quiet"])
def test_held_slots_same_finding_at_any_step_time(shape):
    fast, slow = (_found(_held_stream(shape, dt)) for dt in STEP_TIMES)
    assert "held-slots" in fast and "stall" not in fast  # the 0-token steps are a symptom of the held slots
    _same(fast["held-slots"], slow["held-slots"])


def test_held_slots_busy_shape_evidence():
    f = _found(_held_stream("busy", 0.001))["held-slots"]
    ev = f.to_dict()["evidence"]
    # every second step schedules 0 tokens with all 16 slots held
    assert ev == {"held_steps": 20, "waiting_steps": 40, "share_of_waiting_steps": 0.5, "held_slot_steps": 320,
                  "held_slot_share": 0.5, "held_max": 16, "step_range": [1, 39], "max_num_seqs": 16, "running_max": 16,
                  "waiting_max": 484,
                  "tokens_min": 0, "tokens_max": 0, "tokens_mean": 0.0, "head_blocked_by": {"deferred": 20},
                  "scheduler_class": "AsyncScheduler"}
    assert (f.remedy.setting, f.remedy.value) == ("async_scheduling", False)
    assert f.remedy.alternatives[0]["setting"] == "max_num_seqs" and f.remedy.alternatives[0]["value"] == 32


def test_held_slots_quiet_shape_evidence():
    """The quiet machine's shape (3,840 / 256 tokens) is the same mechanism: 1 then 15 held."""
    ev = _found(_held_stream("quiet", 0.05))["held-slots"].to_dict()["evidence"]
    assert ev["held_steps"] == 40 and ev["waiting_steps"] == 40 and ev["held_slot_steps"] == 20 * (1 + 15)
    assert ev["held_max"] == 15 and (ev["tokens_min"], ev["tokens_max"]) == (256, 3840)
    assert ev["tokens_mean"] == 2048.0 and ev["head_blocked_by"] == {"deferred": 40}


def test_no_held_slots_under_the_synchronous_scheduler():
    """The same queue shape under the synchronous Scheduler: no held slot (a finished request
    leaves the running queue before the next schedule())."""
    assert "held-slots" not in _found(_held_stream("quiet", 0.001, scheduler="Scheduler"))


def test_held_slots_not_for_one_finishing_request_per_step():
    """Long outputs: one request of 16 finishes per step, its slot held one step: 1/16 of
    the slots (below HELD_MIN_SLOT_SHARE 0.1) is the normal cost of async scheduling."""
    s = Stream()
    s.config(10.0, budget=4096, max_num_seqs=SEQS, scheduler_class="AsyncScheduler", async_scheduling=True,
             num_kv_blocks=4096, block_size=16)
    for n in range(40):
        ev = s.step(11.0 + n * 0.01, n, 4096, prefill=PROMPT, decode=14, running=SEQS, waiting=100 - n, kv=0.3,
                    prefill_reqs=1, decode_reqs=14)  # 1 admitted, 14 decoding, 1 slot held
        ev["head_blocked_by"] = "deferred"
    assert "held-slots" not in _found(s)


def test_held_slots_needs_a_few_steps():
    """2 held steps (HELD_MIN_STEPS 3) are a finishing request's one-step hold, not a finding."""
    assert "held-slots" not in _found(_held_stream("busy", 0.001, pairs=2))
    assert "held-slots" in _found(_held_stream("busy", 0.001, pairs=3))


# -- preemptions ------------------------------------------------------------------------------------

ONLY_PREEMPT = {"log_schedule_each_step": False, "log_preempt_events": True, "log_chunk_boundaries": False,
                "log_request_events": False}


def _preempt_only(dt: float) -> Stream:
    """Only preempt events (settings with just log_preempt_events on): B preempted 3 times,
    C once, ``dt`` seconds per step."""
    s = Stream()
    s.config(10.0, budget=512, max_num_seqs=8, flags=ONLY_PREEMPT)
    for i, (step, rid, n) in enumerate(((5, "B", 1), (9, "C", 1), (12, "B", 2), (20, "B", 3))):
        s.preempt(11.0 + step * dt, step, rid, 300 + 10 * i, 300, 10 * i, n, running=3, waiting=1)
    return s


def test_preemption_rules_work_from_preempt_events_alone():
    """Issue 17 item 7: 4 preemptions with only preempt events read "nothing held this run
    back"; the storm is judged on the count, thrash on the request preempted 3 times, and the
    rules that need steps are listed as not checked."""
    fast, slow = (_found(_preempt_only(dt)) for dt in STEP_TIMES)
    for fid in ("preemption-storm", "preemption-thrash", "not-checked"):
        _same(fast[fid], slow[fid])
    storm = fast["preemption-storm"].to_dict()
    assert storm["evidence"]["preemptions"] == 4 and storm["evidence"]["requests"] == 2
    assert storm["evidence"]["discarded_tokens"] == 300 + 310 + 320 + 330
    assert storm["evidence"]["judged_on_count"] is True and storm["evidence"]["per_100_steps"] is None
    assert storm["message"].startswith("4 preemptions (2 requests) threw away 1,260 computed tokens; "
                                       "the first at step 5")
    thrash = fast["preemption-thrash"].to_dict()["evidence"]
    assert thrash["requests"][0]["req_id"] == "B" and thrash["requests"][0]["steps"] == [5, 12, 20]
    rules = fast["not-checked"].to_dict()["evidence"]["rules"]
    assert {"held-slots", "kv-bound", "stall", "head-of-line-blocking"} <= set(rules)


def _storm_with_cache(dt: float) -> Stream:
    """A 1,000-token prefill, then V0 and V1 (100-token prompts) preempted at steps 1 and 2;
    both readmitted at step 3, V0's re-prefill 60 tokens from the prefix cache and 40
    recomputed, V1's 100 recomputed; 100 steps in all, ``dt`` seconds each."""
    s = Stream()
    s.config(10.0, budget=1024, max_num_seqs=8)
    t = lambda n: 11.0 + n * dt  # noqa: E731
    for rid, plen in (("A", 1000), ("V0", 100), ("V1", 100)):
        s.added(10.5, rid, plen, 8, arrival=10.5)
    s.chunk(t(0) - dt / 2, 0, "A", 0, 0, 1000, 1000, last=True)
    s.step(t(0), 0, 1024, prefill=1000, running=3, waiting=0)
    for n, rid in ((1, "V0"), (2, "V1")):
        s.preempt(t(n) - dt / 2, n, rid, 100, 100, 0, 1, running=2, waiting=1)
        s.step(t(n), n, 1024, decode=1, running=2, waiting=1, preempted=[rid])
    s.chunk(t(3) - dt / 2, 3, "V0", 0, 60, 100, 100, last=True, resumed=True)["prefix_hit_tokens"] = 60
    s.chunk(t(3) - dt / 2, 3, "V1", 0, 0, 100, 100, last=True, resumed=True)
    s.step(t(3), 3, 1024, prefill=140, decode=1, running=3, waiting=0)
    for n in range(4, 100):
        s.step(t(n), n, 1024, decode=3, running=3, waiting=0)
    return s


def test_storm_says_which_re_prefills_came_from_the_prefix_cache():
    fast, slow = (_found(_storm_with_cache(dt)) for dt in STEP_TIMES)
    _same(fast["preemption-storm"], slow["preemption-storm"])
    f = fast["preemption-storm"].to_dict()
    assert (f["evidence"]["readmitted_prefix_hit_tokens"], f["evidence"]["recomputed_tokens"]) == (60, 140)
    assert f["evidence"]["per_100_steps"] == 2.0 and "victim_priorities" not in f["evidence"]
    assert "recomputed 140 tokens and took 60 from the prefix cache" in f["message"]


# -- advice converges: seqs-bound never asks for more slots than the cache holds at full length ---


def _seqs_bound(blocks: int, dt_steps: int = 1):
    """max_num_seqs 4; 14 requests of 1,536 + 256 tokens (14 blocks of 128 at full length);
    4 admitted, then 40 steps with the running queue full, 10 waiting, KV 30 % used."""
    from tests.analysis.test_doctor_rules import Run

    r = Run(budget=8192, seqs=4, blocks=blocks)
    for i in range(14):
        r.add(f"R{i}", 1536, 256)
    for i in range(4):
        r.chunk(f"R{i}", 0, 0, 1536, 1536, last=True)
    r.step(prefill=4 * 1536, running=4, waiting=10, blocked="max_num_seqs", kv=0.3)
    r.step(decode=4, running=4, waiting=10, blocked="max_num_seqs", kv=0.3, times=39)
    return {f.id: f for f in r.analyze()[2]}


def test_seqs_bound_stays_within_what_the_cache_holds_at_full_length():
    # 127 usable blocks hold 127 // 14 = 9 such requests: 4 + min(88.9 // 14 = 6, 10 waiting) = 10 is capped at 9
    f = _seqs_bound(128)["seqs-bound"]
    assert (f.remedy.setting, f.remedy.value) == ("max_num_seqs", 9)
    assert ("(at most 9: the cache holds 9 of the largest requests, 14 blocks each, at full length)"
            in f.remedy.arithmetic)
    # the storm remedy's max_num_seqs 63 // 14 = 4 applied: doctor on that run does not ask to raise it again
    f = _seqs_bound(64)["seqs-bound"]
    assert f.remedy is None
    from vllm_probe.analysis.doctor import RULES

    knob = next(k for k in RULES["seqs-bound"].knobs if k.setting == "max_num_seqs")
    assert knob.candidates({"max_num_seqs": 4}, f) == []  # 6, 8, 12, 16 all above the 4 the cache holds


# -- "nothing held this run back" is earned -----------------------------------------------------------


def _waits(wait_steps: int, dt: float, reason: str = "deferred", after: int = 150) -> Stream:
    """One request running and decoding; W arrives at step 0 and is admitted after
    ``wait_steps`` steps whose head_blocked_by is ``reason`` (no limit rule explains it:
    the running queue, the budget and the cache all have room), then ``after`` steps of A
    decoding alone."""
    s = Stream()
    s.config(10.0, budget=1024, max_num_seqs=8)
    t = lambda n: 11.0 + n * dt  # noqa: E731
    s.added(t(0) - dt, "A", 100, 200, arrival=t(0) - dt)
    s.added(t(0) - dt, "W", 100, 4, arrival=t(0) - dt)
    s.chunk(t(0) - dt / 2, 0, "A", 0, 0, 100, 100, last=True)
    ev = s.step(t(0), 0, 1024, prefill=100, running=1, waiting=1, prefill_reqs=1, kv=0.05)
    ev["head_blocked_by"] = reason
    n = 1
    for _ in range(wait_steps - 1):
        s.step(t(n), n, 1024, decode=1, running=1, waiting=1, decode_reqs=1, kv=0.05)["head_blocked_by"] = reason
        n += 1
    s.chunk(t(n) - dt / 2, n, "W", 0, 0, 100, 100, last=True)
    s.step(t(n), n, 1024, prefill=100, decode=1, running=2, waiting=0, prefill_reqs=1, decode_reqs=1, kv=0.1)
    n += 1
    s.finished(t(n) - dt / 2, n - 1, "W", 100, 4)
    for _ in range(after):
        s.step(t(n), n, 1024, decode=1, running=1, waiting=0, decode_reqs=1, kv=0.05)
        n += 1
    return s


def _report(s: Stream):
    from vllm_probe.analysis.doctor.context import Context
    from vllm_probe.analysis.doctor import all_clear

    ep = Episodes()
    state = RunState(listener=ep).apply_all(s.records)
    found = diagnose(state, ep)
    return {f.id: f for f in found}, all_clear(Context(state, ep), found)


def test_a_wait_no_rule_explains_is_named_with_its_head_blocked_by():
    """W waits 40 steps (ADMIT_WITHIN_STEPS 32) with admission deferred and room everywhere:
    no limit rule fires, so unexplained-wait names the reason; at 1 ms and 50 ms per step."""
    (fast, clear_fast), (slow, clear_slow) = (_report(_waits(40, dt)) for dt in STEP_TIMES)
    assert clear_fast is None and clear_slow is None  # a warning: no all-clear line
    _same(fast["unexplained-wait"], slow["unexplained-wait"])
    ev = fast["unexplained-wait"].to_dict()["evidence"]
    assert ev == {"admit_within_steps": 32, "longest_wait_steps": 40,
                  "requests": [{"req_id": "W", "waited_steps": 40, "steps": [0, 39], "admitted": True,
                                "head_blocked_by": {"deferred": 40}}],
                  "head_blocked_by": {"deferred": 40}, "limit": "deferred"}
    assert "underloaded" not in fast  # the run was held back: not "the scheduler is not the bottleneck"
    assert "deferred admission (held slots) held them" in fast["unexplained-wait"].message


def test_a_wait_held_by_the_kv_cache_names_it_and_carries_its_remedy():
    """W waits 40 steps with head_blocked_by kv_cache in a run too long for kv-bound to fire
    (the limit held 40 of many steps): the finding says the KV cache held it, never "no rule
    explains it", and its knobs are the KV cache's (more blocks, fewer running requests); its
    goal is W's queue time."""
    from vllm_probe.analysis.doctor import RULES

    found, _ = _report(_waits(40, 0.01, reason="kv_cache", after=400))
    assert "kv-bound" not in found  # 40 of 441 steps: below kv-bound's share of the run
    f = found["unexplained-wait"]
    assert "the KV cache held them" in f.message and "no rule explains it" not in f.message
    assert f.evidence.limit == "kv_cache"
    rule = RULES["unexplained-wait"]
    settings = {"num_kv_blocks": 40, "max_num_seqs": 8, "max_num_batched_tokens": 1024}
    offered = {k.setting: list(k.candidates(settings, f)) for k in rule.knobs if k.candidates(settings, f)}
    assert offered == {"num_kv_blocks": [50, 60, 80, 120, 160], "max_num_seqs": [1]}
    g = rule.goal(f)
    assert (g.figure, g.reduce_by, g.requests) == ("queue_p90", 0.3, ("W",))


def test_all_clear_is_said_only_when_every_request_was_admitted_within_the_threshold():
    found, clear = _report(_waits(32, 0.01))
    assert "unexplained-wait" not in found
    assert clear == ("No finding above info: every request was admitted within 32 steps (the longest waited 32); "
                     "nothing held this run back.")


# -- head-of-line blocking ---------------------------------------------------------------------------

SECONDS = ("queue_s", "ttft_s")


def _hol_queued(dt: float, warm: bool = False) -> Stream:
    """Budget 1,024. L1 and L2 (4,096-token prompts) arrive first, S after them, all before
    step 0; L1 is prefilled in steps 0-3, L2 in 4-7, S in step 8. ``warm``: S is a 4,096-token
    follow-up whose first 4,000 tokens come from the prefix cache (96 left to compute),
    else a 96-token prompt. Every time is ``dt`` per step."""
    s = Stream()
    s.config(10.0, budget=1024, max_num_seqs=8, prefix_caching=True)
    t = lambda n: 11.0 + n * dt  # noqa: E731
    plen = 4096 if warm else 96
    for rid, p in (("L1", 4096), ("L2", 4096), ("S", plen)):
        s.added(t(0) - dt * 0.75, rid, p, 4, arrival=t(0) - dt * 0.75)
    n = 0
    for rid in ("L1", "L2"):
        for k in range(4):
            s.chunk(t(n) - dt / 2, n, rid, k, 1024 * k, 1024 * (k + 1), 4096, last=k == 3)
            ev = s.step(t(n), n, 1024, prefill=1024, running=1 + (rid == "L2"),
                        waiting=2 - (rid == "L2") - (k == 3 and rid == "L2"), prefill_reqs=1)
            if ev["waiting"]:
                ev["head_blocked_by"] = "token_budget"
            n += 1
    start = 4000 if warm else 0
    s.chunk(t(n) - dt / 2, n, "S", 0, start, plen, plen, last=True)["prefix_hit_tokens"] = start
    s.step(t(n), n, 1024, prefill=96, running=3, waiting=0, prefill_reqs=1)
    n += 1
    for _ in range(4):
        s.step(t(n), n, 1024, decode=3, running=3, waiting=0, decode_reqs=3)
        n += 1
    for rid, p in (("S", plen), ("L1", 4096), ("L2", 4096)):
        s.finished(t(n) - dt / 2, n - 1, rid, p, 4)
    s.step(t(n), n, 1024, running=0, waiting=0)
    return s


@pytest.mark.parametrize("warm", [False, True])
def test_head_of_line_blocking_same_at_any_step_time_and_short_by_tokens_to_compute(warm):
    fast, slow = (_found(_hol_queued(dt, warm))["head-of-line-blocking"].to_dict() for dt in STEP_TIMES)
    assert fast["message"] == slow["message"] and fast["remedy"] == slow["remedy"]
    for a, b in zip(fast["evidence"]["blocked"], slow["evidence"]["blocked"]):
        assert {k: v for k, v in a.items() if k not in SECONDS} == {k: v for k, v in b.items() if k not in SECONDS}
        # seconds scale with the step time (the fast run's are rounded to 0.1 ms: 50× that is 5 ms)
        assert b["queue_s"] == pytest.approx(50 * a["queue_s"], abs=0.005)
        assert b["ttft_s"] == pytest.approx(50 * a["ttft_s"], abs=0.005)
    (b,) = fast["evidence"]["blocked"]
    assert (b["req_id"], b["waited_steps"], b["steps"], b["prefix_hit_tokens"]) == ("S", 8, [0, 7], 4000 if warm else 0)
    assert fast["evidence"]["takers"] == [  # largest first; equal tokens: by request id, descending
        {"req_id": "L2", "prompt_len": 4096, "prefill_tokens": 4096, "first_chunk_step": 4},
        {"req_id": "L1", "prompt_len": 4096, "prefill_tokens": 4096, "first_chunk_step": 0}]
    # queued ahead: a budget for both long prompts + S (8,192 + 96 → 8,448) is over 8× the 1,024
    # budget, so the long prefills' chunk cap leads, at a quarter of the budget
    r = fast["remedy"]
    assert (r["setting"], r["value"], r["whatif"]) == ("long_prefill_token_threshold", 256,
                                                       {"long_prefill_token_threshold": 256})
    assert [(a["setting"], a["value"]) for a in r["alternatives"]] == [("max_num_batched_tokens", 8192),
                                                                      ("scheduling_policy", "priority")]
    # each alternative spelt as vLLM takes it, as the remedy is
    assert [(a["engine_arg"], a["flags"]) for a in r["alternatives"]] == [
        ("max_num_batched_tokens", ["--max-num-batched-tokens", "8192"]),
        ("scheduling_policy", ["--scheduling-policy", "priority"])]
    if warm:
        assert "1 of them cache-warm (96 tokens left to compute after prefix-cache hits)" in fast["message"]
    from vllm_probe.analysis.doctor import RULES

    f = _found(_hol_queued(0.001, warm))["head-of-line-blocking"]
    assert RULES["head-of-line-blocking"].goal(f).requests == ("S",)


# -- priority ------------------------------------------------------------------------------------------


def _priority(dt: float) -> Stream:
    """Priority policy, max_num_seqs 2: B1 and B2 (priority 5) run from step 0; U (priority 0)
    arrives before step 1 and waits 6 steps with the running queue full (head max_num_seqs)
    until B1 finishes; then it is admitted. vLLM never preempts for a slot."""
    s = Stream()
    s.config(10.0, budget=1024, max_num_seqs=2, scheduling_policy="priority")
    t = lambda n: 11.0 + n * dt  # noqa: E731
    for rid in ("B1", "B2"):
        ev = s.added(t(0) - dt, rid, 100, 8, arrival=t(0) - dt)
        ev["priority"] = 5
        s.chunk(t(0) - dt / 2, 0, rid, 0, 0, 100, 100, last=True)
    s.step(t(0), 0, 1024, prefill=200, running=2, waiting=0, prefill_reqs=2)
    s.added(t(1) - dt * 0.75, "U", 100, 8, arrival=t(1) - dt * 0.75)["priority"] = 0
    for n in range(1, 7):
        s.step(t(n), n, 1024, decode=2, running=2, waiting=1, decode_reqs=2)["head_blocked_by"] = "max_num_seqs"
    s.finished(t(7) - dt * 0.75, 6, "B1", 100, 8)
    s.chunk(t(7) - dt / 2, 7, "U", 0, 0, 100, 100, last=True)
    s.step(t(7), 7, 1024, prefill=100, decode=1, running=2, waiting=0, prefill_reqs=1, decode_reqs=1)
    return s


def test_a_high_priority_request_waiting_for_a_slot():
    fast, slow = (_found(_priority(dt)) for dt in STEP_TIMES)
    _same(fast["priority-slot-wait"], slow["priority-slot-wait"])
    f = fast["priority-slot-wait"].to_dict()
    assert f["evidence"] == {"requests": 1, "max_num_seqs": 2, "waits": [
        {"req_id": "U", "priority": 0, "steps": [1, 6], "slot_steps": 6, "head_blocked_by": {"max_num_seqs": 6},
         # B2 ran from before U arrived until U was admitted (B1 finished to free the slot)
         "lower_priority_running": [{"req_id": "B2", "priority": 5}]}]}
    assert "vLLM preempts for KV blocks, never for a slot" in f["message"]
    assert (f["remedy"]["setting"], f["remedy"]["value"]) == ("max_num_seqs", 3)


def test_no_priority_slot_wait_under_fcfs():
    s = _priority(0.001)
    s.events[0]["scheduling_policy"] = "fcfs"
    assert "priority-slot-wait" not in _found(s)


# -- which "Maximum concurrency Nx" reading applies ----------------------------------------------


def test_kv_bound_says_which_concurrency_reading_applies():
    """64 blocks of 128 tokens (63 usable), max_model_len 8,192: vLLM's start-up line reads
    64 / ⌈8,192 / 128⌉ = 1.00x (the whole pool over one request's blocks, as
    get_max_concurrency_for_kv_cache_config counts); this run's requests (1,024 + 256 tokens:
    10 blocks at full length) fit 63 // 10 = 6 at once."""
    from tests.analysis.test_doctor_rules import Run

    r = Run(budget=8192, seqs=64)
    for i in range(4):
        r.add(f"R{i}", 1024, 256)
        r.chunk(f"R{i}", 0, 0, 1024, 1024, last=True)
    r.step(prefill=4096, running=4, waiting=3, blocked="kv_cache", kv=0.95)
    r.step(decode=4, running=4, waiting=3, blocked="kv_cache", kv=0.95, times=29)
    f = {f.id: f for f in r.analyze()[2]}["kv-bound"].to_dict()
    assert f["evidence"]["vllm_max_concurrency"] == 1.0 and f["evidence"]["concurrency_at_run_lengths"] == 6
    assert f["message"].endswith("\"Maximum concurrency 1.00x\" assumes every request fills max_model_len, this run "
                                 "ran 4 at once; at this run's request lengths (prompt + max_tokens, 10.0 blocks each "
                                 "on average) the cache holds 6 requests to the end at once: that is the reading that "
                                 "applies")


def test_chunking_remedy_holds_the_prompt_even_beyond_eight_times_the_budget():
    """A 9,000-token prompt chunked alone by a 512-token budget: one step needs 9,216, 18× the
    budget. That is the rule's own fix, so the remedy and the knob offer it beyond the 8× cap
    other remedies keep (a cap that forbids the rule's fix is a bug), and say so; the knob
    tries the scaled budgets below it first."""
    from tests.analysis.test_doctor_rules import Run

    r = Run(budget=512, blocks=128)
    r.add("L", 9000, 4)
    chunks = [(k * 512, min((k + 1) * 512, 9000)) for k in range(18)]
    for k, (a, b) in enumerate(chunks):
        r.chunk("L", k, a, b, 9000, last=k == len(chunks) - 1)
        r.step(prefill=b - a)
    r.step(decode=1, times=4)
    f = {f.id: f for f in r.analyze()[2]}["chunking-without-benefit"]
    assert (f.remedy.setting, f.remedy.value) == ("max_num_batched_tokens", 9216)
    assert "more than the 8× of the recorded budget" in f.remedy.arithmetic
    from vllm_probe.advice.bounds import allowed
    from vllm_probe.analysis.doctor import RULES

    (knob,) = RULES["chunking-without-benefit"].knobs
    assert knob.candidates({"max_num_batched_tokens": 512}, f) == [768, 1024, 2048, 4096, 9216]
    assert allowed("max_num_batched_tokens", 9216, {"max_num_batched_tokens": 512}, {}, knob) is None
    assert allowed("max_num_batched_tokens", 9216, {"max_num_batched_tokens": 512}, {}) is not None


# -- every rule of tests/test_doctor_rules.py's streams, at other step times ------------------------


def _retimed(s: Stream, per_step: float) -> Stream:
    """``s`` (one step per second of event time from t = 100) at ``per_step`` seconds per
    step: every time stamp moved proportionally, nothing else changed."""
    out = Stream()
    for ev in s.events:
        ev = dict(ev)
        for key in ("ts", "arrival_ts"):
            if isinstance(ev.get(key), float):
                ev[key] = 100.0 + (ev[key] - 100.0) * per_step
        out.events.append(ev)
    return out


def _without_seconds(d):
    if isinstance(d, dict):
        return {k: _without_seconds(v) for k, v in d.items() if k not in SECONDS}
    if isinstance(d, list):
        return [_without_seconds(v) for v in d]
    return d


def test_every_rule_reads_the_same_at_any_step_time():
    from tests.analysis import test_doctor_rules as t

    runs = {"preemption-storm": t._storm(100, (100, 100)), "preemption-thrash": t._thrash(3, 10),
            "head-of-line-blocking": t._hol(3), "kv-bound": t._bound({"kv_cache": 30}),
            "budget-bound": t._bound({"token_budget": 30}),
            "seqs-bound": t._bound({"max_num_seqs": 30}, kv=0.5, running=64), "stall": t._stall(5)}
    for fid, run in runs.items():
        fast, slow = (_found(_retimed(run.s, k)) for k in STEP_TIMES)
        assert fid in fast, fid
        assert set(fast) == set(slow)
        for key in fast:
            assert _without_seconds(fast[key].to_dict()) == _without_seconds(slow[key].to_dict()), key
