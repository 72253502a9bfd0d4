"""What ``vllm-probe summary`` reports: :class:`Summary` and its parts, and what each figure means.

The figures are computed by :func:`vllm_probe.analysis.summary.summarize`; views
(:mod:`vllm_probe.tui.summary_view`, :mod:`vllm_probe.analysis.compare`, the exporters)
read these records, never the events.

Definitions (event fields: docs/events.md; request timings: ``vllm_probe/analysis/state.py``):

* **steps**: ``step`` events (calls of ``Scheduler.schedule()``), summed over engine
  cores. **duration_s**: from the start of the first step (its ``ts`` minus its
  ``schedule_us``) to the ``ts`` of the last step, across engine cores (the time the
  schedulers were stepping; in the time-ordered stream). **busy_s**: the seconds with at
  least one request in an engine core (``request_added`` to ``request_finished``, idle
  gaps between bursts left out: :meth:`~vllm_probe.analysis.state.RunState.busy_s`);
  **output_tokens_per_busy_s**: output tokens of finished requests per busy second (the
  engine's throughput while it had work; ``output_tokens_per_s`` divides by duration).
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
  chunking (from the second chunk on, attention reads again the KV of
  every earlier position of the prompt) is counted as **KV tokens re-read**:
  for every prefill chunk ``k >= 1`` of a pass (``chunk_index >= 1``, first passes and
  recompute passes alike) with positions ``[start_k, end_k)``, its attention reads the
  ``start_k`` KV entries computed before it, so ``reread = sum(start_k for k >= 1)``
  (:func:`~vllm_probe.analysis.figures.chunk_reread_tokens`).
  A single-shot prefill of the same pass (one chunk ``[start_0, prefill_len)``) reads
  only the ``start_0`` prefix-cache hits, which the chunked pass reads too; so
  ``reread`` is exactly the extra KV reading caused by chunking (0 without chunking).
  Example: a 5,000-token prompt cut 2,048 / 2,048 / 904 re-reads 2,048 + 4,096 =
  6,144 tokens. ``reread_per_prefill_token`` divides it by the prefill tokens of all
  chunks (the KV a single-shot prefill would write once and never re-read).
* **latency** (per finished request, from :class:`~vllm_probe.analysis.state.RequestState`):
  queue time, time to first token (s and steps), decode time, mean inter-token time,
  end-to-end latency (arrival to finish). Requests still running when the log ends are
  counted as ``unfinished`` and left out.
* **latency classes**: the same per finished request, split by prompt length
  (``prompt_len``) at ``boundaries`` (a prompt of exactly a boundary's length belongs to
  the class below it). The default boundaries are a quarter of the token budget and the
  token budget (``max_num_batched_tokens``): a *short* prompt leaves room for other work
  in its step, a *medium* one fits in one step, a *long* one cannot be prefilled in one
  step and is chunked when chunked prefill is on ("chunked prefill on but TTFT
  worse" is the long class getting slower while the others get faster). Also split by
  ``priority`` when the finished requests have more than one (at most
  :data:`PRIORITY_CLASSES_MAX`, the most common).
* **prefix cache**: tokens served by the prefix cache (a pass's first chunk's
  ``prefix_hit_tokens``), on first passes against their prompt tokens, and on
  re-admissions after a preemption against the ``prefill_len`` those passes had to
  compute again (with prefix caching on, a preempted request's freed blocks stay cached
  until they are reused, so a re-admission can skip part of its recompute).
* **queues**: the running and waiting queue lengths after each step (exact distributions
  over all steps: the "maximum concurrency" actually reached).
* **preemptions per step**: from the steps' ``preempted`` lists: the most in one step,
  steps with any, steps with more than one (a cascade).
* **expected**: what ``meta.json``'s ``expected`` (the user's settings file) says the
  engine should run with, checked setting by setting against ``engine_config``
  (:func:`vllm_probe.analysis.expected.check_expected`) and, for its ``sampling``
  section, against what the requests asked for (``request_added``).
* **bound by**: share of steps per limit of :func:`vllm_probe.analysis.figures.bound_by`
  (``token_budget``, ``max_num_seqs``, ``kv_cache``, ``none``); ``bound_most`` is the
  most frequent one.
* **head blocked by**: share of the steps that carried ``step.head_blocked_by`` (requests
  waited after the step; the probe recorded why the first of them was not admitted) per
  reason; ``head_blocked_steps`` is how many steps carried it (0: nothing ever waited, or
  the run was recorded by a probe without the field).
* **speed mark**: the machine-speed mark of each engine core (``engine_config.speed_mark_us``
  when its probe started, the last ``probe_stats.speed_mark_us`` at its end; µs of the
  probe's fixed reference computation, :mod:`vllm_probe.engine.speed`, lower is faster):
  the median over engine cores of each, the run's mark (their geometric mean, or the one
  known), and how it moved while the run ran (end / start − 1). Unknown (None) for a run
  recorded by an older probe and for a simulated run.
* Quantiles (median, p90) interpolate linearly between order statistics (numpy's default
  "linear" method): the median of 1, 2, 3, 4 is 2.5.
"""


from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any
from collections.abc import Iterable

from .figures import DECODE_PERIOD_US, Distribution

#: Keys of ``engine_config`` shown as the effective configuration (in this order).
CONFIG_KEYS = (
    "vllm_version", "max_num_batched_tokens", "max_num_seqs", "enable_chunked_prefill",
    "long_prefill_token_threshold", "num_kv_blocks", "block_size", "kv_capacity_tokens",
    "max_model_len", "scheduling_policy", "async_scheduling", "prefix_caching",
    "data_parallel_size", "scheduler_class",
)

#: Default prompt-length class boundaries as shares of the token budget (see the module
#: docstring): short ≤ budget/4 < medium ≤ budget < long.
DEFAULT_CLASS_SHARES = (0.25, 1.0)
#: Boundaries (tokens) when the run's token budget is unknown.
FALLBACK_BOUNDARIES = (512, 2048)
#: Most priority classes in ``latency_by_priority`` (the most common priorities).
PRIORITY_CLASSES_MAX = 8


def default_boundaries(token_budget: int | None) -> list[int]:
    """Prompt-length class boundaries (tokens) for a run with this token budget
    (:data:`DEFAULT_CLASS_SHARES`; :data:`FALLBACK_BOUNDARIES` when unknown)."""
    if not token_budget:
        return list(FALLBACK_BOUNDARIES)
    return sorted({max(int(token_budget * fraction), 1) for fraction in DEFAULT_CLASS_SHARES})


def class_names(n: int) -> list[str]:
    """Names of ``n`` prompt-length classes: short / medium / long for three, else 1..n."""
    return ["short", "medium", "long"] if n == 3 else [str(i + 1) for i in range(n)]


# -- the result ---------------------------------------------------------------------------


@dataclass
class Preemptions:
    """Preemptions of the run (vLLM V1 preempts by recompute)."""

    count: int = 0
    requests: int = 0  # distinct requests preempted at least once
    discarded_tokens: int = 0  # computed tokens thrown away
    recomputed_tokens: int = 0  # tokens of prefill chunks in resumed passes
    #: recompute tax (vLLM RFC #54644): recomputed_tokens / every token computed (the
    #: steps' scheduled tokens), 0..1; None without step events
    recompute_tax: float | None = None
    worst_request: str | None = None
    worst_preemptions: int = 0
    worst_recomputed_tokens: int = 0
    # from the steps' ``preempted`` lists: None when the run has no step events
    steps_with_preemptions: int | None = 0  # steps whose ``preempted`` list is not empty
    steps_with_several: int | None = 0  # of those, steps that preempted more than one request
    max_per_step: int | None = 0  # most requests preempted in one step


@dataclass
class PrefixCache:
    """Prefix-cache hits (tokens whose KV came from cached blocks, not computed)."""

    enabled: bool | None = None  # engine_config.prefix_caching
    hit_tokens: int = 0  # on first passes (equals chunking.prefix_hit_tokens)
    prompt_tokens: int = 0  # prompt tokens of the first passes that started
    hit_share: float | None = None  # hit_tokens / prompt_tokens (0..1)
    first_passes: int = 0  # first prefill passes started (one per request)
    requests_with_hits: int = 0  # of those, passes that started with a hit
    resumed_passes: int = 0  # re-admissions after a preemption
    resumed_hit_tokens: int = 0  # served by the prefix cache on those re-admissions
    resumed_prefill_tokens: int = 0  # prefill_len of those passes: what they had to compute again
    resumed_hit_share: float | None = None  # resumed_hit_tokens / resumed_prefill_tokens (0..1)


@dataclass
class Queues:
    """Queue lengths after each step (requests), over all steps."""

    running: Distribution = field(default_factory=Distribution)
    waiting: Distribution = field(default_factory=Distribution)


@dataclass
class Chunking:
    """Prefill chunking and its cost in KV re-reads (see the module docstring)."""

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
    e2e_s: Distribution = field(default_factory=Distribution)  # arrival to finish


@dataclass
class LatencyClass:
    """Latency of the finished requests of one class: seconds, ``ttft_steps`` in steps.

    Prompt-length classes: ``low``..``high`` is the range of ``prompt_len`` (tokens, both
    inclusive; ``high`` None: no upper bound). Priority classes: ``low`` = ``high`` = the
    priority.
    """

    name: str
    low: int | None = None
    high: int | None = None
    n: int = 0  # finished requests in the class
    queue_s: Distribution = field(default_factory=Distribution)
    ttft_s: Distribution = field(default_factory=Distribution)
    ttft_steps: Distribution = field(default_factory=Distribution)
    e2e_s: Distribution = field(default_factory=Distribution)


@dataclass
class LatencyClasses:
    """Latency split by prompt length (see the module docstring)."""

    by: str = "prompt_len"
    boundaries: list[int] = field(default_factory=list)  # tokens
    basis: str = "token budget"  # where the boundaries come from: "token budget", "given" or "default"
    classes: list[LatencyClass] = field(default_factory=list)  # every class, empty ones included


#: Fewest periods of one decode batch for its :attr:`SpeedMark.decode_steps` row (30).
DECODE_MARK_MIN_STEPS = 30


@dataclass
class DecodeSteps:
    """The engine's decode speed at one batch: the periods between two consecutive
    decode-only steps (no prefill in either) with ``batch`` decode requests each.

    Attributes:
        batch: decode requests in each of the two steps.
        steps: periods measured (step pairs).
        median_us: their median (µs, at
            :data:`~vllm_probe.analysis.figures.DECODE_PERIOD_US` resolution).
    """

    batch: int
    steps: int
    median_us: float


@dataclass
class SpeedMark:
    """How fast the run's host ran the probe's fixed reference computation
    (:mod:`vllm_probe.engine.speed`): µs per pass, lower is faster; None where not recorded
    (an older probe, a simulated run, an engine core killed before its end's mark). And
    the engine's own decode speed (:attr:`decode_steps`): what the engine, not a fixed
    computation beside it, took for the same work; a host whose other core is busy can
    slow a two-thread engine and leave the one-thread mark as it was."""

    start_us: float | None = None  # when the probes started (before the first step): median over engine cores
    end_us: float | None = None  # at the end (stop signal or exit): median over engine cores
    #: the run's mark: the geometric mean of ``start_us`` and ``end_us`` (the one known when
    #: only one is): what :mod:`vllm_probe.analysis.compare` sets two runs' seconds against
    mark_us: float | None = None
    #: ``end_us / start_us − 1``: how the host's speed moved while the run ran (+0.25: the
    #: reference took 25 % longer at the end than at the start)
    change: float | None = None
    engines: int = 0  # engine cores with at least one mark
    #: per decode batch with at least :data:`DECODE_MARK_MIN_STEPS` periods, every engine
    #: core together, by batch (a replay's are its step-time model's)
    decode_steps: list[DecodeSteps] = field(default_factory=list)

    @classmethod
    def of(cls, starts: Iterable[float | None], ends: Iterable[float | None],
           periods: Iterable[dict[tuple[int, int], int]] = ()) -> SpeedMark:
        """The run's mark from each engine core's start and end marks (µs; None: not
        recorded) and its decode periods (each engine core's
        :attr:`~vllm_probe.analysis.engine_state.EngineState.decode_periods`)."""
        pairs = list(zip(starts, ends))
        known_starts = [a for a, _ in pairs if a is not None]
        known_ends = [b for _, b in pairs if b is not None]
        m = cls(engines=sum(1 for a, b in pairs if a is not None or b is not None))
        m.decode_steps = _decode_steps(periods)
        m.start_us = Distribution.of(known_starts).median if known_starts else None
        m.end_us = Distribution.of(known_ends).median if known_ends else None
        if m.start_us and m.end_us:
            m.mark_us = math.sqrt(m.start_us * m.end_us)
            m.change = m.end_us / m.start_us - 1.0
        else:
            m.mark_us = m.start_us or m.end_us
        return m


def _decode_steps(periods: Iterable[dict[tuple[int, int], int]]) -> list[DecodeSteps]:
    """:attr:`SpeedMark.decode_steps` from the engine cores' period histograms (each
    period rounded to :data:`~vllm_probe.analysis.figures.DECODE_PERIOD_US`)."""
    by_batch: dict[int, dict[int, int]] = {}
    for hist in periods:
        for (batch, bucket), n in hist.items():
            counts = by_batch.setdefault(batch, {})
            counts[bucket] = counts.get(bucket, 0) + n
    out = []
    for batch in sorted(by_batch):
        counts = by_batch[batch]
        total = sum(counts.values())
        if total < DECODE_MARK_MIN_STEPS:
            continue
        seen = 0
        for bucket in sorted(counts):
            seen += counts[bucket]
            if 2 * seen >= total:
                out.append(DecodeSteps(batch, total, float(bucket * DECODE_PERIOD_US)))
                break
    return out


@dataclass
class Summary:
    """Everything ``vllm-probe summary`` shows; ``compare`` lines several up."""

    run_dir: str = ""
    command: list[str] | None = None  # from meta.json
    #: the command's exit status from meta.json (128+N when killed by signal N: 130 for
    #: Ctrl-C); None: still running, or not recorded
    exit_code: int | None = None
    read: dict[str, Any] = field(default_factory=dict)  # ReadStats counts
    engines: int = 0
    config: dict[str, Any] = field(default_factory=dict)  # effective, engine 0 (or first)
    config_differs_across_engines: bool = False
    steps: int = 0
    duration_s: float | None = None
    busy_s: float | None = None  # seconds with a request in an engine core (None: no request events)
    requests_added: int = 0
    requests_finished: int = 0
    requests_unfinished: int = 0
    prompt_tokens: int = 0  # of finished requests
    output_tokens: int = 0  # of finished requests
    output_tokens_per_s: float | None = None
    output_tokens_per_busy_s: float | None = None
    tokens_per_step: Distribution = field(default_factory=Distribution)
    budget_use: Distribution = field(default_factory=Distribution)  # 0..1
    scheduled_tokens: int | None = 0
    prefill_tokens: int | None = 0  # None (as scheduled_tokens, decode_tokens): no step events
    decode_tokens: int | None = 0
    prefill_share: float | None = None  # prefill / (prefill + decode)
    schedule_us: Distribution = field(default_factory=Distribution)  # mean only exact; see note
    preemptions: Preemptions = field(default_factory=Preemptions)
    chunking: Chunking = field(default_factory=Chunking)
    latency: Latency = field(default_factory=Latency)
    latency_classes: LatencyClasses = field(default_factory=LatencyClasses)
    latency_by_priority: list[LatencyClass] = field(default_factory=list)  # empty unless priorities vary
    requests_by_priority: dict[int, int] = field(default_factory=dict)  # priority -> requests added
    prefix_cache: PrefixCache = field(default_factory=PrefixCache)
    queues: Queues = field(default_factory=Queues)
    #: meta.json's ``expected`` against the run: ``{"source": file, "checks": [SettingCheck
    #: as a dict]}`` (None: the run was started without a settings file saying what to expect)
    expected: dict[str, Any] | None = None
    bound_by: dict[str, float] = field(default_factory=dict)  # limit -> share of steps
    bound_most: str | None = None
    head_blocked_by: dict[str, float] = field(default_factory=dict)  # reason -> share of head_blocked_steps
    head_blocked_steps: int = 0  # steps with requests waiting and step.head_blocked_by recorded
    #: a finished run's notable moments (:func:`vllm_probe.analysis.episodes.notable_moments`,
    #: as dicts): filled by :func:`analyze_story`, empty otherwise
    moments: list[dict[str, Any]] = field(default_factory=list)
    #: when retention removed the start of the run: the one line saying so
    #: (:func:`vllm_probe.analysis.window.retention_note`); None: the events start at the start
    retention: str | None = None
    #: requests whose ``request_added`` retention removed (requests): left out of the
    #: request counts, token totals, throughput and latencies, which need their start
    requests_before_window: int = 0
    probe_dropped_events: int = 0  # events the probe lost (state.EngineState.events_dropped)
    probe_hook_errors: int = 0  # exceptions caught in the probe's hooks (last probe_stats per file)
    probe_hooks_disabled: list[str] = field(default_factory=list)
    #: the machine-speed mark of the run's host (:class:`SpeedMark`)
    speed_mark: SpeedMark = field(default_factory=SpeedMark)
    #: recomputed token positions by the probe's count and vLLM's own counter
    #: (:meth:`vllm_probe.analysis.recompute.RecomputeCheck.to_dict`), counted by every
    #: whole-run reading; None only for a summary built without it
    recompute_counter: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``summary --json``)."""
        return asdict(self)
