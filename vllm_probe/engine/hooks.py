"""The hooks: what the probe records inside vLLM's scheduler, and the state it keeps.

:class:`SchedulerProbe` is attached to each ``Scheduler`` instance (one per engine core)
and builds the events: ``engine_config`` when the scheduler is built, ``step`` per
``schedule()`` call, ``chunk`` per prefill chunk, ``preempt`` per preempted request,
``request_added`` / ``request_finished`` per request; with speculative decoding, the
drafts each output verified (``update_from_output``) go into the next step line and the
request's ``request_finished``. :class:`HookHealth` counts the
exceptions caught in each hook and switches a hook off after :data:`MAX_HOOK_ERRORS`;
:class:`Runtime` is the process-wide state (flags, health, the lazily created sink).
Which scheduler methods call into these, and how they are wrapped, is the patch table
in :mod:`.patches`.

Hot-path budget (see docs/performance.md): per step the probe reads a few counters and
appends one event to the sink's queue; per-request work happens only for requests that
are prefilling, admitted, preempted or finished.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from collections.abc import Callable

from .. import __version__, envvars
from . import compat
from .admission import AdmissionProfile, head_blocked_by
from ..schema.events import CHUNK, ENGINE_CONFIG, PREEMPT, REQUEST_ADDED, REQUEST_FINISHED, STEP
from ..settings import ProbeFlags
from . import speed
from .signals import on_stop_signals
from .sink import Deferred, EventSink

logger = logging.getLogger("vllm_probe")

#: Exceptions a hook may raise before it switches itself off.
MAX_HOOK_ERRORS = 3
#: Attribute holding a scheduler's :class:`SchedulerProbe` (in the instance's ``__dict__``).
PROBE_ATTR = "_vllm_probe"
#: Attribute set on our wrappers, pointing at vLLM's original (guards double wrapping).
WRAPPED_ATTR = "__vllm_probe_original__"


class HookHealth:
    """Per-process count of exceptions caught in each hook, and which are switched off.

    ``errors`` maps hook name -> exceptions caught (``probe_stats.hook_errors``);
    ``disabled`` holds the hooks switched off (``probe_stats.hooks_disabled``).
    """

    def __init__(self) -> None:
        self.errors: dict[str, int] = {}
        self.disabled: set[str] = set()

    def track(self, hooks: Iterable[str]) -> None:
        """Count ``hooks`` from zero (the patch table's hooks, at install); their order
        is the order of ``probe_stats.hook_errors``. Counts already there are kept."""
        for hook in hooks:
            self.errors.setdefault(hook, 0)

    def failed(self, hook: str, exc: BaseException, limit: int = MAX_HOOK_ERRORS) -> None:
        """Count one exception of ``hook``; at ``limit`` switch the hook off with one warning."""
        self.errors[hook] = self.errors.get(hook, 0) + 1
        if self.errors[hook] == 1:
            logger.debug("vllm-probe: error in hook %r", hook, exc_info=exc)
        if self.errors[hook] >= limit and hook not in self.disabled:
            self.disabled.add(hook)
            logger.warning(
                "vllm-probe: hook %r disabled after %d errors (last: %s: %s); vLLM is unaffected",
                hook, self.errors[hook], type(exc).__name__, exc,
            )

    def snapshot(self) -> tuple[dict[str, int], list[str]]:
        """``(hook_errors, hooks_disabled)`` for a ``probe_stats`` line (copies)."""
        return dict(self.errors), sorted(self.disabled)


class Runtime:
    """Process-wide probe state: flags, health, the lazily created sink, the clocks.

    Args:
        flags: which event kinds to write.
        sink_factory: builds the sink on the first scheduler (so only engine-core
            processes, where a ``Scheduler`` is built, ever create a file).
        clock: ``() -> float``, the events' ``ts`` (s since the epoch); ``time.time``
            in vLLM. A replay (:mod:`vllm_probe.sim.replay`) passes its virtual clock.
        timer: ``() -> float``, the monotonic seconds ``schedule_us`` is measured with;
            ``time.perf_counter`` in vLLM.
        speed_mark: ``() -> float | None``, the machine-speed mark in µs
            (:func:`vllm_probe.engine.speed.measure`, never raising), taken when each
            scheduler's probe starts (``engine_config.speed_mark_us``) and, by
            :func:`file_sink_factory`'s sink, at the end (``probe_stats.speed_mark_us``);
            None: no mark (a replay, whose machine is its step-time model).

    The hooks bind ``clock`` and the ``schedule()`` wrapper binds ``timer`` once, so a
    clock costs the hot path nothing over calling ``time.time`` directly.
    """

    def __init__(self, flags: ProbeFlags, sink_factory: Callable[[Runtime], Any],
                 clock: Callable[[], float] = time.time,
                 timer: Callable[[], float] = time.perf_counter,
                 speed_mark: Callable[[], float | None] | None = speed.measure) -> None:
        self.flags = flags
        self.health = HookHealth()
        self.clock = clock
        self.timer = timer
        self.speed_mark = speed_mark
        self._sink_factory = sink_factory
        self._sink = None
        self.patched: list[str] = []
        self.vllm_version = "unknown"
        #: Called once, when the first scheduler of this process gets its probe: the
        #: plugin logs there, so only engine cores (not API servers or workers) say so.
        self.on_first_scheduler: Callable[[], None] | None = None

    @property
    def sink(self) -> Any:
        """The sink, built by ``sink_factory`` on first use."""
        if self._sink is None:
            self._sink = self._sink_factory(self)
        return self._sink

    def enabled(self, hook: str) -> bool:
        """Whether ``hook`` is still on (not switched off after errors)."""
        return hook not in self.health.disabled

    def close(self) -> None:
        """Close the sink if one was made (it writes its final ``probe_stats`` line).

        Idempotent. In vLLM's processes the sink closes itself at exit; tests and
        benchmarks that install the probe in their own process call this when done.
        """
        if self._sink is not None:
            self._sink.close()


#: Bytes in the settings' MB (``max_segment_mb``, ``keep_mb``): MiB.
MIB = 1 << 20


def file_sink_factory(run_dir: Path) -> Callable[[Runtime], EventSink]:
    """A factory writing ``<run_dir>/events-<pid>.jsonl`` (run_dir created 0700), in
    segments as ``rt.flags`` say (``max_segment_mb`` …, :class:`~.sink.EventSink`)."""

    def make(rt: Runtime) -> EventSink:
        path = Path(run_dir) / f"events-{os.getpid()}.jsonl"
        try:
            Path(run_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError:
            pass  # the sink reports the failure to open the file
        f = rt.flags
        sink = EventSink(
            path, capacity=f.queue_capacity, stats_extra=rt.health.snapshot,
            max_segment_bytes=int(f.max_segment_mb * MIB) or None, rotate_every_s=f.rotate_every_s,
            compress_segments=f.compress_segments,
            keep_bytes=None if f.keep_mb is None else int(f.keep_mb * MIB),
            keep_s=None if f.keep_hours is None else f.keep_hours * 3600.0, speed_mark=rt.speed_mark,
        )
        on_stop_signals(sink.checkpoint)
        return sink

    return make


class _Pass:
    """A prefill pass in progress: where it ends, the next chunk index, resumed or not."""

    __slots__ = ("prefill_len", "index", "resumed")

    def __init__(self, prefill_len: int, index: int, resumed: bool) -> None:
        self.prefill_len = prefill_len
        self.index = index
        self.resumed = resumed


class SchedulerProbe:
    """State the probe keeps for one ``Scheduler`` instance (one engine core).

    ``step`` is the index of the step in progress (0-based). ``prefilling`` holds the
    requests whose prefill pass has started but not reached ``prefill_len``;
    ``resume_pending`` the preempted requests not yet readmitted. Both stay small
    (bounded by the running and waiting queues), which keeps decode-only steps O(1).

    Every event is built by field name with its kind's ``pack``
    (:class:`~vllm_probe.schema.events.EventKind`) and queued with ``rt.sink.emit(kind,
    ts, engine, event)``; ``ts`` is ``rt.clock()`` (s since the epoch: ``time.time()``
    in vLLM), ``engine`` the data-parallel rank.
    Building the probe writes ``engine_config``; it raises whatever reading the
    scheduler's settings raises (the ``__init__`` wrapper counts it and leaves that
    scheduler unprobed). ``admission`` is the scheduler's
    :class:`~.admission.AdmissionProfile`, read once here (None: its layout is unknown,
    and step events carry no ``head_blocked_by``). ``engine_config`` carries the machine-speed
    mark taken here, before the first step (``rt.speed_mark``; a few ms, once per scheduler).
    """

    def __init__(self, rt: Runtime, sched: Any) -> None:
        self.rt = rt
        self.flags = rt.flags
        self.emit = rt.sink.emit
        self.clock = rt.clock
        settings = compat.engine_settings(sched)
        #: request_added carries block digests (prefix caching on: they say what it can hit)
        self.digests_on = bool(self.flags.log_block_digests and settings.get("prefix_caching"))
        #: key of those digests: random, per scheduler, never written
        self._digest_salt = os.urandom(16)
        #: tokens per block hash: request_finished's digests start after the prompt's full blocks
        self._hash_block_size = int(settings.get("hash_block_size") or 0)
        self.engine = settings.pop("engine")
        if hasattr(rt.sink, "engine"):  # the file's probe_stats carry this engine's rank
            rt.sink.engine = self.engine
        self.budget = compat.token_budget(sched)
        self.queue_lengths = compat.queue_lengths_reader(sched)
        self.admission = AdmissionProfile.of(sched, rt.vllm_version)
        self.step = -1
        self.in_schedule = False
        self.step_preempted: list[str] = []
        self.step_prefill_reqs = 0
        self.step_prefill_tokens = 0
        self.step_new_reqs = 0
        self.chunks_seen = False
        self.prefilling: dict[str, _Pass] = {}
        self.resume_pending: set[str] = set()
        #: speculative decoding on: step lines carry draft counts, request_finished its verifications
        self.spec_on = bool(settings.get("num_speculative_tokens"))
        self.sampled_per_step = compat.sampled_per_step(sched)
        #: proposed and accepted draft tokens of the outputs processed since the last step line
        self.verified_since = 0
        self.accepted_since = 0
        #: request -> its verifying steps so far, ``(output index, proposed, accepted, slots)`` each
        #: (written as ``draft_verifications`` strings on the sink's writer thread)
        self.verifications: dict[str, list[tuple[int, int, int, int]]] = {}
        mark = rt.speed_mark() if rt.speed_mark is not None else None
        self.emit(ENGINE_CONFIG, self.clock(), self.engine, ENGINE_CONFIG.pack(
            vllm_version=rt.vllm_version, probe_version=__version__,
            scheduler_class=type(sched).__name__, patched=list(rt.patched),
            flags=self.flags.to_dict(), platform=compat.platform_name(), speed_mark_us=mark, **settings,
        ))

    # -- step -------------------------------------------------------------------------

    def begin_step(self) -> None:
        """Before ``schedule()``: the next step index; per-step counts back to zero."""
        self.step += 1
        self.in_schedule = True
        self.step_preempted = []
        self.step_prefill_reqs = self.step_prefill_tokens = self.step_new_reqs = 0
        self.chunks_seen = False

    def end_step(self, sched: Any, out: Any, seconds: float, throttle_prefills: bool = False) -> None:
        """After ``schedule(throttle_prefills)`` returned ``out`` (a ``SchedulerOutput``)
        in ``seconds``: the ``step`` event (queue lengths and KV use as the step leaves
        them; with requests waiting, why the head was not admitted)."""
        self.in_schedule = False
        if not self.flags.log_schedule_each_step:
            return
        n_tokens = out.total_num_scheduled_tokens
        n_reqs = len(out.num_scheduled_tokens)
        pre_r: int | None
        pre_t: int | None
        dec_r: int | None
        dec_t: int | None
        if self.chunks_seen:
            pre_r, pre_t = self.step_prefill_reqs, self.step_prefill_tokens
            dec_r, dec_t = n_reqs - pre_r, n_tokens - pre_t
        else:  # chunk hook missing or switched off: the split is unknown
            pre_r = pre_t = dec_r = dec_t = None
        running, waiting = self.queue_lengths(sched)
        blocked = None
        if waiting and self.admission is not None:
            try:
                blocked = head_blocked_by(self.admission, sched, out, self.step_preempted, throttle_prefills)
            except Exception as e:  # an unknown layout: this field off for this scheduler, the step goes on
                self.admission = None
                logger.warning("vllm-probe: head_blocked_by switched off (%s: %s); step events go on",
                               type(e).__name__, e)
        kvm = sched.kv_cache_manager
        finished = out.finished_req_ids
        drafts = verified = accepted = None
        if self.spec_on:
            # every scheduled draft slot, placeholders too: what the token budget paid for
            drafts = sum(map(len, out.scheduled_spec_decode_tokens.values()))
            verified, accepted = self.verified_since, self.accepted_since
            self.verified_since = self.accepted_since = 0
        self.emit(STEP, self.clock(), self.engine, STEP.pack(
            step=self.step, scheduled_tokens=n_tokens, token_budget=self.budget,
            prefill_reqs=pre_r, prefill_tokens=pre_t, decode_reqs=dec_r, decode_tokens=dec_t,
            new_reqs=self.step_new_reqs, running=running, waiting=waiting, kv_usage=kvm.usage,
            free_blocks=kvm.block_pool.get_num_free_blocks(), schedule_us=seconds * 1e6,
            preempted=self.step_preempted, finished=list(finished) if finished else [],
            head_blocked_by=blocked, draft_tokens=drafts, verified_tokens=verified, accepted_tokens=accepted,
        ))

    # -- speculative decoding (called before vLLM's update_from_output) -----------------

    def on_output(self, sched: Any, out: Any, model_output: Any) -> None:
        """Before vLLM's ``update_from_output(out, model_output)`` processes a step's output:
        for each request whose drafts the step verified, the proposed drafts (placeholder
        padding, ``-1``, excluded; the scheduled slots too where a drafter padded) and how
        many the model accepted: ``len(sampled) - 1``
        (``num_sampled_tokens_per_step``), as ``update_from_output`` counts them before it
        rolls back the rejected ones (``vllm/v1/core/sched/scheduler.py`` 0.32). Requests
        vLLM skips there (finished, or an output gone stale by a preemption) are skipped
        too. O(requests with drafts); nothing without speculative decoding."""
        drafts = out.scheduled_spec_decode_tokens
        if not drafts:
            return
        sampled = model_output.sampled_token_ids
        if not sampled:
            return
        index = compat.output_index(model_output)
        requests = sched.requests
        keep = self.verifications if self.flags.log_request_events else None
        per = self.sampled_per_step
        verified = accepted = 0
        for rid, ids in drafts.items():
            i = index.get(rid)
            req = requests.get(rid)
            if i is None or req is None:
                continue
            got = sampled[i]
            # a first decode step's placeholders (no output yet) are the scheduler's own padding
            out_index = req.num_output_tokens
            if not out_index or not len(got) or req.is_finished() or getattr(req, "num_stale_output_tokens", 0):
                continue
            n = _proposed(ids)
            a = min(max(len(got) - per, 0), n)
            verified += n
            accepted += a
            if keep is not None:
                keep.setdefault(rid, []).append((out_index, n, a, len(ids)))
        self.verified_since += verified
        self.accepted_since += accepted

    # -- prefill chunks (called before num_computed_tokens advances) -------------------

    def on_chunks(self, sched: Any, out: Any) -> None:
        """Before vLLM's ``_update_after_schedule(out)`` advances ``num_computed_tokens``:
        one ``chunk`` event per scheduled prefill slice, and the step's prefill counts."""
        if not (self.prefilling or self.resume_pending or out.scheduled_new_reqs):
            self.chunks_seen = True  # decode-only step: begin_step's zero counts stand
            return
        nst = out.num_scheduled_tokens
        requests = sched.requests
        emit = self.emit if self.flags.log_chunk_boundaries else None
        pack = CHUNK.pack
        step, engine = self.step, self.engine
        pre_r = pre_t = 0
        ts = self.clock()
        prefilling = self.prefilling
        # draft tokens (speculative decoding) scheduled beside a request's last prefill
        # tokens are decode work: vLLM 0.32 pads a request reaching its first decode step
        # with placeholder drafts (scheduler.py; tests/v1/core/test_scheduler.py
        # ::test_spec_decode_padding_first_decode_step). Found by python -m tests.peer.
        drafts = getattr(out, "scheduled_spec_decode_tokens", None) or {}
        if prefilling:
            for rid in out.finished_req_ids:
                prefilling.pop(rid, None)
            done = []
            for rid, p in prefilling.items():
                n = nst.get(rid)
                if n and drafts:
                    n -= len(drafts.get(rid, ()))
                if not n or n < 0:
                    continue
                req = requests[rid]
                start = req.num_computed_tokens
                end = start + n
                last = end >= p.prefill_len
                if emit:
                    emit(CHUNK, ts, engine, pack(
                        step=step, req_id=rid, chunk_index=p.index, start=start, end=end,
                        prompt_len=req.num_prompt_tokens, prefill_len=p.prefill_len, last=last,
                        resumed=p.resumed))
                p.index += 1
                pre_r += 1
                pre_t += n
                if last:
                    done.append(rid)
            for rid in done:
                del prefilling[rid]
        starting = [r.req_id for r in out.scheduled_new_reqs]
        pending = self.resume_pending
        if pending:
            pending.difference_update(out.finished_req_ids)
            starting.extend(rid for rid in pending if rid in nst and rid not in starting)
        for rid in starting:
            req = requests[rid]
            resumed = rid in pending
            if resumed:
                pending.discard(rid)
            n = nst[rid] - (len(drafts.get(rid, ())) if drafts else 0)
            start = req.num_computed_tokens
            end = start + n
            prefill_len = req.num_tokens
            last = end >= prefill_len
            if emit:
                emit(CHUNK, ts, engine, pack(
                    step=step, req_id=rid, chunk_index=0, start=start, end=end,
                    prompt_len=req.num_prompt_tokens, prefill_len=prefill_len, last=last,
                    resumed=resumed, prefix_hit_tokens=start))
            if not last:
                prefilling[rid] = _Pass(prefill_len, 1, resumed)
            pre_r += 1
            pre_t += n
        self.step_prefill_reqs = pre_r
        self.step_prefill_tokens = pre_t
        self.step_new_reqs = len(starting)
        self.chunks_seen = True

    # -- preemption (called around vLLM's _preempt_request) ----------------------------

    def before_preempt(self, sched: Any, request: Any) -> tuple[int, float]:
        """Bookkeeping that chunk and step events rely on (runs even when preempt
        events are switched off); returns what the preempt event needs."""
        rid = request.request_id
        self.prefilling.pop(rid, None)
        self.resume_pending.add(rid)
        if self.in_schedule:
            self.step_preempted.append(rid)
        if self.spec_on:
            # vLLM drops the drafts of a preempted request unverified; they asked the KV cache for
            # slots all the same (what may have preempted it), so a replay must propose them too
            drafts = getattr(request, "spec_token_ids", None)
            if drafts and request.num_output_tokens and self.flags.log_request_events:
                self.verifications.setdefault(rid, []).append(
                    (request.num_output_tokens, _proposed(drafts), -1, len(drafts)))
        return request.num_computed_tokens, sched.kv_cache_manager.usage

    def after_preempt(self, sched: Any, request: Any, snap: tuple[int, float]) -> None:
        """After vLLM preempted ``request``: the ``preempt`` event; ``snap`` is
        ``(computed tokens, KV use)`` from :meth:`before_preempt`."""
        rid = request.request_id
        if not self.flags.log_preempt_events:
            return
        discarded, usage = snap
        running, waiting = self.queue_lengths(sched)
        self.emit(PREEMPT, self.clock(), self.engine, PREEMPT.pack(
            step=self.step, req_id=rid, discarded_tokens=discarded,
            prompt_len=request.num_prompt_tokens, output_tokens=request.num_output_tokens,
            num_preemptions=getattr(request, "num_preemptions", None), kv_usage=usage,
            running=running, waiting=waiting, reason="kv_cache" if self.in_schedule else "reset",
        ))

    # -- request lifecycle --------------------------------------------------------------

    def on_added(self, request: Any) -> None:
        """After vLLM's ``add_request`` took a new ``request``: ``request_added`` (lengths
        and sampling settings only, never prompt text or token ids).

        With ``log_block_digests`` and prefix caching on, the prompt's full-block hashes
        that vLLM computed (``request.block_hashes``)
        are copied as they are (references, no hashing here) and become salted digests
        on the sink's writer thread (:func:`block_digests`).
        """
        sp = request.sampling_params
        digests = None
        if self.digests_on:
            hashes = getattr(request, "block_hashes", None)
            if hashes:
                digests = Deferred(self._digests, list(hashes))
        self.emit(REQUEST_ADDED, self.clock(), self.engine, REQUEST_ADDED.pack(
            req_id=request.request_id, prompt_len=request.num_prompt_tokens,
            max_tokens=getattr(sp, "max_tokens", None), temperature=getattr(sp, "temperature", None),
            top_p=getattr(sp, "top_p", None), priority=getattr(request, "priority", 0),
            arrival_ts=request.arrival_time, block_digests=digests,
        ))

    def _digests(self, hashes: list[Any]) -> list[str]:
        return block_digests(hashes, self._digest_salt)

    def on_finished(self, request: Any) -> None:
        """Before vLLM's ``_free_request(request)``: ``request_finished``; the request
        leaves the probe's prefill bookkeeping.

        With block digests on, the hashes of the full blocks past the prompt's (vLLM hashes
        output tokens as they are appended, ``Request.update_block_hashes``) are copied
        and become digests on the writer thread: a later prompt that repeats this answer
        hits those blocks, and only these digests let a replay rebuild that hit.
        """
        rid = request.request_id
        self.prefilling.pop(rid, None)
        self.resume_pending.discard(rid)
        done = self.verifications.pop(rid, None) if self.verifications else None
        verifications = Deferred(verification_strings, done) if done else None
        if self.flags.log_request_events:
            digests = None
            if self.digests_on and self._hash_block_size:
                hashes = getattr(request, "block_hashes", None)
                first = request.num_prompt_tokens // self._hash_block_size
                if hashes and len(hashes) > first:
                    digests = Deferred(self._digests, list(hashes[first:]))
            self.emit(REQUEST_FINISHED, self.clock(), self.engine, REQUEST_FINISHED.pack(
                step=max(self.step, 0), req_id=rid, reason=compat.finish_reason(request),
                prompt_len=request.num_prompt_tokens, output_tokens=request.num_output_tokens,
                num_preemptions=getattr(request, "num_preemptions", None), output_block_digests=digests,
                draft_verifications=verifications,
            ))


def verification_strings(entries: list[tuple[int, int, int, int]]) -> list[str]:
    """``request_finished.draft_verifications``: ``"index:proposed:accepted"``, with the draft
    slots as a fourth number where the drafter padded (slots ≠ proposed). On the writer thread."""
    return [f"{i}:{p}:{a}" if s == p else f"{i}:{p}:{a}:{s}" for i, p, a, s in entries]


def _proposed(ids: list[int]) -> int:
    """Draft tokens a proposer made of a request's scheduled drafts: those before the first
    ``-1`` placeholder (vLLM pads a first decode step, and an ngram miss, with ``-1``;
    ``strip_speculative_padding``, ``vllm/v1/structured_output/utils.py`` 0.32)."""
    for i, t in enumerate(ids):
        if t < 0:
            return i
    return len(ids)


#: Bytes of one block digest (16 hex characters on the line).
DIGEST_BYTES = 8


def block_digests(hashes: list[Any], salt: bytes) -> list[str]:
    """Salted digests of a prompt's full-block hashes, for ``request_added.block_digests``.

    ``blake2b(block_hash, key=salt, digest_size=8)`` in hex, one per hash. vLLM's block
    hash of block ``i`` chains the hashes of blocks ``0..i`` with their token ids (and the
    request's cache salt, LoRA and multimodal extras; ``vllm/v1/core/kv_cache_utils.py``
    ``hash_block_tokens``), so within one file equal digests mean equal prompt prefixes
    up to that block, which is all a replay needs to hit the prefix cache where the
    recorded engine did. The salt (16 random bytes per scheduler, never written) makes
    the digests useless outside the file: vLLM's sha256 block hashes start from a fixed
    seed, so an unsalted hash (even truncated) would fingerprint the prompt's text.
    A hash that is not ``bytes`` (every release from 0.12 uses ``bytes``) is skipped.
    Runs on the sink's writer thread.
    """
    out = []
    for h in hashes:
        if isinstance(h, (bytes, bytearray)):
            out.append(hashlib.blake2b(h, key=salt, digest_size=DIGEST_BYTES).hexdigest())
    return out


def attached_probe(sched: Any) -> SchedulerProbe | None:
    """The probe attached to a scheduler instance, if any."""
    probe: SchedulerProbe | None = sched.__dict__.get(PROBE_ATTR)
    return probe


def default_run_dir() -> Path:
    """Run directory from the environment (``VLLMPROBE_RUN_DIR``), else the manual one."""
    return Path(os.environ.get(envvars.RUN_DIR) or envvars.DEFAULT_MANUAL_RUN_DIR)

