"""The held-slot scenario on the real CPU engine (vLLM 0.32, the tiny model, AsyncScheduler
forced on as design.md §6 says): ``doctor`` finds ``held-slots`` at two step rates, the
engine's own and with 200 ms of extra work per model step, with the same evidence (the
finding is read from the steps, not from their timing)."""

from __future__ import annotations

import glob
import json
import statistics

import pytest

from tests.conftest import requires_vllm, run_cli

pytestmark = [requires_vllm, pytest.mark.engine, pytest.mark.slow]

SCENARIO = "configs/scenarios/held-slots.yaml"


def _doctor(run_dir) -> dict:
    r = run_cli("doctor", str(run_dir), "--json", "--no-replay", timeout=120)
    assert r.returncode in (0, 3), r.stderr
    return {f["id"]: f for f in json.loads(r.stdout)["findings"]}


def _step_interval_s(run_dir) -> float:
    ts = []
    for path in glob.glob(f"{run_dir}/events-*.jsonl"):
        with open(path) as lines:
            for line in lines:
                ev = json.loads(line)
                if ev["event"] == "step":
                    ts.append(ev["ts"])
    ts.sort()
    return statistics.median(b - a for a, b in zip(ts, ts[1:]))


def test_held_slots_found_at_two_step_rates(probe_run):
    fast_dir = probe_run("--scenario", SCENARIO)
    slow_dir = probe_run("--scenario", SCENARIO, "--step-delay-ms", "200")
    fast, slow = _doctor(fast_dir), _doctor(slow_dir)
    assert _step_interval_s(slow_dir) >= 0.2  # the extra work per step took effect
    for found in (fast, slow):
        f = found["held-slots"]
        ev = f["evidence"]
        assert ev["scheduler_class"] == "AsyncScheduler" and ev["max_num_seqs"] == 16 and ev["running_max"] == 16
        assert ev["held_steps"] >= 3 and ev["held_max"] >= 1
        assert set(ev["head_blocked_by"]) <= {"deferred", "max_num_seqs"}
        assert (f["remedy"]["setting"], f["remedy"]["value"]) == ("async_scheduling", False)
        assert f["remedy"]["alternatives"][0]["setting"] == "max_num_seqs"
        assert "stall" not in found  # the 0-token steps are the held slots' symptom, named once
    # one burst of 200 one-token requests, all added before the first step: the same schedule
    assert fast["held-slots"]["evidence"] == slow["held-slots"]["evidence"]
