"""The compatibility matrix as data: docs/compatibility.md agrees with
``vllm_probe.engine.compat`` (its supported range, its differences table), and ``python -m
tests.compat --docs`` merges the releases it ran into the matrix, keeping the others; the
readers of the 0.34 differences, on stand-in schedulers."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

from tests import compat as suite
from vllm_probe.engine import compat


def test_the_docs_say_what_compat_py_says():
    """The supported range is the matrix's passing rows up to NEWEST_TESTED (a bump without
    a matrix run, or a run without the bump, fails here); the differences table is
    DIFFERENCES'."""
    text = suite.DOCS.read_text()
    rows, _ = suite.parse_matrix(text)
    passed = sorted((suite.vkey(r)[:2] for r, cells in rows.items() if cells[1] == "pass"))
    assert passed[-1] == compat.NEWEST_TESTED and passed[0] == compat.MIN_SUPPORTED
    assert passed == [(0, m) for m in range(compat.MIN_SUPPORTED[1], compat.NEWEST_TESTED[1] + 1)]
    assert "<!-- supported:start -->\n" + suite.supported_markdown(list(rows.values())) in text
    assert "<!-- differences:start -->\n" + suite.differences_markdown() + "<!-- differences:end -->" in text


def test_a_run_replaces_its_releases_rows_and_keeps_the_others():
    old = ("| release | result | patched targets | tests | last run (UTC) | notes |\n|---|---|---|---|---|---|\n"
           "| 0.32.0 | pass | 6/6 | 39 passed, 0 failed, 1 skipped | 2026-12-01 06:24 | probe: x; harness: y |\n"
           "| 0.33.0 | pass | 6/6 | 40 passed, 0 failed | 2026-12-01 06:24 | - |\n")
    previous, _ = suite.parse_matrix(f"<!-- matrix:start -->\nRun on ...\n\n{old}<!-- matrix:end -->")
    assert previous["0.32.0"] == ("0.32.0", "pass", "6/6", "39 passed, 0 failed, 1 skipped", "2026-12-01 06:24",
                                  "probe: x; harness: y")
    ran = [suite.Result("0.34.0", "pass", refused=False, patched=["a"] * 6, passed=40,
                        notes=["compat: new queue", "harness: Scheduler(block_size)"]),
           suite.Result("0.33.0", "fail", refused=False, patched=["a"] * 6, passed=39, failed=1, failures=["t"])]
    table = suite.merged_rows(previous, ran, 6, "2026-12-04 17:00")
    assert [row[0] for row in table] == ["0.32.0", "0.33.0", "0.34.0"]
    assert table[0] == previous["0.32.0"]
    assert table[1] == ("0.33.0", "FAIL", "6/6", "39 passed, 1 failed", "2026-12-04 17:00", "FAILED: t")
    assert table[2] == ("0.34.0", "pass", "6/6", "40 passed, 0 failed", "2026-12-04 17:00",
                        "probe: new queue | harness: Scheduler(block_size)")
    md = suite.markdown(table, "python -m tests.compat --releases 0.33.0,0.34.0", "2026-12-04 17:00")
    again, _ = suite.parse_matrix(f"<!-- matrix:start -->\n{md}<!-- matrix:end -->")
    assert again["0.34.0"][5] == "probe: new queue; harness: Scheduler(block_size)"  # as the table reads it
    assert list(again) == ["0.32.0", "0.33.0", "0.34.0"] and again["0.32.0"] == previous["0.32.0"]


def test_the_parked_async_kv_loads_count_as_waiting():
    """0.34's get_request_counts adds async_kv_waiting; the probe's reader too."""
    s = SimpleNamespace(running=[1, 2], waiting=[1], kv_holding_waiting=[1, 2], async_kv_waiting=[1, 2, 3])
    assert compat.queue_lengths_reader(s)(s) == (2, 6)
    del s.async_kv_waiting
    assert compat.queue_lengths_reader(s)(s) == (2, 3)


class _Queue(deque):
    def peek_request(self):
        return self[0]


def test_the_head_with_parked_async_kv_loads():
    """0.34 ``_next_waiting_queue``: after kv_holding_waiting, the earlier arrival of the
    waiting and async_kv_waiting heads (FCFS), the smaller one under the priority policy."""
    from vllm_probe.engine.admission import _head_async_kv

    class Req(SimpleNamespace):
        def __lt__(self, other):
            return (self.priority, self.arrival_time) < (other.priority, other.arrival_time)

    early, late = Req(arrival_time=1.0, priority=5), Req(arrival_time=2.0, priority=0)
    s = SimpleNamespace(kv_holding_waiting=_Queue(), waiting=_Queue([late]), async_kv_waiting=_Queue([early]),
                        policy=SimpleNamespace(name="FCFS"))
    assert _head_async_kv(s) is early
    s.policy.name = "PRIORITY"
    assert _head_async_kv(s) is late
    holder = Req(arrival_time=3.0, priority=9)
    s.kv_holding_waiting.append(holder)
    assert _head_async_kv(s) is holder
    s.kv_holding_waiting.clear()
    s.waiting.clear()
    assert _head_async_kv(s) is early
    s.async_kv_waiting.clear()
    assert _head_async_kv(s) is None
