"""An API server's traffic shape: requests at Poisson times, mixed prompt and output lengths.

Run it under the probe (the engine is vLLM's ``AsyncLLM``, the one behind the
OpenAI-compatible server, without HTTP):

    vllm-probe run -- python examples/timed_arrivals.py
    vllm-probe run -- python examples/timed_arrivals.py --rate 12 --num-kv-blocks 32
    vllm-probe run -- python examples/timed_arrivals.py --enable-prefix-caching --prefix-groups 300,700,1100

Each request arrives at its planned offset (Poisson at ``--rate`` requests/s, in
``--waves`` waves ``--gap`` seconds apart, the engine idle in between), with a prompt
length drawn from ``--prompt-tokens MIN,MAX`` and an output length from ``--max-tokens
MIN,MAX`` (``ignore_eos``: exactly that many). ``--prefix-groups`` starts that share of
the prompts (``--prefix-share``) with one of a few shared system prefixes of the given
lengths, and ``--second-turns`` makes that share of prompts extend an earlier prompt (a
conversation's next turn). The plan depends only on ``--seed``, so runs at other
engine settings serve the same requests at the same offsets: ``benchmarks/bench_whatif.py``
records one setting, predicts others with ``vllm-probe whatif`` and runs them for real.
Tiny local model with random weights (the text is noise, the scheduling is real).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time


def _pair(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(",")
    return int(lo), int(hi or lo)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-requests", type=int, default=40)
    p.add_argument("--rate", type=float, default=8.0, help="requests/s within a wave (Poisson)")
    p.add_argument("--waves", type=int, default=1)
    p.add_argument("--gap", type=float, default=1.5, help="seconds of silence between waves")
    p.add_argument("--prompt-tokens", type=_pair, default=(64, 1200), metavar="MIN,MAX")
    p.add_argument("--max-tokens", type=_pair, default=(16, 200), metavar="MIN,MAX")
    p.add_argument("--prefix-groups", default="", metavar="N,N,...", help="lengths of shared system prefixes")
    p.add_argument("--prefix-share", type=float, default=0.8, help="share of prompts with a shared prefix")
    p.add_argument("--second-turns", type=float, default=0.0, help="share of prompts extending an earlier one")
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--num-kv-blocks", type=int, default=64)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--enable-prefix-caching", action="store_true")
    p.add_argument("--policy", default="fcfs", choices=("fcfs", "priority"))
    p.add_argument("--priorities", type=int, default=1, help="priorities drawn from 0..N-1 (--policy priority)")
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args(argv)


def plan(a: argparse.Namespace) -> list[tuple[float, list[int], int, int]]:
    """``(offset s, prompt token ids, output tokens, priority)`` per request, from the seed."""
    rng = random.Random(a.seed)
    groups = [[5 + (g * 131 + j * 7) % 400 for j in range(int(n))]
              for g, n in enumerate(x for x in a.prefix_groups.split(",") if x.strip())]
    out: list[tuple[float, list[int], int, int]] = []
    t = 0.0
    per_wave = max(a.num_requests // max(a.waves, 1), 1)
    for i in range(a.num_requests):
        if i and i % per_wave == 0:
            t += a.gap
        t += rng.expovariate(a.rate)
        n_prompt = rng.randint(*a.prompt_tokens)
        tail = [3 + (i * 7919 + j * 31) % 500 for j in range(n_prompt)]
        if out and rng.random() < a.second_turns:
            prompt = out[rng.randrange(len(out))][1] + tail[: max(n_prompt // 4, 1)]
        elif groups and rng.random() < a.prefix_share:
            prefix = groups[rng.randrange(len(groups))]
            prompt = prefix + tail[: max(n_prompt - len(prefix), 16)]
        else:
            prompt = tail
        prompt = prompt[: a.max_model_len - a.max_tokens[1] - 1]
        out.append((t, prompt, rng.randint(*a.max_tokens), rng.randrange(a.priorities)))
    return out


async def serve(a: argparse.Namespace) -> int:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.async_llm import AsyncLLM

    from vllm_probe.sim.tiny_model import write_tiny_model

    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(
        model=str(write_tiny_model()), load_format="dummy", enforce_eager=True, dtype="float32", seed=0,
        max_model_len=a.max_model_len, max_num_batched_tokens=a.max_num_batched_tokens,
        max_num_seqs=a.max_num_seqs, enable_prefix_caching=a.enable_prefix_caching,
        num_gpu_blocks_override=a.num_kv_blocks, gpu_memory_utilization=0.3, scheduling_policy=a.policy))
    requests = plan(a)

    async def one(i: int, at: float, prompt: list[int], n: int, priority: int) -> int:
        await asyncio.sleep(max(0.0, at - (time.perf_counter() - t0)))
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        last = None
        async for last in engine.generate(TokensPrompt(prompt_token_ids=prompt), params,  # noqa: B007 - keeps the last
                                          request_id=f"r{i}", priority=priority):
            pass
        return len(last.outputs[0].token_ids) if last is not None else 0

    t0 = time.perf_counter()
    produced = await asyncio.gather(*(one(i, *r) for i, r in enumerate(requests)))
    elapsed = time.perf_counter() - t0
    print(f"{len(produced)} requests, {sum(produced)} output tokens in {elapsed:.1f} s; budget "
          f"{a.max_num_batched_tokens}, KV {a.num_kv_blocks} blocks, rate {a.rate}/s", flush=True)
    engine.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(serve(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
