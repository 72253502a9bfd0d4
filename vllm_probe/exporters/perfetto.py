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
    first chunk; ``queued (preempted)`` after a preemption until readmission;
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

Streaming: the output is written while reading; memory holds one state per request in
flight (removed when it finishes) and, per engine core, the events of the current step
(chunk slices end when the next step's ``schedule()`` starts, which its step event
tells). Without ``step`` events (flag off) chunk slices end at the first event of a
later step, and no counters or step slices are written.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterable

from ..runs.reader import ReadStats, iter_run
from ..runs.rundir import event_files, read_meta

#: Request tracks get thread ids from here on (above any OS pid, so no clash with them).
TID_BASE = 10_000_000
#: Thread id of each engine core's ``scheduler`` track.
SCHED_TID = 1
#: Most events buffered per engine core while waiting for a step event.
MAX_PENDING = 100_000

try:  # msgspec (it comes with vLLM) encodes ~5x faster; output is the same JSON (UTF-8)
    from msgspec.json import Encoder as _Encoder

    _dumps = _Encoder().encode
except ImportError:  # pragma: no cover - depends on the environment
    _json_encode = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode

    def _dumps(obj: Any) -> bytes:
        return _json_encode(obj).encode()


class PerfettoError(Exception):
    """The run cannot be exported (no event files)."""


@dataclass
class ExportResult:
    """What :func:`export_perfetto` wrote."""

    trace_events: int = 0
    requests: int = 0
    engines: int = 0
    steps: int = 0


@dataclass
class _Track:
    """One request's track."""

    tid: int
    req_id: str
    cursor: int = 0  # end (µs) of the last slice emitted on this track
    open_name: str | None = None
    open_start: int = 0
    open_args: dict | None = None
    chunk_last: bool = False  # the open slice is the last chunk of a pass


@dataclass
class _Engine:
    rank: int
    pid: int
    steps_logged: bool = True
    pending: list = field(default_factory=list)
    open_chunks: dict = field(default_factory=dict)  # req_id -> _Track with an open chunk slice
    tracks: dict = field(default_factory=dict)  # req_id -> _Track
    cur_step: int = -1  # unbuffered mode: step of the open chunks
    sched_cursor: int = 0
    last_us: int = 0


class TraceBuilder:
    """Turns time-ordered probe events into trace events, written to ``out`` as they come.

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
        self.result = ExportResult()
        self._next_tid = TID_BASE
        self._first = True
        out.write(b'{"traceEvents":[')

    # -- output ---------------------------------------------------------------------------

    def _emit(self, obj: dict) -> None:
        self.out.write((b"\n" if self._first else b",\n") + _dumps(obj))
        self._first = False
        self.result.trace_events += 1

    def _us(self, t: float) -> int:
        v = int(round((t - self.t0) * 1e6))
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

    # -- tracks ---------------------------------------------------------------------------

    def _engine(self, ev: dict) -> _Engine:
        rank = ev.get("engine", 0) or 0
        eng = self.engines.get(rank)
        if eng is None:
            os_pid = ev.get("pid")
            pid = os_pid if isinstance(os_pid, int) and os_pid > 0 else rank + 1
            eng = self.engines[rank] = _Engine(rank, pid)
            label = f"vLLM engine core · DP rank {rank}" + (f" (pid {os_pid})" if os_pid else "")
            self._meta(pid, 0, "process_name", {"name": label})
            self._meta(pid, 0, "process_sort_index", {"sort_index": rank})
            self._meta(pid, SCHED_TID, "thread_name", {"name": "scheduler"})
            self._meta(pid, SCHED_TID, "thread_sort_index", {"sort_index": -1})
            self.result.engines += 1
        return eng

    def _track(self, eng: _Engine, req_id: str, prompt_len: Any = None) -> _Track:
        tr = eng.tracks.get(req_id)
        if tr is None:
            tid = self._next_tid
            self._next_tid += 1
            tr = eng.tracks[req_id] = _Track(tid, req_id)
            label = f"req {req_id}" + (f" · {prompt_len} tok" if isinstance(prompt_len, int) else "")
            self._meta(eng.pid, tid, "thread_name", {"name": label})
            self._meta(eng.pid, tid, "thread_sort_index", {"sort_index": tid - TID_BASE})
            self.result.requests += 1
        return tr

    def _open(self, eng: _Engine, tr: _Track, name: str, start: int, args: dict | None = None) -> None:
        if tr.open_name is not None:
            self._close(eng, tr, start)
        tr.open_name, tr.open_start, tr.open_args, tr.chunk_last = name, start, args, False

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
            last = tr.chunk_last
            self._close(eng, tr, end)
            if last:
                self._open(eng, tr, "decode", end)
        eng.open_chunks.clear()

    # -- events ---------------------------------------------------------------------------

    def add(self, ev: dict) -> None:
        """Feed one event (in time order across the run)."""
        kind = ev["event"]
        if kind == "probe_stats":  # written with engine 0 by every process; not on the timeline
            return
        eng = self._engine(ev)
        t = self._us(ev["ts"])
        if t > eng.last_us:
            eng.last_us = t
        if kind == "engine_config":
            flags = ev.get("flags")
            if isinstance(flags, dict) and flags.get("log_schedule_each_step") is False:
                eng.steps_logged = False
            self.other.setdefault("engine_config", {})[str(eng.rank)] = {
                k: v for k, v in ev.items() if k not in ("event", "ts", "pid", "schema", "flags", "patched")}
            return
        if kind == "step":
            self._step(eng, ev, t)
            return
        if kind not in ("chunk", "preempt", "request_added", "request_finished"):
            return
        if eng.steps_logged:
            eng.pending.append(ev)
            if len(eng.pending) > MAX_PENDING:
                self._flush_unbuffered(eng)
        else:
            self._unbuffered(eng, ev)

    def _step(self, eng: _Engine, ev: dict, t: int) -> None:
        us = ev.get("schedule_us") or 0.0
        sched_start = self._us(ev["ts"] - us * 1e-6)
        closed = False
        for pe in eng.pending:
            if not closed and self._us(pe["ts"]) >= sched_start:
                self._close_chunks(eng, sched_start)
                closed = True
            self._handle(eng, pe, t)
        if not closed:
            self._close_chunks(eng, sched_start)
        eng.pending.clear()
        step = ev.get("step")
        eng.cur_step = step if isinstance(step, int) else eng.cur_step + 1
        self.result.steps += 1
        # the scheduler track: time inside schedule()
        start = max(sched_start, eng.sched_cursor)
        end = max(t, start)
        args = {k: ev[k] for k in ("step", "scheduled_tokens", "token_budget", "prefill_reqs", "decode_reqs",
                                   "new_reqs", "running", "waiting", "free_blocks") if k in ev}
        if ev.get("preempted"):
            args["preempted"] = ev["preempted"]
        self._emit({"name": "schedule()", "cat": "scheduler", "ph": "X", "ts": start,
                    "dur": end - start, "pid": eng.pid, "tid": SCHED_TID, "args": args})
        eng.sched_cursor = end
        # counters
        kv = ev.get("kv_usage")
        if isinstance(kv, (int, float)) and math.isfinite(kv):
            self._counter(eng, "KV-cache use", t, {"percent": round(kv * 100, 3)})
        self._counter(eng, "requests", t, {"running": _num(ev.get("running")), "waiting": _num(ev.get("waiting"))})
        sched, budget = _num(ev.get("scheduled_tokens")), _num(ev.get("token_budget"))
        pf, dc = ev.get("prefill_tokens"), ev.get("decode_tokens")
        if _is_num(pf) and _is_num(dc):
            tok = {"prefill": pf, "decode": dc}
        else:
            tok = {"scheduled": sched}
        tok["unused budget"] = max(budget - sched, 0)
        self._counter(eng, "step tokens", t, tok)

    def _counter(self, eng: _Engine, name: str, t: int, args: dict) -> None:
        self._emit({"name": name, "cat": "scheduler", "ph": "C", "ts": t, "pid": eng.pid, "tid": 0, "args": args})

    def _handle(self, eng: _Engine, ev: dict, step_end: int) -> None:
        """Apply one chunk / preempt / request event; chunk slices start at ``step_end``."""
        kind = ev["event"]
        req_id = ev.get("req_id")
        if not isinstance(req_id, str):
            return
        t = self._us(ev["ts"])
        if kind == "request_added":
            tr = self._track(eng, req_id, ev.get("prompt_len"))
            arrival = ev.get("arrival_ts")
            start = self._us(arrival) if isinstance(arrival, (int, float)) else t
            self._open(eng, tr, "queued", min(start, t),
                       {"prompt_len": ev.get("prompt_len"), "max_tokens": ev.get("max_tokens")})
        elif kind == "chunk":
            tr = self._track(eng, req_id, ev.get("prompt_len"))
            if req_id in eng.open_chunks:  # a second chunk before the first closed (no step event between)
                self._close(eng, tr, step_end)
                del eng.open_chunks[req_id]
            s, e = ev.get("start", 0), ev.get("end", 0)
            name = f"{'recompute' if ev.get('resumed') else 'prefill'} [{s}, {e})"
            args = {k: ev[k] for k in ("step", "chunk_index", "start", "end", "prompt_len", "prefill_len",
                                       "last", "resumed", "prefix_hit_tokens") if k in ev}
            args["tokens"] = e - s
            self._open(eng, tr, name, step_end, args)
            tr.chunk_last = bool(ev.get("last"))
            eng.open_chunks[req_id] = tr
        elif kind == "preempt":
            tr = self._track(eng, req_id, ev.get("prompt_len"))
            eng.open_chunks.pop(req_id, None)
            self._close(eng, tr, t, {"ended_by": "preemption"})
            at = max(t, tr.cursor)
            args = {k: ev[k] for k in ("step", "discarded_tokens", "output_tokens", "num_preemptions",
                                       "kv_usage", "running", "waiting", "reason") if k in ev}
            self._emit({"name": "preempted", "cat": "request", "ph": "i", "s": "t", "ts": at,
                        "pid": eng.pid, "tid": tr.tid, "args": args})
            self._open(eng, tr, "queued (preempted)", at)
        elif kind == "request_finished":
            tr = eng.tracks.pop(req_id, None)
            if tr is None:
                return
            eng.open_chunks.pop(req_id, None)
            self._close(eng, tr, t, {k: ev[k] for k in ("reason", "output_tokens", "num_preemptions") if k in ev})

    def _unbuffered(self, eng: _Engine, ev: dict) -> None:
        """Without step events: a chunk slice ends at the first event of a later step."""
        t = self._us(ev["ts"])
        step = ev.get("step")
        if ev["event"] in ("chunk", "preempt") and isinstance(step, int) and step > eng.cur_step:
            self._close_chunks(eng, t)
            eng.cur_step = step
        self._handle(eng, ev, t)

    def _flush_unbuffered(self, eng: _Engine) -> None:
        pending, eng.pending = eng.pending, []
        for pe in pending:
            self._unbuffered(eng, pe)

    def finish(self) -> ExportResult:
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
        return self.result


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _num(v: Any) -> int | float:
    """A counter value: numbers pass, anything else (missing, bool, NaN) is 0."""
    return v if _is_num(v) else 0


def build_trace(events: Iterable[dict], out: IO[bytes], t0: float | None = None,
                other_data: dict | None = None) -> ExportResult:
    """Write the trace of time-ordered ``events`` to the binary stream ``out``.

    ``t0`` (epoch seconds) becomes ``ts`` 0; default: the first event's ``ts``.
    """
    it = iter(events)
    first = next(it, None)
    if t0 is None:
        t0 = first["ts"] if first is not None else 0.0
    builder = TraceBuilder(out, t0, other_data)
    if first is not None:
        builder.add(first)
        for ev in it:
            builder.add(ev)
    return builder.finish()


def export_perfetto(run_dir: str | Path, out: str | Path, stats: ReadStats | None = None) -> ExportResult:
    """Write the run's timeline to ``out`` (``-``: stdout; ``*.gz``: gzip-compressed).

    ``ts`` 0 is the run's first event (usually ``engine_config``, written when the
    scheduler is built: the engine's start-up before it is left out); earlier request
    arrivals are clamped to 0.

    Raises:
        PerfettoError: no event file in ``run_dir``.
        OSError: the output cannot be written.
    """
    from .jsonl import ExportError

    run_dir = Path(run_dir)
    stats = stats if stats is not None else ReadStats()
    if not event_files(run_dir):
        raise ExportError(f"no event files (events-*.jsonl) in {run_dir}")
    meta = read_meta(run_dir)
    events = iter_run(run_dir, stats)
    first = next(events, None)
    t0 = first["ts"] if first is not None else 0.0
    other = {"run_dir": str(run_dir), "command": meta.get("command"), "run_start_epoch_s": meta.get("start_time")}

    def chained():
        if first is not None:
            yield first
        yield from events

    if str(out) == "-":
        result = build_trace(chained(), sys.stdout.buffer, t0, other)
        sys.stdout.buffer.flush()
        return result
    path = Path(out)
    if path.suffix == ".gz":
        with gzip.open(path, "wb", compresslevel=6) as gz, io.BufferedWriter(gz, 1 << 20) as f:
            return build_trace(chained(), f, t0, other)
    with open(path, "wb", buffering=1 << 20) as f:
        return build_trace(chained(), f, t0, other)
