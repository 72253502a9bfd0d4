"""Property-based tests of every reader (issue 19 item 4), with hypothesis.

* the record decoder (``reader._decode_lines``, ``iter_file``) over corrupted bytes: it
  never raises, every complete line is counted exactly once (an event, malformed, or of
  an unknown kind), a cut last line is counted as partial, and the fast path yields the
  same records as the slow one (``parse_line``) line by line;
* the live :class:`~vllm_probe.runs.reader.Follower` over a file written in pieces cut at
  any byte: the same records as reading the finished file, whatever the cuts; a file
  cut mid-line keeps the cut line pending, never decoded;
* the summary, the doctor and whatif's workload extraction over streams of records that
  are valid by the schema but arbitrary in meaning (requests finished before they were
  added, steps out of order, chunks of unknown requests): never a traceback, only the
  documented errors (``NoEventsError``, ``WorkloadError``);
* a valid stream's figures (summary ``to_dict``, doctor's finding ids, the workload) are
  unchanged by where the Follower's reads cut it.

Valid streams: ``tests/data/real_run_lines.jsonl`` (a real vLLM 0.32 run: chunked
prefill, 137 lines naming preemptions) and the hand-made preemption scenario. Each test
bounds its examples (``max_examples``) and has no deadline (the machine is shared); the
database is off (nothing written into the worktree). The whole file runs in ~30 s here.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests._events import scenario_preempt
from vllm_probe.runs.reader import Follower, ReadStats, _decode_lines, iter_file, parse_line
from vllm_probe.schema.events import KINDS

DATA = Path(__file__).resolve().parents[1] / "data"
REAL = (DATA / "real_run_lines.jsonl").read_bytes()
PREEMPT = "".join(scenario_preempt().lines()).encode()
VALID_LINES = [line + b"\n" for line in (REAL + PREEMPT).splitlines()]

FUZZ = settings(deadline=None, database=None, derandomize=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])


# -- corrupted bytes ------------------------------------------------------------------------


@st.composite
def corrupted(draw) -> bytes:
    """Valid lines, then a few corruptions: bytes flipped, ranges deleted or inserted,
    lines duplicated or joined, the end cut."""
    lines = draw(st.lists(st.sampled_from(VALID_LINES), min_size=1, max_size=40))
    data = bytearray(b"".join(lines))
    for _ in range(draw(st.integers(0, 6))):
        op = draw(st.sampled_from(["flip", "delete", "insert", "newline", "cut"]))
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        if op == "flip":
            data[i] = draw(st.integers(0, 255))
        elif op == "delete":
            del data[i:i + draw(st.integers(1, 40))]
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=30))
        elif op == "newline":
            data[i:i] = b"\n"
        else:
            del data[i:]
    return bytes(data)


def expected_counts(data: bytes) -> tuple[int, int]:
    """(complete non-blank lines, 1 if the last line is cut mid-line else 0)."""
    *complete, last = data.split(b"\n")
    return sum(1 for line in complete if line.strip()), int(bool(last.strip()))


@settings(FUZZ, max_examples=100)
@given(corrupted())
def test_decoder_counts_every_line_once_and_agrees_with_the_slow_path(data):
    stats = ReadStats()
    recs = list(_decode_lines(io.BytesIO(data), stats, False))
    complete, partial = expected_counts(data)
    assert stats.events + stats.malformed + stats.unknown_kind == complete
    assert stats.partial == partial and len(recs) == stats.events
    # the fast path (one typed decode) and the slow path (parse_line) agree line by line
    slow_stats = ReadStats()
    slow = [r for line in data.split(b"\n")[:-1] if line.strip()
            for r in [parse_line(line + b"\n", slow_stats)] if r is not None]
    assert recs == slow
    assert (slow_stats.events, slow_stats.malformed, slow_stats.unknown_kind) == (
        stats.events, stats.malformed, stats.unknown_kind)


@settings(FUZZ, max_examples=200)
@given(st.binary(max_size=400))
def test_decoder_on_arbitrary_bytes_never_raises(data):
    stats = ReadStats()
    recs = list(_decode_lines(io.BytesIO(data), stats, False))
    complete, partial = expected_counts(data)
    assert stats.events + stats.malformed + stats.unknown_kind == complete and stats.partial == partial
    assert len(recs) == stats.events


# -- the follower ------------------------------------------------------------------------------


def follow_in_pieces(tmp: Path, data: bytes, cuts: list[int], max_bytes: int | None = None):
    """Write ``data`` into ``tmp/events-1.jsonl`` piece by piece (cut at ``cuts``), polling
    a Follower after each piece; returns (records, stats, follower)."""
    run = tmp
    run.mkdir(parents=True, exist_ok=True)
    path = run / "events-1.jsonl"
    path.write_bytes(b"")
    stats = ReadStats()
    f = Follower(run, stats)
    recs: list = []
    prev = 0
    for cut in [*sorted(set(cuts)), len(data)]:
        with open(path, "ab") as out:
            out.write(data[prev:cut])
        prev = max(prev, cut)
        recs += f.poll(max_bytes)
    for _ in range(len(data) // (max_bytes or len(data) or 1) + 2):  # drain what max_bytes held back
        recs += f.poll(max_bytes)
    return recs, stats, f


@settings(FUZZ, max_examples=60)
@given(st.data())
def test_follower_reads_the_same_records_wherever_the_writes_are_cut(tmp_path_factory, data):
    payload = data.draw(st.sampled_from([REAL, PREEMPT, REAL + PREEMPT]))
    cuts = data.draw(st.lists(st.integers(0, len(payload)), max_size=12))
    max_bytes = data.draw(st.one_of(st.none(), st.integers(64, 4096)))
    recs, stats, f = follow_in_pieces(tmp_path_factory.mktemp("follow"), payload, cuts, max_bytes)
    whole_stats = ReadStats()
    whole = list(_decode_lines(io.BytesIO(payload), whole_stats, False))
    assert recs == whole
    assert (stats.events, stats.skipped) == (whole_stats.events, 0) and f.pending_partial() == 0


@settings(FUZZ, max_examples=60)
@given(st.data())
def test_follower_over_corrupted_and_cut_files_counts_like_the_reader(tmp_path_factory, data):
    payload = data.draw(corrupted())
    cuts = data.draw(st.lists(st.integers(0, len(payload)), max_size=8))
    recs, stats, f = follow_in_pieces(tmp_path_factory.mktemp("follow"), payload, cuts)
    whole_stats = ReadStats()
    whole = list(_decode_lines(io.BytesIO(payload), whole_stats, False))
    assert recs == whole
    assert (stats.events, stats.malformed, stats.unknown_kind) == (
        whole_stats.events, whole_stats.malformed, whole_stats.unknown_kind)
    # a cut last line is pending (the writer may finish it), not decoded nor counted yet
    assert f.pending_partial() == whole_stats.partial and stats.partial == 0


# -- analyses over valid but arbitrary records ----------------------------------------------------

REQ_IDS = st.sampled_from(["a", "b", "c", "d-1"])
SIGNED = {"priority", "temperature", "top_p"}


def _value(kind: str, field) -> st.SearchStrategy:
    name, typ, unit = field.name, field.type, field.unit
    if name == "req_id":
        return REQ_IDS
    if typ == "int":
        if name in SIGNED:
            return st.integers(-5, 5)
        if name in ("step", "chunk_index", "num_preemptions", "segment", "data_parallel_size"):
            return st.integers(0, 12)
        return st.integers(0, 3000)
    if typ == "float":
        if unit == "0..1":
            return st.floats(0, 1)
        if name in SIGNED:
            return st.floats(-2, 2)
        return st.floats(0, 5e4)
    if typ == "bool":
        return st.booleans()
    if typ == "list[string]":
        return st.lists(REQ_IDS, max_size=3)
    if typ == "object":
        return st.dictionaries(st.sampled_from(["chunk", "step", "log_request_events", "x"]),
                               st.one_of(st.integers(0, 3), st.booleans()), max_size=3)
    if typ == "list[kv_group]":
        return st.lists(st.fixed_dictionaries({
            "kind": st.sampled_from(["FullAttentionSpec", "SlidingWindowSpec", "MambaSpec", "??"]),
            "block_size": st.integers(1, 64), "sliding_window": st.one_of(st.none(), st.integers(1, 4096)),
            "layers": st.integers(1, 4), "blocks_per_request": st.one_of(st.none(), st.integers(0, 300))}),
            max_size=3)
    if name == "reason":
        return st.sampled_from(["stop", "length", "abort", "error", "kv_cache", "priority", "??"])
    if name == "head_blocked_by":
        return st.sampled_from(["token_budget", "max_num_seqs", "kv_cache", "deferred", "other", "??"])
    if name == "scheduling_policy":
        return st.sampled_from(["fcfs", "priority", "??"])
    return st.text(max_size=6)


@st.composite
def any_record(draw) -> dict:
    """One event valid by the schema (every required field, optional ones or not), with
    arbitrary values of the right type and range."""
    kind = draw(st.sampled_from(sorted(KINDS)))
    ev: dict = {"event": kind, "ts": draw(st.floats(1000.0, 1100.0)), "pid": 7,
                "engine": draw(st.sampled_from([0, 0, 1])), "schema": 1}
    for f in KINDS[kind].fields:
        if f.optional and draw(st.booleans()):
            continue
        ev[f.name] = draw(_value(kind, f))
    return ev


@st.composite
def any_stream(draw) -> list[dict]:
    """An engine_config first (usually), then arbitrary valid records, mostly in time order."""
    evs = draw(st.lists(any_record(), max_size=40))
    if draw(st.booleans()):
        evs.sort(key=lambda e: e["ts"])
    if draw(st.integers(0, 4)):
        cfg = {"event": "engine_config", "ts": 999.0, "pid": 7, "engine": 0, "schema": 1}
        for f in KINDS["engine_config"].fields:
            if not f.optional:
                cfg[f.name] = draw(_value("engine_config", f))
        cfg["max_num_batched_tokens"] = draw(st.integers(1, 4096))
        cfg["block_size"] = draw(st.integers(1, 256))
        evs.insert(0, cfg)
    return evs


def write_run(run: Path, events: list[dict]) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    (run / "events-7.jsonl").write_bytes(b"".join(msgspec.json.encode(e) + b"\n" for e in events))
    return run


@settings(FUZZ, max_examples=150)
@given(any_stream())
def test_summary_doctor_and_workload_never_raise_on_valid_records(tmp_path_factory, events):
    from vllm_probe.analysis.doctor import examine
    from vllm_probe.analysis.summary import summarize
    from vllm_probe.analysis.workload import WorkloadError, load_workload
    from vllm_probe.runs.rundir import NoEventsError

    run = write_run(tmp_path_factory.mktemp("any"), events)
    stats = ReadStats()
    assert len(list(iter_file(run / "events-7.jsonl", stats))) == len(events)  # all valid by the schema
    assert stats.skipped == 0
    try:
        s = summarize(run)
    except NoEventsError:
        assert not events
    else:
        json.dumps(s.to_dict())  # the --json output encodes
    try:
        report = examine(run)
    except NoEventsError:
        pass
    else:
        assert all(f.id for f in report.findings)
    try:
        w = load_workload(run)
    except WorkloadError as e:
        assert "\n" not in str(e)  # one line for the user
    else:
        # one engine core's file is one rank's: the rank of its first record (runs.ranks.layout)
        rank = events[0]["engine"]
        assert len(w.requests) == len({e["req_id"] for e in events
                                       if e["event"] == "request_added" and e["engine"] == rank})


# -- a valid stream's figures do not depend on where it is cut -------------------------------------


def figures(records: list) -> tuple:
    """Summary (as --json), doctor's finding ids, and the workload's requests of records."""
    from vllm_probe.analysis.doctor import diagnose
    from vllm_probe.analysis.episodes import Episodes
    from vllm_probe.analysis.summary import analyze_events
    from vllm_probe.analysis.workload import workload_of

    _, s = analyze_events(records)
    episodes = Episodes()
    state, _ = analyze_events(records, listener=episodes, with_summary=False)
    ids = sorted(f.id for f in diagnose(state, episodes))
    w = workload_of(records)
    reqs = [(r.req_id, r.prompt_len, r.output_tokens, r.add_before_step) for r in w.requests]
    d = s.to_dict()
    d.pop("run_dir", None)
    return d, ids, reqs, len(w.steps), w.chunks, w.preempts


WHOLE = {name: figures(list(_decode_lines(io.BytesIO(data), ReadStats(), False)))
         for name, data in (("real", REAL), ("preempt", PREEMPT))}


@settings(FUZZ, max_examples=25)
@given(st.data())
def test_figures_do_not_depend_on_where_the_follower_cuts_the_stream(tmp_path_factory, data):
    name = data.draw(st.sampled_from(sorted(WHOLE)))
    payload = REAL if name == "real" else PREEMPT
    cuts = data.draw(st.lists(st.integers(0, len(payload)), max_size=10))
    recs, _, _ = follow_in_pieces(tmp_path_factory.mktemp("cut"), payload, cuts)
    assert figures(recs) == WHOLE[name]


def test_the_valid_streams_hold_what_the_properties_need():
    # the fixed streams exercise chunks, preemptions and finished requests (else the
    # figure equality above would hold on nothing)
    d, _ids, reqs, steps, chunks, preempts = WHOLE["real"]
    assert steps > 0 and chunks and preempts and reqs
    assert d["requests_finished"] > 0
    d, _ids, reqs, steps, chunks, preempts = WHOLE["preempt"]
    assert preempts and d["requests_finished"] == 3


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_record_strategy_builds_valid_records_of_every_kind(kind):
    from hypothesis import find

    ev = find(any_record(), lambda e: e["event"] == kind, settings=settings(database=None, max_examples=2000))
    stats = ReadStats()
    assert parse_line(msgspec.json.encode(ev), stats) is not None, ev
