"""Data-parallel ranks of a run directory (vllm_probe/runs/ranks.py): a stream's rank, two
engine cores that both said rank 0 at the same time (a dense model's ranks recorded by a
probe that read ``data_parallel_rank``) against one engine core restarted, a stream that
holds two ranks, and a rank's own run directory for the replays. Hand-made streams: no vLLM."""

from __future__ import annotations

import json

from tests._events import Stream, scenario_chunked, scenario_preempt
from vllm_probe.runs.ranks import layout, rank_batches, rank_view
from vllm_probe.runs.reader import ReadStats, iter_run


def test_two_engine_cores_that_both_say_rank_0_at_the_same_time_are_a_clash(tmp_path, capsys):
    scenario_chunked(engine=0, pid=11, t=100.0).write(tmp_path)
    scenario_chunked(engine=0, pid=12, t=100.2).write(tmp_path)  # overlaps: 100.0-101.0 and 100.2-101.2
    lay = layout(tmp_path)
    assert (lay.ids, lay.clashes, lay.spans) == ([0], (0,), {"events-11": (100.0, 101.0), "events-12": (100.2, 101.2)})
    from vllm_probe.cli import main

    assert main(["summary", str(tmp_path), "--json"]) == 0
    err = capsys.readouterr().err
    assert "2 engine cores wrote data-parallel rank 0 at the same time" in err
    from vllm_probe.analysis.workload import WorkloadError, load_workload

    try:
        load_workload(tmp_path)
    except WorkloadError as e:
        assert str(e).startswith(f"{tmp_path}: data-parallel rank 0 has 2 engine-core files (2 engine cores wrote")
    else:
        raise AssertionError("a clash must not be replayed as one engine core")


def test_an_engine_core_restarted_is_no_clash(tmp_path):
    scenario_chunked(engine=0, pid=11, t=100.0).write(tmp_path)
    scenario_chunked(engine=0, pid=12, t=200.0).write(tmp_path)
    lay = layout(tmp_path)
    assert (lay.ids, lay.clashes, [s.name for s in lay.ranks[0]]) == ([0], (), ["events-11", "events-12"])
    assert lay.clash_note() is None


def test_a_stream_holding_two_ranks_is_read_rank_by_rank(tmp_path):
    """Two schedulers of one process writing one file: each rank's records, and a rank's
    own run directory holds its lines only (a linked file for a stream of one rank)."""
    a, b = scenario_chunked(engine=0, pid=7, t=100.0), scenario_preempt(t=100.0)
    for ev in b.events:
        ev["engine"], ev["pid"] = 1, 7
    shared = Stream(pid=7)
    shared.events = sorted(a.events + b.events, key=lambda ev: ev["ts"])
    shared.write(tmp_path / "run")
    scenario_chunked(engine=2, pid=8, t=100.0).write(tmp_path / "run")
    lay = layout(tmp_path / "run")
    # a stream's rank is its first record's; the shared one is rank 1's (its engine_config comes first)
    assert {r: [s.name for s in ss] for r, ss in lay.ranks.items()} == {1: ["events-7"], 2: ["events-8"]}
    got = [rec for batch in rank_batches(lay.ranks[1], 1, ReadStats()) for rec in batch]
    assert [(r.kind, r.engine) for r in got] == [(ev["event"], 1) for ev in b.events]
    view = rank_view(tmp_path / "run", 1, tmp_path / "view1", lay)
    assert not (view / "events-7.jsonl").is_symlink()
    assert [json.loads(line)["engine"] for line in (view / "events-7.jsonl").read_text().splitlines()] == [1] * len(
        b.events)
    view2 = rank_view(tmp_path / "run", 2, tmp_path / "view2", lay)
    assert (view2 / "events-8.jsonl").resolve() == (tmp_path / "run" / "events-8.jsonl").resolve()
    assert json.loads((view2 / "meta.json").read_text())["rank_of"] == {"run": str(tmp_path / "run"), "rank": 2}
    assert {r.engine for r in iter_run(view2, ReadStats())} == {2}
