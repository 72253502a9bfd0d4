"""The doctor's catalogue: one rule per file, one line per rule here, in report order.

Each file of this package holds one whole rule (:class:`~vllm_probe.analysis.doctor.rule.Rule`,
its module's ``RULE``): its mechanism in vLLM's code, its thresholds with their sources,
``evaluate`` (the run's state and episodes → findings with typed evidence), its goal and
knobs (what ``advice/`` searches), the remedy arithmetic and the lines a view shows.
``python -m vllm_probe.analysis.doctor.rules`` prints docs/doctor.md's rule reference.

Every rule reads the one state (:class:`~vllm_probe.analysis.state.RunState`), its timeline
and the :class:`~vllm_probe.analysis.episodes.Episodes` that followed it, so the same rules
run on a finished run (``vllm-probe doctor``) and on the live state (the dashboard's
findings panel). Rules run per engine core; with several data-parallel ranks each finding's
evidence names its ``engine``.
"""

from __future__ import annotations

from ..rule import Rule
from . import (
    budget_bound, chunking_without_benefit, config_not_applied, head_of_line_blocking, held_slots, kv_bound,
    max_concurrency, not_checked, preemption_storm, preemption_thrash, priority_slot_wait, seqs_bound, stall,
    underloaded, unexplained_wait,
)

#: The rules in report order (and in evaluation order: unexplained-wait reads what the rules
#: before it explained; not-checked is last, the others note what they could not check).
CATALOGUE: tuple[Rule, ...] = (
    stall.RULE,
    preemption_thrash.RULE,
    preemption_storm.RULE,
    head_of_line_blocking.RULE,
    kv_bound.RULE,
    seqs_bound.RULE,
    budget_bound.RULE,
    held_slots.RULE,
    config_not_applied.RULE,
    chunking_without_benefit.RULE,
    priority_slot_wait.RULE,
    unexplained_wait.RULE,
    underloaded.RULE,
    max_concurrency.RULE,
    not_checked.RULE,
)

#: The rules by finding id.
RULES: dict[str, Rule] = {r.id: r for r in CATALOGUE}
#: Every finding id, in report order (a public interface).
FINDING_IDS: tuple[str, ...] = tuple(r.id for r in CATALOGUE)
#: The findings that name the limit that held requests back (``Rule.wait == "explains"``).
EXPLAINS_WAITS: tuple[str, ...] = tuple(r.id for r in CATALOGUE if r.wait == "explains")
#: The findings that say requests were held back, explained or not (``underloaded`` is
#: dropped beside them).
HELD_BACK: tuple[str, ...] = tuple(r.id for r in CATALOGUE if r.wait is not None)

__all__ = ["CATALOGUE", "EXPLAINS_WAITS", "FINDING_IDS", "HELD_BACK", "RULES"]
