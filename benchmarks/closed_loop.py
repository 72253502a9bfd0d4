"""vLLM's OpenAI server on the tiny model under ``vllm-probe run``, driven by a closed-loop client.

    python -m benchmarks.closed_loop --out RUN_DIR                  # 96 requests, 8 threads, 50 ms think time
    python -m benchmarks.closed_loop --out RUN_DIR --requests 24 --max-num-seqs 4

The ``server-closed`` workload of ``benchmarks/bench_whatif.py`` (a server under
``vllm bench serve --max-concurrency``). :func:`record`:

1. starts ``vllm-probe run --out RUN_DIR -- python -m vllm.entrypoints.openai.api_server``
   on 127.0.0.1 (the server command line, its environment, the free port and the wait for
   ``/health`` are ``benchmarks/soak.py``'s) with :data:`ENGINE_ARGS`: soak's server
   arguments at the engine settings of bench_whatif's other workloads (budget 512 tokens,
   64 KV blocks of 128 tokens, ``max_num_seqs`` 16, ``max_model_len`` 2,048, seed 0,
   prefix caching off: every prompt is its own);
2. drives it with :class:`ClosedLoop`: ``threads`` client threads, each sending its next
   completion (prompt token ids, ``ignore_eos`` so the output has exactly ``max_tokens``
   tokens) ``think_s`` seconds after its previous one was answered. The requests
   (:func:`ClosedLoop.plan`: prompts of 64-1,200 tokens, outputs of 16-200, uniform) depend
   only on the seed, and thread ``k`` sends requests ``k, k + threads, k + 2 * threads, ...``
   in that order, so every run, at any setting, sends the same requests in the same
   per-thread order;
3. stops the server with SIGTERM to ``vllm-probe run`` (which passes it on; the engine
   core writes its last events and ``probe_stats``), as the soak does, and waits for it.

Token ids stay below the tiny model's vocabulary (``soak.VOCAB``); the first token of each
prompt differs from every other prompt's (no shared prefix even with caching on).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.soak import SERVER_ARGS, VOCAB, free_port, server_command, serving


def with_flags(args: tuple[str, ...] | list[str], values: dict[str, str]) -> list[str]:
    """``args`` with each ``flag -> value`` of ``values`` set: replaced where the flag is
    present, appended otherwise."""
    out = list(args)
    for flag, value in values.items():
        if flag in out:
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
    return out


#: The server's engine arguments: soak's (dummy weights, eager, float32, memory share 0.3)
#: at budget 512 tokens, 64 KV blocks, max_num_seqs 16, max_model_len 2,048 tokens.
ENGINE_ARGS = (*with_flags(SERVER_ARGS, {"--max-model-len": "2048", "--max-num-batched-tokens": "512",
                                         "--num-gpu-blocks-override": "64", "--max-num-seqs": "16",
                                         "--seed": "0"}), "--no-enable-prefix-caching")
#: Server flag of each setting bench_whatif's grid changes (KV blocks: vLLM's override).
FLAGS = {"max_num_batched_tokens": "--max-num-batched-tokens", "num_kv_blocks": "--num-gpu-blocks-override",
         "max_num_seqs": "--max-num-seqs"}
#: Seconds to wait for the server's /health, and for it to exit after SIGTERM.
START_TIMEOUT_S = 900.0
STOP_TIMEOUT_S = 180.0


@dataclass
class ClosedLoop:
    """A closed-loop client: ``threads`` in flight, ``requests`` in all, ``think_s`` seconds
    from an answer to the thread's next request; lengths in tokens, drawn from ``seed``."""

    threads: int = 8
    requests: int = 96
    think_s: float = 0.05
    seed: int = 1
    prompt_tokens: tuple[int, int] = (64, 1200)
    max_tokens: tuple[int, int] = (16, 200)

    def plan(self) -> list[tuple[list[int], int]]:
        """``(prompt token ids, max_tokens)`` per request, in order; the seed decides all."""
        rng = random.Random(self.seed)
        out = []
        for i in range(self.requests):
            n, m = rng.randint(*self.prompt_tokens), rng.randint(*self.max_tokens)
            # 7919 * i mod (VOCAB - 3) (a prime) differs for every i below it: no two prompts share a first token
            out.append(([3 + (i * 7919 + j * 31) % (VOCAB - 3) for j in range(n)], m))
        return out

    def describe(self) -> str:
        return (f"closed loop: {self.threads} client threads, {self.think_s * 1e3:g} ms think time, "
                f"{self.requests} requests, prompts {self.prompt_tokens[0]}-{self.prompt_tokens[1]:,}, "
                f"out {self.max_tokens[0]}-{self.max_tokens[1]}")


@dataclass
class ClientResult:
    """What the client got back: requests answered 200 with exactly ``max_tokens`` tokens
    (``ok``), the others (``failed``), token counts from ``usage``, the load's wall time (s)."""

    ok: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    elapsed_s: float = 0.0
    errors: list[str] = field(default_factory=list)  # the first few


def drive(base: str, model: str, loop: ClosedLoop) -> ClientResult:
    """Send ``loop``'s requests to the server at ``base`` (see the module docstring); returns
    when every thread has had its last answer."""
    plan = loop.plan()
    result = ClientResult()
    lock = threading.Lock()

    def worker(k: int) -> None:
        for prompt, max_tokens in plan[k::loop.threads]:
            body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                               "ignore_eos": True}).encode()
            req = urllib.request.Request(f"{base}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            error = None
            usage: dict = {}
            try:
                with urllib.request.urlopen(req, timeout=600) as r:
                    usage = json.load(r).get("usage") or {}
            except (OSError, ValueError) as e:
                error = f"{type(e).__name__}: {e}"
            if error is None and usage.get("completion_tokens") != max_tokens:
                error = f"{usage.get('completion_tokens')} output tokens, asked for exactly {max_tokens}"
            with lock:
                if error is None:
                    result.ok += 1
                    result.prompt_tokens += usage.get("prompt_tokens") or 0
                    result.output_tokens += usage.get("completion_tokens") or 0
                else:
                    result.failed += 1
                    if len(result.errors) < 5:
                        result.errors.append(error)
            if loop.think_s > 0:
                time.sleep(loop.think_s)

    t0 = time.perf_counter()
    workers = [threading.Thread(target=worker, args=(k,), daemon=True, name=f"closed-loop-{k}")
               for k in range(loop.threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    result.elapsed_s = time.perf_counter() - t0
    return result


def record(run_dir: Path, engine_args: tuple[str, ...] | list[str], loop: ClosedLoop, log: Path) -> ClientResult:
    """One recorded run: the server under ``vllm-probe run --out run_dir`` with ``engine_args``,
    ``loop`` against it, then SIGTERM and a clean exit (its output in ``log``).

    Raises:
        RuntimeError: the server did not start or stop, a request failed, or the run
            directory has no ``meta.json``.
    """
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "vllm_probe", "run", "--out", str(run_dir), "--",
           *server_command(port, list(engine_args))]
    with serving(cmd, base, log, START_TIMEOUT_S, STOP_TIMEOUT_S) as model:
        result = drive(base, model, loop)
    if result.failed:
        raise RuntimeError(f"{result.failed} of {loop.requests} requests failed ({'; '.join(result.errors)}); "
                           f"see {log}")
    if not (run_dir / "meta.json").exists():
        raise RuntimeError(f"{run_dir} has no meta.json after the server's exit; see {log}")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the run directory (vllm-probe run --out)")
    p.add_argument("--requests", type=int, default=ClosedLoop.requests)
    p.add_argument("--threads", type=int, default=ClosedLoop.threads, help="requests in flight")
    p.add_argument("--think-ms", type=float, default=ClosedLoop.think_s * 1e3,
                   help="milliseconds from an answer to the thread's next request")
    p.add_argument("--seed", type=int, default=ClosedLoop.seed)
    for name, flag in FLAGS.items():
        p.add_argument(flag, dest=name, help="engine setting (default: ENGINE_ARGS')")
    a = p.parse_args(argv)
    loop = ClosedLoop(threads=a.threads, requests=a.requests, think_s=a.think_ms / 1e3, seed=a.seed)
    args = with_flags(ENGINE_ARGS, {flag: getattr(a, name) for name, flag in FLAGS.items()
                                    if getattr(a, name) is not None})
    r = record(a.out, args, loop, a.out.parent / f"{a.out.name}.server.log")
    print(json.dumps({"workload": loop.describe(), "engine_args": args, **asdict(r)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
