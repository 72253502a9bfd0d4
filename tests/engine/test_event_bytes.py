"""The bytes the probe writes do not change when its code is reorganised.

``data/harness_events.masked.jsonl`` was written by the probe as of commit 1649c4d
(before the package got its folders), then again when ``engine_config`` gained the
scheduler inputs ``whatif`` needs and ``request_added`` its block digests: the hooks on
vLLM 0.32's real Scheduler, driven without a model through three workloads
(preemptions, chunked prefill, prefix-cache hits), into a real ``EventSink`` file.
Values that differ from run to run or machine to machine (``ts``, ``pid``,
``arrival_ts``, ``schedule_us``, ``device_memory_bytes``, the machine-speed marks
``speed_mark_us``, and the block digests, keyed by a random salt) are masked; everything
else — field order, separators, number formatting, omitted optional fields, the final
``probe_stats`` — must match byte for byte. Optional fields added since
(:data:`ADDED_SINCE`) are cut out of the new lines before the comparison: the rest of
each line must not move; their values are tested where they are made
(``head_blocked_by``: tests/engine/test_head_blocked_by.py; ``speed_mark_us``:
tests/engine/test_speed_mark.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import requires_vllm

GOLDEN = Path(__file__).parents[1] / "data" / "harness_events.masked.jsonl"
_VARIES = re.compile(rb'"(ts|pid|arrival_ts|schedule_us|device_memory_bytes|speed_mark_us)": -?[0-9][0-9.e+-]*')
_DIGEST = re.compile(rb'"[0-9a-f]{16}"')
#: Optional fields written since the golden file (the last field of their kind, so the
#: line is the old one once the field and its leading ", " are cut).
ADDED_SINCE = re.compile(rb', "head_blocked_by": "[a-z_]+"|, "platform": "[a-z]+"|, "max_segment_mb": [0-9.]+, '
                         rb'"rotate_every_s": [0-9.a-z]+, "compress_segments": [a-z]+, "keep_mb": [0-9.a-z]+, '
                         rb'"keep_hours": [0-9.a-z]+|, "speed_mark_us": _|, "output_block_digests": \[[^\]]*\]'
                         # the KV-cache groups and vLLM's concurrency (engine_config, last); the hook on
                         # update_from_output (speculative decoding) in `patched` and in probe_stats' errors
                         rb'|, "kv_cache_group_specs": \[[^\]]*\]|, "kv_max_concurrency": [0-9.e+-]+'
                         rb'|, "Scheduler.update_from_output"|, "spec_decode": 0')


def mask(data: bytes) -> bytes:
    """The line bytes with the run-dependent values replaced by ``_``; each block digest
    by ``"d<n>"``, numbered by first appearance, so which blocks are equal still shows."""
    data = _VARIES.sub(lambda m: b'"' + m.group(1) + b'": _', data)
    seen: dict[bytes, bytes] = {}
    return _DIGEST.sub(lambda m: seen.setdefault(m.group(0), b'"d%d"' % len(seen)), data)


def record_harness_workloads(out: Path) -> Path:
    """The three workloads of the golden file, through the installed probe into ``out``."""
    import vllm
    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_probe import engine as probe

    from vllm_probe.sim import harness as testing
    from vllm_probe.settings import ProbeFlags

    rt = probe.Runtime(ProbeFlags(), probe.file_sink_factory(out))
    probe.install(Scheduler, rt, vllm.__version__)
    try:
        s = testing.make_scheduler(testing.SchedulerSpec(max_num_batched_tokens=64, num_blocks=12))
        for i in range(3):
            s.add_request(testing.make_request(40, 60, req_id=f"p{i}", seed=i))
        testing.run_until_idle(s)
        s = testing.make_scheduler(testing.SchedulerSpec(max_num_batched_tokens=128, num_blocks=64))
        s.add_request(testing.make_request(300, 5, req_id="c0", seed=10))
        s.add_request(testing.make_request(20, 3, req_id="c1", seed=11))
        testing.run_until_idle(s)
        s = testing.make_scheduler(testing.SchedulerSpec(max_num_batched_tokens=256, num_blocks=64,
                                                         enable_prefix_caching=True))
        prefix = [5 + i for i in range(64)]
        s.add_request(testing.make_request(100, 4, req_id="x0", prefix=prefix, seed=20))
        testing.run_until_idle(s)
        s.add_request(testing.make_request(120, 4, req_id="x1", prefix=prefix, seed=21))
        testing.run_until_idle(s)
        rt.sink.close()
    finally:
        probe.uninstall(Scheduler)
    (path,) = out.glob("events-*.jsonl")
    return path


@requires_vllm
def test_hooks_and_sink_write_the_same_bytes_as_before(tmp_path):
    import vllm

    if vllm.__version__ != "0.32.0":
        pytest.skip("the golden file was recorded on vLLM 0.32.0")
    got = ADDED_SINCE.sub(b"", mask(record_harness_workloads(tmp_path).read_bytes())).splitlines()
    want = GOLDEN.read_bytes().splitlines()
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"line {i + 1} differs"


#: Lines of a real engine run (``examples/long_prompts.py`` with the tests' quick workload,
#: vLLM 0.32 CPU, written as of commit 1649c4d): engine_config, 124 steps, 38 chunks,
#: 4 preemptions, 8 requests added and finished.
REAL_RUN = Path(__file__).parents[1] / "data" / "real_run_lines.jsonl"


def test_a_real_runs_events_render_to_the_same_bytes(tmp_path):
    """Each event of a real run, emitted again with its recorded values, is written as
    the same line (the sink stamps its own ``pid``)."""
    import json

    from vllm_probe.schema.events import KINDS
    from vllm_probe.engine.sink import EventSink

    want = REAL_RUN.read_bytes().splitlines()
    sink = EventSink(tmp_path / "events.jsonl")
    for raw in want:
        ev = json.loads(raw)
        kind = KINDS[ev["event"]]
        sink.emit(kind, ev["ts"], ev["engine"], tuple(ev.get(f.name) for f in kind.fields))
    sink.close()
    got = [line for line in (tmp_path / "events.jsonl").read_bytes().splitlines()
           if b'"event": "probe_stats"' not in line]
    pid = re.compile(rb'"pid": [0-9]+')
    assert len(got) == len(want) == 183
    for i, (g, w) in enumerate(zip(got, want)):
        assert pid.sub(b"", g) == pid.sub(b"", w), f"line {i + 1} differs"
