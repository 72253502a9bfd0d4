"""Do doctor's replay-chosen remedies work when run for real?

For each scenario of ``configs/scenarios/`` (or those named): record it on the real
engine (``vllm-probe run -- python examples/long_prompts.py --scenario FILE``), run
``vllm-probe doctor --json`` (the remedy search, :mod:`vllm_probe.advice.remedies`), run
each finding's top remedy for real (the same scenario with the remedy's settings), and
print, per finding, the goal figure recorded / predicted by the replay / measured on the
real rerun, and whether the real rerun reached the goal. Then ``doctor`` on the remedied
run: does it ask to undo the remedy (advice that does not converge)?

    python benchmarks/bench_remedies.py [--scenarios thrash,short-behind-long] [--out DIR]

Request ids differ between runs: a goal over some requests (the short requests of a
head-of-line finding) is measured on the rerun over the requests at the same positions
in arrival order (the scenarios add their requests in one fixed order). The machine's
load moves the seconds figures (design.md §7); the load average is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

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

    return [ev.req_id for ev in iter_run(run, ReadStats()) if isinstance(ev, RequestAddedEvent)]


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", help="comma-separated names (default: every file of configs/scenarios/)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench_remedies"))
    ap.add_argument("--budget", type=float, default=120.0, help="doctor's search budget (s)")
    ap.add_argument("--no-undo-check", action="store_true", help="skip doctor on the remedied runs")
    a = ap.parse_args()
    names = (a.scenarios.split(",") if a.scenarios
             else sorted(p.stem for p in (ROOT / "configs/scenarios").glob("*.yaml")))
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
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

    def f(v):
        return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)
    for row in rows:
        print("| " + " | ".join(f(v) for v in row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
