"""Events: what a chart reacts to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

from statifier.expr import UNDEFINED, Value

__all__ = ["Event", "EventType"]

EventType: TypeAlias = Literal["external", "internal", "platform"]


@dataclass(frozen=True, slots=True)
class Event:
    """An event. ``data`` defaults to undefined, which is not the same as ``None`` (null).

    ``type`` records provenance: ``external`` events come from outside (one per
    :func:`~statifier.core.handle_event` call), ``internal`` ones from ``<raise>`` and
    sends to ``#_internal``, ``platform`` ones from the engine (``error.execution``,
    ``done.state.*``). ``sendid``, ``origin``, ``origintype`` and ``invokeid`` follow the
    SCXML event fields.

    >>> Event("order.placed", data={"id": 7}).as_value()["data"]
    {'id': 7}
    """

    name: str
    type: EventType = "external"
    data: Value = UNDEFINED
    sendid: str | None = None
    origin: str | None = None
    origintype: str | None = None
    invokeid: str | None = None

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
