"""What the console's action buttons do, through the library's own APIs.

Each function takes the router's configuration of the database the console shows and
answers a :class:`Done` (what happened, in one line for the page and the audit row) or
raises :class:`Refused` (nothing to do: the execution has ended, the dead letter is
gone...). Anything else raised is a failure the page reports.

- :func:`cancel`: :meth:`statifier.persistence.Executions.cancel` inside a router
  transaction (under the execution's lock; the cancel's effects go through the
  router's own executor, so timers are deleted and sends land in the outbox).
- :func:`retry_outbox`: :meth:`statifier.router.OutboxDrain.retry_dead` of one row.
- :func:`discard_outbox`: deletes one dead-lettered outbox row (never a pending one).
- :func:`retry_consumer`: routes a consumer dead letter's event again with
  :func:`statifier.router.route` (the router's dedupe answers a message already
  delivered ``duplicate``) and deletes the dead letter once it routed.
- :func:`discard_consumer`: deletes one consumer dead letter.
- :func:`rotate`: :func:`statifier.router.locations.rotate_location`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from statifier.persistence import Discarded, ExecutionNotFound, UndecodableBlob
from statifier.router import ConfigError, InboundEvent, OutboxDrain, RouterConfig, route
from statifier.router.errors import RouterError
from statifier.router.locations import NoLocation, rotate_location
from statifier.sql.tables import Tables

__all__ = [
    "Done",
    "Refused",
    "cancel",
    "discard_consumer",
    "discard_outbox",
    "retry_consumer",
    "retry_outbox",
    "rotate",
    "row_id",
]

_ENVELOPE = frozenset({"scope", "source", "message_id", "data"})


class Refused(Exception):  # noqa: N818 - names the answer
    """The action had nothing to act on; ``str()`` says why, in one line."""


@dataclass(frozen=True, slots=True)
class Done:
    """An action that took place.

    Attributes:
        summary: one line for the page and the audit row (never a secret).
        secret: what the operator must see once and nothing may keep (a rotated
            location), else ``None``.
    """

    summary: str
    secret: str | None = None


def row_id(tables: Tables, text: str) -> int | uuid.UUID:
    """A row key as a URL carries it: an integer, or a UUID when the tables use them.

    Raises:
        Refused: ``text`` is neither.
    """
    try:
        if tables.options.key_default is None:
            return int(text)
        return uuid.UUID(text)
    except ValueError:
        raise Refused(f"{text[:40]!r} is not a row id") from None


async def cancel(config: RouterConfig, execution_id: str) -> Done:
    """Cancel ``execution_id`` (and the durable children it started).

    Raises:
        Refused: no such execution, or it has ended already.
    """
    try:
        async with config.transaction() as unit:
            answer = await unit.executions.cancel(execution_id)
    except ExecutionNotFound:
        raise Refused(f"no execution {execution_id!r}") from None
    if isinstance(answer, Discarded):
        status = answer.execution.status.value
        raise Refused(f"execution {execution_id!r} has ended already ({status})")
    return Done(f"cancelled execution {execution_id!r}")


async def retry_outbox(config: RouterConfig, row: int | uuid.UUID) -> Done:
    """Re-arm one dead outbox row: due at once, with a fresh round of attempts.

    Raises:
        Refused: no dead row with that id.
    """
    drain = OutboxDrain(config, {})
    if await drain.retry_dead(row) == 0:
        raise Refused(f"no dead outbox row {row}")
    return Done(f"outbox row {row} is due again")


async def discard_outbox(engine: sa.Engine | AsyncEngine, tables: Tables, row: Any) -> Done:
    """Delete one dead outbox row (a row still pending or sent is left alone).

    Raises:
        Refused: no dead row with that id.
    """
    outbox = tables.outbox
    statement = outbox.delete().where(outbox.c.id == row, outbox.c.dead_at.is_not(None))
    if await _run(engine, statement) == 0:
        raise Refused(f"no dead outbox row {row}")
    return Done(f"discarded dead outbox row {row}")


async def discard_consumer(engine: sa.Engine | AsyncEngine, tables: Tables, row: Any) -> Done:
    """Delete one consumer dead letter.

    Raises:
        Refused: no dead letter with that id.
    """
    letters = tables.consumer_dead_letters
    if await _run(engine, letters.delete().where(letters.c.id == row)) == 0:
        raise Refused(f"no consumer dead letter {row}")
    return Done(f"discarded consumer dead letter {row}")


async def retry_consumer(
    config: RouterConfig,
    engine: sa.Engine | AsyncEngine,
    tables: Tables,
    row: Any,
    scopes: Mapping[str, str],
) -> Done:
    """Route one consumer dead letter's event again, then delete the dead letter.

    The event is read back from the letter's raw bytes: the inbound-events table's
    letters carry the whole event (scope, source, message id, data); a broker's carry
    the data alone, and then the source's scope comes from ``scopes`` (source name to
    its fixed scope, from the service's configuration) and the message id from the
    letter.

    Raises:
        Refused: no such letter, or its event cannot be read back (malformed, no
            message id, a source whose scope is not fixed).
        Exception: the routing failed (the letter stays).
    """
    letters = tables.consumer_dead_letters
    query = sa.select(letters.c.source, letters.c.message_id, letters.c.raw).where(
        letters.c.id == row
    )
    found = await _first(engine, query)
    if found is None:
        raise Refused(f"no consumer dead letter {row}")
    source, message_id, raw = found
    try:  # the raw bytes are stored encoded under the configuration's codec
        plain = config.storage.codec.decode(bytes(raw))
    except UndecodableBlob as undecodable:
        raise Refused(f"the dead letter's bytes cannot be decoded: {undecodable}") from None
    event = _event(str(source), message_id, plain, scopes)
    routed = await route(config, event)
    await _run(engine, letters.delete().where(letters.c.id == row))
    outcomes = ", ".join(type(outcome).__name__ for outcome in routed.outcomes) or "no binding"
    return Done(f"routed consumer dead letter {row} again: {outcomes}")


def _event(
    source: str, message_id: str | None, raw: bytes, scopes: Mapping[str, str]
) -> InboundEvent:
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise Refused("the dead letter's bytes are not a JSON event: discard it") from None
    if not isinstance(data, dict):
        raise Refused("the dead letter's bytes are not a JSON object: discard it")
    try:
        if set(data) == _ENVELOPE:
            return InboundEvent(
                scope=data["scope"],
                source=data["source"],
                message_id=data["message_id"],
                data=data["data"],
            )
        scope = scopes.get(source)
        if scope is None:
            raise Refused(
                f"the scope of source {source!r} is not fixed by the configuration: "
                "the event cannot be routed again from here"
            )
        if message_id is None:
            raise Refused("the dead letter has no message id: discard it")
        return InboundEvent(scope=scope, source=source, message_id=message_id, data=data)
    except RouterError as error:  # InvalidEvent
        raise Refused(f"the dead letter holds no valid event: {error}") from None


async def rotate(config: RouterConfig, execution_id: str) -> Done:
    """Give ``execution_id`` a new BasicHTTP location; the old one reaches nothing.

    Raises:
        Refused: the console has no BasicHTTP base URL, or the execution has no
            location.
    """
    try:
        location = await rotate_location(config, execution_id)
    except (ConfigError, NoLocation) as error:
        raise Refused(str(error)) from None
    return Done(f"rotated the BasicHTTP location of {execution_id!r}", secret=location)


async def _run(engine: sa.Engine | AsyncEngine, statement: sa.Executable) -> int:
    """Run one writing statement in a transaction of its own; answers the rows hit."""
    if isinstance(engine, AsyncEngine):
        async with engine.begin() as connection:
            result = await connection.execute(statement)
    else:
        with engine.begin() as connection:
            result = connection.execute(statement)
    return int(getattr(result, "rowcount", 0))


async def _first(engine: sa.Engine | AsyncEngine, statement: sa.Select[Any]) -> Any:
    if isinstance(engine, AsyncEngine):
        async with engine.connect() as connection:
            return (await connection.execute(statement)).first()
    with engine.connect() as connection:
        return connection.execute(statement).first()
