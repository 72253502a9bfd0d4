"""End to end on a real vLLM engine (tiny model, CPU): the offline LLM class and the
OpenAI-compatible server, started through `vllm-probe run`."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import pytest

from tests._events import as_dict
from tests.conftest import SERVER_MAX_TOKENS, SERVER_REQUESTS, requires_vllm
from vllm_probe.runs.reader import ReadStats, iter_file, iter_run
from vllm_probe.runs.rundir import event_files

pytestmark = [requires_vllm, pytest.mark.engine]

SMALL_WORKLOAD = ["--num-prompts", "2", "--prompt-tokens", "300", "--max-tokens", "8",
                  "--max-num-batched-tokens", "128", "--num-kv-blocks", "20", "--max-model-len", "1024"]


def events_of(run_dir):
    stats = ReadStats()
    evs = [as_dict(e) for e in iter_run(run_dir, stats)]
    assert stats.skipped == 0, stats.describe()
    return evs


def test_offline_run_writes_every_event_kind(quick_run):
    files = event_files(quick_run)
    assert len(files) == 1  # one engine core; the API process and the worker write nothing
    evs = events_of(quick_run)
    kinds = Counter(e["event"] for e in evs)
    assert kinds["engine_config"] == 1
    assert kinds["request_added"] == 8 and kinds["request_finished"] == 8
    assert kinds["preempt"] >= 1 and kinds["chunk"] >= 8 * 3  # 600-token prompts, budget 256
    last = as_dict(list(iter_file(files[0], ReadStats()))[-1])
    assert last["event"] == "probe_stats" and last["events_dropped"] == 0
    # on the stop signal the sink writes probe_stats after the events, then again with the
    # end's speed mark (a SIGKILL may follow): the last one counts every event line
    assert last["events_written"] == len(evs) - kinds["probe_stats"] and last.get("speed_mark_us")
    cfg = next(e for e in evs if e["event"] == "engine_config")
    assert (cfg["max_num_batched_tokens"], cfg["num_kv_blocks"], cfg["block_size"]) == (256, 20, 128)
    assert cfg["kv_capacity_tokens"] == 19 * 128 and cfg["max_model_len"] == 1024
    assert cfg["enable_chunked_prefill"] is True and cfg["prefix_caching"] is False
    assert cfg["vllm_version"].startswith("0.32")
    steps = [e for e in evs if e["event"] == "step"]
    assert [s["step"] for s in steps] == list(range(len(steps)))
    for s in steps:
        assert s["scheduled_tokens"] <= s["token_budget"] == 256
        assert s["scheduled_tokens"] == s["prefill_tokens"] + s["decode_tokens"]
    # every first prefill pass tiles [0, 600) exactly
    first_pass = defaultdict(list)
    for c in (e for e in evs if e["event"] == "chunk" and not e["resumed"]):
        first_pass[c["req_id"]].append((c["start"], c["end"]))
    for spans in first_pass.values():
        assert spans[0][0] == 0 and spans[-1][1] == 600
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), spans
    finished = [e for e in evs if e["event"] == "request_finished"]
    assert {(e["reason"], e["output_tokens"]) for e in finished} == {("length", 300)}


def test_preemptions_agree_with_the_steps_around_them(quick_run):
    evs = events_of(quick_run)
    steps = {e["step"]: e for e in evs if e["event"] == "step"}
    preempts = [e for e in evs if e["event"] == "preempt"]
    chunks = [e for e in evs if e["event"] == "chunk"]
    assert preempts
    assert sum(len(s["preempted"]) for s in steps.values()) == len(preempts)
    for p in preempts:
        assert p["req_id"] in steps[p["step"]]["preempted"]
        assert p["prompt_len"] == 600 and p["reason"] == "kv_cache"
        if p["output_tokens"]:  # a decoding victim: prompt + outputs but the last are computed
            assert p["discarded_tokens"] == 600 + p["output_tokens"] - 1
        else:  # a prefilling victim: up to the end of its latest chunk
            before = [c for c in chunks if c["req_id"] == p["req_id"] and c["step"] < p["step"]]
            assert p["discarded_tokens"] == before[-1]["end"]
        # readmitted later: a resumed pass recomputing prompt + outputs
        resume = next(c for c in chunks if c["req_id"] == p["req_id"] and c["step"] > p["step"]
                      and c["chunk_index"] == 0)
        assert resume["resumed"] is True
        assert resume["prefill_len"] == 600 + p["output_tokens"]
    per_req = Counter(p["req_id"] for p in preempts)
    for f in (e for e in evs if e["event"] == "request_finished"):
        assert f["num_preemptions"] == per_req.get(f["req_id"], 0)


def test_each_flag_off_means_no_such_events(probe_run, tmp_path_factory):
    settings = tmp_path_factory.mktemp("settings") / "settings.json"
    settings.write_text(json.dumps({"scheduler_probe": {
        "log_schedule_each_step": False, "log_preempt_events": False,
        "log_chunk_boundaries": False, "log_request_events": False}}))
    run_dir = probe_run(*SMALL_WORKLOAD, settings=str(settings))
    kinds = Counter(e["event"] for e in events_of(run_dir))
    assert kinds.pop("probe_stats") >= 1 and kinds == Counter({"engine_config": 1})


def test_probe_not_enabled_patches_nothing(unprobed_quick_run):
    cwd, proc = unprobed_quick_run
    assert not (cwd / "vllm-probe-runs").exists()
    assert list(cwd.iterdir()) == []
    assert "vllm-probe:" not in proc.stdout + proc.stderr  # no "patched" line, no warning


@pytest.mark.slow  # starts the OpenAI server (session fixture shared with e2e/test_guarantees_engine.py)
def test_openai_server_under_the_probe(server_run):
    assert server_run.statuses == [200] * SERVER_REQUESTS
    assert [r["usage"]["completion_tokens"] for r in server_run.responses] == [SERVER_MAX_TOKENS] * SERVER_REQUESTS
    files = event_files(server_run.run_dir)
    assert len(files) == 1, files
    evs = events_of(server_run.run_dir)
    kinds = Counter(e["event"] for e in evs)
    assert kinds["engine_config"] == 1 and kinds["step"] > 0
    added = [e for e in evs if e["event"] == "request_added"]
    assert len(added) == SERVER_REQUESTS
    prompt_lens = {r["id"]: r["usage"]["prompt_tokens"] for r in server_run.responses}
    assert sorted(e["prompt_len"] for e in added) == sorted(prompt_lens.values())
    assert all(e["max_tokens"] == SERVER_MAX_TOKENS for e in added)
    finished = [e for e in evs if e["event"] == "request_finished"]
    assert [(e["reason"], e["output_tokens"]) for e in finished] == [("length", SERVER_MAX_TOKENS)] * SERVER_REQUESTS
    assert "vllm-probe: patched Scheduler.schedule" in server_run.log or "Scheduler.schedule" in server_run.log
