"""Events: what a chart reacts to, and the type URIs of the SCXML processor that
carries them between charts."""

from __future__ import annotations

import builtins
from dataclasses import KW_ONLY, dataclass
from typing import Final, Literal, NoReturn, TypeAlias

from statifier.expr import UNDEFINED, Value

__all__ = [
    "SCXML_INVOKE_TYPE",
    "SCXML_INVOKE_TYPES",
    "SCXML_PROCESSOR",
    "SCXML_SEND_TYPES",
    "Event",
    "EventType",
    "engine_event",
]

EventType: TypeAlias = Literal["external", "internal", "platform"]

SCXML_PROCESSOR: Final = "http://www.w3.org/TR/scxml/#SCXMLEventProcessor"
"""The SCXML event I/O processor's type URI (``_ioprocessors`` and ``origintype``)."""
SCXML_SEND_TYPES: Final = frozenset({SCXML_PROCESSOR, "scxml"})
"""The ``<send type>`` spellings the SCXML processor answers to (no type means it too)."""
SCXML_INVOKE_TYPE: Final = "http://www.w3.org/TR/scxml/"
"""The SCXML invoke type as every ``Invoke`` effect carries it, whatever the chart
wrote."""
SCXML_INVOKE_TYPES: Final = frozenset(
    {SCXML_INVOKE_TYPE, "http://www.w3.org/TR/scxml", "scxml", SCXML_PROCESSOR}
)
"""The ``<invoke type>`` spellings charts use for an SCXML child (the W3C corpus writes
the URI without its trailing slash too); the core reads each as
:data:`SCXML_INVOKE_TYPE`."""

_EVENT_TYPES: Final = frozenset({"external", "internal", "platform"})
_OPTIONAL_TEXT: Final = ("sendid", "origin", "origintype", "invokeid")
_new: Final = object.__new__
_set: Final = object.__setattr__


@dataclass(frozen=True, slots=True, init=False)
class Event:
    """An event. ``data`` defaults to undefined, which is not the same as ``None`` (null).

    Only the name is positional; every other field is keyword-only, and the fields are
    checked: ``Event("pay", {"amount": 42})`` raises :class:`TypeError` rather than build
    an event whose type is a dict (``docs/decisions/0062``).

    ``type`` records provenance: ``external`` events come from outside (one per
    :func:`~statifier.core.handle_event` call), ``internal`` ones from ``<raise>`` and
    sends to ``#_internal``, ``platform`` ones from the engine (``error.execution``,
    ``done.state.*``). ``sendid``, ``origin``, ``origintype`` and ``invokeid`` follow the
    SCXML event fields.

    >>> Event("order.placed", data={"id": 7}).as_value()["data"]
    {'id': 7}
    >>> Event("order.placed", {"id": 7})
    Traceback (most recent call last):
    ...
    TypeError: Event.__init__() takes 2 positional arguments but 3 were given
    >>> Event("order.placed", type={"id": 7})
    Traceback (most recent call last):
    ...
    TypeError: Event type must be 'external', 'internal' or 'platform', not {'id': 7}

    Raises:
        TypeError: ``name`` is not a non-empty string, ``type`` is not ``"external"``,
            ``"internal"`` or ``"platform"``, or ``sendid``, ``origin``, ``origintype``
            or ``invokeid`` is neither a string nor ``None``; the message names the
            field.
    """

    name: str
    _: KW_ONLY
    type: EventType = "external"
    data: Value = UNDEFINED
    sendid: str | None = None
    origin: str | None = None
    origintype: str | None = None
    invokeid: str | None = None

    def __init__(
        self,
        name: str,
        *,
        type: EventType = "external",  # noqa: A002 - the field's name
        data: Value = UNDEFINED,
        sendid: str | None = None,
        origin: str | None = None,
        origintype: str | None = None,
        invokeid: str | None = None,
    ) -> None:
        # Written out rather than generated with a __post_init__: the checks read
        # arguments, not attributes, so a checked event costs what an unchecked one did.
        kind: object = type
        if (
            name.__class__ is not str
            or not name
            or (kind != "external" and (kind.__class__ is not str or kind not in _EVENT_TYPES))
            or (sendid is not None and sendid.__class__ is not str)
            or (origin is not None and origin.__class__ is not str)
            or (origintype is not None and origintype.__class__ is not str)
            or (invokeid is not None and invokeid.__class__ is not str)
        ):
            _misbuilt(name, kind, sendid, origin, origintype, invokeid)
        _set(self, "name", name)
        _set(self, "type", type)
        _set(self, "data", data)
        _set(self, "sendid", sendid)
        _set(self, "origin", origin)
        _set(self, "origintype", origintype)
        _set(self, "invokeid", invokeid)

    def as_value(self) -> dict[str, Value]:
        """The event as the ``_event`` system variable sees it (absent fields undefined)."""
        return {
            "name": self.name,
            "type": self.type,
            "sendid": UNDEFINED if self.sendid is None else self.sendid,
            "origin": UNDEFINED if self.origin is None else self.origin,
            "origintype": UNDEFINED if self.origintype is None else self.origintype,
            "invokeid": UNDEFINED if self.invokeid is None else self.invokeid,
            "data": self.data,
        }


def _misbuilt(name: object, kind: object, *optional: object) -> NoReturn:
    if not isinstance(name, str):
        raise TypeError(f"Event name must be a str, not {builtins.type(name).__name__}: {name!r}")
    if not name:
        raise TypeError("Event name must be a non-empty str")
    if not isinstance(kind, str) or kind not in _EVENT_TYPES:
        raise TypeError(f"Event type must be 'external', 'internal' or 'platform', not {kind!r}")
    for field, value in zip(_OPTIONAL_TEXT, optional, strict=True):
        if value is not None and not isinstance(value, str):
            kind_name = builtins.type(value).__name__
            raise TypeError(f"Event {field} must be a str or None, not {kind_name}")
    raise TypeError("Event fields must be exact str values, not instances of a str subclass")


def engine_event(
    name: str,
    type: EventType,  # noqa: A002 - the field's name
    data: Value = UNDEFINED,
    sendid: str | None = None,
    origin: str | None = None,
    origintype: str | None = None,
    invokeid: str | None = None,
) -> Event:
    """The engine's one way to build an :class:`Event` without the checks.

    For events the engine makes from what it already holds checked: the names a
    compiled chart raises and sends (a ``<send>`` with only ``<content>`` makes an
    event whose name is empty, which :class:`Event` refuses a caller), the events of a
    stored position, an event copied with a field changed. Positional and unchecked,
    so cheaper than ``Event(...)`` on the interpreter's hot path; hosts build
    ``Event(name, data=..., type=...)``.
    """
    event: Event = _new(Event)
    _set(event, "name", name)
    _set(event, "type", type)
    _set(event, "data", data)
    _set(event, "sendid", sendid)
    _set(event, "origin", origin)
    _set(event, "origintype", origintype)
    _set(event, "invokeid", invokeid)
    return event
