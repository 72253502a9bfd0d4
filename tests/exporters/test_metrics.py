"""Prometheus metrics (vllm_probe/exporters/prometheus.py) without an engine.

The collector's series on the hand-made streams of tests/_events.py, whose figures are
worked out by hand there and in tests/analysis/test_summary.py; the server over HTTP on a run
directory that grows, with a malformed and a half-written line; ``run --metrics-port``
and the ``metrics`` sidecar end to end with a command that writes events itself.
The real engines and a real Prometheus server: tests/e2e/test_fleet_prometheus.py.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests._events import scenario_chunked, scenario_preempt, records
from tests.conftest import ROOT, vllm_probe_cmd
from vllm_probe.analysis.state import RunState
from vllm_probe.exporters.prometheus import MetricsServer, RunStateCollector, model_name_of
from vllm_probe.runs.reader import ReadStats

approx = pytest.approx


def scrape_text(collector: RunStateCollector) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry).decode()


class Series:
    """The samples of one exposition, looked up by name and labels."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples = {}
        self.types = {}
        for fam in text_string_to_metric_families(text):
            self.types[fam.name] = fam.type
            for s in fam.samples:
                self.samples[(s.name, frozenset(s.labels.items()))] = s.value

    def __call__(self, name: str, **labels) -> float:
        return self.samples[(name, frozenset(labels.items()))]

    def names(self) -> set[str]:
        return {name for name, _ in self.samples}

    def buckets(self, name: str, **labels) -> dict[str, float]:
        """``le`` -> cumulative count of a histogram's series."""
        return {dict(lbl)["le"]: v for (n, lbl), v in self.samples.items()
                if n == name + "_bucket" and {k: v2 for k, v2 in lbl if k != "le"} == labels}


def collect(events, **kw) -> Series:
    return Series(scrape_text(RunStateCollector(RunState().apply_all(records(events)), **kw)))


# -- the collector on hand-made streams ---------------------------------------------------


def test_counters_of_the_preemption_scenario_by_hand():
    """tests/_events.scenario_preempt: 9 steps scheduling 100 100 31 51 82 1 82 1 0 tokens
    (budget 100), B preempted twice (80 then 81 tokens discarded, 81 + 82 recomputed),
    7 chunks, 3 requests."""
    m = collect(scenario_preempt().events)
    e = {"engine": "0"}
    assert m("vllm_probe_steps_total", **e) == 9
    assert m("vllm_probe_scheduled_tokens_total", **e) == 448
    assert (m("vllm_probe_prefill_tokens_total", **e), m("vllm_probe_decode_tokens_total", **e)) == (443, 5)
    assert m("vllm_probe_preemptions_total", reason="kv_cache", **e) == 2
    assert m("vllm_probe_preemptions_total", reason="reset", **e) == 0
    assert m("vllm_probe_discarded_tokens_total", reason="kv_cache", **e) == 80 + 81
    assert m("vllm_probe_recomputed_tokens_total", **e) == 81 + 82
    assert m("vllm_probe_requests_preempted_total", **e) == 1
    assert m("vllm_probe_prefill_chunks_total", **e) == 7
    assert m("vllm_probe_kv_reread_tokens_total", **e) == 100 + 50  # A's [100,150), B's [50,80)
    assert m("vllm_probe_prefix_cache_hit_tokens_total", **e) == 0
    assert (m("vllm_probe_requests_added_total", **e), m("vllm_probe_requests_finished_total", **e)) == (3, 3)
    assert {lim: m("vllm_probe_steps_by_limit_total", limit=lim, **e)
            for lim in ("token_budget", "max_num_seqs", "kv_cache", "none")} == \
        {"token_budget": 2, "max_num_seqs": 2, "kv_cache": 1, "none": 4}
    assert m("vllm_probe_events_written_total", **e) == len(scenario_preempt().events) - 1  # lines before probe_stats
    assert m("vllm_probe_events_dropped_total", **e) == m("vllm_probe_hook_errors_total", **e) == 0
    assert m.types["vllm_probe_steps"] == "counter"  # the family; its sample is vllm_probe_steps_total


def test_histograms_of_the_preemption_scenario_by_hand():
    m = collect(scenario_preempt().events)
    e = {"engine": "0"}
    # tokens per step 100 100 31 51 82 1 82 1 0: three <= 1, 31 <= 32, 51 <= 64, the rest <= 128
    tok = m.buckets("vllm_probe_step_tokens", **e)
    assert (tok["1.0"], tok["16.0"], tok["32.0"], tok["64.0"], tok["128.0"], tok["+Inf"]) == (3, 3, 4, 5, 9, 9)
    assert m("vllm_probe_step_tokens_sum", **e) == 448 and m("vllm_probe_step_tokens_count", **e) == 9
    # budget use 1.0 1.0 .31 .51 .82 .01 .82 .01 0
    use = m.buckets("vllm_probe_step_budget_use_ratio", **e)
    assert (use["0.01"], use["0.3"], use["0.4"], use["0.6"], use["0.8"], use["0.9"], use["0.99"], use["1.0"]) == \
        (3, 3, 4, 5, 5, 7, 7, 9)
    assert m("vllm_probe_step_budget_use_ratio_sum", **e) == approx(4.48)
    # schedule() took 1 ms each
    sched = m.buckets("vllm_probe_schedule_duration_seconds", **e)
    assert (sched["0.0005"], sched["0.001"]) == (0, 9)
    assert m("vllm_probe_schedule_duration_seconds_sum", **e) == approx(0.009)
    # queue: A 0.095, B 0.195, C 0.395 s; TTFT: A 0.3, B 0.4, C 0.5 s
    q = m.buckets("vllm_probe_request_queue_time_seconds", **e)
    assert (q["0.08"], q["0.1"], q["0.25"], q["0.5"], q["+Inf"]) == (0, 1, 2, 3, 3)
    assert m("vllm_probe_request_queue_time_seconds_sum", **e) == approx(0.685)
    t = m.buckets("vllm_probe_time_to_first_token_seconds", **e)
    assert (t["0.25"], t["0.5"], t["+Inf"]) == (0, 3, 3)
    assert m("vllm_probe_time_to_first_token_seconds_sum", **e) == approx(1.2)
    # chunks of the first complete pass: A 2, B 2, C 1
    c = m.buckets("vllm_probe_prefill_chunks_per_prompt", **e)
    assert (c["1.0"], c["2.0"], c["+Inf"]) == (1, 3, 3)
    assert m("vllm_probe_prefill_chunks_per_prompt_sum", **e) == 5
    # histograms' buckets are cumulative and end at the count
    for name in ("vllm_probe_step_tokens", "vllm_probe_request_queue_time_seconds"):
        values = [v for le, v in sorted(m.buckets(name, **e).items(), key=lambda kv: float(kv[0]))]
        assert values == sorted(values) and values[-1] == m(name + "_count", **e)


def test_a_collector_scraped_while_the_state_grows_says_what_a_fresh_one_says():
    """The collector remembers where each (tokens, budget) pair falls between scrapes."""
    a, b = scenario_preempt().records, scenario_chunked(engine=1, pid=9, t=300.0).records
    state = RunState()
    collector = RunStateCollector(state)
    for ev in a[:10] + b[:5]:
        state.apply(ev)
    early = Series(scrape_text(collector))
    assert early.buckets("vllm_probe_step_tokens", engine="0")["+Inf"] == 2
    for ev in a[10:] + b[5:]:
        state.apply(ev)
    assert scrape_text(collector) == scrape_text(RunStateCollector(state))
    assert collect(a).buckets("vllm_probe_step_tokens", engine="0") == \
        Series(scrape_text(collector)).buckets("vllm_probe_step_tokens", engine="0")


def test_gauges_and_the_config_info():
    m = collect(scenario_preempt().events)
    e = {"engine": "0"}
    assert (m("vllm_probe_running_requests", **e), m("vllm_probe_waiting_requests", **e)) == (0, 0)
    assert m("vllm_probe_kv_cache_usage_ratio", **e) == 0.5 and m("vllm_probe_kv_cache_free_blocks", **e) == 10
    assert m("vllm_probe_last_step_timestamp_seconds", **e) == approx(200.9)
    ((name, labels),) = [k for k in m.samples if k[0] == "vllm_probe_engine_config_info"]
    info = dict(labels)
    assert m(name, **info) == 1
    assert info == {"engine": "0", "probe_version": "0.1.0", "vllm_version": "0.32.0", "max_num_batched_tokens": "100",
                    "max_num_seqs": "2", "enable_chunked_prefill": "true", "long_prefill_token_threshold": "0",
                    "num_kv_blocks": "64", "block_size": "128", "kv_capacity_tokens": "8064",
                    "max_model_len": "8192", "scheduling_policy": "fcfs", "async_scheduling": "false",
                    "prefix_caching": "false", "data_parallel_size": "1", "scheduler_class": "Scheduler"}


def test_two_engine_cores_are_two_series_and_sum_to_the_run():
    a = scenario_chunked(engine=0, pid=11, t=100.0, req="a")
    b = scenario_chunked(engine=1, pid=22, t=100.05, req="b")
    m = collect(sorted(a.events + b.events, key=lambda ev: ev["ts"]))
    for engine in ("0", "1"):
        assert m("vllm_probe_steps_total", engine=engine) == 7
        assert m("vllm_probe_prefill_chunks_total", engine=engine) == 3
        assert m("vllm_probe_kv_reread_tokens_total", engine=engine) == 2048 + 4096
        assert m.buckets("vllm_probe_prefill_chunks_per_prompt", engine=engine)["2.0"] == 0
        assert m.buckets("vllm_probe_prefill_chunks_per_prompt", engine=engine)["3.0"] == 1
        # TTFT 0.501 s; queue 0.2 s
        assert m.buckets("vllm_probe_time_to_first_token_seconds", engine=engine)["0.75"] == 1
        assert m.buckets("vllm_probe_request_queue_time_seconds", engine=engine)["0.25"] == 1
    steps = [v for (name, _), v in m.samples.items() if name == "vllm_probe_steps_total"]
    assert sorted(steps) == [7, 7]


def test_no_request_id_in_any_label():
    m = collect(scenario_preempt().events)
    label_values = {v for _, labels in m.samples for _, v in labels}
    assert not label_values & {"A", "B", "C"}
    assert {k for _, labels in m.samples for k, _ in labels} <= {
        "engine", "reason", "limit", "le", *dict(next(lbl for n, lbl in m.samples
                                                     if n == "vllm_probe_engine_config_info"))}


# -- model_name ----------------------------------------------------------------------------


@pytest.mark.parametrize("command, expected", [
    (["vllm", "serve", "Qwen/Qwen2.5-7B-Instruct", "--port", "8000"], "Qwen/Qwen2.5-7B-Instruct"),
    (["/opt/venv/bin/vllm", "serve", "m", "--served-model-name", "chat", "chat-b"], "chat"),
    (["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/llama"], "llama"),
    (["vllm", "serve", "/work/main/.venv/models/tiny-llama/"], "tiny-llama"),  # a local folder: never its path
    (["vllm", "serve", "./tiny"], "tiny"),
    (["vllm", "serve", "/models/llama", "--served-model-name", "/x/y"], "/x/y"),  # the user's own name, as given
    (["python", "-m", "vllm.entrypoints.openai.api_server", "--model=/models/llama",
      "--served-model-name=llama"], "llama"),
    (["python", "examples/long_prompts.py", "--num-prompts", "8"], None),
    (["python", "my_script.py", "serve", "x"], None),  # not vllm's serve
    (["vllm", "serve", "--model", "m2"], "m2"),
    ([], None),
    (None, None),
])
def test_model_name_from_the_command_line(command, expected):
    assert model_name_of(command) == expected


def test_model_name_labels_every_engine_series_when_known():
    meta = {"command": ["vllm", "serve", "m1", "--served-model-name", "tiny"]}
    m = collect(scenario_preempt().events, meta=meta, stats=ReadStats(), incomplete_lines=lambda: 0)
    assert m("vllm_probe_steps_total", engine="0", model_name="tiny") == 9
    assert m("vllm_probe_preemptions_total", engine="0", model_name="tiny", reason="kv_cache") == 2
    assert m("vllm_probe_lines_skipped_total", model_name="tiny", reason="malformed") == 0
    assert m("vllm_probe_lines_incomplete", model_name="tiny") == 0
    assert all(dict(labels).get("model_name") == "tiny" for _, labels in m.samples)


# -- head_blocked_by and the doctor's findings ----------------------------------------------


def test_head_blocked_counts_are_the_steps_with_each_reason():
    from tests.analysis.test_doctor_rules import Run

    r = Run()
    r.step(running=1, waiting=2, blocked="kv_cache", times=3)
    r.step(running=1, waiting=1, blocked="token_budget")
    r.step(running=1, waiting=0)  # nothing waits: no reason
    r.step(running=1, waiting=1, blocked="a_reason_from_a_newer_probe")
    m = Series(scrape_text(RunStateCollector(RunState().apply_all(records(r.s.events)))))
    got = {dict(lbl)["reason"]: v for (n, lbl), v in m.samples.items() if n == "vllm_probe_steps_by_head_blocked_total"}
    assert got == {"kv_cache": 3, "token_budget": 1, "max_num_seqs": 0, "preemption": 0, "prefill_limit": 0,
                   "deferred": 0, "other": 1}


def test_findings_are_one_series_each_while_they_hold():
    findings = [SimpleNamespace(id="kv_thrash", severity="warning", engine=0),
                SimpleNamespace(id="kv_thrash", severity="warning", engine=0),  # the same series once
                SimpleNamespace(id="budget_idle", severity="info", engine=None)]  # a finding of the whole run
    seen = []

    def source(state):
        seen.append(state)
        return findings

    state = RunState().apply_all(records(scenario_preempt().events))
    m = Series(scrape_text(RunStateCollector(state, findings=source)))
    assert seen == [state]
    got = {tuple(sorted(dict(lbl).items())): v for (n, lbl), v in m.samples.items() if n == "vllm_probe_finding"}
    assert got == {(("engine", "0"), ("id", "kv_thrash"), ("severity", "warning")): 1,
                   (("engine", ""), ("id", "budget_idle"), ("severity", "info")): 1}
    none = Series(scrape_text(RunStateCollector(state, findings=lambda _s: [])))
    assert "vllm_probe_finding" in none.types and not [n for n in none.names() if n == "vllm_probe_finding"]
    assert "vllm_probe_finding" not in collect(scenario_preempt().events).types  # no source: absent


def test_the_server_serves_the_doctors_findings_on_what_it_followed(tmp_path):
    """The metrics server runs the doctor's rules on the state it follows: the findings
    `vllm-probe doctor` reports on the same run, one series each."""
    from tests.analysis.test_doctor_rules import _storm
    from vllm_probe.analysis.doctor import examine

    run = tmp_path / "run"
    _storm(200, (1, 1)).s.write(run)
    (run / "meta.json").write_text(json.dumps({"start_time": 1.0, "end_time": 2.0}))
    want = {(f.id, f.severity) for f in examine(run).findings}
    assert ("preemption-storm", "warning") in want
    with MetricsServer("127.0.0.1", 0) as server:
        server.follow(run, background=False)
        server.pump()
        m = Series(urllib.request.urlopen(server.url, timeout=10).read().decode())
    got = {(dict(lbl)["id"], dict(lbl)["severity"]) for (n, lbl), v in m.samples.items()
           if n == "vllm_probe_finding" and v == 1}
    assert got == want


def test_every_metric_is_documented_and_every_documented_metric_exists():
    state = RunState().apply_all(records(scenario_preempt().events))
    m = Series(scrape_text(RunStateCollector(state, stats=ReadStats(), incomplete_lines=lambda: 0,
                                             findings=lambda _s: [SimpleNamespace(id="x", severity="info")])))
    exposed = {name + "_total" if kind == "counter" else name + "_info" if kind == "info" else name
               for name, kind in m.types.items()}
    doc = (ROOT / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"^\| `(vllm_probe_\w+)`", doc, re.M))
    assert documented == exposed
    assert {"vllm_probe_steps_total", "vllm_probe_preemptions_total", "vllm_probe_prefill_chunks_total"} <= exposed


# -- the server: HTTP, a growing run, bad lines ------------------------------------------


def get(url: str) -> Series:
    with urllib.request.urlopen(url, timeout=5) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        return Series(r.read().decode())


def wait_for(url: str, cond, timeout: float = 10.0, proc: subprocess.Popen | None = None) -> Series:
    """The first scrape of ``url`` that satisfies ``cond``. With ``proc`` (the server's
    process): the server may not answer yet, and the process must stay alive meanwhile."""
    deadline = time.monotonic() + timeout
    m = None
    while True:
        if proc is not None:
            assert proc.poll() is None, proc.communicate()
        try:
            m = get(url)
            if cond(m):
                return m
        except KeyError:
            pass
        except OSError:
            if proc is None:
                raise
        assert time.monotonic() < deadline, m.text[-2000:] if m is not None else "no answer"
        time.sleep(0.05)


def test_server_follows_a_growing_run_counting_bad_and_half_written_lines(tmp_path):
    stream = scenario_preempt()
    lines = stream.lines()
    steps_in = lambda ls: sum(1 for line in ls if '"event": "step"' in line)  # noqa: E731
    head, tail = lines[:12], lines[12:]
    path = tmp_path / "events-4242.jsonl"
    half = tail[0][:20]
    path.write_text("".join(head) + "this is not json\n" + '{"event": "mystery", "ts": 1.0}\n' + half)
    (tmp_path / "meta.json").write_text(json.dumps({"command": ["vllm", "serve", "tiny"], "start_time": 1.0}))
    with MetricsServer("127.0.0.1", 0, poll_s=0.02) as server:
        before = get(server.url)  # before following: no engine's series, still a valid answer
        assert not [labels for _, labels in before.samples if "engine" in dict(labels)]
        server.follow(tmp_path)
        e = {"engine": "0", "model_name": "tiny"}
        # the unknown kind's line follows the first 12 events: once it is counted, they are read;
        # the half line is counted when the follower's pass ends (a scrape can fall between)
        first = wait_for(server.url, lambda m: m("vllm_probe_lines_skipped_total", model_name="tiny",
                                                 reason="unknown_kind") == 1
                         and m("vllm_probe_lines_incomplete", model_name="tiny") == 1)
        assert first("vllm_probe_steps_total", **e) == steps_in(head)
        assert first("vllm_probe_lines_skipped_total", model_name="tiny", reason="malformed") == 1
        assert first("vllm_probe_lines_skipped_total", model_name="tiny", reason="unknown_kind") == 1
        assert first("vllm_probe_lines_incomplete", model_name="tiny") == 1  # the writer is mid-line
        with open(path, "a") as f:  # the writer finishes its line and the run
            f.write(tail[0][20:] + "".join(tail[1:]))
        # probe_stats is the last line: once it counts, every line is read
        last = wait_for(server.url, lambda m: m("vllm_probe_events_written_total", **e) == len(lines) - 1)
        assert last("vllm_probe_lines_incomplete", model_name="tiny") == 0
        assert last("vllm_probe_steps_total", **e) == 9
        assert last("vllm_probe_preemptions_total", reason="kv_cache", **e) == 2
        assert last("vllm_probe_discarded_tokens_total", reason="kv_cache", **e) == 161
        assert last("vllm_probe_prefill_chunks_total", **e) == 7
        for key, value in first.samples.items():  # counters never go down
            if key[0].endswith(("_total", "_bucket", "_count")) and key in last.samples:
                assert last.samples[key] >= value, key
        # a file that appears later: another engine core
        other = scenario_chunked(engine=1, pid=77, t=300.0)
        other.write(tmp_path)
        both = wait_for(server.url, lambda m: m("vllm_probe_steps_total", engine="1", model_name="tiny") == 7)
        assert both("vllm_probe_steps_total", **e) == 9
        url = server.url
    with pytest.raises(urllib.error.URLError):  # closed: nothing listens any more
        urllib.request.urlopen(url, timeout=2)


# -- end to end: run --metrics-port, and the sidecar -------------------------------------

#: A command that writes the preemption scenario into the run directory as the engine
#: core would (in two parts), then waits for a file before it exits.
FAKE_ENGINE = """
import os, pathlib, sys, time
run = pathlib.Path(os.environ["VLLMPROBE_RUN_DIR"])
lines = pathlib.Path(sys.argv[1]).read_text().splitlines(keepends=True)
with open(run / "events-4242.jsonl", "w") as f:
    f.write("".join(lines[:10])); f.flush()
    time.sleep(0.3)
    f.write("".join(lines[10:]))
go = pathlib.Path(sys.argv[2])
deadline = time.time() + 60
while not go.exists() and time.time() < deadline:
    time.sleep(0.05)
sys.exit(0 if go.exists() else 5)
"""


def free_port() -> int:
    from tests.conftest import _free_port

    return _free_port()


@pytest.mark.parametrize("live", [[], ["--live"]], ids=["foreground", "live"])
def test_run_metrics_port_serves_while_the_command_runs_and_stops_at_its_exit(live, tmp_path):
    events = tmp_path / "stream.jsonl"
    events.write_text("".join(scenario_preempt().lines()))
    go, out, port = tmp_path / "go", tmp_path / "run", free_port()
    proc = subprocess.Popen(vllm_probe_cmd("run", *live, "--out", str(out), "--metrics-port", str(port), "--",
                                           sys.executable, "-c", FAKE_ENGINE, str(events), str(go)),
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/metrics"
    try:  # the server is up before the command starts; wait for the whole stream
        m = wait_for(url, lambda m: m("vllm_probe_steps_total", engine="0") == 9, timeout=30, proc=proc)
        assert m("vllm_probe_preemptions_total", engine="0", reason="kv_cache") == 2
        assert m("vllm_probe_prefill_chunks_total", engine="0") == 7
        go.touch()
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    assert f"vllm-probe: metrics -> {url}" in stderr and "Traceback" not in stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["exit_code"] == 0 and meta["end_time"] >= meta["start_time"]  # the run directory is complete
    with pytest.raises(urllib.error.URLError):  # the command's exit stopped the server
        urllib.request.urlopen(url, timeout=2)


def test_sidecar_serves_a_finished_runs_totals_until_sigterm(tmp_path):
    run = tmp_path / "run"
    scenario_preempt().write(run)
    (run / "meta.json").write_text(json.dumps({"command": ["python", "-m", "vllm.entrypoints.openai.api_server",
                                                           "--model", "/m/tiny"], "start_time": 1.0,
                                               "end_time": 2.0, "exit_code": 0}))
    port = free_port()
    proc = subprocess.Popen(vllm_probe_cmd("metrics", str(run), "--port", str(port)), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        e = {"engine": "0", "model_name": "tiny"}  # the folder of --model /m/tiny, not its path
        m = wait_for(url, lambda m: ("vllm_probe_steps_total", frozenset(e.items())) in m.samples, timeout=30,
                     proc=proc)
        assert m("vllm_probe_steps_total", **e) == 9
        assert m("vllm_probe_discarded_tokens_total", reason="kv_cache", **e) == 161
        assert m("vllm_probe_events_written_total", **e) == len(scenario_preempt().events) - 1
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    assert stderr.splitlines() == [f"vllm-probe: metrics of {run} -> {url} (Ctrl-C stops)"]
