"""The statements of the ``active_slots`` and ``held_creates`` tables: what caps on
active executions count, and the creates they hold.

:class:`CapTable` counts a cap's slots (by document, and by scope or over every scope),
deletes those of executions that have ended, takes a slot for a new execution, holds a
create behind the others of its address, says whether a cap holds any, picks the
addresses to make first (the scope with the fewest slots first), and reads and deletes an
address's held creates. What a cap means is the router's (:mod:`statifier.router.caps`).

A create's count, and the slot or the held row it writes after it, run under the cap's
lock (the router's lock on PostgreSQL, the single writer on SQLite), so they
never race another create. Deleting the slots of ended executions needs no lock: it
only removes what no count should see.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from statifier.buckets import address_bucket
from statifier.sql.dialect import Dialect
from statifier.sql.keys import RowKeys
from statifier.sql.names import TableNames
from statifier.sql.tables import Tables

__all__ = ["CapTable", "HeldCreateRow"]

_HELD_COLUMNS: Final = (
    "document",
    "scope",
    "key",
    "binding_id",
    "create_mode",
    "on_error",
    "message_id",
    "source",
    "event_blob",
    "arrived_at",
)
_LIVE: Final = ("active", "paused", "needs_migration")
"""The statuses of an execution that has not ended: each holds its slot."""
# A cap over every scope binds the scope as NULL: the condition then holds for all.
_BUCKET: Final = "document = :document AND (CAST(:scope AS TEXT) IS NULL OR scope = :scope)"


@dataclass(frozen=True, slots=True)
class HeldCreateRow:
    """A row of ``held_creates``: one event whose create a cap holds (``event_blob``
    as stored, through the storage's codec)."""

    document: str
    scope: str
    key: str
    binding_id: str
    create_mode: str
    on_error: str | None
    message_id: str
    source: str | None
    event_blob: bytes
    arrived_at: datetime
    seq: int = 0


class CapTable:
    """The statements of one pair of cap tables on one database, made once.

    Every method takes the driver's connection of the caller's transaction
    (``tx.driver``) and runs in it. ``scope`` ``None`` names a cap over every scope.
    """

    def __init__(self, tables: Tables, dialect: Dialect) -> None:
        self.dialect = dialect
        self.keys = keys = RowKeys.of(tables, dialect)
        names = TableNames.of(tables)
        slots, held, executions = names.active_slots, names.held_creates, names.executions
        sql = dialect.statement
        live = ", ".join(f"'{status}'" for status in _LIVE)
        self._count = sql(f"SELECT count(*) FROM {slots} WHERE {_BUCKET}")
        self._purge = sql(
            f"DELETE FROM {slots} WHERE {_BUCKET} AND NOT EXISTS (SELECT 1 FROM {executions} "
            f"AS e WHERE e.execution_id = {slots}.execution_id AND e.status IN ({live}))"
        )
        self._occupy = sql(keys.insert(slots, ("document", "scope", "execution_id", "inserted_at")))
        # The next seq of the address's held creates, read in the insert itself: the
        # caller holds the cap's lock, so no other insert of it runs meanwhile.
        next_seq = {"seq": "COALESCE(MAX(seq), 0) + 1"}
        self._hold = sql(
            f"{keys.insert(held, (*_HELD_COLUMNS, 'bucket', 'seq'), next_seq, select=True)} "
            f"FROM {held} WHERE document = :document AND scope = :scope AND key = :key"
        )
        self._any = sql(f"SELECT 1 FROM {held} WHERE {_BUCKET} LIMIT 1")
        # Each scope's addresses ranked by their oldest held create, then taken by
        # the scope's slots plus that rank, lowest first: the scope with the fewest
        # executions is served first, and filled level with the others (a scope with
        # two active and one waiting yields to one with none active), ties by age.
        self._fair = sql(
            "SELECT h.scope, h.key FROM (SELECT scope, key, MIN(arrived_at) AS first, "
            "ROW_NUMBER() OVER (PARTITION BY scope ORDER BY MIN(arrived_at), key) AS rank "
            f"FROM {held} WHERE {_BUCKET} GROUP BY scope, key) AS h LEFT JOIN "
            f"(SELECT scope, count(*) AS n FROM {slots} WHERE {_BUCKET} GROUP BY scope) "
            "AS s ON s.scope = h.scope ORDER BY COALESCE(s.n, 0) + h.rank, h.first, "
            "h.scope LIMIT :limit"
        )
        self._buckets = sql(f"SELECT DISTINCT document, scope FROM {held}")
        self._address = sql(
            f"SELECT {', '.join(_HELD_COLUMNS)}, seq FROM {held} WHERE document = :document "
            "AND scope = :scope AND key = :key ORDER BY seq"
        )
        self._drop = sql(
            f"DELETE FROM {held} WHERE document = :document AND scope = :scope AND key = :key "
            "AND seq = :seq"
        )
        self._totals = sql(
            "SELECT count(*), COALESCE(sum(n), 0) FROM (SELECT count(*) AS n "
            f"FROM {held} GROUP BY document, scope, key) AS addresses"
        )

    async def count(self, driver: Any, document: str, scope: str | None) -> int:
        """How many slots the cap of ``document`` (in ``scope``) counts."""
        row = await self.dialect.row(driver, self._count, {"document": document, "scope": scope})
        assert row is not None
        return int(row[0])

    async def purge(self, driver: Any, document: str, scope: str | None) -> int:
        """Delete the cap's slots of executions that ended (or are gone); answer how
        many."""
        values = {"document": document, "scope": scope}
        return await self.dialect.execute(driver, self._purge, values)

    async def occupy(
        self, driver: Any, document: str, scope: str, execution_id: str, now: datetime
    ) -> None:
        """Count ``execution_id`` against the cap of ``document`` in ``scope``."""
        values = {
            "document": document,
            "scope": scope,
            "execution_id": execution_id,
            "inserted_at": self.dialect.time(now),
        }
        await self.dialect.execute(driver, self._occupy, self.keys.keyed(values))

    async def hold(self, driver: Any, row: HeldCreateRow) -> None:
        """Hold ``row`` behind the address's other held creates."""
        values: dict[str, Any] = {column: getattr(row, column) for column in _HELD_COLUMNS}
        values["arrived_at"] = self.dialect.time(row.arrived_at)
        values["bucket"] = address_bucket(row.scope, row.document, row.key)
        await self.dialect.execute(driver, self._hold, self.keys.keyed(values))

    async def any_held(self, driver: Any, document: str, scope: str | None) -> bool:
        """Whether the cap of ``document`` (in ``scope``) holds any create."""
        values = {"document": document, "scope": scope}
        return await self.dialect.row(driver, self._any, values) is not None

    async def fair(
        self, driver: Any, document: str, scope: str | None, limit: int
    ) -> list[tuple[str, str]]:
        """At most ``limit`` addresses ``(scope, key)`` with held creates, in the order
        they are made: the scope with the fewest slots first, each scope's oldest
        first."""
        values = {"document": document, "scope": scope, "limit": limit}
        return [(row[0], row[1]) for row in await self.dialect.rows(driver, self._fair, values)]

    async def buckets(self, driver: Any) -> list[tuple[str, str]]:
        """Every ``(document, scope)`` with held creates."""
        return [(row[0], row[1]) for row in await self.dialect.rows(driver, self._buckets)]

    async def held(self, driver: Any, document: str, scope: str, key: str) -> list[HeldCreateRow]:
        """The address's held creates, in ``seq`` order."""
        values = {"document": document, "scope": scope, "key": key}
        read = self.dialect.read_time
        found = []
        for row in await self.dialect.rows(driver, self._address, values):
            arrived_at = read(row[9])
            assert arrived_at is not None
            found.append(
                HeldCreateRow(
                    row[0],
                    row[1],
                    row[2],
                    row[3],
                    row[4],
                    row[5],
                    row[6],
                    row[7],
                    bytes(row[8]),
                    arrived_at,
                    int(row[10]),
                )
            )
        return found

    async def drop(self, driver: Any, row: HeldCreateRow) -> None:
        """Delete ``row`` (made)."""
        values = {"document": row.document, "scope": row.scope, "key": row.key, "seq": row.seq}
        await self.dialect.execute(driver, self._drop, values)

    async def totals(self, driver: Any) -> tuple[int, int]:
        """How many addresses wait on a cap, and how many events they hold."""
        row = await self.dialect.row(driver, self._totals)
        assert row is not None
        return int(row[0]), int(row[1])
