"""A small load client for vLLM's OpenAI-compatible server (examples/serve.sh).

Sends N completion requests with C in flight at a time and prints one line per
request (status, prompt/completion tokens, latency) and a total. Only the standard
library; talks to the address given (default http://127.0.0.1:8000).

    python examples/load_client.py --requests 16 --concurrency 8 --prompt-words 300
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def wait_ready(base: str, timeout_s: float) -> None:
    """Poll /health until the server answers 200; SystemExit after ``timeout_s``."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    sys.exit(f"server at {base} not ready after {timeout_s:.0f} s")


def first_model(base: str) -> str:
    with urllib.request.urlopen(f"{base}/v1/models", timeout=10) as r:
        return json.load(r)["data"][0]["id"]


def complete(base: str, model: str, prompt: str, max_tokens: int) -> tuple[int, dict, float]:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0.0, "ignore_eos": True}).encode()
    req = urllib.request.Request(f"{base}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=300) as r:
        return r.status, json.load(r), time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--prompt-words", type=int, default=300)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--wait", type=float, default=180, help="seconds to wait for the server")
    args = p.parse_args(argv)
    wait_ready(args.base_url, args.wait)
    model = first_model(args.base_url)
    prompts = [" ".join(f"w{(i * 31 + j) % 97}" for j in range(args.prompt_words)) for i in range(args.requests)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        results = list(pool.map(lambda pr: complete(args.base_url, model, pr, args.max_tokens), prompts))
    for i, (status, body, secs) in enumerate(results):
        u = body.get("usage", {})
        print(f"[{i}] {status} prompt={u.get('prompt_tokens')} completion={u.get('completion_tokens')} {secs:.2f}s")
    total = sum(r[1].get("usage", {}).get("completion_tokens", 0) for r in results)
    print(f"{len(results)} requests, {total} completion tokens in {time.perf_counter() - t0:.1f} s")
    return 0 if all(r[0] == 200 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
