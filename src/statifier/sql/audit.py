"""The statement of the ``console_audit`` table that runs inside another transaction:
an operator's action written with what the action wrote, so that neither commits
without the other. What a row means is the console's (:mod:`statifier.console.audit`,
which reads the table through SQLAlchemy Core).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from statifier.sql.dialect import Dialect
from statifier.sql.tables import Tables

__all__ = ["AUDIT_COLUMNS", "AuditTable"]

AUDIT_COLUMNS: Final = ("at", "actor", "action", "target", "outcome", "detail")
"""The columns an audit row is written with, besides its key."""


class AuditTable:
    """The audit insert of one set of tables on one database, made once.

    Args:
        tables: the tables the migrations built.
        dialect: the database's dialect.
    """

    def __init__(self, tables: Tables, dialect: Dialect) -> None:
        self.dialect = dialect
        options = tables.options
        table = f"{options.schema}." if options.schema else ""
        table += options.name("console_audit")

        def insert(columns: tuple[str, ...]) -> str:
            return dialect.statement(
                f"INSERT INTO {table} ({', '.join(columns)}) "
                f"VALUES ({', '.join(f':{column}' for column in columns)}) RETURNING id"
            )

        self._insert = insert(AUDIT_COLUMNS)
        self._insert_keyed = insert(("id", *AUDIT_COLUMNS))

    async def insert(self, driver: Any, values: Mapping[str, Any]) -> Any:
        """Insert a row of ``values`` (:data:`AUDIT_COLUMNS`, and ``id`` where the
        caller makes keys) on ``driver``; answer the row's key as the database holds it."""
        dialect = self.dialect
        stored = dict(values, at=dialect.time(values["at"]))
        keyed = "id" in values
        if keyed:
            stored["id"] = dialect.key(values["id"])
        found = await dialect.row(driver, self._insert_keyed if keyed else self._insert, stored)
        assert found is not None  # RETURNING gives the inserted row
        return values["id"] if keyed else found[0]
