"""A run as Parquet tables, for SQL over many runs (``vllm-probe export --format parquet -o DIR``).

One file per table in ``DIR`` (docs/fleet.md queries a folder of many runs' with DuckDB):

* ``steps.parquet``, ``chunks.parquet``, ``preemptions.parquet``: one row per ``step``,
  ``chunk`` and ``preempt`` event, every field of the kind (docs/events.md: names and
  units as in the JSON lines; ``list[string]`` fields as lists; ``ts`` epoch seconds);
* ``requests.parquet``: one row per request the run saw, with its latencies as the
  state computes them (:class:`~vllm_probe.analysis.requests.RequestState`: queue time,
  TTFT in seconds and steps, decode time, mean inter-token time, end-to-end, seconds),
  ``finished`` false for requests still in flight when the events end;
* ``runs.parquet``: one row per engine core: ``meta.json``'s command, times, exit code
  and ``simulated``, every ``engine_config`` field (the settings in force; ``object``
  fields as JSON text), and the span its steps cover (``first_step_start_ts``: the first
  step's ``ts`` minus its ``schedule_us``; ``last_step_ts``: so ``max(last_step_ts) -
  min(first_step_start_ts)`` over a run is ``summary``'s ``duration_s``).

Every table starts with the keys ``run_id`` (the run directory's name), ``host``
(``meta.json``'s ``host``, which ``vllm-probe run`` records, or the one given), ``engine``
(data-parallel rank) and ``step`` (``requests``: the step before which it arrived;
``runs``: the first step read). Each file's metadata holds ``vllm_probe.schema_version``
(the events' :data:`~vllm_probe.schema.events.SCHEMA_VERSION`),
``vllm_probe.parquet_version`` (:data:`PARQUET_VERSION`: this layout) and
``vllm_probe.table``.

The run is read once, as every reader reads it (:mod:`vllm_probe.runs.reader`:
segments in order, ``.gz`` included, as one stream per engine core), through the one
state (:class:`~vllm_probe.analysis.state.RunState`), which gives the requests'
latencies. Rows are written in row groups of :data:`ROW_GROUP` (memory: one group per
table), zstd-compressed. The folder is written whole (a temporary renamed when
complete, files 0600: :func:`~vllm_probe.runs.rundir.atomic_dir`); a folder that holds
anything but these tables is never replaced. Needs the ``fleet`` extra (pyarrow).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, BinaryIO

from msgspec.structs import astuple, fields

from ..analysis.requests import RequestState
from ..analysis.state import RunState
from ..runs.reader import ReadStats, iter_file_batches
from ..runs.rundir import NoEventsError, atomic_dir, event_files, read_meta
from ..schema.events import KINDS, SCHEMA_VERSION
from ..schema.records import STRUCTS
from .base import ExportError, ExportResult

#: The layout of the tables (bumped when a column changes meaning or goes).
PARQUET_VERSION = 1
#: Rows buffered per table before they are written as a row group.
ROW_GROUP = 65_536
#: The event tables: table name -> event kind.
EVENT_TABLES = {"steps": "step", "chunks": "chunk", "preemptions": "preempt"}
#: Every table, in the order written.
TABLES = ("steps", "chunks", "preemptions", "requests", "runs")
#: The key columns every table starts with.
KEYS = ("run_id", "host", "engine", "step")
#: Per request: column, Arrow type name, the :class:`RequestState` attribute it reads.
REQUEST_COLUMNS = (
    ("req_id", "string", "req_id"), ("finished", "bool", None), ("prompt_len", "int", "prompt_len"),
    ("max_tokens", "int", "max_tokens"), ("priority", "int", "priority"), ("arrival_ts", "float", "arrival_ts"),
    ("first_scheduled_ts", "float", "first_scheduled_ts"), ("first_scheduled_step", "int", "first_scheduled_step"),
    ("first_token_ts", "float", "first_token_ts"), ("first_token_step", "int", "first_token_step"),
    ("finished_ts", "float", "finished_ts"), ("finish_reason", "string", "finish_reason"),
    ("output_tokens", "int", "output_tokens"), ("preemptions", "int", "preemptions"),
    ("discarded_tokens", "int", "discarded_tokens"), ("recomputed_tokens", "int", "recomputed_tokens"),
    ("chunks", "int", "chunks"), ("prefix_hit_tokens", "int", "prefix_hit_tokens"),
    ("queue_s", "float", "queue_time_s"), ("ttft_s", "float", "ttft_s"), ("ttft_steps", "int", "ttft_steps"),
    ("decode_s", "float", "decode_time_s"), ("itl_s", "float", "mean_itl_s"), ("e2e_s", "float", "e2e_s"),
    ("before_window", "bool", "before_window"),
)
#: ``meta.json`` fields in the runs table: column, Arrow type name.
META_COLUMNS = (("command", "string"), ("start_time", "float"), ("end_time", "float"), ("exit_code", "int"),
                ("simulated", "bool"))


class ParquetExporter:
    """``--format parquet``: one Parquet file per table in the ``-o`` folder."""

    name = "parquet"
    default_file = "parquet"
    help = ("Parquet tables (steps, chunks, preemptions, requests, runs) in the folder -o DIR, for SQL over many runs "
            "(pip install 'vllm-probe[fleet]')")
    takes_filters = False

    def export(self, run_dir: Path, out: str | Path | BinaryIO, filters: Any, stats: ReadStats) -> ExportResult:
        if not isinstance(out, (str, Path)) or str(out) == "-":
            raise ExportError("--format parquet writes a folder of files: give it with -o DIR")
        return export_parquet(run_dir, Path(out), stats)


def _arrow() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ExportError("--format parquet needs pyarrow: pip install 'vllm-probe[fleet]'") from None
    return pa, pq


def _types(pa: Any) -> dict[str, Any]:
    return {"int": pa.int64(), "float": pa.float64(), "string": pa.string(), "bool": pa.bool_(),
            "list[string]": pa.list_(pa.string()), "object": pa.string(), "list[kv_group]": pa.string()}


def _json(v: Any) -> str | None:
    return None if v is None else json.dumps(v, separators=(",", ":"), sort_keys=True)


class _Table:
    """One table's writer: rows buffered per column, a row group written when full."""

    def __init__(self, pa: Any, pq: Any, path: Path, name: str, columns: list[tuple[str, str]],
                 metadata: dict[str, str]) -> None:
        self.pa = pa
        types = _types(pa)
        self.names = [c for c, _ in columns]
        self.objects = {c for c, t in columns if t in ("object", "list[kv_group]")}  # as JSON text
        self.schema = pa.schema([pa.field(c, types[t]) for c, t in columns],
                                metadata={**metadata, "vllm_probe.table": name})
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self.file = os.fdopen(fd, "wb")
        self.writer = pq.ParquetWriter(self.file, self.schema, compression="zstd")
        self.columns: list[list[Any]] = [[] for _ in self.names]
        self.rows = 0

    def add_columns(self, columns: list[Any]) -> None:
        """Append rows given as columns (one list per column, in order, equal lengths)."""
        for mine, more in zip(self.columns, columns):
            mine.extend(more)
        if len(self.columns[0]) >= ROW_GROUP:
            self.flush()

    def flush(self) -> None:
        n = len(self.columns[0])
        if not n:
            return
        arrays = []
        for name, col, field in zip(self.names, self.columns, self.schema):
            if name in self.objects:
                col = [_json(v) for v in col]
            arrays.append(self.pa.array(col, type=field.type))
        self.writer.write_table(self.pa.Table.from_arrays(arrays, schema=self.schema))
        self.rows += n
        self.columns = [[] for _ in self.names]

    def close(self) -> None:
        self.flush()
        self.writer.close()
        self.file.close()


def _event_columns(kind: str) -> list[tuple[str, str]]:
    """The keys, then ``ts``, ``pid``, ``schema`` and every field of ``kind``."""
    fields = [(f.name, f.type) for f in KINDS[kind].fields if f.name not in KEYS]
    return [("run_id", "string"), ("host", "string"), ("engine", "int"), ("step", "int"), ("ts", "float"),
            ("pid", "int"), ("schema", "int"), *fields]


def export_parquet(run_dir: str | Path, out: str | Path, stats: ReadStats | None = None,
                   host: str | None = None, run_id: str | None = None) -> ExportResult:
    """Write the run in ``run_dir`` as Parquet tables into the folder ``out`` (see the
    module docstring). ``host``: the server's name when ``meta.json`` has none;
    ``run_id``: the run's id (default: the run directory's name). ``written`` counts
    rows, ``matched`` events.

    Raises:
        NoEventsError: no event file, or no readable event in them.
        ExportError: pyarrow is missing; ``out`` holds something other than these tables.
        OSError: the folder cannot be written (nothing is left under its name).
    """
    pa, pq = _arrow()
    run_dir, out = Path(run_dir), Path(out)
    stats = stats if stats is not None else ReadStats()
    files = event_files(run_dir)
    if not files:
        raise NoEventsError(f"no event files (events-*.jsonl) in {run_dir}")
    if out.exists() and (not out.is_dir() or any(p.name not in {f"{t}.parquet" for t in TABLES}
                                                 for p in out.iterdir())):
        raise ExportError(f"{out} exists and is not a folder of vllm-probe Parquet tables; choose another -o")
    meta = read_meta(run_dir)
    run_id = run_id or run_dir.resolve().name
    host = meta.get("host") if isinstance(meta.get("host"), str) else host
    metadata = {"vllm_probe.schema_version": str(SCHEMA_VERSION), "vllm_probe.parquet_version": str(PARQUET_VERSION),
                "vllm_probe.run_id": run_id}
    requests: list[RequestState] = []
    state = RunState(step_window=0, on_request_finished=requests.append, buckets=False)
    with atomic_dir(out) as tmp:
        tables: dict[str, _Table] = {}
        try:
            for name, kind in EVENT_TABLES.items():
                tables[name] = _Table(pa, pq, tmp / f"{name}.parquet", name, _event_columns(kind), metadata)
            routes = {STRUCTS[kind]: (tables[name], _positions(kind)) for name, kind in EVENT_TABLES.items()}
            for path in files:
                for batch in iter_file_batches(path, stats):
                    state.apply_batch(batch)
                    _route(batch, routes, run_id, host)
            if stats.events == 0:
                raise NoEventsError(f"no readable events in {run_dir} ({stats.describe()})")
            tables["requests"] = _Table(pa, pq, tmp / "requests.parquet", "requests", _request_columns(), metadata)
            _requests(tables["requests"], requests, state, run_id, host)
            tables["runs"] = _Table(pa, pq, tmp / "runs.parquet", "runs", _run_columns(), metadata)
            _runs(tables["runs"], state, meta, run_id, host)
        finally:
            for t in tables.values():
                t.close()
    rows = {name: t.rows for name, t in tables.items()}
    return ExportResult(written=sum(rows.values()), matched=stats.events, unit="rows",
                        note=f"{len(rows)} tables in {out}: " + ", ".join(f"{n} {r:,}" for n, r in rows.items()))


def _positions(kind: str) -> list[int]:
    """Where each column after ``run_id`` and ``host`` is in a record of ``kind`` as a tuple."""
    order = [f.name for f in fields(STRUCTS[kind])]
    return [order.index(c) for c, _ in _event_columns(kind)[2:]]


def _route(batch: list[Any], routes: dict[type, tuple[_Table, list[int]]], run_id: str, host: str | None) -> None:
    """Append a batch's step, chunk and preempt records to their tables, column by column
    (records as tuples, transposed: no Python code per field)."""
    by_kind: dict[type, list[Any]] = {}
    for rec in batch:
        kind = type(rec)
        if kind in routes:
            recs = by_kind.get(kind)
            if recs is None:
                recs = by_kind[kind] = []
            recs.append(rec)
    for kind, recs in by_kind.items():
        table, positions = routes[kind]
        n = len(recs)
        columns = list(zip(*map(astuple, recs)))
        table.add_columns([[run_id] * n, [host] * n, *(columns[i] for i in positions)])


def _request_columns() -> list[tuple[str, str]]:
    return [("run_id", "string"), ("host", "string"), ("engine", "int"), ("step", "int"),
            *((c, t) for c, t, _ in REQUEST_COLUMNS)]


def _requests(table: _Table, finished: list[RequestState], state: RunState, run_id: str, host: str | None) -> None:
    in_flight = [r for e in state.engines.values() for r in e.requests.values()]
    for done, reqs in ((True, finished), (False, in_flight)):
        for i in range(0, len(reqs), ROW_GROUP):
            part = reqs[i:i + ROW_GROUP]
            n = len(part)
            cols: list[list[Any]] = [[run_id] * n, [host] * n, [r.engine for r in part],
                                     [None if r.before_window else r.arrival_step for r in part]]
            for _, _, attr in REQUEST_COLUMNS:
                cols.append([done] * n if attr is None else [getattr(r, attr) for r in part])
            table.add_columns(cols)


def _run_columns() -> list[tuple[str, str]]:
    config = [(f.name, f.type) for f in KINDS["engine_config"].fields]
    return [("run_id", "string"), ("host", "string"), ("engine", "int"), ("step", "int"), *META_COLUMNS,
            ("first_step_start_ts", "float"), ("last_step_ts", "float"), ("steps", "int"), *config]


def _runs(table: _Table, state: RunState, meta: dict[str, Any], run_id: str, host: str | None) -> None:
    command = " ".join(meta["command"]) if isinstance(meta.get("command"), list) else None
    simulated = meta.get("simulated") if isinstance(meta.get("simulated"), bool) else None
    rows = []
    for idx in state.engine_ids():
        eng = state.engines[idx]
        spans = eng.timeline.spans
        first = spans[0].first_step if spans else None
        cfg = eng.config
        rows.append([run_id, host, idx, first, command, meta.get("start_time"), meta.get("end_time"),
                     meta.get("exit_code"), simulated, eng.stepping_since, eng.last_step_ts, eng.steps,
                     *(getattr(cfg, f.name, None) if cfg is not None else None
                       for f in KINDS["engine_config"].fields)])
    if rows:
        table.add_columns([list(col) for col in zip(*rows)])
