"""One router transaction: the SQL adapter's transaction, the router's statements on
its driver connection, and the lifecycle over the adapter bound to it, so that a
delivery's dedupe claim, address, create, step and ledger row commit together or not
at all.

The transaction is :meth:`SqlAdapter.transaction`: on PostgreSQL a pooled connection in
a transaction, where each step takes the execution's lock, held until the
commit; on SQLite the adapter's single writer (the in-process lock and the database's
write lock) for the whole transaction, so every writer of the process, the router's and
the adapter's own, queues on one lock. Given a caller's connection, the same runs in the
caller's transaction through :meth:`SqlAdapter.joined`, and the caller ends it.

What a step's sends must know of the delivery that stepped it (its scope, its time, the
executions mid-step) travels as a :class:`Delivering`, passed down explicitly: each
delivery asks the unit for the lifecycle that performs its sends
(:meth:`Unit.executions`).

A transaction the router opens for one of its entries (:class:`~statifier.router.Entry`)
knows it (:attr:`Unit.entered`): a send to an execution target inside it is enclosed by
that entry's ``around_delivery`` call, and not wrapped again. :func:`around` is that
call, and :meth:`Unit.begin` the configuration's ``on_begin``.
"""

from __future__ import annotations

import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Iterator,
    Sequence,
)
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from statifier.core import StartOptions
from statifier.persistence import ErrorPolicy, Executions, Executor, LockTimeout, Storage
from statifier.persistence.serialization import AdapterLock, Serialization, Unserialized
from statifier.persistence.shards import Shard
from statifier.persistence.sql import SqlAdapter, SqlTransaction
from statifier.router.config import Entry, RouterConfig
from statifier.router.timer_queue import TimerQueue
from statifier.sql.caps import CapTable
from statifier.sql.dialect import lock_key
from statifier.sql.flow import FlowTable
from statifier.sql.routing import RoutingSession, RoutingStatements

__all__ = [
    "Delivering",
    "HeldLocks",
    "RouterParts",
    "SendsOf",
    "Unit",
    "around",
    "lock_key",
    "sorted_locks",
    "statements_for",
    "transaction",
]

_T = TypeVar("_T")


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
        # Built directly: dataclasses.replace costs a few microseconds, once a step.
        return Delivering(self.scope, self.now, (*self.stepping, execution_id))


class HeldLocks:
    """The exclusion of steps whose executions' locks the transaction took already
    (a timer worker's claim, a delivery batch's locks), held until it ends: a step of
    one of ``held`` enters at once; any other execution (a send's target) goes through
    ``others``."""

    def __init__(self, held: Collection[str], others: Serialization) -> None:
        self.held = set(held)
        self.others = others

    def exclusive(self, execution_id: str) -> AbstractAsyncContextManager[None]:
        if execution_id in self.held:
            return nullcontext()
        return self.others.exclusive(execution_id)


SendsOf = Callable[["Unit", Delivering], Executor]
"""Makes the executor that performs a delivery's sends, from the unit and the delivery."""


class Unit:
    """An open router transaction.

    Attributes:
        sql: the router's statements on the transaction's driver connection.
        tx: the SQL adapter's transaction itself.
        storage: the storage, bound to the transaction.
        exclusion: what a step of an execution takes before it runs: on PostgreSQL
            the execution's lock, held until the commit; on SQLite nothing,
            since the transaction already holds the database's single writer (a step
            then opens no nested block of its own, and one that raises is undone
            with its delivery).
        scheduled: how many timers the transaction's steps scheduled (the send
            handler counts them).
        entered: the entry whose ``around_delivery`` call encloses the deliveries run in
            this transaction, or ``None`` when none does (a call of the host's own).
    """

    def __init__(
        self,
        parts: RouterParts,
        sql: RoutingSession,
        tx: SqlTransaction,
        storage: Storage,
        exclusion: Serialization,
        entered: Entry | None = None,
    ) -> None:
        self.sql = sql
        self.tx = tx
        self.storage = storage
        self.exclusion = exclusion
        self.scheduled = 0
        self.entered = entered
        self._parts = parts

    @property
    def config(self) -> RouterConfig:
        """The router's configuration."""
        return self._parts.config

    @property
    def flow(self) -> FlowTable:
        """The statements of what debounce, batch and throttle bindings hold."""
        return self._parts.flow

    @property
    def caps(self) -> CapTable:
        """The statements of what caps on active executions count and hold."""
        return self._parts.caps

    @property
    def shard(self) -> Shard | None:
        """The router's place among the stores of a
        :class:`~statifier.router.ShardedRouter`, or ``None`` for a router of its own."""
        return self._parts.shard

    @property
    def timers(self) -> TimerQueue | None:
        """Where delayed sends wait, or ``None``."""
        return self._parts.timers

    @property
    def start_options(self) -> StartOptions:
        """What every create starts with (:attr:`RouterConfig.chart_start_options`)."""
        return self._parts.start_options

    def executions(self, delivering: Delivering) -> Executions:
        """The lifecycle over this transaction whose executor performs the sends of
        ``delivering``'s steps (the router's send handler), each step taking the unit's
        exclusion (in a :meth:`holding` block, one that knows the locks held)."""
        parts = self._parts
        return Executions(
            self.storage,
            executor=parts.sends_of(self, delivering),
            serialization=self.exclusion,
            on_error=parts.error_policy,
        )

    @contextmanager
    def holding(self, execution_ids: Collection[str]) -> Iterator[None]:
        """For the block, a step of one of ``execution_ids``, whose locks the caller
        took in this transaction, enters at once (:class:`HeldLocks`)."""
        before = self.exclusion
        self.exclusion = HeldLocks(execution_ids, before)
        try:
            yield
        finally:
            self.exclusion = before

    def deferred_steps(self) -> AbstractAsyncContextManager[None]:
        """For the block, the steps' writes queued and sent together
        (:meth:`Storage.deferred_steps <statifier.persistence.Storage.deferred_steps>`),
        unless a host hook runs in the transaction between the steps (``on_begin``,
        ``around_delivery``, ``on_step``, ``on_create``): a statement of its own, or a
        setting it makes for the next step (a tenant's row policy), would meet the
        queued writes out of their order."""
        config = self._parts.config
        hooks = (config.on_begin, config.around_delivery, config.on_step, config.on_create)
        if any(hook is not None for hook in hooks):
            return nullcontext()
        return self.storage.deferred_steps()

    def locked(self, execution_id: str) -> None:
        """Note that this transaction took ``execution_id``'s lock (a create did): in
        a :meth:`holding` block, its later steps enter at once as the held ones do;
        elsewhere nothing changes."""
        if isinstance(self.exclusion, HeldLocks):
            self.exclusion.held.add(execution_id)

    async def begin(self, scope: str, entry: Entry) -> None:
        """Call the configuration's ``on_begin``, if any, on this transaction: first in
        a delivery (or a fire), before any statement of it."""
        on_begin = self._parts.config.on_begin
        if on_begin is not None:
            await on_begin(self.tx, scope, entry)

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
    its configuration, the storage and statements it runs on (the flow and cap
    tables' too),
    the timer queue, the start options and error policy of its steps, and what
    performs their sends."""

    config: RouterConfig
    storage: Storage
    statements: RoutingStatements
    flow: FlowTable
    caps: CapTable
    timers: TimerQueue | None
    start_options: StartOptions
    error_policy: ErrorPolicy
    sends_of: SendsOf
    shard: Shard | None = None


@asynccontextmanager
async def transaction(
    parts: RouterParts,
    connection: sa.Connection | AsyncConnection | None = None,
    entered: Entry | None = None,
) -> AsyncIterator[Unit]:
    """Open a router transaction on ``parts.storage``'s SQL adapter, commit it when
    the block ends and roll it back when it raises; or, given ``connection`` (with a
    transaction the caller began), run in that transaction and leave its end to the
    caller. The configuration's ``lock_wait`` bounds the wait for an execution's lock
    and for SQLite's single writer. ``entered`` is the entry whose ``around_delivery``
    call encloses its deliveries (:attr:`Unit.entered`).
    """
    adapter = parts.storage.adapter
    assert isinstance(adapter, SqlAdapter)
    source = adapter if connection is None else adapter.joined(connection)
    lock_wait = parts.config.lock_wait
    async with source.transaction(lock_wait) as tx:
        exclusion: Serialization
        if parts.statements.dialect.row_locks:
            exclusion = AdapterLock(tx.adapter, lock_wait)
        else:
            exclusion = Unserialized()
        view = parts.storage.over(tx.adapter)
        sql = RoutingSession(parts.statements, tx.driver)
        yield Unit(parts, sql, tx, view, exclusion, entered)


async def around(
    config: RouterConfig, scope: str, entry: Entry, work: Callable[[], Awaitable[_T]]
) -> _T:
    """``work`` under the configuration's ``around_delivery``, told ``scope`` and
    ``entry``; ``work`` alone when there is none."""
    wrapper = config.around_delivery
    if wrapper is None:
        return await work()
    result: _T = await wrapper(scope, entry, work)
    return result


def sorted_locks(keys: Iterable[int]) -> list[int]:
    """Distinct lock keys in the one order every transaction takes them in."""
    return sorted(set(keys))
