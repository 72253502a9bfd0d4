"""Drive vLLM's real ``Scheduler`` without a model (tests, benchmarks, compatibility runs).

Mirrors vLLM's own ``tests/v1/core/utils.py`` (``create_scheduler``): a ``VllmConfig``
on the tiny local model config, a ``KVCacheConfig`` with one full-attention group and
``num_blocks`` blocks (block 0 is reserved, so ``num_blocks - 1`` are usable), and a
step loop that feeds the scheduler a fake ``ModelRunnerOutput`` sampling one token per
request whose prefill is complete. Scheduling decisions are vLLM's own; only the model
is absent. Imports vLLM lazily; raises ImportError when it is not installed.

Release differences the harness adapts to (the compatibility suite, ``python -m
tests.compat``, runs it on every minor release from 0.12; probe differences are in
:mod:`vllm_probe.engine.compat`). Constructor arguments are detected by signature, so each
release gets what it accepts; :func:`harness_adaptations` names those in use.

* ``Request(eos_token_id=...)``: required up to 0.16, removed in 0.17.
* ``Scheduler(block_size=...)``: required from 0.11 (0.11.2 has it, 0.10.2 not);
  ``hash_block_size`` from 0.20.
* ``SchedulerConfig``: keys a release does not know are left out (``is_encoder_decoder``
  before 0.11, ``async_scheduling`` before 0.10).
* ``init_none_hash``: up to 0.28 each call draws a random ``NONE_HASH`` when
  ``PYTHONHASHSEED`` is unset; the harness calls it once per process, as the engine does
  (per request, equal prefixes would hash differently and never hit the prefix cache).
* ``ModelRunnerOutput(pooler_output=[])``: an empty list means "no pooling outputs" in
  every release; a list of ``None`` makes 0.12 run ``check_stop`` on every request,
  even one that sampled nothing (IndexError on its empty output).
* ``ModelRunnerOutput(req_id_to_index=...)``: up to 0.33; 0.34 indexes the output by
  ``req_ids`` alone and drops the argument.
* ``DeviceConfig(device="cpu")`` always: older releases fail to infer the device type.
"""

from __future__ import annotations

import inspect
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from ..engine.sink import Deferred
from .tiny_model import DEFAULT_DIR, MAX_POSITIONS, write_tiny_model


def accepts(func: Any, name: str) -> bool:
    """Whether ``func`` (a constructor or function of the imported vLLM) takes a parameter
    ``name``: how the harness and the settings check tell releases apart."""
    return name in inspect.signature(func).parameters


#: Release-dependent keyword arguments: passed only where the constructor accepts them.
_OPTIONAL_KWARGS = {
    "Request": ("eos_token_id",),
    "Scheduler": ("block_size", "hash_block_size"),
}


def fit_kwargs(kind: str, func: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` less the release-dependent keys of ``kind`` that ``func`` does not take."""
    optional = _OPTIONAL_KWARGS[kind]
    return {k: v for k, v in kwargs.items() if k not in optional or accepts(func, k)}


def harness_adaptations() -> list[str]:
    """The release-dependent constructor arguments in use with the vLLM imported here.

    E.g. ``["Request(eos_token_id)", "Scheduler(block_size)"]`` on 0.12;
    ``SchedulerConfig(-key)`` for a setting the release does not accept,
    ``ModelRunnerOutput(-req_id_to_index)`` from 0.34.
    """
    from vllm.config import SchedulerConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import Request

    out = []
    for kind, func in (("Request", Request.__init__), ("Scheduler", Scheduler.__init__)):
        used = [k for k in _OPTIONAL_KWARGS[kind] if accepts(func, k)]
        if used:
            out.append(f"{kind}({', '.join(used)})")
    dropped = [k for k in _SCHEDULER_CONFIG_KEYS if not accepts(SchedulerConfig, k)]
    if dropped:
        out.append(f"SchedulerConfig({', '.join('-' + k for k in dropped)})")
    from vllm.v1.outputs import ModelRunnerOutput

    if not accepts(ModelRunnerOutput, "req_id_to_index"):
        out.append("ModelRunnerOutput(-req_id_to_index)")
    return out


#: ``SchedulerConfig`` settings of :func:`make_scheduler`; one a release does not know is
#: left out (``is_encoder_decoder`` appears in 0.11, ``async_scheduling`` in 0.10).
_SCHEDULER_CONFIG_KEYS = ("max_num_seqs", "max_num_batched_tokens", "max_model_len",
                          "enable_chunked_prefill", "long_prefill_token_threshold",
                          "async_scheduling", "is_encoder_decoder")


@dataclass
class SchedulerSpec:
    """Scheduler settings for :func:`make_scheduler` (tokens, blocks, requests)."""

    max_num_batched_tokens: int = 256
    max_num_seqs: int = 16
    num_blocks: int = 64
    block_size: int = 16
    max_model_len: int = 2048
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = False
    long_prefill_token_threshold: int = 0
    async_scheduling: bool = False
    model_dir: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: the KV-cache groups to build, as ``engine_config.kv_cache_group_specs`` records them
    #: (``kind``, ``sliding_window``, ``layers``; each group's blocks are ``block_size``
    #: tokens); None: one full-attention group
    kv_groups: list[dict[str, Any]] | None = None
    #: draft tokens per step (speculative decoding, as ``engine_config.num_speculative_tokens``);
    #: 0: none. The scheduler gets an n-gram ``SpeculativeConfig`` (no draft model to load)
    num_speculative_tokens: int = 0


def make_vllm_config(spec: SchedulerSpec | None = None) -> Any:
    """The ``VllmConfig`` :func:`make_scheduler` builds for ``spec``: vLLM validates the
    settings here (``SchedulerConfig``'s own checks, e.g. a token budget below
    ``max_num_seqs``), raising pydantic's ``ValidationError`` or ``ValueError``.

    ``async_scheduling`` is set again after vLLM's platform hook: the CPU platform
    forces it off (``CpuPlatform.check_and_update_config``), and a replay of a GPU run
    needs the scheduler it recorded.
    """
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig

    spec = spec or SchedulerSpec()
    if spec.model_dir is None and spec.max_model_len > MAX_POSITIONS:  # a run of a long-context model
        model_dir = write_tiny_model(DEFAULT_DIR.with_name(f"{DEFAULT_DIR.name}-{spec.max_model_len}"),
                                     max_positions=spec.max_model_len)
    else:
        model_dir = write_tiny_model(spec.model_dir or DEFAULT_DIR)
    model_config = ModelConfig(
        str(model_dir), skip_tokenizer_init=True, max_model_len=spec.max_model_len,
        dtype="float32", seed=0,
    )
    sched_kwargs = dict(
        max_num_seqs=spec.max_num_seqs,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        max_model_len=spec.max_model_len,
        enable_chunked_prefill=spec.enable_chunked_prefill,
        long_prefill_token_threshold=spec.long_prefill_token_threshold,
        async_scheduling=spec.async_scheduling,
        is_encoder_decoder=False,
    )
    assert tuple(sched_kwargs) == _SCHEDULER_CONFIG_KEYS
    sched_kwargs = {k: v for k, v in sched_kwargs.items() if accepts(SchedulerConfig, k)}
    scheduler_config = SchedulerConfig(**sched_kwargs, **spec.extra)
    cache_config = CacheConfig(
        block_size=spec.block_size, enable_prefix_caching=spec.enable_prefix_caching,
        **({"gpu_memory_utilization": 0.3} if accepts(CacheConfig, "gpu_memory_utilization") else {}),
    )
    cache_config.num_gpu_blocks = spec.num_blocks
    extra: dict[str, Any] = {}
    if spec.num_speculative_tokens:
        from vllm.config import SpeculativeConfig

        # n-gram: the method that needs no draft model and reserves no extra slot per request
        # (SpeculativeConfig.max_num_new_slots_for_drafting, vllm/config/speculative.py 0.32)
        extra["speculative_config"] = SpeculativeConfig(method="ngram",
                                                        num_speculative_tokens=spec.num_speculative_tokens)
    vllm_config = VllmConfig(
        model_config=model_config, scheduler_config=scheduler_config,
        cache_config=cache_config, device_config=DeviceConfig(device="cpu"), **extra,
    )
    if spec.async_scheduling and hasattr(vllm_config.scheduler_config, "async_scheduling"):
        vllm_config.scheduler_config.async_scheduling = True
    return vllm_config


def make_scheduler(spec: SchedulerSpec | None = None, scheduler_cls: type | None = None) -> Any:
    """Build a real vLLM ``Scheduler`` (or ``scheduler_cls``) for ``spec``; no model loaded.

    Raises what :func:`make_vllm_config` raises for settings vLLM refuses.
    """
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.structured_output import StructuredOutputManager

    spec = spec or SchedulerSpec()
    vllm_config = make_vllm_config(spec)
    kv_cache_config = KVCacheConfig(num_blocks=spec.num_blocks, kv_cache_tensors=[],
                                    kv_cache_groups=kv_cache_groups(spec))
    try:  # what vLLM's engine core sets before it builds the scheduler (update_kv_cache_capacity, 0.32)
        from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config

        vllm_config.cache_config.kv_cache_max_concurrency = get_max_concurrency_for_kv_cache_config(
            vllm_config, kv_cache_config)
    except (ImportError, AttributeError, ValueError, TypeError, ZeroDivisionError):
        pass  # a release without the figure: engine_config leaves it out, as that release's engine does
    cls = scheduler_cls or Scheduler
    kwargs: dict[str, Any] = dict(
        vllm_config=vllm_config, kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config), log_stats=True,
    )
    kwargs.update(block_size=spec.block_size, hash_block_size=spec.block_size)
    return cls(**fit_kwargs("Scheduler", Scheduler.__init__, kwargs))


def kv_cache_groups(spec: SchedulerSpec) -> list[Any]:
    """vLLM ``KVCacheGroupSpec``s for ``spec``: one full-attention group of one layer, or
    the groups of ``spec.kv_groups``, each of its recorded kind and layer count with
    ``spec.block_size``-token blocks: ``SlidingWindowSpec`` with its window (the KV-cache
    manager frees the blocks that fall out of the window, ``SlidingWindowManager``), a
    ``FullAttentionSpec`` otherwise (``vllm/v1/kv_cache_interface.py`` 0.32). Every spec has
    one 64-wide KV head in float32 (the scheduler reads only block sizes and windows; the
    page size is the same in every group, as vLLM's hybrid allocator requires)."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, SlidingWindowSpec

    shape = dict(block_size=spec.block_size, num_kv_heads=1, head_size=64, dtype=torch.float32)
    if not spec.kv_groups:
        return [KVCacheGroupSpec(["layer"], FullAttentionSpec(**shape))]
    out = []
    for i, g in enumerate(spec.kv_groups):
        window = g.get("sliding_window")
        names = [f"group{i}.layer{j}" for j in range(max(int(g.get("layers") or 1), 1))]
        if g.get("kind") == "SlidingWindowSpec" and window:
            out.append(KVCacheGroupSpec(names, SlidingWindowSpec(**shape, sliding_window=int(window))))
        else:
            out.append(KVCacheGroupSpec(names, FullAttentionSpec(**shape)))
    return out


_ids = itertools.count()
_hash_fn_cache: list[Any] = []


def block_hash_fn() -> Any:
    """vLLM's sha256 block-hash function, with ``NONE_HASH`` initialised once per process.

    vLLM's engine calls ``init_none_hash`` once. Up to 0.28 it draws a random
    ``NONE_HASH`` on every call when ``PYTHONHASHSEED`` is unset, so calling it per
    request would give equal prefixes different hashes (no prefix-cache hits).
    """
    if not _hash_fn_cache:
        from vllm.v1.core.kv_cache_utils import init_none_hash

        try:
            from vllm.utils.hashing import sha256 as hash_fn
        except ImportError:  # older releases
            from vllm.utils import sha256 as hash_fn
        init_none_hash(hash_fn)
        _hash_fn_cache.append(hash_fn)
    return _hash_fn_cache[0]


def make_request(
    prompt_len: int, max_tokens: int, *, req_id: str | None = None, block_size: int = 16,
    prefix: list[int] | None = None, seed: int | None = None,
) -> Any:
    """A ``Request`` of ``prompt_len`` tokens that generates exactly ``max_tokens``.

    Token ids are distinct per request (so prefix caching does not merge prompts)
    unless ``prefix`` gives shared leading ids.
    """
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.request import Request

    hash_fn = block_hash_fn()
    n = next(_ids)
    rid = req_id or f"req-{n}"
    base = (seed if seed is not None else n) * 7919
    head = list(prefix or [])
    tokens = head + [3 + (base + i) % 500 for i in range(prompt_len - len(head))]
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
    kwargs: dict[str, Any] = dict(
        request_id=rid, prompt_token_ids=tokens, sampling_params=params, pooling_params=None,
        block_hasher=get_request_block_hasher(block_size, hash_fn), eos_token_id=2,
        mm_features=None,
    )
    return Request(**fit_kwargs("Request", Request.__init__, kwargs))


def step(sched: Any) -> Any:
    """One scheduler step: ``schedule()``, then a fake model output; returns the output.

    Every scheduled request whose computed tokens reached its token count samples one
    token (id 7), as a model would after the last prefill chunk or a decode.
    """
    out = sched.schedule()
    sched.update_from_output(out, fake_model_output(sched, out))
    return out


def fake_model_output(sched: Any, out: Any) -> Any:
    """The ``ModelRunnerOutput`` a model would return for ``out`` (see :func:`step`)."""
    req_ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid in req_ids:
        req = sched.requests.get(rid)
        done = req is not None and req.num_computed_tokens >= req.num_tokens
        sampled.append([7] if done else [])
    return model_runner_output(req_ids, sampled)


_output_kwargs: list[tuple[dict[str, Any], bool]] = []


def model_runner_output(req_ids: list[str], sampled: list[list[int]]) -> Any:
    """vLLM's ``ModelRunnerOutput`` with ``sampled[i]`` the tokens of ``req_ids[i]``
    (the release-dependent arguments are looked up once per process)."""
    from vllm.v1.outputs import ModelRunnerOutput

    if not _output_kwargs:
        extra: dict[str, Any] = {}
        if accepts(ModelRunnerOutput, "pooler_output"):
            extra["pooler_output"] = []
        if accepts(ModelRunnerOutput, "spec_token_ids"):
            extra["spec_token_ids"] = None
        _output_kwargs.append((extra, accepts(ModelRunnerOutput, "req_id_to_index")))
    extra, by_index = _output_kwargs[0]
    if by_index:  # up to 0.33; from 0.34 update_from_output indexes by req_ids
        extra = {**extra, "req_id_to_index": {r: i for i, r in enumerate(req_ids)}}
    return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={},
                             **extra)


def run_until_idle(sched: Any, max_steps: int = 10_000) -> int:
    """Step until no request is left; return the number of steps.

    Raises:
        RuntimeError: still busy after ``max_steps`` (a stuck workload).
    """
    for n in range(max_steps):
        if not sched.has_requests():
            return n
        step(sched)
    raise RuntimeError(f"scheduler still has requests after {max_steps} steps")


class MemorySink:
    """A sink that keeps events as ``(kind_name, fields_dict)`` in memory (tests, compat).

    Same ``emit`` signature as :class:`vllm_probe.engine.sink.EventSink` (``values``: what
    ``kind.pack(...)`` returned, or a tuple in ``kind.fields`` order); the dicts hold every
    field of the kind, optional ones as None when absent.
    """

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def emit(self, kind: Any, ts: float, engine: int, values: Any) -> None:
        """Keep one event as ``(kind.name, {field: value})``; a
        :class:`~vllm_probe.engine.sink.Deferred` value is computed here, as the file
        sink's writer would."""
        if type(values) is not tuple:
            values = msgspec.structs.astuple(values)
        self.events.append((kind.name, {k: v() if type(v) is Deferred else v
                                        for k, v in zip(kind.field_names, values)}))

    def of(self, name: str) -> list[dict[str, Any]]:
        """The fields of every event of kind ``name``, in emission order."""
        return [e for k, e in self.events if k == name]
