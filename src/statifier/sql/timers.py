"""The statements of the ``timers`` table: pending delayed sends, one row each.

:class:`TimerTable` inserts a row once per dedup key, deletes a send's rows (a cancel),
takes due rows off the table in firing order (one statement for a batch, or a claim
then one delete per row) and reads what is pending. What a row's payload means is the
router's (:mod:`statifier.router.timers`); here it is a JSON document, stored as
given.

The firing order is the due time, then the scheduling order (``inserted_at``), then the
send's place in its step (two sends of one step share an insert time on a coarse
clock), then the key. Where the database locks rows (:attr:`Dialect.row_locks`), a
claim skips the rows another transaction holds and tries each execution's lock
(:mod:`statifier.sql.locks`) once, so that two workers never fire one execution's
timers at once or out of order; on SQLite the transaction is the single writer.

Each row carries its execution's bucket (:func:`statifier.buckets.bucket_of`), and the
take, the claim and the next due time read a range of buckets, ``(start, end)``: the
whole range (:data:`~statifier.buckets.ALL_BUCKETS`) by default, or a part, which the
``(bucket, due_at)`` index serves without a scan of the rest (decision 0121).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from statifier.buckets import ALL_BUCKETS, bucket_of
from statifier.sql.dialect import Dialect, execution_lock_key
from statifier.sql.keys import RowKeys
from statifier.sql.locks import Locks, locks_of
from statifier.sql.names import TableNames
from statifier.sql.ranges import also, by_range, where
from statifier.sql.tables import Tables

__all__ = ["TakenRows", "TimerRow", "TimerTable"]

_COLUMNS: Final = ("id", "execution_id", "send_id", "kind", "due_at", "step_position", "payload")
_ORDER: Final = ("due_at", "inserted_at", "step_position", "id")


def _listed(columns: Sequence[str], alias: str = "") -> str:
    return ", ".join(f"{alias}{column}" for column in columns)


@dataclass(frozen=True, slots=True)
class TimerRow:
    """A row of the timers table as read.

    Attributes:
        id: the row's key.
        execution_id, send_id, kind, step_position: its columns.
        due_at: when it is due (aware, UTC).
        payload: its JSON document, as the driver reads it (a ``dict`` from a
            ``jsonb`` column, text from SQLite).
        locked: whether the transaction that read it holds its execution's lock and no
            earlier row of that execution is held by another transaction: always true on
            SQLite; meaningless for rows read by :meth:`TimerTable.of_execution`.
    """

    id: Any
    execution_id: str
    send_id: str
    kind: str
    due_at: datetime
    step_position: int
    payload: Any
    locked: bool


@dataclass(frozen=True, slots=True)
class TakenRows:
    """What :meth:`TimerTable.take_due` deleted.

    Attributes:
        rows: the deleted rows, in firing order.
        picked: how many due rows the statement looked at (at most the limit).
        upcoming: the earliest due time after ``now`` of any row, or ``None``.
    """

    rows: list[TimerRow]
    picked: int
    upcoming: datetime | None


class TimerTable:
    """The statements of one ``timers`` table on one database, made once.

    Args:
        tables: the tables the migrations built (names the table, and says whether
            keys are made by the client).
        dialect: the database's dialect (``SqlAdapter.dialect``).

    Every method takes the driver's connection of the caller's transaction
    (``tx.driver``) and runs in it.
    """

    def __init__(self, tables: Tables, dialect: Dialect) -> None:
        self.dialect = dialect
        self.keys = keys = RowKeys.of(tables, dialect)
        timers = TableNames.of(tables).timers
        order = _listed(_ORDER)
        order_columns = _listed([column for column in _ORDER if column not in _COLUMNS])
        columns = (
            "execution_id",
            "send_id",
            "dedup_key",
            "lock_key",
            "bucket",
            "kind",
            "due_at",
            "step_position",
            "payload",
            "inserted_at",
        )
        values = {"payload": dialect.json("payload")}
        if dialect.server_clock:
            # The server's clock, read at the insert: it orders the schedules of every
            # process and machine on one clock.
            values["inserted_at"] = dialect.server_clock
        sql = dialect.statement
        self._insert = sql(
            f"{keys.insert(timers, columns, values)} ON CONFLICT (dedup_key) DO NOTHING"
        )
        self._delete_send = sql(
            f"DELETE FROM {timers} WHERE execution_id = :execution_id AND send_id = :send_id"
        )
        self._delete = sql(f"DELETE FROM {timers} WHERE id = :id")
        self._move = sql(f"UPDATE {timers} SET due_at = :due_at WHERE id = :id")
        self._of_execution = sql(
            f"SELECT {_listed(_COLUMNS)}, 0 FROM {timers} WHERE execution_id = :execution_id "
            f"ORDER BY {order} LIMIT :limit"
        )
        self._of_executions = sql(
            f"SELECT {_listed(_COLUMNS)}, 0 FROM (SELECT {_listed(_COLUMNS)}, {order_columns}, "
            f"row_number() OVER (PARTITION BY execution_id ORDER BY {order}) AS nth "
            f"FROM {timers} WHERE execution_id {dialect.among('execution_ids')}) AS ranked "
            f"WHERE nth <= :limit ORDER BY execution_id, {order}"
        )
        locks = locks_of(tables, dialect)
        self._claims = by_range(lambda within: _claims(timers, dialect, locks, within))

    def _row(self, row: Sequence[Any]) -> TimerRow:
        due_at = self.dialect.read_time(row[4])
        assert due_at is not None  # due_at is NOT NULL
        return TimerRow(row[0], row[1], row[2], row[3], due_at, row[5], row[6], bool(row[7]))

    async def insert(
        self,
        driver: Any,
        *,
        execution_id: str,
        send_id: str,
        dedup_key: str,
        kind: str,
        due_at: datetime,
        step_position: int,
        payload: str,
        now: datetime,
    ) -> None:
        """Insert a row unless one with ``dedup_key`` exists (a redriven step).

        ``payload`` is the JSON document's text; ``now`` orders the row among those due
        at the same time where the database has no clock of its own to read.
        """
        dialect = self.dialect
        values: dict[str, Any] = {
            "execution_id": execution_id,
            "send_id": send_id,
            "dedup_key": dedup_key,
            "lock_key": execution_lock_key(execution_id),
            "bucket": bucket_of(execution_id),
            "kind": kind,
            "due_at": dialect.time(due_at),
            "step_position": step_position,
            "payload": payload,
        }
        if not dialect.server_clock:
            values["inserted_at"] = dialect.time(now)
        await dialect.execute(driver, self._insert, self.keys.keyed(values))

    async def delete_send(self, driver: Any, execution_id: str, send_id: str) -> int:
        """Delete every row of ``(execution_id, send_id)``; answer how many."""
        values = {"execution_id": execution_id, "send_id": send_id}
        return await self.dialect.execute(driver, self._delete_send, values)

    async def take_due(
        self,
        driver: Any,
        now: datetime,
        limit: int,
        buckets: tuple[int, int] = ALL_BUCKETS,
    ) -> TakenRows:
        """Delete at most ``limit`` rows of ``buckets`` due at ``now`` in one statement
        and answer them in firing order (and the earliest due time after ``now`` in
        ``buckets``); a rollback of the caller's transaction puts them back.

        Where rows are locked, only the rows whose execution's lock was granted are
        deleted, and of those not one that an earlier row of its execution, held by
        another transaction, precedes; the locks are held until the transaction ends.
        """
        dialect = self.dialect
        claims, within = self._claims.of(buckets)
        values = {"now": dialect.time(now), "limit": limit, **within}
        found = await dialect.rows(driver, claims.take_due, values)
        if dialect.row_locks:
            rows = [self._row(row) for row in found if row[0] is not None]
            return TakenRows(rows, int(found[0][8]), found[0][9])
        found.sort(key=_firing_order)
        rows = [self._row(row) for row in found]
        return TakenRows(rows, len(rows), await self.upcoming(driver, now, buckets))

    async def claim(
        self,
        driver: Any,
        now: datetime,
        limit: int,
        buckets: tuple[int, int] = ALL_BUCKETS,
    ) -> list[TimerRow]:
        """At most ``limit`` rows of ``buckets`` due at ``now``, in firing order, left
        in the table.

        Where rows are locked, each is locked (rows other transactions hold are
        skipped) and its execution's lock tried, both held until the transaction ends;
        a row is :attr:`TimerRow.locked` only if the lock was granted and no earlier row
        of its execution is held by another transaction.
        """
        claims, within = self._claims.of(buckets)
        values = {"now": self.dialect.time(now), "limit": limit, **within}
        return [self._row(row) for row in await self.dialect.rows(driver, claims.claim, values)]

    async def delete(self, driver: Any, timer_id: Any) -> bool:
        """Delete the row ``timer_id``; answer whether it was still there."""
        return await self.dialect.execute(driver, self._delete, {"id": timer_id}) == 1

    async def move(self, driver: Any, timer_id: Any, due_at: datetime) -> None:
        """Make the row ``timer_id`` due at ``due_at`` instead."""
        values = {"id": timer_id, "due_at": self.dialect.time(due_at)}
        await self.dialect.execute(driver, self._move, values)

    async def upcoming(
        self, driver: Any, now: datetime, buckets: tuple[int, int] = ALL_BUCKETS
    ) -> datetime | None:
        """The earliest due time after ``now`` of any row of ``buckets``, or ``None``."""
        claims, within = self._claims.of(buckets)
        values = {"now": self.dialect.time(now), **within}
        row = await self.dialect.row(driver, claims.upcoming, values)
        return None if row is None else self.dialect.read_time(row[0])

    async def of_execution(self, driver: Any, execution_id: str, limit: int) -> list[TimerRow]:
        """The execution's rows (at most ``limit``), in firing order, read without
        locking them."""
        values = {"execution_id": execution_id, "limit": limit}
        return [
            self._row(row) for row in await self.dialect.rows(driver, self._of_execution, values)
        ]

    async def of_executions(
        self, driver: Any, execution_ids: Sequence[str], limit: int
    ) -> list[TimerRow]:
        """The rows of every execution of ``execution_ids`` (at most ``limit`` each) in
        one statement, by execution, each execution's in firing order, read without
        locking them."""
        if not execution_ids:
            return []
        values = {"execution_ids": self.dialect.listed(execution_ids), "limit": limit}
        rows = await self.dialect.rows(driver, self._of_executions, values)
        return [self._row(row) for row in rows]

    async def next_due(
        self, driver: Any, buckets: tuple[int, int] = ALL_BUCKETS
    ) -> datetime | None:
        """The earliest due time of any row of ``buckets``, or ``None`` when there is
        none."""
        claims, within = self._claims.of(buckets)
        row = await self.dialect.row(driver, claims.next_due, within)
        return None if row is None else self.dialect.read_time(row[0])


@dataclass(frozen=True, slots=True)
class _Claims:
    """The statements that read due rows (of every bucket, or of a range)."""

    take_due: str
    claim: str
    upcoming: str
    next_due: str


def _claims(timers: str, dialect: Dialect, locks: Locks | None, within: str) -> _Claims:
    """The statements reading due rows where ``within`` holds too (``""``: every row).

    Where rows are locked, rows another worker holds are skipped, never waited for;
    the execution's lock is only tried: a step that holds it may be deleting these rows
    (a cancel) and wait for the row locks taken here. The lock is tried once an
    execution, so its rows are all granted or none; and a row waits while an earlier
    row of its execution is held elsewhere (skipped here: another worker's claim that
    did not get the lock), so that one execution's timers never fire out of order. The
    key is the row's own, hashed in Python at the insert as every other taker of the
    execution's lock hashes it.
    """
    sql = dialect.statement
    order = _listed(_ORDER)
    due = f"due_at <= :now{also(within)}"
    later = f"SELECT min(due_at) FROM {timers} WHERE due_at > :now{also(within)}"
    next_due = sql(f"SELECT min(due_at) FROM {timers}{where(within)}")
    if locks is not None:
        locked = locks.tried("SELECT DISTINCT lock_key FROM picked", "locked")
        ready = (
            "p.lock_key IN (SELECT key FROM locked) "
            f"AND NOT EXISTS (SELECT 1 FROM {timers} AS e "
            f"WHERE e.execution_id = p.execution_id "
            f"AND ({_listed(_ORDER, 'e.')}) < ({_listed(_ORDER, 'p.')}) "
            "AND e.id NOT IN (SELECT id FROM picked))"
        )
        # One row even when nothing is taken: it carries the counts.
        take_due = sql(
            f"WITH picked AS MATERIALIZED (SELECT id, execution_id, lock_key, due_at, "
            f"inserted_at, step_position FROM {timers} "
            f"WHERE {due} ORDER BY {order} LIMIT :limit "
            f"FOR UPDATE SKIP LOCKED), {locked}, "
            f"granted AS MATERIALIZED (SELECT p.id FROM picked AS p WHERE {ready}), "
            f"taken AS (DELETE FROM {timers} AS t USING granted WHERE t.id = granted.id "
            f"RETURNING {_listed(_COLUMNS, 't.')}, t.inserted_at) "
            f"SELECT {_listed(_COLUMNS, 'taken.')}, true, (SELECT count(*) FROM picked), "
            f"({later}) "
            "FROM (SELECT 1) AS one LEFT JOIN taken ON true "
            f"ORDER BY {_listed(_ORDER, 'taken.')}"
        )
        claim = sql(
            f"WITH picked AS MATERIALIZED (SELECT {_listed(_COLUMNS)}, lock_key, "
            f"inserted_at FROM {timers} WHERE {due} "
            f"ORDER BY {order} LIMIT :limit FOR UPDATE SKIP LOCKED), {locked} "
            f"SELECT {_listed(_COLUMNS, 'p.')}, {ready} "
            f"FROM picked AS p ORDER BY {_listed(_ORDER, 'p.')}"
        )
    else:
        # RETURNING comes in no promised order: take_due sorts.
        take_due = sql(
            f"DELETE FROM {timers} WHERE id IN (SELECT id FROM {timers} "
            f"WHERE {due} ORDER BY {order} LIMIT :limit) "
            f"RETURNING {_listed(_COLUMNS)}, 1, inserted_at"
        )
        claim = sql(
            f"SELECT {_listed(_COLUMNS)}, 1 FROM {timers} WHERE {due} ORDER BY {order} LIMIT :limit"
        )
    return _Claims(take_due, claim, sql(later), next_due)


def _firing_order(row: Sequence[Any]) -> tuple[Any, ...]:
    """A SQLite row's place in the firing order (its times are sortable text)."""
    return (row[4], row[8], row[5], row[0])
