"""What a recording says of the model that the replay's scheduler must have too: its KV-cache
groups (sliding-window layers) and its speculative decoding.

**KV-cache groups.** ``engine_config.kv_cache_group_specs`` records each group's kind, window
and layers; :func:`as_recorded` hands them to the harness
(:attr:`~vllm_probe.sim.harness.SchedulerSpec.kv_groups`), which builds the same groups on one
pool of blocks, so vLLM's own KV-cache manager (``HybridKVCacheCoordinator``,
``SlidingWindowManager``: vllm/v1/core/, 0.32) allocates and frees as the recorded one did.

**Speculative decoding.** A replay has no drafter and no model: :class:`Drafts` gives each
request, after each step that ran it (``EngineCore.post_step`` calls
``update_draft_token_ids`` there, vllm/v1/engine/core.py 0.32), the drafts recorded at its
current output position (``request_finished.draft_verifications``), and the fake model accepts
as many as recorded. The scheduler then spends the same draft slots of the token budget
(``Request.num_tokens_with_spec``: a decode with ``k`` drafts takes ``1 + k`` tokens of
``max_num_scheduled_tokens``), allocates the same KV slots (what preempts), and rolls the
rejected drafts back itself (``update_from_output``). Exact at the recorded settings without
async scheduling; at another token budget a step may fit fewer drafts than recorded, and the
recorded acceptance is then capped at what was scheduled.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..analysis.workload import Workload
from .harness import SchedulerSpec

#: The group kinds the harness builds as they are (others are built as full attention).
REBUILT_KINDS = ("FullAttentionSpec", "SlidingWindowSpec")


def as_recorded(spec: SchedulerSpec, config: dict[str, Any]) -> SchedulerSpec:
    """``spec`` with what the recording's ``engine_config`` says of the model where the spec
    leaves it open: its KV-cache groups (``kv_cache_group_specs``, when they are more than one
    full-attention group; each built with the spec's block size) and its draft tokens per step
    (``num_speculative_tokens``: the scheduler then pads a first decode step's drafts as the
    recorded one did)."""
    changes: dict[str, Any] = {}
    groups = config.get("kv_cache_group_specs")
    if spec.kv_groups is None and groups and (len(groups) > 1 or any(
            g.get("kind") != "FullAttentionSpec" for g in groups)):
        changes["kv_groups"] = [dict(g) for g in groups]
    if not spec.num_speculative_tokens and config.get("num_speculative_tokens"):
        changes["num_speculative_tokens"] = int(config["num_speculative_tokens"])
    return dataclasses.replace(spec, **changes) if changes else spec


def verification(text: str) -> tuple[int, int, int, int] | None:
    """One ``request_finished.draft_verifications`` entry, ``"index:proposed:accepted[:slots]"``,
    as ``(output index, proposed, accepted, draft slots)`` (accepted -1: dropped unverified by a
    preemption; slots: the proposed ones unless the drafter padded); None when malformed."""
    try:
        parts = [int(x) for x in text.split(":")]
    except (AttributeError, ValueError):
        return None
    if len(parts) not in (3, 4):
        return None
    return parts[0], parts[1], parts[2], parts[3] if len(parts) == 4 else parts[1]


class Drafts:
    """The recorded drafts of a replay's requests: request -> {output index: (proposed,
    accepted, draft slots)} (``accepted`` -1: a preemption dropped them unverified).
    False when nothing is to be proposed."""

    def __init__(self, by_request: dict[str, dict[int, tuple[int, int, int]]], token: int) -> None:
        self.by_request = by_request
        self.token = token

    @classmethod
    def of(cls, w: Workload, spec: SchedulerSpec, token: int) -> Drafts:
        """The drafts of ``w``'s requests when ``spec`` has speculative decoding (draft token id
        ``token``: the scheduler only counts them)."""
        out: dict[str, dict[int, tuple[int, int, int]]] = {}
        if spec.num_speculative_tokens:
            for r in w.requests:
                entries = [v for v in map(verification, r.draft_verifications or ()) if v is not None]
                if entries:
                    out[r.req_id] = {i: (p, a, s) for i, p, a, s in entries}
        return cls(out, token)

    def __bool__(self) -> bool:
        return bool(self.by_request)

    def accepted(self, rid: str, index: int, drafts: int) -> int:
        """Draft tokens the fake model accepts of the ``drafts`` request ``rid`` proposed at
        output ``index``: the recorded count there (never more than were proposed), else 0."""
        v = self.by_request.get(rid, {}).get(index)
        return max(min(v[1], drafts), 0) if v is not None else 0

    def propose(self, sched: Any, out: Any) -> None:
        """The drafter's turn after a step's output: each request of the step still running
        gets, at its current output position, the drafts recorded there (the recorded slots:
        ``-1`` padding where the recorded drafter padded), none where nothing was recorded."""
        from vllm.v1.outputs import DraftTokenIds

        ids, drafts = [], []
        requests = sched.requests
        for rid in out.num_scheduled_tokens:
            plan = self.by_request.get(rid)
            req = requests.get(rid) if plan else None
            if req is None or plan is None:
                continue
            v = plan.get(req.num_output_tokens)
            if v is not None:
                proposed, _, slots = v
                ids.append(rid)
                drafts.append([self.token] * proposed + [-1] * max(slots - proposed, 0))
        if ids:
            sched.update_draft_token_ids(DraftTokenIds(ids, drafts))


def notes(w: Workload) -> list[str]:
    """What the replay assumes about the model's KV-cache groups and speculative decoding,
    one line each (part of :func:`vllm_probe.sim.plan.notes_of`)."""
    cfg = w.config
    out = []
    groups = cfg.get("kv_cache_groups") or []
    specs = cfg.get("kv_cache_group_specs") or []
    if len(groups) > 1 or any(g != "FullAttentionSpec" for g in groups):
        other = sorted({str(g.get("kind")) for g in specs} - set(REBUILT_KINDS))
        if not specs:
            out.append(f"the model's KV cache has groups {groups} but engine_config has no kv_cache_group_specs "
                       "(an older probe): the replay builds one full-attention group, so KV accounting is "
                       "approximate")
        elif other:
            out.append(f"the model's KV cache has groups of kind {', '.join(other)}: the replay builds them as "
                       "full-attention groups (only full-attention and sliding-window groups are rebuilt as they "
                       "are), so KV accounting is approximate")
        else:
            out.append(f"the model's KV cache has {len(specs)} groups ({_groups_text(specs)}): the replay builds "
                       "the same groups on one pool of blocks, vLLM's own KV-cache manager freeing what leaves "
                       "each window")
    k = cfg.get("num_speculative_tokens")
    if k:
        out += _spec_notes(w, int(k))
    return out


def _spec_notes(w: Workload, k: int) -> list[str]:
    cfg = w.config
    method = cfg.get("speculative_method")
    verified = [r for r in w.requests if r.draft_verifications]
    out = []
    if not verified:
        out.append(f"speculative decoding ({k} draft tokens) was on but request_finished has no "
                   "draft_verifications (an older probe, or no draft was ever verified): the replay reserves and "
                   "pads draft slots as vLLM does but proposes no draft, so every output token takes a step")
    else:
        accepted = sum(max(v[2], 0) for r in verified for v in map(verification, r.draft_verifications or ())
                       if v is not None)
        out.append(f"speculative decoding ({k} draft tokens, {method or 'method unknown'}): each request gets the "
                   f"drafts recorded at the same output positions and accepts as many as recorded ({accepted:,} "
                   f"accepted tokens over {len(verified):,} requests); draft tokens take token-budget slots beside "
                   "each decode, so at another budget the drafts a step fits differ")
    if method not in (None, "ngram"):
        out.append(f"speculative method {method}: the replay's scheduler reserves no extra drafting slot per "
                   "request (SpeculativeConfig.max_num_new_slots_for_drafting of an n-gram proposer, 0); a draft "
                   "model reserves 1, parallel drafting more")
    if cfg.get("scheduler_class") == "AsyncScheduler":
        out.append("speculative decoding under AsyncScheduler: the replay proposes no drafts (the engine fills "
                   "them into a step already scheduled); only runs without async scheduling replay their drafts")
    return out


def _groups_text(specs: list[dict[str, Any]]) -> str:
    """The KV-cache groups as a note names them, equal groups counted:
    ``3 × sliding window 256 tokens, 1 layer; 1 × full attention, 1 layer``."""
    kinds: dict[str, int] = {}
    for g in specs:
        kind = (f"sliding window {g.get('sliding_window')} tokens" if g.get("kind") == "SlidingWindowSpec"
                else "full attention")
        layers = g.get("layers") or 1
        key = f"{kind}, {layers} layer{'s' if layers != 1 else ''}"
        kinds[key] = kinds.get(key, 0) + 1
    return "; ".join(f"{n} × {k}" for k, n in kinds.items())
