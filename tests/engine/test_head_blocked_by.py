"""``step.head_blocked_by`` on vLLM's real Scheduler, driven without a model.

Each scenario is small enough to work out by hand; the expected reason of every step is
derived from the numbers in its docstring (the probe's research, notes/head_blocked_by.md,
checked them against a line trace of vLLM's own ``schedule()`` on every release 0.12-0.33).
The compatibility suite (``python -m tests.compat``) runs this file on every release; the
expectations that differ by release say why.
"""

from __future__ import annotations

import inspect
from collections import deque

import pytest

from tests.conftest import requires_vllm

pytestmark = requires_vllm


@pytest.fixture
def probed():
    """Install the probe (every flag on) into a MemorySink; uninstall afterwards."""
    import vllm
    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_probe import engine as probe
    from vllm_probe.settings import ProbeFlags
    from vllm_probe.sim import harness

    sink = harness.MemorySink()
    rt = probe.Runtime(ProbeFlags(), lambda _rt: sink)
    assert "Scheduler.schedule" in probe.install(Scheduler, rt, vllm.__version__)
    yield sink
    probe.uninstall(Scheduler)


def _version() -> tuple[int, int]:
    from vllm_probe.engine.compat import parse_version
    import vllm

    return parse_version(vllm.__version__)


class Driver:
    """One scheduler under the probe; :meth:`step` returns the step's ``head_blocked_by``."""

    def __init__(self, sink, cls=None, **spec) -> None:
        from vllm_probe.sim import harness

        self.harness = harness
        self.sink = sink
        self.spec = harness.SchedulerSpec(**spec)
        self.s = harness.make_scheduler(self.spec, scheduler_cls=cls)

    def add(self, rid: str, prompt: int, max_tokens: int, *, status=None, priority: int | None = None,
            prefix: list[int] | None = None):
        r = self.harness.make_request(prompt, max_tokens, req_id=rid, block_size=self.spec.block_size,
                                      prefix=prefix)
        if status is not None:
            r.status = status
        if priority is not None:
            r.priority = priority
        self.s.add_request(r)
        return r

    def schedule(self, throttle: bool = False):
        out = self.s.schedule(True) if throttle else self.s.schedule()
        return out, self.sink.of("step")[-1]

    def step(self, throttle: bool = False) -> str | None:
        out, ev = self.schedule(throttle)
        self.s.update_from_output(out, self.harness.fake_model_output(self.s, out))
        return ev["head_blocked_by"]

    def steps(self, n: int) -> list[str | None]:
        return [self.step() for _ in range(n)]


def _grammar_pending():
    from vllm.v1.request import RequestStatus

    return (getattr(RequestStatus, "WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR", None)
            or RequestStatus.WAITING_FOR_FSM)


def test_token_budget(probed):
    """Budget 64, three 100-token prompts: step 0 gives A 64 tokens (budget 0 before B);
    step 1 gives A 36 and B 28 (budget 0 again, C is the head)."""
    d = Driver(probed, max_num_batched_tokens=64, num_blocks=64)
    for rid in "ABC":
        d.add(rid, 100, 2)
    assert d.steps(2) == ["token_budget", "token_budget"]


def test_max_num_seqs(probed):
    """max_num_seqs 2, four 8-token prompts: A and B run, C waits on the full running queue."""
    d = Driver(probed, max_num_batched_tokens=256, max_num_seqs=2, num_blocks=64)
    for rid in "ABCD":
        d.add(rid, 8, 3)
    assert d.steps(2) == ["max_num_seqs", "max_num_seqs"]


def test_kv_cache(probed):
    """10 usable blocks of 16; A (100 tokens, 7 blocks) then B (100 tokens); budget 128.

    After A, 28 tokens are left: B's first chunk needs 2 blocks (3 free), its whole prompt
    7. From 0.19 (whole prompt must fit) B waits with 3 free blocks: kv_cache. Before,
    B's chunk is admitted; its next chunk cannot get blocks, so B preempts itself
    (preemption), then waits for 7 blocks with 3-4 free (kv_cache)."""
    d = Driver(probed, max_num_batched_tokens=128, num_blocks=11)
    d.add("A", 100, 4)
    d.add("B", 100, 2)
    got = d.steps(4)
    if getattr(d.s, "scheduler_reserve_full_isl", False):
        assert got == ["kv_cache"] * 4
        assert probed.of("step")[0]["free_blocks"] == 3
    else:
        assert got == [None, "preemption", "kv_cache", "kv_cache"]


def test_kv_cache_despite_prefix_hits(probed):
    """Prefix caching on, 10 usable blocks: B shares A's first 96 tokens (6 full blocks held
    by A) and is admitted with 3 free blocks although its prompt has 7; C (100 distinct
    tokens) needs 7: kv_cache. A reconstruction "free < blocks of the prompt" would have
    named B; the elimination names only the head vLLM left waiting."""
    d = Driver(probed, max_num_batched_tokens=256, num_blocks=11, enable_prefix_caching=True)
    a = d.add("A", 100, 6)
    assert d.step() is None
    d.add("B", 100, 2, prefix=list(a.prompt_token_ids[:96]))
    d.add("C", 100, 2)
    assert d.steps(2) == ["kv_cache", "kv_cache"]
    assert [c["req_id"] for c in probed.of("chunk") if c["step"] == 1] == ["B"]


def test_preemption_then_kv_cache(probed):
    """8 usable blocks; A and B (48-token prompts, 3 blocks each) decode until the pool is
    exhausted, C waits on max_num_seqs 2. Step 0 prefills A and B (6 blocks, 2 free);
    steps 1-16 decode tokens 49..64 (a 4th block each at step 1, 0 free); at step 17 A's
    65th token needs a 5th block: B (the newest) is preempted and vLLM skips admission;
    at step 18 B, now the head, needs cdiv(65, 16) = 5 blocks with 3 free."""
    d = Driver(probed, max_num_batched_tokens=256, max_num_seqs=2, num_blocks=9)
    d.add("A", 48, 40)
    d.add("B", 48, 40)
    d.add("C", 16, 2)
    got = d.steps(19)
    assert got == ["max_num_seqs"] * 17 + ["preemption", "kv_cache"]
    assert probed.of("step")[17]["preempted"] == ["B"]


def test_long_prefill_threshold_never_blocks_admission(probed):
    """long_prefill_token_threshold 32 caps chunks; both 100-token prompts are admitted."""
    d = Driver(probed, max_num_batched_tokens=256, num_blocks=64, long_prefill_token_threshold=32)
    d.add("A", 100, 2)
    d.add("B", 100, 2)
    assert d.steps(2) == [None, None]


def test_prefill_limit_under_the_data_parallel_throttle(probed):
    """0.24+: schedule(throttle_prefills=True) defers a new prefill while a request decodes."""
    from vllm.v1.core.sched.scheduler import Scheduler

    if "throttle_prefills" not in inspect.signature(getattr(Scheduler.schedule, "__wrapped__",
                                                            Scheduler.schedule)).parameters:
        pytest.skip("this release has no throttle_prefills (0.24+)")
    d = Driver(probed, max_num_batched_tokens=256, num_blocks=64)
    d.add("A", 8, 10)
    assert d.step() is None
    d.add("B", 32, 2)
    assert d.step(throttle=True) == "prefill_limit"
    assert d.step() is None  # unthrottled: B admitted


def test_prefill_limit_under_the_local_cadence(probed):
    """0.33 prefill cadence, interval 3, 7 usable blocks of 16: prefill is held while
    (steps executed before this one + 1) - last prefill step < 3 and a request decodes.
    Step 1: (1+1)-1 = 1, held; step 2: 2, held; step 3 carries B's prefill, C (100 tokens,
    7 blocks) finds 4 free: kv_cache; from then on prefill_capacity_bound stops the
    cadence (vLLM's capacity escape) and C meets the KV cache every step."""
    from vllm.config import SchedulerConfig

    if "prefill_schedule_interval" not in SchedulerConfig.__dataclass_fields__ or _version() < (0, 33):
        pytest.skip("this release has no local prefill cadence (0.33+)")
    d = Driver(probed, max_num_batched_tokens=256, num_blocks=8, extra={"prefill_schedule_interval": 3})
    d.add("A", 8, 30)
    assert d.step() is None
    d.add("B", 32, 30)
    assert d.step() == "prefill_limit"
    d.add("C", 100, 2)
    assert d.steps(5) == ["prefill_limit", "kv_cache", "kv_cache", "kv_cache", "kv_cache"]


def test_deferred_head_waits_for_its_grammar(probed):
    """G waits for its grammar (status set, no grammar object): vLLM skips it every step
    and admits B and C behind it; once G is aborted nothing waits."""
    from vllm.v1.request import RequestStatus

    d = Driver(probed, max_num_batched_tokens=256, num_blocks=64)
    d.add("G", 8, 2, status=_grammar_pending())
    d.add("B", 8, 2)
    d.add("C", 8, 2)
    assert d.steps(2) == ["deferred", "deferred"]
    d.s.finish_requests("G", RequestStatus.FINISHED_ABORTED)
    assert d.step() is None


def test_deferred_head_named_by_its_own_block(probed):
    """A takes the whole 64-token budget; vLLM never looks at G (its literal stop is the
    budget), but G could not run anyway: its own block, deferred, is named (policy)."""
    from vllm.v1.request import RequestStatus

    d = Driver(probed, max_num_batched_tokens=64, num_blocks=64)
    d.add("A", 100, 2)
    d.add("G", 8, 2, status=_grammar_pending())
    assert d.step() == "deferred"
    d.s.finish_requests("G", RequestStatus.FINISHED_ABORTED)


def test_deferred_under_the_priority_policy(probed):
    """Priority policy, max_num_seqs 2: G (priority 0) waits for its grammar, B and C are
    admitted; G stays the head (the smallest priority), so both steps are deferred; once
    G is aborted B and C finish and D is admitted."""
    from vllm.v1.request import RequestStatus

    d = Driver(probed, max_num_batched_tokens=256, max_num_seqs=2, num_blocks=64, extra={"policy": "priority"})
    d.add("G", 8, 2, status=_grammar_pending(), priority=0)
    for rid in "BCD":
        d.add(rid, 8, 2, priority=1)
    assert d.steps(2) == ["deferred", "deferred"]
    d.s.finish_requests("G", RequestStatus.FINISHED_ABORTED)
    assert d.step() is None


def test_deferred_while_paused(probed):
    """0.17+: PAUSED_NEW keeps running requests going and admits no new one."""
    try:
        from vllm.v1.core.sched.interface import PauseState
    except ImportError:
        pytest.skip("this release has no PauseState (0.17+)")
    d = Driver(probed, max_num_batched_tokens=256, num_blocks=64)
    if not hasattr(d.s, "set_pause_state"):
        pytest.skip("this release has no PauseState (0.17+)")
    d.add("A", 8, 5)
    assert d.step() is None
    d.s.set_pause_state(PauseState.PAUSED_NEW)
    d.add("B", 8, 2)
    assert d.step() == "deferred"
    d.s.set_pause_state(PauseState.UNPAUSED)
    assert d.step() is None


# -- AsyncScheduler: finished requests keep their slot one more step -------------------------


def _async_drive(d: Driver, steps: int) -> list[tuple[str | None, str | None]]:
    """Drive like ``EngineCore.step_with_batch_queue`` (a batch queue of 2): step N+1 is
    scheduled before ``update_from_output(N)``. Returns per step (probe's reason, the
    brute-force expectation).

    The expectation loops over the running queue with vLLM's own early-exit condition
    (0.32 scheduler.py:659-673): a request whose last token is in flight is skipped but
    keeps its slot. When the cap is reached only because of such requests, the head
    waits for that output (deferred), not for a max_num_seqs slot."""
    from vllm_probe.sim.harness import model_runner_output

    s, cap = d.s, d.spec.max_num_seqs
    pending: deque = deque()
    rows = []
    for _ in range(steps):
        out, ev = d.schedule()
        finishing = sum(1 for r in s.running if r.request_id not in out.num_scheduled_tokens
                        and r.num_output_placeholders > 0
                        and r.num_computed_tokens + 2 - r.num_output_placeholders >= r.num_prompt_tokens + r.max_tokens)
        waiting = ev["waiting"]
        if not waiting:
            want = None
        elif len(s.running) >= cap:
            want = "deferred" if len(s.running) - finishing < cap else "max_num_seqs"
        else:
            want = "kv_cache"
        rows.append((ev["head_blocked_by"], want))
        sampled = [rid for rid in out.num_scheduled_tokens
                   if (r := s.requests.get(rid)) is not None and r.num_computed_tokens >= r.num_tokens]
        pending.append((out, sampled))
        while len(pending) == 2 or (pending and not s.has_requests()):
            o, ids = pending.popleft()
            req_ids = list(o.num_scheduled_tokens)
            s.update_from_output(o, model_runner_output(req_ids, [[7] if r in ids else [] for r in req_ids]))
        if not s.has_requests():
            break
    return rows


def test_async_max_tokens_1_alternates_admission_and_deferred(probed):
    """AsyncScheduler, max_num_seqs 4, twelve 8-token prompts with max_tokens 1: an
    admitting step fills the 4 slots (max_num_seqs); the next schedules nothing because
    the 4 finished requests still hold their slots (deferred); then the next group."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    d = Driver(probed, cls=AsyncScheduler, max_num_batched_tokens=256, max_num_seqs=4, num_blocks=64,
               async_scheduling=True)
    for i in range(12):
        d.add(f"R{i}", 8, 1)
    rows = _async_drive(d, 8)
    assert [got for got, _ in rows[:4]] == ["max_num_seqs", "deferred", "max_num_seqs", "deferred"]
    assert all(got == want for got, want in rows), rows
    steps = probed.of("step")
    assert [s["scheduled_tokens"] for s in steps[:4]] == [32, 0, 32, 0]


def test_async_mixed_outputs(probed):
    """AsyncScheduler, max_num_seqs 4, max_tokens alternating 1 and 3: some running
    requests hold a slot for their last token, others decode; the brute force decides."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    d = Driver(probed, cls=AsyncScheduler, max_num_batched_tokens=256, max_num_seqs=4, num_blocks=64,
               async_scheduling=True)
    for i in range(10):
        d.add(f"M{i}", 8, 1 if i % 2 == 0 else 3)
    rows = _async_drive(d, 12)
    assert all(got == want for got, want in rows), rows
    assert "deferred" in [got for got, _ in rows] and "max_num_seqs" in [got for got, _ in rows]


# -- invariants over every step ----------------------------------------------------------------


def test_absent_exactly_when_nothing_waits_and_preemption_whenever_a_step_preempted(probed):
    """A preempting workload (the guarantee tests'): in every step the field is absent iff
    the waiting queue is empty, and `preemption` iff the step preempted with requests
    waiting."""
    from tests._workload import SPEC, trace, workload
    from vllm_probe.sim import harness

    trace(harness.make_scheduler(harness.SchedulerSpec(**SPEC)), workload())
    steps = probed.of("step")
    assert any(s["preempted"] for s in steps)
    for s in steps:
        assert (s["head_blocked_by"] is None) == (s["waiting"] == 0), s
        if s["waiting"]:
            assert (s["head_blocked_by"] == "preemption") == bool(s["preempted"]), s


def test_an_unknown_layout_switches_the_field_off_and_nothing_else(probed, caplog):
    """A scheduler whose layout the profile cannot read: the steps go on without the field."""
    import logging

    caplog.set_level(logging.WARNING, logger="vllm_probe")
    d = Driver(probed, max_num_batched_tokens=64, num_blocks=64)
    probe = d.s.__dict__["_vllm_probe"]
    probe.admission.head = lambda s: 1 / 0  # the layout changed under the probe
    for rid in "ABC":
        d.add(rid, 100, 2)
    assert d.steps(2) == [None, None]
    assert probe.admission is None and len(probed.of("step")) == 2
    assert [r.getMessage() for r in caplog.records if "head_blocked_by" in r.getMessage()] == [
        "vllm-probe: head_blocked_by switched off (ZeroDivisionError: division by zero); step events go on"]
