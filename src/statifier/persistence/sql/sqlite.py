"""The SQL adapter on SQLite: the statements of :mod:`statifier.sql.executions` run
inline on one ``sqlite3`` connection (a statement takes microseconds, less than a hop
to a thread would cost).

SQLite admits one writer at a time, so the adapter has one connection and one writer:
an :class:`asyncio.Lock` within the process, then ``BEGIN IMMEDIATE``, which keeps
other processes out. The connection's busy wait is off (see
:mod:`statifier.sql.engines`); a locked database is retried with a short asynchronous
back-off until the wait runs out.

Where a call runs: in the transaction it was bound to (a view: :meth:`SqliteDatabase.bound`),
else in the transaction of the writer if the calling task holds it (inside
``exclusive`` or ``transaction``), else in a short transaction of its own under the
writer's lock.

Times are stored as SQLAlchemy's ``DATETIME`` text of the UTC wall time (microseconds
always written), metadata as JSON text, UUID keys as 32 hex digits: what the columns'
SQLAlchemy types store, so rows written either way read alike.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import datetime
from types import TracebackType
from typing import Any, Final, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from statifier.buckets import bucket_of
from statifier.persistence.errors import (
    AdapterClosed,
    ChartRetired,
    ExecutionExists,
    ExecutionNotFound,
    LockTimeout,
    Pinned,
    ReentrantCall,
)
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
from statifier.persistence.sql.schema import (
    PINNING,
    WAITING,
    Tables,
    answer,
    appended,
    chart,
    error,
    error_values,
    execution_record,
)
from statifier.sql.dialect import Savepoint, savepoint_statements, utc_text, utc_time
from statifier.sql.engines import (
    configure_sqlite,
    is_busy,
    retry_busy,
    set_busy_timeout,
    tables_missing,
)
from statifier.sql.executions import ExecutionStatements
from statifier.sql.names import table_names
from statifier.sql.sqlite import BEGIN_WRITE, COMMIT, SQLITE
from statifier.sql.tables import PARENT_METADATA_KEY

__all__ = ["SqliteDatabase", "SqliteTransaction"]

_T = TypeVar("_T")
_TRANSACTION: Final = "(transaction)"  # what a LockTimeout of transaction() names
_log = logging.getLogger(__name__)

CLOSE_WAIT: Final = 5.0
"""Seconds an adapter's close waits for the transaction under way to end."""


def _metadata(text: str) -> Any:
    # Most executions carry no metadata: the empty object needs no parsing.
    return {} if text == "{}" else json.loads(text)


def _execution(row: tuple[Any, ...]) -> ExecutionRecord:
    return execution_record(row, utc_time, _metadata)


class SqliteTransaction:
    """A transaction on the adapter's ``sqlite3`` connection (or on a caller's).

    Attributes:
        driver: the ``sqlite3.Connection``; run your own SQL on it, in the transaction.
        adapter: the adapter bound to this transaction (set by
            :meth:`~statifier.persistence.sql.SqlAdapter.transaction`).
        holds_writer: whether it holds the adapter's single writer now.
    """

    __slots__ = ("adapter", "cursor", "driver", "held", "holds_writer", "savepoints")

    def __init__(self, driver: sqlite3.Connection, holds_writer: bool) -> None:
        self.driver = driver
        self.cursor = driver.cursor()
        self.holds_writer = holds_writer
        self.savepoints = 0
        self.adapter: Any = None
        # The locks taken in it (see statifier.persistence.reentry): on SQLite the
        # single writer is the one, so none is ever noted.
        self.held: set[object] = set()

    def savepoint(self) -> _Savepoint:
        """``async with tx.savepoint():`` undoes what the block wrote if it raises; the
        rest of the transaction stays usable."""
        return _Savepoint(self)

    def next_savepoint(self) -> Savepoint:
        self.savepoints += 1
        return savepoint_statements(self.savepoints)


class _Savepoint:
    __slots__ = ("_savepoint", "_tx")

    def __init__(self, tx: SqliteTransaction) -> None:
        self._tx = tx
        self._savepoint: Savepoint | None = None

    async def __aenter__(self) -> None:
        self._savepoint = point = self._tx.next_savepoint()
        self._tx.cursor.execute(point.begin)

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        cursor, point = self._tx.cursor, self._savepoint
        assert point is not None
        if error is not None:
            cursor.execute(point.undo)
        cursor.execute(point.release)


class Writer:
    """The single writer of one adapter (and its views) within the process: the lock
    every transaction of the adapter's own takes, and the task holding it with its
    transaction. One task holds it at a time, so a call finds out whether it runs in
    the writer's transaction by comparing tasks."""

    __slots__ = ("lock", "task", "tx", "waiting")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.task: asyncio.Task[Any] | None = None
        self.tx: SqliteTransaction | None = None
        # Callers queued in acquire(): every wait for the lock goes through it.
        self.waiting = 0

    async def acquire(self, wait: float | None, name: str) -> None:
        """Take the in-process lock within ``wait`` seconds (``None``: however long it
        takes), else ``LockTimeout``."""
        # The loop's other tasks get a turn before each transaction: sqlite3 runs
        # inline, so a task running transactions back to back (a bulk run, a timer
        # backlog, a schedule's catch-up) would otherwise hold the loop to its end,
        # a server answering nothing and no cancellation reaching it meanwhile.
        await asyncio.sleep(0)
        if not self.waiting and not self.lock.locked():
            # Free with nobody queued: asyncio.Lock takes it without suspending, so
            # the usual case arms no timer (a timer per step costs more than the lock).
            await self.lock.acquire()
            return
        started = time.monotonic()
        self.waiting += 1
        try:
            async with asyncio.timeout(wait):
                await self.lock.acquire()
        except TimeoutError:
            raise LockTimeout(name, time.monotonic() - started) from None
        finally:
            self.waiting -= 1

    def hold(self, tx: SqliteTransaction) -> None:
        self.task = asyncio.current_task()
        self.tx = tx
        tx.holds_writer = True

    def release(self) -> None:
        tx = self.tx
        if tx is not None:
            tx.holds_writer = False
        self.task = self.tx = None
        self.lock.release()


class Shared:
    """What an adapter and its views share: the engine, the statements, the writer and
    the one connection."""

    def __init__(self, engine: sa.Engine, owned: bool, tables: Tables) -> None:
        self.engine = engine
        self.owned = owned
        self.tables = tables
        self.statements = ExecutionStatements(tables, SQLITE, PINNING, WAITING)
        # SQLite has a single writer: a caller's open transaction becomes it by a write.
        assert self.statements.claim_writer is not None
        self.claim_writer: str = self.statements.claim_writer
        assert self.statements.update_position is not None
        self.update_position: str = self.statements.update_position
        self.names = table_names(tables)
        self.writer = Writer()
        # The connection may go to a worker thread (a commit) only where SQLAlchemy
        # opened it for any thread: an engine of the adapter's own on a file, unless
        # its URL asks for the check (an in-memory database, by name or by a URI's
        # ``mode=memory``, keeps its connection to the thread that opened it).
        url = engine.url
        self.may_cross_threads = (
            owned
            and url.database not in (None, "", ":memory:")
            and url.query.get("mode") != "memory"
            and str(url.query.get("check_same_thread", "false")).lower() in ("false", "0")
        )
        self.closed = False
        self._pooled: Any = None
        self._restore: tuple[Any, float] | None = None
        self._tx: SqliteTransaction | None = None
        self._commit_thread: ThreadPoolExecutor | None = None

    def own(self) -> SqliteTransaction:
        """The adapter's connection, opened on first use, as a transaction object (not
        yet holding the writer).

        Raises:
            AdapterClosed: :meth:`close` was called.
        """
        if self.closed:
            raise AdapterClosed
        if self._tx is None:
            self._pooled = self.engine.raw_connection()
            driver = self._pooled.driver_connection
            assert isinstance(driver, sqlite3.Connection)
            # The connection goes back to a pool that may be the caller's: note what
            # to give back.
            self._restore = (driver.isolation_level, configure_sqlite(driver))
            self._tx = SqliteTransaction(driver, holds_writer=False)
        return self._tx

    def commit_thread(self) -> ThreadPoolExecutor:
        """The thread the adapter's commits run on when they leave the loop, started on
        first use: one of its own, so that a commit never queues behind other work
        in the loop's default executor while it holds the writer.

        Raises:
            AdapterClosed: :meth:`close` was called.
        """
        if self.closed:
            raise AdapterClosed
        if self._commit_thread is None:
            self._commit_thread = ThreadPoolExecutor(1, thread_name_prefix="statifier-commit")
        return self._commit_thread

    async def close(self) -> None:
        """Refuse new transactions (:class:`AdapterClosed`), let the one under way end
        (commit or roll back) within ``CLOSE_WAIT`` seconds, then give the connection
        back and stop the commit thread. A transaction still under way past the wait
        is rolled back, never committed, and said at WARNING; its task's next statement
        fails on the closed connection."""
        if self.closed:
            return
        self.closed = True
        writer = self.writer
        held = await _writer_within(writer, CLOSE_WAIT)
        try:
            if self._commit_thread is not None:
                # First: past the wait, a commit may still run there on the connection.
                self._commit_thread.shutdown(wait=True)
                self._commit_thread = None
            tx, pooled, restore = self._tx, self._pooled, self._restore
            self._tx = self._pooled = self._restore = None
            if tx is not None and pooled is not None:
                if tx.driver.in_transaction:
                    # Only past the wait: restoring the isolation level below would
                    # commit what the transaction wrote so far.
                    tx.driver.rollback()
                if restore is not None:
                    isolation_level, timeout = restore
                    tx.driver.isolation_level = isolation_level
                    set_busy_timeout(tx.driver, timeout)
                pooled.close()
        finally:
            if held:
                writer.lock.release()


async def _take_database(
    tx: SqliteTransaction, claim: str, deadline: float | None, name: str
) -> None:
    """Make ``tx`` the database's writer: ``BEGIN IMMEDIATE``, or in a caller's open
    transaction a write that touches no row; retried without blocking until
    ``deadline``, then ``LockTimeout``."""
    started = time.monotonic()
    cursor, driver = tx.cursor, tx.driver

    def attempt() -> None:
        cursor.execute(claim if driver.in_transaction else BEGIN_WRITE)

    await retry_busy(attempt, deadline, lambda _: LockTimeout(name, time.monotonic() - started))


async def _writer_within(writer: Writer, wait: float) -> bool:
    """Take ``writer``'s lock within ``wait`` seconds for :meth:`Shared.close`; whether
    it was taken (not when the calling task holds it, nor past the wait: then said at
    WARNING)."""
    if writer.task is not None and writer.task is asyncio.current_task():
        held_by = "the task closing it"
    else:
        try:
            async with asyncio.timeout(wait):
                await writer.lock.acquire()
        except TimeoutError:
            held_by = f"another task for longer than {wait:g} s"
        else:
            return True
    _log.warning(
        "a SQLite adapter closed while a transaction held its writer (%s): the "
        "transaction is rolled back, not committed",
        held_by,
    )
    return False


async def _commit_in_thread(tx: SqliteTransaction, thread: ThreadPoolExecutor) -> None:
    """``COMMIT`` on the adapter's commit ``thread`` (``sqlite3`` lets go of the GIL
    while SQLite writes and syncs the file), the loop running other tasks meanwhile.
    The caller holds the writer throughout, so no other task uses the connection.
    Once the interpreter is exiting (its executors take no more work) the commit runs
    on the loop.

    Raises:
        asyncio.CancelledError: the task was cancelled meanwhile: the very error, raised
            only once the commit has ended (the connection is the thread's until
            then), whether it committed or not; a commit that failed meanwhile is its
            cause, and said at WARNING.
        sqlite3.Error: what the commit raised.
    """
    loop = asyncio.get_running_loop()
    try:
        committed = loop.run_in_executor(thread, tx.cursor.execute, COMMIT)
    except RuntimeError:  # the interpreter is exiting: no new work for its threads
        tx.cursor.execute(COMMIT)
        return
    cancelled: asyncio.CancelledError | None = None
    while not committed.done():
        try:
            await asyncio.wait([committed])  # never cancels the commit
        except asyncio.CancelledError as error:
            cancelled = error
    if cancelled is None:
        committed.result()
        return
    failed = committed.exception()
    if failed is not None:
        _log.warning(
            "a SQLite commit failed while its task was being cancelled (%s): nothing of "
            "its transaction was committed",
            type(failed).__name__,
        )
        raise cancelled from failed
    raise cancelled


class _Block:
    """One ``exclusive`` block (or one ``transaction``) on SQLite. In order of how often
    it happens:

    - the adapter's own: the in-process lock, ``BEGIN IMMEDIATE``, and at the end
      ``COMMIT`` (``ROLLBACK`` if it raised);
    - inside a transaction that holds the writer already (a child created in its
      parent's step, or a view's ``transaction``): a savepoint, so a raising block
      undoes only itself (a ``transaction`` there is just a part of it);
    - in a caller's transaction (a view from ``joined``): the in-process lock and the
      database's write lock taken for the caller's transaction, which the caller ends.

    A class rather than a generator: this is the durable step's hot path.
    """

    __slots__ = ("_db", "_in_thread", "_mode", "_name", "_savepoint", "_wait", "tx")

    def __init__(
        self,
        db: SqliteDatabase,
        name: str,
        wait: float | None,
        nested: bool,
        commit_in_thread: bool = False,
    ) -> None:
        self._db = db
        self._in_thread = commit_in_thread and db.shared.may_cross_threads
        self._name = name
        self._wait = wait
        # What a block inside a transaction that holds the writer does: a savepoint
        # (exclusive), or nothing (transaction on a view).
        self._mode = "savepoint" if nested else "part"
        self._savepoint: Savepoint | None = None
        self.tx: SqliteTransaction | None = None

    async def __aenter__(self) -> None:
        db = self._db
        writer = db.writer
        tx = db.current()
        if tx is not None and tx.holds_writer:
            self.tx = tx
            if self._mode == "savepoint":
                self._savepoint = point = tx.next_savepoint()
                tx.cursor.execute(point.begin)
            elif db.view is None:
                # A transaction of the adapter's own inside a block of the same task
                # would wait for itself (use the block's adapter, tx.adapter).
                raise ReentrantCall("the SQLite database's single writer")
            return
        wait = self._wait
        deadline = None if wait is None else time.monotonic() + wait
        await writer.acquire(wait, self._name)
        try:
            if tx is not None:  # a caller's transaction
                await _take_database(tx, db.shared.claim_writer, deadline, self._name)
                self._mode = "claimed"
            else:
                tx = db.shared.own()
                if self._mode == "part":
                    # A transaction handed to the caller: an object of its own, so
                    # nothing the caller keeps of it outlives the block.
                    tx = SqliteTransaction(tx.driver, holds_writer=False)
                try:  # the usual case: the writer is free
                    tx.cursor.execute(BEGIN_WRITE)
                except sqlite3.OperationalError as error:
                    if not is_busy(error):
                        raise
                    await _take_database(tx, db.shared.claim_writer, deadline, self._name)
                self._mode = "own"
        except BaseException:
            writer.lock.release()
            raise
        writer.hold(tx)
        self.tx = tx

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        tx = self.tx
        assert tx is not None
        mode = self._mode
        if mode == "savepoint":
            point = self._savepoint
            assert point is not None
            if error is not None:
                tx.cursor.execute(point.undo)
            tx.cursor.execute(point.release)
            return
        if mode == "part":
            return
        writer = self._db.writer
        try:
            if mode == "claimed":
                return  # the caller's transaction: the caller ends it
            if error is not None:
                tx.driver.rollback()
                missing = tables_missing(error, self._db.shared.names)
                if missing is not None:  # an unmigrated database: say so
                    raise missing from error
                return
            try:  # the usual case: nothing in the way of the commit
                if self._in_thread:
                    await _commit_in_thread(tx, self._db.shared.commit_thread())
                else:
                    tx.cursor.execute(COMMIT)
            except sqlite3.OperationalError as failed:
                if not is_busy(failed):
                    raise
                await retry_busy(lambda: tx.cursor.execute(COMMIT), None)
        finally:
            try:
                # A commit that failed or was cancelled must not leave the shared
                # connection inside a transaction for the next holder of the writer.
                if mode != "claimed" and tx.driver.in_transaction:
                    tx.driver.rollback()
            finally:  # even on a connection the adapter's close took away meanwhile
                writer.release()


class SqliteDatabase:
    """The adapter's operations on SQLite, free or bound to one transaction (a view).

    Each operation is a plain function of a cursor (``_fetch_execution`` ...), run where
    :meth:`current` says, or in a short transaction of its own (:meth:`_alone`).
    """

    __slots__ = ("shared", "statements", "view", "writer")

    def __init__(self, shared: Shared, view: SqliteTransaction | None = None) -> None:
        self.shared = shared
        self.statements = shared.statements
        self.writer = shared.writer
        self.view = view

    def bound(self, tx: SqliteTransaction) -> SqliteDatabase:
        """These operations, every one of them run in ``tx``."""
        return SqliteDatabase(self.shared, tx)

    def joined(self, connection: sa.Connection | AsyncConnection) -> SqliteDatabase:
        """Bound to a caller's connection, whose transaction the caller ends."""
        if not isinstance(connection, sa.Connection):
            raise TypeError("on SQLite join a Connection of the adapter's engine")
        driver = connection.connection.driver_connection
        if not isinstance(driver, sqlite3.Connection):
            raise TypeError(f"a SQLite adapter joins a sqlite3 connection, not {driver!r}")
        # A caller's connection must not busy-wait on the loop either.
        set_busy_timeout(driver, 0)
        return self.bound(SqliteTransaction(driver, holds_writer=False))

    def current(self) -> SqliteTransaction | None:
        """The transaction a call runs in: the view's, else the writer's if this task
        holds it, else ``None`` (a transaction of its own)."""
        tx = self.view
        if tx is not None:
            return tx
        writer = self.writer
        task = writer.task
        if task is not None and task is asyncio.current_task():
            return writer.tx
        return None

    async def _alone(self, work: Callable[..., _T], write: bool, *args: Any) -> _T:
        """``work(cursor, *args)`` in a transaction of its own, under the writer's lock
        (a read needs none: in WAL it sees the last commit)."""
        writer = self.writer
        await writer.acquire(None, _TRANSACTION)
        try:
            tx = self.shared.own()
            cursor = tx.cursor
            if not write:
                # Busy only while another process commits in rollback-journal mode.
                try:
                    return await retry_busy(lambda: work(cursor, *args), None)
                except sqlite3.OperationalError as error:
                    missing = tables_missing(error, self.shared.names)
                    if missing is None:
                        raise
                    raise missing from error  # an unmigrated database: say so
            await retry_busy(lambda: cursor.execute(BEGIN_WRITE), None)
            try:
                result = work(cursor, *args)
            except BaseException as error:
                tx.driver.rollback()
                missing = tables_missing(error, self.shared.names)
                if missing is None:
                    raise
                raise missing from error
            try:
                await retry_busy(lambda: cursor.execute(COMMIT), None)
            finally:
                # A commit that failed or was cancelled must not leave the shared
                # connection inside a transaction for the next holder of the writer.
                if tx.driver.in_transaction:
                    tx.driver.rollback()
            return result
        finally:
            writer.lock.release()

    async def _run(self, work: Callable[..., _T], write: bool, *args: Any) -> _T:
        tx = self.current()
        if tx is not None:
            return work(tx.cursor, *args)
        return await self._alone(work, write, *args)

    def exclusive(self, execution_id: str, wait: float | None) -> _Block:
        return _Block(self, execution_id, wait, nested=True)

    @asynccontextmanager
    async def transaction(
        self, wait: float | None, commit_in_thread: bool = False
    ) -> AsyncIterator[SqliteTransaction]:
        """The transaction of :meth:`SqlAdapter.transaction` (see there)."""
        block = _Block(self, _TRANSACTION, wait, nested=False, commit_in_thread=commit_in_thread)
        await block.__aenter__()
        assert block.tx is not None
        try:
            yield block.tx
        except BaseException as error:
            await block.__aexit__(type(error), error, error.__traceback__)
            raise
        await block.__aexit__(None, None, None)

    async def close(self) -> None:
        if self.view is None:
            await self.shared.close()

    # Charts.

    async def save_chart(self, record: ChartRecord) -> ChartRecord:
        return await self._run(self._save_chart, True, record)

    def _save_chart(self, cursor: sqlite3.Cursor, record: ChartRecord) -> ChartRecord:
        s = self.statements
        values = {
            "content_hash": record.content_hash,
            "chart_blob": record.source,
            "name": record.name,
            "version": record.version,
            "saved_at": utc_text(record.saved_at),
            "retired_at": utc_text(record.retired_at),
            "retired_by": record.retired_by,
        }
        cursor.execute(s.insert_chart, s.keyed(values))
        row = cursor.execute(s.fetch_chart, {"h": record.content_hash}).fetchone()
        return chart(row, utc_time)

    async def fetch_chart(self, content_hash: str) -> ChartRecord | None:
        return await self._run(self._fetch_chart, False, content_hash)

    def _fetch_chart(self, cursor: sqlite3.Cursor, content_hash: str) -> ChartRecord | None:
        row = cursor.execute(self.statements.fetch_chart, {"h": content_hash}).fetchone()
        return None if row is None else chart(row, utc_time)

    async def retire_chart(
        self, content_hash: str, retired_by: str, retired_at: datetime
    ) -> ChartRecord | None:
        return await self._run(self._retire_chart, True, content_hash, retired_by, retired_at)

    def _retire_chart(
        self, cursor: sqlite3.Cursor, content_hash: str, retired_by: str, retired_at: datetime
    ) -> ChartRecord | None:
        s = self.statements
        row = cursor.execute(s.guard_chart, {"h": content_hash}).fetchone()
        if row is None or row[0] is not None:
            return self._fetch_chart(cursor, content_hash)
        pins = {
            f"executions_{status.value}": n
            for status, n in self._count_executions_on(cursor, content_hash).items()
            if status.pins and n
        }
        positions = self._count_positions_on(cursor, content_hash)
        linked = self._count_linked(cursor, content_hash)
        pins.update({k: n for k, n in (("positions", positions), ("children_linked", linked)) if n})
        if pins:
            raise Pinned(content_hash, pins)
        values = {"h": content_hash, "by": retired_by, "at": utc_text(retired_at)}
        cursor.execute(s.retire_chart, values)
        return self._fetch_chart(cursor, content_hash)

    async def count_linked_children_on(self, content_hash: str) -> int:
        return await self._run(self._count_linked, False, content_hash)

    def _count_linked(self, cursor: sqlite3.Cursor, content_hash: str) -> int:
        (count,) = cursor.execute(self.statements.linked, {"h": content_hash}).fetchone()
        return int(count)

    # Executions: the three calls of a durable step (fetch, append, update) run inline
    # when the task holds the writer, with no coroutine of their own in between.

    async def insert_execution(self, record: ExecutionRecord) -> None:
        await self._run(self._insert_execution, True, record)

    def _insert_execution(self, cursor: sqlite3.Cursor, record: ExecutionRecord) -> None:
        if record.created_at is None or record.updated_at is None:
            raise ValueError(f"execution {record.id!r} needs created_at and updated_at")
        s = self.statements
        guard = cursor.execute(s.guard_chart, {"h": record.content_hash}).fetchone()
        if guard is not None and guard[0] is not None:
            raise ChartRetired(record.content_hash, guard[1])
        values = {
            "execution_id": record.id,
            "content_hash": record.content_hash,
            "status": record.status.value,
            "position_blob": record.position,
            "metadata": json.dumps(dict(record.metadata)),
            "outcome_blob": record.outcome,
            "failure": record.failure,
            "created_at": utc_text(record.created_at),
            "updated_at": utc_text(record.updated_at),
            "ended_at": utc_text(record.ended_at),
            "error_count": record.error_count,
            "last_error_at": utc_text(record.last_error_at),
            "final_state": record.final_state,
            "bucket": bucket_of(record.id),
        }
        if cursor.execute(s.insert_execution, s.keyed(values)).fetchone() is None:
            raise ExecutionExists(record.id)

    async def fetch_execution(self, execution_id: str) -> ExecutionRecord | None:
        tx = self.current()
        if tx is not None:
            return self._fetch_execution(tx.cursor, execution_id)
        return await self._alone(self._fetch_execution, False, execution_id)

    def _fetch_execution(self, cursor: sqlite3.Cursor, execution_id: str) -> ExecutionRecord | None:
        row = cursor.execute(self.statements.fetch_execution, {"id": execution_id}).fetchone()
        return None if row is None else _execution(row)

    async def fetch_executions(self, execution_ids: Sequence[str]) -> list[ExecutionRecord]:
        tx = self.current()
        if tx is not None:
            return self._fetch_executions(tx.cursor, execution_ids)
        return await self._alone(self._fetch_executions, False, execution_ids)

    def _fetch_executions(
        self, cursor: sqlite3.Cursor, execution_ids: Sequence[str]
    ) -> list[ExecutionRecord]:
        ids = json.dumps(list(execution_ids))
        rows = cursor.execute(self.statements.fetch_executions, {"ids": ids}).fetchall()
        return [_execution(row) for row in rows]

    async def update_execution(self, record: ExecutionRecord) -> None:
        tx = self.current()
        if tx is not None:
            self._update_execution(tx.cursor, record)
            return
        await self._alone(self._update_execution, True, record)

    def _update_execution(self, cursor: sqlite3.Cursor, record: ExecutionRecord) -> None:
        values = {
            "status": record.status.value,
            "position_blob": record.position,
            "outcome_blob": record.outcome,
            "failure": record.failure,
            "updated_at": utc_text(record.updated_at),
            "ended_at": utc_text(record.ended_at),
            "error_count": record.error_count,
            "last_error_at": utc_text(record.last_error_at),
            "final_state": record.final_state,
            "execution_id": record.id,
        }
        # A step that changed only the position writes no index page (see
        # update_position): a smaller commit, one statement; else the whole row.
        if cursor.execute(self.shared.update_position, values).rowcount:
            return
        if not cursor.execute(self.statements.update_execution, values).rowcount:
            raise ExecutionNotFound(record.id)

    async def record_step(
        self,
        record: ExecutionRecord,
        via: str,
        event: bytes,
        recorded_at: datetime,
        cap: int | None,
        errors: Sequence[ErrorRecord] = (),
    ) -> int | None:
        tx = self.current()
        if tx is not None:
            return self._record_step(tx.cursor, record, via, event, recorded_at, cap, errors)
        return await self._alone(
            self._record_step, True, record, via, event, recorded_at, cap, errors
        )

    async def record_steps(self, steps: Sequence[StepWrite], cap: int | None) -> None:
        tx = self.current()
        if tx is not None:
            self._record_steps(tx.cursor, steps, cap)
            return
        await self._alone(self._record_steps, True, steps, cap)

    def _record_steps(
        self, cursor: sqlite3.Cursor, steps: Sequence[StepWrite], cap: int | None
    ) -> None:
        for step in steps:
            self._record_step(cursor, step.record, step.via, step.event, step.recorded_at, cap)

    def _record_step(
        self,
        cursor: sqlite3.Cursor,
        record: ExecutionRecord,
        via: str,
        event: bytes,
        recorded_at: datetime,
        cap: int | None,
        errors: Sequence[ErrorRecord] = (),
    ) -> int | None:
        # In process, two statements cost no round trip: the update first, so a
        # missing execution appends nothing.
        self._update_execution(cursor, record)
        seq = self._append_input(cursor, record.id, via, event, recorded_at, cap)
        if errors:
            self._record_errors(cursor, [replace(each, seq=seq) for each in errors])
        return seq

    # Errors.

    async def record_errors(self, errors: Sequence[ErrorRecord]) -> None:
        if not errors:
            return
        tx = self.current()
        if tx is not None:
            self._record_errors(tx.cursor, errors)
            return
        await self._alone(self._record_errors, True, errors)

    def _record_errors(self, cursor: sqlite3.Cursor, errors: Sequence[ErrorRecord]) -> None:
        s = self.statements
        cursor.executemany(
            s.insert_error,
            [s.keyed(error_values(each, utc_text)) for each in errors],
        )

    async def errors(self, execution_id: str, limit: int) -> list[ErrorRecord]:
        if limit <= 0:
            return []
        return await self._run(self._errors, False, execution_id, limit)

    def _errors(self, cursor: sqlite3.Cursor, execution_id: str, limit: int) -> list[ErrorRecord]:
        values = {"id": execution_id, "limit": limit}
        rows = cursor.execute(self.statements.errors, values).fetchall()
        return [error(row, utc_time) for row in rows]

    async def rechart_execution(self, record: ExecutionRecord, from_hash: str) -> bool:
        tx = self.current()
        if tx is not None:
            return self._rechart_execution(tx.cursor, record, from_hash)
        return await self._alone(self._rechart_execution, True, record, from_hash)

    def _rechart_execution(
        self, cursor: sqlite3.Cursor, record: ExecutionRecord, from_hash: str
    ) -> bool:
        values = {
            "to": record.content_hash,
            "status": record.status.value,
            "position_blob": record.position,
            "failure": record.failure,
            "updated_at": utc_text(record.updated_at),
            "id": record.id,
            "from": from_hash,
        }
        return bool(cursor.execute(self.statements.rechart_execution, values).rowcount)

    async def count_executions_on(self, content_hash: str) -> Mapping[Status, int]:
        return await self._run(self._count_executions_on, False, content_hash)

    def _count_executions_on(self, cursor: sqlite3.Cursor, content_hash: str) -> dict[Status, int]:
        rows = cursor.execute(self.statements.count_executions, {"h": content_hash}).fetchall()
        return {Status(status): int(count) for status, count in rows}

    async def pinning_executions(self, content_hash: str) -> list[str]:
        return await self._run(self._pinning_executions, False, content_hash)

    def _pinning_executions(self, cursor: sqlite3.Cursor, content_hash: str) -> list[str]:
        rows = cursor.execute(self.statements.pinning, {"h": content_hash}).fetchall()
        return [execution_id for (execution_id,) in rows]

    async def list_by_metadata(self, pairs: Mapping[str, str]) -> list[ExecutionRecord]:
        rows = await self._run(self._by_metadata, False, pairs, False)
        return [_execution(row) for row in rows]

    async def statuses_by_metadata(self, pairs: Mapping[str, str]) -> dict[str, Status]:
        rows = await self._run(self._by_metadata, False, pairs, True)
        return {execution_id: Status(status) for execution_id, status in rows}

    def _by_metadata(
        self, cursor: sqlite3.Cursor, pairs: Mapping[str, str], statuses: bool
    ) -> list[tuple[Any, ...]]:
        # Every pair given, as one document: keys and values bound, never spliced.
        sql = self.statements.metadata_query(pairs, statuses=statuses)
        values = {"metadata": json.dumps(dict(pairs)), "parent": pairs.get(PARENT_METADATA_KEY)}
        return cursor.execute(sql, values).fetchall()

    # Durable children's answers.

    async def insert_answer(self, record: AnswerRecord) -> None:
        await self._run(self._insert_answer, True, record)

    def _insert_answer(self, cursor: sqlite3.Cursor, record: AnswerRecord) -> None:
        s = self.statements
        values = {
            "child_id": record.child_id,
            "parent_id": record.parent_id,
            "invoke_id": record.invoke_id,
            "content_hash": record.content_hash,
            "kind": record.status.value,
            "answer_blob": record.outcome,
            "failure": record.failure,
            "created_at": utc_text(record.created_at),
            "delivered_at": utc_text(record.delivered_at),
        }
        cursor.execute(s.insert_answer, s.keyed(values))

    async def fetch_answer(self, child_id: str) -> AnswerRecord | None:
        rows = await self._run(self._answers, False, self.statements.fetch_answer, {"id": child_id})
        return rows[0] if rows else None

    async def undelivered_answers(self, limit: int) -> list[AnswerRecord]:
        if limit <= 0:
            return []
        return await self._run(self._answers, False, self.statements.undelivered, {"limit": limit})

    def _answers(
        self, cursor: sqlite3.Cursor, sql: str, values: dict[str, Any]
    ) -> list[AnswerRecord]:
        return [answer(row, utc_time) for row in cursor.execute(sql, values).fetchall()]

    async def mark_delivered(self, child_ids: Sequence[str], delivered_at: datetime) -> None:
        if child_ids:
            await self._run(self._mark_delivered, True, list(child_ids), delivered_at)

    def _mark_delivered(self, cursor: sqlite3.Cursor, ids: list[str], at: datetime) -> None:
        values = {"ids": json.dumps(ids), "at": utc_text(at)}
        cursor.execute(self.statements.mark_delivered, values)

    async def take_fan_out_end(self, parent_id: str, invoke_id: str, ended_at: datetime) -> bool:
        return await self._run(self._take_fan_out_end, True, parent_id, invoke_id, ended_at)

    def _take_fan_out_end(
        self, cursor: sqlite3.Cursor, parent_id: str, invoke_id: str, at: datetime
    ) -> bool:
        s = self.statements
        values = {"parent": parent_id, "invoke": invoke_id, "at": utc_text(at)}
        return cursor.execute(s.take_fan_out_end, s.keyed(values)).fetchone() is not None

    async def fan_out_ended(self, parent_id: str, invoke_id: str) -> bool:
        return await self._run(self._fan_out_ended, False, parent_id, invoke_id)

    def _fan_out_ended(self, cursor: sqlite3.Cursor, parent_id: str, invoke_id: str) -> bool:
        values = {"parent": parent_id, "invoke": invoke_id}
        return cursor.execute(self.statements.fan_out_ended, values).fetchone() is not None

    # Saved positions.

    async def save_position(self, record: PositionRecord) -> None:
        await self._run(self._save_position, True, record)

    def _save_position(self, cursor: sqlite3.Cursor, record: PositionRecord) -> None:
        s = self.statements
        values = {
            "key": record.key,
            "content_hash": record.content_hash,
            "position_blob": record.position,
            "saved_at": utc_text(record.saved_at),
            "bucket": bucket_of(record.key),
        }
        cursor.execute(s.save_position, s.keyed(values))

    async def fetch_position(self, key: str) -> PositionRecord | None:
        return await self._run(self._fetch_position, False, key)

    def _fetch_position(self, cursor: sqlite3.Cursor, key: str) -> PositionRecord | None:
        row = cursor.execute(self.statements.fetch_position, {"key": key}).fetchone()
        if row is None:
            return None
        saved_at = utc_time(row[3])
        assert saved_at is not None
        return PositionRecord(row[0], content_hash=row[1], position=row[2], saved_at=saved_at)

    async def delete_position(self, key: str) -> bool:
        return await self._run(self._delete_position, True, key)

    def _delete_position(self, cursor: sqlite3.Cursor, key: str) -> bool:
        return cursor.execute(self.statements.delete_position, {"key": key}).rowcount > 0

    async def count_positions_on(self, content_hash: str) -> int:
        return await self._run(self._count_positions_on, False, content_hash)

    def _count_positions_on(self, cursor: sqlite3.Cursor, content_hash: str) -> int:
        (count,) = cursor.execute(self.statements.count_positions, {"h": content_hash}).fetchone()
        return int(count)

    # The input log.

    async def append_input(
        self,
        execution_id: str,
        via: str,
        event: bytes,
        recorded_at: datetime,
        cap: int | None,
    ) -> int | None:
        tx = self.current()
        if tx is not None:
            return self._append_input(tx.cursor, execution_id, via, event, recorded_at, cap)
        return await self._alone(
            self._append_input, True, execution_id, via, event, recorded_at, cap
        )

    def _append_input(
        self,
        cursor: sqlite3.Cursor,
        execution_id: str,
        via: str,
        event: bytes,
        recorded_at: datetime,
        cap: int | None,
    ) -> int | None:
        s = self.statements
        values = {
            "execution_id": execution_id,
            "via": via,
            "cap": cap,
            "input_blob": event,
            "recorded_at": utc_text(recorded_at),
        }
        return appended(cursor.execute(s.append_input, s.keyed(values)).fetchall(), cap)

    async def inputs(self, execution_id: str) -> list[InputRecord]:
        return await self._run(self._inputs, False, execution_id)

    def _inputs(self, cursor: sqlite3.Cursor, execution_id: str) -> list[InputRecord]:
        rows = cursor.execute(self.statements.inputs, {"id": execution_id}).fetchall()
        return [
            InputRecord(execution_id, seq=seq, via=via, event=blob, recorded_at=_aware(recorded_at))
            for execution_id, seq, via, blob, recorded_at in rows
        ]

    # Retention.

    async def prune(self, ended_before: datetime, limit: int) -> list[str]:
        if limit <= 0:
            return []
        return await self._run(self._prune, True, ended_before, limit)

    def _prune(self, cursor: sqlite3.Cursor, ended_before: datetime, limit: int) -> list[str]:
        s = self.statements
        values = {"before": utc_text(ended_before), "limit": limit}
        pruned = [execution_id for (execution_id,) in cursor.execute(s.prune, values).fetchall()]
        if pruned:
            ids = {"ids": json.dumps(pruned)}
            cursor.execute(s.drop_logs, ids)
            cursor.execute(s.drop_errors, ids)
        return pruned


def _aware(text: str) -> datetime:
    moment = utc_time(text)
    assert moment is not None
    return moment
