"""Hand-made event streams for the export, summary and Perfetto tests.

Events are built with the probe's field names (docs/events.md) and written as the sink
writes them (one JSON object per line, ``events-<pid>.jsonl``). What is fed to the
analysis is records (:mod:`vllm_probe.schema.records`), as the reader yields them:
:attr:`Stream.records`, or :func:`records` of a list of event objects; the state, the
summary and the Perfetto builder take nothing else. Two scenarios with
figures worked out by hand:

* :func:`scenario_chunked` — one 5,000-token prompt cut 2,048 / 2,048 / 904 by a 2,048
  token budget, then 3 decode steps.
* :func:`scenario_preempt` — three requests, a 100-token budget, ``max_num_seqs`` 2; B is
  preempted twice (once in decode after each readmission) and recomputed.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec


def records(events) -> list:
    """The records of event objects, each decoded from its JSON line by the reader's
    decoder (``vllm_probe.schema.records.decode``: the same types and checks as a file);
    records pass through; a line the reader would skip (wrong type, unknown kind) is left
    out, as the reader leaves it out."""
    from vllm_probe.runs.reader import ReadStats, parse_line

    out = []
    stats = ReadStats()
    for ev in events:
        if type(ev) is not dict:
            out.append(ev)
            continue
        rec = parse_line(json.dumps(ev), stats)
        if rec is not None:
            out.append(rec)
    return out


def as_dict(rec) -> dict:
    """A record as the event object of its line: ``event`` first, absent (None) fields left out."""
    return {"event": rec.kind, **{k: v for k, v in msgspec.structs.asdict(rec).items() if v is not None}}


class Stream:
    """Events of one engine core, in the order the probe writes them."""

    def __init__(self, engine: int = 0, pid: int = 4242) -> None:
        self.engine, self.pid = engine, pid
        self.events: list[dict] = []

    def add(self, kind: str, ts: float, **fields) -> dict:
        ev = {"event": kind, "ts": ts, "pid": self.pid, "engine": self.engine, "schema": 1, **fields}
        self.events.append(ev)
        return ev

    def config(self, ts: float, budget: int, max_num_seqs: int, **over) -> dict:
        fields = dict(vllm_version="0.32.0", probe_version="0.1.0", scheduler_class="Scheduler",
                      patched=["Scheduler.schedule"], max_num_batched_tokens=budget, max_num_seqs=max_num_seqs,
                      enable_chunked_prefill=True, long_prefill_token_threshold=0, num_kv_blocks=64,
                      block_size=128, kv_capacity_tokens=63 * 128, max_model_len=8192, scheduling_policy="fcfs",
                      async_scheduling=False, prefix_caching=False, data_parallel_size=1,
                      flags={"log_schedule_each_step": True, "log_preempt_events": True,
                             "log_chunk_boundaries": True, "log_request_events": True})
        fields.update(over)
        return self.add("engine_config", ts, **fields)

    def step(self, ts: float, step: int, budget: int, prefill: int = 0, decode: int = 0, *, running: int,
             waiting: int, kv: float = 0.5, schedule_us: float = 1000.0, preempted=(), finished=(),
             prefill_reqs: int = 0, decode_reqs: int = 0) -> dict:
        return self.add("step", ts, step=step, scheduled_tokens=prefill + decode, token_budget=budget,
                        prefill_reqs=prefill_reqs, prefill_tokens=prefill, decode_reqs=decode_reqs,
                        decode_tokens=decode, new_reqs=0, running=running, waiting=waiting, kv_usage=kv,
                        free_blocks=10, schedule_us=schedule_us, preempted=list(preempted), finished=list(finished))

    def chunk(self, ts: float, step: int, req: str, index: int, start: int, end: int, prompt_len: int, *,
              prefill_len: int | None = None, last: bool = False, resumed: bool = False) -> dict:
        extra = {"prefix_hit_tokens": 0} if index == 0 else {}
        return self.add("chunk", ts, step=step, req_id=req, chunk_index=index, start=start, end=end,
                        prompt_len=prompt_len, prefill_len=prefill_len or prompt_len, last=last,
                        resumed=resumed, **extra)

    def added(self, ts: float, req: str, prompt_len: int, max_tokens: int, arrival: float) -> dict:
        return self.add("request_added", ts, req_id=req, prompt_len=prompt_len, max_tokens=max_tokens,
                        temperature=0.0, top_p=1.0, priority=0, arrival_ts=arrival)

    def preempt(self, ts: float, step: int, req: str, discarded: int, prompt_len: int, output: int, n: int, *,
                running: int, waiting: int) -> dict:
        return self.add("preempt", ts, step=step, req_id=req, discarded_tokens=discarded, prompt_len=prompt_len,
                        output_tokens=output, num_preemptions=n, kv_usage=0.99, running=running,
                        waiting=waiting, reason="kv_cache")

    def finished(self, ts: float, step: int, req: str, prompt_len: int, output: int, n: int = 0) -> dict:
        return self.add("request_finished", ts, step=step, req_id=req, reason="length", prompt_len=prompt_len,
                        output_tokens=output, num_preemptions=n)

    def probe_stats(self, ts: float, dropped: int = 0) -> dict:
        return self.add("probe_stats", ts, events_written=len(self.events), events_dropped=dropped,
                        hook_errors={}, hooks_disabled=[])

    def lines(self) -> list[str]:
        return [json.dumps(ev) + "\n" for ev in self.events]

    @property
    def records(self) -> list:
        """The stream as the reader yields it: one record per event (:func:`records`)."""
        return records(self.events)

    def write(self, run_dir: Path, extra_lines: list[str] | None = None, tail: str = "") -> Path:
        """Write ``events-<pid>.jsonl`` (plus ``extra_lines`` and an unterminated ``tail``)."""
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / f"events-{self.pid}.jsonl"
        path.write_text("".join(self.lines() + list(extra_lines or [])) + tail)
        return path


def scenario_chunked(engine: int = 0, pid: int = 4242, t: float = 100.0, req: str = "R") -> Stream:
    """A 5,000-token prompt, budget 2,048: chunks [0,2048) [2048,4096) [4096,5000), 4 tokens.

    By hand: queue 0.2 s (arrival t+0.1, first chunk t+0.3); first token at step 3's ts
    (t+0.601): TTFT 0.501 s, 3 steps (arrival step 0 → last chunk step 2); finish t+0.85:
    decode 0.249 s, inter-token 0.083 s; re-read 2,048 + 4,096 = 6,144 tokens.
    Steps 0..6 scheduled 2048, 2048, 904, 1, 1, 1, 0; schedule() takes 1 ms each.
    """
    s = Stream(engine, pid)
    s.config(t, budget=2048, max_num_seqs=8)
    s.added(t + 0.2, req, 5000, 4, arrival=t + 0.1)
    s.chunk(t + 0.300, 0, req, 0, 0, 2048, 5000)
    s.step(t + 0.301, 0, 2048, prefill=2048, running=1, waiting=0, kv=0.25, prefill_reqs=1)
    s.chunk(t + 0.400, 1, req, 1, 2048, 4096, 5000)
    s.step(t + 0.401, 1, 2048, prefill=2048, running=1, waiting=0, kv=0.5, prefill_reqs=1)
    s.chunk(t + 0.500, 2, req, 2, 4096, 5000, 5000, last=True)
    s.step(t + 0.501, 2, 2048, prefill=904, running=1, waiting=0, kv=0.625, prefill_reqs=1)
    s.step(t + 0.601, 3, 2048, decode=1, running=1, waiting=0, kv=0.625, decode_reqs=1)
    s.step(t + 0.701, 4, 2048, decode=1, running=1, waiting=0, kv=0.625, decode_reqs=1)
    s.step(t + 0.801, 5, 2048, decode=1, running=1, waiting=0, kv=0.625, decode_reqs=1)
    s.finished(t + 0.85, 5, req, 5000, 4)
    s.step(t + 0.901, 6, 2048, running=0, waiting=0, kv=0.0, finished=[req])
    s.probe_stats(t + 1.0)
    return s


def scenario_preempt(t: float = 200.0) -> Stream:
    """Three requests (A 150, B 80, C 50 prompt tokens; 3 output tokens each), budget 100,
    ``max_num_seqs`` 2, all arriving at t. B is preempted at steps 3 and 5 and recomputed
    (81, then 82 tokens). Figures by hand in tests/analysis/test_summary.py.
    """
    s = Stream()
    B = 100
    s.config(t - 0.5, budget=B, max_num_seqs=2)
    for rid, p in (("A", 150), ("B", 80), ("C", 50)):
        s.added(t, rid, p, 3, arrival=t)
    s.chunk(t + 0.095, 0, "A", 0, 0, 100, 150)
    s.step(t + 0.1, 0, B, prefill=100, running=1, waiting=2)  # token_budget
    s.chunk(t + 0.195, 1, "A", 1, 100, 150, 150, last=True)
    s.chunk(t + 0.195, 1, "B", 0, 0, 50, 80)
    s.step(t + 0.2, 1, B, prefill=100, running=2, waiting=1)  # token_budget
    s.chunk(t + 0.295, 2, "B", 1, 50, 80, 80, last=True)
    s.step(t + 0.3, 2, B, prefill=30, decode=1, running=2, waiting=1)  # max_num_seqs
    s.preempt(t + 0.39, 3, "B", 80, 80, 1, 1, running=1, waiting=2)
    s.chunk(t + 0.395, 3, "C", 0, 0, 50, 50, last=True)
    s.step(t + 0.4, 3, B, prefill=50, decode=1, running=2, waiting=1, preempted=["B"])  # max_num_seqs
    s.finished(t + 0.45, 3, "A", 150, 3)
    s.chunk(t + 0.495, 4, "B", 0, 0, 81, 80, prefill_len=81, last=True, resumed=True)
    s.step(t + 0.5, 4, B, prefill=81, decode=1, running=2, waiting=0, finished=["A"])  # none
    s.preempt(t + 0.59, 5, "B", 81, 80, 2, 2, running=1, waiting=1)
    s.step(t + 0.6, 5, B, decode=1, running=1, waiting=1, preempted=["B"])  # kv_cache
    s.finished(t + 0.65, 5, "C", 50, 3)
    s.chunk(t + 0.695, 6, "B", 0, 0, 82, 80, prefill_len=82, last=True, resumed=True)
    s.step(t + 0.7, 6, B, prefill=82, running=1, waiting=0, finished=["C"])  # none
    s.step(t + 0.8, 7, B, decode=1, running=1, waiting=0)  # none
    s.finished(t + 0.85, 7, "B", 80, 3, n=2)
    s.step(t + 0.9, 8, B, running=0, waiting=0, finished=["B"])  # none
    s.probe_stats(t + 1.0)
    return s
