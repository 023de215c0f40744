"""The router's statements on PostgreSQL: SQL text with named parameters, run on the
psycopg 3 connection of the delivery's transaction.

The unique indexes settle every race: a second claim of one message, or a second
address for one key, waits for the first transaction and then inserts nothing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from statifier.extras import MissingExtra
from statifier.persistence import LockTimeout
from statifier.persistence.sql.postgres import lock_timeout
from statifier.router.records import AddressRow, LedgerRow, ReapRow
from statifier.sql.names import TableNames
from statifier.sql.tables import Tables

try:
    import psycopg
except ModuleNotFoundError as missing:  # psycopg: the postgres extra
    raise MissingExtra.of(missing) from missing

__all__ = ["PostgresSession", "PostgresStatements"]

_LOCK_NOT_AVAILABLE = "55P03"

_LEDGER_COLUMNS = (  # after binding_id, in the order the ledger query selects them
    "message_id",
    "scope",
    "source",
    "outcome",
    "reason",
    "document",
    "key",
    "execution_id",
    "inserted_at",
)


class PostgresStatements:
    """The statement texts for one set of tables, made once per configuration."""

    def __init__(self, tables: Tables) -> None:
        names = TableNames.of(tables)
        dedupe, addresses = names.dedupe, names.addresses
        ledger, executions = names.routing_ledger, names.executions
        self.client_keys = tables.options.key_default
        key_column, key_value = ("id, ", "%(id)s, ") if self.client_keys else ("", "")
        self.claim = (
            f"INSERT INTO {dedupe} AS d ({key_column}binding_id, message_id, expires_at) "
            f"VALUES ({key_value}%(binding_id)s, %(message_id)s, %(expires_at)s) "
            "ON CONFLICT (binding_id, message_id) DO UPDATE SET expires_at = "
            "EXCLUDED.expires_at WHERE d.expires_at <= %(now)s RETURNING 1"
        )
        # The claim and the address lookup in one round trip: the lookup reads the
        # address table only, so the claim's insert in the same statement cannot hide
        # anything from it.
        self.claim_and_find = (
            f"WITH claim AS ({self.claim}) SELECT EXISTS (SELECT 1 FROM claim), "
            "a.id, a.execution_id, a.terminal_seen_at FROM (VALUES (1)) AS one "
            f"LEFT JOIN {addresses} AS a ON a.scope = %(scope)s "
            "AND a.document = %(document)s AND a.key = %(key)s"
        )
        self.find_address = (
            f"SELECT id, execution_id, terminal_seen_at FROM {addresses} "
            "WHERE scope = %(scope)s AND document = %(document)s AND key = %(key)s"
        )
        self.insert_address = (
            f"INSERT INTO {addresses} ({key_column}scope, document, key, execution_id, "
            f"inserted_at) VALUES ({key_value}%(scope)s, %(document)s, %(key)s, "
            "%(execution_id)s, %(now)s) ON CONFLICT (scope, document, key) DO NOTHING "
            "RETURNING id"
        )
        self.stamp = (
            f"UPDATE {addresses} SET terminal_seen_at = %(now)s "
            "WHERE id = ANY(%(ids)s) AND terminal_seen_at IS NULL"
        )
        self.record = (
            f"INSERT INTO {ledger} ({key_column}binding_id, message_id, scope, source, "
            "outcome, reason, document, key, execution_id, inserted_at) VALUES "
            f"({key_value}%(binding_id)s, %(message_id)s, %(scope)s, %(source)s, "
            "%(outcome)s, %(reason)s, %(document)s, %(key)s, %(execution_id)s, %(inserted_at)s)"
        )
        # Locks taken in the order given: the caller sorts them, so two transactions
        # that need the same keys take them in the same order and cannot deadlock.
        self.lock = "SELECT pg_advisory_xact_lock(k) FROM unnest(%(keys)s::bigint[]) AS k"
        self.set_timeout = (
            "SELECT current_setting('lock_timeout'), set_config('lock_timeout', %(t)s, true)"
        )
        self.restore_timeout = "SELECT set_config('lock_timeout', %(t)s, true)"
        self.reap_dedupe = f"DELETE FROM {dedupe} WHERE expires_at < %(now)s"
        self.reap_page = (
            "SELECT a.id, a.document, a.terminal_seen_at, e.status "
            f"FROM {addresses} AS a LEFT JOIN {executions} AS e "
            "ON e.execution_id = a.execution_id WHERE %(after)s::text IS NULL OR "
            "a.id > %(after_id)s ORDER BY a.id LIMIT %(limit)s"
        )
        self.delete_addresses = f"DELETE FROM {addresses} WHERE id = ANY(%(ids)s)"
        self.count_addresses = f"SELECT count(*) FROM {addresses} WHERE execution_id = ANY(%(ids)s)"
        self.named_by = (
            f"SELECT execution_id FROM {addresses} WHERE scope = %(scope)s "
            "AND document = %(document)s ORDER BY inserted_at DESC, id DESC LIMIT 1"
        )
        self.address_of = (
            f"SELECT scope, document, key FROM {addresses} WHERE execution_id = %(execution_id)s"
        )
        self.ledger = (
            "SELECT binding_id, message_id, scope, source, outcome, reason, document, key, "
            f"execution_id, inserted_at FROM {ledger} "
            "WHERE %(execution_id)s::text IS NULL OR execution_id = %(execution_id)s "
            "ORDER BY inserted_at, id"
        )


class PostgresSession:
    """The statements bound to one transaction's psycopg ``AsyncConnection``."""

    __slots__ = ("_driver", "_s")

    def __init__(self, statements: PostgresStatements, driver: Any) -> None:
        self._s = statements
        self._driver = driver

    def _keyed(self, values: dict[str, Any]) -> dict[str, Any]:
        if self._s.client_keys is not None:
            values["id"] = self._s.client_keys()
        return values

    async def command(self, sql: str) -> None:
        await self._driver.execute(sql)

    async def lock(self, keys: Sequence[int], wait: float | None) -> None:
        """Take ``keys`` (sorted by the caller) as transaction-scoped advisory locks,
        waiting at most ``wait`` seconds for them (``None``: as long as it takes).

        Raises:
            LockTimeout: not granted in time; the transaction must be rolled back (or
                rolled back to the savepoint the call runs in).
        """
        if not keys:
            return
        values = {"keys": list(keys)}
        if wait is None:
            await self._driver.execute(self._s.lock, values)
            return
        started = time.monotonic()
        cursor = await self._driver.execute(self._s.set_timeout, {"t": lock_timeout(wait)})
        row = await cursor.fetchone()
        try:
            await self._driver.execute(self._s.lock, values)
        except psycopg.Error as error:
            if getattr(error, "sqlstate", None) != _LOCK_NOT_AVAILABLE:
                raise
            raise LockTimeout("(the router's locks)", time.monotonic() - started) from None
        await self._driver.execute(self._s.restore_timeout, {"t": row[0]})

    async def claim(
        self, binding_id: str, message_id: str, now: datetime, expires_at: datetime
    ) -> bool:
        values = {
            "binding_id": binding_id,
            "message_id": message_id,
            "expires_at": expires_at,
            "now": now,
        }
        cursor = await self._driver.execute(self._s.claim, self._keyed(values))
        return await cursor.fetchone() is not None

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
        if address is None:
            return await self.claim(binding_id, message_id, now, expires_at), None
        scope, document, key = address
        values = {
            "binding_id": binding_id,
            "message_id": message_id,
            "expires_at": expires_at,
            "now": now,
            "scope": scope,
            "document": document,
            "key": key,
        }
        cursor = await self._driver.execute(self._s.claim_and_find, self._keyed(values))
        fresh, address_id, execution_id, terminal_seen_at = await cursor.fetchone()
        found = (
            None
            if address_id is None
            else AddressRow(
                address_id, execution_id=execution_id, terminal_seen_at=terminal_seen_at
            )
        )
        return bool(fresh), found

    async def find_address(self, scope: str, document: str, key: str) -> AddressRow | None:
        values = {"scope": scope, "document": document, "key": key}
        cursor = await self._driver.execute(self._s.find_address, values)
        row = await cursor.fetchone()
        return (
            None
            if row is None
            else AddressRow(row[0], execution_id=row[1], terminal_seen_at=row[2])
        )

    async def insert_address(
        self, scope: str, document: str, key: str, execution_id: str, now: datetime
    ) -> Any:
        values = {
            "scope": scope,
            "document": document,
            "key": key,
            "execution_id": execution_id,
            "now": now,
        }
        cursor = await self._driver.execute(self._s.insert_address, self._keyed(values))
        row = await cursor.fetchone()
        return None if row is None else row[0]

    async def stamp(self, address_ids: Sequence[Any], now: datetime) -> None:
        await self._driver.execute(self._s.stamp, {"ids": list(address_ids), "now": now})

    async def record(self, row: LedgerRow) -> None:
        await self._driver.execute(self._s.record, self._keyed(row.values()))

    async def record_many(self, rows: Sequence[LedgerRow]) -> None:
        if rows:
            async with self._driver.cursor() as cursor:
                await cursor.executemany(self._s.record, [self._keyed(r.values()) for r in rows])

    async def reap_dedupe(self, now: datetime) -> int:
        cursor = await self._driver.execute(self._s.reap_dedupe, {"now": now})
        return int(cursor.rowcount)

    async def reap_page(self, after: Any, limit: int) -> list[ReapRow]:
        values = {"after": None if after is None else str(after), "after_id": after}
        values["limit"] = limit
        cursor = await self._driver.execute(self._s.reap_page, values)
        return [
            ReapRow(row[0], document=row[1], terminal_seen_at=row[2], status=row[3])
            for row in await cursor.fetchall()
        ]

    async def delete_addresses(self, address_ids: Sequence[Any]) -> None:
        await self._driver.execute(self._s.delete_addresses, {"ids": list(address_ids)})

    async def count_addresses(self, execution_ids: Sequence[str]) -> int:
        cursor = await self._driver.execute(self._s.count_addresses, {"ids": list(execution_ids)})
        row = await cursor.fetchone()
        return int(row[0])

    async def named_by(self, scope: str, document: str) -> str | None:
        values = {"scope": scope, "document": document}
        cursor = await self._driver.execute(self._s.named_by, values)
        row = await cursor.fetchone()
        return None if row is None else str(row[0])

    async def address_of(self, execution_id: str) -> tuple[str, str, str] | None:
        cursor = await self._driver.execute(self._s.address_of, {"execution_id": execution_id})
        row = await cursor.fetchone()
        return None if row is None else (row[0], row[1], row[2])

    async def ledger(self, execution_id: str | None) -> list[LedgerRow]:
        cursor = await self._driver.execute(self._s.ledger, {"execution_id": execution_id})
        return [
            LedgerRow(row[0], **dict(zip(_LEDGER_COLUMNS, row[1:], strict=True)))
            for row in await cursor.fetchall()
        ]
