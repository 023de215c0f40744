"""What the console's action buttons do, through the library's own APIs.

Each function takes the router's configuration of the database the console shows and
a :data:`Record`, and returns a :class:`Done` (what happened, in one line for the page
and the audit row) or raises :class:`Refused` (nothing to do: the execution has ended,
the dead letter is gone...). Anything else raised is a failure the page reports.

A done action calls ``record`` inside its own transaction, after its statements and
before the commit: the console writes the action's ``done`` audit row there
(:meth:`statifier.console.audit.Audit.record_in`), so the act and its row commit
together or not at all. If ``record`` raises, the action is rolled back with it. A
refused action has written nothing and calls no ``record``.

- :func:`cancel`: :meth:`statifier.persistence.Executions.cancel` inside a router
  transaction (under the execution's lock; the cancel's effects go through the
  router's own executor, so timers are deleted and sends land in the outbox); what it
  held while paused is dropped.
- :func:`pause` and :func:`resume`: :meth:`statifier.persistence.Executions.pause`
  inside a router transaction, and :meth:`statifier.router.Router.resume` (which steps
  in what was held, recording in its transaction).
- :func:`migrate_to` makes the action that moves an execution onto a stored revision:
  :meth:`statifier.persistence.Executions.migrate` inside a router transaction.
- :func:`retry_outbox`: :meth:`statifier.router.OutboxDrain.retry_dead_in` of one row;
  :func:`retry_dead_letters`: of every dead row one execution sent.
- :func:`discard_outbox`: deletes one dead-lettered outbox row (never a pending one).
- :func:`retry_consumer`: routes a consumer dead letter's event again with
  :meth:`statifier.router.Router.route` (the router's dedupe finds a message already
  delivered ``duplicate``), then deletes the dead letter and records, in one
  transaction after the routing (the routing cannot join it: see the function).
- :func:`discard_consumer`: deletes one consumer dead letter.
- :func:`rotate`: :func:`statifier.router.locations.rotate_location_in`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from statifier.chart import Machine
from statifier.expr import Value
from statifier.extras import MissingExtra
from statifier.persistence import (
    Discarded,
    ExecutionNotFound,
    MigrationPlan,
    Parked,
    StepError,
    UndecodableBlob,
)
from statifier.persistence.sql import SqlTransaction
from statifier.router import (
    ConfigError,
    InboundEvent,
    OutboxDrain,
    Resumed,
    Router,
    RouterError,
    ShardedRouter,
)
from statifier.router.locations import NoLocation, rotate_location_in
from statifier.router.transaction import Delivering
from statifier.sql.dead_letters import DeadLetterTable
from statifier.sql.engines import run_on
from statifier.sql.outbox import OutboxTable
from statifier.sql.tables import Tables

try:
    import sqlalchemy as sa
except ModuleNotFoundError as missing:  # SQLAlchemy: the sqlite extra
    raise MissingExtra.of(missing) from missing

__all__ = [
    "Action",
    "Done",
    "Record",
    "Refused",
    "cancel",
    "discard_consumer",
    "discard_outbox",
    "migrate_to",
    "pause",
    "resume",
    "retry_consumer",
    "retry_dead_letters",
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
        parked: a migration that could not carry the execution's position and parked
            it (``needs_migration``) instead: a change, recorded, but not the one asked.
        raised: a resume: the error events its held events raised that no transition
            took, in order (what makes ``statifier executions resume`` exit 1).
    """

    summary: str
    secret: str | None = None
    parked: bool = False
    raised: tuple[StepError, ...] = ()


Record = Callable[[SqlTransaction, Done], Awaitable[object]]
"""Writes what a done action must leave beside it (the console: its audit row) inside
the action's transaction, given that transaction and the action's :class:`Done`. It
runs after the action's statements and before the commit; what it raises rolls the
action back and leaves the action's function."""


class Action(Protocol):
    """An action on one execution (:func:`cancel`, :func:`pause`, :func:`resume`)."""

    async def __call__(self, router: Router, execution_id: str, *, record: Record) -> Done: ...


def row_id(tables: Tables, text: str) -> int | uuid.UUID | str:
    """A row key as a URL carries it: an integer, or a UUID or text when the tables use them.

    Raises:
        Refused: ``text`` is neither.
    """
    try:
        return tables.options.key_from_text(text)
    except ValueError:
        raise Refused(f"{text[:40]!r} is not a row id") from None


async def cancel(router: Router, execution_id: str, *, record: Record) -> Done:
    """Cancel ``execution_id`` (and the durable children it started), and drop what was
    held for it while paused, ``record`` in the same router transaction.

    Raises:
        Refused: no such execution, or it has ended already (nothing written).
    """
    done = Done(f"cancelled execution {execution_id!r}")
    async with router.transaction() as unit:
        # Sends of the exit handlers resolve in no scope, timed from now.
        executions = unit.executions(Delivering(None, router.storage.clock()))
        try:
            answer = await executions.cancel(execution_id)
        except ExecutionNotFound:
            raise Refused(f"no execution {execution_id!r}") from None
        if isinstance(answer, Discarded):
            status = answer.execution.status.value
            raise Refused(f"execution {execution_id!r} has ended already ({status})")
        # What a paused execution held goes with it, as later events would be discarded.
        await unit.sql.drop_held(execution_id)
        await record(unit.tx, done)
    return done


async def pause(router: Router, execution_id: str, *, record: Record) -> Done:
    """Pause ``execution_id``: until it resumes, what is sent to it and its timers
    that come due are held, in order (:mod:`statifier.router.pausing`); ``record`` in
    the same router transaction.

    Raises:
        Refused: no such execution, or it is not active (nothing written).
    """
    done = Done(f"paused execution {execution_id!r}")
    async with router.transaction() as unit:
        lifecycle = unit.executions(Delivering(None, router.storage.clock()))
        try:
            answer = await lifecycle.pause(execution_id)
        except ExecutionNotFound:
            raise Refused(f"no execution {execution_id!r}") from None
        if isinstance(answer, Discarded):
            status = answer.execution.status.value
            raise Refused(f"execution {execution_id!r} is not active ({status})")
        await record(unit.tx, done)
    return done


async def resume(router: Router, execution_id: str, *, record: Record) -> Done:
    """Resume the paused ``execution_id`` and step in what it held, oldest first
    (:meth:`statifier.router.Router.resume`); ``record`` in the same transaction.

    Raises:
        Refused: no such execution, or it is not paused (nothing written).
    """

    async def recorded(tx: SqlTransaction, resumed: Resumed) -> None:
        await record(tx, _resumed(resumed))

    try:
        resumed = await router.resume(execution_id, record=recorded)
    except ExecutionNotFound:
        raise Refused(f"no execution {execution_id!r}") from None
    if resumed is None:
        found = await router.storage.find_execution(execution_id)
        status = "gone" if found is None else found.status.value
        raise Refused(f"execution {execution_id!r} is not paused ({status})")
    return _resumed(resumed)


def _resumed(resumed: Resumed) -> Done:
    said = f"resumed execution {resumed.execution_id!r}: {resumed.stepped} held events stepped in"
    if resumed.discarded:
        said += f", {resumed.discarded} discarded (it ended first)"
    raised = tuple(error for error in resumed.errors if not error.taken)
    if raised:
        events = "error event" if len(raised) == 1 else "error events"
        said += f"; {len(raised)} {events} no transition took, the last {placed(raised[-1])}"
    return Done(said, raised=raised)


def placed(error: StepError) -> str:
    """``error`` as audit rows and a bulk run's row keep it: its name, where the chart
    raised it and whether a transition took it, not its message. The message may quote
    the execution's data, which the execution's errors keep through the storage's
    codec (encrypted when it encrypts); those rows are plain text."""
    return replace(error, message=None).describe()


def migrate_to(
    target: Machine,
    *,
    state_map: Mapping[str, str | None] | None = None,
    data: Mapping[str, Value] | None = None,
) -> Action:
    """The action that moves an execution onto the revision ``target`` (a chart the
    store holds), by state id with ``state_map`` and ``data`` as
    :class:`~statifier.persistence.MigrationPlan` takes them, each execution from the
    revision it runs; ``record`` in the migration's router transaction. One whose
    position the revision cannot carry is parked (``needs_migration``, a paused one
    stays paused), and that is recorded too: the answer says so (:attr:`Done.parked`).

    Raises (the action):
        Refused: no such execution, it has ended, it is on ``target`` already, or it
            runs a chart of another name (not a revision of ``target``'s).
        PersistenceError: the plan does not fit the revision the execution runs
            (:class:`~statifier.persistence.InvalidMigrationPlan`), it runs another
            chart, its lock wait ran out (nothing written).
    """
    target_hash = target.identity.content_hash
    short = target_hash[:12]

    async def migrate(router: Router, execution_id: str, *, record: Record) -> Done:
        found = await router.storage.find_execution(execution_id)
        if found is None:
            raise Refused(f"no execution {execution_id!r}")
        if found.content_hash == target_hash:
            raise Refused(f"execution {execution_id!r} is on revision {short} already")
        if not found.status.pins:
            raise Refused(f"execution {execution_id!r} has ended ({found.status.value})")
        source = await router.storage.machine(found.content_hash)
        if source.identity.name != target.identity.name:  # another chart, not a revision
            raise Refused(
                f"execution {execution_id!r} runs the chart {source.identity.name!r}, "
                f"not {target.identity.name!r}"
            )
        plan = MigrationPlan(source, target, state_map=state_map or {}, data=data or {})
        async with router.transaction() as unit:
            executions = unit.executions(Delivering(None, router.storage.clock()))
            answer = await executions.migrate(execution_id, plan)
            if isinstance(answer, Discarded):  # it moved or ended since it was read
                why = answer.execution.status.value
                raise Refused(f"execution {execution_id!r} was left as it is ({why})")
            if isinstance(answer, Parked):
                done = Done(
                    f"could not migrate execution {execution_id!r} to revision {short}, "
                    f"parked: {answer.reason}",
                    parked=True,
                )
            else:
                done = Done(f"migrated execution {execution_id!r} to revision {short}")
            await record(unit.tx, done)
        return done

    return migrate


async def retry_dead_letters(router: Router, execution_id: str, *, record: Record) -> Done:
    """Re-arm every dead outbox row the execution sent (due at once, a fresh round of
    attempts); ``record`` in the same transaction.

    Raises:
        Refused: the execution has no dead outbox row.
    """
    drain = OutboxDrain(router.storage, {})
    async with router.transaction() as unit:
        count = await drain.retry_dead_in(unit.tx, execution_id=execution_id)
        if count == 0:
            raise Refused(f"execution {execution_id!r} has no dead outbox row")
        done = Done(f"{count} dead outbox rows of execution {execution_id!r} are due again")
        await record(unit.tx, done)
    return done


async def retry_outbox(router: Router, row: int | uuid.UUID | str, *, record: Record) -> Done:
    """Re-arm one dead outbox row: due at once, with a fresh round of attempts;
    ``record`` in the same transaction.

    Raises:
        Refused: no dead row with that id.
    """
    drain = OutboxDrain(router.storage, {})
    done = Done(f"outbox row {row} is due again")
    async with router.transaction() as unit:
        if await drain.retry_dead_in(unit.tx, row_id=row) == 0:
            raise Refused(f"no dead outbox row {row}")
        await record(unit.tx, done)
    return done


async def discard_outbox(router: Router, row: Any, *, record: Record) -> Done:
    """Delete one dead outbox row (a row still pending or sent is left alone);
    ``record`` in the same transaction.

    Raises:
        Refused: no dead row with that id.
    """
    done = Done(f"discarded dead outbox row {row}")
    async with router.transaction() as unit:
        outbox = OutboxTable(router.adapter.tables, router.adapter.dialect)
        if await outbox.delete_dead(unit.tx.driver, row) == 0:
            raise Refused(f"no dead outbox row {row}")
        await record(unit.tx, done)
    return done


async def discard_consumer(router: Router, row: Any, *, record: Record) -> Done:
    """Delete one consumer dead letter; ``record`` in the same transaction.

    Raises:
        Refused: no dead letter with that id.
    """
    done = Done(f"discarded consumer dead letter {row}")
    async with router.transaction() as unit:
        letters = DeadLetterTable(router.adapter.tables, router.adapter.dialect)
        if await letters.delete(unit.tx.driver, row) == 0:
            raise Refused(f"no consumer dead letter {row}")
        await record(unit.tx, done)
    return done


async def retry_consumer(
    router: Router,
    row: Any,
    scopes: Mapping[str, str],
    *,
    record: Record,
    routing: Router | ShardedRouter | None = None,
) -> Done:
    """Route one consumer dead letter's event again, then delete the dead letter and
    ``record``, those two in one transaction.

    The event is read back from the letter's raw bytes: the inbound-events table's
    letters carry the whole event (scope, source, message id, data); a broker's carry
    the data alone, and then the source's scope comes from ``scopes`` (source name to
    its fixed scope, from the service's configuration) and the message id from the
    letter.

    The letter is read and deleted in ``router``'s database; the event is routed by
    ``routing`` (default ``router``): over several stores, the
    :class:`~statifier.router.ShardedRouter`, since the event's addresses may lie in
    other stores than the letter.

    The routing is :meth:`statifier.router.Router.route`, which opens transactions of its own
    (one per binding the event matches) and cannot join the delete's: it stays the
    router's one way in, with its locks and its dedupe. The dedupe is what makes the
    order safe: if the process dies after the routing and before the delete, the
    letter and no audit row remain, and a second retry is found ``duplicate`` by
    every binding the first one reached (within the bindings' dedupe horizon). A
    letter deleted meanwhile by another operator is not a refusal: the event was
    routed, and the action is recorded as done.

    Raises:
        Refused: no such letter, or its event cannot be read back (malformed, no
            message id, a source whose scope is not fixed).
        Exception: the routing failed (the letter stays).
    """
    adapter = router.adapter
    letters = adapter.tables.consumer_dead_letters
    query = sa.select(letters.c.source, letters.c.message_id, letters.c.raw).where(
        letters.c.id == row
    )
    found = await run_on(adapter.engine, lambda connection: connection.execute(query).first())
    if found is None:
        raise Refused(f"no consumer dead letter {row}")
    source, message_id, raw = found
    try:  # the raw bytes are stored encoded under the configuration's codec
        plain = router.storage.codec.decode(bytes(raw))
    except UndecodableBlob as undecodable:
        raise Refused(f"the dead letter's bytes cannot be decoded: {undecodable}") from None
    event = _event(str(source), message_id, plain, scopes)
    routed = await (router if routing is None else routing).route(event)
    outcomes = ", ".join(type(outcome).__name__ for outcome in routed.outcomes) or "no binding"
    done = Done(f"routed consumer dead letter {row} again: {outcomes}")
    async with router.transaction() as unit:
        table = DeadLetterTable(adapter.tables, adapter.dialect)
        await table.delete(unit.tx.driver, row)
        await record(unit.tx, done)
    return done


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


async def rotate(router: Router, execution_id: str, *, record: Record) -> Done:
    """Give ``execution_id`` a new BasicHTTP location; the old one reaches nothing.
    ``record`` runs in the rotation's transaction; the new location is the answer's
    ``secret``, never handed to ``record`` but inside that answer.

    Raises:
        Refused: the console has no BasicHTTP base URL, or the execution has no
            location.
    """
    async with router.transaction() as unit:
        try:
            location = await rotate_location_in(unit, execution_id)
        except (ConfigError, NoLocation) as error:
            raise Refused(str(error)) from None
        done = Done(f"rotated the BasicHTTP location of {execution_id!r}", secret=location)
        await record(unit.tx, done)
    return done
