"""``vllm-probe report`` and ``export --format parquet`` against ``summary``, and a fleet's
question in one DuckDB query against ``summary --json`` run by run.

    python -m benchmarks.bench_report --recordings RUN [RUN ...]       # 1,000,000 events, 100 fleet runs
    python -m benchmarks.bench_report --run /tmp/big --recordings RUN  # reuse a generated run

1. **One long run** (``--events``, default 1,000,000, two engine cores: the generator of
   :mod:`benchmarks.bench_analysis`, or ``--run DIR``): in this process, round by round
   (``--repeat``; the least of each is kept, so the shared machine's load hits all alike),
   the ``summary --json`` analysis (:func:`~vllm_probe.analysis.summary.analyze_story`
   and its JSON), the report (:func:`~vllm_probe.analysis.report.read_run`, the page
   rendered and written) and ``export --format parquet``; then the page's size and the
   Parquet tables' size against the JSONL's. Targets: report ≤ 2× summary's time; Parquet
   ≤ 15 % of the JSONL.
2. **A fleet** (``--fleet-runs``, default 100): real recordings (``--recordings``), copied
   round-robin with shifted ids — request ids, pid and timestamps (one hour apart), ten
   hosts — each exported to Parquet; then the question "preemptions per hour of stepping,
   per server and max_num_seqs" answered by docs/fleet.md's one DuckDB query over the
   folder, against the same answer built from ``vllm-probe summary --json`` per run (the
   loop an operator would write; also timed in-process with
   :func:`~vllm_probe.analysis.summary.summarize`, without the interpreter's start-up).
   Target: the query ≥ 20× faster than the per-run loop, with equal answers.

Every time is printed with ``os.getloadavg()`` beside it (run it when the machine is
quiet: the load average below ~1.5 on two cores).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TARGET_REPORT = 2.0
TARGET_PARQUET = 0.15
TARGET_FLEET = 20.0
PAGE_LIMIT_MB = 5.0

#: docs/fleet.md's query over a folder of runs' Parquet tables ({fleet}: the folder).
FLEET_QUERY = """
WITH spans AS (
  SELECT run_id, host, any_value(max_num_seqs) AS max_num_seqs,
         max(last_step_ts) - min(first_step_start_ts) AS seconds
  FROM read_parquet('{fleet}/*/runs.parquet') GROUP BY run_id, host),
events AS (SELECT run_id, engine, count(*) AS n FROM read_parquet('{fleet}/*/preemptions.parquet')
           GROUP BY run_id, engine),
lists AS (SELECT run_id, engine, sum(len(preempted)) AS n FROM read_parquet('{fleet}/*/steps.parquet')
          GROUP BY run_id, engine),
per_run AS (SELECT run_id, sum(greatest(coalesce(events.n, 0), coalesce(lists.n, 0))) AS preemptions
            FROM lists FULL JOIN events USING (run_id, engine) GROUP BY run_id)
SELECT host, max_num_seqs, count(*) AS runs, sum(coalesce(preemptions, 0)) AS preemptions,
       sum(seconds) / 3600 AS hours, sum(coalesce(preemptions, 0)) / (sum(seconds) / 3600) AS per_hour
FROM spans LEFT JOIN per_run USING (run_id) GROUP BY host, max_num_seqs ORDER BY host, max_num_seqs
"""


def load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def _fetch(query: str) -> list[tuple[Any, ...]]:
    """The rows of one DuckDB query (a query always has a result relation)."""
    import duckdb

    rel = duckdb.sql(query)
    assert rel is not None
    return rel.fetchall()


def timed(fn):
    gc.collect()
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def size_of(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# -- the long run ------------------------------------------------------------------------


def long_run(run: Path, work: Path, repeat: int) -> dict:
    from vllm_probe.analysis import reading
    from vllm_probe.analysis.report import read_run
    from vllm_probe.analysis.summary import analyze_story
    from vllm_probe.exporters.parquet import export_parquet
    from vllm_probe.html.report import render, write
    from vllm_probe.runs.rundir import event_files

    page, tables = work / "report.html", work / "parquet"

    def summary():
        reading.clear()  # a read of the files each time, as one summary command does
        _, s = analyze_story(run)
        return json.dumps(s.to_dict())

    def report():
        text = render([read_run(run)])
        write(page, text)
        return len(text.encode())

    def parquet():
        return export_parquet(run, tables)

    best: dict[str, tuple[float, str]] = {}
    for r in range(repeat):
        for name, fn in (("summary", summary), ("report", report), ("export parquet", parquet)):
            secs, _ = timed(fn)
            print(f"  round {r + 1}: {name:<15} {secs:7.2f} s   ({load()})", flush=True)
            if name not in best or secs < best[name][0]:
                best[name] = (secs, load())
    jsonl = sum(p.stat().st_size for p in event_files(run))
    return {"times": best, "page_bytes": page.stat().st_size, "parquet_bytes": size_of(tables), "jsonl_bytes": jsonl}


# -- the fleet ---------------------------------------------------------------------------


def make_fleet(recordings: list[Path], n: int, root: Path) -> list[Path]:
    """``n`` runs copied round-robin from ``recordings``: request ids prefixed with the
    copy's number, pid shifted, timestamps one hour apart, ten hosts."""
    from vllm_probe.runs.rundir import event_files, read_meta

    runs = []
    for i in range(n):
        src = recordings[i % len(recordings)]
        dst = root / "runs" / f"run-{i:03d}"
        dst.mkdir(parents=True)
        shift = 3600.0 * (i + 1)
        for path in event_files(src):
            if path.name.endswith(".gz"):
                raise SystemExit(f"{path}: give recordings without gzipped segments")
            pid = 100_000 + i
            with open(path) as f, open(dst / f"events-{pid}.jsonl", "w") as out:
                for line in f:
                    ev = json.loads(line)
                    ev["ts"] += shift
                    ev["pid"] = pid
                    if "arrival_ts" in ev:
                        ev["arrival_ts"] += shift
                    for key in ("req_id",):
                        if key in ev:
                            ev[key] = f"{i}x{ev[key]}"
                    for key in ("preempted", "finished"):
                        if key in ev:
                            ev[key] = [f"{i}x{r}" for r in ev[key]]
                    out.write(json.dumps(ev) + "\n")
        meta = read_meta(src)
        meta.update(host=f"host-{i % 10:02d}", start_time=(meta.get("start_time") or 0) + shift,
                    end_time=(meta.get("end_time") or 0) + shift)
        (dst / "meta.json").write_text(json.dumps(meta))
        runs.append(dst)
    return runs


def per_run_answer(summaries: list[tuple[str, dict]]) -> list[tuple]:
    """The fleet query's answer built from each run's ``summary --json`` (and its host)."""
    by: dict[tuple, list] = {}
    for host, s in summaries:
        e = by.setdefault((host, s["config"].get("max_num_seqs")), [0, 0, 0.0])
        e[0] += 1
        e[1] += s["preemptions"]["count"]
        e[2] += s["duration_s"] or 0.0
    return [(h, m, n, p, secs / 3600, p / (secs / 3600) if secs else None)
            for (h, m), (n, p, secs) in sorted(by.items())]


def same(a: list[tuple], b: list[tuple]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x[:4] != tuple(y[:4]):
            return False
        for u, v in zip(x[4:], y[4:]):
            if (u is None) != (v is None) or (u is not None and abs(u - v) > 1e-9 * max(abs(u), 1.0)):
                return False
    return True


def fleet(recordings: list[Path], n: int, work: Path) -> dict:

    from vllm_probe.analysis.summary import summarize
    from vllm_probe.exporters.parquet import export_parquet

    runs = make_fleet(recordings, n, work)
    hosts = {r.name: json.loads((r / "meta.json").read_text())["host"] for r in runs}
    tables = work / "fleet"
    secs_export, _ = timed(lambda: [export_parquet(r, tables / r.name) for r in runs])
    print(f"  export --format parquet of {n} runs: {secs_export:.2f} s   ({load()})", flush=True)
    query = FLEET_QUERY.format(fleet=tables)
    _fetch(query)  # DuckDB's own start-up (extension loading) is not the query's
    secs_query, rows = timed(lambda: _fetch(query))
    q_load = load()
    print(f"  DuckDB query over {n} runs' Parquet: {secs_query * 1000:.1f} ms   ({q_load})", flush=True)

    def cli_loop():
        out = []
        for r in runs:
            proc = subprocess.run([sys.executable, "-m", "vllm_probe", "summary", str(r), "--json"],
                                  capture_output=True, text=True, cwd=ROOT, check=True)
            out.append((hosts[r.name], json.loads(proc.stdout)))
        return out

    secs_cli, cli = timed(cli_loop)
    c_load = load()
    print(f"  summary --json per run ({n} processes): {secs_cli:.2f} s   ({c_load})", flush=True)
    secs_inproc, inproc = timed(lambda: [(hosts[r.name], summarize(r).to_dict()) for r in runs])
    i_load = load()
    print(f"  summarize() per run in one process: {secs_inproc:.2f} s   ({i_load})", flush=True)
    want = per_run_answer(cli)
    return {"rows": rows, "want": want, "equal": same(rows, want) and same(rows, per_run_answer(inproc)),
            "query_s": (secs_query, q_load), "cli_s": (secs_cli, c_load), "inproc_s": (secs_inproc, i_load),
            "export_s": secs_export, "parquet_bytes": size_of(tables),
            "jsonl_bytes": sum(size_of(r) for r in runs)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=1_000_000, help="events of the generated run (default 1,000,000)")
    p.add_argument("--run", type=Path, help="use this run instead of generating one")
    p.add_argument("--recordings", type=Path, nargs="*", default=[],
                   help="real recorded runs the fleet is copied from (default: none, no fleet part)")
    p.add_argument("--fleet-runs", type=int, default=100)
    p.add_argument("--repeat", type=int, default=2, help="rounds of the long run's timings (the least is kept)")
    p.add_argument("--skip-long", action="store_true", help="only the fleet part")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-report-"))
    print(f"bench_report: {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, {load()}", flush=True)
    ok = True
    try:
        if not args.skip_long:
            run = args.run
            if run is None:
                from benchmarks.bench_analysis import generate_run

                run = work / "run"
                print(f"generating a run of {args.events:,} events ...", flush=True)
                generate_run(run, args.events)
            print(f"long run: {run}", flush=True)
            res = long_run(run, work, args.repeat)
            t = res["times"]
            s, r, x = t["summary"][0], t["report"][0], t["export parquet"][0]
            page_mb = res["page_bytes"] / 1e6
            share = res["parquet_bytes"] / res["jsonl_bytes"]
            print("\n| figure | value | target | load (1, 5, 15 min) |\n|---|---|---|---|")
            print(f"| summary --json | {s:.2f} s | | {t['summary'][1]} |")
            print(f"| report | {r:.2f} s = {r / s:.2f}× summary | ≤ {TARGET_REPORT:.0f}× "
                  f"{'met' if r / s <= TARGET_REPORT else 'MISSED'} | {t['report'][1]} |")
            print(f"| export --format parquet | {x:.2f} s = {x / s:.2f}× summary | | {t['export parquet'][1]} |")
            verdict = "met" if page_mb < PAGE_LIMIT_MB else "MISSED"
            print(f"| page | {page_mb:.2f} MB | < {PAGE_LIMIT_MB:.0f} MB {verdict} | |")
            print(f"| Parquet / JSONL | {res['parquet_bytes'] / 1e6:.1f} MB / {res['jsonl_bytes'] / 1e6:.1f} MB = "
                  f"{share * 100:.1f} % | ≤ {TARGET_PARQUET * 100:.0f} % "
                  f"{'met' if share <= TARGET_PARQUET else 'MISSED'} | |")
            ok &= r / s <= TARGET_REPORT and share <= TARGET_PARQUET and page_mb < PAGE_LIMIT_MB
        if args.recordings:
            print(f"\nfleet: {args.fleet_runs} runs from {', '.join(map(str, args.recordings))}", flush=True)
            f = fleet(args.recordings, args.fleet_runs, work)
            q, c, i = f["query_s"][0], f["cli_s"][0], f["inproc_s"][0]
            print("\n| figure | value | target | load |\n|---|---|---|---|")
            print(f"| DuckDB query, {args.fleet_runs} runs' Parquet | {q * 1000:.1f} ms | | {f['query_s'][1]} |")
            print(f"| summary --json per run | {c:.2f} s = {c / q:,.0f}× the query | ≥ {TARGET_FLEET:.0f}× "
                  f"{'met' if c / q >= TARGET_FLEET else 'MISSED'} | {f['cli_s'][1]} |")
            print(f"| summarize() per run, one process | {i:.2f} s = {i / q:,.0f}× the query | | {f['inproc_s'][1]} |")
            print(f"| answers equal | {f['equal']} | equal | |")
            print(f"| fleet Parquet / JSONL | {f['parquet_bytes'] / 1e6:.2f} MB / {f['jsonl_bytes'] / 1e6:.2f} MB = "
                  f"{f['parquet_bytes'] / f['jsonl_bytes'] * 100:.1f} % | | |")
            print("\nthe query's answer (host, max_num_seqs, runs, preemptions, hours, per hour):")
            for row in f["rows"]:
                print("  ", row)
            ok &= f["equal"] and c / q >= TARGET_FLEET
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
