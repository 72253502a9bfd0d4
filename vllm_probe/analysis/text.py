"""How numbers read: counts, shares, durations and figures by unit, one definition for every
text the project writes — the doctor's messages (part of ``--json``, so written by the
analysis) and every view (:mod:`vllm_probe.tui.format`, the HTML report). On the analysis
floor, the lowest that writes text, so that nothing below the views copies it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["UNKNOWN", "fmt_count", "fmt_count_or", "fmt_duration", "fmt_figure", "fmt_pct"]


def fmt_pct(v: float) -> str:
    return f"{100 * v:.1f}%" if 0 < v < 0.1 else f"{100 * v:.0f}%"


def fmt_count(v: int | float) -> str:
    return f"{int(v):,}"


#: What an unknown figure reads as (tui.format.UNKNOWN).
UNKNOWN = "-"


def fmt_count_or(v: int | float | None) -> str:
    """A count as tui.format.count reads it, None as :data:`UNKNOWN` (the views' lines)."""
    return UNKNOWN if v is None else fmt_count(v)


def fmt_duration(s: float | None) -> str:
    """Seconds as tui.format.duration writes them (``850 ms``, ``2.31 s``, ``1m 05s``)."""
    if s is None:
        return UNKNOWN
    if s < 0.01:
        return f"{s * 1000:.1f} ms"
    if s < 1.0:
        return f"{s * 1000:.0f} ms"
    if s < 60:
        return f"{s:.2f} s"
    if s < 3600:
        return f"{int(s // 60)}m {int(s % 60):02d}s"
    return f"{int(s // 3600)}h {int(s % 3600 // 60):02d}m"


def fmt_figure(value: Any, unit: str = "") -> str:
    """A figure as tui.format.figure reads it, for the units the doctor's lines use
    (``%``: a share 0..1; ``s``; else a count or number; booleans ``on``/``off``)."""
    if value is None:
        return UNKNOWN
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, str):
        return value
    if unit == "%":
        return fmt_pct(value)
    if unit == "s":
        return fmt_duration(value)
    if isinstance(value, int) or float(value).is_integer():
        return fmt_count(value)
    return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.2f}"


