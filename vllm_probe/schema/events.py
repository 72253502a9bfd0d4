"""The event schema: every kind of line vllm-probe writes, its fields and their units.

This module is the single definition of the JSON-lines interface. The probe's hooks
build each event by field name with :attr:`EventKind.pack` (``STEP.pack(step=3, ...)``),
a msgspec Struct generated from the kind's fields, and queue it; the writer thread turns
it into an object with the fields in schema order. ``docs/events.md`` is generated from
here (``python -m vllm_probe.schema.events > docs/events.md``) and a test keeps the two
in sync.

Bump :data:`SCHEMA_VERSION` whenever the meaning of an existing field changes or a field
is removed; adding a new optional field or a new kind does not bump it (readers skip
kinds and fields they do not know, and an emit site that does not pass a new optional
field leaves it out of the line).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Field:
    """One field of an event: name, JSON type, unit and meaning."""

    name: str
    type: str
    unit: str
    doc: str
    optional: bool = False


@dataclass(frozen=True)
class EventKind:
    """One kind of event line (the value of its ``event`` key).

    ``pack`` builds one event of this kind by field name, as the sink queues it:
    ``STEP.pack(step=3, scheduled_tokens=256, ...)``. It is a msgspec Struct class
    generated from ``fields`` (same names, same order, values untyped: no checks on the
    hot path). Every field not marked optional is a required keyword argument, so an
    emit site that leaves one out raises ``TypeError: Missing required argument 'x'``;
    an optional field defaults to None, which the sink leaves out of the line; a name
    that is not a field raises ``TypeError: Unexpected keyword argument 'x'``.
    ``msgspec.structs.astuple(event)`` gives the values in ``fields`` order.
    """

    name: str
    flag: str | None
    doc: str
    fields: tuple[Field, ...]
    pack: type = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pack", _fields_struct(self.name, self.fields))

    @property
    def field_names(self) -> tuple[str, ...]:
        """The kind's field names in schema order (the common fields excluded)."""
        return tuple(f.name for f in self.fields)


def _fields_struct(kind_name: str, fields: tuple[Field, ...]) -> type:
    """The Struct behind :attr:`EventKind.pack`, e.g. ``StepFields`` for ``step``.

    Keyword-only, so values go in by name only; optional fields default to None.
    Chosen by measurement (Python 3.11, msgspec 0.23, the 2-core test machine; CPU µs
    to build and queue a 15-field ``step`` event, and MiB held by 65,536 of them in the
    sink's queue): a positional tuple (before) 0.35 µs, 26.7 MiB; this Struct 0.40 µs,
    26.5 MiB; a keyword function generated with ``exec`` returning the tuple 0.44 µs,
    26.7 MiB; a dict literal 0.82 µs, 46.0 MiB.
    """
    name = "".join(part.title() for part in kind_name.split("_")) + "Fields"
    spec = [(f.name, object, None) if f.optional else (f.name, object) for f in fields]
    return msgspec.defstruct(name, spec, kw_only=True, module=__name__)


#: Fields present on every line, written by the sink (not by the hooks).
COMMON_FIELDS: tuple[Field, ...] = (
    Field("event", "string", "-", "Kind of event (one of the kinds below)."),
    Field("ts", "float", "s", "Wall-clock time since the Unix epoch when the event happened."),
    Field("pid", "int", "-", "Process id of the engine core that wrote the line."),
    Field("engine", "int", "-", "Data-parallel rank of the engine core; 0 without data parallelism."),
    Field("schema", "int", "-", f"Schema version of the line (currently {SCHEMA_VERSION})."),
)

#: Every value of ``step.head_blocked_by``, in the order its documentation lists them
#: (the engine side decides which, :mod:`vllm_probe.engine.admission`).
HEAD_BLOCKED_REASONS = ("token_budget", "max_num_seqs", "kv_cache", "preemption", "prefill_limit", "deferred")

#: What a machine-speed mark is (``engine_config`` and ``probe_stats`` carry one each).
_SPEED_MARK = ("Machine-speed mark: the median wall-clock time of one pass of the probe's fixed reference computation "
               "(10,000 rounds of an integer loop in Python, `vllm_probe/engine/speed.py`; 5 passes timed, ~1 ms each) "
               "on this engine core's host; lower is faster. Two runs' marks compare their hosts' speed for the engine "
               "core's Python work (scheduling; on the CPU backend the model too): a mark 1.3× another's means "
               "seconds up to 1.3× longer for that reason alone.")

_STEP_REF = Field("step", "int", "step", "Index of the scheduler step (0-based, per engine core) in which it happened.")

ENGINE_CONFIG = EventKind(
    "engine_config",
    None,
    "Once per engine core, when its scheduler is built: the effective settings, "
    "after vLLM applied its defaults and platform overrides.",
    (
        Field("vllm_version", "string", "-", "`vllm.__version__` of the engine."),
        Field("probe_version", "string", "-", "Version of vllm-probe."),
        Field("scheduler_class", "string", "-", "Class of the scheduler, e.g. `Scheduler` or `AsyncScheduler`."),
        Field("patched", "list[string]", "-", "Hook targets installed (e.g. `Scheduler.schedule`)."),
        Field("max_num_batched_tokens", "int", "tokens", "Token budget of one step."),
        Field("max_num_seqs", "int", "requests", "Most requests in the running queue."),
        Field("enable_chunked_prefill", "bool", "-", "Whether a prompt may be split across steps."),
        Field("long_prefill_token_threshold", "int", "tokens", "Cap on one request's prefill chunk (0 = none)."),
        Field("num_kv_blocks", "int", "blocks", "KV-cache blocks of the engine (block 0 is reserved by vLLM)."),
        Field("block_size", "int", "tokens", "Tokens per KV-cache block."),
        Field("kv_capacity_tokens", "int", "tokens", "`(num_kv_blocks - 1) * block_size`: tokens the KV cache can hold."),
        Field("max_model_len", "int", "tokens", "Longest prompt + output a request may have."),
        Field("scheduling_policy", "string", "-", "`fcfs` or `priority`."),
        Field("async_scheduling", "bool", "-", "Whether step N+1 is scheduled before step N's output is processed."),
        Field("prefix_caching", "bool", "-", "Whether automatic prefix caching is on."),
        Field("data_parallel_size", "int", "ranks", "Number of data-parallel engine cores."),
        Field("flags", "object", "-", "The `scheduler_probe` flags in force for this engine core."),
        # Scheduler inputs beyond the classic settings: what `vllm-probe whatif` needs to
        # rebuild the same scheduler (null or absent where the release has no such setting).
        Field("max_num_scheduled_tokens", "int", "tokens", "Tokens one step may schedule (vLLM 0.17+; differs from `max_num_batched_tokens` only when set apart).", True),
        Field("max_num_active_seqs", "int", "requests", "Most requests admitted into the running queue, when set below `max_num_seqs` (vLLM 0.31+).", True),
        Field("long_prefill_token_threshold_adaptive", "bool", "-", "Whether the long-prefill threshold is raised to budget / running requests (vLLM 0.31+).", True),
        Field("scheduler_reserve_full_isl", "bool", "-", "Whether a waiting request is admitted only when its whole prompt fits in the free KV blocks (vLLM 0.19+).", True),
        Field("watermark", "float", "0..1", "Share of KV blocks kept free when admitting requests (vLLM 0.24+).", True),
        Field("hash_block_size", "int", "tokens", "Tokens per prefix-cache block hash (`block_size` unless the KV cache groups differ).", True),
        Field("num_speculative_tokens", "int", "tokens", "Draft tokens per step with speculative decoding (absent without).", True),
        Field("kv_cache_groups", "list[string]", "-", "KV-cache spec of each KV cache group, e.g. `[\"FullAttentionSpec\"]`; hybrid models have several.", True),
        Field("gpu_memory_utilization", "float", "0..1", "Share of the device's memory vLLM may use (the CPU backend: of the NUMA node's memory).", True),
        Field("num_gpu_blocks_override", "int", "blocks", "KV blocks forced by `num_gpu_blocks_override` (absent when vLLM sized the cache from memory).", True),
        Field("kv_cache_memory_bytes", "int", "bytes", "KV-cache size forced by `kv_cache_memory_bytes` (absent when not set).", True),
        Field("kv_block_bytes", "int", "bytes", "Device memory of one KV block across all layers (KV-cache tensors / `num_kv_blocks`).", True),
        Field("device_memory_bytes", "int", "bytes", "Total memory of the device `gpu_memory_utilization` is a share of, where vLLM's platform reports it without touching the device (CPU: the NUMA node; CUDA: NVML).", True),
        Field("platform", "string", "-", "vLLM's platform the engine runs on (`current_platform`): `cpu`, `cuda`, `rocm`, `tpu`, `xpu`, … (what a remedy may ask of the engine depends on it: the CPU backend takes `gpu_memory_utilization` as a share of the NUMA node's memory).", True),
        Field("segment", "int", "-", "On the copy of this line that heads segment n ≥ 2 of an engine core's events (`events-<pid>.<n>.jsonl`, see `scheduler_probe.max_segment_mb`): n. Absent on the original line. The copy keeps the original's `ts` and is not an event: readers of the whole stream skip it, `probe_stats.events_written` does not count it.", True),
        Field("speed_mark_us", "float", "µs", _SPEED_MARK + " Timed when the scheduler was built, before its first step. Absent from older probes and from simulated runs (a replay's machine is its step-time model).", True),
        Field("kv_cache_group_specs", "list[kv_group]", "-", "Each KV-cache group as the scheduler's KV-cache manager holds it, in vLLM's group order: `kind` (the spec class, e.g. `FullAttentionSpec`, `SlidingWindowSpec`), `block_size` (tokens per block), `sliding_window` (tokens, null without), `layers` (attention layers sharing the group's block table) and `blocks_per_request` (the blocks vLLM reserves for one request of `max_model_len` tokens in that group: `cdiv(max_memory_usage_bytes, page_size_bytes)`, `vllm/v1/core/kv_cache_utils.py` 0.32; a sliding-window group holds only its window plus the tokens in flight). Every group takes its blocks from the one pool of `num_kv_blocks`. What a replay needs to build the same groups.", True),
        Field("kv_max_concurrency", "float", "x", "vLLM's own start-up figure \"Maximum concurrency for `max_model_len` tokens per request: X×\" (`cache_config.kv_cache_max_concurrency`, vLLM 0.32): `num_kv_blocks` / the sum of the groups' `blocks_per_request`. Absent where the release does not compute it.", True),
        Field("speculative_method", "string", "-", "Speculative decoding's method (`ngram`, `eagle`, `draft_model`, `mtp`, …; absent without speculative decoding).", True),
    ),
)

STEP = EventKind(
    "step",
    "log_schedule_each_step",
    "One per call of `Scheduler.schedule()`: what the step scheduled and the state "
    "of the queues and KV cache when it returned.",
    (
        _STEP_REF,
        Field("scheduled_tokens", "int", "tokens", "Tokens scheduled in this step (prefill + decode)."),
        Field("token_budget", "int", "tokens", "The step's token budget (`max_num_scheduled_tokens`)."),
        Field("prefill_reqs", "int", "requests", "Requests that got a prefill chunk (first prefill or recompute).", True),
        Field("prefill_tokens", "int", "tokens", "Tokens of those prefill chunks.", True),
        Field("decode_reqs", "int", "requests", "Requests that got decode tokens.", True),
        Field("decode_tokens", "int", "tokens", "Decode tokens (incl. speculative tokens).", True),
        Field("new_reqs", "int", "requests", "Requests admitted from the waiting queue in this step (incl. resumed)."),
        Field("running", "int", "requests", "Length of the running queue after scheduling."),
        Field("waiting", "int", "requests", "Length of the waiting queue after scheduling."),
        Field("kv_usage", "float", "0..1", "Share of KV-cache blocks in use after scheduling."),
        Field("free_blocks", "int", "blocks", "Free KV-cache blocks after scheduling."),
        Field("schedule_us", "float", "µs", "Time spent inside `schedule()`."),
        Field("preempted", "list[string]", "-", "Ids of requests preempted during this step (empty list when none)."),
        Field("finished", "list[string]", "-", "Ids of requests that finished since the previous step."),
        Field("head_blocked_by", "string", "-",
              "With requests still waiting: why the first of them was not admitted. `token_budget` "
              "(budget used up), `max_num_seqs` (running queue full), `kv_cache` (the blocks vLLM "
              "requires to admit it, its whole prompt from vLLM 0.19, exceed the free blocks), "
              "`preemption` (the step preempted; vLLM admits nobody in such a step), `prefill_limit` "
              "(new prefills held back: data-parallel throttle, 0.24+, or prefill cadence, 0.33), "
              "`deferred` (waiting outside the scheduler: grammar, remote KV, LoRA slot, pause, or "
              "under async scheduling a slot held one more step by a finished request). Absent when "
              "nothing waits. `kv_cache` is named by elimination (no prefix-cache lookup); a KV "
              "connector's hidden skips before 0.18 read as `kv_cache`.", True),
        Field("draft_tokens", "int", "tokens",
              "With speculative decoding: draft tokens scheduled in this step for verification "
              "(`scheduled_spec_decode_tokens`, placeholder padding of a request's first decode step "
              "included): each takes a slot of the token budget beside its request's one decode token; "
              "part of `decode_tokens`. Absent without speculative decoding.", True),
        Field("verified_tokens", "int", "tokens",
              "With speculative decoding: proposed draft tokens (padding excluded) whose verification vLLM "
              "processed since the previous step line (`update_from_output`): without async scheduling, "
              "the previous step's drafts.", True),
        Field("accepted_tokens", "int", "tokens",
              "With speculative decoding: of `verified_tokens`, those the model accepted (each one an output "
              "token that took no step of its own).", True),
    ),
)

PREEMPT = EventKind(
    "preempt",
    "log_preempt_events",
    "One per preempted request (vLLM V1 preempts by recompute: the request's KV blocks "
    "are freed and it goes back to the front of the waiting queue).",
    (
        _STEP_REF,
        Field("req_id", "string", "-", "Request id."),
        Field("discarded_tokens", "int", "tokens", "Computed tokens thrown away; they will be recomputed."),
        Field("prompt_len", "int", "tokens", "Prompt length of the request."),
        Field("output_tokens", "int", "tokens", "Tokens the request had generated so far."),
        Field("num_preemptions", "int", "-", "Times this request has been preempted, this one included."),
        Field("kv_usage", "float", "0..1", "KV-cache use just before the request's blocks were freed."),
        Field("running", "int", "requests", "Running queue length after the preemption."),
        Field("waiting", "int", "requests", "Waiting queue length after the preemption."),
        Field("reason", "string", "-", "`kv_cache` (inside `schedule()`: no free blocks) or `reset` (outside a step, e.g. `reset_prefix_cache`)."),
    ),
)

CHUNK = EventKind(
    "chunk",
    "log_chunk_boundaries",
    "One per prefill chunk: a scheduled slice of a request's prefill. A prefill pass "
    "runs from admission (or readmission after a preemption) until the request's "
    "computed tokens reach `prefill_len`.",
    (
        _STEP_REF,
        Field("req_id", "string", "-", "Request id."),
        Field("chunk_index", "int", "-", "0-based index of the chunk within this prefill pass."),
        Field("start", "int", "tokens", "First token position computed by this chunk."),
        Field("end", "int", "tokens", "One past the last position (exclusive)."),
        Field("prompt_len", "int", "tokens", "Prompt length of the request."),
        Field("prefill_len", "int", "tokens", "Where this pass ends: `prompt_len` on first admission, prompt + output tokens so far on a recompute."),
        Field("last", "bool", "-", "True on the chunk that reaches `prefill_len`."),
        Field("resumed", "bool", "-", "True when this pass re-prefills after a preemption."),
        Field("prefix_hit_tokens", "int", "tokens", "On `chunk_index` 0 only: tokens served by the prefix cache (equals `start`).", True),
    ),
)

REQUEST_ADDED = EventKind(
    "request_added",
    "log_request_events",
    "A request reached the engine core's scheduler. Never carries prompt text or token ids.",
    (
        Field("req_id", "string", "-", "Request id."),
        Field("prompt_len", "int", "tokens", "Prompt length."),
        Field("max_tokens", "int", "tokens", "Sampling `max_tokens` (null for pooling requests)."),
        Field("temperature", "float", "-", "Sampling temperature (null for pooling requests)."),
        Field("top_p", "float", "-", "Sampling top_p (null for pooling requests)."),
        Field("priority", "int", "-", "Request priority (used by the `priority` policy)."),
        Field("arrival_ts", "float", "s", "Wall-clock arrival time stamped by vLLM's front end (epoch seconds)."),
        Field("block_digests", "list[string]", "-", "With prefix caching on: one 16-hex-digit digest per full block of the prompt (`hash_block_size` tokens), a keyed BLAKE2b of vLLM's block hash. Equal digests in one file mean equal prompt prefixes through that block; the key is random per engine core and never written, so digests say nothing across files or about the text. 19 bytes per block on the line (a 2,048-token prompt: 16 blocks of 128, ~300 bytes). Switched by `scheduler_probe.log_block_digests`.", True),
    ),
)

REQUEST_FINISHED = EventKind(
    "request_finished",
    "log_request_events",
    "A request left the scheduler (stopped, length cap reached, or aborted).",
    (
        _STEP_REF,
        Field("req_id", "string", "-", "Request id."),
        Field("reason", "string", "-", "`stop`, `length`, `abort`, `error` or the raw status name."),
        Field("prompt_len", "int", "tokens", "Prompt length."),
        Field("output_tokens", "int", "tokens", "Tokens generated."),
        Field("num_preemptions", "int", "-", "Times the request was preempted."),
        Field("output_block_digests", "list[string]", "-", "With prefix caching on: the digests (as `request_added.block_digests`, same key) of the full blocks past the prompt's full blocks at the end: the blocks holding output tokens, the first of them also the prompt's last partial block. A later prompt that repeats this request's prompt and answer (a conversation's next turn) has these digests in its `block_digests`, and a replay hits them where the engine did; absent when the output filled no block. Switched by `scheduler_probe.log_block_digests`.", True),
        Field("draft_verifications", "list[string]", "tokens", "With speculative decoding: one `\"output_index:proposed:accepted\"` per step that verified drafts of this request, in order (counts, never token ids): the output tokens it had before that step, the proposed draft tokens scheduled (`-1` padding excluded) and how many the model accepted; a fourth number, the draft slots scheduled, where the drafter padded its proposal (they took budget slots all the same), e.g. `\"41:1:0:3\"`. The placeholders of a request's first decode step (no output yet) are the scheduler's own and not listed. `accepted` is -1 for drafts a preemption dropped before their verification (vLLM clears them; they had asked the KV cache for their slots, which is what can preempt). A replay gives the request the same drafts at the same output positions and accepts the same number (about 10 bytes per verifying step: a 256-token answer verified 3 drafts at a time, ~700 bytes). Absent without drafts.", True),
    ),
)

PROBE_STATS = EventKind(
    "probe_stats",
    None,
    "How complete the engine core's events are. Written when the engine core receives SIGTERM/SIGINT, "
    "then at the end of every write until the process ends (vLLM may SIGKILL it "
    "milliseconds later), and at exit if more events followed; counts are cumulative "
    "over the engine core's segments and the last `probe_stats` line of its last segment "
    "is final. A stream without one was cut short (SIGKILL): at most the last 0.1 s of "
    "events is missing.",
    (
        Field("events_written", "int", "events", "Event lines this engine core wrote, in all its segments (this line and `engine_config` copies excluded)."),
        Field("events_dropped", "int", "events", "Events lost: queue full or write failed."),
        Field("hook_errors", "object", "-", "Exceptions caught per hook, e.g. `{\"chunk\": 0}`."),
        Field("hooks_disabled", "list[string]", "-", "Hooks switched off after repeated errors."),
        Field("speed_mark_us", "float", "µs", _SPEED_MARK + " Timed once at the end: at the stop signal (after the events queued then are written, so a line before it may lack the field) or at exit; every later `probe_stats` line repeats it. Absent from older probes, from simulated runs, and when the engine core was killed before it was timed.", True),
    ),
)

KINDS: dict[str, EventKind] = {
    k.name: k
    for k in (ENGINE_CONFIG, STEP, PREEMPT, CHUNK, REQUEST_ADDED, REQUEST_FINISHED, PROBE_STATS)
}


def render_markdown() -> str:
    """Return the schema as the Markdown page kept in ``docs/events.md``."""
    out = [
        "# Event schema",
        "",
        "<!-- generated by `python -m vllm_probe.schema.events > docs/events.md`; do not edit -->",
        "",
        f"Schema version: **{SCHEMA_VERSION}**. One JSON object per line, one stream per "
        "engine-core process: `events-<pid>.jsonl` in the run directory, continued in "
        "`events-<pid>.2.jsonl`, `events-<pid>.3.jsonl` … when the probe rotates segments "
        "(`scheduler_probe.max_segment_mb`, `rotate_every_s`); closed segments may be gzipped "
        "(`.jsonl.gz`) and the oldest removed (`keep_mb`, `keep_hours`). Each segment from 2 on "
        "starts with a copy of `engine_config` carrying `segment`. Readers must "
        "skip kinds and fields they do not know; `schema` is bumped when a meaning changes. "
        "Optional fields are omitted when they do not apply. vllm-probe's own readers "
        "(`summary`, `compare`, `export`, `tail`) read each line as a typed record built from "
        "this page (`vllm_probe/schema/records.py`): a value of another JSON type than listed (`null` "
        "aside; a `float` field accepts integers) makes the line count as malformed.",
        "",
        "## Fields on every line",
        "",
        "| field | type | unit | meaning |",
        "|---|---|---|---|",
    ]
    out += [f"| `{f.name}` | {f.type} | {f.unit} | {f.doc} |" for f in COMMON_FIELDS]
    for kind in KINDS.values():
        flag = f" Switched by `scheduler_probe.{kind.flag}`." if kind.flag else " Always written."
        out += ["", f"## `{kind.name}`", "", kind.doc + flag, "",
                "| field | type | unit | meaning |", "|---|---|---|---|"]
        for f in kind.fields:
            opt = " *(optional)*" if f.optional else ""
            out.append(f"| `{f.name}` | {f.type} | {f.unit} | {f.doc}{opt} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")
