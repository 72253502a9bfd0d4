"""``bench_whatif.py --coverage``'s judging and doc tables, without an engine (benchmarks/coverage.py)."""

from __future__ import annotations

import pytest

from benchmarks import coverage
from benchmarks.coverage import Counts, RowResult, compare


def test_the_target_is_every_count_exact_and_steps_within_two_percent():
    rec = Counts(1000, 6, 20_224, 0, (1843, 1783))
    assert compare(rec, rec).exact and compare(rec, rec).meets
    steps = compare(rec, Counts(1019, 6, 20_224, 0, (1843, 1783)))
    assert not steps.exact and steps.meets and steps.differences() == ["steps 1,000 → 1,019"]
    assert not compare(rec, Counts(1021, 6, 20_224, 0, (1843, 1783))).meets
    hits = compare(rec, Counts(1000, 6, 19_968, 0, (1843, 1783)))
    assert not hits.meets and hits.differences() == ["hit tokens 20,224 → 19,968"]
    drafts = compare(rec, Counts(1000, 6, 20_224, 0, (1843, 1780)))
    assert not drafts.meets and drafts.differences() == ["drafts 1,783 of 1,843 → 1,780 of 1,843"]


def test_rows_parse_in_table_order_and_unknown_names_are_refused():
    assert [r.name for r in coverage.parse_rows("dp2,held-slots")] == ["held-slots", "dp2"]
    assert len(coverage.parse_rows(None)) == len(coverage.ROWS)
    with pytest.raises(ValueError, match="unknown nope"):
        coverage.parse_rows("held-slots,nope")


def test_a_changed_kv_size_goes_through_each_recordings_own_flag():
    rows = {r.name: r for r in coverage.ROWS}
    assert rows["spec-ngram"].arguments({"num_kv_blocks": 40}).count("--num-kv-blocks") == 1
    assert "40" in rows["spec-ngram"].arguments({"num_kv_blocks": 40})
    server = rows["dp2"].arguments({"num_kv_blocks": 80})
    assert server[server.index("--num-gpu-blocks-override") + 1] == "80"
    held = rows["held-slots"].arguments({"num_kv_blocks": 64})
    assert held[-2:] == ["--num-kv-blocks", "64"]  # not in its arguments: appended


def test_a_partial_run_replaces_its_rows_and_keeps_the_others(tmp_path):
    def result(name: str, steps: int, when: str) -> RowResult:
        c = Counts(steps, 0, 0, 0)
        return RowResult(name, baseline=[compare(c, c)], changed=[compare(c, c)], load=(1.0, 1.5), when=when)

    doc = tmp_path / "whatif.md"
    doc.write_text(f"# Coverage\n\nprose before\n\n{coverage.DOC_BEGIN}\nold\n{coverage.DOC_END}\n\nprose after\n")
    coverage.write_doc(doc, [result("held-slots", 26, "day 1"), result("spec-ngram", 274, "day 1")])
    coverage.write_doc(doc, [result("spec-ngram", 275, "day 2")])
    text = doc.read_text()
    assert text.startswith("# Coverage\n\nprose before\n\n") and text.endswith(f"{coverage.DOC_END}\n\nprose after\n")
    lines = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| `")}
    assert "| 26 · 0 · 0 · 0 |" in lines["| `held-slots`"] and "day 1" in lines["| `held-slots`"]
    assert "| 275 · 0 · 0 · 0 |" in lines["| `spec-ngram`"] and "day 2" in lines["| `spec-ngram`"]
    assert "scheduler-level only" in lines["| `vllm-0.34`"]
    changed = text.split("| row | changed setting")[1]
    assert "`num_kv_blocks=40`" in changed and "day 2" in changed and "held-slots" not in changed


def test_the_cells_say_a_small_step_error_and_the_arrival_model():
    closed = "closed:8, think 3,003.7 ms"
    one_more = compare(Counts(2149, 6, 8960, 0), Counts(2150, 6, 8960, 0))
    assert coverage.baseline_cells(RowResult("r", baseline=[one_more], arrivals=[closed])) == [
        "2,149 · 6 · 8,960 · 0", "2,150 · 6 · 8,960 · 0", "+0.05 %", "✓ steps 2,149 → 2,150", closed]
    assert coverage.arrivals_text({"kind": "closed", "concurrency": 8, "think_s": 3.0037}) == closed
    assert coverage.arrivals_text({"kind": "open", "concurrency": None}) == "open"
    assert coverage.arrivals_text(None) == "-"
