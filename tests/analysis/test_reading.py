"""Every command reads a recording once (analysis/reading.py): the event files each command
opens, counted where the reader opens them (``runs.reader.open_segment``), and what the one
pass gives against what each reader computed on its own read."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from tests.analysis.test_doctor_rules import _storm
from tests.conftest import requires_vllm
from vllm_probe.analysis import reading
from vllm_probe.runs import reader


@pytest.fixture
def opens(monkeypatch):
    """Opens of event files, by file version ``(path, inode, size, mtime_ns)``: a replay
    written again into the same run directory is a new version, read once more."""
    counted: Counter[tuple[str, int, int, int]] = Counter()
    real = reader.open_segment

    def open_segment(path):
        st = os.stat(path)
        counted[(str(path), st.st_ino, st.st_size, st.st_mtime_ns)] += 1
        return real(path)

    monkeypatch.setattr(reader, "open_segment", open_segment)
    reading.clear()
    yield counted
    reading.clear()


def _by_path(counted: Counter, under: Path) -> dict[str, int]:
    """Opens of the files directly in ``under``, by file name."""
    out: Counter[str] = Counter()
    for (path, *_), n in counted.items():
        if Path(path).parent == under:
            out[Path(path).name] += n
    return dict(out)


@pytest.fixture
def storm(tmp_path) -> Path:
    run = tmp_path / "storm"
    r = _storm(200, (1, 1))
    r.finish("P", 1000, 8)
    r.s.write(run)
    return run


def test_every_reader_of_a_run_shares_one_pass(storm, opens):
    from vllm_probe.analysis.doctor import examine
    from vllm_probe.analysis.objectives import measure, request_rows
    from vllm_probe.analysis.ranks import story
    from vllm_probe.analysis.summary import analyze_story
    from vllm_probe.analysis.workload import load_workload

    reading.read(storm, *reading.PARTS)  # a command asks its first read for every part it will need
    report = examine(storm)
    state, summary = analyze_story(storm)
    summary_state, summary_again = story(storm)
    w = load_workload(storm)
    rows = request_rows(storm)
    figures = measure(storm, ["ttft_p99", "preemptions"])
    assert _by_path(opens, storm) == {p.name: 1 for p in storm.glob("events-*.jsonl")} and len(opens) == 1
    assert report.state is state is summary_state and report.stats.events == summary.read["events"] > 0
    assert summary.to_dict() == summary_again.to_dict() and summary.moments
    assert figures["preemptions"] == 2 and w.requests and len(rows) == 1


def test_the_one_pass_gives_what_each_reader_read_on_its_own(storm):
    """The figures of the shared pass are those each reader computed on its own read."""
    import itertools

    from vllm_probe.analysis.objectives import request_rows
    from vllm_probe.analysis.state import RunState
    from vllm_probe.analysis.summary import analyze_story, summarize
    from vllm_probe.analysis.workload import load_workload, workload_of
    from vllm_probe.runs.reader import ReadStats, iter_file
    from vllm_probe.runs.rundir import event_files

    reading.clear()
    alone = RunState(step_window=0, on_request_finished=(rows := []).append)
    alone.apply_all(itertools.chain.from_iterable(iter_file(p, ReadStats()) for p in event_files(storm)))
    own_workload = workload_of(iter_file(event_files(storm)[0], ReadStats()), str(storm))
    own_summary = summarize(storm).to_dict()
    assert load_workload(storm) == own_workload
    assert [r.req_id for r in request_rows(storm)] == [r.req_id for r in rows]
    shared = analyze_story(storm)[1].to_dict()
    assert shared.pop("moments") and {**own_summary, "moments": None} == {**shared, "moments": None}


def test_a_changed_file_is_read_again(storm, opens):
    first = reading.read(storm)
    assert reading.read(storm) is first
    (path,) = storm.glob("events-*.jsonl")
    with open(path, "ab") as f:  # the run goes on: one more line
        f.write(b'{"event": "probe_stats", "ts": 400.0, "pid": 1, "engine": 0, "schema": 1}\n')
    assert reading.cached(storm) is None
    again = reading.read(storm)
    assert again is not first and again.stats.events == first.stats.events + 1
    assert sorted(opens.values()) == [1, 1]  # each version of the file once


def test_a_part_not_asked_for_reads_the_run_again_with_every_part(storm, opens):
    assert reading.read(storm, "summary").rows is None
    with_rows = reading.read(storm, "rows", "workload")
    assert with_rows.rows is not None and with_rows.workload is not None and with_rows.finished is not None
    assert reading.read(storm) is with_rows and reading.read(storm, "summary", "rows") is with_rows
    assert sum(opens.values()) == 2
    with pytest.raises(ValueError, match="unknown reading parts"):
        reading.read(storm, "prompts")


def test_the_recording_outlives_its_replays_readings(tmp_path, opens):
    """The LRU keeps the recording a command replays (it asked for its workload) while more
    replay directories than it holds are read."""
    recording = tmp_path / "recording"
    _storm(200, (1, 1)).s.write(recording)
    rec = reading.read(recording, "summary", "workload")
    replays = []
    for i in range(reading.CAPACITY + 2):
        replays.append(tmp_path / f"replay{i}")
        _storm(100 + i, (1,)).s.write(replays[-1])
        reading.read(replays[-1], "summary", "rows")
    assert reading.cached(recording) is rec
    assert reading.cached(replays[0]) is None and reading.cached(replays[-1]) is not None
    assert sum(r is not None for r in map(reading.cached, [recording, *replays])) == reading.CAPACITY


def test_each_caller_gets_its_own_workload_and_summary(storm, opens):
    from vllm_probe.analysis.summary import analyze_story
    from vllm_probe.analysis.workload import load_workload

    reading.read(storm, "summary", "workload")
    w = load_workload(storm)
    w.requests[0].client = 3  # what the arrivals' detection does to the workload it is given
    w.steps.clear()
    assert load_workload(storm).requests[0].client is None and load_workload(storm).steps
    s = analyze_story(storm)[1]
    s.moments = []
    assert analyze_story(storm)[1].moments
    assert sum(opens.values()) == 1


# -- every command, its event files opened -------------------------------------------------


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Two small runs of vLLM's real scheduler that preempt (the doctor has remedies to replay)."""
    from tests._simrun import record

    spec = dict(max_num_batched_tokens=256, max_num_seqs=8, num_blocks=24, block_size=16, max_model_len=256)
    base = tmp_path_factory.mktemp("one-read")
    return (record(base / "a", spec, [(f"R{i}", 64, 60) for i in range(8)], max_steps=3000),
            record(base / "b", {**spec, "num_blocks": 40}, [(f"R{i}", 64, 60) for i in range(8)], max_steps=3000))


def _command(opens: Counter, *argv: str) -> int:
    from vllm_probe import cli

    reading.clear()  # one command, one process
    opens.clear()
    return cli.main(list(argv))


@requires_vllm
@pytest.mark.parametrize("argv", [("summary", "--json"), ("doctor", "--json", "--no-replay"),
                                  ("export", "-o", "{tmp}/events.jsonl")])
def test_a_command_opens_each_event_file_once(recorded, opens, argv, tmp_path, capsys):
    run, _ = recorded
    _command(opens, argv[0], str(run), *(a.format(tmp=tmp_path) for a in argv[1:]))
    assert opens and _by_path(opens, run) == {p.name: 1 for p in run.glob("events-*.jsonl")}
    assert len(opens) == 1


@requires_vllm
def test_compare_opens_each_run_once(recorded, opens, capsys):
    a, b = recorded
    assert _command(opens, "compare", str(a), str(b), "--json") == 0
    assert set(opens.values()) == {1} and len(opens) == 2


@requires_vllm
@pytest.mark.parametrize("argv", [("doctor", "--json", "--budget", "10"),
                                  ("whatif", "--json", "--set", "max_num_seqs=4", "--out", "{tmp}/whatif")])
def test_a_replaying_command_opens_the_recording_once_and_each_replay_once(recorded, opens, argv, tmp_path, capsys):
    """The recording once; each replay's run directory once as written (a replay written
    again into the same directory, the baseline replayed for a subset, is read again)."""
    run, _ = recorded
    assert _command(opens, argv[0], str(run), *(a.format(tmp=tmp_path) for a in argv[1:])) in (0, 3)
    assert _by_path(opens, run) == {p.name: 1 for p in run.glob("events-*.jsonl")}
    replays = {k for k in opens if Path(k[0]).parent != run}
    assert len(replays) >= 2  # the baseline and a setting at least
    assert {opens[k] for k in replays} == {1}
