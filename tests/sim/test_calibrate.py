"""``vllm-probe calibrate`` on a stand-in engine of known nonlinear cost, profiles and
their matching, and calibrate's one-line failures."""

from __future__ import annotations


import numpy as np
import pytest

from tests.conftest import requires_vllm, run_cli
from tests.sim._hand import feature, nonlinear_cost, poisson, record, workload


def grid_rows(pmax: int, seqs: int, mml: int):
    """:data:`FEATURES` rows across the whole space: prefill-only steps of 1..pmax tokens,
    decode-only steps of 1..seqs requests at contexts up to max_model_len, mixed steps."""
    from vllm_probe.sim.stepmodel import FEATURES

    rows = []

    def row(pt=0, pr=0, d=0, ap=0, ad=0):
        r = dict.fromkeys(FEATURES, 0)
        r.update(prefill_tokens=pt, prefill_reqs=pr, decode_reqs=d, attn_prefill=ap, attn_decode=ad,
                 tokens=pt + d, reqs=pr + d)
        return [r[k] for k in FEATURES]

    for p in (1, 8, 64, 200, 256, 500, 700, 900, pmax):
        rows.append(row(pt=p, pr=1, ap=p * (p + 1) // 2))
    for b in (1, 4, 8, 12, seqs):
        for ctx in (16, 100, 400):
            rows.append(row(d=b, ad=b * ctx))
    for b, p in ((4, 256), (8, 800), (seqs, pmax)):
        rows.append(row(pt=p, pr=1, ap=p * (p + 1) // 2, d=b, ad=b * 64))
    return np.array(rows, float)


@requires_vllm
def test_calibrated_model_recovers_a_known_nonlinear_cost(tmp_path, monkeypatch):
    """The stand-in engine costs what :func:`nonlinear_cost` says (two regime changes):
    the profile recovers it within 3 % everywhere in the space, up to 4× the recorded
    budget; the recording-only fit (steps of ≤ 256 tokens) is off by > 25 % on a 1,024-
    token prefill and > 10 % on 16 decodes."""
    from vllm_probe.analysis.workload import load_workload
    from vllm_probe.sim.calibrate import StandIn, calibrate
    from vllm_probe.sim.stepmodel import fit

    monkeypatch.setenv("VLLMPROBE_PROFILE_DIR", str(tmp_path / "cache"))
    run = record(tmp_path / "run", workload(poisson(outputs=(5, 12))), nonlinear_cost)
    prof, written = calibrate(run, tmp_path / "p.json", driver=StandIn(nonlinear_cost))
    assert written[0] == tmp_path / "p.json" and len(written) == 2 and written[1].parent == tmp_path / "cache"
    assert prof.region["prefill_tokens"] == 1024 and prof.region["decode_reqs"] == 16  # 4 × budget 256
    assert min(prof.intercept_s, *prof.coef_s) >= 0
    assert any(t.startswith("prefill_tokens>") for t in prof.terms), prof.terms
    model = prof.model()
    rows = grid_rows(1024, 16, 2048)
    truth = np.array([nonlinear_cost(r) for r in rows])
    rel = np.abs(np.array([model.raw(r) for r in rows]) - truth) / truth
    assert rel.max() < 0.03, (prof.terms, rel.round(3))
    assert all(r.median_rel_err < 0.03 for r in prof.fit)
    rec = fit(load_workload(run))
    assert rec.region["prefill_tokens"] <= 256 and rec.intercept >= 0
    big = rows[[feature(r, "prefill_tokens") == 1024 and feature(r, "decode_reqs") == 0 for r in rows]][0]
    assert abs(rec.raw(big) * rec.level - nonlinear_cost(big)) / nonlinear_cost(big) > 0.25
    # and the model says when a step is outside what it was fitted on
    rec.reset_counts()
    rec.predict(big), rec.predict(rows[0])
    assert rec.outside_share == 0.5


def test_profile_from_another_engine_is_refused_in_one_line(tmp_path):
    from vllm_probe.sim import profile as profiles
    from vllm_probe.sim.profile import Identity, Profile, ProfileError

    here = Identity(model="/m/tiny", hardware="CPU: x", vllm="0.32.0", dtype="float32")
    prof = Profile(terms=["prefill_tokens"], intercept_s=0.001, coef_s=[1e-6], region={"prefill_tokens": 10.0},
                   fit=[], measured_on=here)
    path = profiles.save(prof, tmp_path / "p.json")
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]  # no temporary file left
    loaded = profiles.load(path)
    assert loaded == prof and profiles.check(loaded, here, path) is None
    for change, words in ((dict(model="/m/other"), "model '/m/tiny', the recording's is '/m/other'"),
                          (dict(vllm="0.33.0"), "vLLM release '0.32.0'"),
                          (dict(hardware="GPU: NVIDIA H200 ×1"), "hardware 'CPU: x'")):
        other = Identity(**{f: getattr(here, f) for f in here.__struct_fields__} | change)
        with pytest.raises(ProfileError) as e:
            profiles.check(loaded, other, path)
        assert "\n" not in str(e.value) and words in str(e.value) and "--force" in str(e.value)
        note = profiles.check(loaded, other, path, force=True)
        assert note.startswith("FORCED: ") and words in note
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ProfileError, match="is not a vllm-probe profile"):
        profiles.load(tmp_path / "bad.json")


def test_cached_profile_is_found_for_a_matching_recording(tmp_path, monkeypatch):
    from vllm_probe.sim import profile as profiles
    from vllm_probe.sim.profile import Identity, Profile

    monkeypatch.setenv("VLLMPROBE_PROFILE_DIR", str(tmp_path / "cache"))
    ident = Identity(model="/m/tiny", hardware="CPU: x", vllm="0.32.0")
    assert profiles.find_cached(ident) is None
    old = Profile(terms=[], intercept_s=0.001, coef_s=[], region={}, fit=[], measured_on=ident, created=1.0)
    new = Profile(terms=[], intercept_s=0.002, coef_s=[], region={}, fit=[], measured_on=ident, created=2.0)
    profiles.save(old, tmp_path / "cache" / "a.json")
    profiles.save(new, tmp_path / "cache" / "b.json")
    profiles.save(Profile(terms=[], intercept_s=0.003, coef_s=[], region={}, fit=[], created=3.0,
                          measured_on=Identity(model="/m/other", hardware="CPU: x", vllm="0.32.0")),
                  tmp_path / "cache" / "c.json")
    path, prof = profiles.find_cached(ident)
    assert path.name == "b.json" and prof.intercept_s == 0.002


def test_identity_of_a_run_reads_its_command():
    from vllm_probe.sim.profile import engine_arguments

    assert engine_arguments(["vllm", "serve", "meta/llama", "--dtype=bfloat16", "-tp", "2"]) == {
        "model": "meta/llama", "dtype": "bfloat16", "tensor_parallel_size": "2"}
    assert engine_arguments(["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m/x"]) == {
        "model": "/m/x"}


@requires_vllm
def test_calibrate_with_the_model_folder_gone_is_one_line(tmp_path):
    run = record(tmp_path / "run", workload(poisson(n=6)), nonlinear_cost,
                 meta={"command": ["vllm", "serve", str(tmp_path / "gone-model")]})
    r = run_cli("calibrate", "--like", str(run), "--out", str(tmp_path / "p.json"))
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0
    assert f"the model folder {tmp_path / 'gone-model'} is gone" in r.stderr
    assert not (tmp_path / "p.json").exists()


@requires_vllm
def test_whatif_refuses_a_profile_of_another_release_and_marks_it_when_forced(tmp_path):
    import io

    from rich.console import Console

    from vllm_probe.sim import profile as profiles
    from vllm_probe.sim.profile import Identity, Profile
    from vllm_probe.sim.whatif import WhatifError, predict
    from vllm_probe.tui.whatif_view import render

    run = record(tmp_path / "run", workload(poisson(n=8)), nonlinear_cost)
    other = Identity(model="/m/tiny", hardware=profiles.hardware(), vllm="0.1.0")
    path = profiles.save(Profile(terms=["prefill_tokens", "decode_reqs"], intercept_s=0.002, coef_s=[4e-6, 3e-4],
                                 region={"prefill_tokens": 1024.0, "decode_reqs": 16.0, "attn_decode": 1e5},
                                 fit=[], measured_on=other), tmp_path / "p.json")
    with pytest.raises(WhatifError) as e:
        predict(run, [], out=tmp_path / "o", profile=path)
    assert "\n" not in str(e.value) and "was measured on model '/m/tiny'" in str(e.value)
    r = predict(run, [], out=tmp_path / "o", profile=path, force=True)
    assert r.forced.startswith("FORCED: ") and r.profile == str(path) and r.model.profile == str(path)
    assert r.model.terms == ("prefill_tokens", "decode_reqs") and r.model.level > 0
    out = io.StringIO()
    Console(file=out, width=200).print(render(r, 200))
    assert "FORCED PROFILE" in out.getvalue()
    assert r.to_dict()["forced"] == r.forced


@requires_vllm
def test_ctrl_c_during_calibration_leaves_no_profile_and_no_run(tmp_path, monkeypatch):
    import tempfile

    from vllm_probe.sim.calibrate import calibrate

    monkeypatch.setenv("VLLMPROBE_PROFILE_DIR", str(tmp_path / "cache"))
    run = record(tmp_path / "run", workload(poisson(n=6)), nonlinear_cost)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    seen = []

    def interrupted(plan, run_dir, max_seconds):
        (run_dir / "events-1.jsonl").write_text("{}\n")
        seen.append(run_dir)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        calibrate(run, tmp_path / "p.json", driver=interrupted)
    assert seen and not seen[0].exists() and list((tmp_path / "tmp").iterdir()) == []
    assert not (tmp_path / "p.json").exists() and not (tmp_path / "cache").exists()


def test_the_seconds_from_beyond_the_region_are_counted():
    """1 ms + 1 µs per prefill token, fitted up to 1,000 tokens: steps of 1,040 (inside: 5 %
    slack), 1,200, 1,600 and 500 tokens take 2.04 + 2.2 + 2.6 + 1.5 = 8.34 ms, of which
    0.2 + 0.6 ms come from tokens beyond 1,000 (the 1,040 step is inside, not counted); a
    term that costs little adds little however far beyond (decode attention at 1 ns)."""
    import pytest

    from vllm_probe.sim.stepmodel import FEATURES, StepTimeModel

    region = {"prefill_tokens": 1000.0, "decode_reqs": 16.0, "attn_decode": 1000.0}
    m = StepTimeModel(("prefill_tokens", "attn_decode"), 0.001, (1e-6, 1e-9), region=region)

    def row(pt, attn=0.0):
        r = [0.0] * len(FEATURES)
        r[FEATURES.index("prefill_tokens")] = pt
        r[FEATURES.index("attn_decode")] = attn
        return r

    for pt in (1040, 1200, 1600, 500):
        m.predict(row(pt))
    assert m.outside_share == 0.5
    assert m.extrapolated_share == pytest.approx(0.8 / 8.34)
    m.reset_counts()
    assert m.extrapolated_share is None
    m.predict(row(100, attn=4000.0))  # 4x beyond in attention: 3 µs of its 1.104 ms
    assert (m.outside_share, m.extrapolated_share) == (1.0, pytest.approx(0.003 / 1.104))
