"""The storm's and thrash's ``max_num_seqs`` candidates start below the most requests that
really ran at once, not below the configured value (a run of 3 under max_num_seqs 64 is not
helped by 48, 32 or 16; the thrash scenario's storm got no remedy that way)."""

from __future__ import annotations

from vllm_probe.analysis.doctor.findings import EngineBasis, Finding
from vllm_probe.analysis.doctor.knobs import seqs_down_candidates
from vllm_probe.analysis.engine_state import EngineState
from vllm_probe.analysis.episodes import Episodes


def _finding(queue_steps: dict[tuple[int, int], int]) -> Finding:
    eng = EngineState(0)
    eng.queue_steps.update(queue_steps)
    return Finding("preemption-storm", "warning", "", None, basis=EngineBasis(eng=eng, ep=Episodes().of(eng)))


def test_candidates_start_below_the_running_peak_not_the_configured_value():
    f = _finding({(3, 5): 10, (2, 0): 4})  # at most 3 ran at once
    assert seqs_down_candidates({"max_num_seqs": 64}, f) == [2, 1]


def test_candidates_stay_below_the_configured_value():
    f = _finding({(3, 5): 10})
    assert seqs_down_candidates({"max_num_seqs": 2}, f) == [1]


def test_a_large_running_queue_scales_down_from_its_peak():
    f = _finding({(105, 5): 1, (40, 0): 9})
    assert seqs_down_candidates({"max_num_seqs": 256}, f) == [79, 52, 26, 13, 2, 1]


def test_without_steps_or_settings_there_is_nothing_to_try():
    assert seqs_down_candidates({}, _finding({})) == []
