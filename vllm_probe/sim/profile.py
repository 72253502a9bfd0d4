"""Step-time profiles: the shape of an engine's step time, measured once by ``vllm-probe
calibrate`` over a designed space of steps, reused by ``whatif`` / ``doctor --whatif`` /
``tune`` for every recording of the same engine.

A profile (:class:`Profile`, written as JSON by msgspec) holds

* the model: terms (features of :mod:`vllm_probe.sim.stepmodel`, hinges ``name>knot``
  where the hardware changes regime), a non-negative intercept and coefficients (s);
* its fit per region (:class:`RegionFit`: median and p90 relative error of the steps
  whose prefill tokens / decode batch / attention context fall in a range);
* the region fitted (largest prefill tokens, decode batch, context);
* what it was measured on (:class:`Identity`: model, hardware, vLLM release, dtype,
  tensor / pipeline parallelism, block size, ``max_model_len``).

A recording gives the level (:func:`vllm_probe.sim.stepmodel.fit_level`): the profile's
shape times the recording machine's speed on that run.

**Matching** (:func:`check`): a profile given by path and measured on another model, vLLM
release or hardware (or dtype, parallelism) than the recording is refused with one line
(:class:`ProfileError`), unless forced (the report then says so). Block size and
``max_model_len`` do not refuse a profile given by path: they bound the region, not the
cost per token; the report says how much of the run lies outside that region
(:func:`coverage_note`).

**The cache** (:func:`cache_dir`): ``~/.cache/vllm-probe/profiles/`` or
``$VLLMPROBE_PROFILE_DIR``; ``calibrate`` stores each profile there too. ``whatif``,
``doctor`` and ``tune`` use a cached profile on their own (:func:`choose_cached`, saying
which) only when it was measured on the same model, vLLM release, dtype, parallelism,
block size and machine (:meth:`Identity.cache_key`) **and** covers the run's own steps (at
most :data:`COVERAGE_OUTSIDE_MAX` of them beyond its region, :func:`outside_share`): a
profile measured on another run can price the recorded steps from outside what it
measured, and then the recording's own fit is the better model. Otherwise the report says
why none was used — what differs, or how much of the run lies outside — and proposes
``vllm-probe calibrate --like RUN``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from .. import envvars

#: Version of the profile format; bumped when a field's meaning changes.
PROFILE_SCHEMA = 1


class ProfileError(Exception):
    """A profile cannot be read or does not match the recording; the message is one line."""


class Identity(msgspec.Struct, kw_only=True):
    """What a profile was measured on, or what a recording ran on.

    Attributes:
        model: the model path or name as given to vLLM (``--model``).
        hardware: ``"GPU: <name> ×N"`` or ``"CPU: <model name>"`` (:func:`hardware`).
        vllm: ``vllm.__version__``.
        dtype: the dtype given to vLLM (``auto`` when not given).
        tensor_parallel_size, pipeline_parallel_size: ranks.
        block_size: tokens per KV block (not identity: bounds only).
        max_model_len: tokens (not identity: bounds only).
    """

    model: str
    hardware: str
    vllm: str
    dtype: str = "auto"
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    block_size: int | None = None
    max_model_len: int | None = None

    def key(self) -> tuple[Any, ...]:
        """The fields a profile must share with a recording to be used."""
        return (self.model, self.hardware, self.vllm, self.dtype, self.tensor_parallel_size,
                self.pipeline_parallel_size)

    def cache_key(self) -> tuple[Any, ...]:
        """The fields a cached profile must share with a recording to be used on its own:
        :meth:`key` and the block size (tokens per KV block: another block size is another
        engine's KV layout and decode cost)."""
        return (*self.key(), self.block_size)


class RegionFit(msgspec.Struct, kw_only=True):
    """The fit's error over one region of calibration steps.

    Attributes:
        quantity: ``prefill_tokens`` (prefill-only steps), ``decode_reqs`` (decode-only
            steps) or ``attn_decode`` (decode-only steps, by context tokens read).
        lo, hi: the region's range of that quantity (inclusive).
        steps: calibration steps in it.
        median_rel_err, p90_rel_err: |predicted − measured| / measured (0.05 = 5 %).
    """

    quantity: str
    lo: float
    hi: float
    steps: int
    median_rel_err: float
    p90_rel_err: float


class Profile(msgspec.Struct, kw_only=True):
    """A calibrated step-time shape (see the module docstring).

    Attributes:
        schema: :data:`PROFILE_SCHEMA`.
        terms, intercept_s, coef_s: the model (s; ``coef_s[i]`` per unit of ``terms[i]``).
        region: per quantity the largest value fitted (tokens / requests / tokens).
        fit: per region, the fit's error (:class:`RegionFit`).
        measured_on: :class:`Identity`.
        steps: calibration steps fitted.
        seconds: wall time of the calibration (s).
        created: epoch seconds.
        command: the command that wrote it.
    """

    terms: list[str]
    intercept_s: float
    coef_s: list[float]
    region: dict[str, float]
    fit: list[RegionFit]
    measured_on: Identity
    steps: int = 0
    seconds: float = 0.0
    created: float = 0.0
    command: list[str] = msgspec.field(default_factory=list)
    schema: int = PROFILE_SCHEMA

    def model(self, path: str | None = None) -> Any:
        """The profile's shape as a :class:`~vllm_probe.sim.stepmodel.StepTimeModel`
        (level 1: fit it on a recording with :func:`~vllm_probe.sim.stepmodel.fit_level`)."""
        from .stepmodel import StepTimeModel

        return StepTimeModel(tuple(self.terms), self.intercept_s, tuple(self.coef_s), region=dict(self.region),
                             profile=path)


def load(path: str | Path) -> Profile:
    """Read a profile.

    Raises:
        ProfileError: missing, not JSON, or not a profile of this format (one line).
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ProfileError(f"cannot read the profile {path}: {e.strerror or e}") from None
    try:
        prof = msgspec.json.decode(data, type=Profile)
    except msgspec.DecodeError as e:
        raise ProfileError(f"{path} is not a vllm-probe profile ({e})") from None
    if prof.schema != PROFILE_SCHEMA:
        raise ProfileError(f"{path} is a profile of format {prof.schema}; this vllm-probe reads {PROFILE_SCHEMA} "
                           "(run vllm-probe calibrate again)")
    if len(prof.terms) != len(prof.coef_s):
        raise ProfileError(f"{path}: {len(prof.terms)} terms but {len(prof.coef_s)} coefficients")
    return prof


def save(prof: Profile, path: str | Path) -> Path:
    """Write ``prof`` to ``path`` under a temporary name, renamed when complete (an
    interrupted write leaves nothing at ``path``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(msgspec.json.format(msgspec.json.encode(prof), indent=2) + b"\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


#: The names of :meth:`Identity.cache_key`'s fields, as a mismatch reads them.
_KEY_NAMES = ("model", "hardware", "vLLM release", "dtype", "tensor parallelism", "pipeline parallelism",
              "block size")


def mismatch(prof: Identity, rec: Identity, cache: bool = False) -> str | None:
    """What differs between a profile's identity and a recording's (one phrase), or None;
    ``cache``: by :meth:`Identity.cache_key` (the block size too)."""
    keys = (prof.cache_key(), rec.cache_key()) if cache else (prof.key(), rec.key())
    for name, a, b in zip(_KEY_NAMES, *keys):
        if a != b:
            return f"{name} {a!r}, the recording's is {b!r}"
    return None


def check(prof: Profile, rec: Identity, path: str | Path, force: bool = False) -> str | None:
    """None when ``prof`` fits the recording ``rec``; with ``force`` the mismatch as a
    note for the report.

    Raises:
        ProfileError: it does not match and ``force`` is off (one line).
    """
    why = mismatch(prof.measured_on, rec)
    if why is None:
        return None
    if not force:
        raise ProfileError(f"the profile {path} was measured on {why}; calibrate this engine "
                           "(vllm-probe calibrate --like RUN_DIR) or pass --force to use it anyway")
    return f"FORCED: the profile {path} was measured on {why}; its shape may not hold here"


def cache_dir() -> Path:
    """Where profiles are kept: ``$VLLMPROBE_PROFILE_DIR`` or ``~/.cache/vllm-probe/profiles``."""
    return Path(os.environ.get(envvars.PROFILE_DIR) or Path.home() / ".cache" / "vllm-probe" / "profiles")


def cache_path(ident: Identity) -> Path:
    """The cache file of a profile of ``ident``: ``<model>-<release>-<hash>.json``."""
    digest = hashlib.sha256(repr(ident.key()).encode()).hexdigest()[:10]
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(ident.model.rstrip("/")).name or "model")[:60]
    return cache_dir() / f"{name}-{ident.vllm}-{digest}.json"


def _cached() -> list[tuple[Path, Profile]]:
    """Every readable profile in :func:`cache_dir`, newest first (unreadable files skipped)."""
    folder = cache_dir()
    if not folder.is_dir():
        return []
    found = []
    for path in folder.glob("*.json"):
        try:
            found.append((load(path), path))
        except ProfileError:
            continue
    return [(path, prof) for prof, path in sorted(found, key=lambda pp: (pp[0].created, str(pp[1])), reverse=True)]


def find_cached(rec: Identity) -> tuple[Path, Profile] | None:
    """The newest profile in :func:`cache_dir` that matches ``rec`` by :meth:`Identity.cache_key`
    (unreadable files are skipped), or None. Whether it covers a run's steps is
    :func:`choose_cached`'s question."""
    for path, prof in _cached():
        if mismatch(prof.measured_on, rec, cache=True) is None:
            return path, prof
    return None


#: A cached profile is used on its own only when at most this share of the run's steps
#: (5 %) lies beyond its region: a run mostly outside what the profile measured is better
#: priced by its own fit, which at least covers the recorded steps.
COVERAGE_OUTSIDE_MAX = 0.05


def outside_share(prof: Profile, w: Any) -> float:
    """Share (0..1) of the recorded steps of ``w`` (a :class:`~vllm_probe.analysis.workload.Workload`)
    whose prefill tokens, decode batch or decode context lie beyond the profile's region by
    more than :data:`~vllm_probe.sim.stepmodel.REGION_SLACK` (0: none, or no steps)."""
    from .stepmodel import FEATURES, REGION_SLACK, recorded_features

    rows, _ = recorded_features(w)
    if not len(rows):
        return 0.0
    beyond = [rows[:, FEATURES.index(k)] > v * (1 + REGION_SLACK) for k, v in prof.region.items() if k in FEATURES]
    if not beyond:
        return 0.0
    out = beyond[0]
    for b in beyond[1:]:
        out = out | b
    return float(out.mean())


def region_text(prof: Profile) -> str:
    """The profile's region in words: ``up to 1,024 prefill tokens, 16 decodes``."""
    r = prof.region
    return (f"up to {r.get('prefill_tokens', 0):,.0f} prefill tokens, {r.get('decode_reqs', 0):,.0f} decodes, "
            f"{r.get('attn_decode', 0):,.0f} decode context tokens")


def coverage_note(prof: Profile, w: Any, path: str | Path, run_dir: str | Path) -> str | None:
    """The report's line when a profile leaves more than :data:`COVERAGE_OUTSIDE_MAX` of
    the run's own steps beyond its region (None: it covers them)."""
    share = outside_share(prof, w)
    if share <= COVERAGE_OUTSIDE_MAX:
        return None
    return (f"profile: {share * 100:.0f} % of this run's steps lie beyond the region {path} was measured on "
            f"({region_text(prof)}); vllm-probe calibrate --like {run_dir} measures one that covers them")


@dataclass
class CacheChoice:
    """What :func:`choose_cached` decided.

    Attributes:
        found: the cached profile to use (its path and the profile), or None.
        notes: what the report says about it, one line each: which profile and why, or
            why none was used (what differs, or how much of the run lies outside) with the
            ``calibrate --like RUN`` that measures one.
    """

    found: tuple[Path, Profile] | None = None
    notes: list[str] = field(default_factory=list)


def choose_cached(rec: Identity, w: Any, run_dir: str | Path) -> CacheChoice:
    """The cached profile a run of identity ``rec`` and workload ``w`` (recorded in
    ``run_dir``) uses on its own: the newest that matches by :meth:`Identity.cache_key`
    and leaves at most :data:`COVERAGE_OUTSIDE_MAX` of the run's steps beyond its region.

    With no such profile, ``notes`` says why: the newest matching profile and the share
    of the run it leaves outside, or the newest profile of the same model and what else
    differs; nothing when the cache holds no profile of this model.
    """
    cached = _cached()
    calibrate = f"vllm-probe calibrate --like {run_dir} measures one"
    matching = [(p, prof) for p, prof in cached if mismatch(prof.measured_on, rec, cache=True) is None]
    if not matching:
        same_model = [(p, prof) for p, prof in cached if prof.measured_on.model == rec.model]
        if not same_model:
            return CacheChoice()
        path, prof = same_model[0]
        why = mismatch(prof.measured_on, rec, cache=True)
        return CacheChoice(notes=[f"profile: the cached profile {path} is not used: it was measured on {why}; "
                                  f"{calibrate} for this engine"])
    shares = []
    for path, prof in matching:
        share = outside_share(prof, w)
        if share <= COVERAGE_OUTSIDE_MAX:
            return CacheChoice(found=(path, prof))
        shares.append(share)
    path, prof = matching[0]
    return CacheChoice(notes=[f"profile: the cached profile {path} is not used: {shares[0] * 100:.0f} % of this "
                              f"run's steps lie beyond the region it was measured on ({region_text(prof)}); "
                              f"{calibrate} that covers them"])


def hardware() -> str:
    """This machine's accelerator or CPU, in words: ``GPU: NVIDIA H200 ×1`` (``nvidia-smi``,
    when present and answering), else ``CPU: <model name>`` (``/proc/cpuinfo``; the
    platform's processor name elsewhere)."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=10).stdout.split("\n")
            names = [n.strip() for n in out if n.strip()]
            if names:
                return f"GPU: {names[0]} ×{len(names)}"
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return "CPU: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return "CPU: " + (platform.processor() or platform.machine() or "unknown")


#: Engine arguments read off a recorded command line: option → :class:`Identity` field.
_OPTIONS = {"--model": "model", "--dtype": "dtype", "--tensor-parallel-size": "tensor_parallel_size",
            "-tp": "tensor_parallel_size", "--pipeline-parallel-size": "pipeline_parallel_size",
            "-pp": "pipeline_parallel_size"}


def engine_arguments(command: list[str]) -> dict[str, str]:
    """``model``, ``dtype``, parallelism and ``load_format`` as a recorded command line
    gives them (``vllm serve MODEL``, ``--model X``, ``--dtype=Y``, ``-tp N``); absent
    ones are left out."""
    out: dict[str, str] = {}
    args = list(command)
    for i, a in enumerate(args):
        key, eq, val = a.partition("=")
        if key in _OPTIONS or key == "--load-format":
            value = val if eq else (args[i + 1] if i + 1 < len(args) else None)
            if value is not None:
                out[_OPTIONS.get(key, "load_format")] = value
        if a == "serve" and i + 1 < len(args) and not args[i + 1].startswith("-") and "model" not in out:
            out["model"] = args[i + 1]
    return out


def identity_of_run(config: dict[str, Any], meta: dict[str, Any], model: str | None = None,
                    dtype: str | None = None) -> tuple[Identity, dict[str, str], bool]:
    """The :class:`Identity` of a recorded run (``config``: its ``engine_config``;
    ``meta``: its ``meta.json``), the engine arguments found, and whether the model was
    assumed: a command that names no model (``examples/*.py``) ran the tiny local model
    with dummy weights in float32 (:mod:`vllm_probe.sim.tiny_model`), so that is assumed.
    The hardware is this machine's (a recording does not say where it ran).
    """
    from .tiny_model import DEFAULT_DIR

    command = meta.get("command") or []
    if isinstance(command, str):
        command = shlex.split(command)
    found = engine_arguments([str(c) for c in command])
    assumed = False
    if model:
        found["model"] = model
    elif "model" not in found:
        found.update(model=str(DEFAULT_DIR), dtype=found.get("dtype", "float32"), load_format="dummy")
        assumed = True
    if dtype:
        found["dtype"] = dtype
    ident = Identity(model=found["model"], hardware=hardware(), vllm=str(config.get("vllm_version") or "?"),
                     dtype=found.get("dtype", "auto"),
                     tensor_parallel_size=int(found.get("tensor_parallel_size", 1)),
                     pipeline_parallel_size=int(found.get("pipeline_parallel_size", 1)),
                     block_size=config.get("block_size"), max_model_len=config.get("max_model_len"))
    return ident, found, assumed


__all__ = ["COVERAGE_OUTSIDE_MAX", "PROFILE_SCHEMA", "CacheChoice", "Identity", "Profile", "ProfileError",
           "RegionFit", "cache_dir", "cache_path", "check", "choose_cached", "coverage_note", "engine_arguments",
           "find_cached", "hardware", "identity_of_run", "load", "mismatch", "outside_share", "region_text", "save"]
