"""doctor's replay-chosen remedy and its one plan run on the real engine (vLLM 0.32 CPU, the
tiny model): the thrash scenario's storm ends, the plan clears what it claims with its
counts exact, and doctor on the remedied run does not ask to undo it."""

from __future__ import annotations

import json

import pytest

from tests.conftest import requires_vllm, run_cli
from vllm_probe.analysis.objectives import measure

pytestmark = [requires_vllm, pytest.mark.engine, pytest.mark.slow]

SCENARIO = ("--scenario", "configs/scenarios/thrash.yaml")
FLAGS = {"max_num_batched_tokens": "--max-num-batched-tokens", "max_num_seqs": "--max-num-seqs",
         "num_kv_blocks": "--num-kv-blocks", "long_prefill_token_threshold": "--long-prefill-token-threshold"}


_DOCTORED: dict[str, dict] = {}


def _doctor_json(run) -> dict:
    """``doctor --json`` of ``run`` (once per run in the session: each takes minutes)."""
    if str(run) not in _DOCTORED:
        r = run_cli("doctor", str(run), "--json", "--budget", "300", timeout=1800)
        assert r.returncode in (0, 3), r.stderr[-2000:]
        _DOCTORED[str(run)] = json.loads(r.stdout)
    return _DOCTORED[str(run)]


def _doctor(run) -> dict:
    return {f["id"]: f for f in _doctor_json(run)["findings"]}


def test_the_storms_remedy_ends_it_for_real_and_advice_converges(probe_run):
    recorded = probe_run(*SCENARIO)
    found = _doctor(recorded)
    r = found["preemption-storm"]["remedy"]
    assert r is not None and r["checked"] is True
    pred = r["predicted"]
    assert pred["goal"]["figure"] == "preemptions" and pred["predicted"] <= 0.1 * pred["baseline"]
    extra = [a for k, v in r["whatif"].items() for a in (FLAGS[k], str(v))]
    rerun = probe_run(*SCENARIO, *extra)
    real = measure(rerun, ["preemptions"])["preemptions"]
    assert real == pred["predicted"]  # the replay is exact on preemptions of an offline burst
    assert real <= 0.1 * pred["recorded"]
    from vllm_probe.analysis.summary import summarize

    config = summarize(recorded).config
    again = _doctor(rerun)
    assert "preemption-storm" not in again
    for f in again.values():  # nothing asks to move the remedied settings back
        for k, v in ((f.get("remedy") or {}).get("whatif") or {}).items():
            if k in r["whatif"] and isinstance(v, (int, float)):
                was = config.get(k)
                assert was is None or (v - r["whatif"][k]) * (was - r["whatif"][k]) <= 0, f


def test_the_plan_clears_what_it_claims_for_real_with_its_counts_exact(probe_run):
    recorded = probe_run(*SCENARIO)
    plan = _doctor_json(recorded)["plan"]
    assert plan["checked"] is True and "preemption-storm" in plan["clears"]
    assert set(plan["settings"]) <= set(FLAGS)
    rerun = probe_run(*SCENARIO, *[a for k, v in plan["settings"].items() for a in (FLAGS[k], str(v))])
    left = {f["id"] for f in _doctor_json(rerun)["findings"] if f["severity"] != "info"}
    assert not set(plan["clears"]) & left, left
    predicted = plan["predicted"]["preemptions"]
    assert predicted["met"] is True
    assert measure(rerun, ["preemptions"])["preemptions"] == predicted["predicted"]
