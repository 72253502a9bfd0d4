"""Records only after the reader (issue 20 item 2): the state and the summary take the
records the reader yields (or a hand-made stream builds), never event dicts."""

from __future__ import annotations

import pytest

from tests._events import records, scenario_preempt
from vllm_probe.analysis.state import RunState
from vllm_probe.analysis.summary import summarize_events
from vllm_probe.schema.records import STRUCTS


def test_a_dict_is_refused_not_silently_converted():
    ev = scenario_preempt().events[0]
    with pytest.raises(TypeError, match="takes records"):
        RunState().apply(ev)
    with pytest.raises(TypeError, match="takes records"):
        summarize_events(scenario_preempt().events)


def test_hand_made_streams_are_records_the_reader_would_yield():
    s = scenario_preempt()
    recs = s.records
    assert len(recs) == len(s.events) and all(type(r) is STRUCTS[ev["event"]] for r, ev in zip(recs, s.events))
    assert summarize_events(recs).preemptions.count == 2
    # a field of the wrong type is skipped as the reader skips it; records pass through
    bad = dict(s.events[1], prompt_len="150")
    assert records([bad, recs[0]]) == [recs[0]]
