"""The engine core's memory under segments and gzip (issue 19, the soak's RSS target).

vLLM 0.32's real scheduler, driven in-process without a model (:mod:`vllm_probe.sim.harness`),
under the probe with a segmented, gzipped sink: 1 MiB segments, keep 2 MiB. glibc's
``malloc_info`` gives each arena's system bytes; the threads the probe starts (writer,
segment keeper) get arenas of their own, and those must not grow with the steps. With
``compress_segment`` reading each segment through ``shutil.copyfileobj`` into
``gzip.GzipFile`` (1 MiB reads), the keeper's arena grew ~10 MiB per 20,000 steps here,
all of it free memory (the soak's engine core: +16.9 % RSS in an hour); with one reused
64 KiB buffer it stays within a fraction of a MiB.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import random
import re
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import requires_vllm

pytestmark = [requires_vllm, pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_info")]


def _arena_bytes() -> dict[int, int]:
    """glibc arena number -> its system bytes (``malloc_info``'s ``<system type="current">``)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    if not hasattr(libc, "malloc_info"):
        pytest.skip("not glibc")
    libc.fopen.restype = ctypes.c_void_p
    with tempfile.NamedTemporaryFile(suffix=".xml") as tmp:
        f = libc.fopen(tmp.name.encode(), b"w")
        libc.malloc_info(0, ctypes.c_void_p(f))
        libc.fclose(ctypes.c_void_p(f))
        xml = Path(tmp.name).read_text()
    return {int(m.group(1)): int(re.search(r'<system type="current" size="(\d+)"', m.group(2)).group(1))
            for m in re.finditer(r'<heap nr="(\d+)">(.*?)</heap>', xml, re.S)}


class _Probed:
    """vLLM's scheduler under the probe with a file sink; ``step()`` keeps 8 requests waiting
    (mixed prompts, a third behind one of three shared prefixes) and runs one step."""

    def __init__(self, tmp_path: Path, **sink_kwargs) -> None:
        from vllm.v1.core.sched.scheduler import Scheduler

        from vllm_probe.engine import hooks, patches
        from vllm_probe.engine.sink import EventSink
        from vllm_probe.settings import ProbeFlags
        from vllm_probe.sim import harness

        self.harness, self.patches, self.cls = harness, patches, Scheduler
        flags = ProbeFlags()
        self.sinks: list[EventSink] = []

        def make_sink(rt):
            self.sinks.append(EventSink(tmp_path / f"events-{os.getpid()}.jsonl", capacity=flags.queue_capacity,
                                        stats_extra=rt.health.snapshot, **sink_kwargs))
            return self.sinks[-1]

        assert patches.install(Scheduler, hooks.Runtime(flags, make_sink), "0.32.0")
        self.sched = harness.make_scheduler(harness.SchedulerSpec(
            max_num_batched_tokens=512, max_num_seqs=16, num_blocks=200, block_size=16,
            max_model_len=4096, enable_prefix_caching=True))
        self.rnd = random.Random(0)
        self.prefixes = [[5 + (i * 13 + j) % 400 for j in range(256)] for i in range(3)]
        self.added = 0

    @property
    def sink(self):
        return self.sinks[0]

    def step(self, n: int = 1) -> None:
        h, sched, rnd = self.harness, self.sched, self.rnd
        for _ in range(n):
            while len(sched.waiting) < 8:
                prompt = rnd.randint(64, 1200)
                sched.add_request(h.make_request(
                    prompt, rnd.randint(16, 120), req_id=f"cmpl-{self.added:08d}", block_size=16,
                    prefix=self.prefixes[self.added % 3] if prompt > 300 else None))
                self.added += 1
            h.step(sched)

    def close(self) -> None:
        self.patches.uninstall(self.cls)
        for s in self.sinks:
            s.close()


def _thread_arenas_growth(before: dict[int, int], after: dict[int, int]) -> int:
    """Bytes the arenas other than the main thread's (0: vLLM's own) grew by."""
    return sum(after[n] - before.get(n, 0) for n in after if n != 0)


def test_the_probes_threads_arenas_stay_flat_across_gzipped_segments(tmp_path):
    p = _Probed(tmp_path, max_segment_bytes=1 << 20, compress_segments=True, keep_bytes=2 << 20)
    try:
        seen = []
        for steps in (20_000, 40_000):
            p.step(steps)
            p.sink.flush()
            assert p.sink.keeper.wait_idle(30)
            seen.append(_arena_bytes())
        sink = p.sink
        assert sink.segment > 20 and sink.keeper.compressed >= sink.segment - 2 and sink.dropped == 0
        assert _thread_arenas_growth(*seen) < 2 << 20, seen
    finally:
        p.close()


def test_a_writer_that_fell_behind_leaves_no_memory_behind(tmp_path):
    """The writer held back (as when starved of the GIL or a core) while 1,500 to 7,500
    steps queue up, then draining them: rendering each backlog at once grew the writer's
    arena with the largest backlog (3 to 12 MiB here); in WRITE_BATCH slices it stays flat."""
    p = _Probed(tmp_path)
    try:
        p.step(3_000)
        p.sink.flush()
        seen = [_arena_bytes()]
        for backlog in (1_500, 3_000, 4_500, 6_000, 7_500):
            with p.sink._drain_lock:  # the writer cannot write meanwhile
                p.step(backlog)
            p.sink.flush()
            p.step(500)
        p.sink.flush()
        seen.append(_arena_bytes())
        assert p.sink.dropped == 0 and p.sink.written > 20_000
        assert _thread_arenas_growth(*seen) < 2 << 20, seen
    finally:
        p.close()
