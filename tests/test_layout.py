"""The package's layout rules (docs/architecture.md), read from the imports with ``ast``.

Every import counts, lazy ones inside functions included. A part is a folder of
``vllm_probe/`` (``engine``, ``runs`` …) or a top-level module (``plugin``, ``settings`` …).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "vllm_probe"

#: Which parts of the package each part may import (itself always included). The
#: floors, lowest first: schema · envvars · settings → engine · runs → analysis →
#: exporters · sim → advice → tui · html → cli.
ALLOWED: dict[str, set[str]] = {
    "__init__": set(),
    "envvars": set(),
    "schema": set(),
    "settings": {"schema"},
    "engine": {"__init__", "schema", "settings", "envvars"},
    "plugin": {"engine", "settings", "envvars"},
    "runs": {"__init__", "schema", "settings", "envvars"},
    "analysis": {"runs", "schema"},
    "exporters": {"analysis", "runs", "schema"},
    "sim": {"__init__", "engine", "runs", "analysis", "exporters", "schema", "settings", "envvars"},
    "advice": {"sim", "analysis", "runs", "schema"},
    "tui": {"analysis", "runs", "exporters", "schema", "settings", "envvars", "advice"},
    "html": {"__init__", "analysis", "runs", "exporters", "schema", "advice"},
    "cli": {"__init__", "envvars", "settings", "schema", "engine", "runs", "analysis", "exporters", "sim", "tui",
            "advice", "html"},
    "__main__": {"cli"},
}
#: The only packages beyond the standard library that ``engine/`` may import: it runs
#: inside vLLM's engine core and carries nothing a server would not already have.
ENGINE_THIRD_PARTY = {"vllm", "structlog", "msgspec"}
#: Third-party packages a part must never import.
FORBIDDEN_THIRD_PARTY: dict[str, set[str]] = {
    "engine": {"rich"},  # runs inside vLLM's engine core: no terminal code there
    "analysis": {"rich"},  # pure: the views draw, the analysis computes
    "exporters": {"rich"},
    "runs": {"rich"},
    "html": {"rich"},  # the page is drawn with Bokeh; the terminal's views are tui's
    "schema": {"rich", "vllm"},
    "settings": {"rich", "vllm"},
}


def part_of(module: str) -> str:
    """``vllm_probe.engine.sink`` -> ``engine``; ``vllm_probe.plugin`` -> ``plugin``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports_of(path: Path) -> list[tuple[str, int]]:
    """Absolute names of the modules ``path`` imports, with line numbers."""
    package = list(path.relative_to(PACKAGE.parent).parts[:-1])  # a module's package, or an __init__'s own
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
                if node.module is None:  # `from . import x`: x is a module of that package, or a name of its __init__
                    for alias in node.names:
                        sub = PACKAGE.parent.joinpath(*name.split("."), alias.name)
                        is_module = sub.is_dir() or sub.with_suffix(".py").exists()
                        out.append((f"{name}.{alias.name}" if is_module else name, node.lineno))
                    continue
            else:
                name = node.module or ""
            out.append((name, node.lineno))
    return out


def violations() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        mine = part_of(".".join(rel.parts[:-1] if rel.parts[-1] == "__init__" else rel.parts))
        for name, line in imports_of(path):
            top = name.split(".")[0]
            where = f"{path.relative_to(PACKAGE.parent)}:{line}"
            if top == "vllm_probe":
                other = part_of(name)
                if other != mine and other not in ALLOWED[mine]:
                    found.append(f"{where}: {mine} imports {other} ({name})")
            elif top in FORBIDDEN_THIRD_PARTY.get(mine, ()):
                found.append(f"{where}: {mine} imports {top}")
    return found


def test_every_part_of_the_package_is_known():
    parts = {part_of(".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts)) for p in PACKAGE.rglob("*.py")}
    assert parts <= set(ALLOWED), parts - set(ALLOWED)


def test_imports_follow_the_layout():
    assert violations() == []


def test_the_checker_sees_a_violation(tmp_path, monkeypatch):
    """An engine module importing the views is caught (the rule is not vacuous)."""
    fake = tmp_path / "vllm_probe"
    (fake / "engine").mkdir(parents=True)
    (fake / "tui").mkdir()
    (fake / "engine" / "hooks.py").write_text("def f():\n    from ..tui import dashboard\n    import rich\n")
    (fake / "tui" / "dashboard.py").write_text("from ..analysis.state import RunState\n")
    monkeypatch.setattr("tests.test_layout.PACKAGE", fake)
    assert violations() == [
        "vllm_probe/engine/hooks.py:2: engine imports tui (vllm_probe.tui)",
        "vllm_probe/engine/hooks.py:3: engine imports rich",
    ]


def test_engine_imports_nothing_beyond_the_stdlib_vllm_structlog_and_msgspec():
    bad = []
    for path in sorted((PACKAGE / "engine").glob("*.py")):
        for name, line in imports_of(path):
            top = name.split(".")[0]
            if top != "vllm_probe" and top not in sys.stdlib_module_names and top not in ENGINE_THIRD_PARTY:
                bad.append(f"{path.name}:{line} imports {name}")
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


def test_every_environment_variable_is_read_through_envvars():
    """Every variable the package reads is named in ``envvars.py``: no lookup elsewhere
    spells a name as a literal."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "envvars.py":
            continue
        for line, name in _env_lookups(ast.parse(path.read_text())):
            bad.append(f"{path.relative_to(PACKAGE)}:{line} reads {name}")
    assert bad == []


#: Modules of the doctor that several rules share (one mechanism each): a rule may take its goal,
#: step, view, evidence and knobs from them, never its evaluate or its arithmetic.
DOCTOR_SHARED = {"vllm_probe.analysis.doctor.limits", "vllm_probe.analysis.doctor.knobs",
                 "vllm_probe.analysis.doctor.kv"}


def test_each_rule_file_holds_its_whole_rule():
    """``rules/<id>.py`` defines its ``RULE``, its evaluate and arithmetic; its goal, step,
    view and evidence are its own or a shared module's; every threshold is a named constant
    the file can read; the catalogue lists each file's rule once."""
    import dataclasses
    import importlib

    from vllm_probe.analysis.doctor.rule import Rule
    from vllm_probe.analysis.doctor.rules import CATALOGUE

    defaults = {f.name: f.default for f in dataclasses.fields(Rule)}
    files = sorted(p.stem for p in (PACKAGE / "analysis" / "doctor" / "rules").glob("*.py")
                   if not p.stem.startswith("__"))
    assert files == sorted(r.id.replace("-", "_") for r in CATALOGUE)
    for rule in CATALOGUE:
        name = f"vllm_probe.analysis.doctor.rules.{rule.id.replace('-', '_')}"
        module = importlib.import_module(name)
        assert module.RULE is rule, name
        assert rule.evaluate.__module__ == name, (rule.id, "evaluate")
        if rule.arithmetic is not defaults["arithmetic"]:
            assert rule.arithmetic.__module__ == name, (rule.id, "arithmetic")
        for part in ("goal", "step", "view"):
            fn = getattr(rule, part)
            assert fn is defaults[part] or fn.__module__ in {name, *DOCTOR_SHARED}, (rule.id, part, fn.__module__)
        assert rule.evidence is not None and rule.evidence.__module__ in {name, *DOCTOR_SHARED}, rule.id
        shared = [importlib.import_module(m) for m in DOCTOR_SHARED]
        for t in rule.thresholds:
            values = [getattr(m, t.name) for m in (module, *shared) if hasattr(m, t.name)]
            assert values and values[0] == t.value, (rule.id, t.name)


def test_no_module_outside_the_rules_defines_a_rule():
    """A ``Rule(...)`` is written only in a rule's own file."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "rules" and path.parent.parent.name == "doctor":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "Rule":
                bad.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert bad == []


def test_no_module_imports_another_modules_private_name():
    """``from .x import _y`` across modules makes ``_y`` an interface nobody declared: a
    name another module needs is public (tests may reach into a module's privates)."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or node.level):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        bad.append(f"{path.relative_to(PACKAGE)}:{node.lineno} imports {alias.name}")
    assert bad == []


def test_benchmarks_import_nothing_from_the_tests():
    """A benchmark runs from a checkout without the test suite's helpers: what both need
    lives in ``benchmarks/`` (e.g. ``benchmarks/_hand.py``), and the tests import it."""
    bad = []
    for path in sorted((PACKAGE.parent / "benchmarks").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{path.name}:{node.lineno} imports {n}" for n in names if n == "tests" or n.startswith("tests.")]
    assert bad == []


#: A module holds one concept a reader takes in at once; a function one step of it.
MODULE_LINES_MAX = 600
FUNCTION_LINES_MAX = 80


def _is_table(node: ast.stmt) -> bool:
    """A declarative table: an assignment of a literal (a tuple, list, dict or call of
    rows), which reads as data however long it is."""
    return isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(
        node.value, (ast.Tuple, ast.List, ast.Dict, ast.Call, ast.Constant))


def sizes(path: Path) -> tuple[int, list[tuple[str, int]]]:
    """The module's lines outside its declarative tables, and each function's lines."""
    tree = ast.parse(path.read_text())
    lines = path.read_text().count("\n")
    for node in tree.body:
        if _is_table(node) and node.end_lineno is not None:
            lines -= node.end_lineno - node.lineno + 1
    funcs = [(f"{path.name}:{n.lineno} {n.name}", n.end_lineno - n.lineno + 1) for n in ast.walk(tree)
             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno is not None]
    return lines, funcs


def test_modules_and_functions_stay_small():
    """Modules ≤ :data:`MODULE_LINES_MAX` lines (declarative tables left out) and functions
    ≤ :data:`FUNCTION_LINES_MAX` lines: past them a module holds two concepts, a function two
    steps, and the next reader has to find the seam."""
    long_modules, long_functions = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines, funcs = sizes(path)
        if lines > MODULE_LINES_MAX:
            long_modules.append(f"{path.relative_to(PACKAGE)} {lines}")
        long_functions += [f"{name} {n}" for name, n in funcs if n > FUNCTION_LINES_MAX]
    assert long_modules + long_functions == []


def test_the_size_check_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES_MAX))
    (tmp_path / "m.py").write_text(f"def f():\n{body}\n    return 0\n\nROWS = (\n" + "    1,\n" * 700 + ")\n")
    lines, funcs = sizes(tmp_path / "m.py")
    assert funcs == [("m.py:1 f", FUNCTION_LINES_MAX + 2)] and lines < MODULE_LINES_MAX


def test_no_test_package_shadows_the_standard_library():
    """A script run from tests/ (``python tests/_fleet_replica.py``) has tests/ first on its
    path: a package there named like a standard-library module (``tests/html``) shadows it,
    and torch's import of networkx, which imports ``html.entities``, fails inside vLLM."""
    tests = Path(__file__).resolve().parent
    shadows = sorted(p.name for p in tests.iterdir()
                     if p.is_dir() and (p / "__init__.py").exists() and p.name in sys.stdlib_module_names)
    assert shadows == []
