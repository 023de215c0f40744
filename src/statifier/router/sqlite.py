"""The router's statements on SQLite: SQL text with named parameters, run inline on
the ``sqlite3`` connection of the delivery's transaction, which holds the database's
single write lock, so no race reaches these statements.

Times are stored as the UTC wall time in SQLAlchemy's ``DATETIME`` text form, as every
statifier table stores them on SQLite.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from statifier.router.records import AddressRow, LedgerRow, ReapRow
from statifier.sql.dialect import utc_text, utc_time
from statifier.sql.names import TableNames
from statifier.sql.tables import Tables

__all__ = ["SqliteSession", "SqliteStatements"]


class SqliteStatements:
    """The statement texts for one set of tables, made once per configuration."""

    def __init__(self, tables: Tables) -> None:
        names = TableNames.of(tables)
        dedupe, addresses = names.dedupe, names.addresses
        ledger, executions = names.routing_ledger, names.executions
        self.client_keys = tables.options.key_default
        key_column, key_value = ("id, ", ":id, ") if self.client_keys else ("", "")
        self.claim = (
            f"INSERT INTO {dedupe} AS d ({key_column}binding_id, message_id, expires_at) "
            f"VALUES ({key_value}:binding_id, :message_id, :expires_at) "
            "ON CONFLICT (binding_id, message_id) DO UPDATE SET expires_at = "
            "excluded.expires_at WHERE d.expires_at <= :now RETURNING 1"
        )
        self.find_address = (
            f"SELECT id, execution_id, terminal_seen_at FROM {addresses} "
            "WHERE scope = :scope AND document = :document AND key = :key"
        )
        self.insert_address = (
            f"INSERT INTO {addresses} ({key_column}scope, document, key, execution_id, "
            f"inserted_at) VALUES ({key_value}:scope, :document, :key, :execution_id, :now) "
            "ON CONFLICT (scope, document, key) DO NOTHING RETURNING id"
        )
        self.stamp = (
            f"UPDATE {addresses} SET terminal_seen_at = :now WHERE terminal_seen_at IS NULL "
            "AND id IN (SELECT value FROM json_each(:ids))"
        )
        self.record = (
            f"INSERT INTO {ledger} ({key_column}binding_id, message_id, scope, source, "
            "outcome, reason, document, key, execution_id, inserted_at) VALUES "
            f"({key_value}:binding_id, :message_id, :scope, :source, :outcome, :reason, "
            ":document, :key, :execution_id, :inserted_at)"
        )
        self.reap_dedupe = f"DELETE FROM {dedupe} WHERE expires_at < :now"
        self.reap_page = (
            "SELECT a.id, a.document, a.terminal_seen_at, e.status "
            f"FROM {addresses} AS a LEFT JOIN {executions} AS e "
            "ON e.execution_id = a.execution_id WHERE :after IS NULL OR a.id > :after "
            "ORDER BY a.id LIMIT :limit"
        )
        self.delete_addresses = (
            f"DELETE FROM {addresses} WHERE id IN (SELECT value FROM json_each(:ids))"
        )
        self.count_addresses = (
            f"SELECT count(*) FROM {addresses} "
            "WHERE execution_id IN (SELECT value FROM json_each(:ids))"
        )
        self.named_by = (
            f"SELECT execution_id FROM {addresses} WHERE scope = :scope "
            "AND document = :document ORDER BY inserted_at DESC, id DESC LIMIT 1"
        )
        self.address_of = (
            f"SELECT scope, document, key FROM {addresses} WHERE execution_id = :execution_id"
        )
        self.ledger = (
            "SELECT binding_id, message_id, scope, source, outcome, reason, document, key, "
            f"execution_id, inserted_at FROM {ledger} "
            "WHERE :execution_id IS NULL OR execution_id = :execution_id "
            "ORDER BY inserted_at, id"
        )


class SqliteSession:
    """The statements bound to one transaction's ``sqlite3`` connection. The methods
    are coroutines only to share one shape with PostgreSQL: they never suspend."""

    __slots__ = ("_driver", "_s")

    def __init__(self, statements: SqliteStatements, driver: sqlite3.Connection) -> None:
        self._s = statements
        self._driver = driver

    def _keyed(self, values: dict[str, Any]) -> dict[str, Any]:
        if self._s.client_keys is not None:
            values["id"] = self._s.client_keys().hex
        return values

    async def command(self, sql: str) -> None:
        self._driver.execute(sql)

    async def lock(self, keys: Sequence[int], wait: float | None) -> None:
        """Nothing to do: the transaction already holds the single write lock."""

    async def claim(
        self, binding_id: str, message_id: str, now: datetime, expires_at: datetime
    ) -> bool:
        values = {
            "binding_id": binding_id,
            "message_id": message_id,
            "expires_at": utc_text(expires_at),
            "now": utc_text(now),
        }
        return self._driver.execute(self._s.claim, self._keyed(values)).fetchone() is not None

    async def claim_and_find(
        self,
        binding_id: str,
        message_id: str,
        now: datetime,
        expires_at: datetime,
        address: tuple[str, str, str] | None,
    ) -> tuple[bool, AddressRow | None]:
        """Claim the message for the binding (``False``: a live claim exists, a
        duplicate) and read ``address`` (scope, document, key), if one is asked for."""
        fresh = await self.claim(binding_id, message_id, now, expires_at)
        if address is None or not fresh:
            return fresh, None
        return fresh, await self.find_address(*address)

    async def find_address(self, scope: str, document: str, key: str) -> AddressRow | None:
        values = {"scope": scope, "document": document, "key": key}
        row = self._driver.execute(self._s.find_address, values).fetchone()
        return (
            None
            if row is None
            else AddressRow(row[0], execution_id=row[1], terminal_seen_at=utc_time(row[2]))
        )

    async def insert_address(
        self, scope: str, document: str, key: str, execution_id: str, now: datetime
    ) -> Any:
        values = {
            "scope": scope,
            "document": document,
            "key": key,
            "execution_id": execution_id,
            "now": utc_text(now),
        }
        row = self._driver.execute(self._s.insert_address, self._keyed(values)).fetchone()
        return None if row is None else row[0]

    async def stamp(self, address_ids: Sequence[Any], now: datetime) -> None:
        values = {"ids": json.dumps(list(address_ids)), "now": utc_text(now)}
        self._driver.execute(self._s.stamp, values)

    async def record(self, row: LedgerRow) -> None:
        self._driver.execute(self._s.record, self._values(row))

    async def record_many(self, rows: Sequence[LedgerRow]) -> None:
        self._driver.executemany(self._s.record, [self._values(row) for row in rows])

    def _values(self, row: LedgerRow) -> dict[str, Any]:
        values = row.values()
        values["inserted_at"] = utc_text(row.inserted_at)
        return self._keyed(values)

    async def reap_dedupe(self, now: datetime) -> int:
        return self._driver.execute(self._s.reap_dedupe, {"now": utc_text(now)}).rowcount

    async def reap_page(self, after: Any, limit: int) -> list[ReapRow]:
        rows = self._driver.execute(self._s.reap_page, {"after": after, "limit": limit})
        return [
            ReapRow(row[0], document=row[1], terminal_seen_at=utc_time(row[2]), status=row[3])
            for row in rows.fetchall()
        ]

    async def delete_addresses(self, address_ids: Sequence[Any]) -> None:
        self._driver.execute(self._s.delete_addresses, {"ids": json.dumps(list(address_ids))})

    async def count_addresses(self, execution_ids: Sequence[str]) -> int:
        values = {"ids": json.dumps(list(execution_ids))}
        (count,) = self._driver.execute(self._s.count_addresses, values).fetchone()
        return int(count)

    async def named_by(self, scope: str, document: str) -> str | None:
        values = {"scope": scope, "document": document}
        row = self._driver.execute(self._s.named_by, values).fetchone()
        return None if row is None else str(row[0])

    async def address_of(self, execution_id: str) -> tuple[str, str, str] | None:
        values = {"execution_id": execution_id}
        row = self._driver.execute(self._s.address_of, values).fetchone()
        return None if row is None else (row[0], row[1], row[2])

    async def ledger(self, execution_id: str | None) -> list[LedgerRow]:
        rows = self._driver.execute(self._s.ledger, {"execution_id": execution_id}).fetchall()
        return [_ledger_row(row) for row in rows]


def _ledger_row(row: Sequence[Any]) -> LedgerRow:
    binding_id, message_id, scope, source, outcome, reason, document, key, execution_id, at = row
    inserted_at = utc_time(at)
    assert inserted_at is not None
    return LedgerRow(
        binding_id,
        message_id=message_id,
        scope=scope,
        source=source,
        outcome=outcome,
        reason=reason,
        document=document,
        key=key,
        execution_id=execution_id,
        inserted_at=inserted_at,
    )
