"""The statements of the ``flow_groups`` and ``flow_events`` tables: what debounce,
batch and throttle bindings hold, by address.

:class:`FlowTable` reads one address's group (locked where rows lock), writes it back
whole, holds an event behind the others, reads and deletes the held events in order,
lists the groups due, records a failed delivery, and pages through the groups for the
console. What a group means (when it is due, what its events become) is the router's
(:mod:`statifier.router.flow`).

Every writer of a group holds its address's lock first (the router's lock on
PostgreSQL, the single writer on SQLite), so the read-then-write of :meth:`locked` and
:meth:`put` never races another.

A group carries its address's bucket (:func:`statifier.buckets.address_bucket`), and
:meth:`FlowTable.due` and :meth:`FlowTable.next_due` read a range of buckets: the whole
range by default, or a part, by the ``(bucket, due_at)`` index (decision 0121).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from statifier.buckets import ALL_BUCKETS, address_bucket
from statifier.sql.dialect import Dialect
from statifier.sql.keys import RowKeys
from statifier.sql.names import TableNames
from statifier.sql.ranges import also, by_range, where
from statifier.sql.tables import Tables

__all__ = ["FlowEventRow", "FlowGroupRow", "FlowTable"]

_GROUP_COLUMNS: Final = (
    "binding_id",
    "scope",
    "key",
    "document",
    "held",
    "last_seq",
    "first_at",
    "window_start",
    "window_count",
    "due_at",
    "failures",
    "last_error",
    "updated_at",
)
_EVENT_COLUMNS: Final = (
    "binding_id",
    "scope",
    "key",
    "seq",
    "message_id",
    "source",
    "data_blob",
    "arrived_at",
)
_TIMES: Final = frozenset({"first_at", "window_start", "due_at", "updated_at", "arrived_at"})
_ADDRESS: Final = "binding_id = :binding_id AND scope = :scope AND key = :key"


@dataclass(frozen=True, slots=True)
class FlowGroupRow:
    """A row of ``flow_groups`` (times aware, in UTC); see
    :func:`statifier.sql.tables` for the columns."""

    binding_id: str
    scope: str
    key: str
    document: str
    held: int
    last_seq: int
    first_at: datetime | None
    window_start: datetime | None
    window_count: int
    due_at: datetime
    failures: int
    last_error: str | None
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class FlowEventRow:
    """A row of ``flow_events``: one held event (``data_blob`` as stored, through the
    storage's codec)."""

    binding_id: str
    scope: str
    key: str
    seq: int
    message_id: str
    source: str | None
    data_blob: bytes
    arrived_at: datetime


class FlowTable:
    """The statements of one pair of flow tables on one database, made once.

    Every method takes the driver's connection of the caller's transaction
    (``tx.driver``) and runs in it.
    """

    def __init__(self, tables: Tables, dialect: Dialect) -> None:
        self.dialect = dialect
        self.keys = keys = RowKeys.of(tables, dialect)
        names = TableNames.of(tables)
        groups, events = names.flow_groups, names.flow_events
        sql = dialect.statement
        lock = " FOR UPDATE" if dialect.row_locks else ""
        listed = ", ".join(_GROUP_COLUMNS)
        self._locked = sql(f"SELECT {listed} FROM {groups} WHERE {_ADDRESS}{lock}")
        updated = ", ".join(
            f"{column} = excluded.{column}"
            for column in _GROUP_COLUMNS
            if column not in ("binding_id", "scope", "key")
        )
        # The bucket is written once, with the address: it never changes.
        self._put = sql(
            f"{keys.insert(groups, (*_GROUP_COLUMNS, 'bucket'))} "
            f"ON CONFLICT (binding_id, scope, key) DO UPDATE SET {updated}"
        )
        self._delete = sql(f"DELETE FROM {groups} WHERE {_ADDRESS}")
        self._hold = sql(keys.insert(events, _EVENT_COLUMNS))
        self._events = sql(
            f"SELECT {', '.join(_EVENT_COLUMNS)} FROM {events} WHERE {_ADDRESS} "
            "ORDER BY seq LIMIT :limit"
        )
        self._drop = sql(f"DELETE FROM {events} WHERE {_ADDRESS} AND seq <= :through")
        due = f"SELECT binding_id, scope, key, document FROM {groups} WHERE due_at <= :now"
        self._due = by_range(
            lambda within: sql(f"{due}{also(within)} ORDER BY due_at LIMIT :limit")
        )
        self._next_due = by_range(
            lambda within: sql(f"SELECT min(due_at) FROM {groups}{where(within)}")
        )
        self._failed = sql(
            f"UPDATE {groups} SET due_at = :due_at, failures = failures + 1, "
            f"last_error = :error, updated_at = :now WHERE {_ADDRESS}"
        )
        self._page = sql(
            f"SELECT {listed} FROM {groups} WHERE held > 0 AND (binding_id > :binding_id OR "
            "(binding_id = :binding_id AND (scope > :scope OR (scope = :scope AND "
            "key > :key)))) ORDER BY binding_id, scope, key LIMIT :limit"
        )
        self._totals = sql(f"SELECT count(*), COALESCE(sum(held), 0) FROM {groups} WHERE held > 0")

    def _group(self, row: Sequence[Any]) -> FlowGroupRow:
        read = self.dialect.read_time
        due_at, updated_at = read(row[9]), read(row[12])
        assert due_at is not None
        assert updated_at is not None
        return FlowGroupRow(
            row[0],
            row[1],
            row[2],
            row[3],
            int(row[4]),
            int(row[5]),
            read(row[6]),
            read(row[7]),
            int(row[8]),
            due_at,
            int(row[10]),
            row[11],
            updated_at,
        )

    async def locked(
        self, driver: Any, binding_id: str, scope: str, key: str
    ) -> FlowGroupRow | None:
        """The group of ``(binding_id, scope, key)``, locked until the transaction ends
        where rows lock, or ``None``."""
        values = {"binding_id": binding_id, "scope": scope, "key": key}
        row = await self.dialect.row(driver, self._locked, values)
        return None if row is None else self._group(row)

    async def put(self, driver: Any, group: FlowGroupRow) -> None:
        """Write ``group`` whole: inserted, or replacing the row of its address."""
        time = self.dialect.time
        values: dict[str, Any] = {}
        for column in _GROUP_COLUMNS:
            value = getattr(group, column)
            values[column] = time(value) if column in _TIMES and value is not None else value
        values["bucket"] = address_bucket(group.scope, group.document, group.key)
        await self.dialect.execute(driver, self._put, self.keys.keyed(values))

    async def delete(self, driver: Any, binding_id: str, scope: str, key: str) -> None:
        """Delete the group of ``(binding_id, scope, key)`` (its events are the
        caller's)."""
        values = {"binding_id": binding_id, "scope": scope, "key": key}
        await self.dialect.execute(driver, self._delete, values)

    async def hold(self, driver: Any, event: FlowEventRow) -> None:
        """Insert ``event`` among the held ones."""
        time = self.dialect.time
        values: dict[str, Any] = {}
        for column in _EVENT_COLUMNS:
            value = getattr(event, column)
            values[column] = time(value) if column in _TIMES else value
        await self.dialect.execute(driver, self._hold, self.keys.keyed(values))

    async def events(
        self, driver: Any, binding_id: str, scope: str, key: str, limit: int
    ) -> list[FlowEventRow]:
        """The first ``limit`` events held for the address, in ``seq`` order."""
        values = {"binding_id": binding_id, "scope": scope, "key": key, "limit": limit}
        read = self.dialect.read_time
        held = []
        for row in await self.dialect.rows(driver, self._events, values):
            arrived_at = read(row[7])
            assert arrived_at is not None
            held.append(
                FlowEventRow(
                    row[0], row[1], row[2], int(row[3]), row[4], row[5], bytes(row[6]), arrived_at
                )
            )
        return held

    async def drop(self, driver: Any, binding_id: str, scope: str, key: str, through: int) -> None:
        """Delete the address's held events up to ``seq`` ``through``."""
        values = {"binding_id": binding_id, "scope": scope, "key": key, "through": through}
        await self.dialect.execute(driver, self._drop, values)

    async def due(
        self,
        driver: Any,
        now: datetime,
        limit: int,
        buckets: tuple[int, int] = ALL_BUCKETS,
    ) -> list[tuple[str, str, str, str]]:
        """At most ``limit`` groups of ``buckets`` due at ``now``, the earliest first,
        as ``(binding_id, scope, key, document)``; read without a lock."""
        statement, within = self._due.of(buckets)
        values = {"now": self.dialect.time(now), "limit": limit, **within}
        rows = await self.dialect.rows(driver, statement, values)
        return [(row[0], row[1], row[2], row[3]) for row in rows]

    async def next_due(
        self, driver: Any, buckets: tuple[int, int] = ALL_BUCKETS
    ) -> datetime | None:
        """The earliest due time of a group of ``buckets``, or ``None``."""
        statement, within = self._next_due.of(buckets)
        row = await self.dialect.row(driver, statement, within)
        return None if row is None else self.dialect.read_time(row[0])

    async def failed(
        self,
        driver: Any,
        group: FlowGroupRow,
        *,
        error: str,
        due_at: datetime,
        now: datetime,
    ) -> None:
        """Record a failed delivery of ``group``'s events: taken again at ``due_at``."""
        time = self.dialect.time
        values = {
            "binding_id": group.binding_id,
            "scope": group.scope,
            "key": group.key,
            "error": error,
            "due_at": time(due_at),
            "now": time(now),
        }
        await self.dialect.execute(driver, self._failed, values)

    async def page(
        self, driver: Any, after: tuple[str, str, str], limit: int
    ) -> list[FlowGroupRow]:
        """At most ``limit`` groups holding events, after the address ``after``
        (``("", "", "")``: from the first), by binding, scope and key."""
        binding_id, scope, key = after
        values = {"binding_id": binding_id, "scope": scope, "key": key, "limit": limit}
        return [self._group(row) for row in await self.dialect.rows(driver, self._page, values)]

    async def totals(self, driver: Any) -> tuple[int, int]:
        """How many groups hold events, and how many events they hold."""
        row = await self.dialect.row(driver, self._totals)
        assert row is not None
        return int(row[0]), int(row[1])
