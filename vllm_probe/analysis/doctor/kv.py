"""The KV-cache arithmetic several rules share: the demand of the admitted requests at full
length against the usable blocks (:func:`kv_remedy`: preemption-storm, preemption-thrash and
kv-bound's fallback), the requests the cache holds to the end at once (:func:`seqs_cap`: a
ceiling for every remedy that raises ``max_num_seqs``), the mean request's blocks at full
length, and vLLM's own "Maximum concurrency" reading.

Blocks are KV-cache blocks of ``engine_config.block_size`` tokens; vLLM reserves block 0, so
a cache of ``num_kv_blocks`` has ``num_kv_blocks - 1`` usable (vllm/v1/core/block_pool.py).
"""

from __future__ import annotations

from typing import Any

from ..engine_state import EngineState
from ..episodes import EngineEpisodes
from .context import SRC_VLLM_PREEMPTION
from ..text import fmt_count
from .findings import Remedy


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
    peak, n = ep.peak_demand_blocks, ep.peak_running
    tradeoff = memory_cost(cfg) + "; a lower max_num_seqs caps concurrency and throughput"
    if peak > usable and n:
        per = peak / n
        sizes = [b for b, k in ep.full_blocks_seen.items() if k]
        each = f"{n} × {sizes[0]} blocks" if len(sizes) == 1 else f"{n} requests, {per:.1f} blocks each on average"
        seqs = max(int(usable // per), 1)
        blocks_text = (f"at step {ep.peak_step} the running requests needed {each} at full length (prompt + "
                       f"max_tokens, {cfg.block_size} tokens per block) = {fmt_count(peak)} blocks; the KV cache has "
                       f"{fmt_count(usable)} (+1 reserved) → num_kv_blocks ≥ {fmt_count(peak + 1)} "
                       f"({memory_advice(cfg, peak + 1)})")
        if cfg.max_num_seqs and seqs < cfg.max_num_seqs:
            return Remedy(
                "max_num_seqs", seqs,
                f"at step {ep.peak_step} the running requests needed {each} at full length (prompt + max_tokens, "
                f"{cfg.block_size} tokens per block) = {fmt_count(peak)} blocks against {fmt_count(usable)} usable: "
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
    blocks // the largest request's blocks at full length; None when unknown."""
    cfg = eng.config
    if cfg is None or not cfg.num_kv_blocks or not ep.full_blocks_max:
        return None
    cap: int = max((cfg.num_kv_blocks - 1) // ep.full_blocks_max, 1)
    return cap


def mean_full_blocks(ep: EngineEpisodes) -> float | None:
    """The mean blocks of the admitted requests at full length (prompt + max_tokens); None
    when none was seen."""
    n = sum(ep.full_blocks_seen.values())
    return sum(b * k for b, k in ep.full_blocks_seen.items()) / n if n else None


def vllm_concurrency(cfg: Any) -> float | None:
    """vLLM's start-up "Maximum concurrency for N tokens per request: Xx": KV capacity in
    tokens / max_model_len (vllm/v1/core/kv_cache_utils.py); ``cfg``: the engine_config
    record; None when either is unknown."""
    if cfg.kv_capacity_tokens and cfg.max_model_len:
        ratio: float = cfg.kv_capacity_tokens / cfg.max_model_len
        return ratio
    return None
