"""Routes: the named, one-way outbound destinations a chart's sends name.

A chart writes ``<send type="myapp:sink" target="joined_records">``: the type is the
router's send type and the target the route's name, which the router resolves against
the host's registry (``RouterConfig.routes``) and never parses. A scope may override a
route's configuration (``RouterConfig.route_overrides``), never its existence.

A :class:`Route` is handed its configuration, the built event, the
:class:`IdempotencyKey` the router composed, the open transaction of the delivery
that sent (``None`` on a live session) and the scope the route was resolved in (the
delivery's; ``None`` when it has none). It hands off durably, or returns
:class:`~statifier.persistence.Refused` (the sender hears ``error.communication``);
what it raises rolls the delivery back.

>>> key = IdempotencyKey("ex_1", send_id="book", macrostep=3, microstep=1, round=0,
...                      content_index=7, ordinal=2)
>>> str(key)
'ex_1/book/3/1/0/7/2'
>>> str(IdempotencyKey("ex_1/pay", send_id=None, macrostep=4, microstep=2, round=0,
...                    content_index=None, ordinal=None))
'ex_1%2Fpay/%/4/2/0/%/%'
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from types import MappingProxyType
from typing import Any, Protocol
from urllib.parse import quote

from statifier.core import Event
from statifier.persistence import Refused
from statifier.persistence.sql import SqlTransaction

__all__ = ["IdempotencyKey", "Route", "RouteEntry"]

_NONE = "%"
"""How a missing component is written: a quoted part never is a lone ``%``."""


@dataclass(frozen=True, slots=True)
class IdempotencyKey:
    """Which send a hand-off is, composed from the effect's deterministic identity.

    A re-driven step re-emits the same sends with the same fields, so a repeat of one
    send carries the same key, and a route that inserts once per key hands it off once.

    Attributes:
        scope: the execution id at the executor seam, the session id on a live session.
        send_id: the send's id (``None`` for the ``on_complete`` hand-off).
        macrostep, microstep, round: where in the step the send sat.
        content_index: the ``<send>`` element's place in the chart (``None`` for
            ``on_complete``); it names the element, and so its owner, chart-wide.
        ordinal: the effect's place among the call's effects (``None`` for
            ``on_complete``); it separates two iterations of a ``<foreach>``.

    ``str(key)`` is the one stable string form: the parts joined by ``/``, each string
    percent-quoted, each missing part a lone ``%``.
    """

    scope: str
    _: KW_ONLY
    send_id: str | None
    macrostep: int
    microstep: int
    round: int
    content_index: int | None
    ordinal: int | None

    def __str__(self) -> str:
        parts = (
            self.scope,
            self.send_id,
            self.macrostep,
            self.microstep,
            self.round,
            self.content_index,
            self.ordinal,
        )
        return "/".join(_part(part) for part in parts)


def _part(value: str | int | None) -> str:
    if value is None:
        return _NONE
    if isinstance(value, int):
        return str(value)
    return quote(value, safe="")


class Route(Protocol):
    """A one-way outbound destination.

    ``deliver`` runs inside the delivery's transaction (``tx``), under the sending
    execution's lock, so it may only hand off durably: a row written on ``tx.driver``
    commits with the step that sent and rolls back with it. It must never call back
    into the sending execution: such a call is refused at once with
    :class:`~statifier.persistence.ReentrantCall`. On a live session ``tx`` is ``None``
    and ``deliver`` may be called more than once for one send, always under the same
    key. ``scope`` is the scope the route was resolved in (the delivery's, the timer's,
    or a live session's processor scope), so a sink can answer into the same scope.

    Returns ``None`` (handed off) or :class:`~statifier.persistence.Refused` (not
    handed off: the sender hears ``error.communication``); a plain function or a
    coroutine function.
    """

    def deliver(
        self,
        config: Mapping[str, Any],
        event: Event,
        key: IdempotencyKey,
        tx: SqlTransaction | None,
        scope: str | None,
    ) -> Awaitable[Refused | None] | Refused | None: ...


@dataclass(frozen=True, slots=True)
class RouteEntry:
    """A registered route: the adapter and its configuration (read-only)."""

    adapter: Route
    config: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "config", MappingProxyType(dict(self.config)))

    def overridden(self, config: Mapping[str, Any] | None) -> Mapping[str, Any]:
        """The configuration a scope's override gives, over this one's."""
        if not config:
            return self.config
        return MappingProxyType({**self.config, **config})
