"""The timer queue: where a durable execution's delayed sends wait for their due time.

At the executor seam the router turns every delayed send of a durable execution (and
every send to the execution itself, with no delay) into a :class:`TimerEntry` on the
configuration's :class:`TimerQueue`, inside the delivery's transaction, and turns a
``<cancel>`` into :meth:`TimerQueue.cancel`. The built-in queue is a table on the same
database (:mod:`statifier.router.timers`); a host may plug its own.

The two keys are not one key: a cancel names ``(execution_id, send_id)``, which every
pending send of that id shares; ``key`` (the send's composed
:class:`~statifier.router.routes.IdempotencyKey`) makes a redriven step's schedule
insert once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Protocol

from statifier.core import Event
from statifier.persistence.sql import SqlTransaction
from statifier.router.routes import IdempotencyKey

__all__ = ["TimerEntry", "TimerKind", "TimerQueue"]


class TimerKind(StrEnum):
    """What firing a timer does."""

    EXTERNAL = "external"
    """Step ``event`` into the execution as an external event."""
    INTERNAL = "internal"
    """Step ``event`` into the execution on its internal queue (``#_internal``)."""
    ROUTE = "route"
    """Hand ``event`` to the route ``route`` (resolved in ``scope``) under ``key``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TimerEntry:
    """One pending delayed send.

    Attributes:
        execution_id: the execution that sent it (the cancel scope).
        send_id: the send's id (the other half of the cancel key).
        key: the send's composed idempotency key; ``str(key)`` is the dedup key.
        due_at: when it fires.
        step_position: the send's place among its step's effects: timers due at
            the same time fire in this order.
        kind: what firing does.
        event: the event it delivers.
        route: for :attr:`TimerKind.ROUTE`, the route's name.
        scope: for :attr:`TimerKind.ROUTE`, the scope the route resolves in.
        attempts: for :attr:`TimerKind.ROUTE`, how many times the route refused it
            already (it is scheduled again, later, until it gives up).
    """

    execution_id: str
    send_id: str
    key: IdempotencyKey
    due_at: datetime
    step_position: int
    kind: TimerKind
    event: Event
    route: str | None = None
    scope: str | None = None
    attempts: int = 0


class TimerQueue(Protocol):
    """A durable queue of delayed sends. Both calls run in the transaction of the
    delivery whose step scheduled or cancelled, so they commit with that step."""

    async def schedule(self, tx: SqlTransaction, entry: TimerEntry) -> None:
        """Hold ``entry`` until it is due, unless an entry with its ``key`` is held
        already (a redriven step schedules once)."""
        ...

    async def cancel(self, tx: SqlTransaction, execution_id: str, send_id: str) -> int:
        """Drop every pending entry of ``(execution_id, send_id)``; answer how many."""
        ...
