"""``max-concurrency`` (info): vLLM's start-up line "Maximum concurrency for N tokens per request:
X×" read with the run's own KV cache per request, on a model whose KV cache is more than one
full-attention group (sliding-window layers: Gemma 3, gpt-oss, Mistral-style windows).

vLLM counts, for one request of ``max_model_len`` tokens, the blocks it takes in every KV-cache
group, and divides the pool by their sum; a sliding-window group holds only its window (plus the
tokens in flight), so X is neither ``num_kv_blocks / (N / block_size)`` (every group takes its
blocks from the same pool) nor what the same memory would give a model whose every layer
attends fully. The run's own requests (prompt + ``max_tokens``) are what the cache holds to the
end at once.
"""

from __future__ import annotations

import msgspec

from ..context import Context, cdiv, engine_of, engines_of, rounded
from ...text import fmt_count, fmt_count_or, fmt_figure
from ..evidence import Evidence
from ..findings import INFO, Finding, evidence_of
from ..kv import KVGroup, blocks_per_request, hybrid, in_flight_tokens, kv_groups, mean_full_blocks, vllm_concurrency
from ..rule import Rule

class GroupBlocks(msgspec.Struct):
    """One KV-cache group's share of a request of ``max_model_len`` tokens.

    Attributes:
        kind: vLLM's spec class (``FullAttentionSpec``, ``SlidingWindowSpec``, ...).
        sliding_window: the window in tokens (null: none).
        layers: attention layers sharing the group's block table.
        blocks_per_request: blocks vLLM counts for one request of ``max_model_len`` tokens in
            this group (a sliding-window group: ⌈min(window - 1 + tokens in flight,
            max_model_len) / block⌉ + 1).
    """

    kind: str
    sliding_window: int | None
    layers: int
    blocks_per_request: int


class MaxConcurrencyEvidence(Evidence, kw_only=True):
    """``max-concurrency``: vLLM's start-up figure and the arithmetic behind it.

    Attributes:
        vllm_max_concurrency: vLLM's "Maximum concurrency for N tokens per request: X×" (X, as
            printed: two decimals).
        max_model_len: N, the tokens per request the line assumes.
        num_kv_blocks: blocks of the pool every group takes from (block 0 included, as vLLM counts).
        block_size: tokens per block.
        tokens_in_flight: tokens scheduled but not yet settled that a sliding-window group keeps
            beyond its window (max_num_batched_tokens × concurrent batches).
        groups: each KV-cache group's blocks for one request of N tokens.
        blocks_per_request: their sum: the pool blocks one request of N tokens takes.
        blocks_over_length: num_kv_blocks / ⌈N / block_size⌉: the line misread as if one group
            held the whole request (every group takes its blocks from the same pool).
        full_attention_same_memory: what the line would say for the same memory if every layer
            attended to the whole request (pool blocks × the layers one block spans / all the
            layers, over ⌈N / block_size⌉).
        run_blocks_per_request: the pool blocks this run's admitted requests take at full length
            (prompt + max_tokens) as vLLM reserves them (each window with the tokens in flight), on
            average; null when no request was admitted.
        concurrency_at_run_lengths: the requests of this run's lengths the cache holds to the end
            at once so reserved ((num_kv_blocks - 1) // run_blocks_per_request); null when unknown.
        run_blocks_decoding: the same requests' blocks while they decode (each window ⌈window /
            block⌉ + 1 blocks: one token in flight); null when unknown.
        concurrency_decoding: the requests of this run's lengths the cache holds while they all
            decode ((num_kv_blocks - 1) // run_blocks_decoding); null when unknown.
        running_max: the most requests that ran at once in this run.
    """

    vllm_max_concurrency: float
    max_model_len: int
    num_kv_blocks: int
    block_size: int
    tokens_in_flight: int
    groups: list[GroupBlocks]
    blocks_per_request: int
    blocks_over_length: float
    full_attention_same_memory: float
    run_blocks_per_request: float | None
    concurrency_at_run_lengths: int | None
    run_blocks_decoding: float | None
    concurrency_decoding: int | None
    running_max: int


def evaluate(ctx: Context) -> list[Finding]:
    """Each engine core whose KV cache has sliding-window or several groups, with vLLM's figure
    worked out from its groups."""
    out = []
    for eng, ep in engines_of(ctx):
        cfg = eng.config
        if cfg is None or not hybrid(cfg) or not cfg.num_kv_blocks or not cfg.max_model_len:
            continue
        groups, per = kv_groups(cfg), blocks_per_request(cfg)
        x = vllm_concurrency(cfg)
        if per is None or x is None or not sum(per):
            continue
        n, blocks, block = cfg.max_model_len, cfg.num_kv_blocks, groups[0].block_size
        total = sum(per)
        naive = blocks / cdiv(n, block)
        slots = max(g.layers for g in groups)  # layers one pool block spans (vLLM pads groups to one size)
        same_memory = blocks * slots / sum(g.layers for g in groups) / cdiv(n, block)
        run, decoding = mean_full_blocks(ep, cfg), mean_full_blocks(ep, cfg, in_flight=1)
        at_run = int((blocks - 1) // run) if run else None
        at_decode = int((blocks - 1) // decoding) if decoding else None
        running = max((r for r, _ in eng.queue_steps), default=0)
        parts = _parts(groups, per)
        where = f"each of the KV cache's {len(groups)} groups" if len(groups) > 1 else "the KV cache's one group"
        msg = (f"vLLM's start-up line \"Maximum concurrency for {fmt_count(n)} tokens per request: {x:.2f}x\" "
               f"counts one request of {fmt_count(n)} tokens in {where}: {parts} = {fmt_count(total)} of the "
               f"pool's {fmt_count(blocks)} blocks of {block} tokens, and {fmt_count(blocks)} / {fmt_count(total)} "
               f"= {blocks / total:.2f}")
        if f"{blocks / total:.2f}" != f"{x:.2f}":  # vLLM's own figure (recorded) counts something more
            msg += (f" (vLLM's own figure, {x:.2f}x, counts more than these groups: pipeline stages or a "
                    "host-resident pool, which the probe does not record)")
        if len(groups) > 1 and naive > x:
            msg += (f"; every group takes its blocks from the one pool, so {fmt_count(blocks)} / "
                    f"⌈{fmt_count(n)} / {block}⌉ = {naive:.2f}x, one group's reading, overstates it")
        if x > same_memory:
            msg += (f"; the same memory would hold {same_memory:.2f}x if every layer attended to the whole request: "
                    f"the sliding windows raise it to {x:.2f}x")
        if run is not None and at_run is not None and decoding is not None and at_decode is not None:
            msg += (f"; this run's requests (prompt + max_tokens) take {run:.1f} blocks each as vLLM reserves them "
                    f"(each window with {fmt_count(in_flight_tokens(cfg))} tokens in flight): the cache holds "
                    f"{fmt_count(at_run)} of them to the end at once; decoding they hold {decoding:.1f}: "
                    f"{fmt_count(at_decode)} at once; {fmt_count(running)} ran at once")
        out.append(Finding("max-concurrency", INFO, msg, MaxConcurrencyEvidence(
            engine=engine_of(ctx, eng), vllm_max_concurrency=round(x, 2), max_model_len=n, num_kv_blocks=blocks,
            block_size=block, tokens_in_flight=in_flight_tokens(cfg),
            groups=[GroupBlocks(g.kind, g.sliding_window, g.layers, b) for g, b in zip(groups, per)],
            blocks_per_request=total, blocks_over_length=round(naive, 2),
            full_attention_same_memory=round(same_memory, 2), run_blocks_per_request=rounded(run, 2),
            concurrency_at_run_lengths=at_run, run_blocks_decoding=rounded(decoding, 2),
            concurrency_decoding=at_decode, running_max=running)))
    return out


def _parts(groups: list[KVGroup], per: list[int]) -> str:
    """The groups' blocks in words, equal groups counted: ``8 (full attention) + 3 × 5
    (sliding window of 256 tokens)``."""
    counted: dict[tuple[str, int], int] = {}
    for g, b in zip(groups, per):
        what = f"sliding window of {g.sliding_window:,} tokens" if g.windowed else (
            "full attention" if g.kind == "FullAttentionSpec" else g.kind)
        counted[(what, b)] = counted.get((what, b), 0) + 1
    return " + ".join(f"{b} ({what})" if k == 1 else f"{k} × {b} ({what})" for (what, b), k in counted.items())


def view(f: Finding) -> list[str]:
    """vLLM's figure, the groups' blocks behind it, and the run's own reading."""
    e = evidence_of(f, MaxConcurrencyEvidence)
    groups = " + ".join(f"{g.blocks_per_request}" for g in e.groups)
    return [f"{fmt_figure(e.vllm_max_concurrency)}x = {fmt_count(e.num_kv_blocks)} blocks / ({groups}) per request "
            f"of {fmt_count(e.max_model_len)} tokens · not {fmt_figure(e.blocks_over_length)}x (one group) · "
            f"{fmt_figure(e.full_attention_same_memory)}x with full attention everywhere",
            f"this run: {fmt_figure(e.run_blocks_per_request)} blocks per request reserved → "
            f"{fmt_count_or(e.concurrency_at_run_lengths)} at once · {fmt_figure(e.run_blocks_decoding)} decoding → "
            f"{fmt_count_or(e.concurrency_decoding)} · ran {fmt_count(e.running_max)} at once"]


RULE = Rule(
    "max-concurrency",
    "vLLM's start-up line \"Maximum concurrency for N tokens per request: X×\" is the pool of "
    "KV blocks over the blocks one request of max_model_len tokens takes in every KV-cache group "
    "(vLLM 0.32 get_max_concurrency_for_kv_cache_config, vllm/v1/core/kv_cache_utils.py): every "
    "group takes its blocks from the one pool, and a sliding-window group holds only its window "
    "plus the tokens in flight (SlidingWindowSpec.max_admission_blocks_per_request), so on a hybrid "
    "model X is neither blocks / (N / block_size) nor the full-attention figure; the run's own "
    "requests say what the cache holds at once.",
    evaluate,
    MaxConcurrencyEvidence,
    view=view, severity=(INFO,))
