"""The doctor's findings, drawn: the ``vllm-probe doctor`` report and the dashboard's
findings panel. No computation here: findings come from :mod:`vllm_probe.analysis.doctor`
(the same rules for a finished run and the live state); this module lays them out.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Callable

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..analysis.doctor import CRITICAL, INFO, WARNING, Finding, Report
from .charts import line, sep
from .format import count, duration, figure, pct, signed_pct

#: How each severity reads.
SEVERITY_STYLE = {CRITICAL: "bold white on red", WARNING: "bold yellow", INFO: "bold cyan"}
SEVERITY_LABEL = {CRITICAL: "CRITICAL", WARNING: "WARNING", INFO: "info"}


def _steps(r: Any) -> str:
    if not r or r[0] is None:
        return "-"
    return f"{r[0]}" if r[0] == r[1] else f"{r[0]}–{r[1]}"


def _reasons(d: dict) -> str:
    total = sum(d.values()) or 1
    return ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in sorted(d.items(), key=lambda kv: -kv[1]))


# -- evidence, per finding id: short lines naming steps, requests, counts ----------------------------


def _ev_storm(e: dict) -> list[str]:
    out = []
    if e.get("busiest_steps"):
        out.append("busiest steps: " + ", ".join(f"{b['step']} ({', '.join(b['preempted'][:3])})"
                                                 for b in e["busiest_steps"]))
    if e.get("peak_kv_demand_blocks"):
        out.append(f"peak KV demand {count(e['peak_kv_demand_blocks'])} blocks for {e['peak_running']} "
                   "running requests "
                   f"at full length; {count(e.get('usable_kv_blocks'))} usable")
    return out


def _ev_thrash(e: dict) -> list[str]:
    requests = e.get("requests", [])
    out = [f"{r['req_id']} ×{r['preemptions']} at steps {', '.join(str(s) for s in r['steps'][:8])}"
           f"{' …' if len(r['steps']) > 8 else ''} (discarded {count(r['discarded_tokens'])} tok, "
           f"prompt {count(r['prompt_len'])})" for r in requests[:4]]
    rest = requests[4:]
    if rest:
        more = e.get("repeated_requests", len(requests)) - len(requests)
        out.append("and " + ", ".join(f"{r['req_id']} ×{r['preemptions']}" for r in rest)
                   + (f" (+{more} more: doctor --json)" if more > 0 else ""))
    return out


def _ev_underloaded(e: dict) -> list[str]:
    return [f"requests waited after {count(e.get('waiting_steps'))} of {count(e.get('total_steps'))} steps · "
            f"median step {pct(e.get('budget_use_median'))} of the token budget"
            + (" · one offline burst" if e.get("burst") else "")]


def _ev_hol(e: dict) -> list[str]:
    out = [f"{b['req_id']} (prompt {count(b['prompt_len'])}) waited {b['waited_steps']} steps, {_steps(b['steps'])}: "
           f"queue {duration(b['queue_s'])} of TTFT {duration(b['ttft_s'])}" for b in e.get("blocked", [])[:4]]
    for t in e.get("takers", [])[:4]:
        out.append(f"budget taken by {t['req_id']} (prompt {count(t['prompt_len'])}): {count(t['prefill_tokens'])} "
                   f"prefill tokens" + (f", first chunk at step {t['first_chunk_step']}"
                                        if t.get("first_chunk_step") is not None else ""))
    return out


def _ev_bound(e: dict) -> list[str]:
    return [f"steps {_steps(e.get('step_range'))} · running max {e['running_max']} (mean {e['running_mean']:.1f}) · "
            f"waiting max {e['waiting_max']} (mean {e['waiting_mean']:.1f}) · KV {figure(e['kv_usage_mean'], '%')} "
            f"mean" + (" · inferred from the queues" if e.get("inferred_from_queues") else "")]


def _ev_stall(e: dict) -> list[str]:
    out = ["stalls at steps " + ", ".join(_steps(s) for s in e.get("stalls", []))]
    if e.get("head_blocked_by"):
        out.append("head blocked by " + _reasons(e["head_blocked_by"]))
    if e.get("head"):
        out.append(f"head {e['head']} (prompt {count(e.get('head_prompt_len'))})")
    return out


def _ev_chunking(e: dict) -> list[str]:
    return [f"e.g. {e['example']} ({count(e['example_prompt_len'])} tokens), steps {_steps(e.get('example_steps'))}"]


def _ev_config(e: dict) -> list[str]:
    out = [f"{d['setting']}: expected {figure(d['expected'])}, in force {figure(d['effective'])}" for d in e["differs"]]
    if e.get("not_recorded"):
        out.append("not recorded by engine_config (not checked): " + ", ".join(e["not_recorded"]))
    for n in e.get("not_in_v1", []):
        out.append(f"{n['setting']}: not a setting of vLLM V1 ({n['note']})")
    return out


def _ev_not_checked(e: dict) -> list[str]:
    return []


EVIDENCE: dict[str, Callable[[dict], list[str]]] = {
    "preemption-storm": _ev_storm, "preemption-thrash": _ev_thrash, "head-of-line-blocking": _ev_hol,
    "kv-bound": _ev_bound, "budget-bound": _ev_bound, "seqs-bound": _ev_bound, "stall": _ev_stall,
    "chunking-without-benefit": _ev_chunking, "config-not-applied": _ev_config, "not-checked": _ev_not_checked,
    "underloaded": _ev_underloaded,
}


def _first_step(f: Finding) -> int | None:
    """A step to jump to for ``f`` (``tail --replay --from-step``)."""
    e = f.evidence
    for key in ("first_step", "step_range", "longest", "example_steps"):
        v = e.get(key)
        if isinstance(v, list) and v and isinstance(v[0], int):
            return v[0]
        if isinstance(v, int):
            return v
    if e.get("blocked"):
        return e["blocked"][0]["steps"][0]
    if e.get("requests") and e["requests"][0].get("steps"):
        return e["requests"][0]["steps"][0]
    return None


def predicted_text(p: dict) -> str:
    """``preemptions 37 → 2 · TTFT p90 4.10 s → 2.60 s`` from a finding's ``predicted``."""
    parts = []
    for name, fig in p.get("figures", {}).items():
        unit = fig.get("unit", "")
        parts.append(f"{name} {figure(fig.get('recorded'), unit)} → {figure(fig.get('predicted'), unit)}")
    return " · ".join(parts)


def unmet_goal_text(p: dict) -> str:
    """Why a replayed remedy falls short of its finding's goal (``predicted["goal"]``)."""
    goal = p.get("goal") or {}
    name, target = goal.get("figure", ""), goal.get("target")
    if target == "lower":
        return f"the replay says it does not help: {name} does not go down"
    if name == "preemptions":
        return "not enough on its own: the replay still preempts"
    return f"not enough on its own: {name} stays above {figure(target)}"


def baseline_line(error: dict | None) -> Text:
    """How far to trust ``--whatif``'s predictions: the replay at the recorded settings
    against the recorded run (``predicted["baseline_error"]``)."""
    head = "predictions: vLLM's own scheduler replayed at each remedy's settings; "
    if not error or "figures" not in error:
        return Text(head + "no baseline comparison", style="dim")
    figs = ", ".join(f"{label} " + ("=" if e == 0 else "-" if e is None else signed_pct(e))
                     for label, e in error["figures"].items())
    if error.get("within"):
        return Text(head + f"at the recorded settings it matched the run within its thresholds ({figs})", style="dim")
    return Text(head + f"at the recorded settings it is off on {', '.join(error.get('off', []))} ({figs}): "
                "take those predicted figures as rough (docs/whatif.md)", style="yellow")


def _finding(f: Finding, run_dir: str) -> RenderableType:
    t = Table.grid(padding=(0, 1))
    t.add_column(no_wrap=True, style="dim", width=10)
    t.add_column(overflow="fold")
    head = Text.assemble((f" {SEVERITY_LABEL[f.severity]} ", SEVERITY_STYLE[f.severity]), "  ", (f.id, "bold"))
    rows: list[tuple[str, RenderableType]] = [("", Text(f.message))]
    for i, ev_line in enumerate(EVIDENCE.get(f.id, _generic)(f.evidence)):
        rows.append(("evidence" if i == 0 else "", Text(ev_line)))
    if "engine" in f.evidence:
        rows.append(("engine", Text(f"data-parallel rank {f.evidence['engine']}")))
    r = f.remedy
    if r is not None:
        rows.append(("remedy", Text.assemble((f"{r.setting} = {figure(r.value)}", "bold green"))))
        rows.append(("", Text(r.arithmetic)))
        for alt in r.alternatives:
            rows.append(("", Text.assemble(("or ", "dim"), (f"{alt['setting']} = {figure(alt['value'])}", "green"),
                                           f": {alt['arithmetic']}")))
        rows.append(("", Text.assemble(("trade-off: ", "dim"), r.tradeoff)))
        rows.append(("", Text.assemble(("source: ", "dim"), (r.source, "dim"))))
    if f.predicted:
        p = f.predicted
        if p.get("error"):
            rows.append(("predicted", Text(p["error"], style="yellow")))
        else:
            line = Text(predicted_text(p), style="bold")
            if p.get("resolved") is False:
                line.append("  " + unmet_goal_text(p), style="yellow")
            rows.append(("predicted", line))
            rows.append(("", Text(f"replayed: {p.get('run_dir')}", style="dim")))
    step = _first_step(f)
    if step is not None and f.id != "not-checked":
        rows.append(("see", Text(f"vllm-probe tail {run_dir} --replay --from-step {step}", style="dim")))
    for label, cell in rows:
        t.add_row(label, cell)
    return Group(head, t)


def _generic(e: dict) -> list[str]:
    return [" · ".join(f"{k} {v}" for k, v in e.items() if not isinstance(v, (dict, list)))] if e else []


def render_report(report: Report, width: int = 120) -> RenderableType:
    """The ``vllm-probe doctor`` report: a header, then each finding worst first."""
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
    replayed = next((f.predicted for f in report.findings if f.predicted and "baseline_error" in f.predicted), None)
    if replayed is not None:
        parts.append(baseline_line(replayed["baseline_error"]))
    shown = list(report.findings)
    serious = [f for f in shown if f.severity in (CRITICAL, WARNING)]
    if not serious:
        parts.append(Text("No finding above info: nothing held this run back beyond what its workload asked for.",
                          style="bold green"))
    for f in shown:
        parts.append(Text(""))
        parts.append(_finding(f, report.run_dir))
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
