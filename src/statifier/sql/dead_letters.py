"""The statements of the ``consumer_dead_letters`` table: messages a stream consumer
gave up on, one row each. What a row means is the fronts'
(:mod:`statifier.fronts.dead_letters`); here ``raw`` is bytes, stored as given.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from statifier.sql.dialect import Dialect
from statifier.sql.keys import RowKeys
from statifier.sql.names import TableNames
from statifier.sql.tables import Tables

__all__ = ["DeadLetterRow", "DeadLetterTable"]

_COLUMNS: Final = ("source", "partition", "position", "message_id", "reason", "raw", "dead_at")


@dataclass(frozen=True, slots=True)
class DeadLetterRow:
    """A row of the dead-letter table as read (``dead_at`` aware, UTC)."""

    source: str
    partition: str
    position: int
    message_id: str | None
    reason: str
    raw: bytes
    dead_at: datetime


class DeadLetterTable:
    """The statements of one dead-letter table on one database, made once.

    Args:
        tables: the tables the migrations built.
        dialect: the database's dialect (``SqlAdapter.dialect``).

    Every method takes the driver's connection of the caller's transaction.
    """

    def __init__(self, tables: Tables, dialect: Dialect) -> None:
        self.dialect = dialect
        self.keys = RowKeys.of(tables, dialect)
        table = TableNames.of(tables).consumer_dead_letters
        self._insert = dialect.statement(self.keys.insert(table, _COLUMNS))
        self._delete = dialect.statement(f"DELETE FROM {table} WHERE id = :id")
        # The cast types the parameter where it is only compared with NULL.
        self._select = dialect.statement(
            f"SELECT {', '.join(_COLUMNS)} FROM {table} "
            "WHERE CAST(:source AS TEXT) IS NULL OR source = :source ORDER BY id"
        )

    async def insert(self, driver: Any, row: DeadLetterRow) -> None:
        """Insert ``row`` as a row of its own."""
        dialect = self.dialect
        values: dict[str, Any] = {
            "source": row.source,
            "partition": row.partition,
            "position": row.position,
            "message_id": row.message_id,
            "reason": row.reason,
            "raw": row.raw,
            "dead_at": dialect.time(row.dead_at),
        }
        await dialect.execute(driver, self._insert, self.keys.keyed(values))

    async def delete(self, driver: Any, key: Any) -> int:
        """Delete the row of ``key``; answer how many rows went (0 or 1)."""
        return await self.dialect.execute(driver, self._delete, {"id": self.dialect.key(key)})

    async def rows(self, driver: Any, source: str | None) -> list[DeadLetterRow]:
        """The rows (of ``source``, or all), oldest first."""
        dialect = self.dialect
        found = await dialect.rows(driver, self._select, {"source": source})
        return [
            DeadLetterRow(
                row[0], row[1], int(row[2]), row[3], row[4], bytes(row[5]), _aware(dialect, row[6])
            )
            for row in found
        ]


def _aware(dialect: Dialect, value: Any) -> datetime:
    time = dialect.read_time(value)
    assert time is not None  # dead_at is NOT NULL
    return time
