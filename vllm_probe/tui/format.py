"""How a figure reads: one formatting for the dashboard, summary, compare and doctor views.

The same value reads the same wherever it is shown (0.85 s is "850 ms" everywhere).
Unknown values (None) read as :data:`UNKNOWN`. The ``--plain`` lines keep their own
machine-friendly rule for counts (no thousands separators) and use :func:`pct` here.
"""

from __future__ import annotations

import os
from typing import Any

from .. import envvars
from ..analysis.text import fmt_duration, fmt_figure

#: What an unknown figure reads as.
UNKNOWN = "-"

#: Width of reports written to a pipe or file (rich would use 80 and cut table cells).
PIPE_WIDTH = 160


def count(v: int | float | None) -> str:
    """An integer figure with thousands separators: ``1,024``."""
    return UNKNOWN if v is None else f"{int(v):,}"


def pct(v: float | None) -> str:
    """A share 0..1 as a percentage: one decimal below 10 % (``4.5%``), else whole (``73%``)."""
    if v is None:
        return UNKNOWN
    return f"{100 * v:.1f}%" if 0 < v < 0.1 else f"{100 * v:.0f}%"


def signed_pct(v: float | None) -> str:
    """A relative change or error as a signed share: ``+1.2%``, ``−15%`` (a real minus
    sign), digits as :func:`pct`."""
    if v is None:
        return UNKNOWN
    return ("+" if v >= 0 else "−") + pct(abs(v))


def duration(s: float | None) -> str:
    """Seconds as ``0.4 ms``, ``5.5 ms``, ``850 ms``, ``2.31 s``, ``1m 05s``, ``2h 03m``: the
    doctor's messages (part of ``--json``) write them the same way, so the analysis's
    :func:`~vllm_probe.analysis.text.fmt_duration` is the one definition."""
    return fmt_duration(s)


def micros(v: float | None) -> str:
    """Microseconds as ``310 µs`` or, from 1,000 µs, ``1.20 ms``."""
    if v is None:
        return UNKNOWN
    return f"{v:.0f} µs" if v < 1000 else f"{v / 1000:.2f} ms"


def figure(value: Any, unit: str = "") -> str:
    """A figure by its unit: ``%`` (share 0..1), ``s``, ``µs``, else a count or number;
    booleans read ``on``/``off`` and strings as they are. All but ``µs`` are the doctor's
    :func:`~vllm_probe.analysis.text.fmt_figure` (its messages are part of
    ``--json``, so the analysis holds the one definition)."""
    if unit == "µs" and value is not None and not isinstance(value, (bool, str)):
        return micros(value)
    return fmt_figure(value, unit)


def with_range(value: Any, lo: float | None, hi: float | None, unit: str = "") -> str:
    """A figure and its interval, the range in the figure's own scale: ``1.23 s (1.05–1.41)``,
    ``7.4 ms (6.5–8.0)``, ``505.0 (464.7–574.0)``; the figure alone without a range."""
    text = figure(value, unit)
    if lo is None or hi is None or value is None or isinstance(value, (bool, str)) or figure(lo, unit) == figure(
            hi, unit):
        return text
    if unit == "s":
        if abs(value) < 0.01:
            scale, fmt = 1e3, "{:.1f}"
        elif abs(value) < 1.0:
            scale, fmt = 1e3, "{:.0f}"
        else:
            scale, fmt = 1.0, "{:.2f}" if abs(value) < 60 else "{:,.0f}"
        return f"{text} ({fmt.format(lo * scale)}–{fmt.format(hi * scale)})"
    return f"{text} ({figure(lo, unit)}–{figure(hi, unit)})"


def signed(d: float, rel: float | None, unit: str = "") -> str:
    """A delta by its figure's unit: ``+1.20 s (+40%)``, ``−3 (−12%)``; shares (``%``)
    in percentage points, ``+5.0 pt``. Minus is a real minus sign, as wide as the plus."""
    if unit == "%":
        text = f"{d * 100:+.1f} pt"
    else:
        text = ("+" if d > 0 else "-") + figure(abs(d), unit)
        if rel is not None:
            text += f" ({rel * 100:+.0f}%)"
    return text.replace("-", "−")


def triple(d: Any, unit: str = "") -> str:
    """A distribution's median, p90 and max: ``4 · 5 · 16``."""
    return f"{figure(d.median, unit)} · {figure(d.p90, unit)} · {figure(d.max, unit)}"


def share_of(part: int | None, whole: int | None, unit: str = "tok") -> str:
    """A part of a whole with its share: ``22,800 of 24,576 prompt tok (93%)``; ``0`` when
    the whole is 0 or unknown."""
    if not whole:
        return count(part or 0)
    return f"{count(part)} of {count(whole)} {unit} ({pct((part or 0) / whole)})"


def prompt_class(c: Any) -> str:
    """A prompt-length class (:class:`~vllm_probe.analysis.summary.LatencyClass`) with its
    bounds in tokens: ``short ≤256``, ``medium 257–1,024``, ``long >1,024``."""
    if c.high is None:
        return f"{c.name} >{count(c.low - 1)}"
    if c.low is None or c.low <= 1:
        return f"{c.name} ≤{count(c.high)}"
    return f"{c.name} {count(c.low)}–{count(c.high)}"


def kv_capacity(capacity_tokens: int | None, blocks: int | None, block_size: int | None) -> tuple[str, str]:
    """The KV cache of an ``engine_config`` as ``("8,064 tok", "(64 blocks × 128, 1
    reserved)")``: vLLM reserves block 0 (the null block), so the capacity is
    ``(blocks - 1) × block_size`` tokens."""
    return f"{count(capacity_tokens)} tok", f"({count(blocks)} blocks × {count(block_size)}, 1 reserved)"


def kv_capacity_compact(capacity_tokens: int | None, blocks: int | None, block_size: int | None) -> str:
    """:func:`kv_capacity` in one short cell: ``8,064 tok = (64 − 1) × 128`` (a GPU's
    cache of millions of tokens still fits a report's column)."""
    return f"{count(capacity_tokens)} tok = ({count(blocks)} − 1) × {count(block_size)}"


def report_console():
    """A rich Console for reports (summary, compare, doctor): the terminal's width, or
    ``$COLUMNS``, or :data:`PIPE_WIDTH` when the output is not a terminal."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal and not os.environ.get(envvars.COLUMNS):
        console = Console(width=PIPE_WIDTH)
    return console
