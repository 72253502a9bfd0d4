"""A fleet on one machine, scraped by a real Prometheus server.

Two replicas — two ``vllm-probe run --metrics-port`` processes, each running a
preempting workload of the long-prompt example on the tiny model, one after the other
(two cores), then idling — and Debian's ``prometheus`` started here on a loopback port
(scrape interval 1 s, configuration and storage in a temporary directory). Through
Prometheus' HTTP API (``/api/v1/query``):

* the counters it stored equal, per replica, the counts in that replica's event files
  (steps, preemptions, discarded tokens, prefill chunks) and ``summary``'s figures;
* ``rate()``/``increase()`` and ``histogram_quantile()`` over them give sane values:
  the increase over the run is its total, the peak step rate is near the run's
  average, quantiles fall in the bucket of the exact value from the events;
* every query of the Grafana dashboard runs, and those not waiting for part 8 return data;
* stopping the commands stops their metrics servers (Prometheus marks them down) and
  leaves complete run directories.

Without ``prometheus`` on PATH the module is skipped, unless
``VLLMPROBE_TEST_REQUIRE_PROMETHEUS=1`` (set by .ci/run, which installs it): then it fails.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests._fleet_replica import DONE
from tests.conftest import QUICK_WORKLOAD, ROOT, _free_port, requires_vllm, vllm_probe_cmd
from tests.exporters.test_grafana import DASHBOARD, queries, substitute
from vllm_probe.analysis.figures import LATENCY_S_BOUNDS, STEP_TOKENS_BOUNDS
from vllm_probe.analysis.state import RunState
from vllm_probe.analysis.summary import summarize
from vllm_probe.runs.reader import ReadStats, iter_run

pytestmark = [pytest.mark.engine, pytest.mark.slow, requires_vllm]

PROMETHEUS = shutil.which("prometheus")
REQUIRED = os.environ.get("VLLMPROBE_TEST_REQUIRE_PROMETHEUS") == "1"
#: The quick workload (8 prompts of 600 tokens, 300 output tokens, KV of 20 blocks)
#: without printing token ids; the second replica runs a smaller variant, so that the
#: two replicas' counts differ.
WORKLOAD_A = [a for a in QUICK_WORKLOAD if a != "--print-token-ids"]
WORKLOAD_B = [{"8": "6", "300": "250"}.get(a, a) if i and WORKLOAD_A[i - 1] in ("--num-prompts", "--max-tokens") else a
              for i, a in enumerate(WORKLOAD_A)]
SCRAPE_S = 1
#: Metrics with no series while nothing is wrong: a doctor finding is a series only
#: while it holds.
MAY_BE_EMPTY = ("vllm_probe_finding",)


def _wait(cond, timeout: float, what: str, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


class Prometheus:
    """A Prometheus server of our own on a loopback port."""

    def __init__(self, base: Path, targets: list[str]) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = base / "prometheus.yml"
        config.write_text(json.dumps({  # JSON is YAML
            "global": {"scrape_interval": f"{SCRAPE_S}s", "scrape_timeout": f"{SCRAPE_S}s",
                       "evaluation_interval": f"{SCRAPE_S}s"},
            "scrape_configs": [{"job_name": "vllm-probe", "static_configs": [{"targets": targets}]}],
        }))
        self.log = base / "prometheus.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={base / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        _wait(self._ready, 60, "Prometheus to be ready")

    def _ready(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def query(self, expr: str) -> list[dict]:
        """The result of an instant query (``/api/v1/query``): a list of series."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        assert body["data"]["resultType"] in ("vector", "scalar"), body
        return body["data"]["result"] if body["data"]["resultType"] == "vector" else \
            [{"metric": {}, "value": body["data"]["result"]}]

    def by_instance(self, expr: str) -> dict[str, float]:
        """An instant query whose series differ by ``instance`` only: instance -> value."""
        out = {}
        for series in self.query(expr):
            instance = series["metric"].get("instance")
            assert instance not in out, (expr, series)
            out[instance] = float(series["value"][1])
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Replica:
    """``vllm-probe run --out DIR --metrics-port PORT -- python tests/_fleet_replica.py ARGS``."""

    def __init__(self, base: Path, name: str, port: int, workload: list[str]) -> None:
        self.name, self.port = name, port
        self.instance = f"127.0.0.1:{port}"
        self.run_dir = base / f"run-{name}"
        self.log = base / f"replica-{name}.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                vllm_probe_cmd("run", "--out", str(self.run_dir), "--metrics-port", str(port), "--",
                               sys.executable, str(ROOT / "tests" / "_fleet_replica.py"), *workload),
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def wait_done(self) -> None:
        def done() -> bool:
            assert self.proc.poll() is None, self.log.read_text(errors="replace")[-3000:]
            return DONE in self.log.read_text(errors="replace")
        _wait(done, 600, f"replica {self.name}'s workload", every=1.0)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # vllm-probe passes it on to the command
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def file_counts(run_dir: Path) -> dict:
    """Counts straight from the event files (plain JSON, not the probe's reader)."""
    counts = {"steps": 0, "preemptions": 0, "discarded": 0, "chunks": 0, "tokens_per_step": []}
    for path in sorted(run_dir.glob("events-*.jsonl")):
        for line in path.read_text().splitlines():
            ev = json.loads(line)
            if ev["event"] == "step":
                counts["steps"] += 1
                counts["tokens_per_step"].append(ev["scheduled_tokens"])
            elif ev["event"] == "preempt":
                counts["preemptions"] += 1
                counts["discarded"] += ev["discarded_tokens"]
            elif ev["event"] == "chunk":
                counts["chunks"] += 1
    return counts


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    if PROMETHEUS is None:
        if REQUIRED:
            pytest.fail("prometheus is not installed; .ci/run installs Debian's package")
        pytest.skip("prometheus is not installed (apt-get install prometheus)")
    base = tmp_path_factory.mktemp("fleet")
    ports = [_free_port(), _free_port()]
    prom = Prometheus(base, [f"127.0.0.1:{p}" for p in ports])
    replicas = []
    try:
        for name, port, workload in zip("ab", ports, (WORKLOAD_A, WORKLOAD_B)):
            replicas.append(Replica(base, name, port, workload))
            replicas[-1].wait_done()  # one engine at a time: the next starts when this one idles
        yield SimpleNamespace(prom=prom, replicas=replicas)
    finally:
        for r in replicas:
            r.stop()
        prom.stop()


def stored(fleet, metric: str, **labels) -> dict[str, float]:
    """``sum by (instance) (metric{labels})`` as Prometheus stored it."""
    sel = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return fleet.prom.by_instance(f"sum by (instance) ({metric}{{{sel}}})")


def test_stored_counters_equal_the_event_counts(fleet):
    expected = {r.instance: file_counts(r.run_dir) for r in fleet.replicas}
    assert all(c["preemptions"] > 0 and c["chunks"] > 0 for c in expected.values())  # the workload preempts
    assert len({c["steps"] for c in expected.values()}) == 2  # the replicas differ
    # the replicas idle: wait until the last scrape has the files' final counts
    _wait(lambda: stored(fleet, "vllm_probe_steps_total") == {i: c["steps"] for i, c in expected.items()},
          30, "Prometheus to store the final step counts")
    assert stored(fleet, "vllm_probe_preemptions_total") == {i: c["preemptions"] for i, c in expected.items()}
    assert stored(fleet, "vllm_probe_preemptions_total", reason="kv_cache") == \
        {i: c["preemptions"] for i, c in expected.items()}
    assert stored(fleet, "vllm_probe_discarded_tokens_total") == {i: c["discarded"] for i, c in expected.items()}
    assert stored(fleet, "vllm_probe_prefill_chunks_total") == {i: c["chunks"] for i, c in expected.items()}
    # per engine core: one each, data-parallel rank 0 of its replica
    series = fleet.prom.query("vllm_probe_steps_total")
    assert sorted((s["metric"]["instance"], s["metric"]["engine"], s["metric"]["job"]) for s in series) == \
        sorted((r.instance, "0", "vllm-probe") for r in fleet.replicas)
    # the same figures as `vllm-probe summary`
    for r in fleet.replicas:
        s = summarize(r.run_dir)
        i = r.instance
        assert (s.steps, s.preemptions.count, s.preemptions.discarded_tokens, s.chunking.chunks) == \
            (stored(fleet, "vllm_probe_steps_total")[i], stored(fleet, "vllm_probe_preemptions_total")[i],
             stored(fleet, "vllm_probe_discarded_tokens_total")[i], stored(fleet, "vllm_probe_prefill_chunks_total")[i])
        assert s.requests_finished == stored(fleet, "vllm_probe_requests_finished_total")[i]
        assert s.chunking.reread_kv_tokens == stored(fleet, "vllm_probe_kv_reread_tokens_total")[i]


def _bucket_bounds(bounds: tuple[float, ...], value: float) -> tuple[float, float]:
    """(lower, upper] of the bucket that holds ``value``."""
    edges = (0.0,) + tuple(bounds) + (math.inf,)
    for lo, hi in zip(edges, edges[1:]):
        if value <= hi:
            return lo, hi
    raise AssertionError(value)


def test_rate_and_quantiles_are_sane(fleet):
    prom = fleet.prom
    for r in fleet.replicas:
        i = r.instance
        counts = file_counts(r.run_dir)
        summary = summarize(r.run_dir)
        sel = f'instance="{i}"'
        # the counter's last value is the total, exactly
        last = prom.by_instance(f"max by (instance) (max_over_time(vllm_probe_steps_total{{{sel}}}[1h]))")[i]
        assert last == counts["steps"], (last, counts["steps"])
        # increase() over the whole run is the total, give or take Prometheus's extrapolation
        # to the window's edges (up to about one scrape interval's worth at each end; the
        # series start at 0 before the first step)
        total = prom.by_instance(f"sum by (instance) (increase(vllm_probe_steps_total{{{sel}}}[1h]))")[i]
        assert 0.95 * counts["steps"] <= total <= 1.25 * counts["steps"], (total, counts["steps"])
        # rate(): the highest rate over 30 s windows is the window that holds the whole run
        # (it steps for a few seconds): its steps / 30 s (/ its length when longer)
        peak = prom.by_instance(
            f"max by (instance) (max_over_time(rate(vllm_probe_steps_total{{{sel}}}[30s])[1h:1s]))")[i]
        expected = counts["steps"] / max(30.0, summary.duration_s + 3 * SCRAPE_S)
        assert 0.8 * expected <= peak <= 1.25 * counts["steps"] / 30.0, (peak, expected, summary.duration_s)
        # the median tokens per step falls in the bucket of the exact order statistic
        tokens = sorted(counts["tokens_per_step"])
        median = prom.by_instance(
            f"histogram_quantile(0.5, sum by (instance, le) (vllm_probe_step_tokens_bucket{{{sel}}}))")[i]
        lo, hi = _bucket_bounds(STEP_TOKENS_BOUNDS, tokens[math.ceil(0.5 * len(tokens)) - 1])
        assert lo <= median <= hi, (median, lo, hi)
        # TTFT: p90 in the bucket of the exact p90 order statistic (the state's definition)
        ttfts: list[float] = []
        RunState(on_request_finished=lambda req: ttfts.append(req.ttft_s)).apply_all(  # noqa: B023 - used in this iteration
            iter_run(r.run_dir, ReadStats()))
        ttfts.sort()
        p90 = prom.by_instance(f"histogram_quantile(0.9, sum by (instance, le) "
                               f"(vllm_probe_time_to_first_token_seconds_bucket{{{sel}}}))")[i]
        lo, hi = _bucket_bounds(LATENCY_S_BOUNDS, ttfts[math.ceil(0.9 * len(ttfts)) - 1])
        assert lo <= p90 <= hi, (p90, lo, hi, ttfts)
        assert 0 < p90 <= summary.duration_s + 60
        # budget use is a share
        use = prom.by_instance(f"histogram_quantile(0.9, sum by (instance, le) "
                               f"(vllm_probe_step_budget_use_ratio_bucket{{{sel}}}))")[i]
        assert 0 < use <= 1


def test_every_dashboard_query_runs_and_returns_data(fleet):
    dashboard = json.loads(DASHBOARD.read_text())
    empty = []
    for title, expr in queries(dashboard):
        # over the last hour: the replicas are idle now, so rates over 1m may be 0, not absent
        result = fleet.prom.query(substitute(expr).replace("[1m]", "[1h]"))
        if not result and not any(m in expr for m in MAY_BE_EMPTY):
            empty.append((title, expr))
    assert empty == []


def test_stopping_the_commands_stops_their_servers_and_completes_the_runs(fleet):
    for r in fleet.replicas:
        assert r.stop() == 0, r.log.read_text(errors="replace")[-3000:]
        meta = json.loads((r.run_dir / "meta.json").read_text())
        assert meta["exit_code"] == 0 and meta["end_time"] >= meta["start_time"]
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://{r.instance}/metrics", timeout=2)
    down = {r.instance: 0.0 for r in fleet.replicas}
    _wait(lambda: fleet.prom.by_instance("up") == down, 15, "Prometheus to see the servers gone")
    for r in fleet.replicas:  # the engine cores closed their files (probe_stats) when the command ended
        s = summarize(r.run_dir)
        assert s.probe_dropped_events == 0 and s.read["partial"] == 0 and s.read["malformed"] == 0
