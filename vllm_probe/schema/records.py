"""Event records: one msgspec Struct per event kind, generated from :mod:`vllm_probe.schema.events`.

Every reader (:mod:`vllm_probe.runs.reader`) decodes each line into the record of its
kind, and past the reader there are only records: the state model, the summary, the
views and the exporters read attributes. Decoding into a Struct checks each field's JSON
type against the schema, takes about 60 % of the time of decoding a dict (no key
objects, no hashing), and attribute reads are cheaper than ``dict.get`` — what brings
``summary`` over its 300,000 events/s target (docs/performance.md).

A record's kind is its class attribute ``kind`` (the line's ``event``). Every field but
``event``, ``ts`` and ``req_id`` is optional: absent (or null) reads as None, and
``engine`` as 0 (a null ``engine`` through the reader's slow path). Unknown fields are
ignored (a newer schema may add some). A value of the wrong JSON type (a string where
an int belongs, ``true`` for a count) fails validation, and so does a value out of its
range (a negative count, time or step; a share above 1), so no consumer ever does
arithmetic on it.
"""

from __future__ import annotations

from typing import Annotated, Any, NotRequired, TypedDict, Union

import msgspec

from .events import COMMON_FIELDS, KINDS, EventKind, Field

_POSITIVE = msgspec.Meta(ge=1)


class KVGroupSpec(TypedDict):
    """One entry of ``engine_config.kv_cache_group_specs`` (decoded as a dict; a line whose
    entry lacks ``kind`` or ``block_size``, or has a value of the wrong type or out of range,
    fails validation, so no replay builds on it)."""

    kind: str
    block_size: Annotated[int, _POSITIVE]
    sliding_window: NotRequired[Annotated[int, _POSITIVE] | None]
    layers: NotRequired[Annotated[int, _POSITIVE]]
    blocks_per_request: NotRequired[Annotated[int, msgspec.Meta(ge=0)] | None]


_TYPES = {"int": int, "float": float, "string": str, "bool": bool, "list[string]": list[str], "object": Any,
          "list[kv_group]": list[KVGroupSpec]}
#: Values that cannot be negative (counts, sizes, times, steps) or exceed 1 (shares): a
#: line with one out of range fails validation like a wrong type, so no figure is built
#: on it. ``priority`` is any integer (vLLM: lower runs first).
_NON_NEGATIVE = msgspec.Meta(ge=0)
_SHARE = msgspec.Meta(ge=0, le=1)
_SIGNED = {"priority", "temperature", "top_p"}


def _type(field: Field) -> Any:
    """The field's Python type, with its range (:data:`_NON_NEGATIVE`, :data:`_SHARE`)."""
    base = _TYPES[field.type]
    if field.type not in ("int", "float") or field.name in _SIGNED:
        return base
    return Annotated[base, _SHARE if field.unit == "0..1" else _NON_NEGATIVE]


def _struct(kind: EventKind) -> type:
    """The Struct of one :class:`~vllm_probe.schema.events.EventKind`: common fields, then the
    kind's, in schema order. ``gc=False``: an event holds JSON values only, never a cycle."""
    fields: list[tuple[Any, ...]] = [("ts", Annotated[float, _NON_NEGATIVE]), ("pid", int | None, None),
                           ("engine", Annotated[int, _NON_NEGATIVE], 0), ("schema", int | None, None)]
    # a request event without its request id cannot be attributed: it fails validation
    fields += [(f.name, str) if f.name == "req_id" else (f.name, _type(f) | None, None) for f in kind.fields]
    assert [f[0] for f in fields] == [f.name for f in COMMON_FIELDS if f.name != "event"] + list(kind.field_names)
    name = "".join(part.title() for part in kind.name.split("_")) + "Event"
    return msgspec.defstruct(name, fields, tag_field="event", tag=kind.name, kw_only=True, gc=False,
                             module=__name__, namespace={"kind": kind.name})


#: Struct class of each event kind, e.g. ``STRUCTS["step"]`` is ``StepEvent``.
STRUCTS: dict[str, type] = {name: _struct(kind) for name, kind in KINDS.items()}
StepEvent = STRUCTS["step"]
ChunkEvent = STRUCTS["chunk"]
PreemptEvent = STRUCTS["preempt"]
EngineConfigEvent = STRUCTS["engine_config"]
RequestAddedEvent = STRUCTS["request_added"]
RequestFinishedEvent = STRUCTS["request_finished"]
ProbeStatsEvent = STRUCTS["probe_stats"]

#: The union of the generated classes, built at run time: for the decoder, not an annotation.
Event: Any = Union[tuple(STRUCTS.values())]  # noqa: UP007 - a runtime union of the generated classes

#: Decode one JSON line into its kind's Struct. Raises ``msgspec.DecodeError`` (not
#: JSON) or ``msgspec.ValidationError`` (not an object, unknown kind, wrong types).
decode = msgspec.json.Decoder(Event).decode


def from_dict(ev: dict[str, Any]) -> Any | None:
    """The record of an event given as a dict (a decoded line, a hand-made stream);
    None when a field has the wrong type or the kind is unknown."""
    cls = STRUCTS.get(ev.get("event", ""))  # by kind: converting to the union is ~8x slower
    if cls is None:
        return None
    try:
        return msgspec.convert(ev, cls)
    except msgspec.ValidationError:
        return None

