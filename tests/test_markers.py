"""The suite's markers: a test that uses a real-engine fixture of tests/conftest.py is
marked ``engine`` without a marker in its file, so ``-m "not engine"`` leaves it out."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ENGINE_FIXTURES, ROOT

#: tests/e2e/test_tail_e2e.py: four tests take ``quick_run`` (no marker in the file), two
#: make their own stand-in runs.
TAIL = "tests/e2e/test_tail_e2e.py"
TAIL_ENGINE = {"test_plain_lines_match_the_events_of_a_real_run", "test_dashboard_of_a_finished_real_run",
               "test_replay_prints_the_same_lines", "test_plain_into_a_closed_pipe_is_quiet"}
TAIL_OTHERS = {"test_follows_a_growing_run_and_files_that_appear_later", "test_bad_input_never_tracebacks"}


def _collected(*args: str) -> set[str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return {line.split("::", 1)[1] for line in proc.stdout.splitlines() if "::" in line}


def test_engine_fixtures_mark_their_tests():
    assert "quick_run" in ENGINE_FIXTURES
    assert _collected("-m", "engine", TAIL) == TAIL_ENGINE
    assert _collected("-m", "not engine", TAIL) == TAIL_OTHERS
