"""The statements of the ``schedules`` table: one row a schedule, its definition (as
JSON) and its state.

:class:`ScheduleTable` inserts a schedule unless it is there, locks and reads one,
writes a new definition, claims the schedule due first, records a fire made or
failed, pauses, resumes and removes. What a definition means is the router's
(:mod:`statifier.router.schedules`).

Where the database locks rows (:attr:`Dialect.row_locks`), a claim locks the row it
answers and skips rows another transaction holds, so workers in several processes
share the table and never take one schedule at once; on SQLite the transaction is the
single writer.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from statifier.sql.dialect import Dialect
from statifier.sql.keys import RowKeys
from statifier.sql.names import TableNames
from statifier.sql.tables import Tables

__all__ = ["ScheduleRow", "ScheduleTable"]

_COLUMNS: Final = (
    "name",
    "scope",
    "definition",
    "paused",
    "next_fire_at",
    "due_at",
    "last_fire_at",
    "last_made_at",
    "fired",
    "skipped",
    "failures",
    "last_error",
    "updated_at",
)
_LISTED: Final = ", ".join(_COLUMNS)


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    """A row of the schedules table as read (times aware, in UTC; ``definition`` a
    JSON object as a ``dict``). See :func:`statifier.sql.tables` for the columns."""

    name: str
    scope: str
    definition: dict[str, Any]
    paused: bool
    next_fire_at: datetime
    due_at: datetime
    last_fire_at: datetime | None
    last_made_at: datetime | None
    fired: int
    skipped: int
    failures: int
    last_error: str | None
    updated_at: datetime


class ScheduleTable:
    """The statements of one ``schedules`` table on one database, made once.

    Every method takes the driver's connection of the caller's transaction
    (``tx.driver``) and runs in it.
    """

    def __init__(self, tables: Tables, dialect: Dialect) -> None:
        self.dialect = dialect
        self.keys = keys = RowKeys.of(tables, dialect)
        table = TableNames.of(tables).schedules
        sql = dialect.statement
        lock = " FOR UPDATE" if dialect.row_locks else ""
        skip = " FOR UPDATE SKIP LOCKED" if dialect.row_locks else ""
        inserted = (
            "name",
            "scope",
            "definition",
            "paused",
            "next_fire_at",
            "due_at",
            "fired",
            "skipped",
            "failures",
            "updated_at",
        )
        insert = keys.insert(table, inserted, {"definition": dialect.json("definition")})
        self._insert = sql(f"{insert} ON CONFLICT (name) DO NOTHING")
        self._locked = sql(f"SELECT {_LISTED} FROM {table} WHERE name = :name{lock}")
        self._get = sql(f"SELECT {_LISTED} FROM {table} WHERE name = :name")
        self._page = sql(
            f"SELECT {_LISTED} FROM {table} WHERE name > :after ORDER BY name LIMIT :limit"
        )
        self._redefine = sql(
            f"UPDATE {table} SET scope = :scope, definition = {dialect.json('definition')}, "
            "next_fire_at = :next_fire_at, due_at = :due_at, updated_at = :now "
            "WHERE name = :name"
        )
        self._claim = sql(
            f"SELECT {_LISTED} FROM {table} WHERE NOT paused AND due_at <= :now "
            f"ORDER BY due_at, name LIMIT 1{skip}"
        )
        self._made = sql(
            f"UPDATE {table} SET next_fire_at = :next_fire_at, due_at = :due_at, "
            "last_fire_at = COALESCE(:fire_at, last_fire_at), "
            "last_made_at = CASE WHEN :made = 1 THEN :now ELSE last_made_at END, "
            "fired = fired + :made, skipped = skipped + :skipped, failures = 0, "
            "last_error = NULL, updated_at = :now WHERE name = :name"
        )
        self._failed = sql(
            f"UPDATE {table} SET due_at = :due_at, failures = failures + 1, "
            "last_error = :error, updated_at = :now WHERE name = :name"
        )
        self._paused = sql(
            f"UPDATE {table} SET paused = :paused, updated_at = :now "
            "WHERE name = :name AND paused <> :paused"
        )
        self._resumed = sql(
            f"UPDATE {table} SET paused = :paused, next_fire_at = :next_fire_at, "
            "due_at = :next_fire_at, failures = 0, last_error = NULL, updated_at = :now "
            "WHERE name = :name AND paused <> :paused"
        )
        self._remove = sql(f"DELETE FROM {table} WHERE name = :name")
        self._next_due = sql(f"SELECT min(due_at) FROM {table} WHERE NOT paused")

    def _row(self, row: Sequence[Any]) -> ScheduleRow:
        read = self.dialect.read_time
        definition = row[2]
        if isinstance(definition, str | bytes):
            definition = json.loads(definition)
        next_fire_at, due_at, updated_at = read(row[4]), read(row[5]), read(row[12])
        assert next_fire_at is not None
        assert due_at is not None
        assert updated_at is not None
        return ScheduleRow(
            row[0],
            row[1],
            definition,
            bool(row[3]),
            next_fire_at,
            due_at,
            read(row[6]),
            read(row[7]),
            int(row[8]),
            int(row[9]),
            int(row[10]),
            row[11],
            updated_at,
        )

    async def insert(
        self,
        driver: Any,
        *,
        name: str,
        scope: str,
        definition: dict[str, Any],
        paused: bool,
        next_fire_at: datetime,
        now: datetime,
    ) -> bool:
        """Insert the schedule ``name`` unless it is there; answer whether it was
        inserted."""
        time = self.dialect.time
        values: dict[str, Any] = {
            "name": name,
            "scope": scope,
            "definition": json.dumps(definition),
            "paused": paused,
            "next_fire_at": time(next_fire_at),
            "due_at": time(next_fire_at),
            "fired": 0,
            "skipped": 0,
            "failures": 0,
            "updated_at": time(now),
        }
        return await self.dialect.execute(driver, self._insert, self.keys.keyed(values)) == 1

    async def locked(self, driver: Any, name: str) -> ScheduleRow | None:
        """The row ``name``, locked until the transaction ends where rows lock."""
        row = await self.dialect.row(driver, self._locked, {"name": name})
        return None if row is None else self._row(row)

    async def get(self, driver: Any, name: str) -> ScheduleRow | None:
        """The row ``name``, read without a lock."""
        row = await self.dialect.row(driver, self._get, {"name": name})
        return None if row is None else self._row(row)

    async def page(self, driver: Any, after: str, limit: int) -> list[ScheduleRow]:
        """At most ``limit`` rows named after ``after`` (``""``: from the first), by
        name."""
        rows = await self.dialect.rows(driver, self._page, {"after": after, "limit": limit})
        return [self._row(row) for row in rows]

    async def redefine(
        self,
        driver: Any,
        *,
        name: str,
        scope: str,
        definition: dict[str, Any],
        next_fire_at: datetime,
        due_at: datetime,
        now: datetime,
    ) -> None:
        """Write the schedule ``name``'s new definition and next fire."""
        time = self.dialect.time
        values = {
            "name": name,
            "scope": scope,
            "definition": json.dumps(definition),
            "next_fire_at": time(next_fire_at),
            "due_at": time(due_at),
            "now": time(now),
        }
        await self.dialect.execute(driver, self._redefine, values)

    async def claim(self, driver: Any, now: datetime) -> ScheduleRow | None:
        """The running schedule due first at ``now``, locked (one another transaction
        holds is skipped), or ``None``."""
        row = await self.dialect.row(driver, self._claim, {"now": self.dialect.time(now)})
        return None if row is None else self._row(row)

    async def made(
        self,
        driver: Any,
        name: str,
        *,
        fire_at: datetime | None,
        skipped: int,
        next_fire_at: datetime,
        now: datetime,
        due_at: datetime | None = None,
    ) -> None:
        """Record a step of ``name``: the fire at ``fire_at`` made (``None``: none),
        ``skipped`` fires let pass, its next fire at ``next_fire_at``, taken again at
        ``due_at`` (``next_fire_at`` unless given); its failures cleared."""
        time = self.dialect.time
        values = {
            "name": name,
            "fire_at": None if fire_at is None else time(fire_at),
            "made": 0 if fire_at is None else 1,
            "skipped": skipped,
            "next_fire_at": time(next_fire_at),
            "due_at": time(next_fire_at if due_at is None else due_at),
            "now": time(now),
        }
        await self.dialect.execute(driver, self._made, values)

    async def failed(
        self, driver: Any, name: str, *, error: str, due_at: datetime, now: datetime
    ) -> None:
        """Record a failed step of ``name``: taken again at ``due_at``."""
        time = self.dialect.time
        values = {"name": name, "error": error, "due_at": time(due_at), "now": time(now)}
        await self.dialect.execute(driver, self._failed, values)

    async def pause(self, driver: Any, name: str, now: datetime) -> bool:
        """Pause ``name``; answer whether it was running."""
        values = {"name": name, "paused": True, "now": self.dialect.time(now)}
        return await self.dialect.execute(driver, self._paused, values) == 1

    async def resume(self, driver: Any, name: str, next_fire_at: datetime, now: datetime) -> bool:
        """Resume ``name``, its next fire at ``next_fire_at``, its failures cleared;
        answer whether it was paused."""
        time = self.dialect.time
        values = {
            "name": name,
            "paused": False,
            "next_fire_at": time(next_fire_at),
            "now": time(now),
        }
        return await self.dialect.execute(driver, self._resumed, values) == 1

    async def remove(self, driver: Any, name: str) -> bool:
        """Delete ``name``; answer whether it was there."""
        return await self.dialect.execute(driver, self._remove, {"name": name}) == 1

    async def next_due(self, driver: Any) -> datetime | None:
        """The earliest due time of a running schedule, or ``None``."""
        row = await self.dialect.row(driver, self._next_due)
        return None if row is None else self.dialect.read_time(row[0])
