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


def test_the_probes_threads_arenas_stay_flat_across_gzipped_segments(tmp_path):
    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_probe.engine import hooks, patches
    from vllm_probe.engine.sink import EventSink
    from vllm_probe.settings import ProbeFlags
    from vllm_probe.sim import harness

    flags = ProbeFlags()
    sinks = []

    def make_sink(rt):
        sinks.append(EventSink(tmp_path / f"events-{os.getpid()}.jsonl", capacity=flags.queue_capacity,
                               stats_extra=rt.health.snapshot, max_segment_bytes=1 << 20,
                               compress_segments=True, keep_bytes=2 << 20))
        return sinks[-1]

    rt = hooks.Runtime(flags, make_sink)
    assert patches.install(Scheduler, rt, "0.32.0")
    try:
        sched = harness.make_scheduler(harness.SchedulerSpec(
            max_num_batched_tokens=512, max_num_seqs=16, num_blocks=200, block_size=16,
            max_model_len=4096, enable_prefix_caching=True))
        rnd = random.Random(0)
        prefixes = [[5 + (i * 13 + j) % 400 for j in range(256)] for i in range(3)]
        added = steps = 0
        seen: list[dict[int, int]] = []
        while steps < 60_000:
            while len(sched.waiting) < 8:
                prompt = rnd.randint(64, 1200)
                sched.add_request(harness.make_request(
                    prompt, rnd.randint(16, 120), req_id=f"cmpl-{added:08d}", block_size=16,
                    prefix=prefixes[added % 3] if prompt > 300 else None))
                added += 1
            harness.step(sched)
            steps += 1
            if steps in (20_000, 60_000):
                sinks[0].flush()
                assert sinks[0].keeper.wait_idle(30)
                seen.append(_arena_bytes())
        sink = sinks[0]
        assert sink.segment > 20 and sink.keeper.compressed >= sink.segment - 2 and sink.dropped == 0
        before, after = seen
        threads = [n for n in after if n != 0]  # arena 0: the main thread's (vLLM's own)
        growth = sum(after[n] - before.get(n, 0) for n in threads)
        assert growth < 2 << 20, {n: (before.get(n), after[n]) for n in threads}
    finally:
        patches.uninstall(Scheduler)
        for s in sinks:
            s.close()
