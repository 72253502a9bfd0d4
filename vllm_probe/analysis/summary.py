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

What each figure means: :mod:`vllm_probe.analysis.summary_types`.
"""

from __future__ import annotations

import bisect
import gc
import itertools
from dataclasses import asdict
from pathlib import Path
from typing import Any
from collections.abc import Iterable

from ..runs.reader import ReadStats, iter_file_batches
from ..runs.rundir import NoEventsError, event_files, never_started_note, read_meta
from .expected import check_expected, check_model, check_sampling
from .figures import LIMITS, Distribution, budget_use_counts, prefill_share, share
from .requests import RequestState
from .recompute import RecomputeCheck, RecomputeListener
from .state import Listeners, RunState, StateListener
from .window import retention_note

from .summary_types import (
    CONFIG_KEYS, LatencyClass, LatencyClasses, Latency, Queues, SpeedMark,
    PRIORITY_CLASSES_MAX, Summary, class_names, default_boundaries,
)


# -- the computation ----------------------------------------------------------------------


#: One finished request's latencies and sizes, in the order of :attr:`FinishedRequests.FIELDS`.
_Row = tuple[Any, ...]


class FinishedRequests:
    """Per finished request: its latencies and token counts (the state keeps only the
    latest finished requests; the summary needs all of them). The state's
    ``on_request_finished``; :func:`build_summary` reads it."""

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
    finished = FinishedRequests() if with_summary else None
    recompute = RecomputeListener() if with_summary else None
    if recompute is not None:
        listener = recompute if listener is None else Listeners(listener, recompute)
    state = RunState(step_window=0, on_request_finished=finished, listener=listener,
                     buckets=False)  # no rolling chart, no bucketed schedule times here
    apply_events(state, events, batched)
    if finished is None:
        return state, None
    return state, build_summary(state, finished, stats or ReadStats(), run_dir, meta or {}, boundaries, recompute)


def apply_events(state: RunState, events: Iterable[Any], batched: bool = False) -> RunState:
    """``state`` with ``events`` applied in order (records; lists of records when
    ``batched``, :meth:`RunState.apply_batch`), the cyclic garbage collector paused
    meanwhile (see :func:`analyze_events`). The one loop of every whole-run reading."""
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
    return state


def build_summary(state: RunState, finished: FinishedRequests, stats: ReadStats, run_dir: str,
                  meta: dict[str, Any], boundaries: Iterable[int] | None = None,
                  recompute: RecomputeListener | None = None) -> Summary:
    """The :class:`Summary` of a state read to its end, ``finished`` its
    ``on_request_finished``; ``stats`` what the reading read, ``run_dir`` as the summary
    names it, ``meta`` the run's ``meta.json``, ``boundaries`` as in :func:`analyze_events`,
    ``recompute`` the recompute counts that followed the state (its ``recompute_counter``;
    None: not counted). Reads its arguments only, so one state gives any number of summaries."""
    s = _build(state, finished, stats, run_dir, meta, None if boundaries is None else sorted(set(boundaries)))
    if recompute is not None:
        s.recompute_counter = RecomputeCheck.of(recompute).to_dict()
    return s


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
    state's timelines). Read once per command (:func:`vllm_probe.analysis.reading.read`):
    the state is shared with the command's other readers, to be read, not changed.
    Raises like :func:`analyze`."""
    from .reading import read

    reading = read(run_dir, "summary")  # the command's one pass over the run (analysis/reading.py)
    return reading.state, reading.summary(stats, boundaries, moments=True)


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


def _build(state: RunState, fin: FinishedRequests, stats: ReadStats, run_dir: str, meta: dict[str, Any],
           boundaries: list[int] | None) -> Summary:
    s = Summary(run_dir=run_dir, command=meta.get("command"), exit_code=meta.get("exit_code"))
    s.read = {"events": stats.events, "malformed": stats.malformed, "partial": stats.partial,
              "unknown_kind": stats.unknown_kind, "newer_schema": stats.newer_schema,
              "files": len(stats.files), "text": stats.describe()}
    _run(s, state, fin)
    _steps(s, state)
    _preemptions(s, state, fin)
    _chunking_and_prefix_cache(s, state)
    _latency(s, state, fin, boundaries)
    _expected(s, state, meta)
    _limits(s, state)
    engines = state.engines.values()
    s.probe_dropped_events = sum(eng.events_dropped for eng in engines)
    s.probe_hooks_disabled = sorted({h for eng in engines for h in eng.hooks_disabled})
    s.probe_hook_errors = sum(eng.hook_errors for eng in engines)
    s.speed_mark = SpeedMark.of([e.speed_mark_start_us for e in engines], [e.speed_mark_end_us for e in engines],
                                [e.decode_periods for e in engines])
    return s


def _run(s: Summary, state: RunState, fin: FinishedRequests) -> None:
    """Engine cores, their configuration, steps, requests, tokens and throughput."""
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


def _steps(s: Summary, state: RunState) -> None:
    """Tokens per step, budget use, the prefill / decode split and the schedule time."""
    engines = state.engines
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
    lengths = [e.queue_lengths() for e in engines.values()]
    s.queues = Queues(Distribution.of_counts(_merged(r for r, _ in lengths)),
                      Distribution.of_counts(_merged(w for _, w in lengths)))


def _preemptions(s: Summary, state: RunState, fin: FinishedRequests) -> None:
    """Preemptions, their recompute, the worst request and the preemptions per step."""
    engines = state.engines
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


def _chunking_and_prefix_cache(s: Summary, state: RunState) -> None:
    """Prompts' chunks, re-read KV and the prefix cache's hits (first passes, re-admissions)."""
    engines = state.engines
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


def _latency(s: Summary, state: RunState, fin: FinishedRequests, boundaries: list[int] | None) -> None:
    """Latencies of the finished requests, pooled, by prompt-length class and by priority."""
    engines = state.engines
    lat = fin.latencies
    col = {name: i for i, name in enumerate(FinishedRequests.FIELDS)}
    s.latency = Latency(**{name: Distribution.of(r[col[name]] for r in lat)
                           for name in ("queue_s", "ttft_s", "ttft_steps", "decode_s", "itl_s", "e2e_s")})
    s.latency_classes = _prompt_classes(lat, col, boundaries, s.config.get("max_num_batched_tokens"))
    s.requests_by_priority = _merged(e.priorities for e in engines.values())
    s.latency_by_priority = _priority_classes(lat, col)


def _expected(s: Summary, state: RunState, meta: dict[str, Any]) -> None:
    """What the user's settings file (``meta.json``'s ``expected``) said, checked."""
    engines = state.engines
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


def _limits(s: Summary, state: RunState) -> None:
    """Which limit bound the steps, and why the head of the waiting queue was not admitted."""
    engines = state.engines
    counts = dict.fromkeys(LIMITS, 0)
    for eng in engines.values():
        for limit, n in eng.bound_counts.items():
            counts[limit] = counts.get(limit, 0) + n
    total = sum(counts.values())
    if total:
        s.bound_by = {k: n / total for k, n in counts.items()}
        s.bound_most = max(counts, key=lambda k: (counts[k], -LIMITS.index(k) if k in LIMITS else 0))

    blocked: dict[str, int] = {}
    for eng in engines.values():
        for reason, n in eng.head_blocked_counts.items():
            blocked[reason] = blocked.get(reason, 0) + n
    s.head_blocked_steps = sum(blocked.values())
    if s.head_blocked_steps:
        s.head_blocked_by = {k: n / s.head_blocked_steps for k, n in sorted(blocked.items(), key=lambda kv: -kv[1])}


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

