"""The engine's own speed mark: the periods between consecutive decode-only steps of one
batch (``SpeedMark.decode_steps``), and ``compare``'s ratio of two runs' marks at equal
batch (``decode_ratio``)."""

from __future__ import annotations

import io
import math

from rich.console import Console

from tests._events import Stream
from vllm_probe.analysis.compare import comparison, decode_ratio
from vllm_probe.analysis.summary import summarize_events
from vllm_probe.analysis.summary_types import DecodeSteps


def _decoding(period_s: float, batch2_steps: int = 40, batch3_steps: int = 31, engine: int = 0) -> Stream:
    """One engine core: ``batch2_steps`` decode-only steps of 2 requests ``period_s`` apart,
    a prefill step (it breaks the pairs on both sides), then ``batch3_steps`` decode-only
    steps of 3 requests at 1.5 × the period, then one of 4 requests."""
    s = Stream(engine=engine, pid=100 + engine)
    s.config(0.0, 512, 16)
    ts, step = 1.0, 0
    for _ in range(batch2_steps):
        s.step(ts, step, 512, decode=2, decode_reqs=2, running=2, waiting=0)
        ts, step = ts + period_s, step + 1
    s.step(ts, step, 512, prefill=100, decode=2, prefill_reqs=1, decode_reqs=2, running=3, waiting=0)
    ts, step = ts + period_s, step + 1
    for _ in range(batch3_steps):
        s.step(ts, step, 512, decode=3, decode_reqs=3, running=3, waiting=0)
        ts, step = ts + 1.5 * period_s, step + 1
    s.step(ts, step, 512, decode=4, decode_reqs=4, running=4, waiting=0)
    return s


def test_decode_steps_are_the_median_period_per_batch_with_enough_pairs():
    """40 steps of batch 2 give 39 periods of 3 ms; the prefill step pairs with neither
    neighbour; 31 steps of batch 3 give 30 periods of 4.5 ms (the least counted); the step
    of batch 4 pairs with none. Periods are kept to the nearest 10 µs."""
    mark = summarize_events(_decoding(0.003).records).speed_mark
    assert mark.decode_steps == [DecodeSteps(batch=2, steps=39, median_us=3000.0),
                                 DecodeSteps(batch=3, steps=30, median_us=4500.0)]
    # one period short of the least counted: batch 3 is left out
    mark = summarize_events(_decoding(0.003, batch3_steps=30).records).speed_mark
    assert [d.batch for d in mark.decode_steps] == [2]


def test_engine_cores_pool_their_periods():
    """Two engine cores of 20 batch-2 steps each: 19 + 19 periods, enough together."""
    a, b = _decoding(0.003, 20, 0, engine=0), _decoding(0.005, 20, 0, engine=1)
    mark = summarize_events(a.records + b.records).speed_mark
    (row,) = mark.decode_steps
    assert (row.batch, row.steps) == (2, 38) and row.median_us in (3000.0, 5000.0)


def test_decode_ratio_weighs_each_shared_batch_by_its_fewer_periods():
    """Run B decodes batch 2 at 3.9 ms (×1.3 of A's 3 ms) and batch 3 at 4.5 ms (×1.0);
    weights 39 and 30: exp((39 ln 1.3 + 30 ln 1.0) / 69)."""
    a = summarize_events(_decoding(0.003).records)
    b = _decoding(0.0039)
    for ev in b.events:  # batch 3 back at A's speed: 4.5 ms apart
        if ev["event"] == "step" and ev.get("decode_reqs") == 3:
            ev["ts"] = 1.0 + 41 * 0.0039 + (ev["step"] - 41) * 0.0045
    b_sum = summarize_events(b.records)
    expected = math.exp(39 * math.log(3900.0 / 3000.0) / 69)
    assert math.isclose(decode_ratio(a, b_sum), expected, rel_tol=1e-12)
    assert decode_ratio(a, a) == 1.0
    no_decode = summarize_events(_decoding(0.003, 0, 0).records)
    assert decode_ratio(a, no_decode) is None


def test_compare_says_the_engine_ratio_beside_the_fixed_mark():
    from vllm_probe.tui.compare_view import machine_line

    a, b = summarize_events(_decoding(0.003).records), summarize_events(_decoding(0.0036).records)
    a.speed_mark.mark_us = b.speed_mark.mark_us = 1000.0  # the fixed computation saw no change
    machine = comparison([a, b])["machine"]
    assert machine["ratio"] == [1.0] and math.isclose(machine["decode_ratio"][0], 1.2, rel_tol=2e-3)
    out = io.StringIO()
    Console(file=out, width=400, color_system=None).print(machine_line(machine))
    assert "decode steps at equal batch, against [1]'s: [2] ×1.20" in out.getvalue()
