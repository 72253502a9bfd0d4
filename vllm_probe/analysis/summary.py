"""The analysis behind ``vllm-probe summary`` and ``vllm-probe compare``.

:func:`summarize` streams a run's events (every engine core's file, one after the other:
the state keeps engine cores apart, so no time-ordered merge is needed) through the shared :class:`~vllm_probe.analysis.state.RunState` and a few
accumulators of its own, and returns a :class:`Summary`: plain numbers, JSON-ready with
:meth:`Summary.to_dict`, rendered by ``cli/summary.py`` and ``cli/compare.py``. No view
code lives here.

Memory grows with the number of distinct requests (one latency record each), not with
the number of steps: per-step figures are kept as exact histograms of
``(scheduled_tokens, token_budget)`` pairs.

Definitions (event fields: docs/events.md; request timings: ``vllm_probe/analysis/state.py``):

* **steps**: ``step`` events (calls of ``Scheduler.schedule()``), summed over engine
  cores. **duration_s**: from the start of the first step (its ``ts`` minus its
  ``schedule_us``) to the ``ts`` of the last step, across engine cores (the time the
  schedulers were stepping; in the time-ordered stream).
* **tokens per step**: ``scheduled_tokens`` of each step; **budget use**:
  ``scheduled_tokens / token_budget`` of each step (0..1). Quantiles over all steps.
* **prefill / decode split**: sums of the steps' ``prefill_tokens`` / ``decode_tokens``;
  ``recomputed_tokens``: tokens of prefill chunks in resumed passes (``resumed: true``):
  the whole re-prefill after a preemption (prompt plus the output so far). Of it, only
  the ``discarded_tokens`` had been computed before: they are the work the preemption
  wasted; the rest of a prompt cut off mid-prefill would have been computed anyway.
* **preemptions**: ``preempt`` events; distinct requests; ``discarded_tokens`` summed;
  worst request: most preemptions, ties broken by recomputed then discarded tokens.
* **chunking**: a prompt's *chunks* are those of the prefill pass that produced its first
  token (the first pass that reached ``last``; a pass cut short by a preemption does not
  count). A prompt is *chunked* when that pass took more than one chunk. The cost of
  chunking (seed notes §3.4: from the second chunk on, attention reads again the KV of
  every earlier position of the prompt) is counted as **KV tokens re-read**:
  for every prefill chunk ``k >= 1`` of a pass (``chunk_index >= 1``, first passes and
  recompute passes alike) with positions ``[start_k, end_k)``, its attention reads the
  ``start_k`` KV entries computed before it, so ``reread = sum(start_k for k >= 1)``.
  A single-shot prefill of the same pass (one chunk ``[start_0, prefill_len)``) reads
  only the ``start_0`` prefix-cache hits, which the chunked pass reads too; so
  ``reread`` is exactly the extra KV reading caused by chunking (0 without chunking).
  Example: a 5,000-token prompt cut 2,048 / 2,048 / 904 re-reads 2,048 + 4,096 =
  6,144 tokens. ``reread_per_prefill_token`` divides it by the prefill tokens of all
  chunks (the KV a single-shot prefill would write once and never re-read).
* **latency** (per finished request, from :class:`~vllm_probe.analysis.state.RequestState`):
  queue time, time to first token (s and steps), decode time, mean inter-token time.
  Requests still running when the log ends are counted as ``unfinished`` and left out.
* **bound by**: share of steps per limit of :func:`vllm_probe.analysis.state.bound_by`
  (``token_budget``, ``max_num_seqs``, ``kv_cache``, ``none``); ``bound_most`` is the
  most frequent one.
* Quantiles (median, p90) interpolate linearly between order statistics (numpy's default
  "linear" method): the median of 1, 2, 3, 4 is 2.5.
"""

from __future__ import annotations

import gc
import itertools
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..runs.reader import ReadStats, iter_file
from ..runs.rundir import event_files, read_meta
from .state import LIMITS, RequestState, RunState
from ..schema.records import ChunkEvent, PreemptEvent, from_dict

#: Keys of ``engine_config`` shown as the effective configuration (in this order).
CONFIG_KEYS = (
    "vllm_version", "max_num_batched_tokens", "max_num_seqs", "enable_chunked_prefill",
    "long_prefill_token_threshold", "num_kv_blocks", "block_size", "kv_capacity_tokens",
    "max_model_len", "scheduling_policy", "async_scheduling", "prefix_caching",
    "data_parallel_size", "scheduler_class",
)


class NoEventsError(Exception):
    """The run holds no usable event (no files, or every line skipped)."""


# -- quantiles ----------------------------------------------------------------------------


def quantile(sorted_values: list[float], q: float) -> float | None:
    """Linear-interpolation quantile of already sorted values (None when empty)."""
    n = len(sorted_values)
    if n == 0:
        return None
    pos = q * (n - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


def _nth_from_counts(items: list[tuple[float, int]], rank: int) -> float:
    """Value at 0-based ``rank`` of the multiset given as sorted ``(value, count)`` pairs."""
    seen = 0
    for value, count in items:
        seen += count
        if rank < seen:
            return value
    return items[-1][0]


def quantile_from_counts(counts: dict[float, int], q: float) -> float | None:
    """:func:`quantile` of a histogram ``{value: count}`` without expanding it."""
    n = sum(counts.values())
    if n == 0:
        return None
    items = sorted(counts.items())
    pos = q * (n - 1)
    lo = math.floor(pos)
    a = _nth_from_counts(items, lo)
    b = _nth_from_counts(items, min(lo + 1, n - 1))
    return a + (b - a) * (pos - lo)


@dataclass
class Distribution:
    """Count, mean, median, p90 and max of a set of values (None when empty)."""

    n: int = 0
    mean: float | None = None
    median: float | None = None
    p90: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, values: Iterable[float]) -> "Distribution":
        vals = sorted(v for v in values if v is not None)
        if not vals:
            return cls()
        return cls(len(vals), sum(vals) / len(vals), quantile(vals, 0.5), quantile(vals, 0.9), vals[-1])

    @classmethod
    def of_counts(cls, counts: dict[float, int]) -> "Distribution":
        n = sum(counts.values())
        if n == 0:
            return cls()
        return cls(n, sum(v * c for v, c in counts.items()) / n, quantile_from_counts(counts, 0.5),
                   quantile_from_counts(counts, 0.9), max(counts))


# -- the result ---------------------------------------------------------------------------


@dataclass
class Preemptions:
    """Preemptions of the run (vLLM V1 preempts by recompute)."""

    count: int = 0
    requests: int = 0  # distinct requests preempted at least once
    discarded_tokens: int = 0  # computed tokens thrown away
    recomputed_tokens: int = 0  # tokens of prefill chunks in resumed passes
    worst_request: str | None = None
    worst_preemptions: int = 0
    worst_recomputed_tokens: int = 0


@dataclass
class Chunking:
    """Prefill chunking and its §3.4 cost (see the module docstring)."""

    prompts: int = 0  # prompts whose prefill completed
    chunked_prompts: int = 0  # of those, prefilled in more than one chunk
    chunks: int = 0  # every chunk event, recompute passes included
    chunks_per_prompt: Distribution = field(default_factory=Distribution)
    prefill_tokens: int = 0  # tokens of every chunk (end - start)
    reread_kv_tokens: int = 0  # sum of start over chunks with chunk_index >= 1
    reread_per_prefill_token: float | None = None  # reread_kv_tokens / prefill_tokens
    prefix_hit_tokens: int = 0  # served by the prefix cache on first chunks


@dataclass
class Latency:
    """Per finished request: seconds, except ``ttft_steps`` (steps)."""

    queue_s: Distribution = field(default_factory=Distribution)
    ttft_s: Distribution = field(default_factory=Distribution)
    ttft_steps: Distribution = field(default_factory=Distribution)
    decode_s: Distribution = field(default_factory=Distribution)
    itl_s: Distribution = field(default_factory=Distribution)


@dataclass
class Summary:
    """Everything ``vllm-probe summary`` shows; ``compare`` lines several up."""

    run_dir: str = ""
    command: list[str] | None = None  # from meta.json
    read: dict[str, Any] = field(default_factory=dict)  # ReadStats counts
    engines: int = 0
    config: dict[str, Any] = field(default_factory=dict)  # effective, engine 0 (or first)
    config_differs_across_engines: bool = False
    steps: int = 0
    duration_s: float | None = None
    requests_added: int = 0
    requests_finished: int = 0
    requests_unfinished: int = 0
    prompt_tokens: int = 0  # of finished requests
    output_tokens: int = 0  # of finished requests
    output_tokens_per_s: float | None = None
    tokens_per_step: Distribution = field(default_factory=Distribution)
    budget_use: Distribution = field(default_factory=Distribution)  # 0..1
    scheduled_tokens: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    prefill_share: float | None = None  # prefill / (prefill + decode)
    schedule_us: Distribution = field(default_factory=Distribution)  # mean only exact; see note
    preemptions: Preemptions = field(default_factory=Preemptions)
    chunking: Chunking = field(default_factory=Chunking)
    latency: Latency = field(default_factory=Latency)
    bound_by: dict[str, float] = field(default_factory=dict)  # limit -> share of steps
    bound_most: str | None = None
    probe_dropped_events: int = 0  # events the probe lost (state.EngineState.events_dropped)
    probe_hook_errors: int = 0  # exceptions caught in the probe's hooks (last probe_stats per file)
    probe_hooks_disabled: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``summary --json``)."""
        return asdict(self)


# -- the computation ----------------------------------------------------------------------


class _Collector:
    """Accumulators that RunState does not keep (it keeps rolling windows only)."""

    def __init__(self) -> None:
        self.reread = 0
        self.chunk_tokens = 0
        self.prefix_hit = 0
        self.prompt_chunks: dict[int, int] = {}  # chunks of the first complete pass -> prompts
        self.first_done: set[tuple[int, str]] = set()  # (engine, req_id) with first pass complete
        self.preempted: set[tuple[int, str]] = set()
        # per finished request: (queue_s, ttft_s, ttft_steps, decode_s, itl_s) and token counts
        self.latencies: list[tuple] = []
        self.finished = 0
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.worst: tuple | None = None  # (preemptions, recomputed, discarded, req_id)

    def on_finished(self, req: RequestState) -> None:
        self.finished += 1
        self.prompt_tokens += req.prompt_len or 0
        self.output_tokens += req.output_tokens or 0
        self.latencies.append((req.queue_time_s, req.ttft_s, req.ttft_steps, req.decode_time_s, req.mean_itl_s))
        self.first_done.discard((req.engine, req.req_id))
        self.consider_worst(req)

    def consider_worst(self, req: RequestState) -> None:
        if req.preemptions:
            key = (req.preemptions, req.recomputed_tokens, req.discarded_tokens, req.req_id)
            if self.worst is None or key[:3] > self.worst[:3]:
                self.worst = key

    def chunk(self, ev) -> None:
        start = ev.start or 0
        index = ev.chunk_index or 0
        self.chunk_tokens += (start if ev.end is None else ev.end) - start
        if index:
            self.reread += start
        elif not ev.resumed:
            self.prefix_hit += start if ev.prefix_hit_tokens is None else ev.prefix_hit_tokens
        if ev.last:
            key = (ev.engine, ev.req_id)
            if key not in self.first_done:
                self.first_done.add(key)
                self.prompt_chunks[index + 1] = self.prompt_chunks.get(index + 1, 0) + 1

    def preempt(self, ev) -> None:
        self.preempted.add((ev.engine, ev.req_id))


def summarize_events(events: Iterable, stats: ReadStats | None = None, run_dir: str = "",
                     meta: dict | None = None) -> Summary:
    """Summarize an iterable of events: each engine core's events in file order (engine
    cores may follow one another or interleave, as ``iter_run`` yields them). Events are
    Structs of :mod:`vllm_probe.schema.records` (``iter_file(typed=True)``) or dicts (converted;
    skipped when a field has the wrong type).

    Python's cyclic garbage collector is paused meanwhile: the loop allocates an object
    per event and creates no reference cycles, and the collector's passes over the
    growing request records cost about a tenth of the time.
    """
    col = _Collector()
    state = RunState(step_window=0, on_request_finished=col.on_finished)  # no rolling chart here
    apply = state.apply
    on_chunk, on_preempt = col.chunk, col.preempt
    chunk_type, preempt_type = ChunkEvent, PreemptEvent
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for ev in events:
            if type(ev) is dict:
                ev = from_dict(ev)
                if ev is None:
                    continue
            apply(ev)
            kind = type(ev)
            if kind is chunk_type:
                on_chunk(ev)
            elif kind is preempt_type:
                on_preempt(ev)
    finally:
        if gc_was_enabled:
            gc.enable()
    return _build(state, col, stats or ReadStats(), run_dir, meta or {})


def summarize(run_dir: str | Path, stats: ReadStats | None = None) -> Summary:
    """Summarize the run in ``run_dir`` (all its engine cores' files).

    Raises:
        NoEventsError: no event file, or no readable event in them.
    """
    run_dir = Path(run_dir)
    stats = stats if stats is not None else ReadStats()
    if not event_files(run_dir):
        raise NoEventsError(f"no event files (events-*.jsonl) in {run_dir}")
    # RunState keeps each engine core apart, so the files need no time-ordered merge
    # (heapq.merge costs about a tenth of summary's time on a two-engine run).
    events = itertools.chain.from_iterable(iter_file(p, stats, typed=True) for p in event_files(run_dir))
    summary = summarize_events(events, stats, str(run_dir), read_meta(run_dir))
    if stats.events == 0:
        raise NoEventsError(f"no readable events in {run_dir} ({stats.describe()})")
    return summary


def _build(state: RunState, col: _Collector, stats: ReadStats, run_dir: str, meta: dict) -> Summary:
    s = Summary(run_dir=run_dir, command=meta.get("command"))
    s.read = {"events": stats.events, "malformed": stats.malformed, "partial": stats.partial,
              "unknown_kind": stats.unknown_kind, "newer_schema": stats.newer_schema,
              "files": len(stats.files), "text": stats.describe()}
    engines = state.engines
    s.engines = len(engines)
    configs = [e.config for _, e in sorted(engines.items()) if e.config]
    if configs:
        s.config = {k: configs[0].get(k) for k in CONFIG_KEYS if k in configs[0]}
        s.config_differs_across_engines = any(
            {k: c.get(k) for k in CONFIG_KEYS if k != "scheduler_class"}
            != {k: configs[0].get(k) for k in CONFIG_KEYS if k != "scheduler_class"} for c in configs[1:])
    s.steps = int(state.total("steps"))
    s.duration_s = state.stepping_s()
    s.requests_added = int(state.total("requests_added"))
    s.requests_finished = col.finished
    s.requests_unfinished = sum(len(e.requests) for e in engines.values())
    s.prompt_tokens = col.prompt_tokens
    s.output_tokens = col.output_tokens
    if s.duration_s:
        s.output_tokens_per_s = s.output_tokens / s.duration_s

    # steps: tokens and budget use
    tokens: dict[float, int] = {}
    use: dict[float, int] = {}
    for eng in engines.values():
        for (sched, budget), n in eng.step_tokens.items():
            tokens[sched] = tokens.get(sched, 0) + n
            if budget:
                use[sched / budget] = use.get(sched / budget, 0) + n
    s.tokens_per_step = Distribution.of_counts(tokens)
    s.budget_use = Distribution.of_counts(use)
    s.scheduled_tokens = int(state.total("scheduled_tokens"))
    s.prefill_tokens = int(state.total("prefill_tokens"))
    s.decode_tokens = int(state.total("decode_tokens"))
    if s.prefill_tokens + s.decode_tokens:
        s.prefill_share = s.prefill_tokens / (s.prefill_tokens + s.decode_tokens)
    if s.steps:
        s.schedule_us = Distribution(n=s.steps, mean=state.total("schedule_us_total") / s.steps,
                                     max=max(e.schedule_us_max for e in engines.values()))

    # preemptions
    p = s.preemptions
    p.count = int(state.total("preemptions"))
    p.requests = len(col.preempted)
    p.discarded_tokens = int(state.total("discarded_tokens"))
    p.recomputed_tokens = int(state.total("recomputed_tokens"))
    for eng in engines.values():  # requests still in flight when the log ends
        for req in eng.requests.values():
            col.consider_worst(req)
    if col.worst is not None:
        p.worst_preemptions, p.worst_recomputed_tokens, _, p.worst_request = col.worst

    # chunking
    c = s.chunking
    c.prompts = sum(col.prompt_chunks.values())
    c.chunked_prompts = sum(n for k, n in col.prompt_chunks.items() if k > 1)
    c.chunks = int(state.total("chunks"))
    c.chunks_per_prompt = Distribution.of_counts(col.prompt_chunks)
    c.prefill_tokens = col.chunk_tokens
    c.reread_kv_tokens = col.reread
    if col.chunk_tokens:
        c.reread_per_prefill_token = col.reread / col.chunk_tokens
    c.prefix_hit_tokens = col.prefix_hit

    # latency of finished requests
    lat = col.latencies
    s.latency = Latency(*(Distribution.of(r[i] for r in lat) for i in range(5)))

    # which limit bound the steps
    counts = {k: 0 for k in LIMITS}
    for eng in engines.values():
        for k, n in eng.bound_counts.items():
            counts[k] = counts.get(k, 0) + n
    total = sum(counts.values())
    if total:
        s.bound_by = {k: n / total for k, n in counts.items()}
        s.bound_most = max(counts, key=lambda k: (counts[k], -LIMITS.index(k) if k in LIMITS else 0))

    s.probe_dropped_events = sum(eng.events_dropped for eng in engines.values())
    s.probe_hooks_disabled = sorted({h for eng in engines.values() for h in eng.hooks_disabled})
    s.probe_hook_errors = sum(eng.hook_errors for eng in engines.values())
    return s


# -- figures for views and compare ---------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    """One number of a summary: where it lives, how to show it, which way is better."""

    section: str
    label: str
    path: str  # dotted attribute path into Summary, e.g. "latency.ttft_s.median"
    unit: str = ""
    better: str | None = None  # "lower", "higher" or None (neither)

    def get(self, s: Summary) -> Any:
        obj: Any = s
        for part in self.path.split("."):
            obj = obj.get(part) if isinstance(obj, dict) else getattr(obj, part, None)
            if obj is None:
                return None
        return obj


#: The figures ``compare`` lines up, in display order.
FIGURES: tuple[Figure, ...] = (
    Figure("run", "steps", "steps", "steps", "lower"),
    Figure("run", "duration", "duration_s", "s", "lower"),
    Figure("run", "requests finished", "requests_finished", "requests"),
    Figure("run", "output tokens/s", "output_tokens_per_s", "tok/s", "higher"),
    Figure("steps", "tokens/step median", "tokens_per_step.median", "tokens", "higher"),
    Figure("steps", "tokens/step p90", "tokens_per_step.p90", "tokens", "higher"),
    Figure("steps", "budget use median", "budget_use.median", "%", "higher"),
    Figure("steps", "budget use p90", "budget_use.p90", "%", "higher"),
    Figure("steps", "prefill share", "prefill_share", "%"),
    Figure("steps", "schedule() mean", "schedule_us.mean", "µs", "lower"),
    Figure("preemptions", "preemptions", "preemptions.count", "", "lower"),
    Figure("preemptions", "requests preempted", "preemptions.requests", "requests", "lower"),
    Figure("preemptions", "discarded tokens", "preemptions.discarded_tokens", "tokens", "lower"),
    Figure("preemptions", "recomputed tokens", "preemptions.recomputed_tokens", "tokens", "lower"),
    Figure("chunking", "prompts chunked", "chunking.chunked_prompts", "prompts"),
    Figure("chunking", "chunks/prompt mean", "chunking.chunks_per_prompt.mean", "chunks", "lower"),
    Figure("chunking", "chunks/prompt max", "chunking.chunks_per_prompt.max", "chunks", "lower"),
    Figure("chunking", "KV tokens re-read", "chunking.reread_kv_tokens", "tokens", "lower"),
    Figure("latency", "queue time median", "latency.queue_s.median", "s", "lower"),
    Figure("latency", "queue time p90", "latency.queue_s.p90", "s", "lower"),
    Figure("latency", "TTFT median", "latency.ttft_s.median", "s", "lower"),
    Figure("latency", "TTFT p90", "latency.ttft_s.p90", "s", "lower"),
    Figure("latency", "TTFT max", "latency.ttft_s.max", "s", "lower"),
    Figure("latency", "TTFT median (steps)", "latency.ttft_steps.median", "steps", "lower"),
    Figure("latency", "TTFT p90 (steps)", "latency.ttft_steps.p90", "steps", "lower"),
    Figure("latency", "decode time median", "latency.decode_s.median", "s", "lower"),
    Figure("latency", "inter-token median", "latency.itl_s.median", "s", "lower"),
    Figure("bound", "bound by", "bound_most", ""),
)
