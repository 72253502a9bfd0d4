"""The scheduler's per-step truth as Prometheus metrics, for a fleet's Prometheus.

:class:`RunStateCollector` is a ``prometheus_client`` custom collector over a
:class:`~vllm_probe.analysis.state.RunState`: each scrape turns the state's counters,
exact histograms and bucketed distributions into metric families. Nothing is counted
here: every figure is the state's (the one model behind the dashboard, the summary and
the timeline), converted to base units and Prometheus' cumulative buckets. Names,
types, units, labels and the event field behind each metric: docs/metrics.md.

:class:`MetricsServer` serves them over HTTP while a run goes on: prometheus_client's
own server (a thread per scrape) over a :class:`~vllm_probe.analysis.follow.LiveRun`
(one Follower into one ``RunState``): the dashboard's when ``run --live`` shows one, else
its own, pumped by one thread. The LiveRun's lock keeps a scrape and the reading apart;
the reader takes it for at most :data:`~vllm_probe.analysis.follow.APPLY_SLICE` events
at a time, so a scrape never waits for a backlog.
The engine core is not involved (it opens no socket, guarantee 9).

Labels are bounded: ``engine`` (the data-parallel rank), ``model_name`` where the run's
command line names the model (:func:`model_name_of`), and fixed sets of values
(``reason``, ``limit``, ``le``). Never a request id.
"""

from __future__ import annotations

import itertools
import sys
import threading
from bisect import bisect_left
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, start_http_server

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer
from prometheus_client.core import (
    CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily, Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ..analysis.figures import (
    BUDGET_USE_BOUNDS, CHUNKS_PER_PROMPT_BOUNDS, STEP_TOKENS_BOUNDS, Buckets, budget_use,
)
from ..analysis.engine_state import EngineState
from ..analysis.state import RunState
from ..schema.events import HEAD_BLOCKED_REASONS
from ..analysis.summary_types import CONFIG_KEYS
from ..analysis.follow import READ_CHUNK, LiveRun
from ..analysis.recompute import ENGINE_FIELD, VLLM_METRIC, RecomputeListener
from ..runs.reader import Follower, ReadStats

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

#: Seconds between two looks at the run directory when the follower has caught up.
POLL_S = 0.25
#: The doctor's findings (``vllm_probe_finding``) are recomputed at most this often (s),
#: on a scrape: a Prometheus scrape interval is 5 s or more.
FINDINGS_EVERY_S = 5.0

#: Every known head_blocked_by reason at 0: the series exist from the first scrape, as
#: ``steps_by_limit``'s do (``rate()`` needs a first sample).
_NO_HEAD_BLOCKED = dict.fromkeys(HEAD_BLOCKED_REASONS, 0)

#: ``findings(state)``: the doctor's findings that hold now (objects with ``id``,
#: ``severity`` and optionally ``engine``).
FindingsSource = Callable[[RunState], Iterable[Any]]


def model_name_of(command: list[str] | None) -> str | None:
    """The ``model_name`` label vLLM itself would use, read from the run's command line
    (``meta.json``): the first ``--served-model-name``, else ``--model``, else the
    positional model of ``vllm serve MODEL``, a local folder by its last component
    (:func:`_model_label`); None when it names none (e.g. a script that builds
    ``LLM(...)`` itself)."""
    if not command:
        return None
    found: dict[str, str] = {}
    for i, word in enumerate(command):
        for flag in ("--served-model-name", "--model"):
            if word == flag and i + 1 < len(command) and not command[i + 1].startswith("-"):
                found.setdefault(flag, command[i + 1])
            elif word.startswith(flag + "="):
                found.setdefault(flag, word[len(flag) + 1:])
        if (word == "serve" and i > 0 and Path(command[i - 1]).name == "vllm" and i + 1 < len(command)
                and not command[i + 1].startswith("-")):
            found.setdefault("serve", command[i + 1])
    if found.get("--served-model-name"):
        return found["--served-model-name"]
    for key in ("--model", "serve"):
        if found.get(key):
            return _model_label(found[key])
    return None


def _model_label(model: str) -> str:
    """A model argument as a label: a local folder (``/models/llama``, ``./tiny``,
    ``~/m``) by its last component (``llama``), never an absolute path of this machine; a
    hub id (``Qwen/Qwen2.5-7B-Instruct``) as written."""
    if model.startswith(("/", ".", "~")) or "\\" in model:
        parts = [p for p in model.replace("\\", "/").split("/") if p not in ("", ".", "..", "~")]
        return parts[-1] if parts else model
    return model


def _label_value(value: Any) -> str:
    """A config value as a label value: ``true``/``false`` for booleans."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class RunStateCollector(Collector):
    """Metric families of a :class:`RunState`, built at each scrape (docs/metrics.md).

    Args:
        state: the state the follower feeds.
        lock: held while the families are built (the follower holds it while applying).
        stats: the reader's counts (lines skipped), None to leave them out.
        incomplete_lines: lines still without their newline, None to leave it out.
        meta: the run's ``meta.json`` (for ``model_name``), a dict or a callable.
        findings: the doctor's findings; ``vllm_probe_finding`` is left out
            until a source is given.
        recompute: recomputed positions per engine core by the probe's count and vLLM's own
            (:class:`~vllm_probe.analysis.recompute.RecomputeListener` following ``state``);
            None leaves their two families out.
    """

    def __init__(self, state: RunState, *, lock: threading.Lock | threading.RLock | None = None,
                 stats: ReadStats | None = None,
                 incomplete_lines: Callable[[], int] | None = None,
                 meta: dict | Callable[[], dict] | None = None, findings: FindingsSource | None = None,
                 recompute: RecomputeListener | None = None) -> None:
        self.state = state
        self.recompute = recompute
        self.lock: threading.Lock | threading.RLock = lock or threading.Lock()
        self.stats = stats
        self.incomplete_lines = incomplete_lines
        self._meta = meta
        self.findings = findings
        self.step_buckets = _StepBuckets()

    def describe(self) -> list[Metric]:
        """Nothing: the registry must not call :meth:`collect` to learn the names."""
        return []

    def model_name(self) -> str | None:
        meta = self._meta() if callable(self._meta) else self._meta
        return model_name_of((meta or {}).get("command"))

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            families = _Families(self).build()
        return iter(families)


class _Families:
    """Builds the families of one scrape; ``engine`` (and ``model_name``) on each series."""

    def __init__(self, collector: RunStateCollector) -> None:
        self.c = collector
        state = collector.state
        self.engines = [state.engines[i] for i in sorted(state.engines)]
        self.model = model_name = collector.model_name()
        self.base = ["engine"] + (["model_name"] if model_name else [])
        self.out: list[Metric] = []

    def labels(self, eng: EngineState | None) -> list[str]:
        return ([str(eng.engine)] if eng is not None else []) + ([self.model] if self.model else [])

    def counter(self, name: str, doc: str, value: Callable[[EngineState], float]) -> None:
        f = CounterMetricFamily(name, doc, labels=self.base)
        for eng in self.engines:
            f.add_metric(self.labels(eng), value(eng))
        self.out.append(f)

    def counter_by(self, name: str, doc: str, label: str, counts: Callable[[EngineState], dict[str, int]]) -> None:
        f = CounterMetricFamily(name, doc, labels=self.base + [label])
        for eng in self.engines:
            for key, n in sorted(counts(eng).items()):
                f.add_metric(self.labels(eng) + [key], n)
        self.out.append(f)

    def gauge(self, name: str, doc: str, value: Callable[[EngineState], float | None]) -> None:
        f = GaugeMetricFamily(name, doc, labels=self.base)
        for eng in self.engines:
            v = value(eng)
            if v is not None:
                f.add_metric(self.labels(eng), v)
        self.out.append(f)

    def histogram(self, name: str, doc: str, buckets: Callable[[EngineState], Buckets]) -> None:
        f = HistogramMetricFamily(name, doc, labels=self.base)
        for eng in self.engines:
            b = buckets(eng)
            f.add_metric(self.labels(eng), [(floatToGoString(le), n) for le, n in b.cumulative()], b.sum)
        self.out.append(f)

    def build(self) -> list[Metric]:
        """Every metric family of the collection, in exposition order."""
        self._steps()
        self._preemptions()
        self._chunking()
        self._requests()
        self._queues_and_kv()
        self._probe()
        return self.out

    def _steps(self) -> None:
        """Steps, tokens, the limit of each step and the time inside schedule()."""
        c = self.c
        self.counter("vllm_probe_steps_total", "Scheduler steps: calls of Scheduler.schedule() (step events).",
                     lambda e: e.steps)
        self.counter("vllm_probe_scheduled_tokens_total",
                     "Tokens scheduled, prefill and decode (step.scheduled_tokens).",
                     lambda e: e.scheduled_tokens)
        self.counter("vllm_probe_prefill_tokens_total", "Prefill tokens scheduled, first passes and recomputes "
                     "(step.prefill_tokens).", lambda e: e.prefill_tokens)
        self.counter("vllm_probe_decode_tokens_total", "Decode tokens scheduled (step.decode_tokens).",
                     lambda e: e.decode_tokens)
        step_buckets = {e.engine: c.step_buckets(e) for e in self.engines}
        self.histogram("vllm_probe_step_tokens", "Tokens scheduled per step (step.scheduled_tokens).",
                       lambda e: step_buckets[e.engine][0])
        self.histogram("vllm_probe_step_budget_use_ratio", "Share of the step's token budget it scheduled, 0..1 "
                       "(step.scheduled_tokens / step.token_budget).", lambda e: step_buckets[e.engine][1])
        self.counter_by("vllm_probe_steps_by_limit_total", "Steps by the limit that held them back: token_budget, "
                        "max_num_seqs, kv_cache or none (analysis.figures.bound_by of each step).", "limit",
                        lambda e: e.bound_counts)
        self.counter_by("vllm_probe_steps_by_head_blocked_total", "Steps with requests waiting, by why the "
                        "head of the waiting queue was not admitted (step.head_blocked_by).", "reason",
                        lambda e: {**_NO_HEAD_BLOCKED, **e.head_blocked_counts})
        self.histogram("vllm_probe_schedule_duration_seconds", "Time inside Scheduler.schedule() per step, "
                       "seconds (step.schedule_us).", lambda e: e.schedule_s)

    def _preemptions(self) -> None:
        """Preemptions, the tokens they discarded and recomputed, the recompute tax."""
        c = self.c
        self.counter_by("vllm_probe_preemptions_total", "Requests preempted (recompute), by reason (preempt events).",
                        "reason", lambda e: e.preemptions_by_reason)
        self.counter_by("vllm_probe_discarded_tokens_total", "Computed tokens thrown away by preemptions, to be "
                        "recomputed (preempt.discarded_tokens).", "reason", lambda e: e.discarded_by_reason)
        self.counter("vllm_probe_recomputed_tokens_total", "Tokens of prefill chunks that re-prefill a preempted "
                     "request (chunk, resumed: end - start).", lambda e: e.recomputed_tokens)
        self.gauge("vllm_probe_recompute_tax", "Recompute tax (vLLM RFC #54644): tokens recomputed after "
                   "preemptions over every token computed, 0..1, since the start of the events read "
                   "(recomputed_tokens_total / step.scheduled_tokens).", lambda e: e.recompute_tax)
        self.gauge("vllm_probe_recompute_tax_recent", "Recompute tax over the rolling window of recent steps, "
                   "0..1.", lambda e: e.recent_recompute_tax())
        self.counter("vllm_probe_requests_preempted_total", "Distinct requests preempted at least once "
                     "(preempt events).", lambda e: e.requests_preempted)
        self._recompute(c.recompute)

    def _chunking(self) -> None:
        """Prefill chunks, the KV re-read they cost and prefix-cache hits."""
        self.counter("vllm_probe_prefill_chunks_total", "Prefill chunks scheduled, recompute passes included "
                     "(chunk events).", lambda e: e.chunks)
        self.histogram("vllm_probe_prefill_chunks_per_prompt", "Chunks of the prefill pass that produced a "
                       "prompt's first token (chunk events).",
                       lambda e: Buckets.of_counts(e.first_pass_chunks, CHUNKS_PER_PROMPT_BOUNDS))
        self.counter("vllm_probe_kv_reread_tokens_total", "KV-cache tokens read again because prompts were "
                     "chunked: start of every chunk after a pass's first.",
                     lambda e: e.reread_kv_tokens)
        self.counter("vllm_probe_prefix_cache_hit_tokens_total", "Prompt tokens served by the prefix cache on "
                     "first passes (chunk.prefix_hit_tokens).", lambda e: e.prefix_hit_tokens)

    def _requests(self) -> None:
        """Requests added and finished, queue time and TTFT."""
        self.counter("vllm_probe_requests_added_total", "Requests that reached the scheduler (request_added).",
                     lambda e: e.requests_added)
        self.counter("vllm_probe_requests_finished_total", "Requests that left the scheduler (request_finished).",
                     lambda e: e.requests_finished)
        self.histogram("vllm_probe_request_queue_time_seconds", "Arrival to the first prefill chunk, seconds "
                       "(request_added.arrival_ts to the chunk's step).", lambda e: e.queue_s)
        self.histogram("vllm_probe_time_to_first_token_seconds", "Arrival to the first token, seconds "
                       "(request_added.arrival_ts to the step after the first pass's last chunk).",
                       lambda e: e.ttft_s)

    def _queues_and_kv(self) -> None:
        """The queues and the KV cache as of the latest step."""
        latest = _latest
        self.gauge("vllm_probe_running_requests", "Running queue length after the latest step (step.running).",
                   lambda e: latest(e, "running"))
        self.gauge("vllm_probe_waiting_requests", "Waiting queue length after the latest step (step.waiting).",
                   lambda e: latest(e, "waiting"))
        self.gauge("vllm_probe_kv_cache_usage_ratio", "Share of KV-cache blocks in use after the latest step, "
                   "0..1 (step.kv_usage).", lambda e: latest(e, "kv_usage"))
        self.gauge("vllm_probe_kv_cache_free_blocks", "Free KV-cache blocks after the latest step "
                   "(step.free_blocks).", lambda e: latest(e, "free_blocks"))
        self.gauge("vllm_probe_last_step_timestamp_seconds", "Wall-clock time of the latest step, Unix seconds "
                   "(step.ts).", lambda e: e.last_step_ts)

    def _probe(self) -> None:
        """The probe's own health, the lines skipped and incomplete, info and findings."""
        c = self.c
        self.counter("vllm_probe_events_written_total", "Event lines the engine core wrote (probe_stats; "
                     "written when the engine core stops).", lambda e: e.events_written)
        self.counter("vllm_probe_events_dropped_total", "Events the probe lost: queue full or write failed "
                     "(probe_stats).", lambda e: e.events_dropped)
        self.counter("vllm_probe_hook_errors_total", "Exceptions caught in the probe's hooks (probe_stats).",
                     lambda e: e.hook_errors)
        if c.stats is not None:
            f = CounterMetricFamily("vllm_probe_lines_skipped_total", "Lines of the event files skipped: not "
                                    "strict JSON or a field of the wrong type (malformed), an unknown kind.",
                                    labels=self.base[1:] + ["reason"])
            for reason, n in (("malformed", c.stats.malformed), ("unknown_kind", c.stats.unknown_kind)):
                f.add_metric(self.labels(None) + [reason], n)
            self.out.append(f)
        if c.incomplete_lines is not None:
            g = GaugeMetricFamily(
                "vllm_probe_lines_incomplete", "Last lines of event files still without their newline: a write "
                "in progress, or a truncated end once the engine core is gone.", labels=self.base[1:])
            g.add_metric(self.labels(None), c.incomplete_lines())
            self.out.append(g)
        self._info()
        if c.findings is not None:
            self._findings(c.findings(c.state))

    def _recompute(self, recompute: RecomputeListener | None) -> None:
        """Recomputed positions as vLLM counts them: the probe's count from its preempt and
        chunk events, and vLLM's own counter where the engine exposed it (only engine cores
        whose steps carried it have a series). Without a listener following the state the
        two families have no series."""
        counts = recompute.counts if recompute is not None else {}
        probe = CounterMetricFamily("vllm_probe_recomputed_positions_total",
                                    "Token positions executed again below the highest position a preemption made "
                                    f"stale, prefix-cache hits not counted: vLLM's {VLLM_METRIC} as the probe "
                                    "counts it (preempt.discarded_tokens, chunk start/end).", labels=self.base)
        engine = CounterMetricFamily("vllm_probe_engine_recomputed_token_executions_total",
                                     f"vLLM's own {VLLM_METRIC} as the engine core counted it, summed over the "
                                     f"steps that carried it (step.{ENGINE_FIELD}); no series where the engine "
                                     "does not expose it.", labels=self.base)
        for eng in self.engines:
            rc = counts.get(eng.engine)
            if recompute is not None:
                probe.add_metric(self.labels(eng), rc.probe_tokens if rc is not None else 0)
            if rc is not None and rc.engine_tokens is not None:
                engine.add_metric(self.labels(eng), rc.engine_tokens)
        self.out += [probe, engine]

    def _info(self) -> None:
        f = InfoMetricFamily("vllm_probe_engine_config", "The engine core's effective scheduler settings "
                             "(engine_config), as labels; the value is 1.", labels=self.base)
        for eng in self.engines:
            cfg = eng.config
            if cfg is None:
                continue
            values = {k: getattr(cfg, k, None) for k in ("probe_version", *CONFIG_KEYS)}
            f.add_metric(self.labels(eng), {k: _label_value(v) for k, v in values.items() if v is not None})
        self.out.append(f)

    def _findings(self, findings: Iterable[Any]) -> None:
        f = GaugeMetricFamily("vllm_probe_finding", "1 while a doctor finding holds (id, severity).",
                              labels=self.base + ["id", "severity"])
        seen = set()
        for finding in findings:
            engine = getattr(finding, "engine", None)
            key = ("" if engine is None else str(engine), str(finding.id), str(finding.severity))
            if key not in seen:
                seen.add(key)
                f.add_metric([key[0]] + ([self.model] if self.model else []) + list(key[1:]), 1)
        self.out.append(f)


def _latest(eng: EngineState, field: str) -> float | None:
    """A field of the engine's latest ``step`` record (None before the first step)."""
    return None if eng.latest is None else getattr(eng.latest, field)


class _StepBuckets:
    """Tokens per step and budget use per step, bucketed from the state's exact histogram
    of ``(scheduled_tokens, token_budget)`` (steps without a budget have no budget use).

    Where each distinct pair falls is remembered per engine core, in the histogram's
    order: ``EngineState.step_tokens`` only ever gains keys, and a dict keeps them in
    insertion order, so a scrape walks the remembered places beside the dict's values
    (no bucket search, no hashing) and locates only the pairs added since. With 8
    engine cores of ~2,000 pairs each, searching would be most of a scrape's time. An
    engine core that has not stepped since the last scrape gets the same buckets again.
    """

    def __init__(self) -> None:
        self._where: dict[int, list[tuple[int, int, float | None, int]]] = {}
        self._last: dict[int, tuple[int, tuple[Buckets, Buckets]]] = {}  # engine -> (steps, buckets)

    @staticmethod
    def _locate(scheduled: int, budget: int) -> tuple[int, int, float | None, int]:
        share = budget_use(scheduled, budget)
        use_index = -1 if share is None else bisect_left(BUDGET_USE_BOUNDS, share)
        return bisect_left(STEP_TOKENS_BOUNDS, scheduled), use_index, share, scheduled

    def __call__(self, eng: EngineState) -> tuple[Buckets, Buckets]:
        last = self._last.get(eng.engine)
        if last is not None and last[0] == eng.steps:
            return last[1]
        hist = eng.step_tokens
        where = self._where.setdefault(eng.engine, [])
        if len(where) > len(hist):  # not the histogram it was built for
            where.clear()
        if len(where) < len(hist):
            where.extend(self._locate(*pair) for pair in itertools.islice(hist, len(where), None))
        tokens, use = Buckets(STEP_TOKENS_BOUNDS), Buckets(BUDGET_USE_BOUNDS)
        token_counts, use_counts = tokens.counts, use.counts
        token_sum = use_sum = 0.0
        for (token_index, use_index, share, scheduled), n in zip(where, hist.values()):
            token_counts[token_index] += n
            token_sum += scheduled * n
            if share is not None:
                use_counts[use_index] += n
                use_sum += share * n
        tokens.sum, use.sum = token_sum, use_sum
        self._last[eng.engine] = (eng.steps, (tokens, use))
        return tokens, use


class MetricsServer:
    """Prometheus text exposition of one run directory at ``http://HOST:PORT/metrics``.

    The port is bound when the server is made (so a port in use fails before anything
    starts); then either :meth:`attach` serves a :class:`~vllm_probe.analysis.follow.LiveRun`
    that another consumer already pumps (``run --live --metrics-port``: the dashboard's,
    so every line is read once into one state), or :meth:`follow` starts a LiveRun of its
    own, pumped by a thread; :meth:`close` stops both. A scrape before either answers with
    no series. ``diagnose``: the doctor follows the same state and its findings are served
    as ``vllm_probe_finding`` (the LiveRun's :class:`~vllm_probe.analysis.doctor.LiveDiagnosis`).

    Raises (from the constructor):
        OSError: the address cannot be bound (in use, not allowed, unknown host).
    """

    def __init__(self, host: str, port: int = 0, *, poll_s: float = POLL_S, diagnose: bool = True) -> None:
        self.diagnose = diagnose
        self.live: LiveRun | None = None
        self.poll_s = poll_s
        self.collector = RunStateCollector(RunState(step_window=0, finished_keep=0), stats=ReadStats(),
                                           incomplete_lines=self._incomplete, meta=self._meta,
                                           findings=self._findings if diagnose else None)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self.collector)
        httpd, self._http_thread = start_http_server(port, addr=host, registry=registry)
        self._httpd: WSGIServer | None = httpd
        self.host = host
        self.port: int = httpd.server_address[1]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed = False

    @property
    def state(self) -> RunState:
        """The state served (the LiveRun's once attached or following)."""
        return self.collector.state

    @property
    def stats(self) -> ReadStats:
        stats = self.collector.stats
        assert stats is not None  # the server's collector is made with stats, and attach() keeps them
        return stats

    @property
    def meta(self) -> dict:
        return self._meta()

    def _meta(self) -> dict:
        return self.live.meta if self.live is not None else {}

    def _incomplete(self) -> int:
        return self.live.incomplete if self.live is not None else 0

    def _findings(self, state: RunState) -> list:
        return self.live.findings() if self.live is not None else []

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def attach(self, live: LiveRun) -> None:
        """Serve ``live``'s state, which its owner pumps (no thread of ours, no second read)."""
        collector = self.collector
        with collector.lock:
            self.live = live
            collector.state, collector.stats, collector.lock = live.state, live.stats, live.lock
            collector.recompute = live.recompute

    def follow(self, run_dir: Path | str, *, background: bool = True) -> None:
        """Start following ``run_dir`` (files that appear later included) in a thread;
        ``background=False``: only set it up, the caller calls :meth:`pump`."""
        self.attach(LiveRun(run_dir, step_window=0, finished_keep=0,  # no rolling views: totals only
                            findings_every_s=FINDINGS_EVERY_S if self.diagnose else None))
        if background:
            self._thread = threading.Thread(target=self._run, name="vllm-probe-metrics", daemon=True)
            self._thread.start()

    @property
    def follower(self) -> Follower | None:
        """The Follower of the followed or attached run (None before either)."""
        return self.live.follower if self.live is not None else None

    @property
    def follower_thread(self) -> threading.Thread | None:
        """The thread that follows the run directory (None before :meth:`follow`, and when
        attached)."""
        return self._thread

    def pump(self, max_bytes: int | None = READ_CHUNK) -> int:
        """Read what the files hold now (up to ``max_bytes`` per file per look) into the
        state; returns the events read."""
        assert self.live is not None  # set by follow() or attach()
        return self.live.pump(max_bytes=max_bytes)

    def _run(self) -> None:
        assert self.live is not None  # set by follow(), which starts this thread
        run_dir = self.live.run_dir
        while not self._stop.is_set():
            read = 0
            try:
                read = self.live.pump(budget_s=self.poll_s, max_bytes=READ_CHUNK)
            except Exception as e:  # a bug of ours must not stop the metrics: one line, keep going
                if not self._failed:
                    self._failed = True
                    print(f"vllm-probe: metrics: internal error while reading {run_dir} "
                          f"({type(e).__name__}: {e}); continuing", file=sys.stderr, flush=True)
            if not read:  # caught up (else: more may wait, look again now)
                self._stop.wait(self.poll_s)

    def close(self) -> None:
        """Stop following and serving (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._http_thread.join(timeout=10)
            self._httpd = None

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
