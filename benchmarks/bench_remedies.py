"""Do doctor's plan and its replay-chosen remedies work when run for real?

``--plan`` (the default): for each scenario, plus a server under a closed-loop client
(``--server``), record it, run ``vllm-probe doctor --json``, apply its one plan for real (the
same workload at the plan's settings), and run ``doctor`` on that run: the findings the plan
claimed to clear that really cleared, its counts (preemptions, the worst request's, held
slots, re-read tokens) predicted against real, its seconds predicted (with interval) against
real, the warnings left on the fixed run and whether any asks to undo the plan.
``--remedies``: the earlier check of each finding's own top remedy, as below.

For each scenario of ``configs/scenarios/`` (or those named): record it on the real
engine (``vllm-probe run -- python examples/long_prompts.py --scenario FILE``), run
``vllm-probe doctor --json`` (the remedy search, :mod:`vllm_probe.advice.remedies`), run
each finding's top remedy for real (the same scenario with the remedy's settings), and
print, per finding, the goal figure recorded / predicted by the replay / measured on the
real rerun, and whether the real rerun reached the goal. Then ``doctor`` on the remedied
run: does it ask to undo the remedy (advice that does not converge)?

    python -m benchmarks.bench_remedies [--scenarios thrash,short-behind-long] [--out DIR] [--server]

(as a module: ``--server`` imports ``benchmarks.closed_loop``)

Request ids differ between runs: a goal over some requests (the short requests of a
head-of-line finding) is measured on the rerun over the requests at the same positions
in arrival order (the scenarios add their requests in one fixed order). The machine's
load moves the seconds figures; the load average is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "long_prompts.py"
#: whatif names → examples/long_prompts.py flags (the settings a scenario rerun can apply).
FLAGS = {"max_num_batched_tokens": "--max-num-batched-tokens", "max_num_seqs": "--max-num-seqs",
         "num_kv_blocks": "--num-kv-blocks", "long_prefill_token_threshold": "--long-prefill-token-threshold",
         "scheduling_policy": "--scheduling-policy", "max_model_len": "--max-model-len"}
#: whatif names of on/off settings → (the flag for on, the flag for off).
SWITCHES = {"async_scheduling": ("--async-scheduling", "--no-async-scheduling"),
            "enable_chunked_prefill": (None, "--no-chunked-prefill"),
            "enable_prefix_caching": ("--enable-prefix-caching", None)}


def rerun_flags(settings: dict) -> list[str] | None:
    """examples/long_prompts.py flags applying ``settings`` (whatif names); None when one of
    them cannot be applied there."""
    out: list[str] = []
    for k, v in settings.items():
        if k in SWITCHES:
            flag = SWITCHES[k][0 if v else 1]
            if flag is None:
                return None
            out.append(flag)
        elif k in FLAGS:
            out += [FLAGS[k], str(v)]
        else:
            return None
    return out


def vllm_probe(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_probe", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=os.environ.copy())


def record(out: Path, scenario: Path, extra: list[str]) -> Path:
    if (out / "meta.json").exists() and json.loads((out / "meta.json").read_text()).get("exit_code") == 0:
        print(f"  reusing {out.name}", file=sys.stderr, flush=True)
        return out  # a complete recording of an earlier pass
    t = time.time()
    p = vllm_probe("run", "--out", str(out), "--", sys.executable, str(EXAMPLE), "--scenario", str(scenario), *extra)
    if p.returncode != 0:
        raise RuntimeError(f"{scenario.stem} {' '.join(extra)}: exit {p.returncode}: {p.stderr[-500:]}")
    print(f"  recorded {out.name} in {time.time() - t:.0f} s", file=sys.stderr, flush=True)
    return out


def doctor(run: Path, budget: float) -> list[dict]:
    saved = run.with_name(run.name + ".doctor.json")
    if saved.exists():
        return json.loads(saved.read_text())["findings"]
    p = vllm_probe("doctor", str(run), "--json", "--budget", str(budget))
    if p.returncode not in (0, 3):
        raise RuntimeError(f"doctor {run}: exit {p.returncode}: {p.stderr[-500:]}")
    saved.write_text(p.stdout)
    return json.loads(p.stdout)["findings"]


def order_of(run: Path) -> list[str]:
    """Request ids in the order the engine added them."""
    from vllm_probe.runs.reader import ReadStats, iter_run
    from vllm_probe.schema.records import RequestAddedEvent

    added: list[Any] = [ev for ev in iter_run(run, ReadStats()) if isinstance(ev, RequestAddedEvent)]
    return [ev.req_id for ev in added]


def goal_figure(run: Path, goal: dict, recorded_order: list[str]) -> float | None:
    from vllm_probe.analysis.objectives import measure

    requests = goal.get("requests") or []
    if requests:
        mine = order_of(run)
        pos = [recorded_order.index(r) for r in requests if r in recorded_order]
        requests = [mine[i] for i in pos if i < len(mine)]
    return measure(run, [goal["figure"]], requests=requests or None)[goal["figure"]]


def met(goal: dict, reference: float | None, value: float | None) -> bool | None:
    from vllm_probe.analysis.doctor.rule import Goal

    return Goal(goal["figure"], goal.get("at_most"), goal.get("reduce_by"), tuple(goal.get("requests") or ())).met(
        reference, value)


def undo(findings: list[dict], remedy: dict, recorded_settings: dict) -> list[str]:
    """Findings on the remedied run whose remedy moves a remedied setting back toward the
    recorded value."""
    out = []
    for f in findings:
        r = f.get("remedy") or {}
        for k, v in (r.get("whatif") or {}).items():
            if k in remedy and k in recorded_settings and isinstance(v, (int, float)) and not isinstance(v, bool):
                was, now = recorded_settings[k], remedy[k]
                if isinstance(was, (int, float)) and (v - now) * (was - now) > 0:
                    out.append(f"{f['id']}: {k} {now} → {v}")
    return out


def doctor_json(run: Path, budget: float) -> dict:
    """``doctor --json`` of ``run`` (kept beside it: a second pass reuses it)."""
    doctor(run, budget)
    return json.loads(run.with_name(run.name + ".doctor.json").read_text())


#: The plan's count figures checked for exactness (objectives' names).
COUNTS = ("preemptions", "worst_request_preemptions", "held_slot_steps", "reread_kv_tokens")
#: The plan's seconds figures compared with their intervals.
SECONDS = ("ttft_p90", "itl_p90", "queue_p90")


def serious(findings: list[dict]) -> set[str]:
    return {f["id"] for f in findings if f["severity"] in ("warning", "critical")}


def plan_row(name: str, base: Path, rerun_at, budget: float) -> dict:
    """One scenario's plan, applied for real with ``rerun_at(settings) -> run dir | None``."""
    from vllm_probe.analysis.summary import summarize
    from vllm_probe.sim.engine_args import recorded_settings

    t = time.time()
    doc = doctor_json(base, budget)
    row: dict = {"scenario": name, "doctor_s": round(time.time() - t), "before": sorted(serious(doc["findings"]))}
    plan = doc.get("plan") or {}
    row["plan"] = plan.get("settings") or {}
    row["checked"] = plan.get("checked")
    row["claims"] = plan.get("clears") or []
    if not row["plan"] or not plan.get("checked"):
        return row
    fixed = rerun_at(row["plan"])
    if fixed is None:
        row["note"] = "the plan's settings cannot be applied to this workload's rerun"
        return row
    after = doctor_json(fixed, budget)
    left = serious(after["findings"])
    row["left"] = sorted(left)
    row["cleared_real"] = [c for c in row["claims"] if c not in left]
    row["all_claims_real"] = set(row["claims"]) <= set(row["cleared_real"])
    order = order_of(base)
    counts, seconds = {}, {}
    for label, f in (plan.get("predicted") or {}).items():
        figure = label.split(" (")[0]
        goal = {"figure": figure, "requests": []}
        if f.get("goal"):
            goal_f: dict[str, Any] = next((x for x in doc["findings"] if x["id"] == f["goal"]), {})
            goal["requests"] = ((goal_f.get("predicted") or {}).get("goal") or {}).get("requests") or []
        if figure in COUNTS:
            counts[label] = (f.get("predicted"), goal_figure(fixed, goal, order))
        elif figure in SECONDS and "(" not in label:
            iv = f.get("interval") or {}
            real = goal_figure(fixed, goal, order)
            covered = None if real is None or not iv else iv["lo"] <= real <= iv["hi"]
            seconds[label] = (f.get("predicted"), iv.get("lo"), iv.get("hi"), real, covered)
    row["counts"], row["seconds"] = counts, seconds
    row["counts_exact"] = all(p == r for p, r in counts.values())
    recorded = recorded_settings(summarize(base).config)
    row["undo"] = undo(after["findings"], row["plan"], recorded)
    row["load"] = round(os.getloadavg()[0], 1)
    return row


def plan_table(rows: list[dict]) -> list[str]:
    """The benchmark's table (Markdown) and its target line."""
    def v(x):
        return "-" if x is None else f"{x:.4g}" if isinstance(x, float) else str(x)
    out = ["| scenario | findings before | plan | claims | cleared for real | counts predicted / real | "
           "seconds predicted (interval) / real | warnings left | undo | load |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        counts = "; ".join(f"{k} {v(p)} / {v(q)}" for k, (p, q) in (r.get("counts") or {}).items()) or "-"
        secs = "; ".join(f"{k} {v(p)} ({v(lo)}–{v(hi)}) / {v(q)}{'' if c else ' ✗' if c is False else ''}"
                         for k, (p, lo, hi, q, c) in (r.get("seconds") or {}).items()) or "-"
        plan = ", ".join(f"{k}={x}" for k, x in r["plan"].items()) or "-"
        out.append(f"| {r['scenario']} | {', '.join(r['before']) or '-'} | {plan}"
                   f"{'' if r.get('checked') else ' (unchecked)'} | {', '.join(r['claims']) or '-'} | "
                   f"{', '.join(r.get('cleared_real', [])) or '-'} | {counts} | {secs} | "
                   f"{', '.join(r.get('left', [])) or '-'} | {'; '.join(r.get('undo', [])) or 'no'} | "
                   f"{r.get('load', '-')} |")
    applied = [r for r in rows if "all_claims_real" in r]
    if applied:
        ok = sum(r["all_claims_real"] for r in applied)
        exact = sum(r["counts_exact"] for r in applied)
        out.append("")
        out.append(f"plans applied for real: {len(applied)}; every claimed finding cleared for real: {ok} "
                   f"({100 * ok / len(applied):.0f} %, target ≥ 90 %); counts exact: {exact}; plans undone by the "
                   f"fixed run's doctor: {sum(bool(r['undo']) for r in applied)}")
    return out


def plans_main(a: argparse.Namespace, names: list[str]) -> int:
    rows: list[dict[str, Any]] = []
    for name in names:
        scenario = ROOT / "configs/scenarios" / f"{name}.yaml"
        print(f"{name}:", file=sys.stderr, flush=True)
        base = record(a.out / f"{name}-recorded", scenario, [])

        def rerun_at(settings: dict, name: str = name, scenario: Path = scenario) -> Path | None:
            extra = rerun_flags(settings)
            if extra is None:
                return None
            slug = ",".join(f"{k}={v}" for k, v in settings.items())
            return record(a.out / f"{name}-plan-{slug}", scenario, extra)

        rows.append(plan_row(name, base, rerun_at, a.budget))
        print("  row: " + json.dumps(rows[-1], default=str), file=sys.stderr, flush=True)
    if a.server:
        from benchmarks.closed_loop import ENGINE_ARGS, ClosedLoop, with_flags
        from benchmarks.closed_loop import record as record_server
        from vllm_probe.schema.engine_settings import serve_flags

        loop = ClosedLoop()

        def server_run(out: Path, args: list[str]) -> Path:
            if not (out / "meta.json").exists():
                record_server(out, args, loop, out.parent / f"{out.name}.server.log")
            return out

        base = server_run(a.out / "server-recorded", list(ENGINE_ARGS))

        def rerun_server(settings: dict) -> Path:
            flags = serve_flags(settings)
            pairs = dict(zip(flags[::2], flags[1::2]))
            slug = ",".join(f"{k}={v}" for k, v in settings.items())
            return server_run(a.out / f"server-plan-{slug}", with_flags(ENGINE_ARGS, pairs))

        rows.append(plan_row("server (closed loop, 8 threads)", base, rerun_server, a.budget))
    print()
    for line in plan_table(rows):
        print(line)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", help="comma-separated names (default: every file of configs/scenarios/)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench_remedies"))
    ap.add_argument("--budget", type=float, default=120.0, help="doctor's search budget (s)")
    ap.add_argument("--no-undo-check", action="store_true", help="skip doctor on the remedied runs")
    ap.add_argument("--remedies", action="store_true", help="check each finding's own remedy, not the plan")
    ap.add_argument("--server", action="store_true", help="also a server under a closed-loop client (plans)")
    a = ap.parse_args()
    names = (a.scenarios.split(",") if a.scenarios
             else sorted(p.stem for p in (ROOT / "configs/scenarios").glob("*.yaml")))
    a.out.mkdir(parents=True, exist_ok=True)
    if not a.remedies:
        return plans_main(a, names)
    rows: list[tuple[Any, ...]] = []
    for name in names:
        scenario = ROOT / "configs/scenarios" / f"{name}.yaml"
        print(f"{name}:", file=sys.stderr, flush=True)
        base = record(a.out / f"{name}-recorded", scenario, [])
        from vllm_probe.analysis.summary import summarize
        from vllm_probe.sim.engine_args import recorded_settings

        settings = recorded_settings(summarize(base).config)
        order = order_of(base)
        t = time.time()
        findings = doctor(base, a.budget)
        print(f"  doctor searched in {time.time() - t:.0f} s", file=sys.stderr, flush=True)
        for f in findings:
            r, p = f.get("remedy"), f.get("predicted") or {}
            if f["severity"] == "info":
                continue
            if not r or not r.get("checked"):
                rows.append((name, f["id"], "-" if not r else f"{r['setting']}={r['value']} (unchecked)",
                             p.get("goal", {}).get("figure", "-"), p.get("recorded"), p.get("baseline"), None, None,
                             None, ""))
                continue
            goal = r["predicted"]["goal"]
            extra = rerun_flags(r["whatif"])
            real = reached = None
            again = ""
            if extra is not None:
                slug = ",".join(f"{k}={v}" for k, v in r["whatif"].items())
                rerun = record(a.out / f"{name}-{f['id']}-{slug}", scenario, extra)
                real = goal_figure(rerun, goal, order)
                recorded_value = r["predicted"]["recorded"]
                reached = met(goal, recorded_value, real)
                if not a.no_undo_check:
                    again = "; ".join(undo(doctor(rerun, a.budget), r["whatif"], settings)) or "no undo"
            rows.append((name, f["id"], ",".join(f"{k}={v}" for k, v in r["whatif"].items()), goal["figure"],
                         r["predicted"]["recorded"], r["predicted"]["baseline"], r["predicted"]["predicted"], real,
                         reached, again))
            print("  row: " + json.dumps(rows[-1], default=str), file=sys.stderr, flush=True)
    load = os.getloadavg()
    print(f"\nload average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    print("| scenario | finding | remedy | goal figure | recorded | replay at recorded | predicted | real | "
          "reached | doctor on the remedied run |")
    print("|---|---|---|---|---|---|---|---|---|---|")

    def cell(v: Any) -> str:
        return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)
    for row in rows:
        print("| " + " | ".join(cell(v) for v in row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
