"""``not-checked`` (info, always last): what the run's data could not support — events
switched off, an older probe without ``head_blocked_by``, or events the probe dropped. The
rules before it note what they could not check (:attr:`Context.not_checked`).
"""

from __future__ import annotations


from ..context import Context, wrote
from ..evidence import Evidence
from ..findings import INFO, Finding
from ..rule import Rule

class NotCheckedEvidence(Evidence, kw_only=True):
    """``not-checked``: what the run's data could not support.

    Attributes:
        rules: rule id (or ``all``, ``head_blocked_by``) -> why it was not checked.
    """

    rules: dict[str, str]


def evaluate(ctx: Context) -> list[Finding]:
    """What the run's data could not support (flags off, an older probe, lost events)."""
    for eng in ctx.state.engines.values():
        if not wrote(eng, "log_schedule_each_step"):
            for rid in ("kv-bound", "budget-bound", "seqs-bound", "stall", "underloaded", "chunking-without-benefit",
                        "head-of-line-blocking", "held-slots"):
                ctx.not_checked.setdefault(rid, "step events are off (scheduler_probe.log_schedule_each_step)")
        if not wrote(eng, "log_chunk_boundaries"):
            ctx.not_checked.setdefault("chunking-without-benefit",
                                       "chunk events are off (scheduler_probe.log_chunk_boundaries)")
        if eng.events_dropped or eng.hooks_disabled:
            ctx.not_checked.setdefault(
                "all", f"the probe lost {eng.events_dropped} events"
                + (f" and switched off {', '.join(eng.hooks_disabled)}" if eng.hooks_disabled else "")
                + ": counts may be low")
    if not ctx.not_checked:
        return []
    by_why: dict[str, list[str]] = {}
    for rule_id, why in ctx.not_checked.items():
        by_why.setdefault(why, []).append(rule_id)
    return [Finding("not-checked", INFO, "Not checked: " + "; ".join(f"{', '.join(ids)}: {why}"
                                                                     for why, ids in by_why.items()),
                    NotCheckedEvidence(rules=dict(ctx.not_checked)))]


RULE = Rule(
    "not-checked",
    "What the run's data could not support: events switched off, an older probe without "
    "head_blocked_by, or events the probe dropped.",
    evaluate,
    NotCheckedEvidence,
    severity=(INFO,))
