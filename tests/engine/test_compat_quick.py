"""CI's slice of the compatibility matrix: the scheduler-level tests on vLLM 0.12.

Runs ``python -m tests.compat --quick``: the oldest supported release's sources (cached
under ``~/.cache/vllm-probe/compat``, or fetched: a ~470 MB wheel of which ~15 MB of
``.py`` files are kept) with ``tests/engine/test_release.py`` and ``tests/engine/test_scheduler_events.py``
in a subprocess. Skips when the sources can be neither found nor fetched (no network).
The full matrix is ``make compat`` (docs/compatibility.md), not part of ``make test``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT, requires_vllm
from vllm_probe.engine import patches

pytestmark = [requires_vllm, pytest.mark.slow]


def test_quick_compat_on_oldest_supported_release():
    # the probe's own variables are unset by conftest; VLLMPROBE_COMPAT_CACHE is honoured
    proc = subprocess.run([sys.executable, "-m", "tests.compat", "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=1500)
    out = proc.stdout + proc.stderr
    skip = [line for line in proc.stdout.splitlines() if line.startswith("SKIP:")]
    if proc.returncode == 0 and skip:
        pytest.skip(skip[0])
    assert proc.returncode == 0, out[-4000:]
    (row,) = [line for line in proc.stdout.splitlines() if line.startswith("0.12.")]
    total = len(patches.PATCHES)  # every hook the probe installs, patched on the oldest release too
    assert " pass " in row and " 0 failed" in row and f" {total}/{total} " in row, row
