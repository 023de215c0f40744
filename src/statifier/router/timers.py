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
The statements are :class:`statifier.sql.timers.TimerTable`'s; this module says what a
row means.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from statifier.buckets import ALL_BUCKETS
from statifier.core.positions import dump_event, load_event
from statifier.persistence import Unstorable
from statifier.persistence.codec import (
    PLAIN,
    BlobCodec,
    UndecodableBlob,
    opened_json,
    sealed_json,
)
from statifier.persistence.sql import SqlAdapter, SqlTransaction
from statifier.router.routes import IdempotencyKey
from statifier.router.timer_queue import TimerEntry, TimerKind
from statifier.sql.timers import TimerRow, TimerTable

__all__ = ["DueTimer", "SqlTimerQueue", "Taken", "UnreadableTimer"]


@dataclass(frozen=True, slots=True)
class DueTimer:
    """A due row the worker claimed.

    Attributes:
        id: the row's key.
        entry: what the row holds.
        locked: on PostgreSQL, whether the claim got the execution's lock
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
    """What the payload column holds of ``entry``.

    Raises:
        Unstorable: the event cannot be stored (see
            :func:`~statifier.core.positions.dump_event`); nothing was written.
    """
    try:
        event = dump_event(entry.event)
    except (ValueError, RecursionError) as error:
        raise Unstorable(f"the send's event cannot be stored: {error}") from None
    key = entry.key
    return {
        "event": json.loads(event),
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


def _entry(row: TimerRow, codec: BlobCodec) -> TimerEntry:
    execution_id, send_id = row.execution_id, row.send_id
    body = opened_json(codec, row.payload, f"the payload of timer {send_id!r} of {execution_id!r}")
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
        due_at=row.due_at,
        step_position=row.step_position,
        kind=TimerKind(row.kind),
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
        self.codec = codec
        self.on_schedule: list[Callable[[datetime], None]] = []
        self.table = TimerTable(adapter.tables, adapter.dialect)

    async def schedule(self, tx: SqlTransaction, entry: TimerEntry) -> None:
        """Insert ``entry`` unless a row with its key exists (a redriven step).

        Raises:
            Unstorable: the entry's event cannot be stored (its data too large,
                nested too deep, or holding a value a stored event cannot keep);
                nothing was written.
        """
        await self.table.insert(
            tx.driver,
            execution_id=entry.execution_id,
            send_id=entry.send_id,
            dedup_key=str(entry.key),
            kind=entry.kind.value,
            due_at=entry.due_at,
            step_position=entry.step_position,
            payload=sealed_json(self.codec, json.dumps(_payload(entry))),
            now=datetime.now(UTC),
        )
        for wake in self.on_schedule:
            wake(entry.due_at)

    async def cancel(self, tx: SqlTransaction, execution_id: str, send_id: str) -> int:
        """Delete every row of ``(execution_id, send_id)``; answer how many."""
        return await self.table.delete_send(tx.driver, execution_id, send_id)

    async def take_due(
        self,
        tx: SqlTransaction,
        now: datetime,
        limit: int,
        buckets: tuple[int, int] = ALL_BUCKETS,
    ) -> Taken:
        """Delete at most ``limit`` rows of the executions of ``buckets`` (by default
        every bucket) due at ``now`` in one statement and answer them, in firing order;
        ``tx`` fires them (a rollback puts them back).

        On PostgreSQL the due rows are locked first (rows other transactions hold are
        skipped) and each execution's lock tried once; only the rows whose lock was
        granted are deleted, and of those not one that an earlier row of its
        execution, held by another transaction, precedes (one execution's timers fire
        in order). The locks are held until ``tx`` ends, those of the rows left too.

        Raises:
            UndecodableBlob: a taken row's payload cannot be decoded.
        """
        taken = await self.table.take_due(tx.driver, now, limit, buckets)
        codec = self.codec
        timers = [DueTimer(row.id, _entry(row, codec), True) for row in taken.rows]
        return Taken(timers, taken.picked, taken.upcoming)

    async def claim(
        self,
        tx: SqlTransaction,
        now: datetime,
        limit: int,
        buckets: tuple[int, int] = ALL_BUCKETS,
    ) -> list[DueTimer | UnreadableTimer]:
        """At most ``limit`` rows of ``buckets`` due at ``now``, in firing order; a row
        whose payload the codec cannot decode is returned as an :class:`UnreadableTimer` (where
        :meth:`take_due` raises), so that one row does not hold up the others.

        On PostgreSQL each row is locked (rows other transactions hold are skipped)
        and its execution's lock tried: both are held until ``tx`` ends. A
        row is ``locked`` only if the lock was granted and no earlier row of its
        execution is held by another transaction.
        """
        found = await self.table.claim(tx.driver, now, limit, buckets)
        return [self._claimed(row) for row in found]

    def _claimed(self, row: TimerRow) -> DueTimer | UnreadableTimer:
        try:
            return DueTimer(row.id, _entry(row, self.codec), row.locked)
        except UndecodableBlob as error:
            return UnreadableTimer(
                row.id,
                row.execution_id,
                row.send_id,
                TimerKind(row.kind),
                row.due_at,
                row.locked,
                error,
            )

    async def take(self, tx: SqlTransaction, timer_id: Any) -> bool:
        """Delete the claimed row ``timer_id``; returns whether it was still there."""
        return await self.table.delete(tx.driver, timer_id)

    async def retry_at(self, tx: SqlTransaction, timer_id: Any, due_at: datetime) -> None:
        """Make the row ``timer_id`` due at ``due_at`` instead."""
        await self.table.move(tx.driver, timer_id, due_at)

    async def upcoming(
        self, tx: SqlTransaction, now: datetime, buckets: tuple[int, int] = ALL_BUCKETS
    ) -> datetime | None:
        """The earliest due time after ``now`` of any row of ``buckets``, or ``None``."""
        return await self.table.upcoming(tx.driver, now, buckets)

    async def pending(
        self, tx: SqlTransaction, execution_id: str, limit: int = 100
    ) -> list[DueTimer | UnreadableTimer]:
        """The execution's pending timers (at most ``limit``), in firing order, read
        without locking them (``locked`` says nothing here)."""
        rows = await self.table.of_execution(tx.driver, execution_id, limit)
        return [self._claimed(row) for row in rows]

    async def pending_many(
        self, tx: SqlTransaction, execution_ids: Sequence[str], limit: int = 100
    ) -> dict[str, list[DueTimer | UnreadableTimer]]:
        """:meth:`pending` for each of ``execution_ids`` (at most ``limit`` each), in one
        statement; an execution without a pending timer is absent."""
        found: dict[str, list[DueTimer | UnreadableTimer]] = {}
        for row in await self.table.of_executions(tx.driver, execution_ids, limit):
            found.setdefault(row.execution_id, []).append(self._claimed(row))
        return found

    async def next_due(
        self, tx: SqlTransaction, buckets: tuple[int, int] = ALL_BUCKETS
    ) -> datetime | None:
        """The earliest due time of any row of ``buckets``, or ``None`` when there is
        none."""
        return await self.table.next_due(tx.driver, buckets)
