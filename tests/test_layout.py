"""Rules of the package's layout that no other test would notice breaking.

* ``vllm_probe/engine/`` runs inside vLLM's engine core: it imports only
  ``vllm_probe.schema``, ``settings``, ``envvars``, the package root (``__version__``),
  itself, vLLM, the standard library and its own dependencies — never the readers
  (runs/, analysis/), the exporters, the live view (tui/, rich), the CLI or the harness.
* Every environment variable the package reads is named in ``vllm_probe/envvars.py``:
  no ``os.environ`` / ``os.getenv`` lookup elsewhere spells a ``VLLMPROBE_`` name.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "vllm_probe"
ENGINE_MAY_IMPORT = {"vllm_probe", "vllm_probe.schema", "vllm_probe.settings", "vllm_probe.envvars",
                     "vllm_probe.engine"}
THIRD_PARTY = {"vllm", "structlog", "msgspec"}


def _imports(path: Path, package: str):
    """(line, absolute module name) of each import in ``path`` (a module of ``package``)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            names = [module] if node.module else [f"{module}.{a.name}" for a in node.names]
            for name in names:
                yield node.lineno, name


def test_engine_imports_only_schema_settings_envvars_and_vllm():
    bad = []
    for path in sorted((PACKAGE / "engine").glob("*.py")):
        for line, module in _imports(path, "vllm_probe.engine"):
            top = module.split(".")[0]
            if top == "vllm_probe":
                ok = any(module == m or module.startswith(m + ".") for m in ENGINE_MAY_IMPORT - {"vllm_probe"}) \
                    or module in ("vllm_probe", "vllm_probe.__version__")
            else:
                ok = top in sys.stdlib_module_names or top in THIRD_PARTY
            if not ok:
                bad.append(f"{path.name}:{line} imports {module}")
    assert bad == []


def _env_lookups(tree: ast.AST):
    """String literals passed to os.environ.get / os.getenv / os.environ[...]."""
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and node.args:
            f = ast.unparse(node.func)
            if f in ("os.environ.get", "os.getenv", "os.environ.pop", "os.environ.setdefault"):
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
            key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            yield node.lineno, key.value


def test_every_probe_env_var_is_named_in_envvars():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "envvars.py":
            continue
        for line, name in _env_lookups(ast.parse(path.read_text())):
            if name.startswith(("VLLMPROBE_", "VLLM_")):
                bad.append(f"{path.relative_to(PACKAGE)}:{line} reads {name}")
    assert bad == []
