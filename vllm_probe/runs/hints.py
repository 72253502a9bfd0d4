"""One-line hints for commands that fail before vLLM's engine core starts.

vLLM starts its engine core (and, on the CPU backend, its worker) as a new Python
process with multiprocessing's ``spawn`` method, which imports the user's main script
again in the child. A script that builds ``LLM(...)`` at module level, not under
``if __name__ == "__main__":`` as a script that starts vLLM must, builds it again in
the child while the child is still bootstrapping, and Python refuses with "An attempt
has been made to start a new process before the current process has finished its
bootstrapping phase" (``multiprocessing/spawn.py``, ``_check_not_importing_main``); the
parent then fails with vLLM's "Engine core initialization failed". The traceback names
neither the script's line nor the fix: :func:`spawn_hint` does.

It recognises the failure from the command's output when there is one (``run --live``
keeps it in ``command.log``) and otherwise from the script itself (``run`` leaves the
output on the terminal): the module-level code calls ``LLM(...)``, an engine's
``from_engine_args(...)``, or a function of the script that does, outside an
``if __name__ == "__main__":`` block.
"""

from __future__ import annotations

import ast
from pathlib import Path
from collections.abc import Iterable

#: What Python's multiprocessing prints when a spawned child starts a process while it
#: is importing the main module (CPython 3.8-3.13, ``multiprocessing/spawn.py``).
SPAWN_ERROR = "An attempt has been made to start a new process before the"
#: Calls that start a vLLM engine (``vllm.LLM``; ``LLMEngine`` / ``AsyncLLMEngine`` /
#: ``AsyncLLM.from_engine_args``).
ENGINE_CALLS = ("LLM", "from_engine_args")


def spawn_hint(command: list[str], log_lines: Iterable[str] | None = None) -> str | None:
    """The hint for a command that failed before an engine core wrote events, or None.

    Args:
        command: the command line (``python script.py ...``).
        log_lines: the command's output, when it was kept.

    Never raises (an unreadable or unparsable script gives None).
    """
    script = _script_of(command)
    if log_lines is not None and any(SPAWN_ERROR in line for line in log_lines):
        where = f"{script.name}'s code" if script is not None else "the script's code"
        return (f"vLLM starts its engine core with multiprocessing 'spawn', which imports the script again: "
                f"put {where} under `if __name__ == \"__main__\":`")
    if script is None:
        return None
    line = unguarded_engine_call(script)
    if line is None:
        return None
    # the output went to the terminal, not to us: say which error this hint is for
    return (f"{script.name} starts vLLM at import time (line {line}); if the error above says \"An attempt has been "
            f"made to start a new process\", vLLM's engine core (a spawned process) imported the script again: put "
            f"the script's code under `if __name__ == \"__main__\":`")


def _script_of(command: list[str]) -> Path | None:
    """The ``.py`` file a ``python [options] SCRIPT ...`` command runs (None: no script,
    ``-m`` or ``-c``)."""
    if not command or not Path(command[0]).name.startswith("python"):
        return None
    for arg in command[1:]:
        if arg in ("-m", "-c"):
            return None
        if not arg.startswith("-"):
            path = Path(arg)
            return path if path.suffix == ".py" and path.is_file() else None
    return None


def unguarded_engine_call(script: Path) -> int | None:
    """Line of the first engine start (:data:`ENGINE_CALLS`) the script runs at import
    time: in its module-level code outside ``if __name__ == "__main__":``, directly or
    through a call of one of its own module-level functions. None when there is none or
    the file cannot be read or parsed."""
    try:
        tree = ast.parse(script.read_text(encoding="utf-8", errors="replace"), str(script))
    except (OSError, SyntaxError, ValueError):
        return None
    starters = {node.name for node in tree.body
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _engine_call(node) is not None}
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or _is_main_guard(stmt):
            continue
        line = _engine_call(stmt, starters)
        if line is not None:
            return line
    return None


def _engine_call(node: ast.AST, starters: frozenset[str] | set[str] = frozenset()) -> int | None:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if name in ENGINE_CALLS or name in starters:
                return sub.lineno
    return None


def _is_main_guard(stmt: ast.stmt) -> bool:
    """``if __name__ == "__main__":`` (either side)."""
    if not isinstance(stmt, ast.If) or not isinstance(stmt.test, ast.Compare) or len(stmt.test.comparators) != 1:
        return False
    sides = [stmt.test.left, stmt.test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    consts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return bool(names and consts) and isinstance(stmt.test.ops[0], ast.Eq)
