"""Soak: vLLM's OpenAI server under ``vllm-probe run --metrics-port`` for a given time.

    python benchmarks/soak.py --minutes 60 --out /tmp/soak/hour
    python benchmarks/soak.py --minutes 3            # the CI mode (tests/benchmarks/test_soak.py)

What it does:

1. Writes a settings file whose ``scheduler_probe`` section sets small segment limits
   (``max_segment_mb``, ``rotate_every_s``, ``compress_segments``, ``keep_mb``,
   ``keep_hours``; ``--no-segments`` leaves them out) and starts
   ``vllm-probe run --settings F --out RUN --metrics-port P -- python -m
   vllm.entrypoints.openai.api_server`` on the tiny model (dummy weights, 127.0.0.1 only).
2. A bounded load generator on loopback (:class:`Load`): ``--concurrency`` client threads
   send completions of mixed lengths (prompts of 24-700 token ids, 16-256 output tokens,
   ``ignore_eos`` so the server generates exactly ``max_tokens``) in bursts: every
   ``BURST_PERIOD_S`` the first ``BURST_S`` seconds use every thread, the rest one thread
   in four with a pause between requests. With 24 KV blocks of 128 tokens (3,072 tokens)
   and 12 requests of up to ~950 tokens in flight, bursts preempt. It stops by itself at
   the deadline or after ``--max-requests``, and counts what it got back: requests
   answered 200, their ``usage.completion_tokens`` and ``usage.prompt_tokens``.
3. Every ``--sample-s`` seconds it samples the engine core's RSS (``VmRSS`` of the pid in
   ``events-<pid>...``), the ``vllm-probe run`` process's RSS (the metrics sidecar: it
   follows the run and serves ``/metrics``), the run directory's disk use (sum of its
   files' sizes), its segment count, and the sidecar's ``vllm_probe_steps_total``,
   ``_requests_finished_total``, ``_events_dropped_total``, ``_hook_errors_total``.
   Disk use is also checked every ``ARCHIVE_POLL_S`` for the maximum.
4. Retention deletes the run's oldest segments, so the soak keeps every segment it sees
   through a hard link in ``OUT/archive`` (same inode, no copy: the run directory's own
   disk use is unchanged; a ``.jsonl`` linked while open goes on growing with the
   writer's appends). At the end it reads every archived segment with the project's
   reader (``vllm-probe summary --json`` on the archive, and one pass of
   :func:`vllm_probe.runs.reader.iter_run` for step contiguity and ``probe_stats``) and
   checks them against the load generator's counts; ``summary`` of the run directory
   itself (what retention left) is run too and its counts reported.
5. Prints a table and writes the result as JSON (``OUT/result.json``; ``--out`` defaults
   to a new folder under ``/tmp``, never in the repository).

RSS growth after warm-up (:func:`growth`): warm-up is the first ``--warmup-min`` minutes
(default: a sixth of the run, at least 1 minute, at most 10), during which the engine
core's and the sidecar's buffers, the sidecar's windows and Python's allocator arenas
fill. The baseline is the median of the samples of the minute after warm-up (at least
3 samples), the end value the median of the last minute's samples; growth = end /
baseline - 1. A least-squares slope over the samples after warm-up is given too (MiB
per hour).

Exit code 0 when every check holds (0 dropped, 0 hook errors, the archive's requests
and output tokens equal to the client's, steps contiguous, disk within ``keep_mb`` + one
segment), 1 otherwise. Numbers: block size 128 and the tiny model's speed are this
machine's (docs/guarantees.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from collections.abc import Iterator
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: A burst every this many seconds ...
BURST_PERIOD_S = 40.0
#: ... lasting this long (every client thread); the rest of the period one thread in four.
BURST_S = 15.0
#: Pause between two requests of one thread outside bursts (s): keeps the quiet phase quiet.
LULL_PAUSE_S = 0.5
#: (prompt tokens, weight) and (max_tokens, weight) of the mix; the largest pair (700 +
#: 256) stays under the server's --max-model-len 1024.
PROMPT_MIX = ((24, 4), (120, 3), (350, 2), (700, 1))
OUTPUT_MIX = ((16, 3), (64, 3), (160, 2), (256, 1))
#: The tiny model's vocabulary (vllm_probe.sim.tiny_model): prompt token ids stay below it.
VOCAB = 512  # == vllm_probe.sim.tiny_model.VOCAB_SIZE (a test checks)
#: Seconds between two looks for new segments to link into the archive (and disk use).
ARCHIVE_POLL_S = 0.25
#: Server command line (the tiny model on CPU, as examples/serve.sh): 24 KV blocks of
#: 128 tokens (3,072 tokens), so bursts of 12 requests preempt.
SERVER_ARGS = ("--load-format", "dummy", "--enforce-eager", "--dtype", "float32", "--max-model-len", "1024",
               "--max-num-batched-tokens", "512", "--num-gpu-blocks-override", "24",
               "--gpu-memory-utilization", "0.3")
MIB = 1 << 20


@dataclass
class SoakConfig:
    """One soak's settings. Sizes in MB as the probe's settings take them (``max_segment_mb``,
    ``keep_mb``); None leaves a setting out (the probe's default)."""

    minutes: float = 3.0
    out: Path | None = None
    sample_s: float = 5.0
    warmup_min: float | None = None
    concurrency: int = 12
    max_requests: int = 1_000_000
    seed: int = 0
    segments: bool = True
    max_segment_mb: float | None = 0.25
    rotate_every_s: float | None = None
    compress_segments: bool | None = True
    keep_mb: float | None = 0.25
    keep_hours: float | None = None
    #: the control run: the same server and load without the probe (RSS only, no checks)
    probe: bool = True

    def probe_settings(self) -> dict[str, Any]:
        """The settings file's ``scheduler_probe`` section."""
        if not self.segments:
            return {}
        names = ("max_segment_mb", "rotate_every_s", "compress_segments", "keep_mb", "keep_hours")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    def warmup_s(self) -> float:
        if self.warmup_min is not None:
            return self.warmup_min * 60
        return min(max(self.minutes * 60 / 6, 60.0), 600.0)


# -- the load generator ------------------------------------------------------------------


@dataclass
class ClientCounts:
    """What the load generator sent and got back."""

    sent: int = 0
    ok: int = 0  # answered 200
    failed: int = 0  # any other answer or an error
    prompt_tokens: int = 0  # usage.prompt_tokens of the ok ones
    output_tokens: int = 0  # usage.completion_tokens of the ok ones
    errors: list[str] = field(default_factory=list)  # the first few, for the report


class Load:
    """A bounded load generator: ``threads`` clients on ``base`` (loopback), bursts, mixed
    lengths; stops at ``deadline`` (time.time()) or after ``max_requests`` sent."""

    def __init__(self, base: str, model: str, threads: int, deadline: float, max_requests: int, seed: int) -> None:
        self.base, self.model, self.threads = base, model, threads
        self.deadline, self.max_requests = deadline, max_requests
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.counts = ClientCounts()
        self.t0 = time.time()
        self._workers: list[threading.Thread] = []
        self.stop_event = threading.Event()

    def _next(self) -> tuple[list[int], int] | None:
        with self.lock:
            if self.counts.sent >= self.max_requests or time.time() >= self.deadline or self.stop_event.is_set():
                return None
            self.counts.sent += 1
            n = self.rng.choices([p for p, _ in PROMPT_MIX], [w for _, w in PROMPT_MIX])[0]
            m = self.rng.choices([o for o, _ in OUTPUT_MIX], [w for _, w in OUTPUT_MIX])[0]
            start = self.rng.randrange(VOCAB)
        # token ids (exact prompt lengths, no tokenizer); each prompt its own, so no prefix-cache hits
        return [3 + (start + j * 7) % (VOCAB - 3) for j in range(n)], m

    def _active(self, i: int) -> bool:
        burst = (time.time() - self.t0) % BURST_PERIOD_S < BURST_S
        return burst or i % 4 == 0

    def _worker(self, i: int) -> None:
        while not self.stop_event.is_set() and time.time() < self.deadline:
            if not self._active(i):
                time.sleep(0.2)
                continue
            nxt = self._next()
            if nxt is None:
                return
            prompt, max_tokens = nxt
            body = json.dumps({"model": self.model, "prompt": prompt, "max_tokens": max_tokens,
                               "temperature": 0.0, "ignore_eos": True}).encode()
            req = urllib.request.Request(f"{self.base}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=600) as r:
                    usage = json.load(r).get("usage") or {}
                    status = r.status
            except (OSError, ValueError) as e:
                with self.lock:
                    self.counts.failed += 1
                    if len(self.counts.errors) < 5:
                        self.counts.errors.append(f"{type(e).__name__}: {e}")
                time.sleep(1.0)  # no hot loop against a server that refuses
                continue
            with self.lock:
                if status == 200:
                    self.counts.ok += 1
                    self.counts.prompt_tokens += usage.get("prompt_tokens") or 0
                    self.counts.output_tokens += usage.get("completion_tokens") or 0
                else:
                    self.counts.failed += 1
            if not (time.time() - self.t0) % BURST_PERIOD_S < BURST_S:
                time.sleep(LULL_PAUSE_S)

    def start(self) -> None:
        for i in range(self.threads):
            t = threading.Thread(target=self._worker, args=(i,), daemon=True, name=f"soak-client-{i}")
            t.start()
            self._workers.append(t)

    def join(self, timeout: float) -> bool:
        """Wait for every client to finish its last request; False if some did not."""
        end = time.time() + timeout
        for t in self._workers:
            t.join(max(0.0, end - time.time()))
        return not any(t.is_alive() for t in self._workers)


# -- watching the processes and the run directory ------------------------------------------


def rss_mib(pid: int | None) -> float | None:
    """Resident set size of ``pid`` (MiB, /proc/PID/status VmRSS); None when gone."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


@dataclass
class Disk:
    """One look at a run directory's files (bytes)."""

    total: int = 0  # every file
    events: int = 0  # event segments (events-*), .gz.tmp included
    in_transit: int = 0  # closed .jsonl segments not yet gzipped, and their .gz.tmp
    waiting: int = 0  # closed .jsonl segments not yet gzipped
    segments: int = 0  # event segment files
    names: list[str] = field(default_factory=list)  # event files (events-*), sorted


def dir_bytes(path: Path) -> Disk:
    """The disk use of the files directly in ``path``. A ``.jsonl`` segment is in transit
    when a later segment of its engine core exists (it is closed: the keeper gzips it and
    removes it); the open segment is the highest-numbered ``.jsonl``."""
    d = Disk()
    try:
        entries = list(os.scandir(path))
    except OSError:
        return d
    plain: dict[int, list[tuple[int, int]]] = {}
    for e in entries:
        try:
            if not e.is_file(follow_symlinks=False):
                continue
            size = e.stat(follow_symlinks=False).st_size
        except OSError:
            continue
        d.total += size
        if not e.name.startswith("events-"):
            continue
        d.events += size
        d.names.append(e.name)
        if e.name.endswith(".gz.tmp"):
            d.in_transit += size
            continue
        d.segments += 1
        m = _SEGMENT.match(e.name)
        if m and not m.group(3):
            plain.setdefault(int(m.group(1)), []).append((int(m.group(2) or 1), size))
    for segs in plain.values():
        segs.sort()
        d.in_transit += sum(size for _, size in segs[:-1])
        d.waiting += len(segs) - 1
    d.names.sort()
    return d


_SEGMENT = re.compile(r"^events-(\d+)(?:\.(\d+))?\.jsonl(\.gz)?$")


class Archive:
    """Hard links of every event segment seen in ``run_dir`` (retention cannot take them)."""

    def __init__(self, run_dir: Path, archive: Path) -> None:
        self.run_dir, self.dir = run_dir, archive
        archive.mkdir(parents=True, exist_ok=True)
        self.linked: dict[tuple[int, int], str] = {}  # (pid, segment) -> name linked
        self.max_bytes = 0  # every file of the run directory
        self.max_events = 0  # event segments
        self.started = time.monotonic()
        self.max_events_at = 0.0  # s since the archive started
        self.max_events_files: list[str] = []
        self.max_events_waiting = 0  # closed segments not yet gzipped at that peak
        self.max_settled = 0  # event segments less those in transit (see dir_bytes)
        self.max_segments = 0
        self.engine_pid: int | None = None

    def poll(self) -> None:
        d = dir_bytes(self.run_dir)
        self.max_bytes = max(self.max_bytes, d.total)
        if d.events > self.max_events:
            # when the event files peaked, and which were on disk: says whether the keeper lagged
            self.max_events, self.max_events_at = d.events, time.monotonic() - self.started
            self.max_events_files, self.max_events_waiting = d.names, d.waiting
        self.max_settled = max(self.max_settled, d.events - d.in_transit)
        self.max_segments = max(self.max_segments, d.segments)
        try:
            names = sorted(os.listdir(self.run_dir))
        except OSError:
            return
        for name in names:
            m = _SEGMENT.match(name)
            if not m:
                continue
            pid, seg = int(m.group(1)), int(m.group(2) or 1)  # segment 1: events-<pid>.jsonl
            self.engine_pid = self.engine_pid or pid
            if (pid, seg) in self.linked:
                continue
            try:
                os.link(self.run_dir / name, self.dir / name)
            except FileExistsError:
                pass
            except OSError:
                continue  # gone between listdir and link (compressed or deleted): try the next name
            self.linked[(pid, seg)] = name

    def missing_segments(self) -> list[tuple[int, int]]:
        """Segment numbers never seen, per engine core (gaps in 1..n)."""
        gaps = []
        for pid in {p for p, _ in self.linked}:
            segs = sorted(s for p, s in self.linked if p == pid)
            gaps += [(pid, s) for s in range(1, segs[-1] + 1) if s not in segs]
        return gaps

    def removed(self) -> int:
        """Segments seen that are in the run directory no more, as .jsonl nor .jsonl.gz
        (retention removed them)."""
        names = set(os.listdir(self.run_dir)) if self.run_dir.is_dir() else set()
        return sum(1 for name in self.linked.values()
                   if name.removesuffix(".gz") not in names and name.removesuffix(".gz") + ".gz" not in names)


def vllm_process(root: int, title: str) -> int | None:
    """The pid of the descendant of ``root`` whose command line is ``title`` (vLLM sets
    ``VLLM::EngineCore`` / ``VLLM::Worker`` as process titles); None if none."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().split(b"\0")[0].decode(errors="replace").startswith(title):
                    return pid
        except OSError:
            pass
        todo += children.get(pid, [])
    return None


def scrape(url: str) -> dict[str, float]:
    """The sidecar's counters the soak samples (summed over labels); {} when it does not answer."""
    from prometheus_client.parser import text_string_to_metric_families

    want = {"vllm_probe_steps_total", "vllm_probe_requests_finished_total", "vllm_probe_events_dropped_total",
            "vllm_probe_hook_errors_total", "vllm_probe_preemptions_total", "vllm_probe_lines_skipped_total"}
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
    except (OSError, ValueError):
        return {}
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in want:
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS's pick)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def growth(samples: list[dict], key: str, warmup_s: float) -> dict[str, float | None]:
    """RSS growth of ``key`` after warm-up (see the module docstring): baseline (median of
    the minute after warm-up), end (median of the last minute), growth (end / baseline - 1)
    and slope (MiB per hour, least squares over the samples after warm-up)."""
    pts = [(s["t"], s[key]) for s in samples if s.get(key) is not None and s["t"] >= warmup_s]
    if len(pts) < 3:
        return {"baseline_mib": None, "end_mib": None, "growth": None, "slope_mib_per_h": None}
    t_first, t_last = pts[0][0], pts[-1][0]
    base = [v for t, v in pts if t <= t_first + 60] or [pts[0][1]]
    if len(base) < 3:
        base = [v for _, v in pts[:3]]
    end = [v for t, v in pts if t >= t_last - 60]
    b, e = statistics.median(base), statistics.median(end)
    n = len(pts)
    mt, mv = sum(t for t, _ in pts) / n, sum(v for _, v in pts) / n
    den = sum((t - mt) ** 2 for t, _ in pts)
    slope = sum((t - mt) * (v - mv) for t, v in pts) / den * 3600 if den else 0.0
    return {"baseline_mib": round(b, 2), "end_mib": round(e, 2), "growth": round(e / b - 1, 4),
            "slope_mib_per_h": round(slope, 2)}


# -- reading the run at the end --------------------------------------------------------------


def read_archive(archive: Path) -> dict[str, Any]:
    """One pass of the project's reader over every archived segment: steps (count, first,
    last, gaps), request_finished (count, output tokens), the last ``probe_stats`` per
    engine core summed, lines skipped."""
    sys.path.insert(0, str(ROOT))
    from vllm_probe.runs.reader import ReadStats, iter_run

    stats = ReadStats()
    steps = gaps = finished = out_tokens = 0
    first = last = None
    final_stats: dict[int, Any] = {}
    before_final: dict[int, int] = {}  # per engine core: records before its last probe_stats
    seen: dict[int, int] = {}
    by_reason: dict[str, int] = {}
    headers = 0
    for rec in iter_run(archive, stats):
        kind = rec.kind
        if kind == "engine_config" and rec.segment is not None:
            headers += 1  # the copy heading segment n >= 2: not an event (docs/events.md)
            continue
        pid = rec.pid or 0
        if kind == "probe_stats":  # the probe's own account, not one of the events it counts
            final_stats[pid] = rec
            before_final[pid] = seen.get(pid, 0)
            continue
        seen[pid] = seen.get(pid, 0) + 1
        if kind == "step":
            steps += 1
            s = rec.step
            if s is not None:
                if last is not None and s != last + 1:
                    gaps += 1
                first = s if first is None else first
                last = s
        elif kind == "request_finished":
            finished += 1
            out_tokens += rec.output_tokens or 0
            by_reason[rec.reason or "?"] = by_reason.get(rec.reason or "?", 0) + 1
    probe = {"events_written": 0, "events_dropped": 0, "hook_errors": 0}
    for rec in final_stats.values():
        for k in probe:
            v = getattr(rec, k, None) or 0
            probe[k] += sum(v.values()) if isinstance(v, dict) else v  # hook_errors: {hook: n}
    return {"events_read": stats.events - headers, "segment_headers": headers, "lines_skipped": stats.skipped,
            "skipped": stats.describe(),
            "steps": steps, "first_step": first, "last_step": last, "step_gaps": gaps,
            "requests_finished": finished, "finished_by_reason": by_reason, "output_tokens": out_tokens,
            "probe_stats_seen": bool(final_stats), "events_before_final_stats": sum(before_final.values()),
            **probe}


def summary_json(run_dir: Path) -> dict[str, Any]:
    """``vllm-probe summary --json RUN`` (a separate process, as a user runs it)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "vllm_probe", "summary", "--json", str(run_dir)], capture_output=True,
                       text=True, cwd=ROOT, env=env, timeout=1800)
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout)[-2000:], "exit_code": p.returncode}
    try:
        return json.loads(p.stdout)
    except ValueError:
        return {"error": p.stdout[-2000:]}


# -- the soak -----------------------------------------------------------------------------------


def server_command(port: int, args: tuple[str, ...] | list[str] = SERVER_ARGS) -> list[str]:
    """vLLM's OpenAI server on the tiny model (written if missing) at 127.0.0.1:``port``,
    with engine arguments ``args`` (default :data:`SERVER_ARGS`)."""
    from vllm_probe.sim.tiny_model import write_tiny_model

    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(write_tiny_model()), "--host", "127.0.0.1", "--port", str(port), *args]


def server_env() -> dict[str, str]:
    """The environment the server and ``vllm-probe run`` start with: this checkout first on
    ``PYTHONPATH``, vLLM's log level WARNING unless set."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # vLLM's per-request log lines would fill server.log
    return env


def wait_ready(base: str, proc: subprocess.Popen, log: Path, timeout: float) -> str:
    """Wait until the server at ``base`` answers ``/health`` (at most ``timeout`` s);
    return its model's name. RuntimeError when ``proc`` exits first (the end of ``log``
    in the message) or the time runs out."""
    deadline = time.time() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}):\n{log.read_text(errors='replace')[-3000:]}")
        if time.time() > deadline:
            raise RuntimeError(f"the server was not ready after {timeout:.0f} s")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(0.5)
    with urllib.request.urlopen(f"{base}/v1/models", timeout=10) as r:
        return json.load(r)["data"][0]["id"]


@contextlib.contextmanager
def serving(cmd: list[str], base: str, log: Path, start_s: float, stop_s: float) -> Iterator[str]:
    """Run the server ``cmd`` (its output in ``log``) for the ``with`` block; yields its
    model's name once it answers at ``base`` (:func:`wait_ready`, at most ``start_s``). When
    the block ends, SIGTERM (``vllm-probe run`` passes it on, so the engine core writes its
    last ``probe_stats``) and a wait of at most ``stop_s``; if the block raised, or the
    server is still there, its process group is killed.

    Raises:
        RuntimeError: the server did not start, or did not stop ``stop_s`` after SIGTERM.
    """
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=server_env(),
                                start_new_session=True)
        try:
            yield wait_ready(base, proc, log, start_s)
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=stop_s)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"the server did not stop {stop_s:.0f} s after SIGTERM; see {log}") from None
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def run_soak(cfg: SoakConfig, progress=print) -> dict[str, Any]:
    """Run one soak; returns the result (also written to ``OUT/result.json``)."""
    sys.path.insert(0, str(ROOT))
    out = Path(cfg.out) if cfg.out else Path(tempfile.mkdtemp(prefix="vllm-probe-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    run_dir, archive_dir, log_path = out / "run", out / "archive", out / "server.log"
    if run_dir.exists() or archive_dir.exists():
        raise SystemExit(f"{out} holds an earlier soak (run/ or archive/): give a new --out")
    settings = out / "settings.json"
    settings.write_text(json.dumps({"scheduler_probe": cfg.probe_settings()}, indent=2))
    port, mport = free_port(), free_port()
    base, metrics_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{mport}/metrics"
    server = server_command(port)
    cmd = [sys.executable, "-m", "vllm_probe", "run", "--settings", str(settings), "--out", str(run_dir),
           "--metrics-port", str(mport), "--", *server] if cfg.probe else server
    env = server_env()
    if not cfg.probe:
        env = {k: v for k, v in env.items() if not k.startswith("VLLMPROBE_")}
    samples: list[dict] = []
    archive = Archive(run_dir, archive_dir)
    result: dict[str, Any] = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
                              "out": str(out), "settings": cfg.probe_settings()}
    t_start = time.time()
    stop_archiving = threading.Event()

    def archiver() -> None:
        while not stop_archiving.is_set():
            archive.poll()
            stop_archiving.wait(ARCHIVE_POLL_S)

    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)
        arch_thread = threading.Thread(target=archiver, daemon=True, name="soak-archive")
        try:
            model = wait_ready(base, proc, log_path, 600)
            arch_thread.start()
            ready = time.time()
            result["startup_s"] = round(ready - t_start, 1)
            engine_pid = vllm_process(proc.pid, "VLLM::EngineCore")
            worker_pid = vllm_process(proc.pid, "VLLM::Worker")
            progress(f"soak: server ready after {ready - t_start:.0f} s; load for {cfg.minutes:g} min -> {out}")
            load = Load(base, model, cfg.concurrency, ready + cfg.minutes * 60, cfg.max_requests, cfg.seed)
            load.start()
            next_sample = ready
            while True:
                now = time.time()
                if now >= next_sample:
                    disk = dir_bytes(run_dir)
                    size, segs = disk.total, disk.segments
                    m = scrape(metrics_url)
                    with load.lock:
                        c = asdict(load.counts)
                    samples.append({
                        "t": round(now - ready, 1), "engine_rss_mib": rss_mib(archive.engine_pid or engine_pid),
                        "worker_rss_mib": rss_mib(worker_pid),
                        "sidecar_rss_mib": rss_mib(proc.pid) if cfg.probe else None, "disk_bytes": size,
                        "segments": segs,
                        "steps": m.get("vllm_probe_steps_total"),
                        "requests_finished": m.get("vllm_probe_requests_finished_total"),
                        "preemptions": m.get("vllm_probe_preemptions_total"),
                        "events_dropped": m.get("vllm_probe_events_dropped_total"),
                        "hook_errors": m.get("vllm_probe_hook_errors_total"),
                        "lines_skipped": m.get("vllm_probe_lines_skipped_total"),
                        "client_ok": c["ok"], "client_failed": c["failed"],
                        "load1": os.getloadavg()[0],
                    })
                    s = samples[-1]
                    if len(samples) % max(1, int(60 / cfg.sample_s)) == 1:
                        progress(f"soak: {s['t'] / 60:5.1f} min  engine {s['engine_rss_mib'] or 0:7.1f} MiB  "
                                 f"sidecar {s['sidecar_rss_mib'] or 0:6.1f} MiB  disk {size / MIB:6.2f} MiB "
                                 f"({segs} files)  steps {s['steps']}  ok {c['ok']}  load {s['load1']:.1f}")
                    next_sample += cfg.sample_s
                if proc.poll() is not None:
                    raise RuntimeError(f"vllm-probe run exited early ({proc.returncode}); see {log_path}")
                if all(not t.is_alive() for t in load._workers):
                    break
                time.sleep(min(1.0, max(0.05, next_sample - time.time())))
            load_end = time.time()
            client = load.counts
            # the sidecar has read everything when its finished count reaches the client's
            m = {}
            deadline = time.time() + (120 if cfg.probe else 0)
            while time.time() < deadline:
                m = scrape(metrics_url)
                if m.get("vllm_probe_requests_finished_total", -1) >= client.ok:
                    break
                time.sleep(0.5)
            result["sidecar_final"] = m
            result["load_s"] = round(load_end - ready, 1)
            os.kill(proc.pid, signal.SIGTERM)  # vllm-probe passes it on; the engine core writes probe_stats
            try:
                result["exit_code"] = proc.wait(timeout=180)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                result["exit_code"] = proc.wait()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            stop_archiving.set()
            if arch_thread.is_alive():
                arch_thread.join(5)
            archive.poll()  # the last segment, closed at exit
    if (run_dir / "meta.json").exists():
        shutil.copy2(run_dir / "meta.json", archive_dir / "meta.json")
    final = dir_bytes(run_dir)
    result["client"] = asdict(client)
    result["samples"] = samples
    result["disk"] = {"max_bytes": archive.max_bytes, "max_mib": round(archive.max_bytes / MIB, 3),
                      "max_event_bytes": archive.max_events, "max_event_at_s": round(archive.max_events_at, 1),
                      "max_event_files": archive.max_events_files,
                      "max_event_waiting": archive.max_events_waiting, "max_settled_bytes": archive.max_settled,
                      "max_files": archive.max_segments, "final_bytes": final.total,
                      "final_in_transit_bytes": final.in_transit,
                      "segments_seen": len(archive.linked), "segments_missed": archive.missing_segments(),
                      "segments_removed": archive.removed()}
    bound = None
    if cfg.segments and cfg.keep_mb is not None and cfg.max_segment_mb is not None:
        bound = (cfg.keep_mb + cfg.max_segment_mb) * MIB
    result["disk"]["bound_bytes"] = bound
    warm = cfg.warmup_s()
    result["warmup_s"] = warm
    result["rss"] = {"engine": growth(samples, "engine_rss_mib", warm),
                     "worker": growth(samples, "worker_rss_mib", warm),
                     "sidecar": growth(samples, "sidecar_rss_mib", warm)}
    loads = [s["load1"] for s in samples]
    result["load_avg"] = {"min": min(loads, default=None), "max": max(loads, default=None),
                          "median": statistics.median(loads) if loads else None}
    if not cfg.probe:  # the control run: memory only
        (out / "result.json").write_text(json.dumps(result, indent=1, default=str))
        return result
    progress("soak: reading every segment ...")
    result["archive"] = read_archive(archive_dir)
    arch_sum, run_sum = summary_json(archive_dir), summary_json(run_dir)
    result["summary"] = {k: arch_sum.get(k) for k in ("requests_finished", "requests_unfinished", "output_tokens",
                                                       "prompt_tokens", "steps", "error")}
    result["summary_run_dir"] = {k: run_sum.get(k) for k in ("requests_finished", "output_tokens", "steps",
                                                             "error")}
    result["checks"] = checks(result)
    result["ok"] = all(v["ok"] for v in result["checks"].values())
    (out / "result.json").write_text(json.dumps(result, indent=1, default=str))
    return result


def checks(r: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The soak's pass/fail checks: name -> {ok, got, want}."""
    c, a, s = r["client"], r["archive"], r["summary"]
    out = {
        "client requests all answered": {"ok": c["failed"] == 0 and c["ok"] > 0, "got": c["failed"], "want": 0},
        "events dropped": {"ok": a["probe_stats_seen"] and a["events_dropped"] == 0, "got": a["events_dropped"],
                           "want": 0},
        "hook errors": {"ok": a["probe_stats_seen"] and a["hook_errors"] == 0, "got": a["hook_errors"], "want": 0},
        "summary requests = client's": {"ok": s.get("requests_finished") == c["ok"],
                                        "got": s.get("requests_finished"), "want": c["ok"]},
        "summary output tokens = client's": {"ok": s.get("output_tokens") == c["output_tokens"],
                                             "got": s.get("output_tokens"), "want": c["output_tokens"]},
        "reader's request_finished = client's": {"ok": a["requests_finished"] == c["ok"],
                                                 "got": a["requests_finished"], "want": c["ok"]},
        "events read = probe_stats events_written": {
            "ok": a["events_before_final_stats"] == a["events_written"],
            "got": a["events_before_final_stats"], "want": a["events_written"]},
        "steps contiguous": {"ok": a["step_gaps"] == 0 and a["first_step"] == 0, "got": a["step_gaps"], "want": 0},
        "no segment missed by the archive": {"ok": not r["disk"]["segments_missed"],
                                             "got": r["disk"]["segments_missed"], "want": []},
        "lines skipped": {"ok": a["lines_skipped"] == 0, "got": a["lines_skipped"], "want": 0},
    }
    if r["disk"]["bound_bytes"] is not None:
        d = r["disk"]
        out["settled segments within keep_mb + one segment"] = {
            "ok": d["max_settled_bytes"] <= d["bound_bytes"], "got": d["max_settled_bytes"], "want": d["bound_bytes"]}
        # closed segments wait for the keeper thread's gzip: how many at once depends on the
        # CPU that thread gets (reported beside the table, not judged); that it catches up is
        out["every closed segment gzipped by the end"] = {
            "ok": d["final_in_transit_bytes"] == 0, "got": d["final_in_transit_bytes"], "want": 0}
    return out


def _rss_text(m: dict[str, Any]) -> str:
    """One process's RSS after warm-up: ``baseline -> end MiB (growth, slope MiB/h)``."""
    growth = "-" if m["growth"] is None else f"{m['growth'] * 100:+.1f} %"
    return f"{m['baseline_mib']} -> {m['end_mib']} MiB ({growth}, {m['slope_mib_per_h']} MiB/h)"


def table(r: dict[str, Any]) -> str:
    """The result as a plain-text table."""
    c, a, d, rss = r["client"], r["archive"], r["disk"], r["rss"]
    rows = [
        ("load time", f"{r.get('load_s', 0) / 60:.1f} min (warm-up {r['warmup_s'] / 60:.1f} min)"),
        ("settings", json.dumps(r["settings"]) if r["settings"] else "(no segment limits)"),
        ("client requests ok / failed", f"{c['ok']:,} / {c['failed']:,}"),
        ("client output / prompt tokens", f"{c['output_tokens']:,} / {c['prompt_tokens']:,}"),
        ("summary requests / output tokens", f"{r['summary'].get('requests_finished')} / "
                                             f"{r['summary'].get('output_tokens')}"),
        ("sidecar requests finished", f"{r.get('sidecar_final', {}).get('vllm_probe_requests_finished_total')}"),
        ("steps (first-last, gaps)", f"{a['steps']:,} ({a['first_step']}-{a['last_step']}, {a['step_gaps']} gaps)"),
        ("preemptions (sidecar)", f"{r.get('sidecar_final', {}).get('vllm_probe_preemptions_total')}"),
        ("events written / read", f"{a['events_written']:,} / {a['events_read']:,}"),
        ("events dropped / hook errors", f"{a['events_dropped']} / {a['hook_errors']}"),
        ("segments seen / removed by retention", f"{d['segments_seen']} / {d['segments_removed']} "
                                                 f"(at most {d['max_files']} in the run dir)"),
        ("disk max: run dir / event files", f"{d['max_mib']:.2f} / {d['max_event_bytes'] / MIB:.2f} MiB (at "
                                            f"{d.get('max_event_at_s', 0):.0f} s; {d.get('max_event_waiting', 0)} "
                                            "closed segments waiting for gzip)"),
        ("disk max settled / bound", f"{d['max_settled_bytes'] / MIB:.2f} MiB / "
                                     + ("-" if d["bound_bytes"] is None else f"{d['bound_bytes'] / MIB:.2f} MiB")),
        ("engine core RSS after warm-up", _rss_text(rss["engine"])),
        ("worker RSS after warm-up (no probe in it)", _rss_text(rss["worker"])),
        ("sidecar RSS after warm-up", _rss_text(rss["sidecar"])),
        ("run dir summary (after retention)", f"{r['summary_run_dir'].get('requests_finished')} requests, "
                                              f"{r['summary_run_dir'].get('steps')} steps"),
        ("load average (min/median/max)", f"{r['load_avg']['min']} / {r['load_avg']['median']} / "
                                          f"{r['load_avg']['max']}"),
    ]
    w = max(len(k) for k, _ in rows)
    lines = [f"{k:<{w}}  {v}" for k, v in rows]
    lines.append("")
    lines += [f"{'PASS' if v['ok'] else 'FAIL'}  {k}: {v['got']} (want {v['want']})" for k, v in r["checks"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=3.0, help="load time (default 3: the CI mode)")
    p.add_argument("--out", type=Path, help="folder for the run, the archive and result.json (default: new in /tmp)")
    p.add_argument("--json", type=Path, help="also write the result here")
    p.add_argument("--sample-s", type=float, default=5.0, help="seconds between samples (default 5)")
    p.add_argument("--warmup-min", type=float, help="warm-up minutes left out of RSS growth (default: a sixth)")
    p.add_argument("--concurrency", type=int, default=12, help="client threads in a burst (default 12)")
    p.add_argument("--max-requests", type=int, default=1_000_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-segment-mb", type=float, default=0.25)
    p.add_argument("--rotate-every-s", type=float)
    p.add_argument("--keep-mb", type=float, default=0.25)
    p.add_argument("--keep-hours", type=float)
    p.add_argument("--no-compress", action="store_true")
    p.add_argument("--no-segments", action="store_true", help="leave every segment setting out (one file)")
    p.add_argument("--no-probe", action="store_true",
                   help="control run: the same server and load without vllm-probe (RSS only, no checks)")
    a = p.parse_args(argv)
    cfg = SoakConfig(minutes=a.minutes, out=a.out, sample_s=a.sample_s, warmup_min=a.warmup_min,
                     concurrency=a.concurrency, max_requests=a.max_requests, seed=a.seed,
                     segments=not a.no_segments, max_segment_mb=a.max_segment_mb, rotate_every_s=a.rotate_every_s,
                     compress_segments=not a.no_compress, keep_mb=a.keep_mb, keep_hours=a.keep_hours,
                     probe=not a.no_probe)
    r = run_soak(cfg)
    if not cfg.probe:
        print(json.dumps({"client": r["client"], "rss": r["rss"], "load_avg": r["load_avg"]}, indent=1))
        return 0
    print(table(r))
    if a.json:
        a.json.write_text(json.dumps(r, indent=1, default=str))
    print(f"result: {Path(r['out']) / 'result.json'}")
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
