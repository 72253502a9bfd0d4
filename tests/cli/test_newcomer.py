"""What a new user stumbles on (part 10, item 6): a run whose command never started an
engine, mistyped subcommands, ``~`` in paths, shortened request ids, the seed's §4.3
script without ``if __name__ == "__main__":``, and getting ``vllm-probe`` on PATH."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from tests._events import scenario_chunked
from tests.conftest import ROOT, requires_vllm, run_cli
from vllm_probe.cli import SUBCOMMANDS, main, mistyped_subcommand
from vllm_probe.runs.hints import spawn_hint, unguarded_engine_call
from vllm_probe.runs.ids import RequestIdError, match_request_id, request_ids
from vllm_probe.runs.rundir import find_latest_run, read_meta, write_meta

#: The seed notes' §4.3 script as written (the model: the tiny local one), line for line.
SEED_SCRIPT = '''from vllm import LLM, SamplingParams
prompts = ["请详细解释调度器原理。" * 200 for _ in range(16)]
sampling_params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=64)
llm = LLM(
    model="{model}",
    max_num_batched_tokens=8192,
    max_num_seqs=64,
    enable_chunked_prefill=True,
    gpu_memory_utilization=0.90,
)
outputs = llm.generate(prompts, sampling_params)
for i, out in enumerate(outputs):
    print(f"[{{i}}] {{out.outputs[0].text[:40]!r}}")
'''
HINT = 'put the script\'s code under `if __name__ == "__main__":`'


# -- a run whose command never started an engine ------------------------------------------------


def _run_at(path: Path, start: float, *, events: bool, code: int = 0) -> None:
    if events:
        scenario_chunked().write(path)
    else:
        path.mkdir(parents=True)
    write_meta(path, {"command": ["python", "x.py"], "start_time": start, "end_time": start + 5,
                      "exit_code": code, "engine_started": events})


def test_latest_skips_runs_that_never_started_an_engine(tmp_path, monkeypatch):
    root = tmp_path / "vllm-probe-runs"
    now = time.time()
    _run_at(root / "a-good", now - 100, events=True)
    _run_at(root / "b-failed", now - 50, events=False, code=1)
    _run_at(root / "c-failed", now - 10, events=False, code=1)
    assert find_latest_run(root) == (root / "a-good", [root / "c-failed", root / "b-failed"])
    monkeypatch.chdir(tmp_path)
    r = run_cli("summary", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "vllm-probe summary vllm-probe-runs/a-good" in r.stdout
    assert r.stderr.strip() == ("vllm-probe: note: showing vllm-probe-runs/a-good: the newer "
                                "vllm-probe-runs/c-failed and 1 more never started an engine (exit 1)")
    # asked for by name, the failed run says why it has nothing to show
    r = run_cli("summary", str(root / "c-failed"), cwd=tmp_path)
    assert r.returncode == 1
    assert "no event files" in r.stderr and "the command (exit 1) ended before vLLM's engine core started" in r.stderr
    # a run recorded before engine_started existed: finished without event files counts too
    meta = read_meta(root / "c-failed")
    del meta["engine_started"]
    write_meta(root / "c-failed", meta)
    assert find_latest_run(root)[1] == [root / "c-failed", root / "b-failed"]
    # only failed runs: the newest, and no note (summary explains it)
    only = tmp_path / "only"
    _run_at(only / "x", now, events=False, code=1)
    assert find_latest_run(only) == (only / "x", [])


def test_run_marks_a_command_that_started_no_engine(tmp_path):
    out = tmp_path / "run"
    r = run_cli("run", "--out", str(out), "--", sys.executable, "-c", "raise SystemExit(3)")
    assert r.returncode == 3
    meta = read_meta(out)
    assert meta["exit_code"] == 3 and meta["engine_started"] is False


# -- mistyped subcommands ----------------------------------------------------------------------


@pytest.mark.parametrize("word, meant", [("summry", "summary"), ("tial", "tail"), ("comapre", "compare"),
                                         ("exprot", "export"), ("rn", "run")])
def test_did_you_mean(word, meant, capsys):
    assert mistyped_subcommand(word) == meant
    assert main([word, "RUN_DIR"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"vllm-probe: error: unknown subcommand {word!r} (did you mean {meant!r}?); "
                   f"subcommands: {', '.join(SUBCOMMANDS)}")


def test_a_command_that_exists_is_run_whatever_its_name(tmp_path, monkeypatch):
    # `tai` is close to `tail`, but a program of that name on PATH is a command to run
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "tai").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "tai").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert mistyped_subcommand("tai") is None
    assert mistyped_subcommand("./summry") is None  # a path is never a subcommand
    assert mistyped_subcommand("frobnicate") is None  # not close to any: "command not found"


# -- ~ in paths ------------------------------------------------------------------------------------


def test_tilde_is_expanded_in_path_arguments(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path)}
    r = run_cli("run", "--out=~/runs/one", "--", sys.executable, "-c", "pass", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "runs" / "one" / "meta.json").is_file() and not (tmp_path / "~").exists()
    scenario_chunked().write(tmp_path / "events-run")
    r = run_cli("summary", "~/events-run", "--json", env=env, cwd=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["steps"] == 7
    r = run_cli("export", "~/events-run", "-o", "~/out.jsonl", env=env, cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "out.jsonl").is_file()
    r = run_cli("compare", "~/events-run", "~/events-run", env=env, cwd=tmp_path)
    assert r.returncode == 0
    r = run_cli("tail", "--plain", "~/events-run", env=env, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.count(" step ") == 7


# -- request ids by unique prefix --------------------------------------------------------------------


def test_request_ids_by_unique_prefix(tmp_path):
    ids = {"0-86816bc7", "1-86816bc8", "cmpl-8f3a2c41-0", "cmpl-8f3a9d00-0"}
    assert match_request_id("0-86816bc7", ids) == "0-86816bc7"
    assert match_request_id("1-", ids) == "1-86816bc8"
    assert match_request_id("cmpl-8f3a2…", ids) == "cmpl-8f3a2c41-0"  # pasted from the dashboard
    with pytest.raises(RequestIdError, match=r"'cmpl-8f3a' starts 2 request ids \(cmpl-8f3a2c41-0, cmpl-8f3a9d00-0\)"):
        match_request_id("cmpl-8f3a", ids)
    with pytest.raises(RequestIdError, match=r"no request id starts with 'x' \(4 requests in the run\)"):
        match_request_id("x", ids)

    run = tmp_path / "run"
    scenario_chunked(req="cmpl-8f3a2c41-0").write(run)
    assert request_ids(run) == {"cmpl-8f3a2c41-0"}
    r = run_cli("export", str(run), "-o", "-", "--request", "cmpl-8f3")
    assert r.returncode == 0, r.stderr
    assert "vllm-probe: request cmpl-8f3 is cmpl-8f3a2c41-0" in r.stderr
    kinds = [json.loads(line)["event"] for line in r.stdout.splitlines()]
    assert kinds == ["engine_config", "request_added", "chunk", "chunk", "chunk", "request_finished"]


# -- the seed's §4.3 script without `if __name__ == "__main__":` -------------------------------------


def test_spawn_hint_from_the_script(tmp_path):
    script = tmp_path / "seed43.py"
    script.write_text(SEED_SCRIPT.format(model="/tiny"), encoding="utf-8")
    assert unguarded_engine_call(script) == 4  # `llm = LLM(` is line 4
    hint = spawn_hint([sys.executable, str(script)])
    assert hint.startswith("seed43.py starts vLLM at import time (line 4); if the error above says")
    assert hint.endswith(HINT)
    assert spawn_hint([sys.executable, "-u", str(script)]) == hint
    guarded = tmp_path / "guarded.py"
    body = "\n".join("    " + line for line in SEED_SCRIPT.format(model="/tiny").splitlines()[1:])
    guarded.write_text("from vllm import LLM, SamplingParams\nif __name__ == '__main__':\n" + body + "\n")
    assert spawn_hint([sys.executable, str(guarded)]) is None
    via_main = tmp_path / "via_main.py"
    via_main.write_text("from vllm import LLM\n\ndef main():\n    return LLM(model='x')\n\nmain()\n")
    assert unguarded_engine_call(via_main) == 6
    assert spawn_hint([sys.executable, "-m", "seed43"]) is None and spawn_hint(["bash", str(script)]) is None
    # run --live keeps the output: the error itself is recognised
    log = ["RuntimeError: ", "        An attempt has been made to start a new process before the",
           "        current process has finished its bootstrapping phase."]
    assert spawn_hint([sys.executable, str(guarded)], log).endswith("put guarded.py's code under "
                                                                      '`if __name__ == "__main__":`')


def test_failed_run_prints_the_hint_once(tmp_path):
    script = tmp_path / "fake.py"  # fails like vLLM's engine start does: at import, no events
    script.write_text("import sys\n\ndef LLM(**kw):\n    sys.exit(1)\n\nllm = LLM(model='x')\n")
    r = run_cli("run", "--out", str(tmp_path / "run"), "--", sys.executable, str(script))
    assert r.returncode == 1
    hints = [line for line in r.stderr.splitlines() if line.startswith("vllm-probe: hint: ")]
    assert hints == [f"vllm-probe: hint: fake.py starts vLLM at import time (line 6); if the error above says \"An "
                     f"attempt has been made to start a new process\", vLLM's engine core (a spawned process) imported "
                     f"the script again: {HINT}"]
    r = run_cli("run", "--out", str(tmp_path / "ok"), "--", sys.executable, "-c", "raise SystemExit(2)")
    assert "hint" not in r.stderr  # no script to blame: no hint


@requires_vllm
@pytest.mark.engine
def test_the_seed_script_verbatim_fails_with_the_hint(tmp_path):
    from vllm_probe.sim.tiny_model import write_tiny_model

    script = tmp_path / "seed43.py"
    script.write_text(SEED_SCRIPT.format(model=write_tiny_model()), encoding="utf-8")
    r = run_cli("run", "--out", str(tmp_path / "run"), "--", sys.executable, str(script), cwd=tmp_path, timeout=300)
    assert r.returncode != 0
    assert "An attempt has been made to start a new process before the" in r.stderr  # vLLM's real failure
    assert r.stderr.rstrip().splitlines()[-1] == (
        "vllm-probe: hint: seed43.py starts vLLM at import time (line 4); if the error above says \"An attempt has "
        "been made to start a new process\", vLLM's engine core (a spawned process) imported the script again: "
        f"{HINT}")
    assert read_meta(tmp_path / "run")["engine_started"] is False


# -- vllm-probe on PATH after `make demo` ------------------------------------------------------------


def test_the_readme_and_make_demo_say_how_to_get_vllm_probe_on_path():
    readme = (ROOT / "README.md").read_text()
    setup = readme.split("## Set-up: two commands", 1)[1].split("\n## ", 1)[0]
    block = setup.split("```sh", 1)[1].split("```", 1)[0]
    assert [line.split("#")[0].strip() for line in block.strip().splitlines()] == ["make demo", "make test"]
    assert ". .venv/bin/activate" in setup
    demo = (ROOT / "Makefile").read_text().split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    assert "$(VENV)/bin/activate' puts it on PATH" in demo
