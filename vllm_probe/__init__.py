"""vllm-probe: structured events from vLLM's V1 scheduler (steps, prefill chunks, preemptions)."""

__version__ = "0.1.0"
