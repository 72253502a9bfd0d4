"""The catalogue of a run's figures: one entry, one name per figure.

Every figure the reading commands name is here once (:data:`CATALOGUE`): its ``name`` (what
``--json``, SLOs, goals, objectives, baseline tolerances and intervals call it:
``ttft_p90``), its ``label`` (how a table reads it: ``TTFT p90``), its unit, which way is
better, where the analysis keeps it (a path into the
:class:`~vllm_probe.analysis.summary.Summary`, or a per-request field of
:class:`~vllm_probe.analysis.requests.RequestState` for a quantile over some requests), and
its place in ``compare``'s table (``section``, ``clock``). :mod:`vllm_probe.analysis.compare`
lines up the entries with a section; :mod:`vllm_probe.analysis.objectives` measures those
marked ``objective`` (the figures goals, SLOs and objectives may name).

Adding a figure: docs/architecture.md, "Where to add", (i).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .paths import FigurePath

#: Figure clocks: decisions of the scheduler (repeatable) or seconds (noisy).
STEPS, WALL = "steps", "wall"


@dataclass(frozen=True)
class Figure:
    """One figure of a run.

    Attributes:
        name: its one name (``ttft_p90``; a public interface).
        label: how a table reads it (``TTFT p90``).
        unit: ``s``, ``µs``, ``%`` (a share 0..1), ``tokens``, ``tokens/s``, ``steps``,
            ``preemptions``, ``requests``, ``blocks``, ``chunks``, ``prompts`` or ``""``.
        better: ``lower``, ``higher`` or None (neither: it moves with the settings).
        summary_path: its dotted path in :class:`~vllm_probe.analysis.summary.Summary`
            (None: not in the summary, e.g. a p99 over per-request rows).
        section: its group in ``compare``'s table (None: not in it).
        clock: :data:`STEPS` (the scheduler's decisions) or :data:`WALL` (seconds).
        request_field: the :class:`~vllm_probe.analysis.requests.RequestState` property it
            is measured from over some requests (None: run-wide only).
        q: the quantile of ``request_field`` (0.5, 0.9, 0.99); None with ``total``.
        total: over some requests, the sum of ``request_field`` (a count).
        objective: goals, SLOs and ``tune``'s objectives may name it.
        doc: one line.
        path: the typed path (:data:`vllm_probe.analysis.paths.S`) of a figure ``compare``
            shows, checked against the Summary's types when the entry is made.

    Raises:
        AttributeError, TypeError: a ``compare`` figure's path names nothing in a Summary.
    """

    name: str
    label: str
    unit: str = ""
    better: str | None = None
    summary_path: str | None = None
    section: str | None = None
    clock: str = STEPS
    request_field: str | None = None
    q: float | None = None
    total: bool = False
    objective: bool = False
    doc: str = ""
    path: FigurePath | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.path is None and self.section is not None and self.summary_path is not None:
            object.__setattr__(self, "path", FigurePath.parse(self.summary_path))
        elif self.path is not None and self.summary_path is None:
            object.__setattr__(self, "summary_path", str(self.path))

    def get(self, s: Any) -> Any:
        """The figure of a Summary (None where it is unknown, or it has no path)."""
        return self.path.get(s) if self.path is not None else None


_F = Figure
#: Every figure, ``compare``'s in its display order first.
CATALOGUE: tuple[Figure, ...] = (
    _F("requests_finished", "requests finished", "requests", None, "requests_finished", "steps"),
    _F("steps", "steps", "steps", "lower", "steps", "steps", objective=True, doc="scheduler steps"),
    _F("tokens_per_step_p50", "tokens/step median", "tokens", "higher", "tokens_per_step.median", "steps"),
    _F("tokens_per_step_p90", "tokens/step p90", "tokens", "higher", "tokens_per_step.p90", "steps"),
    # budget use: no better direction, it falls when the budget itself grows
    _F("budget_use_p50", "budget use median", "%", None, "budget_use.median", "steps"),
    _F("budget_use_p90", "budget use p90", "%", None, "budget_use.p90", "steps"),
    _F("prefill_share", "prefill share", "%", None, "prefill_share", "steps"),
    _F("preemptions", "preemptions", "preemptions", "lower", "preemptions.count", "preemptions", objective=True,
       doc="preempt events of the run"),
    _F("requests_preempted", "requests preempted", "requests", "lower", "preemptions.requests", "preemptions"),
    _F("most_preemptions_in_a_step", "most in one step", "preemptions", "lower", "preemptions.max_per_step",
       "preemptions"),
    _F("steps_with_several_preemptions", "steps with >1", "steps", "lower", "preemptions.steps_with_several",
       "preemptions"),
    _F("discarded_tokens", "discarded tokens", "tokens", "lower", "preemptions.discarded_tokens", "preemptions"),
    _F("recomputed_tokens", "recomputed tokens", "tokens", "lower", "preemptions.recomputed_tokens", "preemptions"),
    _F("recompute_tax", "recompute tax", "%", "lower", "preemptions.recompute_tax", "preemptions"),
    _F("chunked_prompts", "prompts chunked", "prompts", None, "chunking.chunked_prompts", "chunking"),
    _F("chunks_per_prompt_mean", "chunks/prompt mean", "chunks", "lower", "chunking.chunks_per_prompt.mean",
       "chunking"),
    _F("chunks_per_prompt_max", "chunks/prompt max", "chunks", "lower", "chunking.chunks_per_prompt.max", "chunking"),
    _F("reread_kv_tokens", "KV tokens re-read", "tokens", "lower", "chunking.reread_kv_tokens", "chunking",
       request_field="reread_tokens", total=True, objective=True, doc="KV tokens re-read because prompts were chunked"),
    _F("prefix_hit_tokens", "hit tokens (first pass)", "tokens", "higher", "prefix_cache.hit_tokens", "prefix cache"),
    _F("prefix_hit_share", "hit share of prompt tokens", "%", "higher", "prefix_cache.hit_share", "prefix cache"),
    _F("resumed_prefix_hit_tokens", "hit tokens on re-admission", "tokens", "higher",
       "prefix_cache.resumed_hit_tokens", "prefix cache"),
    _F("running_p50", "running median", "requests", None, "queues.running.median", "queues"),
    _F("running_max", "running max", "requests", None, "queues.running.max", "queues"),
    _F("waiting_p50", "waiting median", "requests", "lower", "queues.waiting.median", "queues"),
    _F("waiting_max", "waiting max", "requests", "lower", "queues.waiting.max", "queues"),
    _F("ttft_steps_p50", "TTFT median (steps)", "steps", "lower", "latency.ttft_steps.median", "latency in steps"),
    _F("ttft_steps_p90", "TTFT p90 (steps)", "steps", "lower", "latency.ttft_steps.p90", "latency in steps"),
    _F("queue_p50", "queue time median", "s", "lower", "latency.queue_s.median", "latency in seconds", WALL,
       "queue_time_s", 0.5, objective=True, doc="arrival to first scheduled chunk, median"),
    _F("queue_p90", "queue time p90", "s", "lower", "latency.queue_s.p90", "latency in seconds", WALL, "queue_time_s",
       0.9, objective=True, doc="arrival to first scheduled chunk, p90"),
    _F("ttft_p50", "TTFT median", "s", "lower", "latency.ttft_s.median", "latency in seconds", WALL, "ttft_s", 0.5,
       objective=True, doc="time to first token, median"),
    _F("ttft_p90", "TTFT p90", "s", "lower", "latency.ttft_s.p90", "latency in seconds", WALL, "ttft_s", 0.9,
       objective=True, doc="time to first token, p90"),
    _F("ttft_max", "TTFT max", "s", "lower", "latency.ttft_s.max", "latency in seconds", WALL, objective=True,
       doc="time to first token, the longest"),
    _F("e2e_p50", "end-to-end median", "s", "lower", "latency.e2e_s.median", "latency in seconds", WALL, "e2e_s", 0.5,
       objective=True, doc="arrival to finish, median"),
    _F("e2e_p90", "end-to-end p90", "s", "lower", "latency.e2e_s.p90", "latency in seconds", WALL, "e2e_s", 0.9,
       objective=True, doc="arrival to finish, p90"),
    _F("decode_p50", "decode time median", "s", "lower", "latency.decode_s.median", "latency in seconds", WALL),
    _F("itl_p50", "inter-token median", "s", "lower", "latency.itl_s.median", "latency in seconds", WALL,
       "mean_itl_s", 0.5, objective=True, doc="per-request mean inter-token time, median"),
    _F("duration_s", "duration", "s", "lower", "duration_s", "run time", WALL, objective=True,
       doc="first step's start to last step"),
    _F("output_tokens_per_s", "output tokens/s", "tokens/s", "higher", "output_tokens_per_s", "run time", WALL,
       objective=True, doc="output tokens of finished requests / duration"),
    _F("schedule_us_mean", "schedule() mean", "µs", "lower", "schedule_us.mean", "run time", WALL),
    _F("bound_most", "bound by", "", None, "bound_most", "bound"),
    # not in compare's table: totals (the report's header) and figures for goals and SLOs
    _F("requests_added", "requests added", "requests", None, "requests_added"),
    _F("prompt_tokens", "prompt tokens (finished requests)", "tokens", None, "prompt_tokens"),
    _F("output_tokens", "output tokens (finished requests)", "tokens", None, "output_tokens"),
    _F("scheduled_tokens", "tokens scheduled", "tokens", None, "scheduled_tokens"),
    _F("prefill_tokens", "of them prefill", "tokens", None, "prefill_tokens"),
    _F("decode_tokens", "of them decode", "tokens", None, "decode_tokens"),
    _F("chunks", "prefill chunks", "chunks", None, "chunking.chunks"),
    _F("worst_request_preemptions", "worst request's preemptions", "preemptions", "lower",
       "preemptions.worst_preemptions", objective=True, doc="preemptions of the most preempted request"),
    _F("ttft_p99", "TTFT p99", "s", "lower", None, clock=WALL, request_field="ttft_s", q=0.99, objective=True,
       doc="time to first token, p99 (per-request rows)"),
    _F("itl_p90", "inter-token p90", "s", "lower", "latency.itl_s.p90", clock=WALL, request_field="mean_itl_s",
       q=0.9, objective=True, doc="per-request mean inter-token time, p90"),
    _F("held_slot_steps", "held-slot steps", "steps", "lower", None, objective=True,
       doc="steps whose waiting head was held back as `deferred` (head_blocked_by): under AsyncScheduler, slots "
           "held by requests that produced their last token"),
    _F("num_kv_blocks", "KV-cache blocks", "blocks", "lower", "config.num_kv_blocks", objective=True,
       doc="KV-cache blocks of the engine"),
)
del _F

#: The figures by name.
BY_NAME: dict[str, Figure] = {f.name: f for f in CATALOGUE}
#: The figures by label.
BY_LABEL: dict[str, Figure] = {f.label: f for f in CATALOGUE}
assert len(BY_NAME) == len(BY_LABEL) == len(CATALOGUE), "a figure's name and label are each its own"



def label_of(name: str) -> str:
    """A figure's label by its name (the name itself when the catalogue has none)."""
    f = BY_NAME.get(name)
    return f.label if f is not None else name


__all__ = ["BY_LABEL", "BY_NAME", "CATALOGUE", "STEPS", "WALL", "Figure", "label_of"]
