"""What the probe costs: vLLM's real scheduler and the real engine, with and without it.

    python -m benchmarks.bench_overhead            # micro + end to end (~6 min here)
    python -m benchmarks.bench_overhead --quick    # CI: checks that it runs, not the numbers
    python benchmarks/bench_overhead.py --micro-only

**Micro** -- vLLM's real ``Scheduler`` driven without a model (``vllm_probe.sim.harness``),
at 16, 64 and 256 running requests, for two mixes:

* ``decode``: every running request decodes (the common steady state);
* ``prefill``: N-8 decoding requests plus a stream of 700-token prompts (2 output
  tokens each) kept 4 deep in the waiting queue, so every step admits, chunks and
  finishes requests and most of the 2,048-token budget goes to prefill chunks (the
  step with the most probe work: ~10 events per step).

One scheduler runs the workload; blocks of 20 steps alternate between A (vLLM's own
methods on the class) and B (the probe installed: all flags on, the real
:class:`~vllm_probe.engine.sink.EventSink` writing JSON lines to a temp file, its writer thread
running), A B, B A, ... for 50 rounds in one process, switched with
:func:`vllm_probe.engine.patches.install` / :func:`~vllm_probe.engine.patches.uninstall` (A never goes
through a wrapper; one instance for both, because two instances of the same workload
differ by a few percent on their own). Reported per case: the median µs of one
``schedule()`` call and of a whole step (``add_request`` of new arrivals +
``schedule()`` + ``update_from_output()``), as CPU time of the stepping thread -- on a
shared machine wall time would add whatever other processes took -- and the writer: the
writer thread's CPU time over the measured rounds plus a final ``flush()``, per B step.
The step ratio charges the writer to B in full, as if it never overlapped the scheduler
(without a model nothing releases the GIL; in an engine the writer mostly runs while the
model executes). The heap built during set-up is frozen (``gc.freeze()``), as vLLM's
engine core does after start-up. ``--aa`` runs B without the probe too: its ratios are
the measurement's noise floor.

**End to end** -- the real engine (offline ``LLM``, engine core in its own process, as
vLLM runs it) on the tiny local model with random weights: 256 requests of 128 prompt
tokens x 128 output tokens, ``ignore_eos``, greedy. The probe is switched per process
exactly as ``vllm-probe run`` does it (the plugin's environment variables, all flags
on), so two engines are started side by side, one without and one with the probe; after
an unmeasured warm-up each, their measured ``generate()`` calls alternate one at a
time -- off on, on off, ... (``--pairs``, default 8) -- the other engine idle meanwhile,
so that a pair is seconds apart and a shared machine's changing load hits both alike.
Reported: tokens/s of each call, the on/off ratio per pair and its median, the engine
cores' peak resident memory, and the events written. (Runs in separate, successive
processes varied by +-10-20% here from the load alone; switching the probe inside one
engine needs the engine core in the user's process on the CPU backend, where
throughput swung 0.3x-7x between identical runs.)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable

ROOT = Path(__file__).resolve().parents[1]

# -- micro --------------------------------------------------------------------------------

BUDGET = 2048
DECODE_PROMPT = 32
STREAM_PROMPT = 700
STREAM_OUTPUT = 2
STREAM_SLOTS = 8
STREAM_DEPTH = 4
BLOCK_SIZE = 16


@dataclass
class MicroRow:
    """One micro case: A = vanilla, B = probe. Times in µs."""

    case: str
    running: int  # mean running-queue length over the measured steps
    steps: int  # measured steps per configuration
    sched_a: float  # median µs per schedule()
    sched_b: float
    step_a: float  # median µs per full step on the stepping thread
    step_b: float
    writer: float  # CPU µs per B step spent rendering and writing events (any thread)
    events: int  # events the probe wrote during the measured blocks
    dropped: int
    sched_wall_a: float  # median wall-clock µs per schedule(), for reference
    sched_wall_b: float

    @property
    def sched_ratio(self) -> float:
        return self.sched_b / self.sched_a

    @property
    def total_b(self) -> float:
        """B's step with the writer's CPU time added in full (no overlap assumed)."""
        return self.step_b + self.writer

    @property
    def total_ratio(self) -> float:
        return self.total_b / self.step_a


class Workload:
    """A deterministic workload for one scheduler; identical for A and B."""

    def __init__(self, mix: str, n: int, total_steps: int) -> None:
        from vllm_probe.sim import harness as testing

        self.mix, self.n = mix, n
        self.decoders = n if mix == "decode" else max(n - STREAM_SLOTS, 0)
        self.max_tokens = total_steps + 64
        per_decoder = -(-(DECODE_PROMPT + self.max_tokens) // BLOCK_SIZE) + 1
        per_stream = -(-(STREAM_PROMPT + STREAM_OUTPUT) // BLOCK_SIZE) + 1
        self.spec = testing.SchedulerSpec(
            max_num_batched_tokens=max(BUDGET, n), max_num_seqs=n, block_size=BLOCK_SIZE,
            num_blocks=self.decoders * per_decoder + (STREAM_SLOTS + STREAM_DEPTH) * per_stream + 16,
            max_model_len=max(8192, DECODE_PROMPT + self.max_tokens + 16),
        )
        self.next_stream = 0

    def build(self) -> Any:
        from vllm_probe.sim import harness as testing

        sched = testing.make_scheduler(self.spec)
        for i in range(self.decoders):
            sched.add_request(testing.make_request(
                DECODE_PROMPT, self.max_tokens, req_id=f"d{i}", block_size=BLOCK_SIZE, seed=i))
        return sched

    def arrivals(self, sched: Any) -> list[Any]:
        """New requests to add before the next step (prefill mix: keep the queue 4 deep)."""
        if self.mix != "prefill":
            return []
        from vllm_probe.sim import harness as testing

        new: list[Any] = []
        while len(sched.waiting) + len(new) < STREAM_DEPTH:
            i = self.next_stream
            self.next_stream += 1
            new.append(testing.make_request(
                STREAM_PROMPT, STREAM_OUTPUT, req_id=f"s{i}", block_size=BLOCK_SIZE, seed=10_000 + i))
        return new


class _Driver:
    """Steps one scheduler, timing schedule() and the whole step.

    Times are the stepping thread's CPU time (``time.thread_time``): on a shared machine
    it leaves out the time the process waited for a core, which wall time would add to
    whichever of A or B happened to be running. Wall time is kept too (``sched_wall``).
    """

    def __init__(self, workload: Workload) -> None:
        self.w = workload
        self.sched = workload.build()

    def run(self, steps: int, into: dict[str, list[float]] | None = None) -> None:
        """``steps`` steps; their timings are appended to ``into`` (None: not recorded)."""
        from vllm_probe.sim.harness import fake_model_output

        pc, tt = time.perf_counter, time.thread_time
        s, w = self.sched, self.w
        sched_us, step_us, wall_us = [], [], []
        for _ in range(steps):
            new = w.arrivals(s)
            c0 = tt()
            for r in new:
                s.add_request(r)
            c1 = tt()
            w1 = pc()
            out = s.schedule()
            w2 = pc()
            c2 = tt()
            mro = fake_model_output(s, out)
            c3 = tt()
            s.update_from_output(out, mro)
            c4 = tt()
            sched_us.append((c2 - c1) * 1e6)
            step_us.append(((c2 - c0) + (c4 - c3)) * 1e6)
            wall_us.append((w2 - w1) * 1e6)
        if into is not None:
            into["sched"] += sched_us
            into["step"] += step_us
            into["sched_wall"] += wall_us


def _thread_cpu(sink: Any) -> float:
    """CPU seconds used so far by the sink's writer thread (0 without a sink)."""
    if sink is None:
        return 0.0
    return time.clock_gettime(time.pthread_getcpuclockid(sink._thread.ident))


def _scheduler_class() -> type:
    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_probe.engine import hooks as probe

    if getattr(Scheduler.schedule, probe.WRAPPED_ATTR, None) is not None:
        raise RuntimeError("Scheduler is already patched in this process; run the benchmark alone")
    return Scheduler


def run_micro_case(mix: str, n: int, rounds: int, block: int, warmup: int, out_dir: Path,
                   probe_on: bool = True) -> MicroRow:
    """Measure one case on one scheduler: blocks of ``block`` steps alternate between A
    (vLLM's own methods) and B (the probe installed), A B, B A, ... for ``rounds`` rounds.

    One scheduler instance serves both, so both see the same objects and memory (two
    instances differ by a few percent on their own). While uninstalled, the attached
    probe sees nothing; before each B block its record of requests in mid-prefill is
    brought up to date (requests that finished their prefill during an A block are
    dropped), as the probe would have done itself. ``probe_on=False`` leaves the probe
    out of B as well: an A/A run whose ratios show the noise floor.
    """
    from vllm_probe import engine as probe
    from vllm_probe.settings import ProbeFlags
    from vllm_probe.engine.sink import EventSink

    cls = _scheduler_class()
    flags = ProbeFlags()  # every event kind on, default queue capacity
    out_dir.mkdir(parents=True, exist_ok=True)
    # The plugin's own sink (probe.file_sink_factory), minus its SIGTERM/SIGINT hook,
    # which would outlive the benchmark in the caller's process.
    rt = probe.Runtime(flags, lambda rt: EventSink(
        out_dir / "events.jsonl", capacity=flags.queue_capacity, stats_extra=rt.health.snapshot))
    a: dict[str, list[float]] = {"sched": [], "step": [], "sched_wall": []}
    b: dict[str, list[float]] = {"sched": [], "step": [], "sched_wall": []}
    running: list[int] = []
    try:
        if not probe.install(cls, rt, "bench"):
            raise RuntimeError("probe.install patched nothing")
        d = _Driver(Workload(mix, n, warmup + 2 * rounds * block))  # built with the probe attached
        attached = probe.attached_probe(d.sched)
        if attached is None:
            raise RuntimeError("the probe did not attach to the scheduler")
        sink = rt.sink
        d.run(warmup)
        sink.flush()
        # As vLLM's engine core does after start-up (freeze_gc_heap): the heap built so
        # far is left out of garbage collections, so a collection's cost does not depend
        # on which thread (stepping or writer) happens to trigger it.
        gc.collect()
        gc.freeze()
        written0, dropped0 = sink.written, sink.dropped
        writer0 = _thread_cpu(sink)
        for i in range(rounds):
            for which in ("ab" if i % 2 == 0 else "ba"):
                if which == "b" and probe_on:
                    _catch_up(attached, d.sched)
                    probe.install(cls, rt, "bench")
                else:
                    probe.uninstall(cls)
                d.run(block, b if which == "b" else a)
                running.append(len(d.sched.running))
        # The writer thread drains every FLUSH_INTERVAL_S, as in an engine; all of its CPU
        # time over the measured rounds (idle wake-ups during A blocks included), plus the
        # final flush of what is still queued, is charged to B.
        c0 = time.thread_time()
        sink.flush()
        writer_s = _thread_cpu(sink) - writer0 + time.thread_time() - c0
        events, dropped = sink.written - written0, sink.dropped - dropped0
    finally:
        gc.unfreeze()
        probe.uninstall(cls)
        if rt._sink is not None:
            rt._sink.close()
    return MicroRow(
        case=f"{mix} {n}", running=round(statistics.fmean(running)), steps=len(a["sched"]),
        sched_a=statistics.median(a["sched"]), sched_b=statistics.median(b["sched"]),
        step_a=statistics.median(a["step"]), step_b=statistics.median(b["step"]),
        writer=writer_s * 1e6 / len(b["step"]), events=events, dropped=dropped,
        sched_wall_a=statistics.median(a["sched_wall"]), sched_wall_b=statistics.median(b["sched_wall"]),
    )


def _catch_up(attached: Any, sched: Any) -> None:
    """Drop from the probe's mid-prefill record the requests whose prefill ended (or that
    left) while it was uninstalled; the workloads here never preempt."""
    if attached.resume_pending:
        raise RuntimeError("the micro workloads are not meant to preempt")
    requests = sched.requests
    for rid, p in list(attached.prefilling.items()):
        req = requests.get(rid)
        if req is None or req.num_computed_tokens >= p.prefill_len:
            del attached.prefilling[rid]


def run_micro(quick: bool = False, sizes: tuple[int, ...] = (16, 64, 256),
              mixes: tuple[str, ...] = ("decode", "prefill"), rounds: int | None = None,
              block: int | None = None, log: Callable[[str], None] | None = None,
              probe_on: bool = True) -> list[MicroRow]:
    """All micro cases; ``quick`` shrinks them to a few steps (checks that it runs)."""
    if quick:
        sizes, rounds, block, warmup = (16,), rounds or 2, block or 5, 5
    else:
        rounds, block, warmup = rounds or 50, block or 20, 40
    rows = []
    with tempfile.TemporaryDirectory(prefix="vllm-probe-bench-") as tmp:
        for mix in mixes:
            for n in sizes:
                if log:
                    log(f"micro {mix} {n} ...")
                rows.append(run_micro_case(mix, n, rounds, block, warmup, Path(tmp) / f"{mix}-{n}",
                                           probe_on=probe_on))
    return rows


def queue_memory(capacity: int | None = None) -> dict[str, float]:
    """The sink's worst case: its writer stalled, ``capacity`` + 10% step events emitted.

    Returns the memory the queue holds when full (tracemalloc, MiB) and how many events
    were dropped (counted) instead of growing it.
    """
    import tracemalloc

    from vllm_probe.schema.events import STEP
    from vllm_probe.settings import ProbeFlags
    from vllm_probe.engine.sink import EventSink

    capacity = capacity or ProbeFlags().queue_capacity
    with tempfile.TemporaryDirectory(prefix="vllm-probe-bench-mem-") as tmp:
        sink = EventSink(Path(tmp) / "events.jsonl", capacity=capacity, flush_interval_s=3600)
        try:
            extra = capacity // 10
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            for i in range(capacity + extra):  # a step event as the probe builds it
                sink.emit(STEP, time.time(), 0, STEP.pack(
                    step=i, scheduled_tokens=256, token_budget=2048, prefill_reqs=0, prefill_tokens=0,
                    decode_reqs=256, decode_tokens=256, new_reqs=0, running=256, waiting=0,
                    kv_usage=0.5, free_blocks=1000, schedule_us=1400.0 + i, preempted=[], finished=[]))
            held = tracemalloc.get_traced_memory()[0] - before
            tracemalloc.stop()
            return {"capacity": capacity, "queue_mib": held / 2**20, "dropped": sink.dropped,
                    "emitted_beyond_cap": extra}
        finally:
            sink._queue.clear()  # not a benchmark of writing them
            sink.close()


# -- end to end ---------------------------------------------------------------------------


@dataclass
class E2EConfig:
    num_requests: int = 256
    prompt_tokens: int = 128
    max_tokens: int = 128
    max_num_batched_tokens: int = 4096
    num_kv_blocks: int = 600


#: Pause before each measured generate(): an idle engine's worker keeps polling its
#: shared-memory queue for 1 s after its last step (vLLM's SpinCondition), which would
#: steal a core from the other engine's run.
IDLE_BEFORE_RUN_S = 1.5


@dataclass
class E2EResult:
    """Tokens/s of each measured generate(), pair by pair, of the two engines."""

    off: list[float]
    on: list[float]
    rss_off_mib: float | None
    rss_on_mib: float | None
    events: int

    @property
    def ratios(self) -> list[float]:
        return [b / a for a, b in zip(self.off, self.on)]


class _Engine:
    """The benchmark's engine: ``LLM`` on the tiny model, ``cfg``'s workload."""

    def __init__(self, cfg: E2EConfig) -> None:
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        from vllm_probe.sim.tiny_model import write_tiny_model

        self.cfg = cfg
        self.llm = LLM(
            model=str(write_tiny_model()), load_format="dummy", enforce_eager=True, dtype="float32",
            seed=0, max_model_len=1024, max_num_batched_tokens=cfg.max_num_batched_tokens,
            max_num_seqs=cfg.num_requests, num_gpu_blocks_override=cfg.num_kv_blocks,
            gpu_memory_utilization=0.3,
        )
        self.params = SamplingParams(temperature=0.0, max_tokens=cfg.max_tokens, ignore_eos=True)
        self._prompt = TokensPrompt
        self.reps = 0

    def generate(self) -> float:
        """One ``generate()`` of the workload (distinct prompts each time); output tokens/s."""
        cfg, rep = self.cfg, self.reps
        self.reps += 1
        batch = [self._prompt(prompt_token_ids=[3 + (rep * 131 + i * 7919 + j * 31) % 500
                                                for j in range(cfg.prompt_tokens)])
                 for i in range(cfg.num_requests)]
        t0 = time.perf_counter()
        outs = self.llm.generate(batch, self.params, use_tqdm=False)
        elapsed = time.perf_counter() - t0
        return sum(len(o.outputs[0].token_ids) for o in outs) / elapsed


def e2e_server(cfg: E2EConfig) -> int:
    """An engine process driven over stdin: ``gen`` runs one measured generate() and
    answers its tokens/s; ``quit`` answers the engine core's peak RSS and ends."""
    engine = _Engine(cfg)
    engine.generate()  # warm-up, not measured
    print("READY", flush=True)
    for line in sys.stdin:
        if line.strip() == "gen":
            print("BENCH_RESULT " + json.dumps(engine.generate()), flush=True)
        elif line.strip() == "quit":
            print("BENCH_RESULT " + json.dumps(_peak_rss_mib(_engine_core_process())), flush=True)
            break
    return 0


def _engine_core_process() -> Any:
    """The engine-core child process (vLLM titles it ``VLLM::EngineCore``), or None."""
    try:
        import psutil  # type: ignore[import-untyped]

        for child in psutil.Process().children(recursive=True):
            if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline()):
                return child
    except Exception:
        pass
    return None


def _peak_rss_mib(proc: Any) -> float | None:
    """Peak resident memory (VmHWM) of ``proc``."""
    try:
        with open(f"/proc/{proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except Exception:
        pass
    return None


class _Server:
    """Parent side of :func:`e2e_server`."""

    def __init__(self, cfg: E2EConfig, env: dict[str, str], log_path: Path) -> None:
        import queue
        import threading

        self.log_path = log_path
        self._log = log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--e2e-server", json.dumps(asdict(cfg))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, env=env, cwd=ROOT)
        self._lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self._lines.put(line.strip())
            self._lines.put(None)

        threading.Thread(target=pump, daemon=True).start()

    def _expect(self, prefix: str, timeout: float) -> str:
        import queue

        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.001))
            except queue.Empty:
                line = None
            if line is None:
                tail = self.log_path.read_text()[-3000:]
                raise RuntimeError(f"e2e engine process failed (exit {self.proc.poll()}):\n{tail}")
            if line.startswith(prefix):
                return line[len(prefix):]

    def ready(self, timeout: float = 900) -> None:
        self._expect("READY", timeout)

    def call(self, cmd: str, timeout: float = 900) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return json.loads(self._expect("BENCH_RESULT ", timeout))

    def close(self) -> float | None:
        try:
            rss = self.call("quit", timeout=60) if self.proc.poll() is None else None
            self.proc.wait(timeout=120)
            return rss
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self._log.close()


def run_e2e(cfg: E2EConfig, pairs: int, log: Callable[[str], None] | None = None,
            probe_on: bool = True) -> E2EResult:
    """Two engines alive side by side, probe off and probe on, each in its own processes
    as vLLM runs them; their measured generate() calls alternate one at a time, off on,
    on off, ..., the other engine idle meanwhile. ``probe_on=False``: both without the
    probe (A/A)."""
    from vllm_probe import envvars
    from vllm_probe.runs.launcher import probe_env
    from vllm_probe.settings import ProbeFlags, Settings

    with tempfile.TemporaryDirectory(prefix="vllm-probe-bench-e2e-") as tmp:
        run_dir = Path(tmp) / "run"
        env_on = probe_env(run_dir, Settings(flags=ProbeFlags()))
        env_off = {k: v for k, v in os.environ.items()
                   if k not in (envvars.ENABLE, envvars.RUN_DIR, envvars.SETTINGS)}
        if not probe_on:
            env_on = env_off
        if log:
            log("e2e: starting the two engines (probe off, probe on) ...")
        servers = {False: _Server(cfg, env_off, Path(tmp) / "off.log"),
                   True: _Server(cfg, env_on, Path(tmp) / "on.log")}
        rates: dict[bool, list[float]] = {False: [], True: []}
        rss: dict[bool, float | None] = {}
        try:
            for srv in servers.values():
                srv.ready()
            for i in range(pairs):
                if log:
                    log(f"e2e pair {i + 1}/{pairs} ...")
                for on in ((False, True) if i % 2 == 0 else (True, False)):
                    time.sleep(IDLE_BEFORE_RUN_S)
                    rates[on].append(servers[on].call("gen"))
        finally:
            for on, srv in servers.items():
                rss[on] = srv.close()
        files = list(run_dir.glob("events-*.jsonl"))
        if probe_on and not files:
            raise RuntimeError(f"probe enabled but no events in {run_dir}")
        events = sum(sum(1 for _ in f.open()) for f in files)
    return E2EResult(rates[False], rates[True], rss[False], rss[True], events)


# -- report -------------------------------------------------------------------------------


def machine() -> str:
    cpu = platform.processor() or "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import vllm

        vv = vllm.__version__
    except Exception:
        vv = "?"
    return (f"{cpu}, {os.cpu_count()} cores; Python {platform.python_version()}; "
            f"vLLM {vv}; load avg {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def micro_table(rows: list[MicroRow]) -> str:
    head = (f"{'case':<12} {'run':>4} {'steps':>6} | {'sched A':>8} {'sched B':>8} {'diff':>6} {'ratio':>6}"
            f" | {'step A':>8} {'step B':>8} {'writer':>7} {'ratio':>6} | {'ev/step':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.case:<12} {r.running:>4} {r.steps:>6} | {r.sched_a:>8.1f} {r.sched_b:>8.1f}"
            f" {r.sched_b - r.sched_a:>+6.1f} {r.sched_ratio:>6.3f} | {r.step_a:>8.1f} {r.step_b:>8.1f}"
            f" {r.writer:>7.1f} {r.total_ratio:>6.3f} | {r.events / r.steps:>7.1f}"
            + (f" ({r.dropped} dropped)" if r.dropped else ""))
    return "\n".join(lines)


def e2e_table(r: E2EResult) -> str:
    head = f"{'pair':<5} {'off tok/s':>10} {'on tok/s':>10} {'ratio':>6}"
    lines = [head, "-" * len(head)]
    for i, (off, on, ratio) in enumerate(zip(r.off, r.on, r.ratios), 1):
        lines.append(f"{i:<5} {off:>10.0f} {on:>10.0f} {ratio:>6.3f}")
    lines.append(f"median throughput ratio (on/off): {statistics.median(r.ratios):.3f} (target >= 0.99);"
                 f" median tokens/s off {statistics.median(r.off):.0f}, on {statistics.median(r.on):.0f}")
    lines.append(f"engine-core peak RSS: off {_mib(r.rss_off_mib)} MiB, on {_mib(r.rss_on_mib)} MiB"
                 + (f" ({r.rss_on_mib - r.rss_off_mib:+.1f} MiB)" if r.rss_on_mib and r.rss_off_mib else "")
                 + f"; {r.events} events written")
    return "\n".join(lines)


def _mib(x: float | None) -> str:
    return "?" if x is None else f"{x:.0f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks the benchmark runs (CI)")
    part = p.add_mutually_exclusive_group()
    part.add_argument("--micro-only", action="store_true")
    part.add_argument("--e2e-only", action="store_true")
    p.add_argument("--sizes", default="16,64,256", help="running requests for micro (comma list)")
    p.add_argument("--mixes", default="decode,prefill")
    p.add_argument("--rounds", type=int, help="micro: A/B rounds (default 50)")
    p.add_argument("--block", type=int, help="micro: steps per block (default 20)")
    p.add_argument("--aa", action="store_true",
                   help="B without the probe too (A/A), to see the measurement's noise floor")
    p.add_argument("--pairs", type=int, default=8, help="e2e: off/on generate() pairs (default 8)")
    p.add_argument("--json", type=Path, help="also write the results as JSON here")
    p.add_argument("--e2e-server", metavar="CONFIG", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.e2e_server:
        return e2e_server(E2EConfig(**json.loads(args.e2e_server)))

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    print(f"machine: {machine()}", flush=True)
    report: dict[str, Any] = {"machine": machine()}
    if not args.e2e_only:
        sizes = tuple(int(x) for x in args.sizes.split(","))
        rows = run_micro(args.quick, sizes, tuple(args.mixes.split(",")), args.rounds, args.block, log,
                         probe_on=not args.aa)
        if args.aa:
            print("\nA/A run: B without the probe as well; the ratios show the noise floor.")
        print("\nmicro: vLLM's real Scheduler without a model. A = vanilla, B = probe (all flags on,"
              " EventSink writing a file).\n  sched: median µs per schedule() (target: ratio <= 1.02 at"
              " 256 decodes, <= 1.05 otherwise).\n  step: median µs per step (add_request + schedule +"
              " update_from_output); writer: CPU µs per step\n  rendering and writing events (writer"
              " thread + final flush), added in full to B for the step ratio.")
        print(micro_table(rows), flush=True)
        report["micro"] = [asdict(r) | {"sched_ratio": r.sched_ratio, "total_ratio": r.total_ratio} for r in rows]
        mem = queue_memory(1000 if args.quick else None)
        print(f"memory bound: sink queue full ({mem['capacity']} events, writer stalled) holds "
              f"{mem['queue_mib']:.1f} MiB; {mem['dropped']} of {mem['emitted_beyond_cap']} further "
              "events dropped and counted", flush=True)
        report["queue_memory"] = mem
    if not args.micro_only:
        cfg = E2EConfig(num_requests=16, max_tokens=8) if args.quick else E2EConfig()
        result = run_e2e(cfg, 1 if args.quick else args.pairs, log, probe_on=not args.aa)
        print(f"\nend to end: LLM on the tiny model, {cfg.num_requests} requests x {cfg.prompt_tokens} prompt"
              f" x {cfg.max_tokens} output tokens (ignore_eos, greedy), budget {cfg.max_num_batched_tokens};"
              "\n  two engines (own processes, probe off / probe on via the plugin's environment),"
              " their generate() calls alternating off on, on off, ...")
        print(e2e_table(result), flush=True)
        report["e2e"] = asdict(result) | {"ratios": result.ratios}
    print(f"\nload avg at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    if __package__ in (None, ""):  # `python benchmarks/bench_overhead.py`
        sys.path.insert(0, str(ROOT))
    sys.exit(main())
