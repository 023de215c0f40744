"""The SQL adapter on PostgreSQL: the statements of :mod:`statifier.sql.executions`
run on psycopg 3's :class:`~psycopg.AsyncConnection`.

The adapter's own transactions take connections from a ``psycopg_pool`` pool (an
adapter made from a URL) or from the engine it was given (SQLAlchemy's pool), for one
transaction at a time. Each pooled connection is checked as it is handed out (one the
server closed, after a restart or ``pg_terminate_backend``, is dropped and another
taken: it fails no transaction), a transaction waits at most :data:`POOL_WAIT` seconds
for one (then :class:`DatabaseUnavailable`: a request during an outage fails well
within an HTTP front's deadline), and while the server is away the pool tries to
connect about every second as long as someone waits, so work resumes within a second
or two of the server's return. ``exclusive`` is a transaction holding the lock of the
execution's key, hashed in Python (:func:`~statifier.sql.dialect.execution_lock_key`):
``pg_advisory_xact_lock``, or the key's row of the ``locks`` table
(:mod:`statifier.sql.locks`); ``lock_timeout`` bounds a wait, and SQLSTATE 55P03
becomes ``LockTimeout``.

Where a call runs: in the transaction it was bound to (a view), else in the block of
the calling task (the adapter keeps which task holds which block: several tasks hold
blocks at once on PostgreSQL), else in a short transaction of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from contextvars import Token
from dataclasses import replace
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Final, TypeVar

from statifier.buckets import bucket_of
from statifier.extras import MissingExtra
from statifier.persistence.errors import (
    ChartRetired,
    DatabaseDown,
    ExecutionExists,
    ExecutionNotFound,
    LockTimeout,
    Pinned,
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
from statifier.persistence.reentry import hold, opened, register, unregister
from statifier.persistence.sql.adapter import POOL_SIZE
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
from statifier.sql.dialect import Savepoint, execution_lock_key, savepoint_statements
from statifier.sql.engines import tables_missing
from statifier.sql.executions import ExecutionStatements
from statifier.sql.names import table_names
from statifier.sql.postgres import (
    POSTGRES,
    RESTORE_LOCK_TIMEOUT,
    SET_LOCK_TIMEOUT,
    lock_timeout,
)
from statifier.sql.tables import PARENT_METADATA_KEY

try:
    import psycopg
    import sqlalchemy as sa
    from psycopg.types.json import Jsonb
    from psycopg_pool import AsyncConnectionPool, PoolTimeout
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
except ModuleNotFoundError as missing:  # psycopg: the postgres extra
    raise MissingExtra.of(missing) from missing

__all__ = [
    "CONNECT_TIMEOUT",
    "POOL_WAIT",
    "DatabaseUnavailable",
    "PostgresDatabase",
    "PostgresTransaction",
    "lock_timeout",
]

_T = TypeVar("_T")
Cursor = psycopg.AsyncCursor[Any]
Driver = psycopg.AsyncConnection[Any]

POOL_WAIT: Final = 5.0
"""The most seconds a transaction waits for a pooled connection (then
:class:`DatabaseUnavailable`): half the HTTP fronts' default deadline, so a request
during an outage is answered with the database's error, not the front's timeout."""
CONNECT_TIMEOUT: Final = 5
"""Seconds one connection attempt waits for the server (libpq's ``connect_timeout``),
unless the URL sets its own: a server that does not answer at all (a host down) costs
one attempt no longer than a refused connection would make it wait."""
_CHECK_IDLE: Final = 10.0
"""Seconds a pooled connection may sit idle before its checkout asks the server whether
it is still there (a round trip); a busier one is only looked at (no round trip)."""
_RECONNECT_FOR: Final = 1.0
"""Seconds the pool keeps trying one connection (twice, a second apart) before it
gives up; the next transaction that waits starts a new attempt at once. psycopg_pool's
own backoff would wait up to minutes between attempts, long after the server is back."""


class DatabaseUnavailable(PoolTimeout, DatabaseDown):
    """No pooled connection within :data:`POOL_WAIT` seconds: the server does not
    answer (stopped, restarting, unreachable), or every connection stays busy."""


def utc(value: datetime | None) -> datetime | None:
    """A time to bind: refused if naive (PostgreSQL would read it in the session's zone)."""
    if value is not None and value.tzinfo is not UTC and value.utcoffset() is None:
        raise ValueError(f"stored times must be timezone-aware, not {value!r}")
    return value


def utc_time(value: datetime | None) -> datetime | None:
    """A time read back: aware, in UTC whatever the session's zone."""
    if value is None or value.tzinfo is UTC:
        return value
    return value.astimezone(UTC)


def _same(value: Any) -> Any:
    return value


def _execution(row: tuple[Any, ...]) -> ExecutionRecord:
    return execution_record(row, utc_time, _same)


def _updated(record: ExecutionRecord) -> dict[str, Any]:
    """The parameters of ``update_execution`` for ``record``."""
    return {
        "status": record.status.value,
        "position_blob": record.position,
        "outcome_blob": record.outcome,
        "failure": record.failure,
        "updated_at": utc(record.updated_at),
        "ended_at": utc(record.ended_at),
        "error_count": record.error_count,
        "last_error_at": utc(record.last_error_at),
        "final_state": record.final_state,
        "execution_id": record.id,
    }


class PostgresTransaction:
    """A transaction on one psycopg connection: the adapter's own, or a caller's.

    Attributes:
        driver: the :class:`psycopg.AsyncConnection`; run your own SQL on it, in the
            transaction.
        adapter: the adapter bound to this transaction (set by
            :meth:`~statifier.persistence.sql.SqlAdapter.transaction`).
        blocks: how many ``exclusive`` blocks are open in it (a nested one is a
            savepoint).
    """

    __slots__ = ("adapter", "blocks", "cursor", "driver", "held", "savepoints")

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.cursor: Cursor = driver.cursor()
        self.blocks = 0
        self.savepoints = 0
        self.adapter: Any = None
        # The locks taken in it (see statifier.persistence.reentry).
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

    def __init__(self, tx: PostgresTransaction) -> None:
        self._tx = tx
        self._savepoint: Savepoint | None = None

    async def __aenter__(self) -> None:
        self._savepoint = point = self._tx.next_savepoint()
        await self._tx.cursor.execute(point.begin)

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        cursor, point = self._tx.cursor, self._savepoint
        assert point is not None
        if error is not None:
            await cursor.execute(point.undo)
        await cursor.execute(point.release)


class _Pool:
    """Connections for the adapter's own transactions, one transaction at a time: from
    a ``psycopg_pool`` pool made from the URL (opened on first use: it needs the event
    loop), or checked out of the caller's engine (SQLAlchemy's pool) each time."""

    def __init__(self, engine: AsyncEngine, url: sa.URL | None) -> None:
        self._engine = engine
        self._pool: AsyncConnectionPool[Any] | None = None
        if url is not None:
            conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
            timeout = {} if "connect_timeout" in url.query else {"connect_timeout": CONNECT_TIMEOUT}
            self._pool = AsyncConnectionPool(
                conninfo,
                kwargs=timeout,
                min_size=1,
                max_size=POOL_SIZE,
                open=False,
                timeout=POOL_WAIT,
                reconnect_timeout=_RECONNECT_FOR,
            )
        self._opening: asyncio.Lock | None = None
        self._opened = False
        self._checked_out: dict[int, AsyncConnection] = {}
        self._returned: dict[int, float] = {}
        """When each pooled connection was last given back (monotonic seconds)."""

    async def take(self) -> Driver:
        pool = self._pool
        if pool is None:
            connection = await self._engine.connect()
            sync = connection.sync_connection
            assert sync is not None
            driver = sync.connection.driver_connection
            assert isinstance(driver, psycopg.AsyncConnection)
            self._checked_out[id(driver)] = connection
            return driver
        if not self._opened:
            if self._opening is None:
                self._opening = asyncio.Lock()
            async with self._opening:
                if not self._opened:
                    await pool.open()
                    self._opened = True
        deadline = time.monotonic() + POOL_WAIT
        while True:
            try:
                taken: Driver = await pool.getconn(max(deadline - time.monotonic(), 0.001))
            except PoolTimeout:
                raise DatabaseUnavailable(
                    f"no PostgreSQL connection within {POOL_WAIT:g} s: the server does not "
                    "answer, or every pooled connection stays busy"
                ) from None
            if await self._usable(taken):
                return taken
            await taken.close()
            await pool.putconn(taken)  # a closed one is replaced by the pool

    async def _usable(self, driver: Driver) -> bool:
        """Whether a pooled connection still works. Here rather than as the pool's
        ``check``, which backs off a second, then two, between dead connections.

        First what the server sent while the connection sat in the pool, read and
        parsed without waiting: a server that ended it (a restart,
        ``pg_terminate_backend``) sends a FATAL notice before it closes the stream,
        so the notice alone tells, even before the end of the stream arrives, at no
        round trip. A connection idle for over :data:`_CHECK_IDLE` seconds, which
        may have died without a word (a firewall dropping an idle flow), is also
        asked, by psycopg_pool's own check (one round trip)."""
        returned = self._returned.pop(id(driver), None)
        pgconn = driver.pgconn
        ended: list[bool] = []

        def note(notice: psycopg.errors.Diagnostic) -> None:
            if notice.severity_nonlocalized in ("FATAL", "PANIC"):
                ended.append(True)

        driver.add_notice_handler(note)
        try:
            pgconn.consume_input()
            pgconn.is_busy()  # parses what was read: an idle connection's FATAL is a notice
            pgconn.consume_input()
        except psycopg.OperationalError:
            return False
        finally:
            driver.remove_notice_handler(note)
        if ended or pgconn.status != psycopg.pq.ConnStatus.OK:
            return False
        if returned is None or time.monotonic() - returned > _CHECK_IDLE:
            try:
                await AsyncConnectionPool.check_connection(driver)
            except psycopg.Error:
                return False
        return True

    async def give_back(self, driver: Driver) -> None:
        """Give back a connection whose transaction has ended (or failed: one left in
        a transaction is rolled back, one broken is closed)."""
        pool = self._pool
        if pool is not None:
            if len(self._returned) > 4 * POOL_SIZE:  # ids of connections the pool dropped
                self._returned.clear()
            self._returned[id(driver)] = time.monotonic()
            await pool.putconn(driver)
            return
        connection = self._checked_out.pop(id(driver))
        if driver.closed or driver.broken:
            await connection.invalidate()
        await connection.close()

    async def close(self) -> None:
        if self._pool is not None and self._opened:
            await self._pool.close()


async def _rollback(driver: Driver) -> None:
    """Roll back a transaction that failed; a connection that cannot is left to the
    pool, which drops a broken one."""
    with suppress(psycopg.Error):
        await driver.rollback()


class _Block:
    """One ``exclusive`` block on PostgreSQL. In order of how often it happens:

    - the adapter's own: a pooled connection, the execution's lock, the commit (rollback
      if the block raised);
    - inside an open block of the same transaction (a child created in its parent's
      step): one more lock, in a savepoint so a raising block undoes only
      itself;
    - the first block in a transaction the adapter was bound to (a caller's, or one
      from ``transaction``): the lock, held until that transaction ends.

    With a wait, an acquisition inside a transaction that must outlive a timeout runs
    in a savepoint. A class rather than a generator: this is the durable step's hot
    path.
    """

    __slots__ = (
        "_db",
        "_execution_id",
        "_own",
        "_registered",
        "_savepoint",
        "_task",
        "_tx",
        "_wait",
    )

    def __init__(self, db: PostgresDatabase, execution_id: str, wait: float | None) -> None:
        self._db = db
        self._execution_id = execution_id
        self._wait = wait
        self._tx: PostgresTransaction | None = None
        self._own = False
        self._savepoint: Savepoint | None = None
        self._task: asyncio.Task[Any] | None = None
        self._registered: Token[Any] | None = None

    async def __aenter__(self) -> None:
        db = self._db
        tx = db.current()
        if tx is not None:
            point = None
            if tx.blocks:
                self._savepoint = point = tx.next_savepoint()
                await tx.cursor.execute(point.begin)
            try:
                await db.acquire(tx, self._execution_id, self._wait, keep_usable=True)
            except BaseException:
                if point is not None:
                    # Undo to the savepoint first: after an error other than a lock
                    # timeout (a deadlock, a cancellation) the transaction is aborted, and
                    # a bare RELEASE would raise and hide the error that got us here.
                    with contextlib.suppress(psycopg.Error):
                        await tx.cursor.execute(point.undo)
                        await tx.cursor.execute(point.release)
                raise
            tx.blocks += 1
            self._tx = tx
            return
        pool = db.shared.pool
        driver = await pool.take()
        tx = PostgresTransaction(driver)
        try:
            await db.acquire(tx, self._execution_id, self._wait, keep_usable=False)
        except BaseException:
            await _rollback(driver)
            await pool.give_back(driver)
            raise
        tx.blocks = 1
        self._tx, self._own = tx, True
        self._task = task = asyncio.current_task()
        assert task is not None
        db.shared.blocks[task] = tx
        self._registered = register(tx)

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        tx = self._tx
        assert tx is not None
        tx.blocks -= 1
        if not self._own:
            point = self._savepoint
            if point is not None:
                if error is not None:
                    await tx.cursor.execute(point.undo)
                await tx.cursor.execute(point.release)
            return
        shared = self._db.shared
        assert self._task is not None
        assert self._registered is not None
        del shared.blocks[self._task]
        unregister(self._registered)
        driver = tx.driver
        try:
            if error is None:
                await driver.commit()
            else:
                await _rollback(driver)
        except BaseException:
            await _rollback(driver)
            raise
        finally:
            await shared.pool.give_back(driver)
        missing = tables_missing(error, shared.names)
        if missing is not None:  # an unmigrated database: say so
            raise missing from error


class Shared:
    """What an adapter and its views share: the engine, the statements, the pool and
    the blocks open per task."""

    def __init__(
        self, engine: AsyncEngine, owned: bool, tables: Tables, url: sa.URL | None
    ) -> None:
        self.engine = engine
        self.owned = owned
        self.tables = tables
        self.statements = s = ExecutionStatements(tables, POSTGRES, PINNING, WAITING)
        # PostgreSQL writes in WITH (a step's update and append are one statement) and
        # locks each execution of its own.
        assert s.record_step is not None
        assert s.lock_execution is not None
        assert s.try_lock_execution is not None
        self.record_step: str = s.record_step
        self.record_steps: str | None = s.record_steps
        self.lock_execution: str = s.lock_execution
        self.try_lock_execution: str = s.try_lock_execution
        self.names = table_names(tables)
        self.pool = _Pool(engine, url)
        self.blocks: dict[asyncio.Task[Any], PostgresTransaction] = {}


class PostgresDatabase:
    """The adapter's operations on PostgreSQL, free or bound to one transaction (a
    view). Each operation is a coroutine of a cursor (``_fetch_execution`` ...), run
    where :meth:`current` says, or in a short transaction of its own (:meth:`_alone`).
    """

    __slots__ = ("shared", "statements", "view")

    def __init__(self, shared: Shared, view: PostgresTransaction | None = None) -> None:
        self.shared = shared
        self.statements = shared.statements
        self.view = view

    def bound(self, tx: PostgresTransaction) -> PostgresDatabase:
        """These operations, every one of them run in ``tx``."""
        return PostgresDatabase(self.shared, tx)

    def joined(self, connection: sa.Connection | AsyncConnection) -> PostgresDatabase:
        """Bound to a caller's connection, whose transaction the caller ends."""
        if not isinstance(connection, AsyncConnection):
            raise TypeError("on PostgreSQL join an AsyncConnection of the adapter's engine")
        driver = connection.sync_connection
        raw = None if driver is None else driver.connection.driver_connection
        if not isinstance(raw, psycopg.AsyncConnection):
            raise TypeError(f"a PostgreSQL adapter joins a psycopg connection, not {raw!r}")
        return self.bound(PostgresTransaction(raw))

    def current(self) -> PostgresTransaction | None:
        """The transaction a call runs in: the view's, else the block the calling task
        holds, else ``None`` (a transaction of its own)."""
        view = self.view
        if view is not None:
            return view
        blocks = self.shared.blocks
        if not blocks:
            return None
        task = asyncio.current_task()
        return None if task is None else blocks.get(task)

    async def _alone(self, work: Callable[..., Awaitable[_T]], *args: Any) -> _T:
        pool = self.shared.pool
        driver = await pool.take()
        try:
            result = await work(driver.cursor(), *args)
            await driver.commit()
        except BaseException as error:
            await _rollback(driver)
            await pool.give_back(driver)
            missing = tables_missing(error, self.shared.names)
            if missing is None:
                raise
            raise missing from error  # an unmigrated database: say so
        await pool.give_back(driver)
        return result

    async def _run(self, work: Callable[..., Awaitable[_T]], *args: Any) -> _T:
        tx = self.current()
        if tx is not None:
            return await work(tx.cursor, *args)
        return await self._alone(work, *args)

    async def acquire(
        self, tx: PostgresTransaction, execution_id: str, wait: float | None, keep_usable: bool
    ) -> None:
        """Take the execution's lock in ``tx``, waiting at most ``wait``
        seconds. ``keep_usable``: the transaction must outlive a timeout (it is not the
        block's own), so the attempt runs in a savepoint.

        A bounded wait first tries the lock without waiting: a lock nobody holds or
        waits for (PostgreSQL grants no try ahead of a waiter) is taken in one round
        trip, as an unbounded one is; only a contended lock pays the three statements
        that bound the wait."""
        hold(tx, [("execution", execution_id)], f"execution {execution_id!r}")
        cursor, shared = tx.cursor, self.shared
        values = {"key": execution_lock_key(execution_id)}
        if wait is None:
            await cursor.execute(shared.lock_execution, values)
            return
        started = time.monotonic()
        await cursor.execute(shared.try_lock_execution, values)
        taken = await cursor.fetchone()
        if taken is not None and taken[0]:
            return
        point = tx.next_savepoint() if keep_usable else None
        if point is not None:
            await cursor.execute(point.begin)
        try:
            await cursor.execute(SET_LOCK_TIMEOUT, {"t": lock_timeout(wait)})
            row = await cursor.fetchone()
            assert row is not None
            await cursor.execute(shared.lock_execution, values)
            await cursor.execute(RESTORE_LOCK_TIMEOUT, {"t": row[0]})
        except psycopg.Error as error:
            if not POSTGRES.lock_not_granted(error):
                raise
            if point is not None:
                await cursor.execute(point.undo)
                await cursor.execute(point.release)
            raise LockTimeout(execution_id, time.monotonic() - started) from None
        if point is not None:
            await cursor.execute(point.release)

    def exclusive(self, execution_id: str, wait: float | None) -> _Block:
        return _Block(self, execution_id, wait)

    @asynccontextmanager
    async def transaction(
        self, wait: float | None, commit_in_thread: bool = False
    ) -> AsyncIterator[PostgresTransaction]:
        """The transaction of :meth:`SqlAdapter.transaction`: a pooled connection in a
        transaction, no lock (``wait`` bounds nothing here; the commit is awaited on
        the loop whatever ``commit_in_thread`` says); on a view, the view's
        transaction, which its owner ends."""
        if self.view is not None:
            yield self.view
            return
        pool = self.shared.pool
        tx = PostgresTransaction(await pool.take())
        try:
            with opened(tx):
                yield tx
            await tx.driver.commit()
        except BaseException as error:
            await _rollback(tx.driver)
            missing = tables_missing(error, self.shared.names)
            if missing is None:
                raise
            raise missing from error  # an unmigrated database: say so
        finally:
            await pool.give_back(tx.driver)

    async def close(self) -> None:
        if self.view is None:
            await self.shared.pool.close()

    # Charts.

    async def save_chart(self, record: ChartRecord) -> ChartRecord:
        return await self._run(self._save_chart, record)

    async def _save_chart(self, cursor: Cursor, record: ChartRecord) -> ChartRecord:
        s = self.statements
        values = {
            "content_hash": record.content_hash,
            "chart_blob": record.source,
            "name": record.name,
            "version": record.version,
            "saved_at": utc(record.saved_at),
            "retired_at": utc(record.retired_at),
            "retired_by": record.retired_by,
        }
        assert s.save_chart is not None  # PostgreSQL writes in WITH
        values["h"] = record.content_hash
        await cursor.execute(s.save_chart, s.keyed(values))
        row = await cursor.fetchone()
        if row is None:  # stored by a transaction that committed during the insert
            await cursor.execute(s.fetch_chart, {"h": record.content_hash})
            row = await cursor.fetchone()
        assert row is not None
        return chart(row, utc_time)

    async def fetch_chart(self, content_hash: str) -> ChartRecord | None:
        return await self._run(self._fetch_chart, content_hash)

    async def _fetch_chart(self, cursor: Cursor, content_hash: str) -> ChartRecord | None:
        await cursor.execute(self.statements.fetch_chart, {"h": content_hash})
        row = await cursor.fetchone()
        return None if row is None else chart(row, utc_time)

    async def retire_chart(
        self, content_hash: str, retired_by: str, retired_at: datetime
    ) -> ChartRecord | None:
        return await self._run(self._retire_chart, content_hash, retired_by, retired_at)

    async def _retire_chart(
        self, cursor: Cursor, content_hash: str, retired_by: str, retired_at: datetime
    ) -> ChartRecord | None:
        s = self.statements
        await cursor.execute(s.lock_chart, {"h": content_hash})
        row = await cursor.fetchone()
        if row is None or row[0] is not None:
            return await self._fetch_chart(cursor, content_hash)
        pins = await self._pins(cursor, content_hash)
        if pins:
            raise Pinned(content_hash, pins)
        values = {"h": content_hash, "by": retired_by, "at": utc(retired_at)}
        await cursor.execute(s.retire_chart, values)
        return await self._fetch_chart(cursor, content_hash)

    async def _pins(self, cursor: Cursor, content_hash: str) -> dict[str, int]:
        """What in these tables holds the chart. Executions are counted before linked
        children: a child ending between the two counts was active in the first."""
        counts = {
            f"executions_{status.value}": n
            for status, n in (await self._count_executions_on(cursor, content_hash)).items()
            if status.pins and n
        }
        positions = await self._count_positions_on(cursor, content_hash)
        linked = await self._count_linked(cursor, content_hash)
        counts.update(
            {k: n for k, n in (("positions", positions), ("children_linked", linked)) if n}
        )
        return counts

    async def count_linked_children_on(self, content_hash: str) -> int:
        return await self._run(self._count_linked, content_hash)

    async def _count_linked(self, cursor: Cursor, content_hash: str) -> int:
        await cursor.execute(self.statements.linked, {"h": content_hash})
        row = await cursor.fetchone()
        assert row is not None
        return int(row[0])

    # Executions.

    async def insert_execution(self, record: ExecutionRecord) -> None:
        await self._run(self._insert_execution, record)

    async def _insert_execution(self, cursor: Cursor, record: ExecutionRecord) -> None:
        if record.created_at is None or record.updated_at is None:
            raise ValueError(f"execution {record.id!r} needs created_at and updated_at")
        s = self.statements
        await cursor.execute(s.guard_chart, {"h": record.content_hash})
        guard = await cursor.fetchone()
        if guard is not None and guard[0] is not None:
            raise ChartRetired(record.content_hash, guard[1])
        values = {
            "execution_id": record.id,
            "content_hash": record.content_hash,
            "status": record.status.value,
            "position_blob": record.position,
            "metadata": Jsonb(dict(record.metadata)),
            "outcome_blob": record.outcome,
            "failure": record.failure,
            "created_at": utc(record.created_at),
            "updated_at": utc(record.updated_at),
            "ended_at": utc(record.ended_at),
            "error_count": record.error_count,
            "last_error_at": utc(record.last_error_at),
            "final_state": record.final_state,
            "bucket": bucket_of(record.id),
        }
        await cursor.execute(s.insert_execution, s.keyed(values))
        if await cursor.fetchone() is None:
            raise ExecutionExists(record.id)

    async def fetch_execution(self, execution_id: str) -> ExecutionRecord | None:
        tx = self.current()
        if tx is None:
            return await self._alone(self._fetch_execution, execution_id, False)
        return await self._fetch_execution(tx.cursor, execution_id, True)

    async def _fetch_execution(
        self, cursor: Cursor, execution_id: str, locked: bool
    ) -> ExecutionRecord | None:
        s = self.statements
        sql = s.fetch_execution_locked if locked else s.fetch_execution
        await cursor.execute(sql, {"id": execution_id})
        row = await cursor.fetchone()
        return None if row is None else _execution(row)

    async def fetch_executions(self, execution_ids: Sequence[str]) -> list[ExecutionRecord]:
        tx = self.current()
        if tx is None:
            return await self._alone(self._fetch_executions, execution_ids, False)
        return await self._fetch_executions(tx.cursor, execution_ids, True)

    async def _fetch_executions(
        self, cursor: Cursor, execution_ids: Sequence[str], locked: bool
    ) -> list[ExecutionRecord]:
        s = self.statements
        sql = s.fetch_executions_locked if locked else s.fetch_executions
        await cursor.execute(sql, {"ids": list(execution_ids)})
        return [_execution(row) for row in await cursor.fetchall()]

    async def update_execution(self, record: ExecutionRecord) -> None:
        await self._run(self._update_execution, record)

    async def _update_execution(self, cursor: Cursor, record: ExecutionRecord) -> None:
        await cursor.execute(self.statements.update_execution, _updated(record))
        if not cursor.rowcount:
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
        return await self._run(self._record_step, record, via, event, recorded_at, cap, errors)

    async def _record_step(
        self,
        cursor: Cursor,
        record: ExecutionRecord,
        via: str,
        event: bytes,
        recorded_at: datetime,
        cap: int | None,
        errors: Sequence[ErrorRecord] = (),
    ) -> int | None:
        s = self.statements
        values = _updated(record)
        values.update(via=via, cap=cap, input_blob=event, recorded_at=utc(recorded_at))
        await cursor.execute(self.shared.record_step, s.keyed(values))
        row = await cursor.fetchone()
        assert row is not None
        updated, seq = row
        if not updated:
            raise ExecutionNotFound(record.id)
        answer = None if seq is None else appended([(seq,)], cap)
        if errors:
            # Rare: a second statement, in the same transaction, rather than a wider
            # statement for every step.
            await self._record_errors(cursor, [replace(each, seq=answer) for each in errors])
        return answer

    async def record_steps(self, steps: Sequence[StepWrite], cap: int | None) -> None:
        if steps:
            await self._run(self._record_steps, steps, cap)

    async def _record_steps(
        self, cursor: Cursor, steps: Sequence[StepWrite], cap: int | None
    ) -> None:
        # One statement: each execution's row to its last step's record, every step's
        # entry appended in order.
        statement = self.shared.record_steps
        if statement is None:  # the client makes the entries' keys
            for step in steps:
                await self._record_step(
                    cursor, step.record, step.via, step.event, step.recorded_at, cap
                )
            return
        last = {step.record.id: step.record for step in steps}
        finals = [_updated(record) for record in last.values()]
        values = {
            "cap": cap,
            "ids": [step.record.id for step in steps],
            "vias": [step.via for step in steps],
            "blobs": [step.event for step in steps],
            "ats": [utc(step.recorded_at) for step in steps],
        }
        for column in finals[0]:
            values[f"f_{column}"] = [final[column] for final in finals]
        await cursor.execute(statement, values)
        updated = {row[0] for row in await cursor.fetchall()}
        missing = next((each for each in last if each not in updated), None)
        if missing is not None:
            raise ExecutionNotFound(missing)

    # Errors.

    async def record_errors(self, errors: Sequence[ErrorRecord]) -> None:
        if errors:
            await self._run(self._record_errors, errors)

    async def _record_errors(self, cursor: Cursor, errors: Sequence[ErrorRecord]) -> None:
        s = self.statements
        await cursor.executemany(
            s.insert_error,
            [s.keyed(error_values(each, utc)) for each in errors],
        )

    async def errors(self, execution_id: str, limit: int) -> list[ErrorRecord]:
        if limit <= 0:
            return []
        return await self._run(self._errors, execution_id, limit)

    async def _errors(self, cursor: Cursor, execution_id: str, limit: int) -> list[ErrorRecord]:
        await cursor.execute(self.statements.errors, {"id": execution_id, "limit": limit})
        return [error(row, utc_time) for row in await cursor.fetchall()]

    async def rechart_execution(self, record: ExecutionRecord, from_hash: str) -> bool:
        return await self._run(self._rechart_execution, record, from_hash)

    async def _rechart_execution(
        self, cursor: Cursor, record: ExecutionRecord, from_hash: str
    ) -> bool:
        values = {
            "to": record.content_hash,
            "status": record.status.value,
            "position_blob": record.position,
            "failure": record.failure,
            "updated_at": utc(record.updated_at),
            "id": record.id,
            "from": from_hash,
        }
        await cursor.execute(self.statements.rechart_execution, values)
        return bool(cursor.rowcount)

    async def count_executions_on(self, content_hash: str) -> Mapping[Status, int]:
        return await self._run(self._count_executions_on, content_hash)

    async def _count_executions_on(self, cursor: Cursor, content_hash: str) -> dict[Status, int]:
        await cursor.execute(self.statements.count_executions, {"h": content_hash})
        return {Status(status): int(count) for status, count in await cursor.fetchall()}

    async def pinning_executions(self, content_hash: str) -> list[str]:
        return await self._run(self._pinning_executions, content_hash)

    async def _pinning_executions(self, cursor: Cursor, content_hash: str) -> list[str]:
        await cursor.execute(self.statements.pinning, {"h": content_hash})
        return [execution_id for (execution_id,) in await cursor.fetchall()]

    async def list_by_metadata(self, pairs: Mapping[str, str]) -> list[ExecutionRecord]:
        rows = await self._run(self._by_metadata, pairs, False)
        return [_execution(row) for row in rows]

    async def statuses_by_metadata(self, pairs: Mapping[str, str]) -> dict[str, Status]:
        rows = await self._run(self._by_metadata, pairs, True)
        return {execution_id: Status(status) for execution_id, status in rows}

    async def _by_metadata(
        self, cursor: Cursor, pairs: Mapping[str, str], statuses: bool
    ) -> list[tuple[Any, ...]]:
        # Every pair given, as one document: keys and values bound, never spliced.
        sql = self.statements.metadata_query(pairs, statuses=statuses)
        values = {"metadata": Jsonb(dict(pairs)), "parent": pairs.get(PARENT_METADATA_KEY)}
        await cursor.execute(sql, values)
        return await cursor.fetchall()

    # Durable children's answers.

    async def insert_answer(self, record: AnswerRecord) -> None:
        await self._run(self._insert_answer, record)

    async def _insert_answer(self, cursor: Cursor, record: AnswerRecord) -> None:
        s = self.statements
        values = {
            "child_id": record.child_id,
            "parent_id": record.parent_id,
            "invoke_id": record.invoke_id,
            "content_hash": record.content_hash,
            "kind": record.status.value,
            "answer_blob": record.outcome,
            "failure": record.failure,
            "created_at": utc(record.created_at),
            "delivered_at": utc(record.delivered_at),
        }
        await cursor.execute(s.insert_answer, s.keyed(values))

    async def fetch_answer(self, child_id: str) -> AnswerRecord | None:
        rows = await self._run(self._answers, self.statements.fetch_answer, {"id": child_id})
        return rows[0] if rows else None

    async def undelivered_answers(self, limit: int) -> list[AnswerRecord]:
        if limit <= 0:
            return []
        return await self._run(self._answers, self.statements.undelivered, {"limit": limit})

    async def _answers(
        self, cursor: Cursor, sql: str, values: dict[str, Any]
    ) -> list[AnswerRecord]:
        await cursor.execute(sql, values)
        return [answer(row, utc_time) for row in await cursor.fetchall()]

    async def mark_delivered(self, child_ids: Sequence[str], delivered_at: datetime) -> None:
        if child_ids:
            await self._run(self._mark_delivered, list(child_ids), delivered_at)

    async def _mark_delivered(self, cursor: Cursor, ids: list[str], at: datetime) -> None:
        await cursor.execute(self.statements.mark_delivered, {"ids": ids, "at": utc(at)})

    async def take_fan_out_end(self, parent_id: str, invoke_id: str, ended_at: datetime) -> bool:
        return await self._run(self._take_fan_out_end, parent_id, invoke_id, ended_at)

    async def _take_fan_out_end(
        self, cursor: Cursor, parent_id: str, invoke_id: str, at: datetime
    ) -> bool:
        s = self.statements
        values = {"parent": parent_id, "invoke": invoke_id, "at": utc(at)}
        await cursor.execute(s.take_fan_out_end, s.keyed(values))
        return await cursor.fetchone() is not None

    async def fan_out_ended(self, parent_id: str, invoke_id: str) -> bool:
        return await self._run(self._fan_out_ended, parent_id, invoke_id)

    async def _fan_out_ended(self, cursor: Cursor, parent_id: str, invoke_id: str) -> bool:
        await cursor.execute(
            self.statements.fan_out_ended, {"parent": parent_id, "invoke": invoke_id}
        )
        return await cursor.fetchone() is not None

    # Saved positions.

    async def save_position(self, record: PositionRecord) -> None:
        await self._run(self._save_position, record)

    async def _save_position(self, cursor: Cursor, record: PositionRecord) -> None:
        s = self.statements
        values = {
            "key": record.key,
            "content_hash": record.content_hash,
            "position_blob": record.position,
            "saved_at": utc(record.saved_at),
            "bucket": bucket_of(record.key),
        }
        await cursor.execute(s.save_position, s.keyed(values))

    async def fetch_position(self, key: str) -> PositionRecord | None:
        return await self._run(self._fetch_position, key)

    async def _fetch_position(self, cursor: Cursor, key: str) -> PositionRecord | None:
        await cursor.execute(self.statements.fetch_position, {"key": key})
        row = await cursor.fetchone()
        if row is None:
            return None
        return PositionRecord(
            row[0], content_hash=row[1], position=row[2], saved_at=row[3].astimezone(UTC)
        )

    async def delete_position(self, key: str) -> bool:
        return await self._run(self._delete_position, key)

    async def _delete_position(self, cursor: Cursor, key: str) -> bool:
        await cursor.execute(self.statements.delete_position, {"key": key})
        return cursor.rowcount > 0

    async def count_positions_on(self, content_hash: str) -> int:
        return await self._run(self._count_positions_on, content_hash)

    async def _count_positions_on(self, cursor: Cursor, content_hash: str) -> int:
        await cursor.execute(self.statements.count_positions, {"h": content_hash})
        row = await cursor.fetchone()
        assert row is not None
        return int(row[0])

    # The input log.

    async def append_input(
        self,
        execution_id: str,
        via: str,
        event: bytes,
        recorded_at: datetime,
        cap: int | None,
    ) -> int | None:
        return await self._run(self._append_input, execution_id, via, event, recorded_at, cap)

    async def _append_input(
        self,
        cursor: Cursor,
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
            "recorded_at": utc(recorded_at),
        }
        await cursor.execute(s.append_input, s.keyed(values))
        return appended(await cursor.fetchall(), cap)

    async def inputs(self, execution_id: str) -> list[InputRecord]:
        return await self._run(self._inputs, execution_id)

    async def _inputs(self, cursor: Cursor, execution_id: str) -> list[InputRecord]:
        await cursor.execute(self.statements.inputs, {"id": execution_id})
        return [
            InputRecord(
                execution_id,
                seq=seq,
                via=via,
                event=blob,
                recorded_at=recorded_at.astimezone(UTC),
            )
            for execution_id, seq, via, blob, recorded_at in await cursor.fetchall()
        ]

    # Retention.

    async def prune(self, ended_before: datetime, limit: int) -> list[str]:
        if limit <= 0:
            return []
        return await self._run(self._prune, ended_before, limit)

    async def _prune(self, cursor: Cursor, ended_before: datetime, limit: int) -> list[str]:
        s = self.statements
        await cursor.execute(s.prune, {"before": utc(ended_before), "limit": limit})
        pruned = [execution_id for (execution_id,) in await cursor.fetchall()]
        if pruned:
            await cursor.execute(s.drop_logs, {"ids": pruned})
            await cursor.execute(s.drop_errors, {"ids": pruned})
        return pruned
