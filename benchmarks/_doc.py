"""Generated sections of the docs: the text between two marker lines, rewritten by a benchmark."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path


def replace_section(path: Path, begin: str, end: str, text_of: Callable[[str], str], what: str) -> None:
    """Replace what lies between the lines ``begin`` and ``end`` of ``path`` with
    ``text_of(old)`` (``old``: what lay there; a benchmark that reran some rows keeps the others).

    Raises:
        SystemExit: the markers are missing (``what`` names them in the message).
    """
    doc = path.read_text()
    if begin not in doc or end not in doc:
        sys.exit(f"bench_whatif: {path} has no {what} markers ({begin} … {end})")
    head, rest = doc.split(begin, 1)
    old, tail = rest.split(end, 1)
    path.write_text(f"{head}{begin}\n{text_of(old)}{end}{tail}")
