"""The doctor's rules on hand-made event streams: each threshold's boundary (just below:
no finding; at it: the finding), and the evidence and remedy arithmetic with numbers
worked out by hand."""

from __future__ import annotations

import pytest

from tests._events import Stream, records
from vllm_probe.analysis.doctor import CRITICAL, INFO, WARNING, Expectation, diagnose, rules
from vllm_probe.analysis.doctor.context import Context
from vllm_probe.analysis.doctor.rules import stall
from vllm_probe.analysis.episodes import Episodes
from vllm_probe.analysis.moments import notable_moments
from vllm_probe.analysis.state import RunState


def _ev(f) -> dict:
    """A finding's evidence as ``doctor --json`` writes it."""
    return f.to_dict()["evidence"]


class Run:
    """One engine core's events, one step per second of event time (exact floats)."""

    def __init__(self, budget: int = 1024, seqs: int = 8, blocks: int = 64, block: int = 128, **cfg) -> None:
        self.s = Stream()
        self.budget = budget
        self.n = 0
        self.s.config(99.0, budget=budget, max_num_seqs=seqs, num_kv_blocks=blocks, block_size=block,
                      kv_capacity_tokens=(blocks - 1) * block, **cfg)

    @property
    def t(self) -> float:
        return 100.0 + self.n

    def add(self, req: str, prompt: int, max_tokens: int = 16, arrival: float | None = None) -> None:
        self.s.added(self.t - 0.5, req, prompt, max_tokens, arrival=self.t - 0.5 if arrival is None else arrival)

    def chunk(self, req: str, index: int, start: int, end: int, prompt: int, *, last: bool = False,
              resumed: bool = False, prefill_len: int | None = None) -> None:
        self.s.chunk(self.t - 0.25, self.n, req, index, start, end, prompt, prefill_len=prefill_len, last=last,
                     resumed=resumed)

    def preempt(self, req: str, discarded: int, prompt: int, n: int, output: int = 0) -> None:
        self.s.preempt(self.t - 0.125, self.n, req, discarded, prompt, output, n, running=1, waiting=1)

    def finish(self, req: str, prompt: int, output: int = 16, n: int = 0) -> None:
        self.s.finished(self.t - 0.75, max(self.n - 1, 0), req, prompt, output, n)

    def step(self, prefill: int = 0, decode: int = 0, *, running: int = 1, waiting: int = 0, blocked: str | None = None,
             preempted=(), kv: float = 0.5, times: int = 1) -> None:
        for _ in range(times):
            ev = self.s.step(self.t, self.n, self.budget, prefill, decode, running=running, waiting=waiting, kv=kv,
                             preempted=preempted)
            if blocked is not None:
                ev["head_blocked_by"] = blocked
            self.n += 1

    def analyze(self, expected=None, live: bool = False):
        ep = Episodes()
        state = RunState(listener=ep).apply_all(records(self.s.events))
        return state, ep, diagnose(state, ep, expected, live)

    def findings(self, **kw) -> dict[str, object]:
        return {f.id: f for f in self.analyze(**kw)[2]}


# -- preemption-storm ----------------------------------------------------------------------------


def _storm(steps: int, discarded: tuple[int, ...], prefill: int = 1000) -> Run:
    """One 1,000-token prefill step, then steps that compute nothing: the engine computed
    1,000 tokens in all."""
    r = Run()
    r.add("P", prefill, 8)
    r.chunk("P", 0, 0, prefill, prefill, last=True)
    r.step(prefill=prefill)
    for i, d in enumerate(discarded):
        r.preempt(f"V{i}", d, 100, 1)
        r.step(preempted=[f"V{i}"])
    r.step(times=steps - 1 - len(discarded))
    return r


def test_storm_by_frequency_boundary():
    """2 preemptions discarding 2 of 1,000 computed tokens (0.2 %): 1.0 per 100 steps at
    200 steps is a storm, 0.995 at 201 is not."""
    f = _storm(200, (1, 1)).findings()["preemption-storm"]
    assert f.severity == WARNING and _ev(f)["per_100_steps"] == 1.0 and _ev(f)["discarded_share"] == 0.002
    assert "2 preemptions in 200 steps (1.0 per 100 steps, 0 requests)" not in f.message  # requests are counted
    assert f.message.startswith("2 preemptions in 200 steps (1.0 per 100 steps, 2 requests) threw away 2 computed")
    assert "preemption-storm" not in _storm(201, (1, 1)).findings()


def test_storm_by_cost_boundary_and_critical():
    """1,000 steps (0.2 per 100): 50 of 1,000 computed tokens discarded (5 %) is a storm,
    49 is not; 500 (50 %) is critical, 499 a warning."""
    assert _ev(_storm(1000, (25, 25)).findings()["preemption-storm"])["discarded_share"] == 0.05
    assert "preemption-storm" not in _storm(1000, (25, 24)).findings()
    assert _storm(1000, (250, 250)).findings()["preemption-storm"].severity == CRITICAL
    assert _storm(1000, (250, 249)).findings()["preemption-storm"].severity == WARNING


def test_one_preemption_is_no_storm():
    assert "preemption-storm" not in _storm(100, (1000,)).findings()


def test_storm_remedy_from_the_peak_kv_demand():
    """63 usable blocks of 128; five requests of 1,536 + 256 tokens (14 blocks each at full
    length) admitted: 70 blocks needed -> max_num_seqs 63 // 14 = 4 leads (more blocks let
    admission take more requests, design.md §7), or num_kv_blocks 71 (named by its whatif
    name; num_gpu_blocks_override is its engine argument)."""
    r = Run()
    for i in range(5):
        r.add(f"R{i}", 1536, 256)
    for i in range(5):
        r.chunk(f"R{i}", 0, 0, 1024, 1536)
        r.step(prefill=1024, running=i + 1, waiting=4 - i)
    for i in range(2):
        r.preempt(f"R{4 - i}", 1024, 1536, 1)
        r.step(decode=3, running=3, waiting=2, preempted=[f"R{4 - i}"])
    f = r.findings()["preemption-storm"]
    assert (f.remedy.setting, f.remedy.value, f.remedy.whatif) == ("max_num_seqs", 4, {"max_num_seqs": 4})
    assert "needed 5 × 14 blocks at full length" in f.remedy.arithmetic and "= 70 blocks" in f.remedy.arithmetic
    assert "63 // 14.0 blocks per request = 4" in f.remedy.arithmetic
    alt = f.remedy.alternatives[0]
    assert (alt["setting"], alt["value"], alt["whatif"]) == ("num_kv_blocks", 71, {"num_kv_blocks": 71})
    assert "num_kv_blocks ≥ 71 (--num-gpu-blocks-override 71" in alt["arithmetic"]
    assert _ev(f)["first_step"] == 5 and _ev(f)["peak_running"] == 5


# -- preemption-thrash ---------------------------------------------------------------------------


def _thrash(times: int, discarded: int, prompt: int = 1000, pair: bool = False) -> Run:
    r = Run()
    r.add("T", prompt)
    r.add("U", prompt)
    r.step(decode=1)
    for i in range(times):
        r.preempt("T", discarded, prompt, i + 1)
        r.step(decode=1, preempted=["T"])
        if pair:
            r.preempt("U", discarded, prompt, i + 1)
            r.step(decode=1, preempted=["U"])
    r.step(decode=1, times=300)
    r.finish("T", prompt, n=times)
    r.finish("U", prompt, n=times if pair else 0)
    r.step(decode=0, running=0)
    return r


def test_thrash_boundaries():
    """3 preemptions are thrash whatever they discard; 2 only when they discarded more than
    the prompt (1,001 of a 1,000-token prompt yes, 1,000 no); 10 is critical, 9 not."""
    f = _thrash(3, 10).findings()["preemption-thrash"]
    assert f.severity == WARNING
    assert f.message == ("T was preempted 3 times (steps 1-3), discarding 30 computed tokens against its 1,000-token "
                         "prompt (0.0×)")
    assert _ev(f)["requests"][0] == {"req_id": "T", "preemptions": 3, "steps": [1, 2, 3], "discarded_tokens": 30,
                                         "prompt_len": 1000, "finished": True}
    assert "preemption-thrash" not in _thrash(2, 500).findings()
    assert "preemption-thrash" in _thrash(2, 501).findings()
    assert _thrash(10, 1).findings()["preemption-thrash"].severity == CRITICAL
    assert _thrash(9, 1).findings()["preemption-thrash"].severity == WARNING


def test_two_requests_preempting_each_other():
    f = _thrash(3, 600, pair=True).findings()["preemption-thrash"]
    assert _ev(f)["pair"] == ["T", "U"] and _ev(f)["alternations"] == 5
    assert f.message.startswith("T and U preempted each other: 3 and 3 times (steps 1-6), discarding 3,600 computed "
                                "tokens against 2,000 prompt tokens")


# -- head-of-line-blocking ---------------------------------------------------------------------


def _hol(wait_steps: int, short_prompt: int = 100, arrival: float | None = None, budget: int = 1024) -> Run:
    """L (4,096 tokens) runs from step 0 in 1,024-token chunks; S arrives before step 1 and
    gets its first chunk after ``wait_steps`` steps."""
    r = Run(budget=budget)
    r.add("L", 4096, 8)
    r.chunk("L", 0, 0, 1024, 4096)
    r.step(prefill=1024)
    r.add("S", short_prompt, 8, arrival=arrival)
    for k in range(1, wait_steps + 1):
        r.chunk("L", k, 1024 * k, 1024 * (k + 1), 4096, last=k == 3)
        r.step(prefill=1024, waiting=1, blocked="token_budget")
    r.chunk("S", 0, 0, short_prompt, short_prompt, last=True)
    r.step(prefill=short_prompt, decode=1, running=2)
    r.step(decode=2, running=2, times=8)
    r.finish("S", short_prompt, 8)
    r.finish("L", 4096, 8)
    r.step(running=0)
    return r


def test_head_of_line_blocking_evidence_and_remedy():
    """S (100 tokens) arrived at 100.5 before step 1, waited steps 1-3 (3 steps) while L's
    chunks took all 3,072 prefill tokens; first chunk at 103.75, first token at step 5
    (105.0): queue 3.25 s of TTFT 4.5 s. L started before S arrived: a chunk cap,
    1,024 - 100 = 924, lets S in beside it."""
    f = _hol(3).findings()["head-of-line-blocking"]
    (b,) = _ev(f)["blocked"]
    assert (b["req_id"], b["waited_steps"], b["steps"], b["queue_s"], b["ttft_s"]) == ("S", 3, [1, 3], 3.25, 4.5)
    assert _ev(f)["takers"] == [{"req_id": "L", "prompt_len": 4096, "prefill_tokens": 3072, "first_chunk_step": 0}]
    assert _ev(f)["taken_share"] == 1.0
    assert (f.remedy.setting, f.remedy.value) == ("long_prefill_token_threshold", 924)
    assert f.message == ("1 short request (100-token prompts) waited up to 3 steps for their first chunk while L's "
                         "4,096-token prefill took 100% of the prefill tokens (steps 1-3); queue time was 72% of their "
                         "time to first token")


def test_head_of_line_blocking_boundaries():
    assert "head-of-line-blocking" not in _hol(2).findings()  # HOL_MIN_WAIT_STEPS = 3
    assert "head-of-line-blocking" in _hol(3, short_prompt=256).findings()  # 256 = 25 % of the budget: short
    assert "head-of-line-blocking" not in _hol(3, short_prompt=257).findings()
    # queue share: arrival so that queue / TTFT is 0.5 exactly (queue 3.75 - x, TTFT 5 - x)
    assert "head-of-line-blocking" in _hol(3, arrival=101.25 - 1.0).findings()  # 3.5 / 4.75 = 0.74
    assert "head-of-line-blocking" in _hol(3, arrival=102.5).findings()  # 1.25 / 2.5 = 0.5
    assert "head-of-line-blocking" not in _hol(3, arrival=102.625).findings()  # 1.125 / 2.375 < 0.5


# -- kv-bound, budget-bound, seqs-bound ----------------------------------------------------------


def _bound(waiting_steps: dict[str, int], total: int = 100, kv: float = 0.95, running: int = 4) -> Run:
    r = Run(seqs=64)
    for reason, n in waiting_steps.items():
        r.step(decode=running, running=running, waiting=3, blocked=reason, kv=kv, times=n)
    r.step(decode=running, running=running, kv=kv, times=total - sum(waiting_steps.values()))
    return r


def test_bound_boundaries():
    """Requests waited in 20 of 100 steps (BOUND_MIN_WAITING_SHARE) and one limit held at
    least half of those (BOUND_SHARE)."""
    f = _bound({"kv_cache": 20}).findings()["kv-bound"]
    assert _ev(f)["steps"] == 20 and _ev(f)["share_of_waiting_steps"] == 1.0
    assert _ev(f)["step_range"] == [0, 19] and _ev(f)["running_max"] == 4
    assert f.message.startswith("The KV cache held the run back: in 20 of 100 steps (20%) requests waited because the "
                                "head of the queue did not fit; running plateaued at 4 of max_num_seqs 64 while up to "
                                "3 waited, KV cache 95% used on average")
    assert not {"kv-bound", "budget-bound", "seqs-bound"} & set(_bound({"kv_cache": 19}).findings())
    assert "kv-bound" in _bound({"kv_cache": 8, "preemption": 2, "token_budget": 5, "max_num_seqs": 5}).findings()
    assert not {"kv-bound", "budget-bound", "seqs-bound"} & set(
        _bound({"kv_cache": 9, "token_budget": 6, "max_num_seqs": 5}).findings())


def test_kv_bound_with_the_cache_not_full_says_why():
    f = _bound({"kv_cache": 30}, kv=0.6).findings()["kv-bound"]
    assert "— admission waits for the whole prompt to fit, so the head waited with 40% of the cache free" in f.message


def test_budget_bound_is_info_and_seqs_bound_a_warning():
    f = _bound({"token_budget": 30}).findings()["budget-bound"]
    assert f.severity == INFO and (f.remedy.setting, f.remedy.value) == ("max_num_batched_tokens", 2048)
    f = _bound({"max_num_seqs": 30}, kv=0.5, running=64).findings()["seqs-bound"]
    assert f.severity == WARNING and "running queue full (64 of 64) while up to 3 waited" in f.message
    assert f.remedy.setting == "max_num_seqs"


def test_a_run_without_head_blocked_by_is_inferred_and_says_so():
    r = Run(seqs=64)
    r.step(decode=4, running=4, waiting=3, times=30)  # bound_by: KV cache (waiting, budget and seqs to spare)
    r.step(decode=4, running=4, times=70)
    found = r.findings()
    assert _ev(found["kv-bound"])["inferred_from_queues"] is True
    assert "because the head" not in found["kv-bound"].message
    assert "head_blocked_by" in _ev(found["not-checked"])["rules"]


# -- stall -------------------------------------------------------------------------------------


def _stall(n: int, at_end: bool = False) -> Run:
    r = Run(blocks=8, block=16)
    r.add("A", 40, 4)
    r.add("BIG", 200, 4)
    r.chunk("A", 0, 0, 40, 40, last=True)
    r.step(prefill=40, waiting=1, blocked="kv_cache")
    r.step(decode=1, waiting=1, blocked="kv_cache", times=3)
    r.finish("A", 40, 4)
    r.step(running=0, waiting=1, blocked="kv_cache", times=n)
    if not at_end:
        r.chunk("BIG", 0, 0, 200, 200, last=True)
        r.step(prefill=200)
    return r


def test_stall_boundaries_and_the_head_that_never_fits():
    """7 usable blocks of 16 tokens; BIG's 200-token prompt needs 13: it can never fit."""
    assert "stall" not in _stall(2).findings()
    f = _stall(3).findings()["stall"]
    assert f.severity == WARNING and _ev(f)["first_step"] == 4 and _ev(f)["head"] == "BIG"
    assert _ev(f)["head_blocked_by"] == {"kv_cache": 3}
    assert "the head BIG needs 13 blocks for its 200-token prompt and the KV cache has 7: it can never fit" in f.message
    assert (f.remedy.setting, f.remedy.value) == ("num_kv_blocks", 14)
    assert f.remedy.to_dict()["engine_arg"] == "num_gpu_blocks_override"
    assert f.remedy.to_dict()["flags"] == ["--num-gpu-blocks-override", "14"]
    assert _stall(50, at_end=True).findings()["stall"].severity == CRITICAL
    assert _stall(49, at_end=True).findings()["stall"].severity == WARNING
    assert _stall(50, at_end=True).findings(live=True)["stall"].severity == WARNING  # still going: not "never"


# -- chunking-without-benefit, underloaded, config-not-applied -----------------------------------


def _alone(decode_beside: bool, steps: int = 20) -> Run:
    r = Run()
    r.add("P", 2000, 4)
    r.chunk("P", 0, 0, 1024, 2000)
    r.step(prefill=1024)
    r.chunk("P", 1, 1024, 2000, 2000, last=True)
    r.step(prefill=976, decode=1 if decode_beside else 0, running=2 if decode_beside else 1)
    r.step(decode=1, times=steps - 2)
    return r


def test_chunking_without_benefit():
    f = _alone(False).findings()["chunking-without-benefit"]
    assert _ev(f) == {"prompts": 1, "extra_steps": 1, "share_of_steps": 0.05, "reread_kv_tokens": 1024,
                          "example": "P", "example_prompt_len": 2000, "example_steps": [0, 1], "requests": ["P"]}
    goal = rules.RULES["chunking-without-benefit"].goal(f)
    assert (goal.figure, goal.at_most, goal.requests) == ("reread_kv_tokens", 0, ("P",))
    assert f.severity == WARNING and (f.remedy.setting, f.remedy.value) == ("max_num_batched_tokens", 2048)
    assert _alone(False, steps=21).findings()["chunking-without-benefit"].severity == INFO
    assert "chunking-without-benefit" not in _alone(True).findings()


def test_underloaded_boundaries():
    def light(steps: int, waiting_steps: int = 0, scheduled: int = 256) -> dict:
        r = Run()
        r.step(decode=scheduled, waiting=1, blocked="kv_cache", times=waiting_steps)
        r.step(decode=scheduled, times=steps - waiting_steps)
        return r.findings()
    f = light(100, waiting_steps=5)["underloaded"]
    assert f.severity == INFO and _ev(f)["budget_use_median"] == 0.25
    assert set(light(100, waiting_steps=5)) == {"underloaded"}  # nothing above info
    assert "underloaded" not in light(100, waiting_steps=6)
    assert "underloaded" not in light(49)
    assert "underloaded" not in light(100, scheduled=257)
    assert f.message.endswith("(the client sends too slowly)") and _ev(f)["burst"] is False


def test_underloaded_names_an_offline_burst_and_gives_way_to_a_finding_that_requests_were_held_back():
    r = Run()
    for i in range(3):
        r.add(f"R{i}", 100)  # all before step 0: one burst
    r.step(decode=3, running=3, times=100)
    f = r.findings()["underloaded"]
    assert _ev(f)["burst"] is True and "the workload is one burst of 3 requests" in f.message
    # the same run with a stall: the scheduler held requests back, so not "underloaded"
    r.step(running=1, waiting=2, blocked="kv_cache", times=3)
    found = r.findings()
    assert "stall" in found and "underloaded" not in found


def test_config_not_applied_names_each_setting():
    r = Run(budget=1024, seqs=8)
    r.step(decode=1, times=3)
    exp = Expectation("config.toml", {"max_num_batched_tokens": 8192, "max_num_seqs": 8, "gpu_memory_utilization": 0.9})
    f = r.findings(expected=exp)["config-not-applied"]
    assert f.message == ("1 setting of config.toml did not take effect: max_num_batched_tokens 8,192 expected, 1,024 "
                         "in force (command-line flags and engine arguments win over config files)")
    assert _ev(f)["differs"] == [{"setting": "max_num_batched_tokens", "expected": 8192, "effective": 1024}]
    assert _ev(f)["not_recorded"] == ["gpu_memory_utilization"]
    assert f.remedy.whatif == {"max_num_batched_tokens": 8192}
    assert "config-not-applied" not in r.findings(expected=Expectation("x", {"max_num_seqs": 8}))


def test_findings_are_worst_first_and_moments_come_from_the_same_episodes():
    r = _stall(50, at_end=True)
    state, ep, found = r.analyze()
    assert [f.severity for f in found] == sorted((f.severity for f in found), key=(CRITICAL, WARNING, INFO).index)
    moments = notable_moments(state, ep)
    assert [(m.kind, m.first_step, m.last_step) for m in moments if m.kind == "stall"] == [("stall", 4, 53)]
    assert stall.STALL_CRITICAL_STEPS == 50


@pytest.mark.parametrize("name", [r.id for r in rules.CATALOGUE])
def test_every_rule_is_quiet_on_an_empty_run(name):
    state = RunState()
    ep = Episodes()
    assert rules.RULES[name].evaluate(Context(state, ep)) == []


def test_a_run_with_step_events_off_says_what_it_could_not_check():
    """settings.minimal.yaml: preemptions and chunks only. The storm is judged on the work
    it discarded; the rules that need steps say so."""
    r = Run(flags={"log_schedule_each_step": False, "log_preempt_events": True, "log_chunk_boundaries": True,
                   "log_request_events": True})
    r.add("P", 1000, 8)
    r.chunk("P", 0, 0, 1000, 1000, last=True)
    r.n += 1
    for i in range(2):
        r.preempt(f"V{i}", 100, 100, 1)
        r.n += 1
    found = {f.id: f for f in r.analyze()[2]}
    # step events off: the computed tokens are the prefill chunks' 1,000
    assert found["preemption-storm"].message.startswith("2 preemptions (2 requests) threw away 200 computed tokens, "
                                                        "20%")
    assert _ev(found["preemption-storm"])["per_100_steps"] is None
    checked = _ev(found["not-checked"])["rules"]
    assert set(checked) == {"kv-bound", "budget-bound", "seqs-bound", "stall", "underloaded",
                            "chunking-without-benefit", "head-of-line-blocking", "held-slots"}
    assert checked["stall"] == "step events are off (scheduler_probe.log_schedule_each_step)"


def test_messages_read_numbers_as_the_views_do():
    from vllm_probe.analysis.text import fmt_count, fmt_pct
    from vllm_probe.tui.format import count, pct

    for v in (0.0, 0.004, 0.05, 0.0999, 0.1, 0.5, 0.999, 1.0):
        assert fmt_pct(v) == pct(v)
    for v in (0, 7, 1024, 123456789):
        assert fmt_count(v) == count(v)


def test_config_not_applied_on_the_cpu_backend_never_passes_a_device_memory_share():
    """On the CPU backend gpu_memory_utilization is a share of the machine's memory (0.9 fails
    at start-up): a file's 0.9 against the 0.3 in force is reported, but the remedy passes only
    the budget, and the message says to size the KV cache with VLLM_CPU_KVCACHE_SPACE."""
    r = Run(budget=1024, seqs=8, platform="cpu", gpu_memory_utilization=0.3)
    r.step(decode=1, times=3)
    exp = Expectation("config.toml", {"max_num_batched_tokens": 8192, "gpu_memory_utilization": 0.9})
    f = r.findings(expected=exp)["config-not-applied"]
    assert "gpu_memory_utilization 0.9 expected, 0.3 in force" in f.message
    assert "sized by VLLM_CPU_KVCACHE_SPACE (GiB), so that setting is not passed on" in f.message
    assert f.remedy.whatif == {"max_num_batched_tokens": 8192}
    assert "gpu-memory-utilization" not in f.remedy.arithmetic
    assert (f.remedy.setting, f.remedy.to_dict()["flags"]) == ("max_num_batched_tokens",
                                                               ["--max-num-batched-tokens", "8192"])
