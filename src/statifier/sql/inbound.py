"""The statements of the ``inbound_events`` and ``consumer_positions`` tables: a stream
of events kept in the database, one row per event at ``(partition, position)``, and
each consumer group's committed position per partition.

:class:`InboundTable` appends events at the next positions of their partitions, reads
a partition's rows past a position, and reads and commits a group's positions. What an
event and its data mean is the fronts' (:mod:`statifier.fronts.table_source`); here
the data is a JSON document, stored as given.

Where transactions take locks (:mod:`statifier.sql.locks`: PostgreSQL), an append holds
each of its partitions' locks until its transaction ends, so positions commit in order
and a reader never passes a position a writer could still fill; and a commit holds its
group's lock (:func:`~statifier.sql.leases.group_lock`) shared, so that no claim moves
a lease while it checks the lease. On SQLite the transaction holds the single writer,
which does both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from statifier.sql.dialect import Dialect, lock_key
from statifier.sql.keys import RowKeys
from statifier.sql.leases import group_lock
from statifier.sql.locks import locks_of
from statifier.sql.names import TableNames
from statifier.sql.tables import Tables

__all__ = ["EventRow", "InboundTable", "NewEvent", "partition_lock"]


def partition_lock(names: TableNames, partition: str) -> int:
    """The lock key that an append to ``partition`` holds until its
    transaction ends."""
    return lock_key("inbound_events", names.inbound_events, partition)


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append: its partition, its columns, and its data as JSON text."""

    partition: str
    scope: str
    source: str
    message_id: str
    data: str


@dataclass(frozen=True, slots=True)
class EventRow:
    """A row of the inbound-events table as read (of the partition asked for).

    ``data`` is the JSON document as the driver reads it: decoded from a ``jsonb``
    column, text from SQLite.
    """

    position: int
    scope: str
    source: str
    message_id: str
    data: Any


class InboundTable:
    """The statements of one inbound-events table and its positions on one database,
    made once.

    Args:
        tables: the tables the migrations built.
        dialect: the database's dialect (``SqlAdapter.dialect``).

    Every method takes the driver's connection of the caller's transaction
    (``tx.driver``) and runs in it.
    """

    def __init__(self, tables: Tables, dialect: Dialect) -> None:
        self.dialect = dialect
        self.names = names = TableNames.of(tables)
        self.keys = keys = RowKeys.of(tables, dialect)
        events, positions = names.inbound_events, names.consumer_positions
        sql = dialect.statement
        self._locks = locks_of(tables, dialect)
        self._next = sql(
            f"SELECT coalesce(max(position), 0) FROM {events} WHERE partition = :partition"
        )
        event = ("partition", "position", "scope", "source", "message_id", "data", "appended_at")
        given = {"data": dialect.json("data"), "appended_at": ":now"}
        self._insert = sql(keys.insert(events, event, given))
        self._read = sql(
            f"SELECT position, scope, source, message_id, data FROM {events} "
            "WHERE partition = :partition AND position > :after ORDER BY position LIMIT :limit"
        )
        self._positions = sql(
            f"SELECT partition, position FROM {positions} WHERE consumer_group = :group "
            f"AND partition {dialect.among('partitions')}"
        )
        # Stored only while the lease is the owner's; a position never moves back.
        position = ("consumer_group", "partition", "position", "updated_at")
        given = {"consumer_group": ":group", "updated_at": ":now"}
        self._commit = sql(
            f"{keys.insert(f'{positions} AS p', position, given, select=True)} "
            f"WHERE EXISTS (SELECT 1 FROM {names.partition_leases} "
            "WHERE consumer_group = :group AND partition = :partition AND owner = :owner) "
            "ON CONFLICT (consumer_group, partition) DO UPDATE "
            "SET position = CASE WHEN EXCLUDED.position > p.position "
            "THEN EXCLUDED.position ELSE p.position END, "
            "updated_at = EXCLUDED.updated_at RETURNING partition"
        )

    async def append(
        self, driver: Any, events: Sequence[NewEvent], now: datetime
    ) -> list[tuple[str, int]]:
        """Append ``events`` in order, each at the next position of its partition,
        appended at ``now``; answer each one's ``(partition, position)``. Where there
        are locks, each partition's is held until the transaction ends."""
        dialect, locks = self.dialect, self._locks
        if locks is not None:
            # Every partition's lock up front, in one order: two appends never deadlock.
            keys = {partition_lock(self.names, event.partition) for event in events}
            await dialect.execute(driver, locks.take, locks.values(keys))
        appended_at = dialect.time(now)
        heads: dict[str, int] = {}
        placed: list[tuple[str, int]] = []
        for event in events:
            partition = event.partition
            if partition not in heads:
                row = await dialect.row(driver, self._next, {"partition": partition})
                assert row is not None  # an aggregate returns a row
                heads[partition] = int(row[0])
            heads[partition] += 1
            values = {
                "partition": partition,
                "position": heads[partition],
                "scope": event.scope,
                "source": event.source,
                "message_id": event.message_id,
                "data": event.data,
                "now": appended_at,
            }
            await dialect.execute(driver, self._insert, self.keys.keyed(values))
            placed.append((partition, heads[partition]))
        return placed

    async def read(self, driver: Any, partition: str, after: int, limit: int) -> list[EventRow]:
        """At most ``limit`` rows of ``partition`` past position ``after``, in order."""
        values = {"partition": partition, "after": after, "limit": limit}
        return [
            EventRow(int(row[0]), row[1], row[2], row[3], row[4])
            for row in await self.dialect.rows(driver, self._read, values)
        ]

    async def positions(self, driver: Any, group: str, partitions: Sequence[str]) -> dict[str, int]:
        """``group``'s committed position of each of ``partitions`` that has one."""
        values = {"group": group, "partitions": self.dialect.listed(partitions)}
        found = await self.dialect.rows(driver, self._positions, values)
        return {row[0]: int(row[1]) for row in found}

    async def commit(
        self,
        driver: Any,
        group: str,
        owner: str,
        positions: Mapping[str, int],
        now: datetime,
    ) -> set[str]:
        """Store ``positions`` as ``group``'s, at ``now``, for the partitions whose
        lease ``owner`` holds; a position below the stored one leaves it as it is.
        Answer the partitions stored (the others' leases are not ``owner``'s)."""
        dialect = self.dialect
        if self._locks is not None:
            # Shared against the claims' exclusive lock: no claim moves a lease meanwhile.
            await self._locks.take_shared(dialect, driver, group_lock(self.names, group))
        updated_at = dialect.time(now)
        stored: set[str] = set()
        for partition, position in sorted(positions.items()):
            values = {
                "group": group,
                "owner": owner,
                "partition": partition,
                "position": position,
                "now": updated_at,
            }
            if await dialect.row(driver, self._commit, self.keys.keyed(values)) is not None:
                stored.add(partition)
        return stored
