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
    state = RunState(listener=ep).apply_all(s.events)
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
                  "held_max": 16, "step_range": [1, 39], "max_num_seqs": 16, "running_max": 16, "waiting_max": 484,
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


def test_held_slots_needs_a_few_steps():
    """2 held steps (HELD_MIN_STEPS 3) are a finishing request's one-step hold, not a finding."""
    assert "held-slots" not in _found(_held_stream("busy", 0.001, pairs=2))
    assert "held-slots" in _found(_held_stream("busy", 0.001, pairs=3))
