"""SQLite's dialect (:class:`SqliteDialect`, the constant :data:`SQLITE`): its
statements run on a ``sqlite3.Connection`` with parameters bound by name (``:name``),
times stored as UTC text (:func:`~statifier.sql.dialect.utc_text`), UUID keys as 32 hex
digits, JSON documents as text and a list of values as a JSON array; it takes no
lock of its own, since a transaction holds the single writer.

A call runs the statement at once on the event loop's thread: SQLite's writers are
serialized by the transaction that holds the connection, and its busy wait is off
(:mod:`statifier.sql.engines`).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final
from uuid import UUID

import sqlalchemy as sa

from statifier.sql.dialect import Dialect, Values, spliced_key, utc_text, utc_time

__all__ = ["BEGIN_WRITE", "COMMIT", "SQLITE", "SqliteDialect"]

_NO_VALUES: Final[Values] = {}

BEGIN_WRITE: Final = "BEGIN IMMEDIATE"
"""Begins a transaction that holds the database's one writer from its start (or
returns busy at once, with the busy wait off), so that it never fails later for
want of the write lock."""
COMMIT: Final = "COMMIT"
"""Ends the transaction, keeping what it wrote."""


class SqliteDialect(Dialect):
    """SQLite through ``sqlite3`` (see :class:`~statifier.sql.dialect.Dialect`)."""

    name = "sqlite"
    row_locks = False
    single_writer = True
    writes_in_with = False

    def among(self, parameter: str) -> str:
        return f"IN (SELECT value FROM json_each(:{parameter}))"

    def listed(self, values: Iterable[Any]) -> Any:
        # sqlite3 binds no list: a JSON array, which json_each reads back.
        return json.dumps(list(values))

    def table_of(self, parameter: str, columns: Mapping[str, str]) -> str:
        # Values are stored as the JSON holds them: text, and times as utc_text.
        picked = ", ".join(f"json_extract(value, '$.{name}') AS {name}" for name in columns)
        return f"(SELECT {picked} FROM json_each(:{parameter})) AS r"

    def _json_time(self, value: object) -> object:
        if isinstance(value, datetime):
            return utc_text(value)
        raise TypeError(f"{type(value).__name__} is not a table's value")

    def time(self, value: datetime) -> Any:
        return utc_text(value)

    def read_time(self, value: Any) -> datetime | None:
        return utc_time(value)

    def key(self, value: Any) -> Any:
        # 32 hex digits, as SQLAlchemy stores a UUID on SQLite.
        return value.hex if isinstance(value, UUID) else value

    def read_key(self, value: Any) -> Any:
        # A key column holds integers, or UUIDs as 32 hex digits: text is a UUID.
        return UUID(hex=value) if isinstance(value, str) else value

    def json_has(self, column: Any, pairs: Mapping[str, str]) -> list[Any]:
        conditions = []
        for index, (key, value) in enumerate(sorted(pairs.items())):
            each = sa.func.json_each(column).table_valued("key", "value").alias(f"m{index}")
            conditions.append(
                sa.exists().select_from(each).where(each.c.key == key, each.c.value == value)
            )
        return conditions

    def json_has_sql(self, column: str, parameter: str) -> str:
        # No pair asked is missing from the column's object.
        return (
            f"NOT EXISTS (SELECT 1 FROM json_each(:{parameter}) AS asked "
            f"WHERE NOT EXISTS (SELECT 1 FROM json_each({column}) AS held "
            "WHERE held.key = asked.key AND held.value = asked.value))"
        )

    def json_text_sql(self, column: str, key: str) -> str:
        # The form of the executions' index on their parent (statifier.sql.tables),
        # which SQLite uses only for the same expression.
        return f"json_extract({column}, '$.\"{spliced_key(key)}\"')"

    def bucket(self, column: Any, start: int, width: int) -> Any:
        epoch = sa.cast(sa.func.strftime("%s", column), sa.Integer)
        return (epoch - start) // width  # the integer division of the database

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
