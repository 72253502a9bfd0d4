"""The one-screen summary of a run (``vllm-probe summary``), drawn from a
:class:`~vllm_probe.analysis.summary.Summary` (definitions there). No computation here:
every figure comes from the analysis; this module lays them out.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Group, JustifyMethod
from rich.table import Table
from rich.text import Text

from ..analysis.expected import DIFFERS, MATCHES, NOT_V1, UNKNOWN as NOT_AN_ARG
from ..analysis.figures import Distribution
from ..analysis.summary_types import LatencyClass, LatencyClasses, Summary
from .format import UNKNOWN, count, figure, kv_capacity_compact, pct, prompt_class, share_of, triple


def _kv(title: str, rows: list[tuple[str, str]]) -> Table:
    t = Table(title=title, title_justify="left", title_style="bold underline", box=None,
              show_header=False, pad_edge=False)
    t.add_column(style="dim", no_wrap=True)
    t.add_column(justify="right", no_wrap=True)
    for k, v in rows:
        t.add_row(k, v)
    return t


def _dist_row(t: Table, label: str, d: Distribution, unit: str) -> None:
    t.add_row(label, figure(d.median, unit), figure(d.p90, unit), figure(d.max, unit), str(d.n))


#: How each status of a settings check reads, and its style.
_CHECK_TEXT = {DIFFERS: ("differs", "bold yellow"), MATCHES: ("as expected", "green"),
               NOT_V1: ("not in vLLM V1", "dim"), NOT_AN_ARG: ("unknown", "bold red")}


def expected_table(s: Summary) -> Table | None:
    """The user's settings file against this run, one row per setting; None
    when the run was started without one."""
    if not s.expected or not s.expected.get("checks"):
        return None
    checks = s.expected["checks"]
    differs = sum(1 for c in checks if c["status"] == DIFFERS)
    unknown = sum(1 for c in checks if c["status"] == NOT_AN_ARG)  # misspelt: vLLM never saw them
    said = ([f"{differs} differ"] if differs else []) + (
        [f"{unknown} not an engine argument of vLLM"] if unknown else [])
    title = f"Settings file {s.expected.get('source')} vs this run" + (
        f": {', '.join(said)}" if said else ": no difference")
    t = Table(title=title, title_justify="left", title_style="bold underline" + (" yellow" if said else ""),
              box=None, pad_edge=False, padding=(0, 2))
    columns: tuple[tuple[str, JustifyMethod], ...] = (("setting", "left"), ("file", "right"), ("this run", "right"),
                                                    ("", "left"))
    for col, justify in columns:
        t.add_column(col, justify=justify, style="dim" if col == "setting" else None, no_wrap=col != "")
    for c in checks:
        status, style = _CHECK_TEXT.get(c["status"], ("not recorded", "dim"))
        note = c.get("note") or ""
        if c["status"] == DIFFERS and c.get("section") == "engine":
            note = "the command line or the script wins over a config file"
        effective = c["effective"]
        shown = ", ".join(figure(v) for v in effective) if isinstance(effective, list) else figure(effective)
        name = c["setting"] if c.get("section") != "sampling" else f"sampling.{c['setting']}"
        t.add_row(name, figure(c["expected"]), shown,
                  Text.assemble((status, style), (f"  {note}" if note else "", "dim")))
    return t


def _class_table(title: str, classes: list[LatencyClass], label) -> Table:
    t = Table(title=title, title_justify="left", title_style="bold underline", box=box.SIMPLE, pad_edge=False)
    t.add_column("", style="dim", no_wrap=True)
    for col in ("n", "queue med", "TTFT med", "TTFT p90", "TTFT steps med", "end-to-end med", "end-to-end p90"):
        t.add_column(col, justify="right", no_wrap=True)
    for c in classes:
        if not c.n:
            continue
        t.add_row(label(c), str(c.n), figure(c.queue_s.median, "s"), figure(c.ttft_s.median, "s"),
                  figure(c.ttft_s.p90, "s"), figure(c.ttft_steps.median, "steps"), figure(c.e2e_s.median, "s"),
                  figure(c.e2e_s.p90, "s"))
    return t


def latency_class_parts(s: Summary) -> list[Any]:
    """Latency by prompt-length class (and by priority where it varies)."""
    lc: LatencyClasses = s.latency_classes
    parts: list[Any] = []
    used = [c for c in lc.classes if c.n]
    bounds = " and ".join(count(b) for b in lc.boundaries)
    why = {"token budget": "budget/4 and the token budget",
           "given": "--by", "default": "defaults; the token budget is unknown"}.get(lc.basis, lc.basis)
    if len(used) > 1:
        parts.append(_class_table(f"Latency by prompt length (split at {bounds} tokens: {why})", lc.classes,
                                  prompt_class))
    elif used:
        parts.append(Text(f"Latency by prompt length: all {used[0].n} finished requests are {prompt_class(used[0])} "
                          f"tokens (split at {bounds}: {why}); --by prompt_len:A,B splits elsewhere",
                          style="dim"))
    if s.latency_by_priority:
        policy = s.config.get("scheduling_policy")
        title = "Latency by priority" + ("" if policy == "priority" else
                                         f" (the policy is {policy or 'unknown'}: priorities do not change the order)")
        parts.append(_class_table(title, s.latency_by_priority, lambda c: c.name))
    return parts


def _speed_mark(s: Summary) -> str:
    """The machine-speed marks (µs of the probe's fixed computation, lower is faster) at the
    start and the end of the run: ``1.65 → 1.20 ms`` (the unit once when both share it),
    then the engine's median decode step at its most measured batch."""
    m = s.speed_mark
    decode = ""
    if m.decode_steps:  # the engine's own gauge: its most measured decode batch
        d = max(m.decode_steps, key=lambda d: d.steps)
        decode = f"decode step {figure(d.median_us, 'µs')} at batch {d.batch}"
    if m.start_us is None and m.end_us is None:
        return f"not recorded · {decode}" if decode else "not recorded"
    start, end = figure(m.start_us, "µs"), figure(m.end_us, "µs")
    if start.split(" ")[-1] == end.split(" ")[-1] != UNKNOWN:
        start = start.rsplit(" ", 1)[0]
    return f"{start} → {end}" + (f" · {decode}" if decode else "")


def render(s: Summary, width: int = 120, engines: list | None = None) -> Group:
    """The one-screen view of a summary (side-by-side panels from ``width`` 110 on);
    with the run's ``engines`` (:class:`~vllm_probe.analysis.state.EngineState`), the
    whole-run overview and the notable moments at the end."""
    lines = _heading(s)
    run, cfg = _run_and_config(s)
    steps, pre = _steps_and_preemptions(s)
    queues, hits = _queues_and_prefix_cache(s)
    if width >= 110:
        grid = Table.grid(padding=(0, 4))
        grid.add_column()
        grid.add_column()
        grid.add_row(run, cfg)
        grid.add_row(steps, pre)
        grid.add_row(queues, hits)
        parts: list[Any] = [*lines, grid]
    else:
        parts = [*lines, run, cfg, steps, pre, queues, hits]
    expected = expected_table(s)
    if expected is not None:
        parts.insert(len(lines), expected)
    parts += [_latency_table(s), *latency_class_parts(s), *_notes(s)]
    if engines:
        parts += _story(s, width, engines)
    return Group(*parts)


def _heading(s: Summary) -> list[Text]:
    """The run directory, what was read, the command, and what a reader must know first."""
    c = s.config
    head = Text.assemble(("vllm-probe summary ", "bold"), (s.run_dir, "cyan"))
    sub = [s.read.get("text", ""), f"{s.engines} engine core{'s' if s.engines != 1 else ''}"]
    if c.get("vllm_version"):
        sub.append(f"vLLM {c['vllm_version']}")
    if s.exit_code is not None:  # as tail says it (130: stopped with Ctrl-C)
        sub.append(f"exit {s.exit_code}" + (" (stopped with Ctrl-C)" if s.exit_code == 130 else ""))
    lines = [head, Text(" · ".join(x for x in sub if x), style="dim")]
    if s.command:
        lines.append(Text("command: " + " ".join(s.command), style="dim"))
    if s.config_differs_across_engines:
        lines.append(Text("engine cores run with different settings (config shows the first)", style="yellow"))
    if s.retention:
        before = (f"; {count(s.requests_before_window)} requests added before it are left out of the request "
                  "figures" if s.requests_before_window else "")
        lines.append(Text(s.retention + before, style="yellow"))
    return lines


def _run_and_config(s: Summary) -> tuple[Table, Table]:
    """The run's totals and its effective configuration."""
    c = s.config
    run = _kv("Run", [
        ("steps", figure(s.steps)),
        ("duration · busy", f"{figure(s.duration_s, 's')} · {figure(s.busy_s, 's')}"),
        ("requests finished", count(s.requests_finished)
         + (f" (+{count(s.requests_unfinished)} unfinished)" if s.requests_unfinished else "")),
        ("prompt · output tokens", f"{count(s.prompt_tokens)} · {count(s.output_tokens)}"),
        ("output tokens/s · per busy s", f"{figure(s.output_tokens_per_s)} · {figure(s.output_tokens_per_busy_s)}"),
        ("bound most by", f"{s.bound_most} ({figure(s.bound_by.get(s.bound_most), '%')})" if s.bound_most else UNKNOWN),
    ])
    kv_cap = c.get("kv_capacity_tokens")
    cfg = _kv("Effective config", [
        ("token budget", figure(c.get("max_num_batched_tokens"))),
        ("max_num_seqs", figure(c.get("max_num_seqs"))),
        ("chunked prefill", figure(c.get("enable_chunked_prefill"))
         + (f", long-prefill cap {count(c['long_prefill_token_threshold'])}"
            if c.get("long_prefill_token_threshold") else "")),
        ("KV cache", kv_capacity_compact(kv_cap, c.get("num_kv_blocks"), c.get("block_size"))
         if c.get("num_kv_blocks") is not None else UNKNOWN),
        ("max_model_len", figure(c.get("max_model_len"))),
        ("policy", figure(c.get("scheduling_policy"))),
        ("async · prefix caching", f"{figure(c.get('async_scheduling'))} · {figure(c.get('prefix_caching'))}"),
    ])
    return run, cfg


def _steps_and_preemptions(s: Summary) -> tuple[Table, Table]:
    """Tokens per step, budget use, schedule() time; preemptions, recompute and chunking."""
    steps = _kv("Steps", [
        ("tokens/step med·p90·max", triple(s.tokens_per_step)),
        ("budget use med·p90", f"{figure(s.budget_use.median, '%')} · {figure(s.budget_use.p90, '%')}"),
        ("prefill · decode tokens", f"{count(s.prefill_tokens)} · {count(s.decode_tokens)}"),
        ("prefill share", figure(s.prefill_share, "%")),
        ("schedule() mean·max", f"{figure(s.schedule_us.mean, 'µs')} · {figure(s.schedule_us.max, 'µs')}"),
        ("machine mark", _speed_mark(s)),
    ])
    p, ch = s.preemptions, s.chunking
    pre = _kv("Preemptions · chunking", [
        ("preemptions (requests)", f"{count(p.count)} ({count(p.requests)})"),
        # discarded = work wasted; recomputed = the whole re-prefill (summary.py's definitions)
        ("discarded (wasted) · recomputed tok", f"{count(p.discarded_tokens)} · {count(p.recomputed_tokens)}"),
        # recomputed / all computed tokens (vLLM RFC #54644)
        ("recompute tax",
         figure(p.recompute_tax, "%") + " of computed tokens" if p.recompute_tax is not None else UNKNOWN),
        ("worst request", f"{p.worst_request} ×{p.worst_preemptions}" if p.worst_request else UNKNOWN),
        ("per step max · steps with >1", f"{count(p.max_per_step)} · {count(p.steps_with_several)}"
         + (f" of {count(p.steps_with_preemptions)}" if p.steps_with_preemptions else "")),
        ("prompts chunked", f"{count(ch.chunked_prompts)} of {count(ch.prompts)}"),
        ("chunks/prompt mean·max", f"{figure(ch.chunks_per_prompt.mean)} · {figure(ch.chunks_per_prompt.max)}"),
        ("KV re-read", f"{count(ch.reread_kv_tokens)} tokens"
         + (f" ({ch.reread_per_prefill_token:.2f}×)" if ch.reread_per_prefill_token is not None else "")),
    ])
    return steps, pre


def _queues_and_prefix_cache(s: Summary) -> tuple[Table, Table]:
    """Queue lengths after each step; the prefix cache's hits."""
    c = s.config
    q, pc = s.queues, s.prefix_cache
    max_seqs = c.get("max_num_seqs")
    queues = _kv("Queues after each step", [
        ("running med·p90·max", triple(q.running)),
        ("running max / max_num_seqs", f"{count(q.running.max)} / {count(max_seqs)} ({pct(q.running.max / max_seqs)})"
         if q.running.max is not None and max_seqs else UNKNOWN),
        ("waiting med·p90·max", triple(q.waiting)),
    ])
    if pc.enabled is False:
        hits = _kv("Prefix cache", [("prefix caching", "off: every prompt token computed")])
    else:
        hits = _kv("Prefix cache", [
            ("hits on first passes", share_of(pc.hit_tokens, pc.prompt_tokens, "prompt tok")),
            ("requests with a hit", f"{count(pc.requests_with_hits)} of {count(pc.first_passes)}"),
            (f"hits on {count(pc.resumed_passes)} re-admissions",
             share_of(pc.resumed_hit_tokens, pc.resumed_prefill_tokens, "tok to recompute"))
            if pc.resumed_passes else ("hits on re-admission", "none preempted"),
        ])
    return queues, hits


def _latency_table(s: Summary) -> Table:
    """Latency per finished request: median, p90, max, count."""
    lat = Table(title="Latency per finished request", title_justify="left", title_style="bold underline",
                box=box.SIMPLE, pad_edge=False)
    lat.add_column("", style="dim")
    for col in ("median", "p90", "max", "n"):
        lat.add_column(col, justify="right")
    L = s.latency
    _dist_row(lat, "queue time", L.queue_s, "s")
    _dist_row(lat, "time to first token", L.ttft_s, "s")
    _dist_row(lat, "time to first token (steps)", L.ttft_steps, "steps")
    _dist_row(lat, "decode time", L.decode_s, "s")
    _dist_row(lat, "mean inter-token time", L.itl_s, "s")
    _dist_row(lat, "end-to-end (arrival to finish)", L.e2e_s, "s")
    return lat


def _notes(s: Summary) -> list[Text]:
    """Dim lines under the tables: limits, head-of-queue reasons, the probe's own losses."""
    parts: list[Text] = []
    if s.bound_by:
        parts.append(Text("bound by (share of steps): " + " · ".join(
            f"{k} {figure(v, '%')}" for k, v in s.bound_by.items())
            + ".  KV re-read: prefill KV tokens read again by later chunks of the same pass;"
            " a single-shot prefill re-reads 0.",
            style="dim"))
    if s.head_blocked_by:
        parts.append(Text(f"head of the waiting queue blocked by (share of the {count(s.head_blocked_steps)} steps "
                          "with requests waiting): " + " · ".join(
                              f"{k} {figure(v, '%')}" for k, v in s.head_blocked_by.items()), style="dim"))
    if s.probe_dropped_events or s.probe_hook_errors or s.probe_hooks_disabled:
        off = f", hooks switched off: {', '.join(s.probe_hooks_disabled)}" if s.probe_hooks_disabled else ""
        parts.append(Text(f"probe: {s.probe_dropped_events} events dropped, {s.probe_hook_errors} hook errors{off} "
                          "(figures may be incomplete)", style="yellow"))
    return parts


def _story(s: Summary, width: int, engines: list) -> list[Any]:
    """The whole-run overview chart and the notable moments (:mod:`vllm_probe.tui.story`)."""
    from ..analysis.moments import Moment
    from .story import moments_panel, overview_panel

    rows = 14 + 8 * (len(engines) - 1)
    overview, _ = overview_panel(engines, width, rows)
    moments = [Moment(**m) for m in s.moments]
    panel, _ = moments_panel(moments, width, len(moments) + 3, s.run_dir)
    return [overview, panel]
