"""Typed paths to the figures of a :class:`~vllm_probe.analysis.summary.Summary`.

``S.latency.ttft_s.p90`` is a :class:`FigurePath`: each attribute step is checked
against the dataclass it is taken on (its fields, their annotated types) when the path
is built, at import of the module that writes it, so a misspelt or renamed figure fails
there and not as a silent ``None`` in a comparison. ``[i]`` takes a list's item
(``S.latency_classes.classes[0].ttft_s.median``), ``["key"]`` a dict's value
(``S.bound_by["kv_cache"]``). :meth:`FigurePath.get` reads the figure of a summary
(None where a value on the way is None, a list is shorter or a dict lacks the key);
``str(path)`` is its dotted form (``"latency.ttft_s.p90"``), as ``compare --json``
writes it.

Raises (when a path is built):
    AttributeError: no such field on that dataclass.
    TypeError: an item taken of something that is not a list or a dict.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, Union

from .summary_types import Summary

#: A step: ("attr", name), ("item", index) or ("key", key).
Step = tuple[str, Any]


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    """A dataclass's fields and their resolved annotations."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls)}


def _strip_optional(t: Any) -> Any:
    """``X | None`` -> ``X``."""
    if typing.get_origin(t) in (Union, types.UnionType):
        args = [a for a in typing.get_args(t) if a is not type(None)]
        return args[0] if len(args) == 1 else Any
    return t


class FigurePath:
    """A path into a :class:`Summary`, checked step by step against its types."""

    __slots__ = ("_steps", "_type")

    def __init__(self, steps: tuple[Step, ...] = (), type_: Any = Summary) -> None:
        self._steps = steps
        self._type = type_

    def __getattr__(self, name: str) -> FigurePath:
        if name.startswith("__"):
            raise AttributeError(name)
        t = _strip_optional(self._type)
        if not (isinstance(t, type) and dataclasses.is_dataclass(t)):
            raise AttributeError(f"{self}: {name!r} taken of a value that is not a dataclass ({t!r})")
        fields = _field_types(t)
        if name not in fields:
            raise AttributeError(f"{t.__name__} has no figure {name!r} (path {self}.{name})")
        return FigurePath(self._steps + (("attr", name),), fields[name])

    def __getitem__(self, key: Any) -> FigurePath:
        t = _strip_optional(self._type)
        origin, args = typing.get_origin(t), typing.get_args(t)
        if origin is list and isinstance(key, int):
            return FigurePath(self._steps + (("item", key),), args[0] if args else Any)
        if origin is dict:
            return FigurePath(self._steps + (("key", key),), args[1] if len(args) == 2 else Any)
        raise TypeError(f"{self}[{key!r}]: {t!r} is not a list (int index) or a dict")

    @classmethod
    def parse(cls, dotted: str) -> FigurePath:
        """The typed path of a dotted one (``"latency_classes.classes.0.ttft_s.median"``:
        digits index a list), checked as if written with attributes."""
        path = cls()
        for part in dotted.split("."):
            t = _strip_optional(path._type)
            if typing.get_origin(t) is list and part.isdigit():
                path = path[int(part)]
            elif typing.get_origin(t) is dict:
                path = path[part]
            else:
                path = getattr(path, part)
        return path

    def get(self, s: Summary) -> Any:
        """The figure of ``s`` (None where a step finds nothing)."""
        obj: Any = s
        for kind, key in self._steps:
            if kind == "attr":
                obj = getattr(obj, key)
            elif kind == "item":
                obj = obj[key] if key < len(obj) else None
            else:
                obj = obj.get(key)
            if obj is None:
                return None
        return obj

    def __str__(self) -> str:
        return ".".join(str(key) for _, key in self._steps)

    def __repr__(self) -> str:
        return f"S.{self}" if self._steps else "S"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FigurePath):
            return self._steps == other._steps
        if isinstance(other, str):  # the dotted form (compare --json rows, older callers)
            return str(self) == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(str(self))


#: The root: ``S.latency.ttft_s.p90``.
S = FigurePath()
