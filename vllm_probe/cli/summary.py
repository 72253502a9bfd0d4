"""``vllm-probe summary RUN_DIR [--json]``: one screen on a finished (or running) run.

The numbers come from :func:`vllm_probe.analysis.summary.summarize` (definitions there); this
module only renders them. ``--json`` prints :meth:`Summary.to_dict` instead.

Exit codes: 0 shown; 1 the run holds no readable event; 2 RUN_DIR missing.
Skipped lines (partial last line, not JSON, unknown kind) are reported, not fatal.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..runs.rundir import resolve_run_dir
from ..analysis.summary import Distribution, NoEventsError, Summary, summarize
from . import CliError, report_console
from .export import _silence_stdout

EXIT_NO_EVENTS = 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR",
                   help="run directory (default: the latest under ./vllm-probe-runs/)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")


def main(args: argparse.Namespace) -> int:
    run_dir = resolve_run_dir(args.run_dir)
    try:
        s = summarize(run_dir)
    except NoEventsError as e:
        raise CliError(str(e), EXIT_NO_EVENTS) from None
    try:
        if args.json:
            json.dump(s.to_dict(), sys.stdout, indent=2)
            sys.stdout.write("\n")
            sys.stdout.flush()
        else:
            console = report_console()
            console.print(render(s, console.width))
    except BrokenPipeError:  # `... | head`
        _silence_stdout()
        return 0
    if s.read.get("malformed") or s.read.get("partial") or s.read.get("unknown_kind"):
        print(f"vllm-probe: note: {s.read['text']}", file=sys.stderr)
    return 0


# -- formatting (shared with compare) -------------------------------------------------------


def fmt(value: Any, unit: str = "") -> str:
    """A figure as text: thousands separators, seconds in ms/s, shares in %."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, str):
        return value
    if unit == "%":
        return f"{value * 100:.1f} %"
    if unit == "s":
        if abs(value) < 1:
            return f"{value * 1000:.1f} ms"
        return f"{value:.2f} s"
    if unit == "µs":
        return f"{value:,.0f} µs"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return f"{int(value):,}"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.2f}"
    return str(value)


def _kv(title: str, rows: list[tuple[str, str]]) -> Table:
    t = Table(title=title, title_justify="left", title_style="bold underline", box=None,
              show_header=False, pad_edge=False)
    t.add_column(style="dim", no_wrap=True)
    t.add_column(justify="right", no_wrap=True)
    for k, v in rows:
        t.add_row(k, v)
    return t


def _dist_row(t: Table, label: str, d: Distribution, unit: str) -> None:
    t.add_row(label, fmt(d.median, unit), fmt(d.p90, unit), fmt(d.max, unit), str(d.n))


def render(s: Summary, width: int = 120) -> Group:
    """The one-screen view of a summary (side-by-side panels from ``width`` 110 on)."""
    c = s.config
    head = Text.assemble(("vllm-probe summary ", "bold"), (s.run_dir, "cyan"))
    sub = [s.read.get("text", ""), f"{s.engines} engine core{'s' if s.engines != 1 else ''}"]
    if c.get("vllm_version"):
        sub.append(f"vLLM {c['vllm_version']}")
    lines = [head, Text(" · ".join(x for x in sub if x), style="dim")]
    if s.command:
        lines.append(Text("command: " + " ".join(s.command), style="dim"))
    if s.config_differs_across_engines:
        lines.append(Text("engine cores run with different settings (config shows the first)", style="yellow"))

    run = _kv("Run", [
        ("steps", fmt(s.steps)),
        ("duration", fmt(s.duration_s, "s")),
        ("requests finished", f"{s.requests_finished:,}" + (f" (+{s.requests_unfinished} unfinished)" if s.requests_unfinished else "")),
        ("prompt · output tokens", f"{s.prompt_tokens:,} · {s.output_tokens:,}"),
        ("output tokens/s", fmt(s.output_tokens_per_s)),
        ("bound most by", f"{s.bound_most} ({fmt(s.bound_by.get(s.bound_most), '%')})" if s.bound_most else "–"),
    ])
    kv_cap = c.get("kv_capacity_tokens")
    cfg = _kv("Effective config", [
        ("token budget", fmt(c.get("max_num_batched_tokens"))),
        ("max_num_seqs", fmt(c.get("max_num_seqs"))),
        ("chunked prefill", fmt(c.get("enable_chunked_prefill"))
         + (f", long-prefill cap {c['long_prefill_token_threshold']:,}" if c.get("long_prefill_token_threshold") else "")),
        # vLLM reserves block 0 (the null block): capacity is (blocks - 1) x block size
        ("KV cache", f"{fmt(kv_cap)} tok ({fmt(c.get('num_kv_blocks'))} blocks × {fmt(c.get('block_size'))}, 1 reserved)"
         if c.get("num_kv_blocks") is not None else "–"),
        ("max_model_len", fmt(c.get("max_model_len"))),
        ("policy", str(c.get("scheduling_policy", "–"))),
        ("async · prefix caching", f"{fmt(c.get('async_scheduling'))} · {fmt(c.get('prefix_caching'))}"),
    ])
    steps = _kv("Steps", [
        ("tokens/step med·p90·max", f"{fmt(s.tokens_per_step.median)} · {fmt(s.tokens_per_step.p90)} · {fmt(s.tokens_per_step.max)}"),
        ("budget use med·p90", f"{fmt(s.budget_use.median, '%')} · {fmt(s.budget_use.p90, '%')}"),
        ("prefill · decode tokens", f"{s.prefill_tokens:,} · {s.decode_tokens:,}"),
        ("prefill share", fmt(s.prefill_share, "%")),
        ("schedule() mean·max", f"{fmt(s.schedule_us.mean, 'µs')} · {fmt(s.schedule_us.max, 'µs')}"),
    ])
    p, ch = s.preemptions, s.chunking
    pre = _kv("Preemptions · chunking", [
        ("preemptions (requests)", f"{p.count:,} ({p.requests:,})"),
        # discarded = work wasted; recomputed = the whole re-prefill (summary.py's definitions)
        ("discarded (wasted) · re-prefilled tok", f"{p.discarded_tokens:,} · {p.recomputed_tokens:,}"),
        ("worst request", f"{p.worst_request} ×{p.worst_preemptions}" if p.worst_request else "–"),
        ("prompts chunked", f"{ch.chunked_prompts:,} of {ch.prompts:,}"),
        ("chunks/prompt mean·max", f"{fmt(ch.chunks_per_prompt.mean)} · {fmt(ch.chunks_per_prompt.max)}"),
        ("KV re-read (§3.4)", f"{ch.reread_kv_tokens:,} tokens"
         + (f" ({ch.reread_per_prefill_token:.2f}×)" if ch.reread_per_prefill_token is not None else "")),
    ])
    lat = Table(title="Latency per finished request", title_justify="left", title_style="bold underline",
                box=box.SIMPLE, pad_edge=False)
    lat.add_column("", style="dim")
    for col in ("median", "p90", "max", "n"):
        lat.add_column(col, justify="right")
    L = s.latency
    _dist_row(lat, "queue time", L.queue_s, "s")
    _dist_row(lat, "time to first token", L.ttft_s, "s")
    _dist_row(lat, "time to first token (steps)", L.ttft_steps, "")
    _dist_row(lat, "decode time", L.decode_s, "s")
    _dist_row(lat, "mean inter-token time", L.itl_s, "s")

    if width >= 110:
        grid = Table.grid(padding=(0, 4))
        grid.add_column()
        grid.add_column()
        grid.add_row(run, cfg)
        grid.add_row(steps, pre)
        parts: list[Any] = [*lines, grid, lat]
    else:
        parts = [*lines, run, cfg, steps, pre, lat]
    if s.bound_by:
        parts.append(Text("bound by (share of steps): " + " · ".join(
            f"{k} {fmt(v, '%')}" for k, v in s.bound_by.items())
            + ".  KV re-read: prefill KV tokens read again by later chunks of the same pass; a single-shot prefill re-reads 0.",
            style="dim"))
    if s.probe_dropped_events or s.probe_hook_errors or s.probe_hooks_disabled:
        off = f", hooks switched off: {', '.join(s.probe_hooks_disabled)}" if s.probe_hooks_disabled else ""
        parts.append(Text(f"probe: {s.probe_dropped_events} events dropped, {s.probe_hook_errors} hook errors{off} "
                          "(figures may be incomplete)", style="yellow"))
    return Group(*parts)
