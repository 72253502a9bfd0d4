"""A run as a Chrome / Perfetto timeline (Trace Event Format, JSON Object Format).

Open the file in https://ui.perfetto.dev or ``chrome://tracing``. Layout:

* one *process* per engine core (data-parallel rank), named by ``process_name``
  metadata ("vLLM engine core · DP rank 0 (pid 3381)"); its ``pid`` is the engine
  core's OS pid;
* in it, a *thread* (track) ``scheduler`` with one slice per step covering the time
  inside ``Scheduler.schedule()`` (named ``schedule()``, from ``ts - schedule_us`` to
  ``ts``; the step index and batch figures are its args),
  and one track per request, named by ``thread_name`` metadata and ordered by arrival
  (``thread_sort_index``), holding, in order:

  - ``queued``: arrival (``request_added.arrival_ts``) → the step that scheduled its
    first chunk (args: ``prompt_len``, ``max_tokens``, ``priority``); ``queued
    (preempted)`` after a preemption until readmission;
  - one complete slice per prefill chunk, ``prefill [start, end)`` or, in a pass that
    recomputes after a preemption, ``recompute [start, end)``, lasting from the end of
    the ``schedule()`` call that scheduled it (the step event's ``ts``) to the start of
    the next step's ``schedule()`` (next step's ``ts - schedule_us``): the forward
    pass that computes it;
  - ``decode``: from the end of the pass's last chunk to ``request_finished`` (or the
    next preemption);
  - ``preempted``: an instant event at the ``preempt`` event's ``ts``, followed by
    ``queued (preempted)`` and the ``recompute`` chunks;

* process-wide counters (``ph: "C"``) at each step's ``ts``: ``KV-cache use``
  (``percent``), ``requests`` (``running``, ``waiting``) and ``step tokens``
  (``prefill``, ``decode``, ``unused budget``: stacked in chrome://tracing they add up
  to the step's token budget; Perfetto shows one track per series).

Format rules followed (Trace Event Format; Perfetto's JSON importer): every event has
``name``, ``ph``, ``ts``, ``pid``, ``tid`` (counters: ``pid``; ``tid`` 0); ``ts`` and
``dur`` are integer microseconds since the start of the run (``otherData.t0_epoch_s``
gives that instant as epoch seconds); complete events (``X``) carry ``dur >= 0``;
instant events (``i``) carry scope ``s: "t"``; counter args are numbers; metadata events
(``M``) name processes and threads. Slices on one track never partially overlap: each
track's slices are emitted in order and clamped to start where the previous one ended.
Events are not sorted by ``ts`` (the format does not require it).

Where the slices come from: the records go through the one request-lifecycle model,
:class:`~vllm_probe.analysis.state.RunState`; this module is a
:class:`~vllm_probe.analysis.state.StateListener` that draws each transition it is told
of (arrival, chunk, preemption, finish, step). What it keeps itself is drawing state:
per request track the slice still open and where the track's last slice ended.

Streaming: the output is written while reading; memory holds one state per request in
flight (removed when it finishes) and, per engine core, the records of the current step
(chunk slices end when the next step's ``schedule()`` starts, which its step record
tells; so a step's records reach the state when its step record arrives, in file
order). Without ``step`` events (flag off) chunk slices end at the first record of a
later step, and no counters or step slices are written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, BinaryIO
from collections.abc import Iterable

from msgspec.json import Encoder

from ..analysis.figures import unused_budget
from ..analysis.engine_state import EngineState
from ..analysis.requests import DECODE, RequestState
from ..analysis.state import RunState, StateListener
from ..runs.reader import ReadStats, iter_run
from ..runs.rundir import NoEventsError, event_files, read_meta
from .base import ExportResult, output_stream

#: Request tracks get thread ids from here on (above any OS pid, so no clash with them).
TID_BASE = 10_000_000
#: Thread id of each engine core's ``scheduler`` track.
SCHED_TID = 1
#: Most records buffered per engine core while waiting for a step record.
MAX_PENDING = 100_000

_dumps = Encoder().encode  # strict JSON, UTF-8; non-finite floats are refused by the readers already

#: Fields of a record copied into a slice's args, per kind.
_STEP_ARGS = ("step", "scheduled_tokens", "token_budget", "prefill_reqs", "decode_reqs", "new_reqs",
              "running", "waiting", "free_blocks")
_CHUNK_ARGS = ("step", "chunk_index", "start", "end", "prompt_len", "prefill_len", "last", "resumed",
               "prefix_hit_tokens")
_PREEMPT_ARGS = ("step", "discarded_tokens", "output_tokens", "num_preemptions", "kv_usage", "running",
                 "waiting", "reason")
#: engine_config fields left out of ``otherData.engine_config``.
_CONFIG_SKIP = ("ts", "pid", "schema", "flags", "patched")


def _args(ev: Any, names: Iterable[str]) -> dict:
    """The fields ``names`` of a record that it holds (not None)."""
    out = {}
    for name in names:
        value = getattr(ev, name, None)
        if value is not None:
            out[name] = value
    return out


@dataclass
class TraceResult(ExportResult):
    """What :func:`export_perfetto` wrote: trace events (``written``), and the request
    tracks, engine cores (processes) and steps they hold."""

    requests: int = 0
    engines: int = 0
    steps: int = 0
    unit: str = "trace events"

    @property
    def trace_events(self) -> int:
        return self.written


@dataclass
class _Track:
    """One request's track: the slice still open and where the last slice ended (µs)."""

    tid: int
    cursor: int = 0
    open_name: str | None = None
    open_start: int = 0
    open_args: dict | None = None
    decode_next: bool = False  # the open slice is a pass's last chunk: decode follows


@dataclass
class _Engine:
    """Drawing state of one engine core (a trace process)."""

    rank: int
    pid: int
    steps_logged: bool = True
    pending: list = field(default_factory=list)
    open_chunks: dict = field(default_factory=dict)  # req_id -> _Track with an open chunk slice
    tracks: dict = field(default_factory=dict)  # req_id -> _Track
    cur_step: int = -1  # without step records: step of the open chunks
    sched_cursor: int = 0
    last_us: int = 0


class TraceBuilder(StateListener):
    """Turns time-ordered records into trace events, written to ``out`` as they come.

    Args:
        out: binary stream receiving the JSON document (UTF-8).
        t0: epoch seconds mapped to ``ts`` 0 (earlier times are clamped to 0).
        other_data: extra fields for the document's ``otherData``.
    """

    def __init__(self, out: IO[bytes], t0: float, other_data: dict | None = None) -> None:
        self.out = out
        self.t0 = t0
        self.other = dict(other_data or {})
        self.engines: dict[int, _Engine] = {}
        self.state = RunState(step_window=0, finished_keep=0, listener=self)
        self.result = TraceResult()
        self._next_tid = TID_BASE
        self._first = True
        self._at = 0  # µs where the chunk slices of the records being applied start
        out.write(b'{"traceEvents":[')

    # -- output ---------------------------------------------------------------------------

    def _emit(self, obj: dict) -> None:
        self.out.write((b"\n" if self._first else b",\n") + _dumps(obj))
        self._first = False
        self.result.written += 1

    def _us(self, t: float) -> int:
        v = round((t - self.t0) * 1e6)
        return v if v > 0 else 0

    def _meta(self, pid: int, tid: int, name: str, args: dict) -> None:
        self._emit({"name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": args})

    def _slice(self, eng: _Engine, tr: _Track, name: str, start: int, end: int, args: dict | None) -> None:
        start = max(start, tr.cursor)
        end = max(end, start)
        ev = {"name": name, "cat": "request", "ph": "X", "ts": start, "dur": end - start,
              "pid": eng.pid, "tid": tr.tid}
        if args:
            ev["args"] = args
        self._emit(ev)
        tr.cursor = end

    def _counter(self, eng: _Engine, name: str, t: int, args: dict) -> None:
        self._emit({"name": name, "cat": "scheduler", "ph": "C", "ts": t, "pid": eng.pid, "tid": 0, "args": args})

    # -- tracks ---------------------------------------------------------------------------

    def _engine(self, ev: Any) -> _Engine:
        rank = ev.engine or 0
        eng = self.engines.get(rank)
        if eng is None:
            os_pid = ev.pid
            pid = os_pid if isinstance(os_pid, int) and os_pid > 0 else rank + 1
            eng = self.engines[rank] = _Engine(rank, pid)
            label = f"vLLM engine core · DP rank {rank}" + (f" (pid {os_pid})" if os_pid else "")
            self._meta(pid, 0, "process_name", {"name": label})
            self._meta(pid, 0, "process_sort_index", {"sort_index": rank})
            self._meta(pid, SCHED_TID, "thread_name", {"name": "scheduler"})
            self._meta(pid, SCHED_TID, "thread_sort_index", {"sort_index": -1})
            self.result.engines += 1
        return eng

    def _track(self, eng: _Engine, req: RequestState) -> _Track:
        tr = eng.tracks.get(req.req_id)
        if tr is None:
            tid = self._next_tid
            self._next_tid += 1
            tr = eng.tracks[req.req_id] = _Track(tid)
            label = f"req {req.req_id}" + (f" · {req.prompt_len} tok" if req.prompt_len is not None else "")
            self._meta(eng.pid, tid, "thread_name", {"name": label})
            self._meta(eng.pid, tid, "thread_sort_index", {"sort_index": tid - TID_BASE})
            self.result.requests += 1
        return tr

    def _open(self, eng: _Engine, tr: _Track, name: str, start: int, args: dict | None = None) -> None:
        if tr.open_name is not None:
            self._close(eng, tr, start)
        tr.open_name, tr.open_start, tr.open_args, tr.decode_next = name, start, args, False

    def _close(self, eng: _Engine, tr: _Track, end: int, extra: dict | None = None) -> None:
        if tr.open_name is None:
            return
        args = tr.open_args
        if extra:
            args = {**(args or {}), **extra}
        self._slice(eng, tr, tr.open_name, tr.open_start, end, args)
        tr.open_name = tr.open_args = None

    def _close_chunks(self, eng: _Engine, end: int) -> None:
        for tr in eng.open_chunks.values():
            decode_next = tr.decode_next
            self._close(eng, tr, end)
            if decode_next:
                self._open(eng, tr, "decode", end)
        eng.open_chunks.clear()

    # -- records in -----------------------------------------------------------------------

    def add(self, ev: Any) -> None:
        """Feed one record (:mod:`vllm_probe.schema.records`), in time order across the run."""
        kind = ev.kind
        if kind == "probe_stats":  # written by every process; not on the timeline
            return
        eng = self._engine(ev)
        t = self._us(ev.ts)
        if t > eng.last_us:
            eng.last_us = t
        if kind == "engine_config":
            flags = ev.flags
            if isinstance(flags, dict) and flags.get("log_schedule_each_step") is False:
                eng.steps_logged = False
            config = {name: getattr(ev, name) for name in ev.__struct_fields__
                      if name not in _CONFIG_SKIP and getattr(ev, name) is not None}
            self.other.setdefault("engine_config", {})[str(eng.rank)] = config
            self.state.apply(ev)
        elif kind == "step":
            self._step(eng, ev, t)
        elif eng.steps_logged:
            eng.pending.append(ev)
            if len(eng.pending) > MAX_PENDING:
                self._flush_unbuffered(eng)
        else:
            self._unbuffered(eng, ev)

    def _step(self, eng: _Engine, ev: Any, t: int) -> None:
        """A step record: its step's records reach the state (chunk slices start at the
        end of its ``schedule()``, ``t``), the chunks of the step before close where its
        ``schedule()`` starts, then the step itself (:meth:`on_step`)."""
        sched_start = self._us(ev.ts - (ev.schedule_us or 0.0) * 1e-6)
        closed = False
        self._at = t
        for pe in eng.pending:
            if not closed and self._us(pe.ts) >= sched_start:
                self._close_chunks(eng, sched_start)
                closed = True
            self.state.apply(pe)
        if not closed:
            self._close_chunks(eng, sched_start)
        eng.pending.clear()
        eng.cur_step = ev.step if ev.step is not None else eng.cur_step + 1
        self.state.apply(ev)

    def _unbuffered(self, eng: _Engine, ev: Any) -> None:
        """Without step records: a chunk slice ends at the first record of a later step."""
        t = self._us(ev.ts)
        step = getattr(ev, "step", None)
        if ev.kind in ("chunk", "preempt") and step is not None and step > eng.cur_step:
            self._close_chunks(eng, t)
            eng.cur_step = step
        self._at = t
        self.state.apply(ev)

    def _flush_unbuffered(self, eng: _Engine) -> None:
        pending, eng.pending = eng.pending, []
        for pe in pending:
            self._unbuffered(eng, pe)

    # -- transitions (StateListener) ------------------------------------------------------

    def on_added(self, state: EngineState, req: RequestState, ev: Any) -> None:
        eng = self.engines[state.engine]
        tr = self._track(eng, req)
        t = self._us(ev.ts)
        start = self._us(req.arrival_ts) if req.arrival_ts is not None else t
        self._open(eng, tr, "queued", min(start, t),
                   {"prompt_len": ev.prompt_len, "max_tokens": ev.max_tokens, "priority": ev.priority})

    def on_chunk(self, state: EngineState, req: RequestState, ev: Any) -> None:
        eng = self.engines[state.engine]
        tr = self._track(eng, req)
        if eng.open_chunks.pop(req.req_id, None) is not None:  # a second chunk before the first closed
            self._close(eng, tr, self._at)
        start, end = ev.start or 0, ev.end or 0
        args = _args(ev, _CHUNK_ARGS)
        args["tokens"] = end - start
        self._open(eng, tr, f"{'recompute' if ev.resumed else 'prefill'} [{start}, {end})", self._at, args)
        tr.decode_next = req.phase == DECODE
        eng.open_chunks[req.req_id] = tr

    def on_preempt(self, state: EngineState, req: RequestState, ev: Any) -> None:
        eng = self.engines[state.engine]
        tr = self._track(eng, req)
        t = self._us(ev.ts)
        eng.open_chunks.pop(req.req_id, None)
        self._close(eng, tr, t, {"ended_by": "preemption"})
        at = max(t, tr.cursor)
        self._emit({"name": "preempted", "cat": "request", "ph": "i", "s": "t", "ts": at,
                    "pid": eng.pid, "tid": tr.tid, "args": _args(ev, _PREEMPT_ARGS)})
        self._open(eng, tr, "queued (preempted)", at)

    def on_finished(self, state: EngineState, req: RequestState) -> None:
        eng = self.engines[state.engine]
        tr = eng.tracks.pop(req.req_id, None)
        if tr is None or req.finished_ts is None:  # finished_ts: set by the state before this call
            return
        eng.open_chunks.pop(req.req_id, None)
        done = {"reason": req.finish_reason, "output_tokens": req.output_tokens,
                "num_preemptions": req.preemptions if req.finish_reason is not None else None}
        self._close(eng, tr, self._us(req.finished_ts), {k: v for k, v in done.items() if v is not None})

    def on_step(self, state: EngineState, ev: Any) -> None:
        eng = self.engines[state.engine]
        t = self._us(ev.ts)
        self.result.steps += 1
        # the scheduler track: time inside schedule()
        start = max(self._us(ev.ts - (ev.schedule_us or 0.0) * 1e-6), eng.sched_cursor)
        end = max(t, start)
        args = _args(ev, _STEP_ARGS)
        if ev.preempted:
            args["preempted"] = ev.preempted
        self._emit({"name": "schedule()", "cat": "scheduler", "ph": "X", "ts": start,
                    "dur": end - start, "pid": eng.pid, "tid": SCHED_TID, "args": args})
        eng.sched_cursor = end
        # counters
        kv = ev.kv_usage
        if kv is not None and math.isfinite(kv):
            self._counter(eng, "KV-cache use", t, {"percent": round(kv * 100, 3)})
        self._counter(eng, "requests", t, {"running": ev.running or 0, "waiting": ev.waiting or 0})
        sched = ev.scheduled_tokens or 0
        pf, dc = ev.prefill_tokens, ev.decode_tokens
        tok = {"prefill": pf, "decode": dc} if pf is not None and dc is not None else {"scheduled": sched}
        tok["unused budget"] = unused_budget(sched, ev.token_budget)
        self._counter(eng, "step tokens", t, tok)

    # -- end ------------------------------------------------------------------------------

    def finish(self) -> TraceResult:
        """Close what is still open (requests unfinished when the log ends) and the document."""
        for eng in self.engines.values():
            self._flush_unbuffered(eng)
            end = eng.last_us
            self._close_chunks(eng, end)
            for tr in list(eng.tracks.values()):
                self._close(eng, tr, end, {"unfinished": True})
            eng.tracks.clear()
        other = {"source": "vllm-probe", **self.other, "t0_epoch_s": self.t0}
        self.out.write(b'\n],"displayTimeUnit":"ms","otherData":' + _dumps(other) + b"}\n")
        self.result.matched = self.result.written
        return self.result


def build_trace(events: Iterable[Any], out: IO[bytes], t0: float | None = None,
                other_data: dict | None = None) -> TraceResult:
    """Write the trace of time-ordered records to the binary stream ``out``.

    ``t0`` (epoch seconds) becomes ``ts`` 0; default: the first record's ``ts``.
    """
    it = iter(events)
    first = next(it, None)
    if t0 is None:
        t0 = first.ts if first is not None else 0.0
    builder = TraceBuilder(out, t0, other_data)
    if first is not None:
        builder.add(first)
        for ev in it:
            builder.add(ev)
    return builder.finish()


def export_perfetto(run_dir: str | Path, out: str | Path | BinaryIO, stats: ReadStats | None = None) -> TraceResult:
    """Write the run's timeline to ``out`` (``-``: stdout; ``*.gz``: gzip-compressed; or a
    binary stream).

    ``ts`` 0 is the run's first event (usually ``engine_config``, written when the
    scheduler is built: the engine's start-up before it is left out); earlier request
    arrivals are clamped to 0.

    Raises:
        NoEventsError: no event file in ``run_dir``.
        OSError: the output cannot be written.
    """
    run_dir = Path(run_dir)
    stats = stats if stats is not None else ReadStats()
    if not event_files(run_dir):
        raise NoEventsError(f"no event files (events-*.jsonl) in {run_dir}")
    meta = read_meta(run_dir)
    other = {"run_dir": str(run_dir), "command": meta.get("command"), "run_start_epoch_s": meta.get("start_time")}
    with output_stream(out) as stream:
        return build_trace(iter_run(run_dir, stats), stream, None, other)


class PerfettoExporter:
    """``--format perfetto``: the timeline for ui.perfetto.dev / chrome://tracing."""

    name = "perfetto"
    default_file = "trace.json"
    help = "trace-event JSON for ui.perfetto.dev / chrome://tracing"
    takes_filters = False

    def export(self, run_dir: Path, out: str | Path | BinaryIO, filters: Any, stats: ReadStats) -> TraceResult:
        return export_perfetto(run_dir, out, stats)
