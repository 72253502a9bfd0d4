"""Runs side by side (``vllm-probe compare``): the config, command and settings-file
differences, then the figures per run with their delta against the first — step
figures first (reliable anywhere), wall-clock ones after, their deltas marked ``≈``
when within the runs' own noise — and a one-line verdict per group of figures.
Computation lives in :mod:`vllm_probe.analysis.compare`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich import box
from rich.console import Group as RichGroup
from rich.table import Table
from rich.text import Text

from ..analysis.catalogue import STEPS, WALL, Figure
from ..analysis.compare import GROUPS, comparison, delta
from ..analysis.summary_types import Summary
from .format import figure, pct, prompt_class, signed, signed_pct

#: How a group's verdict reads, and its style.
_VERDICT = {"better": ("better", "green"), "worse": ("worse", "red"), "mixed": ("mixed", "yellow"),
            "same": ("no change", "dim"), "noise": ("within noise", "dim"), "unknown": ("nothing to compare", "dim"),
            "changed": ("changed", "yellow")}
_OPPOSITE = {"better": "worse", "worse": "better"}


def _delta_text(d: float | None, rel: float | None, verdict: str | None, unit: str, noisy: bool = False) -> Text:
    if d is None:
        return Text("")
    if verdict == "same":
        return Text("=", style="dim")
    text = signed(d, rel, unit)
    if noisy:
        return Text("≈ " + text, style="dim")
    return Text(text, style={"better": "green", "worse": "red"}.get(verdict or "", ""))


def _fmt_delta(row: dict, i: int) -> Text:
    d = row["deltas"][i]
    return _delta_text(d["abs"], d["rel"], d["verdict"], row["unit"], bool(d["noisy"]))


def fmt_delta(f: Figure, base: Any, value: Any) -> Text:
    """``value`` against ``base`` on figure ``f`` as the compare table shows it:
    ``+512 (+50%)``, green when better, red when worse, ``=`` when equal (no noise
    judgement: whatif's predictions are a model's, not two noisy runs)."""
    d, rel, verdict = delta(f, base, value)
    return _delta_text(d, rel, verdict, f.unit)


def _labels(summaries: list[Summary]) -> list[str]:
    names = [Path(s.run_dir).name or s.run_dir for s in summaries]
    if len(set(names)) < len(names):
        return [f"#{i + 1}" for i in range(len(names))]
    return names


def verdict_line(v: dict, label: str) -> Text:
    """One group's verdict: ``preemptions: better — preemptions −3 (−75%), …``."""
    word, style = _VERDICT.get(v["verdict"], (v["verdict"], ""))
    text = Text.assemble((f"{label} " if label else "", "dim"), (f"{v['group']}: ", "bold"), (word, style),
                         no_wrap=True, overflow="ellipsis")
    if v["clock"] == WALL:
        text.append(f" (noise ±{pct(v['noise'])})" if v["noise"] is not None else " (noise not measured)", style="dim")
    if v.get("contradicted_by"):
        text.append(f", but {v['contradicted_by']}: {_VERDICT[_OPPOSITE[v['verdict']]][0]} — trust the steps",
                    style="yellow")
    changes = [c for c in v["changes"] if c["abs"] is not None]
    if changes and v["verdict"] not in ("same", "unknown"):
        shown = [f"{c['figure']} {signed(c['abs'], c['rel'], c['unit'])}" + (" ≈" if c["noisy"] else "")
                 for c in changes]
        text.append(" — " + ", ".join(shown))
    return text


def machine_line(machine: dict[str, Any]) -> Text:
    """Each run's machine-speed mark and its ratio to the baseline's, as ``comparison``'s
    ``machine`` gives them: how much of a difference in seconds is the host's."""
    marks, ratios = machine["speed_mark_us"], machine["ratio"]
    if all(m is None for m in marks):
        return Text("Machine-speed mark: not recorded in these runs (an older probe, or simulated runs): how much of "
                    "a difference in seconds is the machine's is unknown.", style="dim")
    said = []
    for i, ratio in enumerate(ratios):
        if ratio is None:  # one of the two has no mark: say which, not just "unknown"
            missing = "[1]" if marks[0] is None else f"[{i + 2}]"
            said.append(f"[{i + 2}] against [1] unknown ({missing} has none)")
        else:
            said.append(f"[{i + 2}] ×{ratio:.2f} of [1]'s ({signed_pct(ratio - 1)} seconds for the same work)")
    text = ("Machine-speed mark (µs of the probe's fixed computation on each run's host, lower is faster): "
            + ", ".join(f"[{i + 1}] {figure(m, 'µs')}" for i, m in enumerate(marks)) + "; " + ", ".join(said)
            + (": a wall-clock delta up to that much is the host's, not the settings'."
               if any(r is not None for r in ratios) else "."))
    engine = [f"[{i + 2}] ×{r:.2f}" for i, r in enumerate(machine.get("decode_ratio") or []) if r is not None]
    if engine:
        text += (" The engine's own decode steps at equal batch, against [1]'s: " + ", ".join(engine)
                 + " (where this differs from the mark, the engine's speed moved beside the host's).")
    return Text(text, style="dim")


def render(summaries: list[Summary]) -> RichGroup:
    """Differences, then the figures side by side with deltas against run 1, then the
    verdicts per group."""
    data = comparison(summaries)
    labels = _labels(summaries)
    parts: list[Any] = [Text("vllm-probe compare", style="bold")]
    for i, (label, s) in enumerate(zip(labels, summaries)):
        parts.append(Text(f"  [{i + 1}] {label}: {s.run_dir}" + ("  (baseline)" if i == 0 else ""), style="dim"))
        if s.retention:
            parts.append(Text(f"      {s.retention}", style="yellow"))
    parts += [_differences(summaries, data), *_notes(summaries, data), _figures(summaries, data)]
    classes = list(summaries[0].latency_classes.classes)
    if any(r["path"].startswith("latency_classes.") for r in data["figures"]):
        parts.append(Text("prompt classes (the baseline's): " + ", ".join(prompt_class(c) for c in classes)
                          + " tokens", style="dim"))

    parts.append(Text("Verdicts", style="bold underline"))
    for v in data["verdicts"]:
        label = f"[{v['run'] + 1}] vs [1]" if len(summaries) > 2 else ""
        parts.append(verdict_line(v, label))
    return RichGroup(*parts)


def _differences(summaries: list[Summary], data: dict[str, Any]) -> Table:
    """The settings (and command, and settings-file checks) in which the runs differ."""
    cfg = Table(title="Differences", title_justify="left", title_style="bold underline", box=box.SIMPLE_HEAD,
                pad_edge=False)
    cfg.add_column("setting", style="dim")
    for i in range(len(summaries)):
        cfg.add_column(f"[{i + 1}]", justify="right")
    diffs = data["config_differences"]
    for key, values in diffs.items():
        cfg.add_row(key, *[figure(v) for v in values])
    cmd = data["command_differences"]
    if cmd:
        cfg.add_row("command", *cmd)
    expected = data["expected_differences"]
    if expected and any(expected):
        cfg.add_row("settings file ≠ run", *[
            "; ".join(f"{c['setting']} {figure(c['expected'])}→{figure(c['effective'])}" for c in run) or "as expected"
            if s.expected else "(no file)" for run, s in zip(expected, summaries)])
    if not diffs and not cmd and not (expected and any(expected)):
        cfg.add_row("(none)", *["" for _ in summaries])
    return cfg


def _notes(summaries: list[Summary], data: dict[str, Any]) -> list[Text]:
    """What a reader must know before the figures: workloads, noise, budgets, predictions,
    the machine, identical decisions."""
    parts: list[Text] = []
    workload = {(s.requests_finished + s.requests_unfinished, s.prompt_tokens) for s in summaries}
    if len(workload) > 1:
        parts.append(Text("note: the runs served different workloads (request count or prompt tokens differ)",
                          style="yellow"))

    spreads = data["noise"]["itl_spread"]
    parts.append(Text(
        "Step figures count the scheduler's decisions: the same on a busy or an idle machine. Seconds also measure "
        "how much CPU each run got; inter-token spread within each run (p90/median − 1): "
        + ", ".join(f"[{i + 1}] {pct(x)}" for i, x in enumerate(spreads))
        + "; a wall-clock delta no larger than the larger of the two is marked ≈ (within noise).", style="dim"))
    for i, ok in enumerate(data.get("steps_comparable", [])):
        if not ok:
            b0, b1 = (summaries[0].config.get("max_num_batched_tokens"), summaries[i + 1].config.get(
                "max_num_batched_tokens"))
            parts.append(Text(f"[{i + 2}]: token budgets differ ({figure(b0)} vs {figure(b1)}): a step holds different "
                              "work, so figures in steps (TTFT in steps) do not compare with [1]'s; judge by seconds",
                              style="yellow"))
    preds = data.get("predictions", [])
    for i in range(1, len(preds)):
        if preds[i] != preds[0]:
            parts.append(Text(f"[{i + 1}] against [1]: a prediction against a real run — their gap in seconds is the "
                              "model's error, not noise (no ≈ marks)", style="yellow"))
    parts.append(machine_line(data["machine"]))
    same = [f"[{i + 2}]" for i, x in enumerate(data["noise"]["same_decisions"]) if x]
    if same:
        parts.append(Text(f"{', '.join(same)}: every step figure equals [1]'s — the scheduler made the same decisions, "
                          "so every difference in seconds is the machine's (all marked ≈).", style="yellow"))
    return parts


def _figures(summaries: list[Summary], data: dict[str, Any]) -> Table:
    """The figures side by side, grouped (step figures first, then seconds), with deltas."""
    t = Table(title="Figures", title_justify="left", title_style="bold underline", box=box.SIMPLE_HEAD,
              pad_edge=False)
    t.add_column("", no_wrap=True)
    t.add_column("[1]", justify="right", no_wrap=True)
    for i in range(1, len(summaries)):
        t.add_column(f"[{i + 1}]", justify="right", no_wrap=True)
        t.add_column(f"Δ [{i + 1}]−[1]", justify="right", no_wrap=True)
    clock_said = None
    for g in GROUPS:
        rows = [r for r in data["figures"] if r["section"] == g.name]
        if not rows:
            continue
        if clock_said is not None:
            t.add_section()
        if g.clock != clock_said:
            header = ("step figures: reliable on any machine" if g.clock == STEPS and clock_said is None else
                      "seconds: noisy on a shared machine" if g.clock == WALL else "")
            clock_said = g.clock
        else:
            header = ""
        head_cells: list[Any] = [""]
        for ratio in data["machine"]["ratio"]:  # the machine's ratio beside each run's seconds
            head_cells += ["", Text(f"machine ×{ratio:.2f}", style="dim") if g.clock == WALL and ratio else ""]
        t.add_row(Text.assemble((g.name, "bold"), (f"  {header}" if header else "", "italic dim")), *head_cells)
        for r in rows:
            cells: list[Any] = [figure(r["values"][0], r["unit"])]
            for i, v in enumerate(r["values"][1:]):
                cells += [figure(v, r["unit"]), _fmt_delta(r, i)]
            t.add_row(Text("  " + r["figure"], style="dim"), *cells)
    return t
