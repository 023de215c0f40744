"""The statements of the ``outbox`` table: events handed off by sends, one row per
``(queue, key)``, until a sink took them (``sent_at``) or they were given up
(``dead_at``).

:class:`OutboxTable` inserts a row once per ``(queue, key)``, leases due rows to one
drain pass (a claim), marks a leased row sent or failed, reads rows by state, re-arms
dead rows and deletes a dead one. What a row means (its payload's event, the backoff,
the sinks) is the router's (:mod:`statifier.router.outbox`); here the payload is a JSON
document, stored as given.

Each row carries a bucket (the router's :mod:`statifier.router.outbox` says whose), and
a claim reads a range of buckets: every bucket by default, or a part, by the
``(bucket, next_attempt_at)`` index (decision 0122).

Where the database locks rows (:attr:`Dialect.row_locks`), a claim is one statement
that locks the rows it picks and skips those another claim holds, so that drains on
several machines share one outbox without waiting for one another; on SQLite the
transaction is the single writer, and a claim picks the rows, then leases them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

from statifier.buckets import ALL_BUCKETS
from statifier.sql.dialect import Dialect
from statifier.sql.keys import RowKeys
from statifier.sql.names import TableNames
from statifier.sql.ranges import also, by_range
from statifier.sql.tables import Tables

__all__ = ["LeasedRow", "OutboxTable", "State", "StoredRow"]

State = Literal["pending", "sent", "dead"]
"""A row's state: pending (neither sent nor dead; leased ones too), sent, or dead."""

_COLUMNS: Final = (
    "id, queue, key, payload, attempts, next_attempt_at, lease, leased_until, sent_at, "
    "dead_at, last_error, inserted_at"
)
_STATES: Final[dict[State | None, str]] = {
    None: "1 = 1",
    "pending": "sent_at IS NULL AND dead_at IS NULL",
    "sent": "sent_at IS NOT NULL",
    "dead": "dead_at IS NOT NULL",
}
# The cast types the parameter where it is only compared with NULL.
_OF_QUEUE: Final = "(CAST(:queue AS TEXT) IS NULL OR queue = :queue)"


@dataclass(frozen=True, slots=True)
class StoredRow:
    """A row of the outbox table as read (times aware, UTC; ``id`` the key it was
    bound as, a UUID where the client makes keys).

    Attributes:
        payload: its JSON document, as the driver reads it (a ``dict`` from a
            ``jsonb`` column, text from SQLite).
        lease, leased_until: the drain pass holding it, and until when, if any.
    """

    id: Any
    queue: str
    key: str
    payload: Any
    attempts: int
    next_attempt_at: datetime
    lease: str | None
    leased_until: datetime | None
    sent_at: datetime | None
    dead_at: datetime | None
    last_error: str | None
    inserted_at: datetime


@dataclass(frozen=True, slots=True)
class LeasedRow:
    """A row a claim leased.

    Attributes:
        payload: its JSON document, as the driver reads it (see :class:`StoredRow`).
        attempts: how many earlier attempts failed.
        reclaimed: whether it was leased before, by a lease that had run out.
    """

    id: Any
    queue: str
    key: str
    payload: Any
    attempts: int
    reclaimed: bool


class OutboxTable:
    """The statements of one ``outbox`` table on one database, made once.

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
        outbox = TableNames.of(tables).outbox
        sql = dialect.statement
        columns = ("queue", "key", "payload", "attempts", "next_attempt_at", "inserted_at")
        given = {"payload": dialect.json("payload"), "attempts": "0"}
        given.update(next_attempt_at=":now", inserted_at=":now")
        self._insert = sql(
            f"{keys.insert(outbox, (*columns, 'execution_id', 'bucket'), given)} "
            "ON CONFLICT (queue, key) DO NOTHING"
        )
        due = (
            "sent_at IS NULL AND dead_at IS NULL AND next_attempt_at <= :now "
            "AND (leased_until IS NULL OR leased_until <= :now)"
        )
        if dialect.row_locks:
            # The rows are locked as they are picked and skipped by a concurrent claim; a
            # row another claim committed meanwhile is re-checked against the conditions
            # (it is leased now) and left out.
            self._claim = by_range(
                lambda within: sql(
                    f"WITH picked AS (SELECT id, lease IS NOT NULL AS lapsed FROM {outbox} "
                    f"WHERE {due}{also(within)} AND queue = ANY(:queues) ORDER BY id "
                    f"LIMIT :limit FOR UPDATE SKIP LOCKED) UPDATE {outbox} AS o "
                    "SET lease = :token, leased_until = :until FROM picked "
                    "WHERE o.id = picked.id "
                    "RETURNING o.id, o.queue, o.key, o.payload, o.attempts, picked.lapsed"
                )
            )
            self._lease = ""
        else:
            # The single writer holds the table from the pick to the lease.
            self._claim = by_range(
                lambda within: sql(
                    f"SELECT id, queue, key, payload, attempts, lease IS NOT NULL "
                    f"FROM {outbox} WHERE {due}{also(within)} "
                    "AND queue IN (SELECT value FROM json_each(:queues)) "
                    "ORDER BY id LIMIT :limit"
                )
            )
            self._lease = sql(
                f"UPDATE {outbox} SET lease = :token, leased_until = :until "
                "WHERE id IN (SELECT value FROM json_each(:ids))"
            )
        self._sent = sql(
            f"UPDATE {outbox} SET sent_at = :now, lease = NULL, leased_until = NULL "
            "WHERE id = :id AND lease = :token"
        )
        self._failed = sql(
            f"UPDATE {outbox} SET attempts = attempts + :counted, last_error = :error, "
            "next_attempt_at = :next_at, dead_at = :dead_at, lease = NULL, "
            "leased_until = NULL WHERE id = :id AND lease = :token"
        )
        self._rows = {
            state: sql(f"SELECT {_COLUMNS} FROM {outbox} WHERE {where} AND {_OF_QUEUE} ORDER BY id")
            for state, where in _STATES.items()
        }

        def retry(which: str) -> str:
            return sql(
                f"UPDATE {outbox} SET dead_at = NULL, attempts = 0, next_attempt_at = :now, "
                f"lease = NULL, leased_until = NULL WHERE dead_at IS NOT NULL AND {which} "
                f"AND {_OF_QUEUE}"
            )

        self._retry_key = retry("key = :which")
        self._retry_id = retry("id = :which")
        self._retry_execution = retry("execution_id = :which")
        self._delete_dead = sql(f"DELETE FROM {outbox} WHERE id = :id AND dead_at IS NOT NULL")

    async def insert(
        self,
        driver: Any,
        *,
        queue: str,
        key: str,
        payload: str,
        execution_id: str | None,
        bucket: int,
        now: datetime,
    ) -> None:
        """Insert the row ``(queue, key)`` of ``bucket``, due at ``now`` with no attempt
        made, unless it exists (then nothing changes).

        ``payload`` is the JSON document's text; ``execution_id`` the sending
        execution's, if any (kept beside the payload, for the console to find).
        """
        dialect = self.dialect
        values: dict[str, Any] = {
            "queue": queue,
            "key": key,
            "payload": payload,
            "now": dialect.time(now),
            "execution_id": execution_id,
            "bucket": bucket,
        }
        await dialect.execute(driver, self._insert, self.keys.keyed(values))

    async def claim(
        self,
        driver: Any,
        queues: Sequence[str],
        *,
        now: datetime,
        until: datetime,
        token: str,
        limit: int,
        buckets: tuple[int, int] = ALL_BUCKETS,
    ) -> list[LeasedRow]:
        """Lease to ``token`` until ``until`` at most ``limit`` rows of ``queues`` and
        ``buckets`` due at ``now`` (not sent, not dead, not leased or leased until
        ``now`` at the latest), and answer them in id order.

        Where rows are locked, rows another transaction holds are skipped, and the
        locks are held until the transaction ends.
        """
        dialect = self.dialect
        claim, within = self._claim.of(buckets)
        if dialect.row_locks:
            values = {
                "now": dialect.time(now),
                "until": dialect.time(until),
                "token": token,
                "queues": list(queues),
                "limit": limit,
                **within,
            }
            found = await dialect.rows(driver, claim, values)
            found.sort(key=_first)  # RETURNING keeps no order
        else:
            values = {
                "now": dialect.time(now),
                "queues": json.dumps(list(queues)),
                "limit": limit,
                **within,
            }
            found = await dialect.rows(driver, claim, values)
            if found:
                leased = {
                    "token": token,
                    "until": dialect.time(until),
                    "ids": json.dumps([row[0] for row in found]),
                }
                await dialect.execute(driver, self._lease, leased)
        return [
            LeasedRow(self.keys.read(r[0]), r[1], r[2], r[3], int(r[4]), bool(r[5])) for r in found
        ]

    async def mark_sent(self, driver: Any, row_id: Any, token: str, now: datetime) -> bool:
        """Mark the row ``row_id`` sent at ``now`` and end its lease, if ``token`` still
        holds it; answer whether it did."""
        dialect = self.dialect
        values = {"id": dialect.key(row_id), "token": token, "now": dialect.time(now)}
        return await dialect.execute(driver, self._sent, values) == 1

    async def mark_failed(
        self,
        driver: Any,
        row_id: Any,
        token: str,
        *,
        error: str,
        next_at: datetime,
        dead_at: datetime | None,
        counted: bool = True,
    ) -> bool:
        """Count a failed attempt of the row ``row_id`` (unless not ``counted``), keep
        ``error``, make it due at ``next_at`` (dead at ``dead_at``, if given) and end
        its lease, if ``token`` still holds it; answer whether it did."""
        dialect = self.dialect
        values = {
            "id": dialect.key(row_id),
            "token": token,
            "counted": 1 if counted else 0,
            "error": error,
            "next_at": dialect.time(next_at),
            "dead_at": None if dead_at is None else dialect.time(dead_at),
        }
        return await dialect.execute(driver, self._failed, values) == 1

    async def rows(
        self, driver: Any, *, queue: str | None = None, state: State | None = None
    ) -> list[StoredRow]:
        """The rows (of ``queue``, or all; in ``state``, or all) in id order, read
        without locking them."""
        dialect = self.dialect
        found = await dialect.rows(driver, self._rows[state], {"queue": queue})
        return [
            StoredRow(
                self.keys.read(r[0]),
                r[1],
                r[2],
                r[3],
                int(r[4]),
                _aware(dialect, r[5]),
                r[6],
                dialect.read_time(r[7]),
                dialect.read_time(r[8]),
                dialect.read_time(r[9]),
                r[10],
                _aware(dialect, r[11]),
            )
            for r in found
        ]

    async def retry_dead_key(self, driver: Any, key: str, queue: str | None, now: datetime) -> int:
        """Re-arm the dead rows of ``key`` (in ``queue``, or every queue): due at
        ``now``, no attempt made, no lease; ``last_error`` stays. Answer how many."""
        values = {"which": key, "queue": queue, "now": self.dialect.time(now)}
        return await self.dialect.execute(driver, self._retry_key, values)

    async def retry_dead_id(
        self, driver: Any, row_id: Any, queue: str | None, now: datetime
    ) -> int:
        """:meth:`retry_dead_key` of the row ``row_id`` (0 or 1)."""
        dialect = self.dialect
        values = {"which": dialect.key(row_id), "queue": queue, "now": dialect.time(now)}
        return await dialect.execute(driver, self._retry_id, values)

    async def retry_dead_of(
        self, driver: Any, execution_id: str, queue: str | None, now: datetime
    ) -> int:
        """:meth:`retry_dead_key` of every dead row the execution ``execution_id`` sent."""
        values = {"which": execution_id, "queue": queue, "now": self.dialect.time(now)}
        return await self.dialect.execute(driver, self._retry_execution, values)

    async def delete_dead(self, driver: Any, key: Any) -> int:
        """Delete the row of ``key`` if it is dead (a row still pending or sent stays);
        answer how many rows went (0 or 1)."""
        values = {"id": self.dialect.key(key)}
        return await self.dialect.execute(driver, self._delete_dead, values)


def _first(row: Sequence[Any]) -> Any:
    return row[0]


def _aware(dialect: Dialect, value: Any) -> datetime:
    time = dialect.read_time(value)
    assert time is not None  # a NOT NULL column
    return time
