"""The doctor's KV arithmetic per KV-cache group, and ``max-concurrency``: vLLM's start-up
"Maximum concurrency" worked out from the recorded groups, on hand-made streams shaped like the
real run of the tiny hybrid model (3 sliding-window layers of 256 tokens, 1 full-attention
layer; 40 blocks of 128 tokens, max_model_len 1,024, budget 256; 8 requests of 600 + 300
tokens, 2 at a time: tests/e2e/test_hybrid_engine.py is that run)."""

from __future__ import annotations

from tests.analysis.test_doctor_rules import Run

WINDOW_GROUP = {"kind": "SlidingWindowSpec", "block_size": 128, "sliding_window": 256, "layers": 1,
                "blocks_per_request": 5}
FULL_GROUP = {"kind": "FullAttentionSpec", "block_size": 128, "sliding_window": None, "layers": 1,
              "blocks_per_request": 8}
HYBRID = [WINDOW_GROUP] * 3 + [FULL_GROUP]


def _run(groups: list[dict] | None, **cfg) -> Run:
    """8 requests of 600 + 300 tokens; 2 run, 6 wait with the head blocked by the KV cache for
    30 of 31 steps."""
    extra = {"kv_cache_group_specs": groups} if groups is not None else {}
    r = Run(budget=256, seqs=64, blocks=40, block=128, max_model_len=1024, **extra, **cfg)
    for i in range(8):
        r.add(f"R{i}", 600, 300)
    for i in range(2):
        r.chunk(f"R{i}", 0, 0, 600, 600, last=True)
    r.step(prefill=1200, running=2, waiting=6, blocked="kv_cache", kv=0.8)
    r.step(decode=2, running=2, waiting=6, blocked="kv_cache", kv=0.8, times=30)
    return r


def test_max_concurrency_works_vllms_figure_out_from_the_groups():
    """Without the recorded figure: 40 / (3 × 5 + 8) = 1.74, what vLLM printed; one group's
    reading 40 / 8 = 5.00; every layer at full attention in the same memory 40 × 1 / 4 / 8 =
    1.25; this run's requests take 8 + 3 × 5 = 23 blocks as reserved (39 // 23 = 1 at once), 8
    + 3 × 3 = 17 decoding (39 // 17 = 2, as ran)."""
    f = _run(HYBRID).findings()["max-concurrency"]
    ev = f.to_dict()["evidence"]
    assert ev == {"vllm_max_concurrency": 1.74, "max_model_len": 1024, "num_kv_blocks": 40, "block_size": 128,
                  "tokens_in_flight": 256,
                  "groups": [{"kind": "SlidingWindowSpec", "sliding_window": 256, "layers": 1, "blocks_per_request": 5}]
                  * 3 + [{"kind": "FullAttentionSpec", "sliding_window": None, "layers": 1, "blocks_per_request": 8}],
                  "blocks_per_request": 23, "blocks_over_length": 5.0, "full_attention_same_memory": 1.25,
                  "run_blocks_per_request": 23.0, "concurrency_at_run_lengths": 1, "run_blocks_decoding": 17.0,
                  "concurrency_decoding": 2, "running_max": 2}
    assert f.severity == "info" and f.remedy is None
    assert f.message.startswith("vLLM's start-up line \"Maximum concurrency for 1,024 tokens per request: 1.74x\" "
                                "counts one request of 1,024 tokens in each of the KV cache's 4 groups: 3 × 5 "
                                "(sliding window of 256 tokens) + 8 (full attention) = 23 of the pool's 40 blocks")


def test_the_groups_blocks_are_worked_out_when_vllm_did_not_record_them():
    """An engine_config with the groups' kinds and windows only: the window groups' blocks are
    vLLM's bound, ⌈min(256 - 1 + 256, 1,024) / 128⌉ + 1 = 5, the full group's ⌈1,024 / 128⌉ = 8."""
    bare = [{k: v for k, v in g.items() if k != "blocks_per_request"} for g in HYBRID]
    ev = _run(bare).findings()["max-concurrency"].to_dict()["evidence"]
    assert (ev["vllm_max_concurrency"], ev["blocks_per_request"]) == (1.74, 23)
    assert [g["blocks_per_request"] for g in ev["groups"]] == [5, 5, 5, 8]


def test_one_full_attention_group_gets_no_finding_and_the_old_arithmetic():
    """One full-attention group: no finding; kv-bound asks for 8 requests × 8 blocks + 1."""
    found = _run([FULL_GROUP]).findings()
    assert "max-concurrency" not in found
    assert found["kv-bound"].remedy.value == 65


def test_kv_bound_counts_every_groups_blocks():
    """The hybrid model's requests take 23 blocks each over the 4 groups: kv-bound asks for
    8 × 23 + 1 = 185 blocks (one group's count asked for 65, which holds 2 at once)."""
    rem = _run(HYBRID).findings()["kv-bound"].remedy
    assert rem.value == 185
    assert ("8 requests (all of the run's) × 23.0 blocks at full length (prompt + max_tokens, 128 tokens per block, "
            "4 KV-cache groups sharing the pool: 3 sliding-window of 256 tokens, 1 full-attention) + 1 reserved = "
            "185 blocks") in rem.arithmetic


def test_the_recorded_figure_wins():
    """vLLM's own figure (engine_config.kv_max_concurrency) is the one the finding gives; where
    the groups' blocks give another, the message says so."""
    f = _run(HYBRID, kv_max_concurrency=1.5).findings()["max-concurrency"]
    assert f.to_dict()["evidence"]["vllm_max_concurrency"] == 1.5
    assert "40 / 23 = 1.74 (vLLM's own figure, 1.50x, counts more than these groups" in f.message
    assert "counts more" not in _run(HYBRID, kv_max_concurrency=40 / 23).findings()["max-concurrency"].message
