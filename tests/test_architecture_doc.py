"""docs/architecture.md names real files and names (issue 20 item 6): every `path` and
`path::name` in backticks outside its code blocks exists: the file (from the repository
root, or from ``vllm_probe/`` as the layout's short forms write it), and the class,
function, constant or ``Class.member`` in it, read with ``ast``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
#: A path (a file with a suffix, or a folder ending in /), optionally ::name.
REF = re.compile(r"^(?P<path>[\w.-]+(?:/[\w.-]+)*(?:\.(?:py|md|json|toml|yaml|jsonl)|/))(?:::(?P<name>[\w.]+))?$")


def references(text: str) -> list[tuple[str, str | None]]:
    """The ``(path, name)`` references of the doc's prose (fenced code blocks left out)."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    out = []
    for span in re.findall(r"`([^`\n]+)`", prose):
        m = REF.match(span.strip())
        if (m and "/" in m["path"]) or (m and m["name"]):
            out.append((m["path"], m["name"]))
    return out


def resolve(path: str) -> Path | None:
    for base in (ROOT, ROOT / "vllm_probe"):
        p = base / path
        if p.exists():
            return p
    return None


def defines(tree: ast.Module, name: str) -> bool:
    """Whether the module defines ``name`` (``Class.member``: a member of that class)."""
    head, _, member = name.partition(".")
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == head:
            if not member:
                return True
            return isinstance(node, ast.ClassDef) and any(_names(n, member) for n in node.body)
        if not member and _names(node, head):
            return True
    return False


def _names(node: ast.stmt, name: str) -> bool:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name == name
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    if isinstance(node, ast.AnnAssign):
        return isinstance(node.target, ast.Name) and node.target.id == name
    return False


def test_every_path_and_name_the_architecture_doc_names_exists():
    refs = references(DOC.read_text())
    assert len(refs) >= 80  # the layout and the seven "where to add" lists
    missing = []
    for path, name in refs:
        p = resolve(path)
        if p is None:
            missing.append(path)
        elif name is not None and not defines(ast.parse(p.read_text()), name):
            missing.append(f"{path}::{name}")
    assert not missing, missing


def test_where_to_add_covers_each_kind_of_change():
    text = DOC.read_text()
    where = text[text.index("## Where to add"):]
    for kind in ("An event field", "A vLLM release", "A diagnosis rule", "An export format", "A live consumer",
                 "A whatif setting", "A metric", "A simulation"):
        assert f"{kind}" in where, kind


def test_the_checker_catches_a_missing_file_and_a_missing_name(tmp_path):
    refs = references("see `vllm_probe/analysis/nope.py` and `vllm_probe/analysis/follow.py::Nope` and "
                      "`vllm_probe/analysis/follow.py::LiveRun.pump`\n```\n`in/a/block.py`\n```\n")
    assert refs == [("vllm_probe/analysis/nope.py", None), ("vllm_probe/analysis/follow.py", "Nope"),
                    ("vllm_probe/analysis/follow.py", "LiveRun.pump")]
    assert resolve("vllm_probe/analysis/nope.py") is None
    tree = ast.parse((ROOT / "vllm_probe/analysis/follow.py").read_text())
    assert not defines(tree, "Nope") and defines(tree, "LiveRun.pump") and defines(tree, "APPLY_SLICE")
    assert not defines(tree, "LiveRun.nope")
