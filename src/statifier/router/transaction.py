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

What a step's sends must know of the delivery that stepped it (its scope, its time, the
executions mid-step) travels as a :class:`Delivering`, passed down explicitly: each
delivery asks the unit for the lifecycle that performs its sends
(:meth:`Unit.executions`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, replace
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from statifier.core import StartOptions
from statifier.persistence import ErrorPolicy, Executions, Executor, LockTimeout, Storage
from statifier.persistence.serialization import Serialization, Unserialized
from statifier.persistence.sql import SqlAdapter, SqlTransaction
from statifier.router.config import RouterConfig
from statifier.router.timer_queue import TimerQueue
from statifier.sql.dialect import lock_key
from statifier.sql.routing import RoutingSession, RoutingStatements

__all__ = [
    "Delivering",
    "RouterParts",
    "SendsOf",
    "Unit",
    "lock_key",
    "sorted_locks",
    "statements_for",
    "transaction",
]


@dataclass(frozen=True, slots=True)
class Delivering:
    """The delivery in progress, as the sends of its steps see it.

    Attributes:
        scope: the delivery's scope (``None`` for one with no scope): route sends
            resolve there.
        now: the delivery's time: delayed sends are timed from it.
        stepping: the executions mid-step, innermost last: a send to one of them would
            step it inside its own step, and is refused.
    """

    scope: str | None
    now: datetime
    stepping: tuple[str, ...] = ()

    def into(self, execution_id: str) -> Delivering:
        """This delivery with ``execution_id`` mid-step, innermost."""
        return replace(self, stepping=(*self.stepping, execution_id))


SendsOf = Callable[["Unit", Delivering], Executor]
"""Makes the executor that performs a delivery's sends, from the unit and the delivery."""


class Unit:
    """An open router transaction.

    Attributes:
        sql: the router's statements on the transaction's driver connection.
        tx: the SQL adapter's transaction itself.
        config: the router's configuration.
        storage: the storage, bound to the transaction.
        timers: where delayed sends wait, or ``None``.
        start_options: what every create starts with
            (:attr:`RouterConfig.chart_start_options`).
        scheduled: how many timers the transaction's steps scheduled (the send
            handler counts them).
    """

    def __init__(
        self,
        sql: RoutingSession,
        tx: SqlTransaction,
        config: RouterConfig,
        storage: Storage,
        timers: TimerQueue | None,
        start_options: StartOptions,
        lifecycle: Callable[[Executor], Executions],
        sends_of: SendsOf,
    ) -> None:
        self.sql = sql
        self.tx = tx
        self.config = config
        self.storage = storage
        self.timers = timers
        self.start_options = start_options
        self.scheduled = 0
        self._lifecycle = lifecycle
        self._sends_of = sends_of

    def executions(self, delivering: Delivering) -> Executions:
        """The lifecycle over this transaction whose executor performs the sends of
        ``delivering``'s steps (the router's send handler)."""
        return self._lifecycle(self._sends_of(self, delivering))

    def executions_with(self, serialization: Serialization, delivering: Delivering) -> Executions:
        """:meth:`executions` with another exclusion (the timer worker's, which knows
        the locks its claim holds)."""
        lifecycle = self.executions(delivering)
        return Executions(
            lifecycle.storage,
            executor=lifecycle.executor,
            serialization=serialization,
            on_error=lifecycle.on_error,
        )

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


@dataclass(frozen=True, slots=True)
class RouterParts:
    """What every transaction of one router is opened with, built once by the router:
    its configuration, the storage and statements it runs on, the timer queue, the
    start options and error policy of its steps, and what performs their sends."""

    config: RouterConfig
    storage: Storage
    statements: RoutingStatements
    timers: TimerQueue | None
    start_options: StartOptions
    error_policy: ErrorPolicy
    sends_of: SendsOf


@asynccontextmanager
async def transaction(
    parts: RouterParts, connection: sa.Connection | AsyncConnection | None = None
) -> AsyncIterator[Unit]:
    """Open a router transaction on ``parts.storage``'s SQL adapter, commit it when
    the block ends and roll it back when it raises; or, given ``connection`` (with a
    transaction the caller began), run in that transaction and leave its end to the
    caller. The configuration's ``lock_wait`` bounds the wait for an execution's lock
    and for SQLite's single writer.
    """
    adapter = parts.storage.adapter
    assert isinstance(adapter, SqlAdapter)
    source = adapter if connection is None else adapter.joined(connection)
    lock_wait = parts.config.lock_wait
    async with source.transaction(lock_wait) as tx:
        view = parts.storage.over(tx.adapter)
        policy = parts.error_policy

        def lifecycle(executor: Executor) -> Executions:
            if parts.statements.dialect.row_locks:
                # Each step takes its execution's advisory lock, held until the commit.
                return Executions(view, executor=executor, lock_wait=lock_wait, on_error=policy)
            # The transaction already holds SQLite's single writer, the exclusion every
            # step needs: a step opens no nested block of its own (and no savepoint),
            # and a step that raises is undone with its delivery.
            return Executions(
                view, executor=executor, serialization=Unserialized(), on_error=policy
            )

        yield Unit(
            RoutingSession(parts.statements, tx.driver),
            tx,
            parts.config,
            view,
            parts.timers,
            parts.start_options,
            lifecycle,
            parts.sends_of,
        )


def sorted_locks(keys: Iterable[int]) -> list[int]:
    """Distinct lock keys in the one order every transaction takes them in."""
    return sorted(set(keys))
