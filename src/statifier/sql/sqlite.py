"""SQLite's dialect (:class:`SqliteDialect`, the constant :data:`SQLITE`): its
statements run on a ``sqlite3.Connection`` with parameters bound by name (``:name``),
times stored as UTC text (:func:`~statifier.sql.dialect.utc_text`), UUID keys as 32 hex
digits, JSON documents as text, and a list in one parameter as a JSON list that
``json_each`` reads.

A call runs the statement at once on the event loop's thread: SQLite's writers are
serialized by the transaction that holds the connection, and its busy wait is off
(:mod:`statifier.sql.engines`).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Final
from uuid import UUID

from statifier.sql.dialect import Dialect, Values, utc_text, utc_time

__all__ = ["SQLITE", "SqliteDialect"]

_NO_VALUES: Final[Values] = {}


class SqliteDialect(Dialect):
    """SQLite through ``sqlite3`` (see :class:`~statifier.sql.dialect.Dialect`)."""

    name = "sqlite"
    row_locks = False

    def time(self, value: datetime) -> Any:
        return utc_text(value)

    def read_time(self, value: Any) -> datetime | None:
        return utc_time(value)

    def key(self, value: UUID) -> Any:
        return value.hex

    def among(self, parameter: str) -> str:
        return f"IN (SELECT value FROM json_each(:{parameter}))"

    def listed(self, values: Iterable[Any]) -> Any:
        return json.dumps(list(values))  # a JSON list, which json_each reads

    async def execute(
        self, driver: sqlite3.Connection, sql: str, values: Values | None = None
    ) -> int:
        return int(driver.execute(sql, _NO_VALUES if values is None else values).rowcount)

    async def execute_many(
        self, driver: sqlite3.Connection, sql: str, values: Sequence[Values]
    ) -> None:
        driver.executemany(sql, values)

    async def rows(
        self, driver: sqlite3.Connection, sql: str, values: Values | None = None
    ) -> list[tuple[Any, ...]]:
        return driver.execute(sql, _NO_VALUES if values is None else values).fetchall()

    async def row(
        self, driver: sqlite3.Connection, sql: str, values: Values | None = None
    ) -> tuple[Any, ...] | None:
        return driver.execute(sql, _NO_VALUES if values is None else values).fetchone()  # type: ignore[no-any-return]


SQLITE: Final = SqliteDialect()
