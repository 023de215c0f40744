"""One router transaction: the connection, the router's statements on its driver, and
a view of the SQL adapter joined to it, so that a delivery's dedupe claim, address,
create, step and ledger row commit together or not at all.

On PostgreSQL the transaction is a plain one on a connection of the adapter's engine;
each step inside it takes the execution's advisory lock, held until the commit. On
SQLite it also holds the adapter's single writer (the in-process lock and the
database's write lock) from its start, so every writer of the process, the router's
and the adapter's own, queues on one lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import sqlite3
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from statifier.persistence import Executions, Storage
from statifier.persistence.sql import SqlAdapter
from statifier.router.postgres import PostgresSession, PostgresStatements
from statifier.router.sqlite import SqliteSession, SqliteStatements

__all__ = ["Session", "Statements", "Unit", "address_lock", "statements_for", "transaction"]

Session = PostgresSession | SqliteSession
Statements = PostgresStatements | SqliteStatements

# What a SQLite transaction's hold on the single writer is called in a LockTimeout.
_WRITER: Final = "statifier.router"


@dataclass(slots=True)
class Unit:
    """An open router transaction.

    Attributes:
        sql: the router's statements on the transaction's driver connection.
        executions: the lifecycle over the adapter joined to the transaction.
        savepoints: how many savepoints this unit has opened (names stay unique).
    """

    sql: Session
    executions: Executions
    savepoints: int = 0

    @asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        """A savepoint: what the block wrote is undone if it raises, and the rest of
        the transaction stays usable."""
        self.savepoints += 1
        name = f"statifier_delivery_{self.savepoints}"
        await self.sql.command(f"SAVEPOINT {name}")
        try:
            yield
        except BaseException:
            await self.sql.command(f"ROLLBACK TO SAVEPOINT {name}")
            await self.sql.command(f"RELEASE SAVEPOINT {name}")
            raise
        await self.sql.command(f"RELEASE SAVEPOINT {name}")


def statements_for(adapter: SqlAdapter) -> Statements:
    """The router's statement texts for the adapter's database and tables."""
    if isinstance(adapter.engine, AsyncEngine):
        return PostgresStatements(adapter.tables)
    return SqliteStatements(adapter.tables)


def address_lock(*parts: str) -> int:
    """A signed 64-bit advisory lock key for an address or a dedupe claim."""
    digest = hashlib.blake2b("\x00".join(("statifier.router", *parts)).encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big", signed=True)


@asynccontextmanager
async def transaction(
    storage: Storage,
    statements: Statements,
    executions: dict[str, Any],
    connection: sa.Connection | AsyncConnection | None = None,
    lock_wait: float | None = None,
    gate: asyncio.Lock | None = None,
) -> AsyncIterator[Unit]:
    """Open a router transaction on ``storage``'s SQL adapter, commit it when the block
    ends and roll it back when it raises; or, given ``connection`` (with a transaction
    the caller began), run in that transaction and leave its end to the caller.

    ``executions`` are the keyword arguments of the :class:`Executions` the unit gets
    (executor, lock wait). On SQLite, ``gate`` is taken before a connection is checked
    out of the engine's pool: the transactions queue on it rather than each holding a
    pooled connection while it waits for the single writer (a checkout that finds the
    pool empty would block the event loop).
    """
    adapter = storage.adapter
    assert isinstance(adapter, SqlAdapter)
    engine = adapter.engine
    if isinstance(engine, AsyncEngine):
        assert isinstance(statements, PostgresStatements)
        if connection is not None:
            assert isinstance(connection, AsyncConnection)
            yield await _postgres_unit(storage, statements, executions, connection)
            return
        async with engine.connect() as own:
            await own.begin()
            yield await _postgres_unit(storage, statements, executions, own)
            await own.commit()
        return
    assert isinstance(statements, SqliteStatements)
    if connection is not None:
        assert isinstance(connection, sa.Connection)
        async with _sqlite_unit(storage, statements, executions, connection, lock_wait) as unit:
            yield unit
        return
    async with gate or contextlib.nullcontext():
        with engine.connect() as own:
            own.begin()
            async with _sqlite_unit(storage, statements, executions, own, lock_wait) as unit:
                yield unit
            own.commit()


async def _postgres_unit(
    storage: Storage,
    statements: PostgresStatements,
    executions: dict[str, Any],
    connection: AsyncConnection,
) -> Unit:
    adapter = storage.adapter
    assert isinstance(adapter, SqlAdapter)
    driver = (await connection.get_raw_connection()).driver_connection
    view = adapter.joined(connection)
    return Unit(PostgresSession(statements, driver), Executions(storage.over(view), **executions))


@asynccontextmanager
async def _sqlite_unit(
    storage: Storage,
    statements: SqliteStatements,
    executions: dict[str, Any],
    connection: sa.Connection,
    lock_wait: float | None,
) -> AsyncIterator[Unit]:
    adapter = storage.adapter
    assert isinstance(adapter, SqlAdapter)
    driver = connection.connection.driver_connection
    assert isinstance(driver, sqlite3.Connection)
    view = adapter.joined(connection)
    async with view.exclusive(_WRITER, lock_wait):
        yield Unit(SqliteSession(statements, driver), Executions(storage.over(view), **executions))


def sorted_locks(keys: Iterable[int]) -> list[int]:
    """Distinct lock keys in the one order every transaction takes them in."""
    return sorted(set(keys))
