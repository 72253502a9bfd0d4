"""Typed figure paths (issue 20 item 2): compare's figures are addressed by paths checked
against the Summary's types when they are written, not by dotted strings walked later."""

from __future__ import annotations

import pytest

from tests._events import scenario_preempt
from vllm_probe.analysis.catalogue import Figure
from vllm_probe.analysis.compare import FIGURES, figures_for
from vllm_probe.analysis.paths import S, FigurePath
from vllm_probe.analysis.summary import summarize_events


def test_a_typed_path_reads_the_figure_and_writes_its_dotted_form():
    s = summarize_events(scenario_preempt().records)
    assert S.preemptions.count.get(s) == 2
    assert str(S.latency.ttft_s.p90) == "latency.ttft_s.p90"
    assert S.latency_classes.classes[0].n.get(s) == s.latency_classes.classes[0].n
    assert S.latency_classes.classes[99].n.get(s) is None  # past the list: unknown, not an error
    assert S.bound_by["kv_cache"].get(s) == s.bound_by.get("kv_cache")
    assert FigurePath.parse("latency_classes.classes.0.ttft_s.median") == S.latency_classes.classes[0].ttft_s.median


def test_a_misspelt_or_renamed_figure_fails_where_it_is_written():
    with pytest.raises(AttributeError, match="Latency has no figure 'ttft_p90'"):
        S.latency.ttft_p90  # noqa: B018 (the read is what raises)
    with pytest.raises(AttributeError, match="no figure 'preemption'"):
        Figure("preemptions", "preemptions", summary_path="preemption.count", section="preemptions")
    with pytest.raises(TypeError):
        S.preemptions["count"]
    with pytest.raises(AttributeError):
        S.steps.median  # noqa: B018 (an int has no figures)


def test_every_compare_figure_is_a_typed_path_and_reads_the_same_as_its_dotted_form():
    s = summarize_events(scenario_preempt().records)
    figures = figures_for([s])
    assert len(figures) >= len(FIGURES) and all(isinstance(f.path, FigurePath) for f in figures)
    for f in figures:
        assert FigurePath.parse(str(f.path)).get(s) == f.get(s)
    by_path = {str(f.path): f.get(s) for f in FIGURES}
    assert by_path["preemptions.count"] == 2 and by_path["steps"] == 9
