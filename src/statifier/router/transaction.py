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

:func:`retried` runs a block in a router transaction of its own and, when that
transaction loses a conflict (SQLSTATE 40001, a serialization failure: CockroachDB and
YugabyteDB report their conflicts so, PostgreSQL under ``SERIALIZABLE`` or
``REPEATABLE READ``; 40P01, a deadlock), rolls it back and runs the block again from its
start, a bounded number of times (:attr:`RouterConfig.transaction_attempts`). An
``async with`` block cannot be run again, so the block is a callable.
"""

from __future__ import annotations

import asyncio
import logging
import random
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
from typing import Final, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from statifier.core import StartOptions
from statifier.persistence import ErrorPolicy, Executions, Executor, LockTimeout, Storage
from statifier.persistence.reentry import hold
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
    "RETRYABLE_SQLSTATES",
    "Delivering",
    "HeldLocks",
    "RouterParts",
    "SendsOf",
    "Unit",
    "around",
    "lock_key",
    "retried",
    "retryable",
    "sorted_locks",
    "statements_for",
    "transaction",
]

_T = TypeVar("_T")
_log = logging.getLogger(__name__)

RETRYABLE_SQLSTATES: Final = frozenset({"40001", "40P01"})
"""The SQLSTATEs after which a router transaction is run again from its start: a
serialization failure (40001) and a deadlock (40P01). Either means the transaction lost
to a concurrent one and may well succeed if run again; neither means anything is wrong
with what it does."""

_BACKOFF_FIRST: Final = 0.01
"""The most seconds before the second attempt; each later wait may be twice as long."""
_BACKOFF_MOST: Final = 0.5
"""The most seconds any wait between attempts lasts."""


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
        retrying: whether a retryable failure (:func:`retryable`) runs this
            transaction again from its start (:func:`retried`, on an attempt before
            its last): see :meth:`reruns`.
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
        self.retrying = False
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

    async def lock_executions(self, execution_ids: Collection[str], what: str) -> list[str]:
        """Take the locks of ``execution_ids`` in one statement, in the one sorted order
        every such statement shares (two never deadlock), then read their rows in one
        more (:meth:`Storage.read_ahead
        <statifier.persistence.Storage.read_ahead>`): their steps enter in a
        :meth:`holding` block of the ids returned, sorted, and read at once. ``what``
        names them in an error.

        Raises:
            ReentrantCall: another open transaction of this task holds one of them.
            LockTimeout: on PostgreSQL, the locks were not granted within the
                configuration's ``lock_wait``; the transaction (or the savepoint the
                call runs in) must be rolled back.
        """
        ordered = sorted(execution_ids)
        if not ordered:
            return ordered
        hold(self.tx, [("execution", execution_id) for execution_id in ordered], what)
        if not await self.sql.lock_executions(ordered, self.config.lock_wait):
            raise LockTimeout(f"({what})", self.config.lock_wait or 0.0)
        await self.storage.read_ahead(ordered)
        return ordered

    def locked(self, execution_id: str) -> None:
        """Note that this transaction took ``execution_id``'s lock (a create did): in
        a :meth:`holding` block, its later steps enter at once as the held ones do;
        elsewhere nothing changes."""
        if isinstance(self.exclusion, HeldLocks):
            self.exclusion.held.add(execution_id)

    def reruns(self, error: BaseException) -> bool:
        """Whether ``error`` must end this whole transaction, to be run again from its
        start: a retryable failure while :attr:`retrying`. Code that answers a failure
        at a savepoint of its own (an event of a batch, a timer's fire) raises such an
        error on instead of answering it: on CockroachDB and YugabyteDB a conflict
        aborts the whole transaction, which no savepoint saves, and on PostgreSQL a run
        from the start is what a conflict asks for. On the last attempt, and in a
        caller's transaction, it is answered there as any other failure."""
        return self.retrying and retryable(error) is not None

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
    batch: bool = False,
) -> AsyncIterator[Unit]:
    """Open a router transaction on ``parts.storage``'s SQL adapter, commit it when
    the block ends and roll it back when it raises; or, given ``connection`` (with a
    transaction the caller began), run in that transaction and leave its end to the
    caller. The configuration's ``lock_wait`` bounds the wait for an execution's lock
    and for SQLite's single writer. ``entered`` is the entry whose ``around_delivery``
    call encloses its deliveries (:attr:`Unit.entered`). ``batch``: the transaction
    writes for many events; on SQLite its commit runs on a worker thread
    (``commit_in_thread`` of :meth:`SqlAdapter.transaction
    <statifier.persistence.sql.SqlAdapter.transaction>`).
    """
    adapter = parts.storage.adapter
    assert isinstance(adapter, SqlAdapter)
    source = adapter if connection is None else adapter.joined(connection)
    lock_wait = parts.config.lock_wait
    async with source.transaction(lock_wait, commit_in_thread=batch) as tx:
        exclusion: Serialization
        if parts.statements.dialect.row_locks:
            exclusion = AdapterLock(tx.adapter, lock_wait)
        else:
            exclusion = Unserialized()
        view = parts.storage.over(tx.adapter)
        sql = RoutingSession(parts.statements, tx.driver)
        yield Unit(parts, sql, tx, view, exclusion, entered)


def retryable(error: BaseException) -> str | None:
    """The SQLSTATE of ``error`` when it is one of :data:`RETRYABLE_SQLSTATES`, read
    on the driver's exception (psycopg's ``sqlstate``) or on the one SQLAlchemy wraps
    (``orig``); else ``None``. SQLite's errors carry no SQLSTATE: none is retryable."""
    for raised in (error, getattr(error, "orig", None)):
        state = getattr(raised, "sqlstate", None)
        if isinstance(state, str) and state in RETRYABLE_SQLSTATES:
            return state
    return None


async def retried(
    parts: RouterParts,
    work: Callable[[Unit], Awaitable[_T]],
    connection: sa.Connection | AsyncConnection | None = None,
    entered: Entry | None = None,
    batch: bool = False,
) -> _T:
    """Run ``work`` in a router transaction (:func:`transaction`, told ``entered`` and
    ``batch``),
    committed when it returns; answer what it returned in the attempt that committed.

    When the transaction fails with a retryable error (:func:`retryable`), in ``work``
    or at the commit, it is rolled back and ``work`` is run again in a new transaction
    from its start, after a short random wait (up to 10 ms, doubling each time, at
    most 0.5 s), at most ``parts.config.transaction_attempts`` times in all; the last
    attempt's error is raised, as is at once any error that is not retryable. Each
    retry is logged at WARNING with its SQLSTATE and attempt number.

    ``work`` must therefore build what it answers anew in each attempt and hand
    nothing outside the database before its commit that a second run would double.
    What it writes to the database is undone with the attempt; what a host hook or an
    executor does elsewhere inside it (``on_begin``, an ``around_delivery`` called in
    the transaction, an executor's call) is done again.

    Given ``connection``, a caller's transaction (:func:`transaction` joins it),
    ``work`` runs once and nothing is retried: the transaction is the caller's, and
    only the caller can run it again from its start. On SQLite nothing is retried
    either: its transaction holds the single writer throughout, so it loses no
    conflict (a wait for the writer is bounded by ``lock_wait``).
    """
    single = connection is not None or parts.statements.dialect.single_writer
    attempts = 1 if single else parts.config.transaction_attempts
    attempt = 1
    while True:
        try:
            async with transaction(parts, connection, entered, batch) as unit:
                unit.retrying = attempt < attempts
                return await work(unit)
        except Exception as error:
            state = retryable(error)
            if state is None or attempt >= attempts:
                raise
            # The driver's own first line: SQLAlchemy's text would add the statement's
            # parameters, which may hold an event's data.
            cause = getattr(error, "orig", None) or error
            said = (str(cause).strip().splitlines() or [""])[0]
            _log.warning(
                "a router transaction failed with SQLSTATE %s on attempt %d of %d and is "
                "run again: %s: %s",
                state,
                attempt,
                attempts,
                type(cause).__name__,
                said,
            )
        # Random, so that the transactions that conflicted do not meet again in step.
        await asyncio.sleep(
            random.uniform(0, min(_BACKOFF_MOST, _BACKOFF_FIRST * 2 ** (attempt - 1)))
        )
        attempt += 1


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
