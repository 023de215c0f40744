"""The statements of the ``outbox`` table that the operator console runs. (The outbox's
own statements, its inserts, claims and marks, are still
:mod:`statifier.router.outbox`'s, to move here.)
"""

from __future__ import annotations

from typing import Any

from statifier.sql.dialect import Dialect
from statifier.sql.names import TableNames
from statifier.sql.tables import Tables

__all__ = ["OutboxTable"]


class OutboxTable:
    """The outbox statements of one set of tables on one database, made once.

    Args:
        tables: the tables the migrations built.
        dialect: the database's dialect.
    """

    def __init__(self, tables: Tables, dialect: Dialect) -> None:
        self.dialect = dialect
        outbox = TableNames.of(tables).outbox
        self._delete_dead = dialect.statement(
            f"DELETE FROM {outbox} WHERE id = :id AND dead_at IS NOT NULL"
        )

    async def delete_dead(self, driver: Any, key: Any) -> int:
        """Delete the row of ``key`` if it is dead (a row still pending or sent stays);
        answer how many rows went (0 or 1)."""
        values = {"id": self.dialect.key(key)}
        return await self.dialect.execute(driver, self._delete_dead, values)
