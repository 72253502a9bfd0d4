"""Profiles that match their run: a profile is used on its own (from the cache) only when
measured on the same model, vLLM release, dtype, block size and machine and when it
covers the run's own steps, else the report says why and proposes ``calibrate --like
RUN``; ``calibrate --out`` never replaces a file silently; ``calibrate`` and ``whatif``
show their progress on stderr."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from tests.conftest import requires_vllm, run_cli
from tests.sim._hand import nonlinear_cost, poisson, record, workload

#: A region that covers any hand-made run (tokens, requests, tokens).
WIDE = {"prefill_tokens": 1e6, "decode_reqs": 1e3, "attn_decode": 1e9}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return record(tmp_path_factory.mktemp("match") / "run", workload(poisson(n=12)), nonlinear_cost)


def _profile(run, path, region=None, created=1.0, **change):
    """A profile of ``run``'s engine (``change``: other identity fields), 2 ms + 4 µs per
    prefill token, measured over ``region`` (default :data:`WIDE`)."""
    from vllm_probe.analysis.workload import load_workload
    from vllm_probe.runs.rundir import read_meta
    from vllm_probe.sim import profile as profiles

    ident = profiles.identity_of_run(load_workload(run).config, read_meta(run))[0]
    ident = profiles.Identity(**{f: getattr(ident, f) for f in ident.__struct_fields__} | change)
    prof = profiles.Profile(terms=["prefill_tokens"], intercept_s=0.002, coef_s=[4e-6], region=dict(region or WIDE),
                            fit=[], measured_on=ident, created=created)
    return profiles.save(prof, path)


def _choice(run, profile=None, force=False):
    from vllm_probe.analysis.workload import load_workload
    from vllm_probe.sim.plan import step_time_model

    return step_time_model(run, load_workload(run), profile, force)


@requires_vllm
def test_a_profile_from_another_model_is_not_used_without_force(run, tmp_path, monkeypatch):
    from vllm_probe.sim.plan import ProfileRefused

    other = _profile(run, tmp_path / "other.json", model="/m/other")
    with pytest.raises(ProfileRefused) as e:
        _choice(run, str(other))
    assert str(e.value).startswith(f"the profile {other} was measured on model '/m/other', the recording's is ")
    assert str(e.value).endswith("or pass --force to use it anyway") and "\n" not in str(e.value)
    forced = _choice(run, str(other), force=True)
    assert forced.source == "profile" and forced.forced.startswith(f"FORCED: the profile {other}")
    # in the cache, it is never used on its own: the report says what differs
    cache = tmp_path / "cache"
    cached = _profile(run, cache / "other.json", model="/m/other")
    monkeypatch.setenv("VLLMPROBE_PROFILE_DIR", str(cache))
    choice = _choice(run)
    assert choice.source == "recording" and choice.profile is None
    ident_model = json.loads(cached.read_text())["measured_on"]
    assert ident_model["model"] == "/m/other"
    # no profile of the run's own model in the cache: nothing to say beyond the recording-only note
    assert not any(n.startswith("profile:") for n in choice.notes)
    same_model = _profile(run, cache / "bs.json", block_size=128)
    choice = _choice(run)
    assert choice.source == "recording"
    (note,) = [n for n in choice.notes if n.startswith("profile:")]
    assert note == (f"profile: the cached profile {same_model} is not used: it was measured on block size 128, "
                    f"the recording's is 16; vllm-probe calibrate --like {run} measures one for this engine")


@requires_vllm
def test_a_cached_profile_is_used_only_when_it_covers_the_runs_steps(run, tmp_path, monkeypatch):
    """The newest matching profile that leaves at most 5 % of the recorded steps outside its
    region is used; a newer one measured on smaller batches is passed over, and with only
    that one the report gives the share of the run outside it."""
    import numpy as np

    from vllm_probe.analysis.workload import load_workload
    from vllm_probe.sim.stepmodel import _INDEX, recorded_features

    cache = tmp_path / "cache"
    monkeypatch.setenv("VLLMPROBE_PROFILE_DIR", str(cache))
    small = {"prefill_tokens": 1e6, "decode_reqs": 2.0, "attn_decode": 1e9}
    narrow = _profile(run, cache / "narrow.json", region=small, created=2.0)
    rows, _ = recorded_features(load_workload(run))
    share = float(np.mean(rows[:, _INDEX["decode_reqs"]] > 2.1))  # beyond 2 decodes + 5 %
    assert share > 0.05
    choice = _choice(run)
    assert choice.source == "recording"
    (note,) = [n for n in choice.notes if n.startswith("profile:")]
    assert note == (f"profile: the cached profile {narrow} is not used: {share * 100:.0f} % of this run's steps lie "
                    "beyond the region it was measured on (up to 1,000,000 prefill tokens, 2 decodes, 1,000,000,000 "
                    f"decode context tokens); vllm-probe calibrate --like {run} measures one that covers them")
    wide = _profile(run, cache / "wide.json", created=1.0)  # older, but it covers the run
    choice = _choice(run)
    assert (choice.source, choice.profile) == ("cache", str(wide))
    assert any(n.startswith(f"profile: using {wide} from the profile cache") for n in choice.notes)
    # given by path, a profile that does not cover the run is used, and the report says how much lies outside
    given = _choice(run, str(narrow))
    assert given.source == "profile"
    assert f"profile: {share * 100:.0f} % of this run's steps lie beyond the region {narrow} was measured on" in \
        " ".join(given.notes)


def test_describe_group_and_the_progress_relay(tmp_path):
    from vllm_probe.sim.calibrate import ProgressRelay, describe_group

    assert describe_group([(1024, 2)]) == "prefill 1,024 tokens"
    assert describe_group([(300, 16)] * 8) == "decode 8 × 300-token contexts"
    assert describe_group([(16, 64)] * 4 + [(2048, 1)] * 2) == "mixed: 4 decoding beside 2 × 2,048-token prefills"
    said: list[str] = []
    path = tmp_path / "progress.txt"
    relay = ProgressRelay(path, said.append)
    assert relay.poll() == 0  # the child has not written yet
    path.write_text("engine started in 31 s; 3 groups, up to 150 s\ngroup 1/3: prefill 1 tokens (0 s)\ngroup 2/3: ")
    assert relay.poll() == 2 and said == ["engine started in 31 s; 3 groups, up to 150 s",
                                          "group 1/3: prefill 1 tokens (0 s)"]
    with open(path, "a") as f:
        f.write("decode 8 × 300-token contexts (1 s)\n")
    assert relay.poll() == 1 and said[-1] == "group 2/3: decode 8 × 300-token contexts (1 s)"
    assert relay.poll() == 0


@requires_vllm
def test_calibrate_out_never_replaces_a_file_silently(run, tmp_path, monkeypatch):
    from vllm_probe.sim.calibrate import CalibrateError, StandIn, calibrate

    monkeypatch.setenv("VLLMPROBE_PROFILE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "p.json"
    out.write_text("mine")
    r = run_cli("calibrate", "--like", str(run), "--out", str(out), env={"VLLMPROBE_PROFILE_DIR": str(
        tmp_path / "cache"), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and r.stderr.strip() == (f"vllm-probe: error: {out} exists; pass --force to replace "
                                                      "it, or choose another --out")
    assert out.read_text() == "mine" and not (tmp_path / "cache").exists()
    with pytest.raises(CalibrateError):
        calibrate(run, out, driver=StandIn(nonlinear_cost))

    def few_groups(plan, run_dir, max_seconds):  # the stand-in engine over the first 12 groups: enough to fit
        StandIn(nonlinear_cost)(dataclasses.replace(plan, groups=plan.groups[:12]), run_dir, max_seconds)

    said: list[str] = []
    prof, written = calibrate(run, out, driver=few_groups, force=True, log=said.append)
    assert written[0] == out and json.loads(out.read_text())["steps"] == prof.steps > 0
    assert not any(s.startswith("replaced the profile cache's") for s in said)
    said.clear()
    calibrate(run, None, driver=few_groups, log=said.append)  # the same engine again: the cache's file is replaced
    (line,) = [s for s in said if s.startswith("replaced the profile cache's")]
    assert re.fullmatch(rf"replaced the profile cache's {re.escape(str(written[1]))} \(measured "
                        rf"\d{{4}}-\d\d-\d\d \d\d:\d\d, {prof.steps} steps\)", line), line


@requires_vllm
def test_whatif_shows_its_progress_per_setting(run, tmp_path):
    from vllm_probe.sim.whatif import predict

    lines: list[str] = []
    r = predict(run, [{"max_num_seqs": 4}], out=tmp_path / "out", drift=False, progress=lines.append)
    assert len(lines) == 2 + r.spread.replays
    assert re.fullmatch(rf"replayed 1/{len(lines)}: baseline \({r.baseline.summary.steps:,} steps in [0-9.]+ s\)",
                        lines[0]), lines
    assert re.fullmatch(rf"replayed 2/{len(lines)}: max_num_seqs=4 \({r.configs[0].summary.steps:,} steps in "
                        r"[0-9.]+ s\)", lines[1]), lines
    cli = run_cli("whatif", str(run), "--set", "max_num_seqs=4", "--out", str(tmp_path / "cli"), "--json",
                  "--no-profile")
    assert cli.returncode == 0, cli.stderr
    said = [ln for ln in cli.stderr.splitlines() if ln.startswith("vllm-probe: replayed ")]
    assert [ln.split(":")[1].split()[1] for ln in said][:2] == ["1/" + str(len(said)), "2/" + str(len(said))]
    assert json.loads(cli.stdout)["configs"][0]["settings"]["max_num_seqs"] == 4
    saved = tmp_path / "cli" / "whatif.json"  # what report --whatif DIR reads: the --json object itself
    assert json.loads(saved.read_text()) == json.loads(cli.stdout) and saved.stat().st_mode & 0o777 == 0o600


def test_the_calibration_child_writes_a_progress_line_per_group(tmp_path, monkeypatch):
    """The child (an engine stood in for by a fake ``vllm.LLM``) appends a line when its
    engine is up and one per group, which the parent relays as they come."""
    import sys
    import types

    from vllm_probe.sim import calibrate as cal

    sent: list[int] = []
    fake = types.ModuleType("vllm")
    fake.LLM = lambda **kw: types.SimpleNamespace(generate=lambda prompts, params, use_tqdm: sent.append(len(prompts)))
    fake.SamplingParams = lambda **kw: kw
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: prompt_token_ids
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    progress = tmp_path / "progress.txt"
    groups = [[(64, 2)], [(300, 16)] * 4, [(16, 64)] * 2 + [(512, 1)]]
    spec = tmp_path / "plan.json"
    spec.write_text(json.dumps({"engine": {}, "groups": groups, "max_seconds": 150, "progress": str(progress)}))
    assert cal._child(str(spec)) == 0 and sent == [1, 4, 3]
    said: list[str] = []
    cal.ProgressRelay(progress, said.append).poll()
    assert re.fullmatch(r"engine started in \d+ s; 3 groups, up to 150 s", said[0]), said
    assert [re.sub(r" \(\d+ s\)$", "", s) for s in said[1:]] == [
        "group 1/3: prefill 64 tokens", "group 2/3: decode 4 × 300-token contexts",
        "group 3/3: mixed: 2 decoding beside 1 × 512-token prefills"]
