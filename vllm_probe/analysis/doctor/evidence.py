"""Typed evidence of the doctor's findings: the base every rule's evidence Struct derives
from (each rule's own is in its file), and how the reference reads their docstrings.

``doctor --json`` encodes a finding's ``evidence`` with :func:`msgspec.to_builtins`: the
keys are the field names, in this order. Fields with a default (``engine``, and the few a
rule sets only in some cases) are left out while they hold it; every other field is
always written, ``null`` when unknown. docs/doctor.md's evidence reference is generated
from these docstrings (:mod:`vllm_probe.analysis.doctor.reference`); a test keeps the
two equal, and another that every field is described.

Step ranges are ``[first, last]``, inclusive step indices of the engine core; request ids
are vLLM's; token counts are tokens; shares are 0..1.
"""

from __future__ import annotations

import msgspec


class Evidence(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Base of every rule's evidence.

    Attributes:
        engine: data-parallel rank the finding is about; left out when the run has one engine core.
    """

    engine: int | None = None


def field_docs(cls: type) -> dict[str, str]:
    """The ``Attributes:`` entries of ``cls``'s docstring (and its bases'), by field name."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        doc = klass.__doc__ or ""
        if "Attributes:" not in doc or klass is msgspec.Struct:
            continue
        name = None
        for raw in doc.split("Attributes:", 1)[1].splitlines():
            line = raw.strip()
            if not line:
                continue
            head, sep, rest = line.partition(": ")
            if sep and head.isidentifier() and raw.startswith(" " * 8) and not raw.startswith(" " * 12):
                name = head
                out[name] = rest.strip()
            elif name is not None:
                out[name] += " " + line
    return out
