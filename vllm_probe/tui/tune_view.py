"""The ``vllm-probe tune`` report: how far to trust the replay (the baseline's error), what
was evaluated against the SLOs, and the recommendation with the flags to apply; or,
when nothing in range meets the SLOs, the closest setting and what it would take.

Lays out :meth:`vllm_probe.advice.tune.TuneResult.to_dict` (figures by
:mod:`vllm_probe.analysis.objectives` names); computes nothing.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..analysis.catalogue import label_of
from ..analysis.objectives import objective
from .format import signed_pct, with_range
from .whatif_view import outside_line, step_time_model_line

#: Evaluated settings shown (the best first); --json has them all.
SHOWN = 20


def _fig(name: str, v: Any, intervals: dict[str, Any] | None = None) -> str:
    unit = objective(name).unit
    iv = (intervals or {}).get(name) or {}
    return with_range(v, iv.get("lo"), iv.get("hi"), "s" if unit == "s" else "")


def _settings(s: dict[str, Any]) -> str:
    return ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in s.items()) or "recorded"


def _outside(d: dict[str, Any]) -> Text | None:
    """The share of steps outside the model's fitted region: the baseline's, the
    recommended (or closest) setting's and the largest among the evaluated."""
    pick = d.get("recommended") or d.get("closest")
    evaluated = [p.get("outside_region") for p in d["evaluated"] if p.get("outside_region") is not None]
    shares = [("baseline", d["baseline"].get("outside_region"))]
    if pick is not None:
        shares.append(("recommended" if d.get("recommended") else "closest", pick.get("outside_region")))
    if evaluated:
        shares.append(("largest of the evaluated", max(evaluated)))
    return outside_line(shares)


def render(d: dict[str, Any]) -> RenderableType:
    """The report of one ``tune`` result (its ``to_dict()``)."""
    obj = d["objective"]["figure"]
    slo_names = [s["figure"] for s in d["slo"]]
    parts: list[RenderableType] = [Text.assemble(("vllm-probe tune ", "bold"), (d["source"], "cyan"))]
    slo_text = ", ".join(f"{s['figure']} {s['op']} {_fig(s['figure'], s['value'])}" for s in d["slo"]) or "none"
    parts.append(Text(f"SLOs: {slo_text} · {d['objective']['direction']} {obj} · knobs: "
                      + "; ".join(f"{k['setting']} {k['values']}" for k in d["knobs"]), style="dim"))
    err = d["baseline"]["error"]
    figs = ", ".join(f"{label_of(name)} " + ("-" if row.get("error") is None else signed_pct(row["error"]))
                     for name, row in err.get("figures", {}).items())
    trust = ("the replay at the recorded settings matched the run within its thresholds" if err.get("within")
             else "the replay at the recorded settings is off its thresholds: take the predicted figures as rough")
    parts.append(Text(f"baseline: {trust} ({figs})", style="dim" if err.get("within") else "yellow"))
    model = step_time_model_line(d.get("step_time_model"))
    if model is not None:
        parts.append(model)
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("settings")
    for name in dict.fromkeys(slo_names + [obj]):
        t.add_column(name, justify="right")
    t.add_column("meets")
    names = list(dict.fromkeys(slo_names + [obj]))
    t.add_row("recorded run", *[_fig(n, d["baseline"]["recorded"].get(n)) for n in names], "", style="dim")
    t.add_row("replayed at recorded", *[_fig(n, d["baseline"]["replayed"].get(n), d["baseline"].get("intervals"))
                                        for n in names], "", style="dim")
    shown = sorted(d["evaluated"], key=lambda p: (not p["meets"], "error" in p))[:SHOWN]
    for p in shown:
        if "error" in p:
            t.add_row(_settings(p["settings"]), *["" for _ in names], Text(p["error"][:60], style="red"))
            continue
        meets = (Text("yes", style="green") if p.get("meets_within_intervals", p["meets"]) else
                 Text("likely", style="yellow") if p["meets"] else Text("no", style="yellow"))
        t.add_row(_settings(p["settings"]), *[_fig(n, p["summary"].get(n), p.get("intervals")) for n in names], meets)
    parts.append(t)
    if any(p["meets"] and not p.get("meets_within_intervals", True) for p in d["evaluated"]):
        parts.append(Text("likely: meets the SLOs at its predicted value, not across its whole interval (the "
                          "machine's speed may take it past)", style="dim"))
    outside = _outside(d)
    if outside is not None:
        parts.append(outside)
    s = d["search"]
    parts.append(Text(f"{s['method']}: {s['replays']} replays in {s['rounds']} rounds, {s['seconds']:.1f} s"
                      + ("" if s["complete"] else " (stopped at its time budget)"), style="dim"))
    rec = d["recommended"]
    if rec is not None:
        parts.append(Text.assemble(("recommended: ", "bold green"), _settings(rec["settings"])))
        applied = " ".join(rec["flags"]) or "none (the recorded settings already meet the SLOs)"
        parts.append(Text("  flags: " + applied))
        parts.append(Text("  " + rec["serve"], style="cyan"))
    else:
        c = d.get("closest")
        parts.append(Text("no setting in range meets the SLOs", style="bold yellow"))
        if c:
            parts.append(Text(f"  closest: {_settings(c['settings'])}"))
            for line in c.get("would_take", []):
                parts.append(Text("  " + line))
    for n in d.get("notes", []):
        parts.append(Text("note: " + n, style="dim"))
    return Group(*parts)
