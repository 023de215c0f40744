"""The statements of the ``subscriptions`` table: one row for each invocation of an
execution that hears a binding's events under the execution's address key.

:class:`SubscriptionTable` inserts a row once per ``(execution_id, invoke_id)``,
deletes an invocation's row, tells whether an execution is subscribed to a binding
under a key, reads an execution's rows, and deletes the rows of the executions some
address rows name. What a subscription means (a source invoke, what is checked before
one is written, the lock a delivery reads it under) is the router's
(:mod:`statifier.router.subscriptions`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from statifier.sql.dialect import Dialect
from statifier.sql.keys import RowKeys
from statifier.sql.names import TableNames
from statifier.sql.tables import Tables

__all__ = ["SubscriptionRow", "SubscriptionTable"]

_COLUMNS: Final = ("binding_id", "execution_id", "invoke_id", "scope", "key", "inserted_at")


@dataclass(frozen=True, slots=True)
class SubscriptionRow:
    """A row of the subscriptions table as read (``inserted_at`` aware, UTC)."""

    binding_id: str
    execution_id: str
    invoke_id: str
    scope: str
    key: str
    inserted_at: datetime


class SubscriptionTable:
    """The statements of one ``subscriptions`` table on one database, made once.

    Args:
        tables: the tables the migrations built (names the table and the address
            table, and says whether keys are made by the client).
        dialect: the database's dialect (``SqlAdapter.dialect``).

    Every method takes the driver's connection of the caller's transaction
    (``tx.driver``) and runs one statement in it.
    """

    def __init__(self, tables: Tables, dialect: Dialect) -> None:
        self.dialect = dialect
        self.keys = keys = RowKeys.of(tables, dialect)
        names = TableNames.of(tables)
        subscriptions = names.subscriptions
        sql = dialect.statement
        self._insert = sql(
            f"{keys.insert(subscriptions, _COLUMNS)} "
            "ON CONFLICT (execution_id, invoke_id) DO NOTHING"
        )
        self._delete = sql(
            f"DELETE FROM {subscriptions} "
            "WHERE execution_id = :execution_id AND invoke_id = :invoke_id"
        )
        # The leading columns of the (binding_id, scope, key) index, then the execution.
        self._exists = sql(
            f"SELECT 1 FROM {subscriptions} WHERE binding_id = :binding_id "
            "AND scope = :scope AND key = :key AND execution_id = :execution_id LIMIT 1"
        )
        self._of_execution = sql(
            f"SELECT {', '.join(_COLUMNS)} FROM {subscriptions} "
            "WHERE execution_id = :execution_id ORDER BY inserted_at, id"
        )
        # The address ids are one parameter, a list of any length.
        self._delete_addressed = sql(
            f"DELETE FROM {subscriptions} WHERE execution_id IN "
            f"(SELECT execution_id FROM {names.addresses} WHERE id {dialect.among('ids')})"
        )

    async def insert(
        self,
        driver: Any,
        *,
        binding_id: str,
        execution_id: str,
        invoke_id: str,
        scope: str,
        key: str,
        inserted_at: datetime,
    ) -> None:
        """Insert a row unless the invocation ``(execution_id, invoke_id)`` has one (a
        redriven step): the row written first stands."""
        dialect = self.dialect
        values: dict[str, Any] = {
            "binding_id": binding_id,
            "execution_id": execution_id,
            "invoke_id": invoke_id,
            "scope": scope,
            "key": key,
            "inserted_at": dialect.time(inserted_at),
        }
        await dialect.execute(driver, self._insert, self.keys.keyed(values))

    async def delete(self, driver: Any, execution_id: str, invoke_id: str) -> bool:
        """Delete the row of the invocation ``invoke_id`` of ``execution_id``; answer
        whether there was one."""
        values = {"execution_id": execution_id, "invoke_id": invoke_id}
        return await self.dialect.execute(driver, self._delete, values) > 0

    async def exists(
        self, driver: Any, binding_id: str, execution_id: str, scope: str, key: str
    ) -> bool:
        """Whether a row subscribes ``execution_id`` to ``binding_id`` under ``(scope,
        key)`` (read without locking it)."""
        values = {
            "binding_id": binding_id,
            "execution_id": execution_id,
            "scope": scope,
            "key": key,
        }
        return await self.dialect.row(driver, self._exists, values) is not None

    async def of_execution(self, driver: Any, execution_id: str) -> list[SubscriptionRow]:
        """The rows of ``execution_id``, oldest first (then by key)."""
        dialect = self.dialect
        found = await dialect.rows(driver, self._of_execution, {"execution_id": execution_id})
        rows = []
        for binding_id, execution, invoke_id, scope, key, at in found:
            inserted_at = dialect.read_time(at)
            assert inserted_at is not None  # inserted_at is NOT NULL
            rows.append(SubscriptionRow(binding_id, execution, invoke_id, scope, key, inserted_at))
        return rows

    async def delete_addressed(self, driver: Any, address_ids: Sequence[Any]) -> int:
        """Delete the rows of the executions that the address rows ``address_ids`` (as
        read from the address table) name; answer how many. Run it before those address
        rows go."""
        values = {"ids": self.dialect.listed(address_ids)}
        return await self.dialect.execute(driver, self._delete_addressed, values)
