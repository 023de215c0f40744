"""The built-in timer queue: the ``timers`` table on the router's own database.

A row is one pending delayed send (a :class:`~statifier.router.timer_queue.TimerEntry`).
Scheduling inserts it in the delivery's transaction, once per dedup key; a cancel
deletes the execution's rows for the send id in the cancelling step's transaction; the
worker (:mod:`statifier.router.timer_worker`) takes due rows off the table in the
transaction that fires them: :meth:`SqlTimerQueue.take_due` deletes a batch in one
statement, and :meth:`SqlTimerQueue.claim` with :meth:`SqlTimerQueue.take` lock rows
and delete them one at a time (the worker's fallback). Whichever of a cancel and a fire
deletes a row first wins: the other deletes nothing.

The payload column holds what the other columns do not: the event, the route, scope and
attempts of a route timer, and the idempotency key's parts (``dedup_key`` is only its string
form). With a blob codec (the configuration storage's), the payload is stored in the
codec's sealed form (:func:`~statifier.persistence.codec.sealed_json`): the event's
data is the host's, like an input-log entry's. ``inserted_at`` is the database's clock
at the insert on PostgreSQL, the process's UTC clock on SQLite (whose writers are
serialized): it orders timers due at the same instant by when they were scheduled.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from statifier.core.positions import dump_event, load_event
from statifier.persistence.codec import (
    PLAIN,
    BlobCodec,
    UndecodableBlob,
    opened_json,
    sealed_json,
)
from statifier.persistence.sql import SqlAdapter, SqlTransaction
from statifier.persistence.sql.schema import TableNames
from statifier.persistence.sql.sqlite import utc_text, utc_time
from statifier.router.routes import IdempotencyKey
from statifier.router.timer_queue import TimerEntry, TimerKind

__all__ = ["DueTimer", "SqlTimerQueue", "Taken", "UnreadableTimer"]

_ENTRY_COLUMNS = "id, execution_id, send_id, kind, due_at, step_position, payload"
_ORDER = "due_at, inserted_at, step_position, id"
"""The firing order: due time, then scheduling order, then the send's place in its step
(two sends of one step share an insert time on a coarse clock), then the key."""


@dataclass(frozen=True, slots=True)
class DueTimer:
    """A due row the worker claimed.

    Attributes:
        id: the row's key.
        entry: what the row holds.
        locked: on PostgreSQL, whether the claim got the execution's advisory lock
            (without it the row is left for a later pass); always true on SQLite.
    """

    id: Any
    entry: TimerEntry
    locked: bool

    @property
    def execution_id(self) -> str:
        return self.entry.execution_id


@dataclass(frozen=True, slots=True)
class UnreadableTimer:
    """A due row :meth:`SqlTimerQueue.claim` locked but whose payload the codec cannot
    decode (written under a key this process lacks, or damaged): it cannot fire here.
    The worker makes it due again later and reports it; the row itself is kept.

    Attributes:
        id: the row's key.
        execution_id, send_id, kind, due_at: the row's own columns (not sealed).
        locked: as :attr:`DueTimer.locked`.
        error: what decoding the payload raised.
    """

    id: Any
    execution_id: str
    send_id: str
    kind: TimerKind
    due_at: datetime
    locked: bool
    error: UndecodableBlob


@dataclass(frozen=True, slots=True)
class Taken:
    """What :meth:`SqlTimerQueue.take_due` took off the queue.

    Attributes:
        timers: the deleted rows, in firing order, each of an execution whose lock the
            transaction now holds (on PostgreSQL; on SQLite the single writer).
        picked: how many due rows the statement looked at (at most the limit): rows it
            left are held by another worker, or their execution's lock was busy. Fewer
            than the limit means no other due row was free.
        upcoming: the earliest due time after ``now`` of any row, as the statement
            saw the table, or ``None``.
    """

    timers: list[DueTimer]
    picked: int
    upcoming: datetime | None


def _payload(entry: TimerEntry) -> dict[str, Any]:
    key = entry.key
    return {
        "event": json.loads(dump_event(entry.event)),
        "route": entry.route,
        "scope": entry.scope,
        "attempts": entry.attempts,
        "key": {
            "scope": key.scope,
            "send_id": key.send_id,
            "macrostep": key.macrostep,
            "microstep": key.microstep,
            "round": key.round,
            "content_index": key.content_index,
            "ordinal": key.ordinal,
        },
    }


def _entry(row: Sequence[Any], due_at: datetime, codec: BlobCodec) -> TimerEntry:
    _, execution_id, send_id, kind, _, step_position, payload = row[:7]
    body = opened_json(codec, payload, f"the payload of timer {send_id!r} of {execution_id!r}")
    parts = body["key"]
    key = IdempotencyKey(
        parts["scope"],
        send_id=parts["send_id"],
        macrostep=parts["macrostep"],
        microstep=parts["microstep"],
        round=parts["round"],
        content_index=parts["content_index"],
        ordinal=parts["ordinal"],
    )
    return TimerEntry(
        execution_id=execution_id,
        send_id=send_id,
        key=key,
        due_at=due_at,
        step_position=step_position,
        kind=TimerKind(kind),
        event=load_event(json.dumps(body["event"]).encode()),
        route=body["route"],
        scope=body["scope"],
        attempts=body.get("attempts", 0),
    )


class SqlTimerQueue:
    """The timer queue over the ``timers`` table of ``adapter``'s database.

    Args:
        adapter: the SQL adapter of the router's configuration (its tables name the
            timer table).
        codec: encodes the payloads (the configuration's ``storage.codec``); a payload
            it cannot decode is refused with
            :class:`~statifier.persistence.codec.UndecodableBlob` when it is taken.

    Attributes:
        on_schedule: called with the entry's due time after each insert, in the
            scheduling transaction (before it commits): an in-process worker's
            :meth:`~statifier.router.timer_worker.TimerWorker.wake` goes here. A call
            must not raise or block.
    """

    def __init__(self, adapter: SqlAdapter, codec: BlobCodec = PLAIN) -> None:
        self.postgres = isinstance(adapter.engine, AsyncEngine)
        self.codec = codec
        self.on_schedule: list[Callable[[datetime], None]] = []
        timers = TableNames.of(adapter.tables).timers
        self.client_keys = adapter.tables.options.key_default

        def mark(name: str) -> str:
            if not self.postgres:
                return f":{name}"
            return f"%({name})s::jsonb" if name == "payload" else f"%({name})s"

        columns = [
            "execution_id",
            "send_id",
            "dedup_key",
            "kind",
            "due_at",
            "step_position",
            "payload",
            "inserted_at",
        ]
        if self.client_keys:
            columns.insert(0, "id")
        values = [mark(c) for c in columns]
        if self.postgres:
            # The server's clock, read at the insert: it orders the schedules of
            # every process and machine on one clock.
            values[columns.index("inserted_at")] = "clock_timestamp()"
        self._schedule = (
            f"INSERT INTO {timers} ({', '.join(columns)}) VALUES "
            f"({', '.join(values)}) ON CONFLICT (dedup_key) DO NOTHING"
        )
        self._cancel = (
            f"DELETE FROM {timers} WHERE execution_id = {mark('execution_id')} "
            f"AND send_id = {mark('send_id')}"
        )
        if self.postgres:
            # Rows another worker holds are skipped, never waited for; the execution's
            # lock is only tried: a step that holds it may be deleting these rows (a
            # cancel) and wait for the row locks taken here. The lock is tried once an
            # execution, so its rows are all granted or none; and a row waits while an
            # earlier row of its execution is held elsewhere (skipped here: another
            # worker's claim that did not get the lock), so that one execution's timers
            # never fire out of order.
            order = ", ".join(f"p.{c}" for c in _ORDER.split(", "))
            earlier = ", ".join(f"e.{c}" for c in _ORDER.split(", "))
            locked = (
                "locked AS MATERIALIZED (SELECT execution_id FROM "
                "(SELECT DISTINCT execution_id FROM picked) AS d "
                "WHERE pg_try_advisory_xact_lock(hashtextextended(execution_id, 0)))"
            )
            ready = (
                "p.execution_id IN (SELECT execution_id FROM locked) "
                f"AND NOT EXISTS (SELECT 1 FROM {timers} AS e "
                f"WHERE e.execution_id = p.execution_id AND ({earlier}) < ({order}) "
                "AND e.id NOT IN (SELECT id FROM picked))"
            )
            taken_columns = ", ".join(f"taken.{c}" for c in _ENTRY_COLUMNS.split(", "))
            # One row even when nothing is taken: it carries the counts.
            self._take_due = (
                f"WITH picked AS MATERIALIZED (SELECT id, execution_id, due_at, inserted_at, "
                f"step_position FROM {timers} "
                f"WHERE due_at <= %(now)s ORDER BY {_ORDER} LIMIT %(limit)s "
                f"FOR UPDATE SKIP LOCKED), {locked}, "
                f"granted AS MATERIALIZED (SELECT p.id FROM picked AS p WHERE {ready}), "
                f"taken AS (DELETE FROM {timers} AS t USING granted WHERE t.id = granted.id "
                f"RETURNING {', '.join(f't.{c}' for c in _ENTRY_COLUMNS.split(', '))}, "
                "t.inserted_at) "
                f"SELECT {taken_columns}, (SELECT count(*) FROM picked), "
                f"(SELECT min(due_at) FROM {timers} WHERE due_at > %(now)s) "
                "FROM (SELECT 1) AS one LEFT JOIN taken ON true "
                f"ORDER BY {', '.join(f'taken.{c}' for c in _ORDER.split(', '))}"
            )
            self._claim = (
                f"WITH picked AS MATERIALIZED (SELECT {_ENTRY_COLUMNS}, inserted_at "
                f"FROM {timers} WHERE due_at <= %(now)s ORDER BY {_ORDER} "
                f"LIMIT %(limit)s FOR UPDATE SKIP LOCKED), {locked} "
                f"SELECT {', '.join(f'p.{c}' for c in _ENTRY_COLUMNS.split(', '))}, {ready} "
                f"FROM picked AS p ORDER BY {order}"
            )
        else:
            # RETURNING comes in no promised order: take_due sorts.
            self._take_due = (
                f"DELETE FROM {timers} WHERE id IN (SELECT id FROM {timers} "
                f"WHERE due_at <= :now ORDER BY {_ORDER} LIMIT :limit) "
                f"RETURNING {_ENTRY_COLUMNS}, inserted_at"
            )
            self._claim = (
                f"SELECT {_ENTRY_COLUMNS}, 1 FROM {timers} WHERE due_at <= :now "
                f"ORDER BY {_ORDER} LIMIT :limit"
            )
        self._take = f"DELETE FROM {timers} WHERE id = {mark('id')}"
        self._retry = f"UPDATE {timers} SET due_at = {mark('due_at')} WHERE id = {mark('id')}"
        self._next_due = f"SELECT min(due_at) FROM {timers}"
        self._of_execution = (
            f"SELECT {_ENTRY_COLUMNS} FROM {timers} WHERE execution_id = {mark('execution_id')} "
            f"ORDER BY {_ORDER} LIMIT {mark('limit')}"
        )
        self._upcoming = f"SELECT min(due_at) FROM {timers} WHERE due_at > {mark('now')}"

    async def schedule(self, tx: SqlTransaction, entry: TimerEntry) -> None:
        """Insert ``entry`` unless a row with its key exists (a redriven step)."""
        values: dict[str, Any] = {
            "execution_id": entry.execution_id,
            "send_id": entry.send_id,
            "dedup_key": str(entry.key),
            "kind": entry.kind.value,
            "step_position": entry.step_position,
            "payload": sealed_json(self.codec, json.dumps(_payload(entry))),
        }
        if self.postgres:
            if self.client_keys:
                values["id"] = self.client_keys()
            values["due_at"] = entry.due_at
            await tx.driver.execute(self._schedule, values)
        else:
            if self.client_keys:
                values["id"] = self.client_keys().hex
            values["due_at"] = utc_text(entry.due_at)
            values["inserted_at"] = utc_text(datetime.now(UTC))
            tx.driver.execute(self._schedule, values)
        for wake in self.on_schedule:
            wake(entry.due_at)

    async def cancel(self, tx: SqlTransaction, execution_id: str, send_id: str) -> int:
        """Delete every row of ``(execution_id, send_id)``; answer how many."""
        values = {"execution_id": execution_id, "send_id": send_id}
        if self.postgres:
            cursor = await tx.driver.execute(self._cancel, values)
            return int(cursor.rowcount)
        return int(tx.driver.execute(self._cancel, values).rowcount)

    async def take_due(self, tx: SqlTransaction, now: datetime, limit: int) -> Taken:
        """Delete at most ``limit`` rows due at ``now`` in one statement and answer them,
        in firing order; ``tx`` fires them (a rollback puts them back).

        On PostgreSQL the due rows are locked first (rows other transactions hold are
        skipped) and each execution's lock tried once; only the rows whose lock was
        granted are deleted, and of those not one that an earlier row of its
        execution, held by another transaction, precedes (one execution's timers fire
        in order). The locks are held until ``tx`` ends, those of the rows left too.
        """
        if self.postgres:
            cursor = await tx.driver.execute(self._take_due, {"now": now, "limit": limit})
            rows = await cursor.fetchall()
            codec = self.codec
            timers = [
                DueTimer(row[0], _entry(row, row[4], codec), True)
                for row in rows
                if row[0] is not None
            ]
            return Taken(timers, int(rows[0][7]), rows[0][8])
        at = utc_text(now)
        found = tx.driver.execute(self._take_due, {"now": at, "limit": limit}).fetchall()
        rows = sorted(found, key=_firing_order)
        timers = [DueTimer(row[0], _entry(row, _aware(row[4]), self.codec), True) for row in rows]
        return Taken(timers, len(timers), await self.upcoming(tx, now))

    async def claim(
        self, tx: SqlTransaction, now: datetime, limit: int
    ) -> list[DueTimer | UnreadableTimer]:
        """At most ``limit`` rows due at ``now``, in firing order; a row whose payload
        the codec cannot decode is answered as an :class:`UnreadableTimer` (where
        :meth:`take_due` raises), so that one row does not hold up the others.

        On PostgreSQL each row is locked (rows other transactions hold are skipped)
        and its execution's advisory lock tried: both are held until ``tx`` ends. A
        row is ``locked`` only if the lock was granted and no earlier row of its
        execution is held by another transaction.
        """
        if self.postgres:
            cursor = await tx.driver.execute(self._claim, {"now": now, "limit": limit})
            return [self._claimed(row, row[4], bool(row[7])) for row in await cursor.fetchall()]
        rows = tx.driver.execute(self._claim, {"now": utc_text(now), "limit": limit}).fetchall()
        return [self._claimed(row, _aware(row[4]), True) for row in rows]

    def _claimed(
        self, row: Sequence[Any], due_at: datetime, locked: bool
    ) -> DueTimer | UnreadableTimer:
        try:
            return DueTimer(row[0], _entry(row, due_at, self.codec), locked)
        except UndecodableBlob as error:
            timer_id, execution_id, send_id, kind = row[:4]
            return UnreadableTimer(
                timer_id, execution_id, send_id, TimerKind(kind), due_at, locked, error
            )

    async def take(self, tx: SqlTransaction, timer_id: Any) -> bool:
        """Delete the claimed row ``timer_id``; answers whether it was still there."""
        if self.postgres:
            cursor = await tx.driver.execute(self._take, {"id": timer_id})
            return int(cursor.rowcount) == 1
        return int(tx.driver.execute(self._take, {"id": timer_id}).rowcount) == 1

    async def retry_at(self, tx: SqlTransaction, timer_id: Any, due_at: datetime) -> None:
        """Make the row ``timer_id`` due at ``due_at`` instead."""
        if self.postgres:
            await tx.driver.execute(self._retry, {"id": timer_id, "due_at": due_at})
        else:
            tx.driver.execute(self._retry, {"id": timer_id, "due_at": utc_text(due_at)})

    async def upcoming(self, tx: SqlTransaction, now: datetime) -> datetime | None:
        """The earliest due time after ``now`` of any row, or ``None``."""
        if self.postgres:
            cursor = await tx.driver.execute(self._upcoming, {"now": now})
            row = await cursor.fetchone()
            return None if row is None else row[0]
        (text,) = tx.driver.execute(self._upcoming, {"now": utc_text(now)}).fetchone()
        return utc_time(text)

    async def pending(
        self, tx: SqlTransaction, execution_id: str, limit: int = 100
    ) -> list[DueTimer | UnreadableTimer]:
        """The execution's pending timers (at most ``limit``), in firing order, read
        without locking them (``locked`` says nothing here)."""
        values = {"execution_id": execution_id, "limit": limit}
        if self.postgres:
            cursor = await tx.driver.execute(self._of_execution, values)
            return [self._claimed(row, row[4], False) for row in await cursor.fetchall()]
        rows = tx.driver.execute(self._of_execution, values).fetchall()
        return [self._claimed(row, _aware(row[4]), False) for row in rows]

    async def next_due(self, tx: SqlTransaction) -> datetime | None:
        """The earliest due time of any row, or ``None`` when the table is empty."""
        if self.postgres:
            cursor = await tx.driver.execute(self._next_due)
            row = await cursor.fetchone()
            return None if row is None else row[0]
        (text,) = tx.driver.execute(self._next_due).fetchone()
        return utc_time(text)


def _firing_order(row: Sequence[Any]) -> tuple[Any, ...]:
    """A SQLite row's place in the firing order (its times are sortable text)."""
    return (row[4], row[7], row[5], row[0])


def _aware(text: str) -> datetime:
    value = utc_time(text)
    assert value is not None  # due_at is NOT NULL
    return value
