"""``vllm-probe report`` as a writer: the page whole and private, one-line errors, an
interrupted write leaving the previous page; and what the page says without a browser
(totals from the summary, each finding's link to the steps it cites)."""

from __future__ import annotations

import json
import shutil
import os
import re
import stat
from pathlib import Path
import subprocess
import sys

import pytest

from tests._events import scenario_preempt
from tests.conftest import ROOT
from vllm_probe.analysis.report import read_run
from vllm_probe.analysis.summary import summarize

pytest.importorskip("bokeh")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_probe", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


@pytest.fixture
def run(tmp_path):
    run = tmp_path / "run"
    scenario_preempt().write(run)
    (run / "meta.json").write_text(json.dumps({"command": ["python", "x.py"], "start_time": 199.0}))
    return run


def test_the_page_is_written_whole_and_private_in_the_run_by_default(run):
    proc = cli("report", str(run))
    assert proc.returncode == 0, proc.stderr
    page = run / "report.html"
    assert stat.S_IMODE(page.stat().st_mode) == 0o600
    assert f"-> {page}" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    text = page.read_text()
    summary = summarize(run)
    totals = dict(re.findall(r"data-total='(\w+)' data-run='0' data-value='([^']*)'", text))
    assert int(totals["steps"]) == summary.steps == 9
    assert int(totals["preemptions"]) == summary.preemptions.count == 2
    assert int(totals["requests_finished"]) == 3 and int(totals["recomputed_tokens"]) == 163
    assert sorted(os.listdir(run)) == ["events-4242.jsonl", "meta.json", "report.html"]


def test_each_finding_links_to_the_steps_it_cites(run):
    page = read_run(run)
    from vllm_probe.html.report import render

    text = render([page])
    links = re.findall(r"data-finding='([\w-]+)' data-run='0'>.*?data-first='(\d+)' data-last='(\d+)'", text)
    want = [(fs.finding.id, str(fs.first_step), str(fs.last_step)) for fs in page.findings
            if fs.first_step is not None]
    assert links == want and want  # the preempt scenario's findings cite steps
    assert "vpZoom('steps-x'" in text


@pytest.mark.parametrize("args, message", [
    (["--whatif", "/nonexistent/w"], "/nonexistent/w: no such file or directory"),
    (["-o", "/nonexistent/dir/r.html"], "cannot write /nonexistent/dir/r.html"),
])
def test_bad_input_is_one_line_and_exit_2(run, args, message):
    proc = cli("report", str(run), *args)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [f"vllm-probe: error: {message}"
                                                                         + proc.stderr.strip().split(message, 1)[1]]
    assert not (run / "report.html").exists()


def test_a_missing_run_and_a_folder_without_a_result(run, tmp_path):
    proc = cli("report", str(tmp_path / "nope"))
    assert proc.returncode == 2 and "run directory not found" in proc.stderr
    (tmp_path / "empty").mkdir()
    proc = cli("report", str(run), "--whatif", str(tmp_path / "empty"))
    assert proc.returncode == 2 and "no replayed run directory" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_an_interrupted_write_leaves_the_previous_page(tmp_path):
    from vllm_probe.html.report import write

    out = tmp_path / "r.html"
    write(out, "<p>one</p>")

    class Interrupted(str):
        def encode(self, *a, **k):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write(out, Interrupted("<p>two</p>"))
    assert out.read_text() == "<p>one</p>" and os.listdir(tmp_path) == ["r.html"]


def test_the_page_shows_the_plan_of_a_saved_doctor_json_else_the_arithmetic(tmp_path):
    """``--doctor FILE`` (a saved ``doctor --json``) puts its replayed plan on the page; without
    it the page shows the rules' arithmetic as the plan, labelled unchecked."""
    import json

    from tests.conftest import run_cli

    run = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parents[1] / "data" / "demo-run", run)
    page = tmp_path / "plain.html"
    r = run_cli("report", str(run), "-o", str(page))
    assert r.returncode == 0, r.stderr
    text = page.read_text()
    assert "the rules&#x27; arithmetic, not checked by the replay" in text or \
        "the rules' arithmetic, not checked by the replay" in text
    saved = tmp_path / "doctor.json"
    plan = {"settings": {"num_kv_blocks": 225}, "flags": ["--num-gpu-blocks-override", "225"],
            "engine_args": {"num_gpu_blocks_override": 225}, "checked": True, "clears": ["kv-bound"],
            "leaves": ["preemption-storm"], "left_because": {"preemption-storm": "preemptions 3 against the goal 0.3"}}
    saved.write_text(json.dumps({"run_dir": str(run), "plan": plan, "findings": []}))
    page2 = tmp_path / "replayed.html"
    r = run_cli("report", str(run), "--doctor", str(saved), "-o", str(page2))
    assert r.returncode == 0, r.stderr
    text = page2.read_text()
    assert "(replayed)" in text and "--num-gpu-blocks-override 225" in text
    assert "preemptions 3 against the goal 0.3" in text
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    r = run_cli("report", str(run), "--doctor", str(bad), "-o", str(tmp_path / "x.html"))
    assert r.returncode == 2 and "not the output of `vllm-probe doctor --json`" in r.stderr
    # saved from another working directory: the run directory's name is the run's
    rel = tmp_path / "relative.json"
    rel.write_text(json.dumps({"run_dir": "run", "plan": plan, "findings": []}))
    r = run_cli("report", str(run), "--doctor", str(rel), "-o", str(tmp_path / "rel.html"))
    assert r.returncode == 0, r.stderr
    assert "--num-gpu-blocks-override 225" in (tmp_path / "rel.html").read_text()
    other = tmp_path / "other.json"  # another run's doctor is refused, not dropped without a word
    other.write_text(json.dumps({"run_dir": str(tmp_path / "elsewhere"), "plan": plan, "findings": []}))
    r = run_cli("report", str(run), "--doctor", str(other), "-o", str(tmp_path / "o.html"))
    assert r.returncode == 2 and f"a doctor of {tmp_path / 'elsewhere'}, none of this report's runs" in r.stderr
    r = run_cli("report", str(run), "--doctor", str(tmp_path / "missing.json"), "-o", str(tmp_path / "m.html"))
    assert r.returncode == 2 and r.stderr.strip().endswith(f"{tmp_path / 'missing.json'}: no such file or directory")
    assert not (tmp_path / "o.html").exists() and not (tmp_path / "m.html").exists()
