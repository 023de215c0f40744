"""One router transaction: the SQL adapter's transaction, the router's statements on
its driver connection, and the lifecycle over the adapter bound to it, so that a
delivery's dedupe claim, address, create, step and ledger row commit together or not
at all.

The transaction is :meth:`SqlAdapter.transaction`: on PostgreSQL a pooled connection in
a transaction, where each step takes the execution's advisory lock, held until the
commit; on SQLite the adapter's single writer (the in-process lock and the database's
write lock) for the whole transaction, so every writer of the process, the router's and
the adapter's own, queues on one lock. Given a caller's connection, the same runs in the
caller's transaction through :meth:`SqlAdapter.joined`, and the caller ends it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from statifier.persistence import ErrorPolicy, Executions, Executor, LockTimeout, Storage
from statifier.persistence.serialization import Unserialized
from statifier.persistence.sql import SqlAdapter, SqlTransaction
from statifier.sql.dialect import lock_key
from statifier.sql.routing import RoutingSession, RoutingStatements

__all__ = ["Unit", "lock_key", "statements_for", "transaction"]


@dataclass(slots=True)
class Unit:
    """An open router transaction.

    Attributes:
        sql: the router's statements on the transaction's driver connection.
        executions: the lifecycle over the adapter bound to the transaction (its
            executor is the router's send handler).
        tx: the SQL adapter's transaction itself.
        scope: the scope of the delivery in progress (``None`` outside one, or for a
            delivery with no scope): the sends of its steps resolve routes there.
        now: the time of the delivery in progress: delayed sends are timed from it.
        stepping: the executions mid-step in this transaction, innermost last: a send
            to one of them would step it inside its own step, and is refused.
        scheduled: how many timers the transaction's steps scheduled.
    """

    sql: RoutingSession
    executions: Executions
    tx: SqlTransaction
    scope: str | None = None
    now: datetime = field(default_factory=lambda: datetime.now(UTC))
    stepping: list[str] = field(default_factory=list)
    scheduled: int = 0

    def savepoint(self) -> AbstractAsyncContextManager[None]:
        """A savepoint: what the block wrote is undone if it raises, and the rest of
        the transaction stays usable."""
        return self.tx.savepoint()

    async def lock(self, keys: Sequence[int], wait: float | None) -> None:
        """Take the router's locks ``keys`` (sorted: :func:`sorted_locks`), held until
        the transaction ends, waiting at most ``wait`` seconds for them (``None``: as
        long as it takes). On SQLite the transaction's single writer already excludes
        every other: nothing is taken.

        Raises:
            LockTimeout: not granted in time; the transaction must be rolled back (or
                rolled back to the savepoint the call runs in).
        """
        started = time.monotonic()
        if not await self.sql.lock(keys, wait):
            raise LockTimeout("(the router's locks)", time.monotonic() - started)


def statements_for(adapter: SqlAdapter) -> RoutingStatements:
    """The router's statements for the adapter's database and tables."""
    return RoutingStatements(adapter.tables, adapter.dialect)


@asynccontextmanager
async def transaction(
    storage: Storage,
    statements: RoutingStatements,
    executor: Callable[[Unit], Executor],
    connection: sa.Connection | AsyncConnection | None = None,
    lock_wait: float | None = None,
    on_error: ErrorPolicy | None = None,
) -> AsyncIterator[Unit]:
    """Open a router transaction on ``storage``'s SQL adapter, commit it when the block
    ends and roll it back when it raises; or, given ``connection`` (with a transaction
    the caller began), run in that transaction and leave its end to the caller.

    ``executor`` makes the executor of the unit's lifecycle from the unit (the send
    handler reads the delivery in progress from it). ``lock_wait`` bounds the wait for
    an execution's lock and for SQLite's single writer; ``on_error`` is the lifecycle's
    policy for errors no transition takes.
    """
    adapter = storage.adapter
    assert isinstance(adapter, SqlAdapter)
    source = adapter if connection is None else adapter.joined(connection)
    policy = ErrorPolicy() if on_error is None else on_error
    async with source.transaction(lock_wait) as tx:
        yield _unit(storage, statements, executor, tx, lock_wait, policy)


def _unit(
    storage: Storage,
    statements: RoutingStatements,
    executor: Callable[[Unit], Executor],
    tx: SqlTransaction,
    lock_wait: float | None,
    on_error: ErrorPolicy,
) -> Unit:
    view = storage.over(tx.adapter)
    unit = Unit(RoutingSession(statements, tx.driver), Executions(view), tx)
    if statements.dialect.row_locks:
        # Each step takes its execution's advisory lock, held until the commit.
        unit.executions = Executions(
            view, executor=executor(unit), lock_wait=lock_wait, on_error=on_error
        )
        return unit
    # The transaction already holds SQLite's single writer, the exclusion every step
    # needs: a step opens no nested block of its own (and no savepoint), and a step
    # that raises is undone with its delivery.
    unit.executions = Executions(
        view, executor=executor(unit), serialization=Unserialized(), on_error=on_error
    )
    return unit


def sorted_locks(keys: Iterable[int]) -> list[int]:
    """Distinct lock keys in the one order every transaction takes them in."""
    return sorted(set(keys))
