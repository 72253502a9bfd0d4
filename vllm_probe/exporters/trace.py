"""A run's workload as vLLM's timed trace: ``vllm bench serve --dataset-name timed_trace``.

One JSON object per request, in arrival order (vLLM's ``TimedTrace``,
``vllm/benchmarks/datasets/datasets.py``, 0.32; its default field names)::

    {"timestamp": 0.0123, "input_length": 1536, "output_length": 256, "hash_ids": [0, 1, 2, ...]}

* ``timestamp``: seconds since the first request's arrival (``arrival_ts``);
* ``input_length``: prompt tokens; ``output_length``: the tokens the request produced
  (what it had produced when the log ended, for one still running);
* ``hash_ids``: one integer per :data:`HASH_SIZE` tokens of the prompt, the last one
  covering the remainder. Requests whose prompts share their first full KV blocks
  (equal ``request_added.block_digests``) share the ids of those blocks; every other
  chunk gets an id of its own. vLLM's benchmark turns each id into the same random
  tokens wherever it appears, so the replayed prompts hit the prefix cache where the
  recorded ones did. A block of ``hash_block_size`` tokens (128 on vLLM's CPU backend)
  becomes ``hash_block_size / 16`` ids, so the trace reads with vLLM's default
  ``--timed-trace-chunk-hash-size 16``; a ``hash_block_size`` that is not a multiple of
  16 is written one id per block and the size is said on stderr.

Replay it on another machine with ``vllm bench serve --backend vllm --dataset-name
timed_trace --dataset-path trace.jsonl --num-prompts N`` (the benchmark passes token ids,
ignores EOS and keeps the timestamps), or with ``vllm-probe whatif --trace trace.jsonl
--like RUN_DIR`` (:func:`trace_workload`). Only lengths, times and which blocks are
equal leave the run: never token ids or text.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, BinaryIO

from ..analysis.workload import Workload, WorkloadError, WorkloadRequest, load_workload
from .base import ExportResult, output_stream

#: Tokens per hash id: vLLM's default ``--timed-trace-chunk-hash-size``.
HASH_SIZE = 16


class TraceError(ValueError):
    """A timed-trace file that cannot be read; the message names the line."""


def trace_entries(w: Workload) -> tuple[list[dict[str, Any]], int]:
    """The trace lines of a workload, in arrival order, and the tokens per hash id."""
    block = int(w.config.get("hash_block_size") or w.config.get("block_size") or HASH_SIZE)
    size = HASH_SIZE if block % HASH_SIZE == 0 else block
    per_block = block // size
    ids: dict[str, int] = {}
    next_id = 0
    entries = []
    t0 = w.t0
    for r in sorted(w.requests, key=lambda r: (r.stamp, r.order)):
        hash_ids: list[int] = []
        for digest in (r.block_digests or [])[: r.prompt_len // block]:
            first = ids.get(digest)
            if first is None:
                first = ids[digest] = next_id
                next_id += per_block
            hash_ids += range(first, first + per_block)
        rest = math.ceil((r.prompt_len - len(hash_ids) * size) / size)
        hash_ids += range(next_id, next_id + rest)
        next_id += rest
        entries.append({"timestamp": round(r.stamp - t0, 6), "input_length": r.prompt_len,
                        "output_length": r.output_tokens, "hash_ids": hash_ids})
    return entries, size


class TraceExporter:
    """``--format trace``: the workload as vLLM's timed-trace JSONL (module docstring)."""

    name = "trace"
    default_file = "trace.jsonl"
    help = "the workload as vLLM's timed trace (vllm bench serve --dataset-name timed_trace)"
    takes_filters = False

    def export(self, run_dir: Path, out: str | Path | BinaryIO, filters: Any, stats: Any) -> ExportResult:
        """Write one line per request of the run.

        Raises:
            ExportError: the run has no request events or several engine cores.
            NoEventsError: no event file.
        """
        from ..runs.rundir import NoEventsError, event_files
        from .base import ExportError

        if not event_files(Path(run_dir)):
            raise NoEventsError(f"no event files (events-*.jsonl) in {run_dir}")
        try:
            w = load_workload(run_dir, stats)
        except WorkloadError as e:
            raise ExportError(str(e)) from None
        entries, size = trace_entries(w)
        with output_stream(out) as f:
            for entry in entries:
                f.write(json.dumps(entry).encode() + b"\n")
        note = None if size == HASH_SIZE else f"hash ids cover {size} tokens: pass --timed-trace-chunk-hash-size {size}"
        return ExportResult(written=len(entries), matched=len(entries), unit="requests", note=note)


def read_trace(path: Path, sec_multiplier: float = 1.0) -> list[dict[str, Any]]:
    """The entries of a timed-trace file, as vLLM's ``TimedTrace`` reads them: ``timestamp``
    (times ``sec_multiplier``: 0.001 for milliseconds, as Mooncake's traces), ``input_length``,
    ``output_length``, ``hash_ids`` (optional). Blank lines are skipped.

    Raises:
        TraceError: the file cannot be read, a line is not a JSON object, a field is
            missing or of the wrong type.
    """
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as err:
        raise TraceError(f"cannot read {path}: {err.strerror or err}") from None
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            e = json.loads(line)
        except ValueError:
            raise TraceError(f"{path}:{n}: not JSON") from None
        if not isinstance(e, dict):
            raise TraceError(f"{path}:{n}: not a JSON object")
        for key in ("timestamp", "input_length", "output_length"):
            if not isinstance(e.get(key), (int, float)) or isinstance(e.get(key), bool):
                raise TraceError(f"{path}:{n}: {key} missing or not a number")
        hash_ids = e.get("hash_ids") or []
        if not isinstance(hash_ids, list):
            raise TraceError(f"{path}:{n}: hash_ids is not a list")
        if int(e["input_length"]) < 1 or int(e["output_length"]) < 1:
            raise TraceError(f"{path}:{n}: input_length and output_length must be at least 1")
        out.append({"timestamp": float(e["timestamp"]) * sec_multiplier, "input_length": int(e["input_length"]),
                    "output_length": int(e["output_length"]), "hash_ids": hash_ids})
    if not out:
        raise TraceError(f"{path}: no requests")
    return out


def trace_workload(path: Path, like: Workload, hash_size: int = HASH_SIZE, sec_multiplier: float = 1.0) -> Workload:
    """A timed trace as a workload with the engine settings of the recorded run ``like``.

    Arrivals are ``like``'s first arrival plus each ``timestamp``; every request stops
    after ``output_length`` tokens; ``hash_ids`` become shared blocks of ``hash_size``
    tokens (:class:`vllm_probe.sim.tokens.PromptBuilder`, as vLLM's ``TimedTrace``
    expands them, a partial last chunk keyed by its size). Where the ids cover less than
    ``input_length`` (or there are none) the rest of the prompt is unique to the request
    (vLLM's benchmark would send the shorter prompt).

    Raises:
        TraceError: see :func:`read_trace`.
    """
    entries = read_trace(path, sec_multiplier)
    t0 = like.t0
    reqs = [WorkloadRequest(order=i, req_id=f"trace-{i}", prompt_len=e["input_length"],
                            max_tokens=e["output_length"], output_tokens=e["output_length"],
                            arrival_ts=t0 + e["timestamp"], added_ts=t0 + e["timestamp"],
                            finish_reason="length", block_digests=list(e["hash_ids"]) or None)
            for i, e in enumerate(sorted(entries, key=lambda e: e["timestamp"]))]
    return Workload(str(path), dict(like.config), reqs, chunk_events=like.chunk_events, block_tokens=hash_size)
