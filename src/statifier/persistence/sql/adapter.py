"""The SQL adapter: durable executions on PostgreSQL or SQLite.

:class:`SqlAdapter` is the front: it opens the database, and hands every call to the
module of its database, which runs the statements of the storage layer
(:mod:`statifier.sql.executions`, and the transaction control of
:mod:`statifier.sql.dialect` and the database's dialect module) on the driver
(:mod:`statifier.persistence.sql.postgres` on psycopg 3,
:mod:`statifier.persistence.sql.sqlite` on ``sqlite3``).

On PostgreSQL ``exclusive`` is a transaction holding the lock of a 64-bit key of the
execution id (an advisory lock, or a row of the ``locks`` table where
``TableOptions.locks`` is ``"rows"``: :mod:`statifier.sql.locks`; ``lock_timeout``
bounds the wait), and
``fetch_execution`` inside it reads with ``SELECT ... FOR UPDATE``. On SQLite it is the
single writer: an asyncio lock per adapter, then ``BEGIN IMMEDIATE`` retried without
blocking the loop until the wait runs out, which keeps other processes out too. Both
declare every capability; SQLite lists by metadata through its JSON functions,
PostgreSQL through ``jsonb`` containment and a GIN index.

Inside ``async with adapter.exclusive(id)``, every call the task makes runs in the
block's transaction, committed when it ends and rolled back if it raises. Outside, each
call is a short transaction of its own. :meth:`SqlAdapter.transaction` opens a
transaction of the adapter's own for a caller that runs its own SQL beside the
adapter's; :meth:`SqlAdapter.joined` binds the adapter to a transaction the caller
opened on the engine.

The tables must exist: build them with :mod:`statifier.sql.migrations` (or
``statifier db upgrade``). Without them, a call raises
:class:`statifier.sql.TablesMissing`, which says so, where the error surfaces: in a
call's own transaction, or when an ``exclusive`` block or a ``transaction`` of the
adapter's own ends (in a view's transaction, the caller's, the driver's error stays as
it is). A PostgreSQL URL without psycopg raises
:class:`statifier.extras.MissingExtra` naming the postgres extra.

>>> import asyncio, os, tempfile
>>> from datetime import UTC, datetime
>>> from statifier.persistence.records import ChartRecord
>>> from statifier.sql import migrations
>>> url = f"sqlite:///{os.path.join(tempfile.mkdtemp(), 'doc.db')}"
>>> migrations.upgrade(url)
>>> async def main() -> str | None:
...     async with SqlAdapter(url) as adapter:
...         now = datetime(2026, 1, 1, tzinfo=UTC)
...         await adapter.save_chart(ChartRecord(
...             "h1", source=b"<scxml/>", name="demo", version="1", saved_at=now
...         ))
...         chart = await adapter.fetch_chart("h1")
...         return chart.name if chart else None
>>> asyncio.run(main())
'demo'
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import replace
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Protocol

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from statifier.extras import MissingExtra
from statifier.persistence.adapter import Capabilities
from statifier.persistence.records import (
    AnswerRecord,
    ChartRecord,
    ErrorRecord,
    ExecutionRecord,
    InputRecord,
    PositionRecord,
    Status,
    StepWrite,
)
from statifier.persistence.sql.schema import EVERYTHING, TableOptions, Tables, chosen_tables
from statifier.sql.dialect import Dialect
from statifier.sql.engines import database_url, dialect_of, dispose, open_engine

if TYPE_CHECKING:
    from statifier.persistence.sql.postgres import PostgresDatabase
    from statifier.persistence.sql.sqlite import SqliteDatabase

__all__ = ["POOL_SIZE", "SqlAdapter", "SqlTransaction"]

_BATCHED: Final = replace(EVERYTHING, batched_steps=True)

POOL_SIZE: Final = 20
"""Connections an adapter made from a PostgreSQL URL keeps at most: past as many
blocks at once, blocks wait for one."""


class SqlTransaction(Protocol):
    """An open transaction of :meth:`SqlAdapter.transaction`.

    Attributes:
        driver: the driver's connection, on which the caller runs its own SQL in the
            same transaction: a :class:`psycopg.AsyncConnection` on PostgreSQL, a
            :class:`sqlite3.Connection` on SQLite.
        adapter: the adapter bound to the transaction: every call, ``exclusive``
            included, runs in it, and a block nested in a block is a savepoint.
        held: the locks taken in it (:mod:`statifier.persistence.reentry`).
    """

    driver: Any
    adapter: SqlAdapter
    held: set[object]

    def savepoint(self) -> AbstractAsyncContextManager[None]:
        """``async with tx.savepoint():`` undoes what the block wrote if it raises; the
        rest of the transaction stays usable."""
        ...


class SqlAdapter:
    """An :class:`~statifier.persistence.adapter.Adapter` on PostgreSQL or SQLite.

    Args:
        target: a database URL (``postgresql://`` or ``postgresql+psycopg://`` runs on
            psycopg 3 async; ``sqlite:///path`` on ``sqlite3``), an
            :class:`~sqlalchemy.ext.asyncio.AsyncEngine` for PostgreSQL, or an
            :class:`~sqlalchemy.Engine` for SQLite. An engine given is the caller's to
            dispose; one made from a URL is disposed by :meth:`close`.
        tables: the tables (or their options) the migrations built; the defaults if
            ``None``.

    Raises:
        ValueError: a database other than PostgreSQL or SQLite, an async engine for
            SQLite, or a schema on SQLite.

    The adapter keeps connections between calls (on SQLite one; on PostgreSQL a pool of
    up to 20 when made from a URL, else the given engine's pool), so :meth:`close` it, or
    use it as ``async with``. On SQLite an engine made from a URL switches a file
    database to WAL; calls from tasks other than the one inside an ``exclusive`` block
    wait for the block to end, so a block must not await another task that calls the
    adapter.
    """

    __slots__ = ("_db", "_dialect", "_engine", "_owned", "_tables")

    _db: PostgresDatabase | SqliteDatabase

    def __init__(
        self,
        target: str | sa.URL | sa.Engine | AsyncEngine,
        tables: Tables | TableOptions | None = None,
    ) -> None:
        chosen = chosen_tables(tables)
        url: sa.URL | None = None
        engine: sa.Engine | AsyncEngine
        if isinstance(target, (str, sa.URL)):
            try:
                url = database_url(target)
            except ValueError:
                raise ValueError(
                    f"durable executions run on PostgreSQL or SQLite, not {target!r}"
                ) from None
            try:
                engine = open_engine(url, pool_size=POOL_SIZE)
            except ModuleNotFoundError as missing:  # psycopg: the postgres extra
                raise MissingExtra.of(missing) from missing
        else:
            engine = target
        dialect = dialect_of(engine)
        if chosen.options.schema is not None and not dialect.schemas:
            raise ValueError("a schema needs PostgreSQL")
        self._tables = chosen
        self._engine = engine
        self._dialect = dialect
        self._owned = url is not None
        # The database's module is imported only when it is used: the sqlite extra
        # comes without psycopg. SQLite's is the single writer's (one connection, a
        # transaction that holds the writer from its start); PostgreSQL's pools
        # connections and locks each execution of its own.
        if dialect.single_writer:
            from statifier.persistence.sql import sqlite

            assert isinstance(engine, sa.Engine)
            self._db = sqlite.SqliteDatabase(sqlite.Shared(engine, self._owned, chosen))
        else:
            try:
                from statifier.persistence.sql import postgres
            except ModuleNotFoundError as missing:  # psycopg: the postgres extra
                raise MissingExtra.of(missing) from missing

            assert not isinstance(engine, sa.Engine)
            self._db = postgres.PostgresDatabase(postgres.Shared(engine, self._owned, chosen, url))

    def _view(self, db: PostgresDatabase | SqliteDatabase) -> SqlAdapter:
        view = SqlAdapter.__new__(SqlAdapter)
        view._tables, view._engine, view._dialect = self._tables, self._engine, self._dialect
        view._owned, view._db = False, db
        return view

    @property
    def capabilities(self) -> Capabilities:
        # Only PostgreSQL gains from sending steps' writes together: SQLite's run in
        # process, with no round trip to save.
        return _BATCHED if self._dialect.writes_in_with else EVERYTHING

    @property
    def tables(self) -> Tables:
        """The tables this adapter reads and writes."""
        return self._tables

    @property
    def dialect(self) -> Dialect:
        """How the statements of :mod:`statifier.sql` bind, convert and run on this
        adapter's database (on ``tx.driver`` of its transactions)."""
        return self._dialect

    @property
    def engine(self) -> sa.Engine | AsyncEngine:
        """The engine: an :class:`AsyncEngine` on PostgreSQL, a sync :class:`Engine` on
        SQLite. Open a transaction for :meth:`joined` on it (on SQLite, on an engine
        the adapter made, ``begin()`` begins a real transaction)."""
        return self._engine

    def transaction(
        self, wait: float | None = None, *, commit_in_thread: bool = False
    ) -> AbstractAsyncContextManager[SqlTransaction]:
        """``async with adapter.transaction() as tx:`` a transaction of the adapter's
        own, committed when the block ends and rolled back when it raises.

        On SQLite it holds the single writer (the in-process lock and
        ``BEGIN IMMEDIATE``) for its whole length, waiting at most ``wait`` seconds for
        it (then :class:`~statifier.persistence.LockTimeout`); on PostgreSQL it is a
        pooled connection in a transaction, and takes no lock. ``tx.driver`` is the
        driver's connection for the caller's own SQL, ``tx.adapter`` the adapter bound
        to the transaction (see :class:`SqlTransaction`).

        On a view (of :meth:`joined`, or a ``tx.adapter``) it is a part of the view's
        transaction, which its owner ends: on SQLite it holds the single writer for the
        block.

        ``commit_in_thread``: (SQLite, an adapter opened on a file by URL) the
        ``COMMIT`` runs on a worker thread, so that the event loop runs other tasks
        while SQLite writes and syncs the file (the writer stays held till it ends);
        worth its hop to the thread for a transaction of many writes, a batch, not for
        a single step's. A cancellation meanwhile is raised once the commit has ended,
        which may have committed. Elsewhere the commit runs as always (PostgreSQL's
        never holds the loop).

        Raises:
            LockTimeout: (SQLite) the writer stayed busy past ``wait``.
            ReentrantCall: (SQLite) the task already holds the writer in an
                ``exclusive`` block of this adapter: use that block's transaction.
            AdapterClosed: (SQLite) the adapter was closed (PostgreSQL: the pool's
                ``PoolClosed``).
        """
        return self._transaction(wait, commit_in_thread)

    @asynccontextmanager
    async def _transaction(
        self, wait: float | None, commit_in_thread: bool
    ) -> AsyncIterator[SqlTransaction]:
        db = self._db
        async with db.transaction(wait, commit_in_thread) as tx:
            # A view's transaction is the view's own: its adapter is the view.
            tx.adapter = self if db.view is not None else self._view(db.bound(tx))  # type: ignore[arg-type]
            yield tx

    def joined(self, connection: sa.Connection | AsyncConnection) -> SqlAdapter:
        """A view of this adapter bound to ``connection``, on which the caller has begun
        a transaction (an :class:`AsyncConnection` on PostgreSQL, a
        :class:`~sqlalchemy.Connection` on SQLite).

        Every call of the view, ``exclusive`` included, runs in that transaction and
        never commits or rolls it back: what the calls wrote commits with the caller's
        commit and vanishes with its rollback, and the execution's lock (PostgreSQL's
        transaction-scoped lock, SQLite's write lock) is held until then. A
        lock wait that times out leaves the caller's transaction usable. The view
        shares the adapter's engine and in-process lock; closing it closes nothing.
        """
        return self._view(self._db.joined(connection))

    async def close(self) -> None:
        """Give back the adapter's connections, and dispose of the engine if the adapter
        made it from a URL. Closing a view closes nothing. On SQLite the transaction
        under way ends first (at most a few seconds, then it is rolled back), and
        later calls raise :class:`~statifier.persistence.AdapterClosed`."""
        await self._db.close()
        if self._owned and self._db.view is None:
            await dispose(self._engine)

    async def __aenter__(self) -> SqlAdapter:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    # The adapter's calls: each hands the database's coroutine back as it is (no
    # coroutine of its own in between: a step makes three).

    def save_chart(self, chart: ChartRecord) -> Coroutine[Any, Any, ChartRecord]:
        return self._db.save_chart(chart)

    def fetch_chart(self, content_hash: str) -> Coroutine[Any, Any, ChartRecord | None]:
        return self._db.fetch_chart(content_hash)

    def retire_chart(
        self, content_hash: str, retired_by: str, retired_at: datetime
    ) -> Coroutine[Any, Any, ChartRecord | None]:
        return self._db.retire_chart(content_hash, retired_by, retired_at)

    def insert_execution(self, record: ExecutionRecord) -> Coroutine[Any, Any, None]:
        return self._db.insert_execution(record)

    def fetch_execution(self, execution_id: str) -> Coroutine[Any, Any, ExecutionRecord | None]:
        return self._db.fetch_execution(execution_id)

    def fetch_executions(
        self, execution_ids: Sequence[str]
    ) -> Coroutine[Any, Any, list[ExecutionRecord]]:
        return self._db.fetch_executions(execution_ids)

    def update_execution(self, record: ExecutionRecord) -> Coroutine[Any, Any, None]:
        return self._db.update_execution(record)

    def record_step(
        self,
        record: ExecutionRecord,
        via: str,
        event: bytes,
        recorded_at: datetime,
        cap: int | None,
        errors: Sequence[ErrorRecord] = (),
    ) -> Coroutine[Any, Any, int | None]:
        return self._db.record_step(record, via, event, recorded_at, cap, errors)

    def record_steps(
        self, steps: Sequence[StepWrite], cap: int | None
    ) -> Coroutine[Any, Any, None]:
        return self._db.record_steps(steps, cap)

    def record_errors(self, errors: Sequence[ErrorRecord]) -> Coroutine[Any, Any, None]:
        return self._db.record_errors(errors)

    def errors(self, execution_id: str, limit: int) -> Coroutine[Any, Any, list[ErrorRecord]]:
        return self._db.errors(execution_id, limit)

    def rechart_execution(
        self, record: ExecutionRecord, from_hash: str
    ) -> Coroutine[Any, Any, bool]:
        return self._db.rechart_execution(record, from_hash)

    def count_executions_on(self, content_hash: str) -> Coroutine[Any, Any, Mapping[Status, int]]:
        return self._db.count_executions_on(content_hash)

    def pinning_executions(self, content_hash: str) -> Coroutine[Any, Any, list[str]]:
        return self._db.pinning_executions(content_hash)

    def list_by_metadata(
        self, pairs: Mapping[str, str]
    ) -> Coroutine[Any, Any, list[ExecutionRecord]]:
        return self._db.list_by_metadata(pairs)

    def statuses_by_metadata(
        self, pairs: Mapping[str, str]
    ) -> Coroutine[Any, Any, dict[str, Status]]:
        return self._db.statuses_by_metadata(pairs)

    def count_linked_children_on(self, content_hash: str) -> Coroutine[Any, Any, int]:
        return self._db.count_linked_children_on(content_hash)

    def insert_answer(self, record: AnswerRecord) -> Coroutine[Any, Any, None]:
        return self._db.insert_answer(record)

    def fetch_answer(self, child_id: str) -> Coroutine[Any, Any, AnswerRecord | None]:
        return self._db.fetch_answer(child_id)

    def undelivered_answers(self, limit: int) -> Coroutine[Any, Any, list[AnswerRecord]]:
        return self._db.undelivered_answers(limit)

    def mark_delivered(
        self, child_ids: Sequence[str], delivered_at: datetime
    ) -> Coroutine[Any, Any, None]:
        return self._db.mark_delivered(child_ids, delivered_at)

    def take_fan_out_end(
        self, parent_id: str, invoke_id: str, ended_at: datetime
    ) -> Coroutine[Any, Any, bool]:
        return self._db.take_fan_out_end(parent_id, invoke_id, ended_at)

    def fan_out_ended(self, parent_id: str, invoke_id: str) -> Coroutine[Any, Any, bool]:
        return self._db.fan_out_ended(parent_id, invoke_id)

    def save_position(self, record: PositionRecord) -> Coroutine[Any, Any, None]:
        return self._db.save_position(record)

    def fetch_position(self, key: str) -> Coroutine[Any, Any, PositionRecord | None]:
        return self._db.fetch_position(key)

    def delete_position(self, key: str) -> Coroutine[Any, Any, bool]:
        return self._db.delete_position(key)

    def count_positions_on(self, content_hash: str) -> Coroutine[Any, Any, int]:
        return self._db.count_positions_on(content_hash)

    def append_input(
        self,
        execution_id: str,
        via: str,
        event: bytes,
        recorded_at: datetime,
        cap: int | None,
    ) -> Coroutine[Any, Any, int | None]:
        return self._db.append_input(execution_id, via, event, recorded_at, cap)

    def inputs(self, execution_id: str) -> Coroutine[Any, Any, list[InputRecord]]:
        return self._db.inputs(execution_id)

    def prune(self, ended_before: datetime, limit: int) -> Coroutine[Any, Any, list[str]]:
        return self._db.prune(ended_before, limit)

    def exclusive(self, execution_id: str, wait: float | None) -> AbstractAsyncContextManager[None]:
        return self._db.exclusive(execution_id, wait)
