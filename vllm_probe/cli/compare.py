"""``vllm-probe compare RUN_DIR RUN_DIR [...] [--json]``: runs side by side (seed notes §4.4).

On top, what differs between the runs' effective configs (``engine_config``) and command
lines (``meta.json``); below, the figures of :data:`vllm_probe.analysis.summary.FIGURES` for each
run, with the delta of every run against the first (the baseline), green when better,
red when worse (for figures where one direction is better).

Exit codes: 0 shown; 1 a run holds no readable event; 2 fewer than two runs, or a
RUN_DIR is missing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..runs.rundir import resolve_run_dir
from ..analysis.summary import CONFIG_KEYS, FIGURES, Figure, NoEventsError, Summary, summarize
from . import CliError, report_console
from .export import _silence_stdout
from .summary import fmt

EXIT_NO_EVENTS = 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="two or more run directories; the first is the baseline")
    p.add_argument("--json", action="store_true", help="print the runs' summaries and differences as JSON")


def main(args: argparse.Namespace) -> int:
    if len(args.run_dirs) < 2:
        raise CliError("compare needs at least two run directories")
    dirs = [resolve_run_dir(d) for d in args.run_dirs]
    summaries = []
    for d in dirs:
        try:
            summaries.append(summarize(d))
        except NoEventsError as e:
            raise CliError(str(e), EXIT_NO_EVENTS) from None
    try:
        if args.json:
            json.dump(comparison(summaries), sys.stdout, indent=2)
            sys.stdout.write("\n")
            sys.stdout.flush()
        else:
            report_console().print(render(summaries))
    except BrokenPipeError:  # `... | head`
        _silence_stdout()
        return 0
    return 0


# -- computation of differences (no rendering) -----------------------------------------------


def config_differences(summaries: list[Summary]) -> dict[str, list[Any]]:
    """``engine_config`` keys whose values differ between runs → value per run."""
    out: dict[str, list[Any]] = {}
    for key in CONFIG_KEYS:
        values = [s.config.get(key) for s in summaries]
        if any(v != values[0] for v in values[1:]):
            out[key] = values
    return out


def command_differences(summaries: list[Summary]) -> list[str] | None:
    """Per run, the command-line arguments that differ from the other runs (None: same).

    Same-length commands are compared position by position and each differing value is
    shown with the option before it (``--max-num-batched-tokens 512``); otherwise the
    whole command lines are returned.
    """
    cmds = [list(s.command or []) for s in summaries]
    if all(c == cmds[0] for c in cmds[1:]):
        return None
    if len({len(c) for c in cmds}) == 1:
        diff_pos = [i for i in range(len(cmds[0])) if any(c[i] != cmds[0][i] for c in cmds[1:])]
        out = []
        for c in cmds:
            parts = []
            for i in diff_pos:
                if i > 0 and c[i - 1].startswith("-") and (i - 1) not in diff_pos:
                    parts.append(f"{c[i - 1]} {c[i]}")
                else:
                    parts.append(c[i])
            out.append(" ".join(parts))
        return out
    return [" ".join(c) for c in cmds]


def delta(figure: Figure, base: Any, value: Any) -> tuple[float | None, float | None, str | None]:
    """(absolute delta, relative delta, verdict) of ``value`` against ``base``.

    The verdict is ``better``/``worse`` for figures with a better direction, ``same``
    when equal, None when not comparable.
    """
    if not isinstance(base, (int, float)) or not isinstance(value, (int, float)) or isinstance(base, bool):
        return None, None, None
    d = value - base
    rel = d / base if base else None
    if d == 0:
        return 0, 0.0 if base else None, "same"
    if figure.better is None:
        return d, rel, None
    good = d < 0 if figure.better == "lower" else d > 0
    return d, rel, "better" if good else "worse"


def comparison(summaries: list[Summary]) -> dict[str, Any]:
    """JSON-ready comparison: config and command differences, figures with deltas."""
    base = summaries[0]
    figures = []
    for f in FIGURES:
        values = [f.get(s) for s in summaries]
        row = {"section": f.section, "figure": f.label, "path": f.path, "unit": f.unit, "values": values,
               "deltas": []}
        for v in values[1:]:
            d, rel, verdict = delta(f, values[0], v)
            row["deltas"].append({"abs": d, "rel": rel, "verdict": verdict})
        figures.append(row)
    return {
        "runs": [s.run_dir for s in summaries],
        "baseline": base.run_dir,
        "config_differences": config_differences(summaries),
        "command_differences": command_differences(summaries),
        "figures": figures,
        "summaries": [s.to_dict() for s in summaries],
    }


# -- view ------------------------------------------------------------------------------------


def _fmt_delta(f: Figure, base: Any, value: Any) -> Text:
    d, rel, verdict = delta(f, base, value)
    if d is None:
        return Text("")
    if verdict == "same":
        return Text("=", style="dim")
    unit = "" if f.unit == "%" else f.unit
    if f.unit == "%":
        text = f"{d * 100:+.1f} pt"
    else:
        text = ("+" if d > 0 else "-") + fmt(abs(d), unit)
        if rel is not None:
            text += f" ({rel * 100:+.0f} %)"
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
    base = summaries[0]
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
        cfg.add_row(key, *[fmt(v) for v in values])
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
        cells: list[Any] = [fmt(values[0], f.unit)]
        for v in values[1:]:
            cells += [fmt(v, f.unit), _fmt_delta(f, values[0], v)]
        t.add_row(f.label, *cells)
    parts.append(t)
    return Group(*parts)
