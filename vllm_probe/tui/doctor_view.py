"""The doctor's findings, drawn: the ``vllm-probe doctor`` report and the dashboard's
findings panel. No computation here: findings come from :mod:`vllm_probe.analysis.doctor`
(the same rules for a finished run and the live state); this module lays them out.
"""

from __future__ import annotations


from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..analysis.doctor import CRITICAL, INFO, RULES, WARNING, Finding, Report
from ..analysis.doctor.findings import BaselineError, Prediction, known
from ..analysis.catalogue import label_of
from ..schema.engine_settings import BY_NAME
from .charts import line, sep
from .format import count, figure, signed_pct, with_range
from .ranks_view import rank_heading
from .whatif_view import outside_line, step_time_model_line

#: How each severity reads.
SEVERITY_STYLE = {CRITICAL: "bold white on red", WARNING: "bold yellow", INFO: "bold cyan"}
SEVERITY_LABEL = {CRITICAL: "CRITICAL", WARNING: "WARNING", INFO: "info"}


def predicted_text(p: Prediction) -> str:
    """``preemptions 37 → 2 · TTFT p90 4.10 s → 2.60 s`` from a finding's ``predicted``: the
    replay at the recorded settings → the replay at the remedy's."""
    parts = []
    for name, fig in (p.figures or {}).items():
        parts.append(f"{name} {figure(fig.baseline, fig.unit)} → {figure(fig.predicted, fig.unit)}")
    return " · ".join(parts)


def unmet_goal_text(p: Prediction) -> str:
    """Why a replayed remedy falls short of its finding's goal (``predicted.goal``)."""
    name, target = (p.goal.figure, p.goal.target) if p.goal else ("", None)
    if p.complete is False:
        return (f"the search stopped at its --budget after {len(p.tried or [])} replayed change(s), none "
                "reaching the goal yet; --budget S searches longer")
    far = p.extrapolated
    if far:
        shown = ", ".join(",".join(f"{k}={v}" for k, v in t.settings.items()) for t in far)
        worst = max(t.extrapolated_share or 0.0 for t in far)
        return (f"not checked: the replay reaches {name}'s goal only at {shown}, with up to "
                f"{worst * 100:.0f} % of its predicted time from beyond the step-time model's fitted region "
                "(its seconds there are a guess: docs/whatif.md, the step-time model's region)")
    if not p.tried:
        return ("no change was replayed: the rule's knobs have no value within bounds here"
                + (f" ({'; '.join(p.skipped)})" if p.skipped else ""))
    if target == "lower":
        return f"the replay says it does not help: {name} does not go down in {len(p.tried)} replayed change(s)"
    if name == "preemptions":
        return "not enough on its own: the replay still preempts"
    return f"not enough on its own: {name} stays above {figure(target)}"


def baseline_line(error: BaselineError | None, stretch: dict | None = None) -> Text:
    """How far to trust ``--whatif``'s predictions: the replay at the recorded settings
    against the recorded run (``predicted.baseline_error``), or against the stretch of it
    that was replayed (``predicted.stretch``)."""
    head = "predictions: vLLM's own scheduler replayed at each remedy's settings; "
    if stretch:
        head += f"on steps {stretch['first_step']:,}–{stretch['last_step']:,} of {stretch['of_steps']:,}, "
    if not error:
        return Text(head + "no baseline comparison", style="dim")
    figs = ", ".join(f"{label_of(name)} " + ("=" if e == 0 else "-" if e is None else signed_pct(e))
                     for name, e in error.figures.items())
    if error.within:
        return Text(head + f"at the recorded settings it matched the run within its thresholds ({figs})", style="dim")
    return Text(head + f"at the recorded settings it is off on {', '.join(label_of(n) for n in error.off)} ({figs}): "
                "take those predicted figures as rough (docs/whatif.md)", style="yellow")


def _finding(f: Finding, run_dir: str) -> RenderableType:
    t = Table.grid(padding=(0, 1))
    t.add_column(no_wrap=True, style="dim", width=10)
    t.add_column(overflow="fold")
    head = Text.assemble((f" {SEVERITY_LABEL[f.severity]} ", SEVERITY_STYLE[f.severity]), "  ", (f.id, "bold"))
    rows: list[tuple[str, RenderableType]] = [("", Text(f.message))]
    rule = RULES[f.id]
    for i, ev_line in enumerate(rule.view(f)):
        rows.append(("evidence" if i == 0 else "", Text(ev_line)))
    if f.engine is not None:
        rows.append(("engine", Text(f"data-parallel rank {f.engine}")))
    r = f.remedy
    if r is not None:
        rows.append(("remedy", Text.assemble((f"{r.setting} = {figure(r.value)}", "bold green"),
                                             (f"  ({' '.join(r.to_dict()['flags'])})", "dim"))))
        rows.append(("", Text(r.arithmetic)))
        for alt in r.alternatives:
            rows.append(("", Text.assemble(("or ", "dim"), (f"{alt['setting']} = {figure(alt['value'])}", "green"),
                                           f": {alt['arithmetic']}")))
        rows.append(("", Text.assemble(("trade-off: ", "dim"), r.tradeoff)))
        rows.append(("", Text.assemble(("source: ", "dim"), (r.source, "dim"))))
    if f.predicted:
        p = f.predicted
        if p.error:
            rows.append(("predicted", Text(p.error, style="yellow")))
        else:
            line = Text(predicted_text(p), style="bold")
            if p.resolved is False:
                line.append("  " + unmet_goal_text(p), style="yellow")
            rows.append(("predicted", line))
            st = p.stretch
            if st:
                rows.append(("", Text(f"replayed steps {st['first_step']:,}–{st['last_step']:,} of {st['of_steps']:,} "
                                      f"({st['requests']:,} requests): the stretch between idle moments that holds "
                                      "what the goal counts (--whole-run replays it all)", style="dim")))
            if p.run_dir:
                rows.append(("", Text(f"replayed: {p.run_dir}", style="dim")))
    step = rule.step(f)
    if step is not None:
        rows.append(("see", Text(f"vllm-probe tail {run_dir} --replay --from-step {step}", style="dim")))
    for label, cell in rows:
        t.add_row(label, cell)
    return Group(head, t)


def _outside(findings: list[Finding], replayed: Prediction) -> Text | None:
    """The share of steps outside the step-time model's fitted region: the baseline
    replay's, then each finding's shown prediction's."""
    shares = [("baseline", known(replayed.baseline_outside_region))]
    shares += [(f.id, known(f.predicted.outside_region)) for f in findings if f.predicted]
    return outside_line(shares)


def render_report(report: Report, width: int = 120) -> RenderableType:
    """The ``vllm-probe doctor`` report: a header, then each finding worst first; on a run
    of several data-parallel ranks, one section per rank (its findings worst first)."""
    state = report.state
    cfg = state.config
    steps = int(state.total("steps"))
    finished = int(state.total("requests_finished"))
    parts: list[RenderableType] = [
        Text.assemble(("vllm-probe doctor ", "bold"), (report.run_dir, "cyan")),
        Text(" · ".join(x for x in (
            f"vLLM {cfg.vllm_version}" if cfg is not None and cfg.vllm_version else "",
            (cfg.scheduler_class or "") if cfg is not None else "",
            f"{count(steps)} steps", f"{count(finished)} request{'s' if finished != 1 else ''} finished",
            f"{count(report.stats.events)} events" + (f" ({report.stats.describe()})" if report.stats.skipped else ""),
            f"expected settings from {report.expected_source}" if report.expected_source else "",
        ) if x), style="dim"),
    ]
    multi = len(report.ranks) > 1
    if multi and report.rank is not None:
        parts.insert(1, rank_heading(report.rank, report.ranks, "its own events; remedies replayed on its own "
                                     "requests, the balancing across ranks as recorded", width))
    replayed = next((f.predicted for f in report.findings if f.predicted and f.predicted.baseline_error), None)
    if replayed is not None:
        parts.append(baseline_line(known(replayed.baseline_error), known(replayed.stretch)))
        for extra in (step_time_model_line(report.step_time_model), _outside(report.findings, replayed)):
            if extra is not None:
                parts.append(extra)
    if report.plan is not None:
        parts.append(Text(""))
        parts.append(plan_block(report.plan, report.run_dir))
    shown = list(report.findings)
    serious = [f for f in shown if f.severity in (CRITICAL, WARNING)]
    if not serious and report.all_clear:
        parts.append(Text(report.all_clear, style="bold green" if report.all_clear.startswith("No finding above info:")
                          else "bold yellow"))
    if not multi or report.rank is not None:
        for f in shown:
            parts.append(Text(""))
            parts.append(_finding(f, report.run_dir))
        return Group(*parts)
    for rank in [None, *report.ranks]:  # findings about the run as a whole first, then each rank's
        of_rank = [f for f in shown if f.engine == rank]
        if rank is None and not of_rank:
            continue
        parts.append(Text(""))
        parts.append(rank_heading(rank, report.ranks, f"{len(of_rank)} finding{'s' if len(of_rank) != 1 else ''} "
                                  f"(vllm-probe doctor --rank {rank}: replays its remedies)", width)
                     if rank is not None else Text("every rank together", style="bold"))
        for f in of_rank:
            parts.append(Text(""))
            parts.append(_finding(f, report.run_dir))
    return Group(*parts)


#: How each direction reads in the plan's block.
DIRECTION_STYLE = {"better": "green", "worse": "red", "unchanged": "dim", "unclear": "yellow"}


def _figure_change(label: str, f: Any) -> Text:
    """``ttft_p90 6.31 s (5.55–6.86) → 1.41 s (0.72–2.16)``: baseline → predicted, each with
    its interval where it has one."""
    b = f.baseline_interval or {}
    p = f.interval or {}
    return Text(f"{label} {with_range(f.baseline, b.get('lo'), b.get('hi'), f.unit)} → "
                f"{with_range(f.predicted, p.get('lo'), p.get('hi'), f.unit)}")


def plan_block(plan: Any, run_dir: str) -> RenderableType:
    """The doctor's one plan (:class:`vllm_probe.analysis.doctor.plan.Plan`): what to apply,
    what it clears and leaves, better / worse / unclear against the replay at the recorded
    settings with the mechanism, what it costs, and how to check it."""
    t = Table.grid(padding=(0, 1))
    t.add_column(no_wrap=True, style="dim", width=10)
    t.add_column(overflow="fold")
    rows: list[tuple[str, Text]] = []
    if plan.settings:
        changes = ", ".join(f"{k} = {figure(v)}" for k, v in plan.settings.items())
        how = "replayed" if plan.checked else "arithmetic, not checked by the replay"
        rows.append(("apply", Text.assemble((changes, "bold green"), (f"  ({how})", "dim"))))
        rows.append(("", Text("vllm serve MODEL " + " ".join(plan.flags), style="dim")))
        rows.append(("", Text("LLM(MODEL, " + ", ".join(f"{k}={v!r}" for k, v in plan.engine_args.items()) + ")",
                              style="dim")))
    elif not plan.leaves and not plan.clears:
        rows.append(("apply", Text("nothing: no warning or critical finding to clear", style="dim")))
    else:
        rows.append(("apply", Text("nothing: no setting the replay tried reaches a goal", style="yellow")))
    if plan.conflict:
        rows.append(("conflict", Text(plan.conflict, style="yellow")))
    goals = {label: f for label, f in plan.predicted.items() if f.goal}
    for fid in plan.clears:
        shown = [_figure_change(label, f) for label, f in goals.items() if f.goal == fid]
        rows.append(("clears", Text.assemble((fid, "bold"), ": ", *(shown[:1] or [Text("")]))))
    for fid in plan.leaves:
        rows.append(("leaves", Text.assemble((fid, "bold"), ": ", plan.left_because.get(fid, ""))))
    mech = "; ".join(f"{k} {figure(v[0])} → {figure(v[1])}" for k, v in plan.mechanism.items() if v[0] != v[1])
    for direction in ("better", "worse", "unclear"):
        for label, f in plan.predicted.items():
            if f.goal or f.direction != direction or label in BY_NAME:  # a setting's own change: apply, cost
                continue
            line = _figure_change(label, f)
            if direction == "unclear":
                line.append("  the intervals overlap: the direction is not known", style="dim")
            elif direction == "worse" and mech:
                line.append(f"  ({mech})", style="dim")
            rows.append((direction, line))
    same = [label for label, f in plan.predicted.items()
            if not f.goal and f.direction == "unchanged" and label not in BY_NAME]
    if same:
        rows.append(("unchanged", Text(", ".join(same))))
    for c in plan.cost:
        rows.append(("cost", Text(c)))
    for i, cmd in enumerate(plan.rerun):
        rows.append(("check" if i == 0 else "", Text(cmd, style="dim")))
    for label, cell in rows:
        cell.stylize(DIRECTION_STYLE.get(label, ""), 0, 0)
        t.add_row(Text(label, style=DIRECTION_STYLE.get(label, "dim")), cell)
    head = Text.assemble((" PLAN ", "bold white on blue"), "  ", ("one set of changes for this run", "bold"),
                         (" · changes against the replay at the recorded settings" if plan.checked else "", "dim"))
    parts: list[RenderableType] = [head, t]
    for i, alt in enumerate(plan.alternatives):
        parts.append(Text(f"alternative {i + 1}: " + ", ".join(f"{k} = {figure(v)}" for k, v in alt.settings.items())
                          + f" — clears {', '.join(alt.clears) or 'nothing'}"
                          + (f", leaves {', '.join(alt.leaves)}" if alt.leaves else ""), style="dim"))
    return Group(*parts)


def findings_panel(findings: list[Finding], width: int, rows: int, live: bool) -> tuple[Panel, int]:
    """The dashboard's panel: one line per finding, worst first (``rows``: the panel's
    height, borders included)."""
    shown = [f for f in findings if f.id != "not-checked"]
    room = max(rows - 2, 1)
    lines: list[Text] = []
    for f in shown[:room if len(shown) <= room else room - 1]:
        lines.append(line((f" {SEVERITY_LABEL[f.severity]} ", SEVERITY_STYLE[f.severity]), " ", (f.id, "bold"), sep(),
                          f.message))
    if len(shown) > len(lines):
        lines.append(line((f"+{len(shown) - len(lines)} more · vllm-probe doctor shows the evidence", "dim")))
    if not lines:
        lines.append(line(("no finding above info so far" if live else "no finding above info", "dim")))
    title = ("findings so far" if live else "findings") + "  (vllm-probe doctor: evidence and remedies)"
    return Panel(Group(*lines), title=title, title_align="left", box=box.ROUNDED, padding=(0, 1)), len(lines) + 2
