"""The KV-cache arithmetic several rules share: the demand of the admitted requests at full
length against the usable blocks (:func:`kv_remedy`: preemption-storm, preemption-thrash and
kv-bound's fallback), the requests the cache holds to the end at once (:func:`seqs_cap`: a
ceiling for every remedy that raises ``max_num_seqs``), the mean request's blocks at full
length, and vLLM's own "Maximum concurrency" reading.

Blocks are KV-cache blocks of ``engine_config.block_size`` tokens; vLLM reserves block 0, so
a cache of ``num_kv_blocks`` has ``num_kv_blocks - 1`` usable (vllm/v1/core/block_pool.py).

**Per group.** A model's layers form KV-cache groups (``engine_config.kv_cache_group_specs``:
one full-attention group for most models; hybrid models such as Gemma 3 or gpt-oss add
sliding-window groups), and every group takes its blocks from the one pool: a request holds
blocks in each group at once (vLLM 0.32 ``HybridKVCacheCoordinator``,
``vllm/v1/core/kv_cache_coordinator.py``). A full-attention group holds ``⌈tokens / block⌉``; a
sliding-window group at most ``⌈min(window - 1 + tokens in flight, max_model_len) / block⌉ + 1``
(``SlidingWindowSpec.max_admission_blocks_per_request``, ``vllm/v1/kv_cache_interface.py``:
the blocks out of the window are freed as the request goes). The per-request figures here
(:func:`request_blocks`, :func:`pool_blocks`) sum the groups; with one full-attention group
they are the plain ``⌈tokens / block⌉``, so a run without hybrid groups reads as before. The
episodes count a request's blocks at full length in ``block_size`` units of one group
(:class:`~vllm_probe.analysis.episodes.EngineEpisodes`); :func:`pool_blocks` turns that into
pool blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..engine_state import EngineState
from ..episodes import EngineEpisodes
from .context import SRC_VLLM_PREEMPTION
from ..text import fmt_count
from .findings import Remedy


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


#: The spec kind of a sliding-window group (vLLM's class name, as engine_config records it).
SLIDING = "SlidingWindowSpec"


@dataclass(frozen=True)
class KVGroup:
    """One KV-cache group as ``engine_config.kv_cache_group_specs`` records it.

    Attributes:
        kind: vLLM's spec class (``FullAttentionSpec``, ``SlidingWindowSpec``, ...).
        block_size: tokens per block.
        sliding_window: tokens of the window (None: none, or a full-attention group that keeps it).
        layers: attention layers sharing the group's block table.
        blocks_per_request: blocks vLLM counts for one request of ``max_model_len`` tokens in
            this group (its start-up line's figure); None when not recorded.
    """

    kind: str
    block_size: int
    sliding_window: int | None = None
    layers: int = 1
    blocks_per_request: int | None = None

    @property
    def windowed(self) -> bool:
        """Blocks out of the window are freed (a ``SlidingWindowSpec`` group)."""
        return self.kind == SLIDING and bool(self.sliding_window)


def kv_groups(cfg: Any) -> list[KVGroup]:
    """The KV-cache groups of an ``engine_config`` record: the recorded ones, else one
    full-attention group of ``block_size`` (a run recorded before the groups were); empty
    when the block size is unknown."""
    specs = getattr(cfg, "kv_cache_group_specs", None) if cfg is not None else None
    out = []
    for g in specs or ():
        if isinstance(g, dict) and g.get("block_size"):
            out.append(KVGroup(str(g.get("kind")), int(g["block_size"]), g.get("sliding_window") or None,
                               int(g.get("layers") or 1), g.get("blocks_per_request")))
    if out:
        return out
    block = getattr(cfg, "block_size", None) if cfg is not None else None
    return [KVGroup("FullAttentionSpec", int(block))] if block else []


def hybrid(cfg: Any) -> bool:
    """Whether the KV cache is more than one full-attention group (several groups, or a
    sliding window): vLLM's per-request arithmetic then differs from ``⌈tokens / block⌉``."""
    groups = kv_groups(cfg)
    return len(groups) > 1 or any(g.windowed for g in groups)


def in_flight_tokens(cfg: Any) -> int:
    """Tokens scheduled but not yet settled, what a sliding-window group keeps beyond its
    window: ``VllmConfig.max_in_flight_tokens`` (vllm/config/vllm.py, 0.32) = concurrent
    batches (2 under async scheduling, else 1; pipeline parallelism is not recorded) ×
    ``max_num_batched_tokens``."""
    batches = 2 if getattr(cfg, "async_scheduling", False) else 1
    return batches * int(getattr(cfg, "max_num_batched_tokens", 0) or 0)


def group_blocks(g: KVGroup, cfg: Any, tokens: int, in_flight: int | None = None) -> int:
    """Blocks a request of ``tokens`` tokens holds at most in group ``g`` (see the module
    docstring): ``⌈tokens / block⌉``, for a sliding-window group at most its window's, with
    ``in_flight`` tokens beyond it (default :func:`in_flight_tokens`, what vLLM reserves;
    1 while the request decodes)."""
    full = _cdiv(tokens, g.block_size)
    if not g.windowed:
        return full
    held = g.sliding_window - 1 + (in_flight_tokens(cfg) if in_flight is None else in_flight)  # type: ignore[operator]
    if getattr(cfg, "max_model_len", None):
        held = min(held, cfg.max_model_len)
    return min(full, _cdiv(held, g.block_size) + 1)


def request_blocks(cfg: Any, tokens: int, in_flight: int | None = None) -> int:
    """Pool blocks a request of ``tokens`` tokens holds at most, summed over the groups
    (``in_flight``: see :func:`group_blocks`)."""
    return sum(group_blocks(g, cfg, tokens, in_flight) for g in kv_groups(cfg))


def pool_blocks(cfg: Any, blocks: int, in_flight: int | None = None) -> int:
    """A request's blocks at full length as the episodes count them (``block_size`` units of
    one group) in pool blocks over every group; ``blocks`` itself for one full-attention group
    (``in_flight``: see :func:`group_blocks`)."""
    if cfg is None or not hybrid(cfg):
        return blocks
    return request_blocks(cfg, blocks * int(cfg.block_size), in_flight)


def groups_text(cfg: Any) -> str:
    """The KV cache's groups in words, for the messages of hybrid models ("" for one
    full-attention group): ``4 KV-cache groups sharing the pool: 1 full-attention, 3
    sliding-window of 256 tokens``."""
    if cfg is None or not hybrid(cfg):
        return ""
    groups = kv_groups(cfg)
    kinds: dict[str, int] = {}
    for g in groups:
        key = f"sliding-window of {g.sliding_window:,} tokens" if g.windowed else (
            "full-attention" if g.kind == "FullAttentionSpec" else g.kind)
        kinds[key] = kinds.get(key, 0) + 1
    return f"{len(groups)} KV-cache groups sharing the pool: " + ", ".join(f"{n} {k}" for k, n in kinds.items())


def per_block_text(cfg: Any) -> str:
    """``128 tokens per block``, with the groups of a hybrid model (:func:`groups_text`)."""
    text = f"{cfg.block_size} tokens per block"
    groups = groups_text(cfg)
    return f"{text}, {groups}" if groups else text


def kv_remedy(eng: EngineState, ep: EngineEpisodes) -> Remedy | None:
    """Fewer running requests, or more KV blocks, from the KV demand the run reached.

    The demand is the blocks the admitted requests would hold at full length (prompt +
    ``max_tokens``, capped at ``max_model_len``; vLLM admits on the prompt alone, so
    this is what the cache must hold for them to finish without preemption). At its
    peak, ``n`` requests needed ``peak`` blocks: ``max_num_seqs = usable // (peak / n)``
    leads (when it is below the recorded ``max_num_seqs``), ``num_kv_blocks >= peak + 1``
    (vLLM reserves block 0) is the alternative: more blocks let admission take
    more requests, which outgrow the larger cache in turn (measured: 176 blocks
    needed at the peak, 181 given, still 40 preemptions of 64). When the peak fits
    (prefix-cache sharing, ``max_tokens`` unknown), ``max_num_seqs`` drops to the running
    queue left by the first preemption.
    """
    cfg = eng.config
    if cfg is None or not cfg.num_kv_blocks or not cfg.block_size:
        return None
    usable = cfg.num_kv_blocks - 1
    peak, n = pool_demand(cfg, ep, ep.peak_demand_blocks), ep.peak_running
    tradeoff = memory_cost(cfg) + "; a lower max_num_seqs caps concurrency and throughput"
    if peak > usable and n:
        per = peak / n
        sizes = [pool_blocks(cfg, b) for b, k in ep.full_blocks_seen.items() if k]
        each = f"{n} × {sizes[0]} blocks" if len(sizes) == 1 else f"{n} requests, {per:.1f} blocks each on average"
        seqs = max(int(usable // per), 1)
        blocks_text = (f"at step {ep.peak_step} the running requests needed {each} at full length (prompt + "
                       f"max_tokens, {per_block_text(cfg)}) = {fmt_count(peak)} blocks; the KV cache has "
                       f"{fmt_count(usable)} (+1 reserved) → num_kv_blocks ≥ {fmt_count(peak + 1)} "
                       f"({memory_advice(cfg, peak + 1)})")
        if cfg.max_num_seqs and seqs < cfg.max_num_seqs:
            return Remedy(
                "max_num_seqs", seqs,
                f"at step {ep.peak_step} the running requests needed {each} at full length (prompt + max_tokens, "
                f"{per_block_text(cfg)}) = {fmt_count(peak)} blocks against {fmt_count(usable)} usable: "
                f"{fmt_count(usable)} // {per:.1f} blocks per request = {seqs} run to the end without preemption → "
                f"max_num_seqs {seqs}",
                tradeoff, SRC_VLLM_PREEMPTION, whatif={"max_num_seqs": seqs},
                alternatives=[{"setting": "num_kv_blocks", "value": peak + 1,
                               "whatif": {"num_kv_blocks": peak + 1},
                               "arithmetic": blocks_text + "; more blocks also let admission take more requests, "
                                             "which can outgrow the cache again (check with --whatif)"}])
        return Remedy(
            "num_kv_blocks", peak + 1, blocks_text,
            tradeoff, SRC_VLLM_PREEMPTION, whatif={"num_kv_blocks": peak + 1})
    if ep.first_preempt is not None:
        step, running = ep.first_preempt
        seqs = max(running, 1)
        return Remedy(
            "max_num_seqs", seqs,
            f"the first preemption (step {step}) left {running} running: that many fit the KV cache of "
            f"{fmt_count(usable)} blocks → max_num_seqs {seqs}",
            tradeoff, SRC_VLLM_PREEMPTION, whatif={"max_num_seqs": seqs})
    return None


#: Bytes in the GiB ``VLLM_CPU_KVCACHE_SPACE`` is given in (vllm/envs.py, 0.32).
GIB = 1 << 30


def memory_advice(cfg: Any, blocks: int) -> str:
    """How to get ``blocks`` KV blocks on the recorded platform, one phrase: on the CPU
    backend the KV cache is sized by ``VLLM_CPU_KVCACHE_SPACE`` (GiB; vllm/platforms/cpu.py,
    0.32: ``gpu_memory_utilization`` there is a share of the machine's memory, and 0.9 fails
    at start-up), elsewhere by ``gpu_memory_utilization``; ``num_gpu_blocks_override`` sets
    the count directly on either."""
    direct = f"--num-gpu-blocks-override {blocks}"
    if cfg is not None and str(getattr(cfg, "platform", "") or "").lower() == "cpu":
        per = getattr(cfg, "kv_block_bytes", None)
        if per:
            gib = -(-blocks * per // GIB)
            return (f"{direct}, or on the CPU backend VLLM_CPU_KVCACHE_SPACE={gib} (GiB: {fmt_count(blocks)} blocks "
                    f"× {fmt_count(per)} bytes)")
        return f"{direct} (the CPU backend sizes its KV cache from VLLM_CPU_KVCACHE_SPACE)"
    return f"{direct}, or raise gpu_memory_utilization until vLLM reports that many blocks"


def memory_cost(cfg: Any) -> str:
    """What more KV blocks cost on the recorded platform, one phrase."""
    if cfg is not None and str(getattr(cfg, "platform", "") or "").lower() == "cpu":
        return "more KV blocks take the CPU's memory (VLLM_CPU_KVCACHE_SPACE)"
    return "more KV blocks take device memory (gpu_memory_utilization: less headroom for activations)"


def seqs_cap(eng: EngineState, ep: EngineEpisodes) -> int | None:
    """The requests the KV cache holds at once at full length (prompt + max_tokens): usable
    blocks // the largest request's blocks at full length (pool blocks over every group);
    None when unknown."""
    cfg = eng.config
    if cfg is None or not cfg.num_kv_blocks or not ep.full_blocks_max:
        return None
    cap: int = max((cfg.num_kv_blocks - 1) // pool_blocks(cfg, ep.full_blocks_max), 1)
    return cap


def mean_full_blocks(ep: EngineEpisodes, cfg: Any = None, in_flight: int | None = None) -> float | None:
    """The mean blocks of the admitted requests at full length (prompt + max_tokens), in pool
    blocks over every KV-cache group of ``cfg`` (the engine_config record; None: as the
    episodes count them, one group; ``in_flight``: see :func:`group_blocks`); None when none
    was seen."""
    n = sum(ep.full_blocks_seen.values())
    return sum(pool_blocks(cfg, b, in_flight) * k for b, k in ep.full_blocks_seen.items()) / n if n else None


def pool_demand(cfg: Any, ep: EngineEpisodes, blocks: int) -> int:
    """A demand the episodes summed in one group's blocks (e.g. ``peak_demand_blocks``) in
    pool blocks: scaled by the admitted requests' pool blocks per one-group block (the same
    requests' mix); ``blocks`` itself for one full-attention group."""
    if cfg is None or not hybrid(cfg) or not blocks:
        return blocks
    one = sum(b * k for b, k in ep.full_blocks_seen.items())
    pool = sum(pool_blocks(cfg, b) * k for b, k in ep.full_blocks_seen.items())
    return _cdiv(blocks * pool, one) if one else blocks


def blocks_per_request(cfg: Any) -> list[int] | None:
    """Each group's blocks for one request of ``max_model_len`` tokens, as vLLM's start-up
    line counts them: the recorded ``blocks_per_request``, else :func:`group_blocks` at
    ``max_model_len``; None when the groups or ``max_model_len`` are unknown."""
    groups = kv_groups(cfg)
    if not groups or not getattr(cfg, "max_model_len", None):
        return None
    return [g.blocks_per_request if g.blocks_per_request else group_blocks(g, cfg, cfg.max_model_len) for g in groups]


def vllm_concurrency(cfg: Any) -> float | None:
    """vLLM's start-up "Maximum concurrency for N tokens per request: Xx" (``N`` =
    ``max_model_len``): the recorded figure (``engine_config.kv_max_concurrency``), else
    ``num_kv_blocks`` / the groups' blocks for one request of ``N`` tokens summed
    (:func:`blocks_per_request`; ``get_max_concurrency_for_kv_cache_config``,
    vllm/v1/core/kv_cache_utils.py 0.32: the whole pool, block 0 included, over what one
    request takes in every group); ``cfg``: the engine_config record; None when unknown."""
    if cfg is None:
        return None
    recorded = getattr(cfg, "kv_max_concurrency", None)
    if recorded:
        return float(recorded)
    per = blocks_per_request(cfg)
    if per and sum(per) and cfg.num_kv_blocks:
        ratio: float = cfg.num_kv_blocks / sum(per)
        return ratio
    return None
