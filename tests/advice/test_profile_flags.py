"""``doctor`` and ``tune`` take whatif's ``--profile``/``--no-profile``/``--force``
(:mod:`vllm_probe.cli.profile_args`): another engine's profile is refused in one line
(exit 2), ``--force`` is marked in ``--json``, a cached profile is used on its own and
said; the profile reaches every replay of the ``Evaluator`` (in this process and in
``--jobs`` processes: the same figures, not the recording-only fit's), and each
prediction carries its share of steps outside the fitted region."""

from __future__ import annotations

import json
import pickle

import pytest

from tests.conftest import requires_vllm
from vllm_probe import cli

pytestmark = requires_vllm

SLO_KNOB = ["--slo", "preemptions<=0", "--knob", "max_num_seqs=2,4"]


@pytest.fixture(scope="module")
def storm_run(tmp_path_factory):
    """16 requests of 64 + 100 tokens in 39 usable KV blocks (vLLM's Scheduler, no model):
    17 preemptions at max_num_seqs 16 (a ``preemption-storm`` finding with knobs)."""
    from tests._simrun import record

    return record(tmp_path_factory.mktemp("profile-flags") / "storm",
                  dict(max_num_batched_tokens=256, max_num_seqs=16, num_blocks=40, block_size=16, max_model_len=256),
                  [(f"R{i}", 64, 100) for i in range(16)], max_steps=5000)


@pytest.fixture(scope="module")
def hand_run(tmp_path_factory):
    """20 requests recorded on a virtual clock of a known step cost
    (:func:`tests.sim._hand.nonlinear_cost`): the same step times in every recording."""
    from tests.sim._hand import nonlinear_cost, poisson, record, workload

    return record(tmp_path_factory.mktemp("profile-flags") / "hand", workload(poisson(n=20)), nonlinear_cost)


def _profile(run, path, region=None, **change):
    """A hand-made profile of ``run``'s engine (``change``: another identity's fields)
    whose step time is 10 ms per prefill token and nothing else, fitted up to 8 prefill
    tokens and 2 decodes (the storm's steps are far outside it), or over ``region``."""
    from vllm_probe.analysis.workload import load_workload
    from vllm_probe.runs.rundir import read_meta
    from vllm_probe.sim import profile as profiles

    ident = profiles.identity_of_run(load_workload(run).config, read_meta(run))[0]
    ident = profiles.Identity(**{f: getattr(ident, f) for f in ident.__struct_fields__} | change)
    prof = profiles.Profile(terms=["prefill_tokens"], intercept_s=0.0, coef_s=[1e-2],
                            region=region or {"prefill_tokens": 8.0, "decode_reqs": 2.0, "attn_decode": 100.0},
                            fit=[],
                            measured_on=ident, created=1.0)
    return profiles.save(prof, path)


def _json(capsys, argv, code=0):
    assert cli.main(argv) == code, capsys.readouterr().err
    out, err = capsys.readouterr()
    return json.loads(out), err


@pytest.mark.parametrize("command", [["tune", *SLO_KNOB], ["doctor", "--budget", "5"], ["whatif"]])
def test_another_engines_profile_is_refused_in_one_line(command, storm_run, tmp_path, capsys):
    other = _profile(storm_run, tmp_path / "other.json", model="/m/other")
    argv = [command[0], str(storm_run), *command[1:], "--profile", str(other), "--json"]
    if command[0] == "whatif":
        argv += ["--out", str(tmp_path / "whatif")]
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = [ln for ln in err.splitlines() if ln.startswith("vllm-probe: error: ")]
    assert f"the profile {other} was measured on model '/m/other', the recording's is " in line
    assert "pass --force to use it anyway" in line


@pytest.mark.parametrize("command", [["tune", *SLO_KNOB], ["doctor", "--budget", "5"], ["whatif"]])
def test_force_uses_it_and_json_says_so(command, storm_run, tmp_path, capsys):
    other = _profile(storm_run, tmp_path / "other.json", model="/m/other")
    extra = ["--out", str(tmp_path / "whatif")] if command[0] == "whatif" else []
    d, _ = _json(capsys, [command[0], str(storm_run), *command[1:], "--profile", str(other), "--force", "--json",
                          *extra], code=_doctor_code(storm_run) if command[0] == "doctor" else 0)
    model = d["step_time_model"]
    assert model["source"] == "profile" and model["profile"] == str(other)
    assert model["forced"].startswith(f"FORCED: the profile {other} was measured on model '/m/other'")


def _doctor_code(run) -> int:
    from vllm_probe.analysis.doctor import examine

    return 3 if examine(run).critical else 0


@pytest.mark.parametrize("args,msg", [
    (["--profile", "p.json", "--no-profile"], "--profile and --no-profile exclude each other"),
    (["--profile", "/nonexistent/p.json"], "cannot read the profile /nonexistent/p.json"),
])
@pytest.mark.parametrize("command", [["tune", *SLO_KNOB], ["doctor"], ["whatif"]])
def test_bad_profile_flags_are_one_line_exit_2(command, args, msg, tmp_path, capsys):
    assert cli.main([command[0], str(tmp_path), *command[1:], *args]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("vllm-probe: error: ") and msg in line


def test_doctor_no_replay_refuses_profile_flags(tmp_path, capsys):
    assert cli.main(["doctor", str(tmp_path), "--no-replay", "--no-profile"]) == 2
    assert "not with --no-replay" in capsys.readouterr().err


def test_the_profile_reaches_tunes_replays(hand_run, tmp_path, capsys):
    """10 ms per prefill token and nothing per decode (the level fitted on the recording)
    predicts other TTFTs than the recording-only fit (on a recording of known step times:
    max_num_seqs 4 gives 0.115 s against 0.031 s, 2 gives 0.108 s against 0.134 s); most
    replayed steps are outside the profile's region (≤ 8 prefill tokens, ≤ 2 decodes),
    none outside the recording's."""
    prof = _profile(hand_run, tmp_path / "p.json")
    with_p, _ = _json(capsys, ["tune", str(hand_run), *SLO_KNOB, "--json", "--profile", str(prof)])
    without, _ = _json(capsys, ["tune", str(hand_run), *SLO_KNOB, "--json", "--no-profile"])
    assert with_p["step_time_model"] == {"source": "profile", "profile": str(prof), "forced": None}
    assert without["step_time_model"] == {"source": "recording", "profile": None, "forced": None}
    ttft = {p["settings"]["max_num_seqs"]: p["summary"]["ttft_p90"] for p in with_p["evaluated"]}
    ttft_rec = {p["settings"]["max_num_seqs"]: p["summary"]["ttft_p90"] for p in without["evaluated"]}
    assert ttft.keys() == ttft_rec.keys() == {2, 4}
    assert ttft[4] > 2 * ttft_rec[4] and abs(ttft[2] - ttft_rec[2]) > 0.1 * ttft_rec[2], (ttft, ttft_rec)
    assert with_p["baseline"]["outside_region"] > 0.5
    assert all(p["outside_region"] > 0.5 for p in with_p["evaluated"])
    assert with_p["recommended"]["outside_region"] > 0.5
    assert any("step-time shape from the profile" in n for n in with_p["notes"])
    assert without["baseline"]["outside_region"] == 0.0
    assert all(p["outside_region"] == 0.0 for p in without["evaluated"])


def test_the_profile_reaches_jobs_processes_and_ray_tasks(storm_run, tmp_path):
    """The same figures in --jobs processes as in this process with the profile, and the
    task a Ray worker receives (pickled) carries the profile's model."""
    from vllm_probe.advice.evaluate import Evaluator

    prof = _profile(storm_run, tmp_path / "p.json")
    points = [{"max_num_seqs": 2}, {"max_num_seqs": 4}]

    def figures(evs):
        return [(e.overrides, e.figures, e.outside_region) for e in evs]

    with Evaluator(storm_run, profile=prof) as ev:
        here = figures(ev.evaluate(points))
        task, _ = ev._tasks([{"max_num_seqs": 2}])[0]
        shipped = pickle.loads(pickle.dumps(task))
        assert shipped.model.profile == str(prof) and shipped.model.terms == ("prefill_tokens",)
    with Evaluator(storm_run, profile=prof, jobs=2) as ev:
        assert figures(ev.evaluate(points)) == here
    with Evaluator(storm_run, profile=False) as ev:
        assert figures(ev.evaluate(points)) != here


def test_a_cached_profile_is_used_on_its_own_and_said(storm_run, tmp_path, monkeypatch, capsys):
    """A cached profile of this engine that covers the run's steps is used on its own (one
    that does not is passed over: tests/sim/test_profile_match.py)."""
    cache = tmp_path / "cache"
    prof = _profile(storm_run, cache / "tiny.json",
                    region={"prefill_tokens": 1e4, "decode_reqs": 64.0, "attn_decode": 1e7})
    monkeypatch.setenv("VLLMPROBE_PROFILE_DIR", str(cache))
    d, _ = _json(capsys, ["tune", str(storm_run), *SLO_KNOB, "--json"])
    assert d["step_time_model"] == {"source": "cache", "profile": str(prof), "forced": None}
    assert any(n.startswith(f"profile: using {prof} from the profile cache") for n in d["notes"])
    d, err = _json(capsys, ["doctor", str(storm_run), "--budget", "5", "--json"], code=_doctor_code(storm_run))
    assert d["step_time_model"]["source"] == "cache"
    assert f"vllm-probe: note: profile: using {prof} from the profile cache" in err
    d, _ = _json(capsys, ["tune", str(storm_run), *SLO_KNOB, "--json", "--no-profile"])
    assert d["step_time_model"]["source"] == "recording"


def test_doctor_predictions_carry_the_outside_share(storm_run, tmp_path, capsys):
    prof = _profile(storm_run, tmp_path / "p.json")
    d, _ = _json(capsys, ["doctor", str(storm_run), "--budget", "20", "--json", "--profile", str(prof)],
                 code=_doctor_code(storm_run))
    assert d["step_time_model"] == {"source": "profile", "profile": str(prof), "forced": None}
    searched = [f for f in d["findings"] if f["predicted"]]
    assert searched
    for f in searched:
        p = f["predicted"]
        assert p["baseline_outside_region"] > 0.5
        assert all(t["outside_region"] > 0.5 for t in p["tried"] if "error" not in t)
        if f["remedy"] and f["remedy"]["checked"]:
            assert f["remedy"]["predicted"]["outside_region"] > 0.5
