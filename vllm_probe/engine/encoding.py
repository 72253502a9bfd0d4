"""How an event becomes a JSON line, on the writer thread: the queued fields as the event's
object (``event``, ``ts``, ``pid``, ``engine``, ``schema``, then the kind's fields in schema
order), encoded with msgspec inside structlog's pipeline (one line per event; a value that
cannot be encoded is counted and its event dropped, never raised into vLLM).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any, cast

import msgspec
import structlog
from msgspec.structs import astuple

from ..schema.events import SCHEMA_VERSION, EventKind

logger = logging.getLogger("vllm_probe")

#: Queue item: (kind, wall-clock ts in s, data-parallel rank, the event's fields): what
#: ``kind.pack(...)`` returned, or a tuple of values in ``kind.fields`` order.
QueuedEvent = tuple[EventKind, float, int, Any]


class LineBuffer:
    """structlog "logger" that collects the rendered lines (ASCII bytes) for one batched
    write, and the events of the batch that could not be encoded (``(kind name,
    exception)``)."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.failed: list[tuple[str, Exception]] = []

    def msg(self, text: bytes, failed: list[tuple[str, Exception]] | None = None) -> None:
        if text:
            self.lines.append(text)
        if failed:
            self.failed += failed


class Deferred:
    """An optional field's value computed on the writer thread: ``func(arg)``.

    A hook whose field costs real work (``request_added.block_digests`` hashes every
    block of the prompt) queues ``Deferred(func, arg)`` instead of the value; the writer
    calls it while rendering, off the scheduler's thread. A call that raises or
    returns None leaves the field out of the line.
    """

    __slots__ = ("func", "arg")

    def __init__(self, func: Callable[[Any], Any], arg: Any) -> None:
        self.func = func
        self.arg = arg

    def __call__(self) -> Any:
        try:
            return self.func(self.arg)
        except Exception:
            logger.debug("vllm-probe: a deferred field failed", exc_info=True)
            return None


#: id(kind) -> (kind, name, field names, indexes of optional fields). Keyed by id: hashing
#: the frozen EventKind dataclass costs more than rendering the event.
_LAYOUTS: dict[int, tuple[EventKind, str, tuple[str, ...], tuple[int, ...]]] = {}


def _layout(kind: EventKind) -> tuple[EventKind, str, tuple[str, ...], tuple[int, ...]]:
    lay = _LAYOUTS.get(id(kind))
    if lay is None or lay[0] is not kind:
        optional = tuple(i for i, f in enumerate(kind.fields) if f.optional)
        lay = _LAYOUTS[id(kind)] = (kind, kind.name, kind.field_names, optional)
    return lay


def event_dicts(_logger: Any, _name: str, event_dict: MutableMapping[str, Any]) -> dict[str, Any]:
    """Processor: a batch of queued events -> one dict per event, ``event`` first, then
    ``ts``, ``pid``, ``engine``, ``schema`` and the kind's fields in order; optional
    fields whose value is None are left out, :class:`Deferred` ones computed here."""
    pid = event_dict["pid"]
    dicts = []
    for kind, ts, engine, values in event_dict["batch"]:
        _, name, names, optional = _layout(kind)
        if type(values) is not tuple:  # kind.pack(...): its values in field order
            values = astuple(values)
        d = {"event": name, "ts": ts, "pid": pid, "engine": engine, "schema": SCHEMA_VERSION}
        d.update(zip(names, values))
        for i in optional:
            if i < len(values):
                v = values[i]
                if v is None:
                    del d[names[i]]
                elif type(v) is Deferred:
                    v = v()
                    if v is None:
                        del d[names[i]]
                    else:
                        d[names[i]] = v
        dicts.append(d)
    return {"events": dicts}


_SAME_SCALARS = frozenset((str, int, bool, type(None)))


_STR = frozenset((str,))


def _msgspec_agrees(values: Iterable[Any]) -> bool:
    """Whether msgspec writes each of ``values`` as ``json.dumps`` does, strings aside.

    True for ints (any size), bools, None, strings (the caller checks their characters
    on the output), floats that are zero or 1e-4 <= |x| < 1e16 — Python's ``repr``
    switches to an exponent outside that range and msgspec formats those differently
    (``0.00001`` for ``1e-05``, ``1e16`` for ``1e+16``, ``null`` for NaN and
    infinities) — and lists, tuples and str-keyed dicts of such values. False for
    anything else: an Enum, a set, a datetime or bytes are written natively by msgspec
    but handed to ``default`` by ``json.dumps``.
    """
    for v in values:
        t = type(v)
        if t in _SAME_SCALARS:
            continue
        if t is float:
            if 1e-4 <= abs(v) < 1e16 or v == 0.0:
                continue
            return False
        if t is list or t is tuple:
            if v and not _msgspec_agrees(v):
                return False
        elif t is dict:
            if not (set(map(type, v)) <= _STR and _msgspec_agrees(v.values())):
                return False
        else:
            return False
    return True


encode = msgspec.json.Encoder().encode


def dumps(obj: Any, default: Callable[[Any], Any] | None = None, **kw: Any) -> bytes:
    """structlog's serializer: the text of ``json.dumps(obj, default=default, **kw)``, as
    ASCII bytes.

    msgspec encodes, and ``msgspec.json.format(..., indent=0)`` spaces the result as
    ``json.dumps`` does (``", "`` and ``": "``), when that gives the same text: every
    value passes :func:`_msgspec_agrees` and the output is ASCII without DEL
    (``json.dumps`` escapes those as ``\\uXXXX``; msgspec escapes control characters,
    quotes and backslashes alike). Otherwise — a non-ASCII request id, NaN, a float
    outside [1e-4, 1e16), an object for ``default`` — or if msgspec raises, ``json.dumps``
    itself writes it. Raises what ``json.dumps`` raises (e.g. ``TypeError`` for a dict
    with tuple keys).
    """
    if not kw and _msgspec_agrees((obj,)):
        try:
            out = msgspec.json.format(encode(obj), indent=0)
        except Exception:  # e.g. a lone surrogate: json.dumps escapes it, msgspec raises
            out = None
        if out is not None and out.isascii() and b"\x7f" not in out:
            return out
    return json.dumps(obj, default=default, **kw).encode()


class JSONLines:
    """Final processor: each event dict through structlog's ``JSONRenderer``, one per line.

    An event that cannot be encoded (say a value JSON cannot hold) costs that event only:
    the batch is rendered again one event at a time and the failures are passed on.
    """

    def __init__(self) -> None:
        # with a serializer that returns bytes, the renderer returns bytes
        self._render = cast("Callable[[Any, str, Any], bytes]", structlog.processors.JSONRenderer(serializer=dumps))

    def __call__(self, logger: Any, name: str, event_dict: MutableMapping[str, Any]) -> bytes | tuple[Any, ...]:
        render = self._render
        try:
            return b"\n".join([render(logger, name, d) for d in event_dict["events"]])
        except Exception:
            pass
        lines: list[bytes] = []
        failed: list[tuple[str, Exception]] = []
        for d in event_dict["events"]:
            try:
                lines.append(render(logger, name, d))
            except Exception as e:
                failed.append((d.get("event", "?"), e))
        return (b"\n".join(lines),), {"failed": failed}


__all__ = ["Deferred", "JSONLines", "LineBuffer", "QueuedEvent", "encode", "event_dicts"]
