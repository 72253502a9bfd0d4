"""The figures part 10 brings to the text views, from hand-made streams with values worked
out by hand (tests/_events.py) and from a real prefix-caching run with preemptions:
prefix-cache hits (first passes and re-admissions), queue distributions, preemptions per
step, latency by prompt-length class and by priority, end-to-end latency, and the user's
settings file against the run (seed §5)."""

from __future__ import annotations

import json
import re

import pytest
from rich.console import Console

from tests._events import Stream, scenario_preempt, records
from tests.conftest import QUICK_WORKLOAD, requires_vllm, run_cli
from vllm_probe.analysis.expected import DIFFERS, MATCHES, NOT_RECORDED
from vllm_probe.analysis.state import RunState
from vllm_probe.analysis.summary import summarize, summarize_events
from vllm_probe.analysis.summary_types import default_boundaries
from vllm_probe.runs.rundir import write_meta
from vllm_probe.schema.records import from_dict
from vllm_probe.tui.plain import PlainFormatter
from vllm_probe.tui.summary_view import render

approx = pytest.approx

#: QUICK_WORKLOAD with prefix caching and a 256-token prefix shared by every prompt: the
#: KV cache still runs out (4 preemptions measured), and the shared blocks, held by the
#: requests still running, are hits again when a preempted request is re-admitted.
PREFIX_WORKLOAD = [*QUICK_WORKLOAD, "--enable-prefix-caching", "--shared-prefix-tokens", "256"]


def flat(renderable, width: int = 140) -> str:
    console = Console(record=True, width=width, color_system=None)
    console.print(renderable)
    return re.sub(r"\s+", " ", console.export_text())


# -- prefix-cache hits ----------------------------------------------------------------------


def prefix_stream() -> Stream:
    """Two requests under prefix caching, budget 512. P (300 tokens) starts with 128 tokens
    hit; Q (300) with 256; Q is preempted at step 2 and re-admitted at step 3 with 256 of
    its 301 tokens hit again (its prefix is still held by P)."""
    s = Stream()
    s.config(0.0, budget=512, max_num_seqs=4, prefix_caching=True)
    s.added(0.01, "P", 300, 4, arrival=0.01)
    s.added(0.01, "Q", 300, 4, arrival=0.01)
    s.chunk(0.09, 0, "P", 0, 128, 300, 300, last=True)
    s.events[-1]["prefix_hit_tokens"] = 128
    s.chunk(0.09, 0, "Q", 0, 256, 300, 300, last=True)
    s.events[-1]["prefix_hit_tokens"] = 256
    s.step(0.1, 0, 512, prefill=216, running=2, waiting=0)
    s.step(0.2, 1, 512, decode=2, running=2, waiting=0)
    s.preempt(0.29, 2, "Q", 301, 300, 1, 1, running=1, waiting=1)
    s.step(0.3, 2, 512, decode=1, running=1, waiting=1, preempted=["Q"])
    s.chunk(0.39, 3, "Q", 0, 256, 301, 300, prefill_len=301, last=True, resumed=True)
    s.events[-1]["prefix_hit_tokens"] = 256
    s.step(0.4, 3, 512, prefill=45, decode=1, running=2, waiting=0)
    return s


def test_prefix_hits_on_first_passes_and_re_admissions():
    pc = summarize_events(records(prefix_stream().events)).prefix_cache
    assert pc.enabled is True
    assert (pc.hit_tokens, pc.prompt_tokens, pc.first_passes, pc.requests_with_hits) == (128 + 256, 600, 2, 2)
    assert pc.hit_share == approx(384 / 600)
    assert (pc.resumed_passes, pc.resumed_hit_tokens, pc.resumed_prefill_tokens) == (1, 256, 301)
    assert pc.resumed_hit_share == approx(256 / 301)


def test_plain_step_lines_say_the_prefix_hits_of_their_step():
    state = RunState()
    fmt = PlainFormatter(state)
    lines = []
    for ev in map(from_dict, prefix_stream().events):
        state.apply(ev)
        if ev.kind == "step":
            lines.append(fmt.format(ev))
    assert [re.search(r"\| hit (\d+) tok \|", line).group(1) for line in lines] == ["384", "0", "0", "256"]
    assert "| kv 50% free 10 blk | hit 384 tok | preempted 0 (total 0)" in lines[0]


# -- queues and preemptions per step -----------------------------------------------------------


def test_queue_distributions_and_preemptions_per_step():
    s = summarize_events(records(scenario_preempt().events))
    # running after steps 0..8: 1 2 2 2 2 1 1 1 0; waiting: 2 1 1 1 0 1 0 0 0
    r, w = s.queues.running, s.queues.waiting
    assert (r.n, r.median, r.p90, r.max) == (9, 1, 2, 2)
    assert (w.median, w.p90, w.max) == (1, approx(1.2), 2)
    p = s.preemptions
    assert (p.max_per_step, p.steps_with_preemptions, p.steps_with_several) == (1, 2, 0)

    cascade = Stream()
    cascade.config(0.0, budget=100, max_num_seqs=8)
    cascade.step(0.1, 0, 100, decode=5, running=5, waiting=0)
    cascade.step(0.2, 1, 100, decode=2, running=2, waiting=3, preempted=["a", "b", "c"])
    cascade.step(0.3, 2, 100, decode=1, running=1, waiting=4, preempted=["d"])
    cascade.step(0.4, 3, 100, decode=0, running=0, waiting=6, preempted=["e", "f"])
    p = summarize_events(records(cascade.events)).preemptions
    assert (p.max_per_step, p.steps_with_preemptions, p.steps_with_several) == (3, 3, 2)


# -- latency: end to end, by prompt length, by priority ------------------------------------------


def test_end_to_end_latency_and_prompt_length_classes():
    # scenario_preempt, all arriving at t: A (150 tokens) queue 0.095, TTFT 0.3 s / 2 steps,
    # finished t+0.45; B (80) 0.195, 0.4 / 3, t+0.85; C (50) 0.395, 0.5 / 4, t+0.65
    s = summarize_events(records(scenario_preempt().events))
    assert (s.latency.e2e_s.median, s.latency.e2e_s.max) == (approx(0.65), approx(0.85))
    lc = s.latency_classes
    assert (lc.by, lc.boundaries, lc.basis) == ("prompt_len", [25, 100], "token budget")  # budget 100
    assert default_boundaries(100) == [25, 100] and default_boundaries(None) == [512, 2048]
    short, medium, long = lc.classes
    assert (short.name, short.low, short.high, short.n) == ("short", 1, 25, 0)
    assert (medium.name, medium.low, medium.high, medium.n) == ("medium", 26, 100, 2)  # B, C
    assert (long.name, long.low, long.high, long.n) == ("long", 101, None, 1)  # A
    assert medium.queue_s.median == approx((0.195 + 0.395) / 2)
    assert medium.ttft_s.median == approx(0.45) and medium.ttft_steps.median == 3.5
    assert medium.e2e_s.median == approx(0.75) and medium.e2e_s.max == approx(0.85)
    assert (long.queue_s.median, long.ttft_s.median, long.ttft_steps.median, long.e2e_s.median) == \
        (approx(0.095), approx(0.3), 2, approx(0.45))
    # given boundaries; a prompt of exactly a boundary's length is in the class below it
    lc = summarize_events(records(scenario_preempt().events), boundaries=[80]).latency_classes
    assert lc.basis == "given" and [c.name for c in lc.classes] == ["1", "2"]
    assert [c.n for c in lc.classes] == [2, 1]  # B (80) and C (50) | A (150)
    assert s.latency_by_priority == []  # one priority: no split


def test_latency_by_priority_where_it_varies():
    s = scenario_preempt()
    for ev in s.events:
        if ev["event"] == "request_added":
            ev["priority"] = {"A": 1, "B": 0, "C": 1}[ev["req_id"]]
    sm = summarize_events(records(s.events))
    assert sm.requests_by_priority == {0: 1, 1: 2}
    p0, p1 = sm.latency_by_priority
    assert (p0.name, p0.n, p0.ttft_s.median) == ("priority 0", 1, approx(0.4))
    assert (p1.name, p1.n, p1.ttft_s.median, p1.e2e_s.median) == ("priority 1", 2, approx(0.4), approx(0.55))
    text = flat(render(sm))
    assert "Latency by priority (the policy is fcfs: priorities do not change the order)" in text
    assert "priority 0 1 195 ms 400 ms" in text


def test_summary_view_shows_the_new_figures():
    text = flat(render(summarize_events(records(scenario_preempt().events))))
    assert "running med·p90·max 1 · 2 · 2" in text and "running max / max_num_seqs 2 / 2 (100%)" in text
    assert "waiting med·p90·max 1 · 1.20 · 2" in text
    assert "per step max · steps with >1 1 · 0 of 2" in text
    assert "end-to-end (arrival to finish) 650 ms 810 ms 850 ms 3" in text
    assert "Latency by prompt length (split at 25 and 100 tokens: budget/4 and the token budget)" in text
    assert "medium 26–100 2 295 ms 450 ms" in text and "long >100 1 95 ms 300 ms" in text
    assert "prefix caching off: every prompt token computed" in text
    text = flat(render(summarize_events(records(prefix_stream().events))))
    assert "hits on first passes 384 of 600 prompt tok (64%)" in text
    assert "hits on 1 re-admissions 256 of 301 tok to recompute (85%)" in text


def test_summary_cli_by_prompt_len(tmp_path):
    scenario_preempt().write(tmp_path / "run")
    r = run_cli("summary", str(tmp_path / "run"), "--json", "--by", "prompt_len:60,120")
    assert r.returncode == 0, r.stderr
    lc = json.loads(r.stdout)["latency_classes"]
    assert lc["boundaries"] == [60, 120] and [c["n"] for c in lc["classes"]] == [1, 1, 1]
    assert [c["name"] for c in lc["classes"]] == ["short", "medium", "long"]
    r = run_cli("summary", str(tmp_path / "run"), "--by", "prompt:5")
    assert r.returncode == 2 and "only prompt_len classes" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("summary", str(tmp_path / "run"), "--by", "prompt_len:a,b")
    assert r.returncode == 2 and "boundaries are token counts" in r.stderr


def test_summary_json_keeps_its_keys_and_adds():
    data = summarize_events(records(scenario_preempt().events)).to_dict()
    for key in ("run_dir", "command", "read", "engines", "config", "steps", "duration_s", "requests_finished",
                "tokens_per_step", "budget_use", "preemptions", "chunking", "latency", "bound_by", "bound_most"):
        assert key in data
    assert set(data["latency"]) == {"queue_s", "ttft_s", "ttft_steps", "decode_s", "itl_s", "e2e_s"}
    assert data["chunking"]["prefix_hit_tokens"] == 0  # kept where it was
    json.dumps(data)  # JSON-ready


# -- the user's settings file against the run (seed §5) -------------------------------------------


def test_expected_settings_against_the_run(tmp_path):
    run = tmp_path / "run"
    scenario_preempt().write(run)  # budget 100, max_num_seqs 2, 3 requests with max_tokens 3, temperature 0
    write_meta(run, {"command": ["python", "x.py"], "expected": {
        "source": "settings.json", "engine": {"max_num_batched_tokens": 8192, "max_num_seqs": 2},
        "model": "facebook/opt-125m", "sampling": {"max_tokens": 3, "temperature": 0.8, "top_p": 0.95}}})
    s = summarize(run)
    checks = [(c["section"], c["setting"], c["expected"], c["effective"], c["status"]) for c in s.expected["checks"]]
    assert checks == [
        ("engine", "max_num_batched_tokens", 8192, 100, DIFFERS),
        ("engine", "max_num_seqs", 2, 2, MATCHES),
        ("model", "model", "facebook/opt-125m", None, NOT_RECORDED),
        ("sampling", "max_tokens", 3, 3, MATCHES),
        ("sampling", "temperature", 0.8, 0.0, DIFFERS),
        ("sampling", "top_p", 0.95, 1.0, DIFFERS),
    ]
    assert s.expected["source"] == "settings.json"
    text = flat(render(s))
    assert "Settings file settings.json vs this run: 3 differ" in text
    assert "max_num_batched_tokens 8,192 100 differs the command line or the script wins over a config file" in text
    assert "sampling.temperature 0.80 0 differs 3 requests" in text
    assert summarize_events(records(scenario_preempt().events)).expected is None  # no settings file: no section


# -- a real prefix-caching run with preemptions --------------------------------------------------


@requires_vllm
@pytest.mark.engine
def test_prefix_hits_of_a_real_run_with_preemptions(probe_run):
    run = probe_run(*PREFIX_WORKLOAD)
    events = [json.loads(line) for p in sorted(run.glob("events-*.jsonl")) for line in p.read_text().splitlines()]
    first = [e for e in events if e["event"] == "chunk" and e["chunk_index"] == 0 and not e["resumed"]]
    again = [e for e in events if e["event"] == "chunk" and e["chunk_index"] == 0 and e["resumed"]]
    preempts = [e for e in events if e["event"] == "preempt"]
    assert len(preempts) >= 1 and len(again) == len(preempts)  # every preempted request came back
    s = summarize(run)
    pc = s.prefix_cache
    assert pc.enabled is True and len(first) == pc.first_passes == 8
    assert pc.hit_tokens == sum(e["prefix_hit_tokens"] for e in first) >= 7 * 256  # all but the first share 256
    assert pc.prompt_tokens == 8 * 600
    assert pc.resumed_passes == len(again)
    assert pc.resumed_hit_tokens == sum(e["prefix_hit_tokens"] for e in again) >= 256 * len(again)
    assert pc.resumed_prefill_tokens == sum(e["prefill_len"] for e in again)
    # the per-step hits of the --plain lines add up to both
    plain = run_cli("tail", "--plain", str(run), timeout=120)
    hits = [int(m.group(1)) for m in re.finditer(r"\| hit (\d+) tok \|", plain.stdout)]
    assert len(hits) == s.steps and sum(hits) == pc.hit_tokens + pc.resumed_hit_tokens
    text = run_cli("summary", str(run), env={**__import__("os").environ, "COLUMNS": "140"}).stdout
    assert f"hits on first passes {pc.hit_tokens:,} of 4,800 prompt tok" in re.sub(r"\s+", " ", text)
