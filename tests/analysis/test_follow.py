"""One live follower per process (issue 20 item 2): ``run --live --metrics-port`` reads
every line once into one state, which the dashboard and the metrics server both read;
the metrics server alone follows the run with a LiveRun of its own."""

from __future__ import annotations

import argparse
import json
import sys

from tests.runs.test_live import FAKE
from tests.exporters.test_metrics import Series, scrape_text
from tests.analysis.test_state import hand_stream
from vllm_probe.analysis.follow import LiveRun
from vllm_probe.analysis.state import RunState
from vllm_probe.cli import run as cli_run
from vllm_probe.exporters.prometheus import MetricsServer
from vllm_probe.runs.reader import Follower


def _count_reads_and_applies(monkeypatch) -> tuple[list, list, set]:
    polled, applied, states = [], [], set()
    poll, apply = Follower.poll, RunState.apply

    def counting_poll(self, *a, **kw):
        out = poll(self, *a, **kw)
        polled.extend(out)
        return out

    def counting_apply(self, ev):
        states.add(id(self))
        applied.append(ev)
        return apply(self, ev)

    monkeypatch.setattr(Follower, "poll", counting_poll)
    monkeypatch.setattr(RunState, "apply", counting_apply)
    return polled, applied, states


def test_run_live_with_metrics_port_reads_every_line_once_into_one_state(tmp_path, monkeypatch, capsys):
    events = hand_stream()  # 18 events: 8 steps, 1 preemption, 2 requests
    script = tmp_path / "fake.py"
    script.write_text(FAKE)
    polled, applied, states = _count_reads_and_applies(monkeypatch)
    servers: list[MetricsServer] = []
    start = cli_run.start_server

    def keep(host, port):
        servers.append(start(host, port))
        return servers[-1]

    monkeypatch.setattr(cli_run, "start_server", keep)
    args = argparse.Namespace(command=["--", sys.executable, str(script), "0", json.dumps(events)], settings=None,
                              out=tmp_path / "run", live=True, metrics_port=0, metrics_host=None)
    assert cli_run.main(args) == 0
    (server,) = servers
    assert len(polled) == len(events) == 18  # each line decoded once ...
    assert len(applied) == 18  # ... and applied once, to one state
    assert states == {id(server.state)}
    assert server.live is not None and server.follower_thread is None  # attached: no thread of its own
    assert server.live.stats.events == 18
    m = Series(scrape_text(server.collector))
    assert m("vllm_probe_steps_total", engine="0") == 8
    assert m("vllm_probe_preemptions_total", engine="0", reason="kv_cache") == 1


def test_a_metrics_server_alone_follows_with_its_own_live_run(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    (run / "events-1.jsonl").write_text("".join(json.dumps(ev) + "\n" for ev in hand_stream()))
    polled, applied, states = _count_reads_and_applies(monkeypatch)
    with MetricsServer("127.0.0.1", 0) as server:
        server.follow(run, background=False)
        assert server.pump() == 18
        assert server.pump() == 0  # nothing new: nothing read again
        m = Series(scrape_text(server.collector))
    assert len(polled) == len(applied) == 18 and states == {id(server.state)}
    assert m("vllm_probe_steps_total", engine="0") == 8


def test_subscribers_see_each_record_after_it_was_applied_and_the_engine_filter(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lines = [json.dumps(ev) + "\n" for ev in hand_stream(0) + hand_stream(1)]
    (run / "events-1.jsonl").write_text("".join(lines[:20]))
    live = LiveRun(run, engine=1)
    seen: list[tuple[str, int]] = []
    live.subscribe(lambda ev: seen.append((type(ev).__name__, live.state.events)))
    assert live.pump() == 2  # 20 lines read: engine 0's 18, then engine 1's first 2
    assert live.stats.events == 20 and live.applied == 2
    assert seen == [("EngineConfigEvent", 1), ("RequestAddedEvent", 2)]
    with open(run / "events-1.jsonl", "a") as f:
        f.write("".join(lines[20:]) + '{"event": "st')  # the writer is mid-line
    assert live.pump() == 16 and live.incomplete == 1 and live.truncated == 0
    live.finished = True
    assert live.truncated == 1
    assert set(live.state.engines) == {1} and live.state.engines[1].steps == 8
