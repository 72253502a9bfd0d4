"""vLLM's own recompute counter (``vllm:recomputed_token_executions_total``, vLLM PR #57698,
in no release yet) beside the probe's count of the same positions (analysis/recompute.py).

No vLLM release has the counter, so the scheduler-level test runs a stand-in: vLLM 0.32's
real ``Scheduler`` subclassed to count as the PR describes it (per request the highest
position a preemption made stale; each later scheduled position below it), its per-step
count put on ``SchedulerOutput``; the probe records the run as it records any, and its count
from its own events must equal the stand-in's to the token."""

from __future__ import annotations

import json
from types import SimpleNamespace

from tests._events import Stream, records, scenario_preempt
from tests.conftest import requires_vllm
from vllm_probe.analysis.recompute import ENGINE_FIELD, RecomputeCheck, RecomputeListener, engine_count
from vllm_probe.analysis.state import RunState


def follow(events) -> tuple[RunState, RecomputeListener]:
    rc = RecomputeListener()
    return RunState(step_window=0, listener=rc).apply_all(records(events)), rc


def test_a_request_preempted_in_decode_reprefills_one_position_more_than_vllm_counts():
    """scenario_preempt: B (80-token prompt) preempted with 80 computed, re-prefilled
    [0, 81); preempted again with 81, re-prefilled [0, 82): vLLM counts 80 + 81 below the
    frontiers, the summary's recomputed tokens are 81 + 82."""
    state, rc = follow(scenario_preempt().events)
    check = RecomputeCheck.of(rc)
    assert (check.probe_tokens, check.engine_tokens, check.agree) == (161, None, None)
    assert state.total("recomputed_tokens") == 163
    assert rc.counts[0].frontier == {}  # B finished: no frontier kept


def test_a_request_preempted_mid_prefill_counts_only_what_it_had_computed():
    """A 100-token prompt preempted with 64 computed: its re-prefill starts after a 32-token
    prefix-cache hit, [32, 48), 16 positions again; preempted again with 48 computed (the
    frontier stays 64), re-prefilled [0, 40) then [40, 100): 40 + 24 more. The recomputed
    tokens count every token of those chunks."""
    s = Stream()
    s.config(1.0, budget=64, max_num_seqs=4, prefix_caching=True)
    s.added(1.0, "A", 100, 5, arrival=1.0)
    s.chunk(1.1, 0, "A", 0, 0, 64, 100)
    s.step(1.1, 0, 64, prefill=64, running=1, waiting=0)
    s.preempt(1.2, 1, "A", 64, 100, 0, 1, running=0, waiting=1)
    s.step(1.2, 1, 64, running=0, waiting=1, preempted=["A"])
    s.chunk(1.3, 2, "A", 0, 32, 48, 100, resumed=True)
    s.step(1.3, 2, 64, prefill=16, running=1, waiting=0)
    s.preempt(1.4, 3, "A", 48, 100, 0, 2, running=0, waiting=1)
    s.step(1.4, 3, 64, running=0, waiting=1, preempted=["A"])
    s.chunk(1.5, 4, "A", 0, 0, 40, 100, resumed=True)
    s.step(1.5, 4, 64, prefill=40, running=1, waiting=0)
    s.chunk(1.6, 5, "A", 1, 40, 100, 100, last=True, resumed=True)
    s.step(1.6, 5, 64, prefill=60, running=1, waiting=0)
    state, rc = follow(s.events)
    assert RecomputeCheck.of(rc).probe_tokens == 16 + 40 + 24
    assert state.total("recomputed_tokens") == 16 + 40 + 60


def test_the_engines_own_count_is_read_defensively_and_summed():
    rc = RecomputeListener()
    eng = SimpleNamespace(engine=3)
    for value in (5, None, True, -1, "7", 2.0, 0, 4):  # only non-negative ints are a count
        rc.on_step(eng, SimpleNamespace(recomputed_token_executions=value))  # type: ignore[arg-type]
    rc.on_step(eng, SimpleNamespace())  # type: ignore[arg-type]  # a probe or release without the field
    assert engine_count(SimpleNamespace(**{ENGINE_FIELD: 12})) == 12 and ENGINE_FIELD == "recomputed_token_executions"
    assert (rc.counts[3].engine_tokens, rc.counts[3].engine_steps) == (9, 3)
    assert engine_count(SimpleNamespace(recomputed_token_executions=True)) is None
    rc.counts[3].probe_tokens = 9
    assert RecomputeCheck.of(rc).to_dict() == {"metric": "vllm:recomputed_token_executions_total",
                                               "probe_tokens": 9, "engine_tokens": 9, "engine_steps": 3,
                                               "agree": True}
    rc.counts[3].probe_tokens = 10
    assert RecomputeCheck.of(rc).agree is False


def test_metrics_serve_the_probes_count_and_the_engines_beside_it():
    from prometheus_client import CollectorRegistry, generate_latest

    from vllm_probe.exporters.prometheus import RunStateCollector

    state, rc = follow(scenario_preempt().events)
    registry = CollectorRegistry()
    registry.register(RunStateCollector(state, recompute=rc))
    lines = generate_latest(registry).decode().splitlines()
    assert 'vllm_probe_recomputed_positions_total{engine="0"} 161.0' in lines
    assert 'vllm_probe_recomputed_tokens_total{engine="0"} 163.0' in lines
    assert not [x for x in lines if x.startswith("vllm_probe_engine_recomputed_token_executions_total{")]
    rc.counts[0].step(161)  # where the engine exposes it
    lines = generate_latest(registry).decode().splitlines()
    assert 'vllm_probe_engine_recomputed_token_executions_total{engine="0"} 161.0' in lines


def _stand_in():
    from vllm.v1.core.sched.scheduler import Scheduler

    class StandInCounter(Scheduler):
        """vLLM PR #57698's counter as its description defines it, on vLLM 0.32's scheduler."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.stale_frontier: dict[str, int] = {}
            self.recomputed_token_executions_total = 0
            made.append(self)

        def _preempt_request(self, request, *args, **kwargs):
            rid = request.request_id
            self.stale_frontier[rid] = max(self.stale_frontier.get(rid, 0), request.num_computed_tokens)
            return super()._preempt_request(request, *args, **kwargs)

        def schedule(self, *args, **kwargs):
            out = super().schedule(*args, **kwargs)
            starts = {r.req_id: r.num_computed_tokens for r in out.scheduled_new_reqs}
            cached = out.scheduled_cached_reqs
            starts.update(zip(cached.req_ids, cached.num_computed_tokens))
            n = 0
            for rid, k in out.num_scheduled_tokens.items():
                f = self.stale_frontier.get(rid)
                if f is not None:
                    n += max(0, min(starts[rid] + k, f) - starts[rid])
            out.num_recomputed_tokens = n
            self.recomputed_token_executions_total += n
            return out

    made: list = []
    return StandInCounter, made


@requires_vllm
def test_the_probes_count_equals_a_stand_in_of_vllms_counter_to_the_token(tmp_path):
    """Eight requests on 29 blocks with prefix caching: 4 preemptions while decoding throw
    away 905 computed tokens, but the re-prefills hit the blocks still cached, so only 89
    positions run again (vLLM's count, and the probe's); the summary's recomputed tokens,
    every token of the resumed passes, are 93 (each re-prefill's last sampled token, 4)."""
    from tests._simrun import record
    from vllm_probe.cli import main

    cls, made = _stand_in()
    spec = dict(max_num_batched_tokens=128, max_num_seqs=16, num_blocks=30, block_size=16, max_model_len=1024,
                enable_prefix_caching=True)
    run = record(tmp_path / "run", spec, [(f"r{i}", 150 + 10 * i, 60) for i in range(8)], scheduler_cls=cls)
    vllm_count = made[0].recomputed_token_executions_total
    from vllm_probe.runs.reader import ReadStats, iter_run

    state, rc = follow(list(iter_run(run, ReadStats())))
    assert (RecomputeCheck.of(rc).probe_tokens, vllm_count) == (89, 89)
    assert (state.total("recomputed_tokens"), state.total("discarded_tokens"), state.total("preemptions_total")) == (
        93, 905, 4)
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["summary", str(run), "--json"]) == 0
    assert json.loads(out.getvalue())["recompute_counter"] == {
        "metric": "vllm:recomputed_token_executions_total", "probe_tokens": 89, "engine_tokens": None,
        "engine_steps": 0, "agree": None}
