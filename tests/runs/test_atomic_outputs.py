"""Outputs written whole (issue 19 item 6): runs.rundir.atomic_dir / atomic_file, and the
commands that use them (whatif, export)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from vllm_probe.runs.rundir import atomic_dir, atomic_file, partial_name, remove_partials


def test_atomic_dir_renames_when_complete_and_replaces_the_previous(tmp_path):
    out = tmp_path / "res"
    with atomic_dir(out) as tmp:
        assert tmp == partial_name(out) and tmp.name == f".res.partial-{os.getpid()}"
        assert not out.exists()  # nothing under the final name while it is written
        (tmp / "a").write_text("1")
    assert sorted(os.listdir(tmp_path)) == ["res"] and (out / "a").read_text() == "1"
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    with atomic_dir(out) as tmp:
        (tmp / "b").write_text("2")
    assert sorted(os.listdir(out)) == ["b"] and sorted(os.listdir(tmp_path)) == ["res"]


@pytest.mark.parametrize("exc", [KeyboardInterrupt, OSError])
def test_an_interrupted_atomic_dir_leaves_the_previous_output(tmp_path, exc):
    out = tmp_path / "res"
    with atomic_dir(out) as tmp:
        (tmp / "a").write_text("1")
    with pytest.raises(exc), atomic_dir(out) as tmp:
        (tmp / "half").write_text("x")
        raise exc()
    assert sorted(os.listdir(tmp_path)) == ["res"] and sorted(os.listdir(out)) == ["a"]


def test_leftovers_of_a_killed_write_are_recognised_and_removed(tmp_path):
    out = tmp_path / "res"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = partial_name(out, int(dead.stdout))
    stale.mkdir()
    (stale / "half").write_text("x")
    alive = partial_name(out, os.getppid())  # a write in progress elsewhere is left alone
    alive.mkdir()
    assert remove_partials(out) == [stale]
    with atomic_dir(out) as tmp:
        (tmp / "a").write_text("1")
    assert sorted(os.listdir(tmp_path)) == sorted(["res", alive.name])


def test_atomic_file_is_private_and_whole(tmp_path):
    path = tmp_path / "out.jsonl"
    with atomic_file(path) as f:
        f.write(b"one\n")
        assert not path.exists()
    assert path.read_bytes() == b"one\n" and stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(KeyboardInterrupt), atomic_file(path) as f:
        f.write(b"two\n")
        raise KeyboardInterrupt
    assert path.read_bytes() == b"one\n" and sorted(os.listdir(tmp_path)) == ["out.jsonl"]


def test_export_writes_its_file_whole_and_0600(tmp_path):
    from vllm_probe.exporters.base import output_stream

    for name in ("e.jsonl", "e.jsonl.gz"):
        path = tmp_path / name
        with output_stream(path) as f:
            f.write(b'{"event": "x"}\n')
            assert not path.exists()
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    import gzip

    assert gzip.decompress((tmp_path / "e.jsonl.gz").read_bytes()) == b'{"event": "x"}\n'
    assert (tmp_path / "e.jsonl").read_bytes() == b'{"event": "x"}\n'
    assert sorted(os.listdir(tmp_path)) == ["e.jsonl", "e.jsonl.gz"]


def test_whatif_replaces_the_half_folder_an_interrupted_whatif_left(tmp_path):
    """Before outputs were written whole, Ctrl-C during the baseline replay left
    ``RUN-whatif/baseline/`` with an event file and no meta.json; every later whatif
    failed ("exists and is not a simulated run"). Such a folder is now recognised and
    replaced, and a folder of the user's is still refused."""
    pytest.importorskip("vllm")
    from vllm_probe.sim.plan import _interrupted

    half = tmp_path / "baseline"
    half.mkdir()
    (half / "events-123.jsonl").write_text('{"event": "step"}\n')
    assert _interrupted(half)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("x")
    assert not _interrupted(mine)
    (mine / "notes.txt").unlink()
    (mine / "events-1.jsonl").write_text("")
    (mine / "meta.json").write_text("{}")  # a recorded run: never replaced
    assert not _interrupted(mine)


def test_summary_shows_the_exit_code_of_a_run_stopped_with_ctrl_c(tmp_path):
    import json

    from vllm_probe.analysis.summary import summarize
    from vllm_probe.tui.summary_view import render
    from rich.console import Console

    run = tmp_path / "run"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"command": ["python", "x.py"], "exit_code": 130,
                                               "start_time": 1.0, "end_time": 2.0}))
    (run / "events-1.jsonl").write_text(json.dumps({
        "event": "step", "ts": 1.5, "pid": 1, "engine": 0, "schema": 1, "step": 0, "scheduled_tokens": 4,
        "token_budget": 8, "new_reqs": 0, "running": 1, "waiting": 0, "kv_usage": 0.1, "free_blocks": 3,
        "schedule_us": 5.0, "preempted": [], "finished": []}) + "\n")
    s = summarize(run)
    assert s.exit_code == 130 and s.to_dict()["exit_code"] == 130
    console = Console(width=120, record=True)
    console.print(render(s))
    assert "exit 130 (stopped with Ctrl-C)" in console.export_text()
