"""Data parallel: a run of two ranks (two real schedulers, each with its own event file, the
ranks' events overlapping in time: tests/sim/_dp.py) read per rank and as a whole by
``summary``, ``doctor`` and ``whatif``; each rank replayed with its own requests, the front
end's balancing kept as recorded.

Rank 0 took 12 long prompts and preempted twice (425 steps); rank 1 took 4 short ones and
never waited (84 steps). The figures below are the recording's, read once by hand from it."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from tests.conftest import requires_vllm
from tests.sim._dp import record_ranks

pytestmark = requires_vllm

RANK0 = {f"r0-{k}" for k in range(12)}
RANK1 = {f"r1-{k}" for k in range(4)}


@pytest.fixture(scope="module")
def dp_run(tmp_path_factory) -> Path:
    return record_ranks(tmp_path_factory.mktemp("dp") / "run")


def cli(*args: str) -> tuple[int, str, str]:
    """``vllm-probe ARGS`` in this process (vLLM is imported already): exit code, stdout, stderr."""
    from vllm_probe.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(args))
    return rc, out.getvalue(), err.getvalue()


def events_of(run_dir: Path) -> list:
    from vllm_probe.runs.reader import ReadStats, iter_run

    return list(iter_run(Path(run_dir), ReadStats()))


def test_each_rank_is_read_from_its_own_file_with_its_own_requests(dp_run):
    from vllm_probe.analysis.workload import WorkloadError, load_workload
    from vllm_probe.runs.ranks import layout

    lay = layout(dp_run)
    assert lay.ids == [0, 1] and lay.clashes == ()
    assert [[s.name for s in lay.ranks[r]] for r in lay.ids] == [["events-100"], ["events-101"]]
    assert {r.req_id for r in load_workload(dp_run, rank=0).requests} == RANK0
    assert {r.req_id for r in load_workload(dp_run, rank=1).requests} == RANK1
    with pytest.raises(WorkloadError, match=r"holds 2 data-parallel ranks \(0, 1\); a replay takes one rank's own "
                                            r"requests \(--rank N\)"):
        load_workload(dp_run)
    with pytest.raises(WorkloadError, match=r"no data-parallel rank 2 in this run \(its ranks: 0, 1\)"):
        load_workload(dp_run, rank=2)


def test_summary_of_the_whole_run_has_a_row_per_rank(dp_run):
    rc, out, _ = cli("summary", str(dp_run), "--json")
    s = json.loads(out)
    assert rc == 0
    assert (s["engines"], s["steps"], s["requests_added"], s["preemptions"]["count"]) == (2, 509, 16, 2)
    rows = [(r["rank"], r["requests_share"], r["summary"]["engines"], r["summary"]["steps"],
             r["summary"]["requests_added"], r["summary"]["requests_finished"], r["summary"]["preemptions"]["count"],
             r["summary"]["queues"]["waiting"]["max"]) for r in s["ranks"]]
    assert rows == [(0, 0.75, 1, 425, 12, 12, 2, 5), (1, 0.25, 1, 84, 4, 4, 0, 0)]
    shares = [r["scheduled_tokens_share"] for r in s["ranks"]]
    assert shares == [r["summary"]["scheduled_tokens"] / s["scheduled_tokens"] for r in s["ranks"]]
    assert sum(shares) == pytest.approx(1.0)
    rc, text, _ = cli("summary", str(dp_run))
    table = text[text.index("Data-parallel ranks"):]
    assert [line.split()[:6] for line in table.splitlines() if line.split()[:1] in (["0"], ["1"])] == [
        ["0", "12", "(12", "done)", "75%", "92%"], ["1", "4", "(4", "done)", "25%", "7.8%"]]


def test_summary_of_one_rank_is_its_own_events_alone(dp_run):
    rc, out, _ = cli("summary", str(dp_run), "--rank", "1", "--json")
    s = json.loads(out)
    assert rc == 0
    assert (s["rank"], s["engines"], s["steps"], s["requests_added"], s["preemptions"]["count"]) == (1, 1, 84, 4, 0)
    assert "ranks" not in s
    rc, _, err = cli("summary", str(dp_run), "--rank", "2")
    assert rc == 2 and err.strip() == "vllm-probe: error: no data-parallel rank 2 in this run (its ranks: 0, 1)"


def test_doctor_names_each_findings_rank_and_one_rank_alone_finds_the_same(dp_run):
    rc, out, err = cli("doctor", str(dp_run), "--json")  # no replay of a run of several ranks: a note says why
    whole = json.loads(out)
    assert (whole["ranks"], whole["rank"]) == ([0, 1], None)
    assert [(f["id"], f["severity"], f["evidence"]["engine"]) for f in whole["findings"]] == [
        ("preemption-storm", "warning", 0), ("kv-bound", "warning", 0), ("chunking-without-benefit", "info", 0),
        ("underloaded", "info", 1)]
    assert "the replay runs one engine core, so doctor --rank N replays rank N's remedies" in err
    storm = whole["findings"][0]["evidence"]
    assert (storm["preemptions"], storm["discarded_tokens"], storm["recomputed_tokens"], storm["usable_kv_blocks"],
            [b["preempted"] for b in storm["busiest_steps"]]) == (2, 448, 450, 29, [["r0-3"], ["r0-4"]])
    for rank, ids in ((0, ["preemption-storm", "kv-bound", "chunking-without-benefit"]), (1, ["underloaded"])):
        rc, out, _ = cli("doctor", str(dp_run), "--json", "--no-replay", "--rank", str(rank))
        alone = json.loads(out)
        assert (alone["rank"], [f["id"] for f in alone["findings"]]) == (rank, ids)
        for f in alone["findings"]:  # the same evidence, the rank said once at the top
            assert "engine" not in f["evidence"]
            same = next(w for w in whole["findings"] if w["id"] == f["id"] and w["evidence"]["engine"] == rank)
            assert {k: v for k, v in same["evidence"].items() if k != "engine"} == f["evidence"]
    rc, text, _ = cli("doctor", str(dp_run), "--no-replay")
    assert rc == 0
    heads = [line.strip() for line in text.splitlines() if line.startswith("data-parallel rank")]
    assert heads == ["data-parallel rank 0 of ranks 0, 1 · 3 findings (vllm-probe doctor --rank 0: replays its "
                     "remedies)", "data-parallel rank 1 of ranks 0, 1 · 1 finding (vllm-probe doctor --rank 1: "
                     "replays its remedies)"]


def test_whatif_replays_every_rank_with_its_own_requests(dp_run, tmp_path):
    rc, out, err = cli("whatif", str(dp_run), "--json", "--no-profile", "--out", str(tmp_path),
                       "--set", "num_kv_blocks=60")
    assert rc == 0, err
    d = json.loads(out)
    assert d["source"] == str(dp_run) and [r["rank"] for r in d["ranks"]] == [0, 1]
    got = {r["rank"]: ((r["recorded"]["steps"], r["recorded"]["preemptions"]["count"]),
                       (r["baseline"]["summary"]["steps"], r["baseline"]["summary"]["preemptions"]["count"]),
                       [(c["overrides"], c["summary"]["steps"], c["summary"]["preemptions"]["count"])
                        for c in r["configs"]]) for r in d["ranks"]}
    assert got == {0: ((425, 2), (425, 2), [({"num_kv_blocks": 60}, 188, 0)]),
                   1: ((84, 0), (84, 0), [({"num_kv_blocks": 60}, 84, 0)])}
    for r, ids in ((0, RANK0), (1, RANK1)):
        res = d["ranks"][r]
        assert res["baseline"]["run_dir"] == str(tmp_path / f"rank{r}" / "baseline")
        assert json.loads((tmp_path / f"rank{r}" / "whatif.json").read_text()) == res
        evs = events_of(res["baseline"]["run_dir"])
        assert {ev.engine for ev in evs} == {r}  # the replay's events carry the rank replayed
        assert {ev.req_id for ev in evs if ev.kind == "request_added"} == ids
        assert res["notes"][0].startswith(f"data parallel: rank {r} of ranks 0, 1, replayed alone with its own "
                                          f"{len(ids)} request(s) as the front end sent them to it")
        assert res["baseline"]["error"]["within"] is True


def test_doctor_of_one_rank_searches_its_remedies_on_its_own_requests(dp_run):
    rc, out, err = cli("doctor", str(dp_run), "--json", "--rank", "0", "--budget", "15", "--no-profile")
    assert rc == 0, err
    d = json.loads(out)
    _, rank0, _ = cli("summary", str(dp_run), "--rank", "0", "--json")
    _, whole, _ = cli("summary", str(dp_run), "--json")
    storm = d["findings"][0]
    assert storm["id"] == "preemption-storm" and storm["remedy"]["checked"] is True
    # the replay's recorded figures are rank 0's, not the run's
    recorded = storm["predicted"]["figures"]["output_tokens_per_s"]["recorded"]
    assert recorded == json.loads(rank0)["output_tokens_per_s"] != json.loads(whole)["output_tokens_per_s"]
    assert d["plan"]["rerun"][1:] == ["vllm-probe doctor --rank 0", f"vllm-probe compare {dp_run} NEW_RUN_DIR"]


def test_tune_searches_one_rank_and_names_the_run(dp_run):
    rc, _, err = cli("tune", str(dp_run), "--slo", "ttft_p90<=0.3", "--knob", "num_kv_blocks=30..40")
    assert rc == 2 and "holds data-parallel ranks 0, 1; tune replays one engine core: --rank N" in err
    rc, out, _ = cli("tune", str(dp_run), "--rank", "1", "--slo", "ttft_p90<=10", "--knob", "num_kv_blocks=30,40",
                     "--budget", "5", "--no-profile", "--json")
    d = json.loads(out)
    assert rc == 0 and (d["source"], d["rank"], d["baseline"]["recorded"]["steps"]) == (str(dp_run), 1, 84.0)
