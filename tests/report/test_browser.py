"""The report opened in a real browser: Debian's headless Chromium loads the page from
disk (no network), runs its scripts, and the test reads the page back (``--dump-dom``):
no script error, every chart drawn by Bokeh, the totals and the findings equal
``summary --json``'s and ``doctor --json``'s; a screenshot is kept beside the page in
the test's temporary folder.

Without ``chromium`` on PATH the test is skipped, unless
``VLLMPROBE_TEST_REQUIRE_CHROMIUM=1`` (set by .ci/run, which installs it): then it fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser

import pytest

from tests._events import scenario_preempt
from tests.conftest import ROOT
from vllm_probe import envvars

pytest.importorskip("bokeh")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
REQUIRED = os.environ.get(envvars.TEST_REQUIRE_CHROMIUM) == "1"
#: Chromium without a display, a profile of its own, nothing fetched: what CI can run.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars", "--enable-logging=stderr", "--v=0")
#: Virtual time the page's scripts get (ms): Bokeh draws, then the page's status script reports.
VIRTUAL_MS = 20_000


@pytest.fixture
def chromium():
    if CHROMIUM is None:
        if REQUIRED:
            pytest.fail(f"chromium is not installed and {envvars.TEST_REQUIRE_CHROMIUM}=1 "
                        "(.ci/run installs Debian's chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium); the report is not opened in a browser")
    return CHROMIUM


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if (tag in ("script", "img", "iframe") and a.get("src")) or (tag == "link" and a.get("href")):
            self.found.append(f"<{tag} {a}>")


def external(text: str) -> list[str]:
    """The tags that would load something from outside the page (script/img src, link href)."""
    parser = _Tags()
    parser.feed(text)
    return parser.found


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_probe", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


def browse(chromium: str, page, tmp_path, *what: str) -> subprocess.CompletedProcess:
    profile = tmp_path / "chromium-profile"
    profile.mkdir(exist_ok=True)
    return subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile}", f"--virtual-time-budget={VIRTUAL_MS}",
                           "--window-size=1400,3000", *what, page.as_uri()], capture_output=True, text=True,
                          timeout=180)


@pytest.fixture
def runs(tmp_path):
    """A generated two-engine run (about 12,000 steps: the buckets merge; preemptions),
    and a hand-made one, with a whatif folder and a tune.json of the latter."""
    from benchmarks.bench_analysis import generate_run

    big = tmp_path / "big"
    generate_run(big, 30_000)
    small = tmp_path / "small"
    scenario_preempt().write(small)
    (small / "meta.json").write_text(json.dumps({"command": ["python", "x.py"], "start_time": 199.0}))
    whatif = tmp_path / "whatif"
    for name, seqs, iv in (("baseline", 2, None), ("max_num_seqs=4", 4, {"ttft_p90": {"lo": 0.2, "hi": 0.5}})):
        d = whatif / name
        scenario_preempt().write(d)
        meta = {"simulated": True, "source": str(small), "settings": {"max_num_seqs": seqs},
                "overrides": {} if name == "baseline" else {"max_num_seqs": seqs}}
        if iv:
            meta["intervals"] = iv
        (d / "meta.json").write_text(json.dumps(meta))
    tune = tmp_path / "tune.json"
    tune.write_text(json.dumps({
        "source": str(small), "slo": [{"figure": "ttft_p90", "op": "<=", "value": 0.5}],
        "knobs": [{"setting": "max_num_seqs", "values": [2, 4]}], "objective": {"figure": "output_tokens_per_s"},
        "baseline": {"settings": {"max_num_seqs": 2}, "recorded": {"ttft_p90": 0.55}, "replayed": {"ttft_p90": 0.6}},
        "evaluated": [{"settings": {"max_num_seqs": 4}, "summary": {"ttft_p90": 0.4}, "meets": True,
                       "intervals": {"ttft_p90": {"lo": 0.3, "hi": 0.5, "from": "drift"}}}],
        "recommended": {"settings": {"max_num_seqs": 4}}}))
    return big, small, whatif, tune


def test_the_report_opens_in_chromium_with_the_summarys_totals(chromium, runs, tmp_path):
    big, small, whatif, tune = runs
    page = tmp_path / "report.html"
    proc = cli("report", str(big), str(small), "--whatif", str(whatif), "--tune", str(tune), "-o", str(page))
    assert proc.returncode == 0, proc.stderr
    text = page.read_text()
    assert external(text) == []  # every script and style inside the page: nothing to fetch
    charts = len(re.findall(r'data-root-id="', text))
    assert charts >= 10

    shot = tmp_path / "report.png"
    proc = browse(chromium, page, tmp_path, f"--screenshot={shot}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shot.stat().st_size > 20_000  # kept beside the page: the test's artefact
    proc = browse(chromium, page, tmp_path, "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout  # as the browser serializes it: attributes in double quotes
    console_errors = [ln for ln in proc.stderr.splitlines()
                      if "CONSOLE" in ln and (":ERROR:" in ln or "Uncaught" in ln)]
    assert console_errors == []
    errors = re.search(r'<div id="page-errors"([^>]*)>([^<]*)', dom)
    assert errors is not None and "hidden" in errors.group(1) and errors.group(2) == "", errors.group(0)

    status = re.search(r'<div id="page-status"([^>]*)>', dom)
    assert status is not None
    attrs = dict(re.findall(r'data-(\w+)="([^"]*)"', status.group(1)))
    assert attrs.get("done") == "1", attrs
    assert int(attrs["roots"]) == charts  # every chart drawn
    assert int(attrs["canvases"]) >= charts

    for i, run in enumerate((big, small)):
        summary = json.loads(cli("summary", str(run), "--json").stdout)
        shown = {k: v for k, r, v in re.findall(r'data-total="(\w+)" data-run="(\d+)" data-value="([^"]*)"', dom)
                 if int(r) == i}
        assert int(shown["steps"]) == summary["steps"] and summary["steps"] > 0
        assert int(shown["preemptions"]) == summary["preemptions"]["count"]
        assert int(shown["requests_finished"]) == summary["requests_finished"]
        assert int(shown["prompt_tokens"]) == summary["prompt_tokens"]
        assert int(shown["output_tokens"]) == summary["output_tokens"]
        assert int(shown["scheduled_tokens"]) == summary["scheduled_tokens"]
        assert int(shown["chunks"]) == summary["chunking"]["chunks"]
        assert int(shown["discarded_tokens"]) == summary["preemptions"]["discarded_tokens"]
        assert float(shown["duration_s"]) == pytest.approx(summary["duration_s"], rel=1e-12)
        latency_n = {c: int(n) for c, r, n in re.findall(r'data-latency="(\w+)" data-run="(\d+)" data-n="(\d+)"', dom)
                     if int(r) == i}
        classes = {c["name"]: c["n"] for c in summary["latency_classes"]["classes"] if c["n"]}
        assert {c: n for c, n in latency_n.items() if c != "all"} == classes
        doctor = json.loads(cli("doctor", str(run), "--json").stdout)
        shown_findings = [f for f, r in re.findall(r'data-finding="([\w-]+)" data-run="(\d+)"', dom) if int(r) == i]
        assert shown_findings == [f["id"] for f in doctor["findings"]]
    big_summary = json.loads(cli("summary", str(big), "--json").stdout)
    assert big_summary["preemptions"]["count"] > 0 and big_summary["engines"] == 2
