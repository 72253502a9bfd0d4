"""The analysis behind ``vllm-probe summary`` and ``vllm-probe compare``.

:func:`summarize` streams a run's records (every engine core's file, one after the
other: the state keeps engine cores apart, so no time-ordered merge is needed) through
the shared :class:`~vllm_probe.analysis.state.RunState`, collects each finished
request's latencies, and returns a :class:`Summary`: plain numbers, JSON-ready with
:meth:`Summary.to_dict`, rendered by :mod:`vllm_probe.tui.summary_view` and compared by
:mod:`vllm_probe.analysis.compare`. No view code lives here; per-step figures come from
:mod:`vllm_probe.analysis.figures`.

Memory grows with the number of distinct requests (one latency record each), not with
the number of steps: per-step figures are kept as exact histograms of
``(scheduled_tokens, token_budget)`` pairs.

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

import bisect
import gc
import itertools
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Iterable

from ..runs.reader import ReadStats, iter_file_batches
from ..runs.rundir import NoEventsError, event_files, never_started_note, read_meta
from .expected import check_expected, check_model, check_sampling
from .figures import LIMITS, Distribution, budget_use_counts, prefill_share, share
from .requests import RequestState
from .state import RunState, StateListener
from .window import retention_note

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


@dataclass
class SpeedMark:
    """How fast the run's host ran the probe's fixed reference computation
    (:mod:`vllm_probe.engine.speed`): µs per pass, lower is faster; None where not recorded
    (an older probe, a simulated run, an engine core killed before its end's mark)."""

    start_us: float | None = None  # when the probes started (before the first step): median over engine cores
    end_us: float | None = None  # at the end (stop signal or exit): median over engine cores
    #: the run's mark: the geometric mean of ``start_us`` and ``end_us`` (the one known when
    #: only one is): what :mod:`vllm_probe.analysis.compare` sets two runs' seconds against
    mark_us: float | None = None
    #: ``end_us / start_us − 1``: how the host's speed moved while the run ran (+0.25: the
    #: reference took 25 % longer at the end than at the start)
    change: float | None = None
    engines: int = 0  # engine cores with at least one mark

    @classmethod
    def of(cls, starts: Iterable[float | None], ends: Iterable[float | None]) -> SpeedMark:
        """The run's mark from each engine core's start and end marks (µs; None: not recorded)."""
        pairs = list(zip(starts, ends))
        known_starts = [a for a, _ in pairs if a is not None]
        known_ends = [b for _, b in pairs if b is not None]
        m = cls(engines=sum(1 for a, b in pairs if a is not None or b is not None))
        m.start_us = Distribution.of(known_starts).median if known_starts else None
        m.end_us = Distribution.of(known_ends).median if known_ends else None
        if m.start_us and m.end_us:
            m.mark_us = math.sqrt(m.start_us * m.end_us)
            m.change = m.end_us / m.start_us - 1.0
        else:
            m.mark_us = m.start_us or m.end_us
        return m


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

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``summary --json``)."""
        return asdict(self)


# -- the computation ----------------------------------------------------------------------


#: One finished request's latencies and sizes, in the order of :attr:`_Finished.FIELDS`.
_Row = tuple[Any, ...]


class _Finished:
    """Per finished request: its latencies and token counts (the state keeps only the
    latest finished requests; the summary needs all of them)."""

    #: what each finished request's tuple in ``latencies`` holds
    FIELDS = ("queue_s", "ttft_s", "ttft_steps", "decode_s", "itl_s", "e2e_s", "prompt_len", "priority")

    def __init__(self) -> None:
        self.latencies: list[_Row] = []  # one tuple of FIELDS per finished request
        self.count = 0
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.worst: tuple[int, int, int, str] | None = None  # (preemptions, recomputed, discarded, req_id)
        self.before_window = 0  # finished requests added before the retention window

    def __call__(self, req: RequestState) -> None:
        if req.before_window:  # its start is not in the events read: counted apart
            self.before_window += 1
            self.consider_worst(req)
            return
        self.count += 1
        self.prompt_tokens += req.prompt_len or 0
        self.output_tokens += req.output_tokens or 0
        self.latencies.append((req.queue_time_s, req.ttft_s, req.ttft_steps, req.decode_time_s, req.mean_itl_s,
                               req.e2e_s, req.prompt_len, req.priority))
        self.consider_worst(req)

    def consider_worst(self, req: RequestState) -> None:
        """Keep the most preempted request (ties: more recomputed, then discarded tokens)."""
        if req.preemptions:
            key = (req.preemptions, req.recomputed_tokens, req.discarded_tokens, req.req_id)
            if self.worst is None or key[:3] > self.worst[:3]:
                self.worst = key


def analyze_events(events: Iterable[Any], stats: ReadStats | None = None, run_dir: str = "",
                   meta: dict[str, Any] | None = None, listener: StateListener | None = None,
                   with_summary: bool = True, boundaries: Iterable[int] | None = None,
                   batched: bool = False) -> tuple[RunState, Summary | None]:
    """The state of a run and its :class:`Summary`, from an iterable of events: each
    engine core's events in file order (engine cores may follow one another or
    interleave, as ``iter_run`` yields them). Events are records of
    :mod:`vllm_probe.schema.records` (past the reader there are only records; a
    hand-made stream builds them: ``tests/_events.py``'s ``records``). ``listener`` follows
    every transition (the doctor's
    :class:`~vllm_probe.analysis.episodes.Episodes`). ``with_summary=False``: the state
    only (no per-request latency records), and None for the summary. ``boundaries``:
    prompt-length class boundaries in tokens (None: :func:`default_boundaries` of the
    run's token budget). ``batched``: ``events`` is an iterable of lists of records (as
    :func:`~vllm_probe.runs.reader.iter_file_batches` yields them), applied with
    :meth:`RunState.apply_batch`.

    Python's cyclic garbage collector is paused meanwhile: the loop allocates an object
    per event and creates no reference cycles, and the collector's passes over the
    growing request records cost about a tenth of the time.
    """
    finished = _Finished() if with_summary else None
    state = RunState(step_window=0, on_request_finished=finished, listener=listener,
                     buckets=False)  # no rolling chart, no bucketed schedule times here
    apply = state.apply
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        if batched:
            apply_batch = state.apply_batch
            for batch in events:
                apply_batch(batch)
            events = ()
        for ev in events:
            apply(ev)
    finally:
        if gc_was_enabled:
            gc.enable()
    if finished is None:
        return state, None
    return state, _build(state, finished, stats or ReadStats(), run_dir, meta or {},
                         None if boundaries is None else sorted(set(boundaries)))


def summarize_events(events: Iterable[Any], stats: ReadStats | None = None, run_dir: str = "",
                     meta: dict[str, Any] | None = None, boundaries: Iterable[int] | None = None) -> Summary:
    """The :class:`Summary` of an iterable of events (see :func:`analyze_events`)."""
    summary = analyze_events(events, stats, run_dir, meta, boundaries=boundaries)[1]
    assert summary is not None
    return summary


def analyze(run_dir: str | Path, stats: ReadStats | None = None, listener: StateListener | None = None,
            with_summary: bool = True, boundaries: Iterable[int] | None = None,
            ) -> tuple[RunState, Summary | None]:
    """The state and the :class:`Summary` of the run in ``run_dir`` (all its engine
    cores' files); ``listener``, ``with_summary`` and ``boundaries`` as in
    :func:`analyze_events`.

    Raises:
        NoEventsError: no event file, or no readable event in them.
    """
    run_dir = Path(run_dir)
    stats = stats if stats is not None else ReadStats()
    if not event_files(run_dir):
        raise NoEventsError(f"no event files (events-*.jsonl) in {run_dir}{never_started_note(read_meta(run_dir))}")
    # RunState keeps each engine core apart, so the files need no time-ordered merge
    # (heapq.merge costs about a tenth of summary's time on a two-engine run).
    batches = itertools.chain.from_iterable(iter_file_batches(p, stats) for p in event_files(run_dir))
    result = analyze_events(batches, stats, str(run_dir), read_meta(run_dir), listener, with_summary, boundaries,
                            batched=True)
    if stats.events == 0:
        raise NoEventsError(f"no readable events in {run_dir} ({stats.describe()})")
    return result


def analyze_story(run_dir: str | Path, stats: ReadStats | None = None,
                  boundaries: Iterable[int] | None = None) -> tuple[RunState, Summary]:
    """:func:`analyze` with the doctor's episodes following the state, and the summary's
    ``moments`` filled (``vllm-probe summary``: the whole-run overview is drawn from the
    state's timelines). Raises like :func:`analyze`."""
    from .episodes import Episodes, notable_moments

    episodes = Episodes()
    state, summary = analyze(run_dir, stats, listener=episodes, boundaries=boundaries)
    assert summary is not None
    summary.moments = [asdict(m) for m in notable_moments(state, episodes)]
    return state, summary


def summarize(run_dir: str | Path, stats: ReadStats | None = None, boundaries: Iterable[int] | None = None) -> Summary:
    """Summarize the run in ``run_dir`` (all its engine cores' files); ``boundaries`` as in
    :func:`analyze_events`.

    Raises:
        NoEventsError: no event file, or no readable event in them.
    """
    summary = analyze(run_dir, stats, boundaries=boundaries)[1]
    assert summary is not None
    return summary


def _config_of(rec: Any) -> dict[str, Any]:
    """The :data:`CONFIG_KEYS` of an ``engine_config`` record that it holds (not None)."""
    values = {k: getattr(rec, k, None) for k in CONFIG_KEYS}
    return {k: v for k, v in values.items() if v is not None}


def _build(state: RunState, fin: _Finished, stats: ReadStats, run_dir: str, meta: dict[str, Any],
           boundaries: list[int] | None) -> Summary:
    s = Summary(run_dir=run_dir, command=meta.get("command"), exit_code=meta.get("exit_code"))
    s.read = {"events": stats.events, "malformed": stats.malformed, "partial": stats.partial,
              "unknown_kind": stats.unknown_kind, "newer_schema": stats.newer_schema,
              "files": len(stats.files), "text": stats.describe()}
    engines = state.engines
    s.engines = len(engines)
    configs = [_config_of(e.config) for _, e in sorted(engines.items()) if e.config is not None]
    if configs:
        s.config = configs[0]

        def settings(c: dict[str, Any]) -> dict[str, Any]:
            return {k: v for k, v in c.items() if k != "scheduler_class"}
        s.config_differs_across_engines = any(settings(c) != settings(configs[0]) for c in configs[1:])
    s.steps = int(state.total("steps"))
    s.duration_s = state.stepping_s()
    s.requests_added = int(state.total("requests_added"))
    s.requests_finished = fin.count
    s.requests_unfinished = sum(1 for e in engines.values() for r in e.requests.values() if not r.before_window)
    s.requests_before_window = int(state.total("requests_before_window"))
    s.retention = retention_note(state)
    s.prompt_tokens = fin.prompt_tokens
    s.output_tokens = fin.output_tokens
    if s.duration_s:
        s.output_tokens_per_s = s.output_tokens / s.duration_s
    s.busy_s = state.busy_s()
    if s.busy_s:
        s.output_tokens_per_busy_s = s.output_tokens / s.busy_s

    # steps: tokens and budget use
    tokens: dict[float, int] = {}
    for eng in engines.values():
        for (sched, _), n in eng.step_tokens.items():
            tokens[sched] = tokens.get(sched, 0) + n
    s.tokens_per_step = Distribution.of_counts(tokens)
    s.budget_use = Distribution.of_counts(budget_use_counts(e.step_tokens for e in engines.values()))
    if s.steps:
        s.scheduled_tokens = int(state.total("scheduled_tokens"))
        s.prefill_tokens = int(state.total("prefill_tokens"))
        s.decode_tokens = int(state.total("decode_tokens"))
        s.prefill_share = prefill_share(s.prefill_tokens, s.decode_tokens)
    else:  # step events off: unknown, not 0
        s.scheduled_tokens = s.prefill_tokens = s.decode_tokens = None
    if s.steps:
        s.schedule_us = Distribution(n=s.steps, mean=state.total("schedule_us_total") / s.steps,
                                     max=max(e.schedule_us_max for e in engines.values()))

    # preemptions
    p = s.preemptions
    p.count = int(state.total("preemptions_total"))  # preempt events, or the steps' lists with those off
    p.requests = int(state.total("requests_preempted"))
    p.discarded_tokens = int(state.total("discarded_tokens"))
    p.recomputed_tokens = int(state.total("recomputed_tokens"))
    p.recompute_tax = share(p.recomputed_tokens, s.scheduled_tokens) if s.steps else None
    for eng in engines.values():  # requests still in flight when the log ends
        for req in eng.requests.values():
            fin.consider_worst(req)
    if fin.worst is not None:
        p.worst_preemptions, p.worst_recomputed_tokens, _, p.worst_request = fin.worst
    per_step = _merged(e.preempted_steps for e in engines.values())
    if s.steps:
        p.steps_with_preemptions = sum(per_step.values())
        p.steps_with_several = sum(n for k, n in per_step.items() if k > 1)
        p.max_per_step = max(per_step, default=0)
    else:
        p.steps_with_preemptions = p.steps_with_several = p.max_per_step = None

    # chunking
    c = s.chunking
    prompt_chunks: dict[int, int] = {}
    for eng in engines.values():
        for k, n in eng.first_pass_chunks.items():
            prompt_chunks[k] = prompt_chunks.get(k, 0) + n
    c.prompts = sum(prompt_chunks.values())
    c.chunked_prompts = sum(n for k, n in prompt_chunks.items() if k > 1)
    c.chunks = int(state.total("chunks"))
    c.chunks_per_prompt = Distribution.of_counts(prompt_chunks)
    c.prefill_tokens = int(state.total("chunk_tokens"))
    c.reread_kv_tokens = int(state.total("reread_kv_tokens"))
    if c.prefill_tokens:
        c.reread_per_prefill_token = c.reread_kv_tokens / c.prefill_tokens
    c.prefix_hit_tokens = int(state.total("prefix_hit_tokens"))

    # prefix cache: first passes and re-admissions
    pc = s.prefix_cache
    pc.enabled = s.config.get("prefix_caching")
    pc.hit_tokens = c.prefix_hit_tokens
    pc.prompt_tokens = int(state.total("first_pass_prompt_tokens"))
    pc.hit_share = share(pc.hit_tokens, pc.prompt_tokens)
    pc.first_passes = int(state.total("first_passes"))
    pc.requests_with_hits = int(state.total("requests_with_prefix_hits"))
    pc.resumed_passes = int(state.total("resumed_passes"))
    pc.resumed_hit_tokens = int(state.total("resumed_prefix_hit_tokens"))
    pc.resumed_prefill_tokens = int(state.total("resumed_prefill_tokens"))
    pc.resumed_hit_share = share(pc.resumed_hit_tokens, pc.resumed_prefill_tokens)

    # queues after each step
    lengths = [e.queue_lengths() for e in engines.values()]
    s.queues = Queues(Distribution.of_counts(_merged(r for r, _ in lengths)),
                      Distribution.of_counts(_merged(w for _, w in lengths)))

    # latency of finished requests, pooled and by class
    lat = fin.latencies
    col = {name: i for i, name in enumerate(_Finished.FIELDS)}
    s.latency = Latency(**{name: Distribution.of(r[col[name]] for r in lat)
                           for name in ("queue_s", "ttft_s", "ttft_steps", "decode_s", "itl_s", "e2e_s")})
    s.latency_classes = _prompt_classes(lat, col, boundaries, s.config.get("max_num_batched_tokens"))
    s.requests_by_priority = _merged(e.priorities for e in engines.values())
    s.latency_by_priority = _priority_classes(lat, col)

    # what the user's settings file expected
    expected = meta.get("expected")
    if isinstance(expected, dict):
        seen: dict[str, dict[Any, int]] = {}
        for eng in engines.values():
            for name, values in eng.sampling_seen.items():
                seen[name] = _merged([seen.get(name, {}), values])
        checks = (check_expected(expected.get("engine") or {}, state.config)
                  + check_model(expected.get("model"))
                  + check_sampling(expected.get("sampling") or {}, seen))
        s.expected = {"source": expected.get("source"), "checks": [asdict(ch) for ch in checks]}

    # which limit bound the steps
    counts = dict.fromkeys(LIMITS, 0)
    for eng in engines.values():
        for limit, n in eng.bound_counts.items():
            counts[limit] = counts.get(limit, 0) + n
    total = sum(counts.values())
    if total:
        s.bound_by = {k: n / total for k, n in counts.items()}
        s.bound_most = max(counts, key=lambda k: (counts[k], -LIMITS.index(k) if k in LIMITS else 0))

    # why the head of the waiting queue was not admitted
    blocked: dict[str, int] = {}
    for eng in engines.values():
        for reason, n in eng.head_blocked_counts.items():
            blocked[reason] = blocked.get(reason, 0) + n
    s.head_blocked_steps = sum(blocked.values())
    if s.head_blocked_steps:
        s.head_blocked_by = {k: n / s.head_blocked_steps for k, n in sorted(blocked.items(), key=lambda kv: -kv[1])}

    s.probe_dropped_events = sum(eng.events_dropped for eng in engines.values())
    s.probe_hooks_disabled = sorted({h for eng in engines.values() for h in eng.hooks_disabled})
    s.probe_hook_errors = sum(eng.hook_errors for eng in engines.values())
    s.speed_mark = SpeedMark.of([e.speed_mark_start_us for e in engines.values()],
                                [e.speed_mark_end_us for e in engines.values()])
    return s


def _merged(hists: Iterable[dict[Any, int]]) -> dict[Any, int]:
    """Histograms ``{value: count}`` added up."""
    out: dict[Any, int] = {}
    for hist in hists:
        for k, n in hist.items():
            out[k] = out.get(k, 0) + n
    return out


def _latency_class(name: str, low: int | None, high: int | None, rows: list[_Row], col: dict[str, int]) -> LatencyClass:
    def dist(field_name: str) -> Distribution:
        return Distribution.of(r[col[field_name]] for r in rows)
    return LatencyClass(name, low, high, len(rows), dist("queue_s"), dist("ttft_s"), dist("ttft_steps"), dist("e2e_s"))


def _prompt_classes(lat: list[_Row], col: dict[str, int], boundaries: list[int] | None,
                    budget: int | None) -> LatencyClasses:
    basis = "given"
    if boundaries is None:
        basis = "token budget" if budget else "default"
        boundaries = default_boundaries(budget)
    names = class_names(len(boundaries) + 1)
    lows = [1] + [b + 1 for b in boundaries]
    highs: list[int | None] = [*boundaries, None]
    rows: list[list[_Row]] = [[] for _ in names]
    i_len = col["prompt_len"]
    for r in lat:
        if r[i_len] is not None:
            rows[bisect.bisect_left(boundaries, r[i_len])].append(r)
    return LatencyClasses("prompt_len", list(boundaries), basis,
                          [_latency_class(n, lo, hi, rs, col) for n, lo, hi, rs in zip(names, lows, highs, rows)])


def _priority_classes(lat: list[_Row], col: dict[str, int]) -> list[LatencyClass]:
    i_pri = col["priority"]
    by: dict[int, list[_Row]] = {}
    for r in lat:
        if r[i_pri] is not None:
            by.setdefault(r[i_pri], []).append(r)
    if len(by) < 2:
        return []
    kept = sorted(sorted(by, key=lambda p: -len(by[p]))[:PRIORITY_CLASSES_MAX])
    return [_latency_class(f"priority {p}", p, p, by[p], col) for p in kept]

