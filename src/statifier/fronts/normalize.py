"""Streams that do not carry JSON objects: how a source decodes a payload and reads an
event's parts from wherever its producer put them.

A byte stream's source (Kafka, NATS JetStream) turns each payload into the event's
data with its ``decode``: by default the one JSON rule
(:func:`~statifier.fronts.source.json_object`); or a host function of the bytes
answering a mapping (an Avro, Protobuf or MessagePack reader). What a host function
answers is held to the rule the table source applies to what a database hands over
(:func:`~statifier.fronts.source.stored_object`): JSON values only, nested at most
:data:`~statifier.expr.jsontext.MAX_JSON_DEPTH` deep, at most the source's
``max_payload`` bytes as JSON text. So whatever a front takes can be stored, stepped,
shown and sent on as JSON.

Every source then builds the event from its fixed parts (its scope, its source name, a
default message id), unless the host passes ``normalize``: a function of the source's
record as read and the decoded data answering :class:`Normalized`, the data to route
and whichever of scope, message id and source it read from the message (an envelope's
fields, a header). What it leaves ``None`` is the source's own.

A decode or a normalize that raises, or answers something else, makes the message
:class:`~statifier.fronts.source.Malformed` with a reason naming the exception's class
and message; the consumer dead-letters it and its partition moves on.

>>> def envelope(record: object, data: dict) -> Normalized:
...     return Normalized(data["body"], scope=data["tenant"], message_id=data["id"])
>>> normalized_event("r", {"tenant": "acme", "id": "e-1", "body": {"n": 1}}, envelope,
...                  scope=None, source="orders", message_id="orders/0/7")
InboundEvent(scope='acme', source='orders', message_id='e-1', data={'n': 1})
>>> normalized_event("r", {"body": {}}, envelope, scope=None, source="orders",
...                  message_id="orders/0/8")
Malformed(reason="normalize raised KeyError: 'tenant'")
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from statifier.expr import Value
from statifier.fronts.source import Malformed, json_object, stored_object
from statifier.router import InboundEvent, InvalidEvent

__all__ = ["Normalized"]

RecordT = TypeVar("RecordT")


@dataclass(frozen=True, slots=True)
class Normalized:
    """What a source's ``normalize`` makes of a message: the event's data, and the parts
    it read from the message; each part left ``None`` is the source's (its configured
    scope, its default message id, its source name).

    Attributes:
        data: the event's data: a mapping of JSON values (held to the same rule as a
            decoded payload).
        scope: the event's scope.
        message_id: the message's identity, the same on every redelivery of it.
        source: the source name the bindings are chosen by.
    """

    data: Mapping[str, object]
    scope: str | None = None
    message_id: str | None = None
    source: str | None = None


Decode = Callable[[bytes], Mapping[str, object]]
"""A host's reading of a payload: its bytes as a mapping of JSON values; raises (any
exception) when it cannot read them."""
Normalize = Callable[[RecordT, dict[str, Value]], Normalized]
"""A host's reading of a message: the source's record as read and the decoded data, to
the event's parts; raises (any exception) when the message is no event."""


def decoded(
    payload: bytes, decode: Decode | None, *, max_bytes: int, what: str
) -> dict[str, Value] | Malformed:
    """``payload`` as the event's data: by the one JSON rule when ``decode`` is ``None``;
    else what ``decode`` answers, held to the value rule of
    :func:`~statifier.fronts.source.stored_object` and, as JSON text, to ``max_bytes``.
    A payload over ``max_bytes`` is never decoded. Names the bytes ``what``.

    >>> text = lambda payload: {"text": payload.decode()}
    >>> decoded(b"ab", text, max_bytes=64, what="value")
    {'text': 'ab'}
    >>> decoded(b"ab", text, max_bytes=8, what="value")  # {"text": "ab"}: 14 bytes
    Malformed(reason='a decoded value of 14 bytes, over the 8')
    >>> decoded(b"ab", lambda payload: {"raw": payload}, max_bytes=8, what="value").reason
    'the decoded value is not JSON: TypeError: Object of type bytes is not JSON serializable'
    >>> decoded(b"a b", lambda payload: payload.split(), max_bytes=8, what="value")
    Malformed(reason='the decoded value is not a mapping: list')
    >>> decoded(b"\\xff", lambda payload: {"t": payload.decode()}, max_bytes=8, what="value").reason
    "the value could not be decoded: UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff..."
    """
    if decode is None:
        return json_object(payload, max_bytes=max_bytes, what=what)
    if len(payload) > max_bytes:
        return Malformed(f"a {what} of {len(payload)} bytes, over the {max_bytes}")
    try:
        found = decode(payload)
    except Exception as error:  # noqa: BLE001 - the host's function: the message's fault
        return Malformed(f"the {what} could not be decoded: {type(error).__name__}: {error}")
    return _checked(found, max_bytes=max_bytes, what=f"decoded {what}")


def normalized_event(
    record: RecordT,
    data: dict[str, Value],
    normalize: Normalize[RecordT] | None,
    *,
    scope: str | None,
    source: str,
    message_id: str,
    max_bytes: int | None = None,
    failure: str = "normalize raised",
    recheck: bool = True,
) -> InboundEvent | Malformed:
    """The event of a message: ``data`` under the source's ``scope``, ``source`` and
    ``message_id``, or what ``normalize`` answers for ``record`` and ``data`` in their
    place (its data held to the value rule, and to ``max_bytes`` as JSON text). Why
    not, when ``normalize`` raises (the reason begins with ``failure``) or answers
    anything but :class:`Normalized`, or the event's parts are unusable (no scope, an
    empty or over-long id).

    ``recheck=False`` is for a source's own ``normalize`` that hands ``data`` back
    untouched (a shorthand reading only the scope or the id): its data is not held to
    the rule a second time.
    """
    found = Normalized(data)
    if normalize is not None:
        try:
            answer: object = normalize(record, data)
        except Exception as error:  # noqa: BLE001 - the host's function: the message's fault
            return Malformed(f"{failure} {type(error).__name__}: {error}")
        if not isinstance(answer, Normalized):
            return Malformed(f"normalize answered {type(answer).__name__}, not Normalized")
        found = answer
        if recheck or found.data is not data:
            checked = _checked(found.data, max_bytes=max_bytes, what="normalized data")
            if isinstance(checked, Malformed):
                return checked
            data = checked
    chosen = found.scope if found.scope is not None else scope
    if chosen is None:
        return Malformed("no scope: normalize answered none and the source has none")
    try:
        return InboundEvent(
            scope=chosen,
            source=found.source if found.source is not None else source,
            message_id=found.message_id if found.message_id is not None else message_id,
            data=data,
        )
    except InvalidEvent as error:
        return Malformed(str(error))


def _checked(found: object, *, max_bytes: int | None, what: str) -> dict[str, Value] | Malformed:
    """A host function's answer ``found`` as data: a mapping of JSON values, by the
    rule of :func:`~statifier.fronts.source.stored_object` (a copy, so nothing the host
    keeps a hold of changes it later)."""
    if not isinstance(found, Mapping):
        return Malformed(f"the {what} is not a mapping: {type(found).__name__}")
    return stored_object(dict(found), what=what, max_bytes=max_bytes)
