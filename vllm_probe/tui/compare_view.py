"""Runs side by side (``vllm-probe compare``): the config and command differences, then
each figure of :data:`~vllm_probe.analysis.compare.FIGURES` per run with its delta
against the first, green when better and red when worse. Computation lives in
:mod:`vllm_probe.analysis.compare`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..analysis.compare import FIGURES, Figure, command_differences, config_differences, delta
from ..analysis.summary import Summary
from .format import figure


def fmt_delta(f: Figure, base: Any, value: Any) -> Text:
    """``value`` against ``base`` as the compare table shows it: ``+512 (+50%)``, green
    when better, red when worse, ``=`` when equal."""
    d, rel, verdict = delta(f, base, value)
    if d is None:
        return Text("")
    if verdict == "same":
        return Text("=", style="dim")
    unit = "" if f.unit == "%" else f.unit
    if f.unit == "%":
        text = f"{d * 100:+.1f} pt"
    else:
        text = ("+" if d > 0 else "-") + figure(abs(d), unit)
        if rel is not None:
            text += f" ({rel * 100:+.0f}%)"
    text = text.replace("-", "−")  # a real minus sign, as wide as the plus
    style = {"better": "green", "worse": "red"}.get(verdict or "", "")
    return Text(text, style=style)


def _labels(summaries: list[Summary]) -> list[str]:
    names = [Path(s.run_dir).name or s.run_dir for s in summaries]
    if len(set(names)) < len(names):
        return [f"#{i + 1}" for i in range(len(names))]
    return names


def render(summaries: list[Summary]) -> Group:
    """Config differences, then the figures side by side with deltas against run 1."""
    labels = _labels(summaries)
    parts: list[Any] = [Text("vllm-probe compare", style="bold")]
    for i, (label, s) in enumerate(zip(labels, summaries)):
        parts.append(Text(f"  [{i + 1}] {label}: {s.run_dir}" + ("  (baseline)" if i == 0 else ""), style="dim"))

    cfg = Table(title="Differences", title_justify="left", title_style="bold underline", box=box.SIMPLE_HEAD,
                pad_edge=False)
    cfg.add_column("setting", style="dim")
    for i in range(len(summaries)):
        cfg.add_column(f"[{i + 1}]", justify="right")
    diffs = config_differences(summaries)
    for key, values in diffs.items():
        cfg.add_row(key, *[figure(v) for v in values])
    cmd = command_differences(summaries)
    if cmd:
        cfg.add_row("command", *cmd)
    if not diffs and not cmd:
        cfg.add_row("(none)", *["" for _ in summaries])
    parts.append(cfg)
    workload = {(s.requests_finished + s.requests_unfinished, s.prompt_tokens) for s in summaries}
    if len(workload) > 1:
        parts.append(Text("note: the runs served different workloads (request count or prompt tokens differ)",
                          style="yellow"))

    t = Table(title="Figures", title_justify="left", title_style="bold underline", box=box.SIMPLE_HEAD,
              pad_edge=False)
    t.add_column("", style="dim", no_wrap=True)
    t.add_column("[1]", justify="right", no_wrap=True)
    for i in range(1, len(summaries)):
        t.add_column(f"[{i + 1}]", justify="right", no_wrap=True)
        t.add_column(f"Δ [{i + 1}]−[1]", justify="right", no_wrap=True)
    section = None
    for f in FIGURES:
        if section is not None and f.section != section:
            t.add_section()
        section = f.section
        values = [f.get(s) for s in summaries]
        cells: list[Any] = [figure(values[0], f.unit)]
        for v in values[1:]:
            cells += [figure(v, f.unit), fmt_delta(f, values[0], v)]
        t.add_row(f.label, *cells)
    parts.append(t)
    return Group(*parts)
