"""How :class:`~statifier.persistence.sql.SqlAdapter` runs its SQL: one small runner per
database, so the adapter's statements are written once.

Statements are SQLAlchemy Core, compiled once per dialect into a :class:`Prepared`
(the dialect's SQL text plus SQLAlchemy's own bind and result processors), and run
straight on the driver connection that SQLAlchemy's pool hands out: psycopg 3 (async)
on PostgreSQL, the standard ``sqlite3`` module inline on the event loop for SQLite.
The statements then cost what the driver costs, which is what the router's step rate
is bounded by.

A unit of work is one transaction. Inside ``exclusive`` the unit is held by the task
(a context variable on PostgreSQL; on SQLite, whose single writer one task holds at a
time, the writer object itself), so every call the task makes in the block joins it;
outside, each call is a unit of its own. A runner bound to a caller's connection (``joined``)
runs everything in the caller's transaction and never commits or rolls back.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine.processors import str_to_datetime
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.compiler import SQLCompiler

from statifier.persistence.errors import LockTimeout
from statifier.sql.types import UtcDateTime

T = TypeVar("T")

_Processor = Callable[[Any], Any] | None

# SQLite answers SQLITE_BUSY (5, and extended codes whose low byte is 5) at once when
# busy_timeout is 0; the runner then waits without blocking the loop.
_SQLITE_BUSY = 5
_FIRST_BACKOFF = 0.0005
_LAST_BACKOFF = 0.005
_LOCK_NOT_AVAILABLE = "55P03"
_IDLE = 0  # libpq's PQTRANS_IDLE: no transaction open


def _sqlite_utc_text(value: datetime | None) -> str | None:
    """What :class:`UtcDateTime` binds on SQLite (the UTC wall time as SQLAlchemy's
    ``DATETIME`` text, microseconds always written), in one step instead of a type
    decorator over the dialect's processor."""
    if value is None:
        return None
    if value.tzinfo is not UTC:
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"stored times must be timezone-aware, not {value!r}")
        value = value.astimezone(UTC)
    # In UTC the text ends in "+00:00"; cutting it is cheaper than replace(tzinfo=None).
    return value.isoformat(" ", "microseconds")[:-6]


def _sqlite_utc_datetime(value: str | None) -> datetime | None:
    """What :class:`UtcDateTime` reads on SQLite: the stored text as an aware UTC time."""
    if value is None:
        return None
    try:  # the stored form has no offset: read it as UTC at once
        parsed: datetime = datetime.fromisoformat(value + "+00:00")
    except ValueError:
        pass
    else:
        if parsed.tzinfo is UTC:
            return parsed
    parsed = str_to_datetime(value)
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def _postgres_utc(value: datetime | None) -> datetime | None:
    """What :class:`UtcDateTime` binds on PostgreSQL, without the type decorator's
    layers: the aware time in UTC."""
    if value is None:
        return None
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"stored times must be timezone-aware, not {value!r}")
    return value.astimezone(UTC)


def _postgres_utc_datetime(value: datetime | None) -> datetime | None:
    """What :class:`UtcDateTime` reads on PostgreSQL: the driver's time in UTC."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _sqlite_json(value: str | None) -> Any:
    """What ``JSON`` reads on SQLite with the standard deserializer; the empty object
    (metadata nobody gave) without parsing it."""
    if value is None:
        return None
    return {} if value == "{}" else json.loads(value)


def _bind_processor(type_: Any, dialect: sa.Dialect) -> Callable[[Any], Any] | None:
    if isinstance(type_, UtcDateTime) and dialect.name in ("sqlite", "postgresql"):
        return _sqlite_utc_text if dialect.name == "sqlite" else _postgres_utc
    processor: Callable[[Any], Any] | None = type_.dialect_impl(dialect).bind_processor(dialect)
    return processor


def _result_processor(type_: Any, dialect: sa.Dialect) -> Callable[[Any], Any] | None:
    if isinstance(type_, UtcDateTime) and dialect.name in ("sqlite", "postgresql"):
        return _sqlite_utc_datetime if dialect.name == "sqlite" else _postgres_utc_datetime
    standard_json = getattr(dialect, "_json_deserializer", None) is None
    if dialect.name == "sqlite" and isinstance(type_, sa.JSON) and standard_json:
        return _sqlite_json
    processor: Callable[[Any], Any] | None = type_.dialect_impl(dialect).result_processor(
        dialect, None
    )
    return processor


class Prepared:
    """One statement compiled for one dialect, with its processors.

    ``values`` given to :meth:`params` are keyed by bind parameter name; literal values
    bound inside the statement are filled in from the compilation. The processors are
    SQLAlchemy's, except for :class:`UtcDateTime`, converted directly (on SQLite to and
    from the same text), and on SQLite for JSON read with the standard deserializer.
    """

    __slots__ = ("_binds", "_converted", "_named", "_results", "names", "sql")

    def __init__(self, statement: sa.Executable, dialect: sa.Dialect) -> None:
        assert isinstance(statement, sa.ClauseElement)
        compiled = statement.compile(dialect=dialect)
        assert isinstance(compiled, SQLCompiler)
        self.sql: str = compiled.string
        self._named = dialect.paramstyle in ("named", "pyformat")
        by_name = {name: bind for bind, name in compiled.bind_names.items()}
        names = list(by_name) if self._named else list(compiled.positiontup or ())
        self.names: tuple[str, ...] = tuple(names)
        defaults = compiled.params
        # The hot path builds the parameters in one pass and converts only the few
        # values that need it (times, JSON), in place.
        self._binds: tuple[tuple[str, Any], ...] = tuple(
            (name, defaults.get(name)) for name in names
        )
        self._converted: tuple[tuple[int, str, Callable[[Any], Any]], ...] = tuple(
            (index, name, processor)
            for index, name in enumerate(names)
            for processor in (_bind_processor(by_name[name].type, dialect),)
            if processor is not None
        )
        columns = list(getattr(statement, "exported_columns", ()))
        self._results: tuple[tuple[int, Callable[[Any], Any]], ...] = tuple(
            (index, processor)
            for index, column in enumerate(columns)
            for processor in (_result_processor(column.type, dialect),)
            if processor is not None
        )

    def params(self, values: Mapping[str, Any]) -> Any:
        """The driver's parameters for ``values`` (a dict or a tuple, by paramstyle)."""
        get = values.get
        if self._named:
            named = {name: get(name, default) for name, default in self._binds}
            for _index, name, processor in self._converted:
                named[name] = processor(named[name])
            return named
        positional = [get(name, default) for name, default in self._binds]
        for index, _name, processor in self._converted:
            positional[index] = processor(positional[index])
        return positional

    def args(self, values: Sequence[Any]) -> Sequence[Any]:
        """The driver's positional parameters for ``values`` given in the order of
        :attr:`names` (a positional paramstyle only)."""
        if not self._converted:
            return values
        positional = list(values)
        for index, _name, processor in self._converted:
            positional[index] = processor(positional[index])
        return positional

    def row(self, raw: Sequence[Any]) -> list[Any]:
        """A driver row with SQLAlchemy's result processing applied."""
        row = list(raw)
        for index, processor in self._results:
            row[index] = processor(row[index])
        return row


class Session(Protocol):
    """Runs prepared statements inside one transaction."""

    async def rows(self, prepared: Prepared, values: Mapping[str, Any]) -> list[list[Any]]:
        """Run a statement that answers rows; answer them."""
        ...

    async def run(self, prepared: Prepared, values: Mapping[str, Any]) -> int:
        """Run a statement that answers no rows; answer the row count."""
        ...

    async def run_many(self, prepared: Prepared, values: Sequence[Mapping[str, Any]]) -> None:
        """Run a statement once per set of values."""
        ...


class SqliteSession:
    """Statements on a ``sqlite3`` connection, run inline (they take microseconds)."""

    __slots__ = ("_cursor", "driver")

    def __init__(self, driver: sqlite3.Connection) -> None:
        self.driver = driver
        self._cursor = driver.cursor()

    def rows_in_order(self, prepared: Prepared, values: Sequence[Any]) -> list[Any]:
        """:meth:`rows` without a coroutine around it, with the values in the order of
        ``prepared.names`` and the rows as the driver answers them (no result
        processing)."""
        return self._cursor.execute(prepared.sql, prepared.args(values)).fetchall()

    def run_in_order(self, prepared: Prepared, values: Sequence[Any]) -> int:
        """:meth:`run` without a coroutine around it, with the values in the order of
        ``prepared.names``."""
        return int(self._cursor.execute(prepared.sql, prepared.args(values)).rowcount)

    async def rows(self, prepared: Prepared, values: Mapping[str, Any]) -> list[list[Any]]:
        raw = self._cursor.execute(prepared.sql, prepared.params(values)).fetchall()
        return [prepared.row(row) for row in raw]

    async def run(self, prepared: Prepared, values: Mapping[str, Any]) -> int:
        return int(self._cursor.execute(prepared.sql, prepared.params(values)).rowcount)

    async def run_many(self, prepared: Prepared, values: Sequence[Mapping[str, Any]]) -> None:
        self._cursor.executemany(prepared.sql, [prepared.params(v) for v in values])

    def command(self, sql: str) -> None:
        self._cursor.execute(sql)


class PostgresSession:
    """Statements on a psycopg 3 async connection."""

    __slots__ = ("_cursor", "driver")

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self._cursor = driver.cursor()

    async def rows(self, prepared: Prepared, values: Mapping[str, Any]) -> list[list[Any]]:
        cursor = self._cursor
        await cursor.execute(prepared.sql, prepared.params(values))
        return [prepared.row(row) for row in await cursor.fetchall()]

    async def run(self, prepared: Prepared, values: Mapping[str, Any]) -> int:
        cursor = self._cursor
        await cursor.execute(prepared.sql, prepared.params(values))
        return int(cursor.rowcount)

    async def run_many(self, prepared: Prepared, values: Sequence[Mapping[str, Any]]) -> None:
        await self._cursor.executemany(prepared.sql, [prepared.params(v) for v in values])

    async def rows_in_order(self, prepared: Prepared, values: Sequence[Any]) -> list[Any]:
        """:meth:`rows` with the values in the order of ``prepared.names``, the rows as
        the driver answers them (no result processing)."""
        cursor = self._cursor
        await cursor.execute(prepared.sql, prepared.args(values))
        rows: list[Any] = await cursor.fetchall()
        return rows

    async def run_in_order(self, prepared: Prepared, values: Sequence[Any]) -> int:
        """:meth:`run` with the values in the order of ``prepared.names``."""
        cursor = self._cursor
        await cursor.execute(prepared.sql, prepared.args(values))
        return int(cursor.rowcount)

    async def command(self, sql: str) -> None:
        await self._cursor.execute(sql)


@dataclass(frozen=True, slots=True)
class _Held:
    owner: object
    task: asyncio.Task[Any] | None
    session: Session
    depth: int


_HELD: contextvars.ContextVar[tuple[_Held, ...]] = contextvars.ContextVar(
    "statifier_sql_units", default=()
)


def _held(owner: object) -> _Held | None:
    units = _HELD.get()
    if not units:
        return None
    task = asyncio.current_task()
    for unit in units:
        if unit.owner is owner and unit.task is task:
            return unit
    return None


@asynccontextmanager
async def _holding(owner: object, session: Session, depth: int) -> AsyncIterator[None]:
    token = _HELD.set((*_HELD.get(), _Held(owner, asyncio.current_task(), session, depth)))
    try:
        yield
    finally:
        _HELD.reset(token)


def lock_timeout_ms(wait: float) -> str:
    """PostgreSQL's ``lock_timeout`` for a wait in seconds (at least 1 ms: 0 means no
    bound there)."""
    return f"{max(1, round(wait * 1000))}ms"


class Runner(Protocol):
    """Where the adapter's units of work run (one per database kind)."""

    dialect: sa.Dialect

    async def run(self, operation: Callable[..., Awaitable[T]], write: bool, *args: Any) -> T:
        """``operation(session, *args)`` in the held unit, or in a unit of its own."""
        ...

    def exclusive(self, execution_id: str, wait: float | None) -> AbstractAsyncContextManager[None]:
        """The per-execution lock and its unit of work, as an async context manager."""
        ...

    def holding(self) -> bool:
        """Whether the current task is inside a block (or a caller's transaction)."""
        ...

    def inline(self) -> SqliteSession | None:
        """The session a call of the current task can run on at once, without a
        coroutine or a unit of its own (SQLite, inside a block or a caller's
        transaction), else ``None``: go through :meth:`run`."""
        ...

    async def close(self) -> None:
        """Give back what the runner holds."""
        ...


# --- PostgreSQL -------------------------------------------------------------------------


class PostgresStatements:
    """The lock statements (prepared by the runner once the dialect is known)."""

    def __init__(self, dialect: sa.Dialect) -> None:
        key = sa.func.hashtextextended(sa.bindparam("execution_id", type_=sa.Text()), 0)
        self.lock = Prepared(sa.select(sa.func.pg_advisory_xact_lock(key)), dialect)
        self.set_timeout = Prepared(
            sa.select(
                sa.func.current_setting("lock_timeout", type_=sa.Text()),
                sa.func.set_config("lock_timeout", sa.bindparam("timeout", type_=sa.Text()), True),
            ),
            dialect,
        )
        self.restore_timeout = Prepared(
            sa.select(
                sa.func.set_config("lock_timeout", sa.bindparam("timeout", type_=sa.Text()), True)
            ),
            dialect,
        )


def _lock_not_available(error: BaseException) -> bool:
    return getattr(error, "sqlstate", None) == _LOCK_NOT_AVAILABLE


@dataclass(frozen=True, slots=True)
class _Kept:
    connection: AsyncConnection
    session: PostgresSession


class _KeptConnections:
    """Connections taken from the engine's pool and kept between units: a checkout and
    a checkin through SQLAlchemy's async pool cost about as much CPU as a statement.
    At most ``keep`` idle ones are kept; one left in doubt (an error, a cancellation)
    is rolled back, or dropped from the pool if even that fails."""

    def __init__(self, engine: AsyncEngine, keep: int) -> None:
        self._engine = engine
        self._keep = keep
        self._idle: list[_Kept] = []

    async def take(self) -> _Kept:
        if self._idle:
            return self._idle.pop()
        connection = await self._engine.connect()
        try:
            driver = (await connection.get_raw_connection()).driver_connection
        except BaseException:
            await connection.close()
            raise
        return _Kept(connection, PostgresSession(driver))

    async def give_back(self, kept: _Kept, committed: bool) -> None:
        driver = kept.session.driver
        if not committed:
            try:
                await driver.rollback()
            except Exception:  # noqa: BLE001 - a broken connection is dropped, not raised
                await kept.connection.invalidate()
                await kept.connection.close()
                return
        idle = driver.info.transaction_status == _IDLE and not driver.closed
        if idle and len(self._idle) < self._keep:
            self._idle.append(kept)
        else:
            await kept.connection.close()

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for kept in idle:
            await kept.connection.close()


class PostgresRunner:
    """Units of work on an :class:`AsyncEngine` (or on a caller's connection)."""

    def __init__(
        self,
        engine: AsyncEngine,
        owner: object,
        joined: AsyncConnection | None = None,
        keep: int = 0,
    ) -> None:
        self._kept = _KeptConnections(engine, keep)
        # Positional parameters: psycopg then binds a list as it comes, instead of
        # reordering a dict on every execution.
        compiling: Any = type(engine.dialect)
        self.dialect: sa.Dialect = compiling(paramstyle="format")
        self._owner = owner
        self._joined = joined
        self._joined_session: PostgresSession | None = None
        self._locks: PostgresStatements | None = None

    def holding(self) -> bool:
        return self._joined is not None or _held(self._owner) is not None

    def inline(self) -> SqliteSession | None:
        return None

    def held(self) -> PostgresSession | None:
        """The session of the block the current task is inside, if any."""
        unit = _held(self._owner)
        if unit is None:
            return None
        assert isinstance(unit.session, PostgresSession)
        return unit.session

    def _statements(self) -> PostgresStatements:
        if self._locks is None:
            self._locks = PostgresStatements(self.dialect)
        return self._locks

    async def _caller_session(self) -> PostgresSession:
        if self._joined_session is None:
            assert self._joined is not None
            raw = await self._joined.get_raw_connection()
            self._joined_session = PostgresSession(raw.driver_connection)
        return self._joined_session

    async def run(self, operation: Callable[..., Awaitable[T]], write: bool, *args: Any) -> T:
        unit = _held(self._owner)
        if unit is not None:
            return await operation(unit.session, *args)
        if self._joined is not None:
            return await operation(await self._caller_session(), *args)
        kept = await self._kept.take()
        session = kept.session
        try:
            result = await operation(session, *args)
            await session.driver.commit()
        except BaseException:
            await self._kept.give_back(kept, committed=False)
            raise
        await self._kept.give_back(kept, committed=True)
        return result

    def exclusive(self, execution_id: str, wait: float | None) -> AbstractAsyncContextManager[None]:
        return _PostgresBlock(self, execution_id, wait)

    @asynccontextmanager
    async def _exclusive(self, execution_id: str, wait: float | None) -> AsyncIterator[None]:
        unit = _held(self._owner)
        if unit is not None:
            # Nested (a child created inside its parent's step): one more advisory lock
            # in the same transaction, and a savepoint so a raising block undoes itself.
            async with self._nested(unit, execution_id, wait):
                yield
            return
        if self._joined is not None:
            session = await self._caller_session()
            await self._acquire(session, execution_id, wait, savepoint=wait is not None)
            async with _holding(self._owner, session, 0):
                yield
            return
        kept = await self._kept.take()
        session = kept.session
        try:
            await self._acquire(session, execution_id, wait, savepoint=False)
            async with _holding(self._owner, session, 0):
                yield
            await session.driver.commit()
        except BaseException:
            await self._kept.give_back(kept, committed=False)
            raise
        await self._kept.give_back(kept, committed=True)

    @asynccontextmanager
    async def _nested(
        self, unit: _Held, execution_id: str, wait: float | None
    ) -> AsyncIterator[None]:
        assert isinstance(unit.session, PostgresSession)
        session = unit.session
        await self._acquire(session, execution_id, wait, savepoint=wait is not None)
        name = f"statifier_unit_{unit.depth + 1}"
        await session.command(f"SAVEPOINT {name}")
        try:
            async with _holding(self._owner, session, unit.depth + 1):
                yield
        except BaseException:
            await session.command(f"ROLLBACK TO SAVEPOINT {name}")
            raise
        await session.command(f"RELEASE SAVEPOINT {name}")

    async def _acquire(
        self, session: PostgresSession, execution_id: str, wait: float | None, savepoint: bool
    ) -> None:
        statements = self._statements()
        started = time.monotonic()
        values = {"execution_id": execution_id}
        if wait is None:
            await session.run(statements.lock, values)
            return
        # A caller's transaction must outlive a timeout, so the attempt runs in a
        # savepoint there; in a transaction of our own the rollback takes care of it.
        if savepoint:
            await session.command("SAVEPOINT statifier_lock")
        try:
            (previous, _set), *_ = await session.rows(
                statements.set_timeout, {"timeout": lock_timeout_ms(wait)}
            )
            await session.run(statements.lock, values)
            await session.rows(statements.restore_timeout, {"timeout": previous})
        except Exception as error:
            if not _lock_not_available(error):
                raise
            if savepoint:
                await session.command("ROLLBACK TO SAVEPOINT statifier_lock")
            raise LockTimeout(execution_id, time.monotonic() - started) from None
        if savepoint:
            await session.command("RELEASE SAVEPOINT statifier_lock")

    async def close(self) -> None:
        self._joined_session = None
        await self._kept.close()


class _PostgresBlock:
    """One ``exclusive`` block on PostgreSQL. The usual case, a block in a transaction
    of the runner's own, is written out here (a kept connection, the advisory lock,
    the unit held by the task, the commit): a class, for the step's hot path. Nested
    blocks and blocks in a caller's transaction go through the generator-based
    ``PostgresRunner._exclusive``."""

    __slots__ = ("_execution_id", "_kept", "_other", "_runner", "_token", "_wait")

    def __init__(self, runner: PostgresRunner, execution_id: str, wait: float | None) -> None:
        self._runner = runner
        self._execution_id = execution_id
        self._wait = wait
        self._kept: _Kept | None = None
        self._token: contextvars.Token[tuple[_Held, ...]] | None = None
        self._other: AbstractAsyncContextManager[None] | None = None

    async def __aenter__(self) -> None:
        runner = self._runner
        if runner._joined is not None or _held(runner._owner) is not None:
            other = runner._exclusive(self._execution_id, self._wait)
            await other.__aenter__()
            self._other = other
            return
        kept = await runner._kept.take()
        session = kept.session
        try:
            await runner._acquire(session, self._execution_id, self._wait, savepoint=False)
        except BaseException:
            await runner._kept.give_back(kept, committed=False)
            raise
        self._kept = kept
        unit = _Held(runner._owner, asyncio.current_task(), session, 0)
        self._token = _HELD.set((*_HELD.get(), unit))

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        if self._other is not None:
            return await self._other.__aexit__(kind, error, traceback)
        kept, token = self._kept, self._token
        assert kept is not None
        assert token is not None
        _HELD.reset(token)
        kept_connections = self._runner._kept
        if error is not None:
            await kept_connections.give_back(kept, committed=False)
            return None
        try:
            await kept.session.driver.commit()
        except BaseException:
            await kept_connections.give_back(kept, committed=False)
            raise
        await kept_connections.give_back(kept, committed=True)
        return None


# --- SQLite -----------------------------------------------------------------------------


def _busy(error: sqlite3.OperationalError) -> bool:
    code = getattr(error, "sqlite_errorcode", None)
    if code is None:  # pragma: no cover - Python builds without the attribute
        return "locked" in str(error) or "busy" in str(error)
    return int(code) & 0xFF == _SQLITE_BUSY


async def _retry_busy(
    attempt: Callable[[], None], deadline: float | None, on_timeout: Callable[[], Exception]
) -> None:
    """Run ``attempt`` until SQLite stops answering busy, sleeping (never blocking the
    loop) between tries; past ``deadline`` raise ``on_timeout()``."""
    backoff = _FIRST_BACKOFF
    while True:
        try:
            attempt()
            return
        except sqlite3.OperationalError as error:
            if not _busy(error):
                raise
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            raise on_timeout()
        pause = backoff if deadline is None else min(backoff, deadline - now)
        await asyncio.sleep(pause)
        backoff = min(backoff * 2, _LAST_BACKOFF)


def configure_sqlite(driver: sqlite3.Connection) -> None:
    """What the runner needs of a ``sqlite3`` connection: transactions under its own
    control (``isolation_level`` ``None``) and no busy wait (``busy_timeout`` 0), so a
    locked database answers at once and the loop never blocks on it."""
    driver.isolation_level = None
    driver.execute("PRAGMA busy_timeout = 0")


class SqliteWriter:
    """The single writer of one SQLite adapter within the process, shared with its
    joined views: the lock every unit takes, and the task holding it in a block, with
    the block's session and how deeply blocks are nested in it.

    One task at a time holds the lock, so the holder can live here rather than in a
    context variable: every call checks it, and a comparison of tasks is cheaper.
    """

    __slots__ = ("depth", "lock", "session", "task")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.task: asyncio.Task[Any] | None = None
        self.session: SqliteSession | None = None
        self.depth = 0

    def held(self) -> SqliteSession | None:
        """The block's session if the current task is inside a block, else ``None``."""
        task = self.task
        if task is not None and task is asyncio.current_task():
            return self.session
        return None


class SqliteRunner:
    """Units of work on one ``sqlite3`` connection, serialized by an asyncio lock.

    SQLite admits one writer at a time, so one connection per adapter carries every
    unit of the process; ``BEGIN IMMEDIATE`` (retried without blocking) keeps other
    processes out while a unit writes.
    """

    def __init__(
        self,
        engine: sa.Engine,
        writer: SqliteWriter,
        claim_sql: str,
        joined: sa.Connection | None = None,
    ) -> None:
        self.engine = engine
        self._claim_sql = claim_sql
        self.dialect = engine.dialect
        self._writer = writer
        self._lock = writer.lock
        self._joined = joined
        self._pooled: Any = None
        self._restore: tuple[Any, int] | None = None
        self._session: SqliteSession | None = None

    def holding(self) -> bool:
        return self._joined is not None or self._writer.held() is not None

    def inline(self) -> SqliteSession | None:
        # As run() decides: the held unit's session, else the caller's transaction.
        session = self._writer.held()
        if session is not None:
            return session
        return self._own_session() if self._joined is not None else None

    def _own_session(self) -> SqliteSession:
        if self._session is None:
            if self._joined is not None:
                driver = self._joined.connection.driver_connection
                assert isinstance(driver, sqlite3.Connection)
                # A caller's connection must not busy-wait on the loop either.
                driver.execute("PRAGMA busy_timeout = 0")
            else:
                self._pooled = self.engine.raw_connection()
                driver = self._pooled.driver_connection
                assert isinstance(driver, sqlite3.Connection)
                (timeout,) = driver.execute("PRAGMA busy_timeout").fetchone()
                self._restore = (driver.isolation_level, int(timeout))
                configure_sqlite(driver)
            self._session = SqliteSession(driver)
        return self._session

    async def run(self, operation: Callable[..., Awaitable[T]], write: bool, *args: Any) -> T:
        held = self._writer.held()
        if held is not None:
            return await operation(held, *args)
        session = self._own_session()
        if self._joined is not None:
            return await operation(session, *args)
        async with self._lock:
            if not write:
                return await self._read(operation, session, args)
            await self._begin(session, None, "")
            try:
                result = await operation(session, *args)
            except BaseException:
                session.driver.rollback()
                raise
            await self._commit(session)
            return result

    async def _read(
        self, operation: Callable[..., Awaitable[T]], session: SqliteSession, args: Sequence[Any]
    ) -> T:
        backoff = _FIRST_BACKOFF
        while True:
            try:
                return await operation(session, *args)
            except sqlite3.OperationalError as error:
                # Only while another process commits in rollback-journal mode.
                if not _busy(error):
                    raise
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _LAST_BACKOFF)

    async def _begin(self, session: SqliteSession, deadline: float | None, id_: str) -> None:
        started = time.monotonic()
        await _retry_busy(
            lambda: session.command("BEGIN IMMEDIATE"),
            deadline,
            lambda: LockTimeout(id_, time.monotonic() - started),
        )

    async def _commit(self, session: SqliteSession) -> None:
        await _retry_busy(lambda: session.command("COMMIT"), None, lambda: AssertionError())

    def exclusive(self, execution_id: str, wait: float | None) -> AbstractAsyncContextManager[None]:
        return _SqliteBlock(self, execution_id, wait)

    async def _take_writer(
        self, session: SqliteSession, deadline: float | None, execution_id: str
    ) -> None:
        """Make the caller's transaction the single writer until the caller commits:
        ``BEGIN IMMEDIATE`` if none is open, else a write that touches no row."""
        started = time.monotonic()
        driver = session.driver

        def attempt() -> None:
            if driver.in_transaction:
                session.command(self._claim_sql)
            else:
                session.command("BEGIN IMMEDIATE")

        await _retry_busy(
            attempt, deadline, lambda: LockTimeout(execution_id, time.monotonic() - started)
        )

    async def close(self) -> None:
        session, self._session = self._session, None
        pooled, self._pooled = self._pooled, None
        if pooled is None or session is None:
            return
        if self._restore is not None:
            # The connection goes back to a pool that may not be ours.
            isolation_level, timeout = self._restore
            session.driver.isolation_level = isolation_level
            session.command(f"PRAGMA busy_timeout = {timeout:d}")
        pooled.close()


class _SqliteBlock:
    """One ``exclusive`` block on SQLite: the single writer (the in-process lock, then
    ``BEGIN IMMEDIATE``) and its unit, or a savepoint when the task already holds one.

    Written out as a class rather than a generator-based context manager: this is the
    durable step's hot path, and each generator layer costs a few microseconds.
    """

    __slots__ = ("_execution_id", "_runner", "_savepoint", "_wait")

    def __init__(self, runner: SqliteRunner, execution_id: str, wait: float | None) -> None:
        self._runner = runner
        self._execution_id = execution_id
        self._wait = wait
        self._savepoint: str | None = None

    async def __aenter__(self) -> None:
        runner = self._runner
        writer = runner._writer
        session = writer.held()
        if session is not None:
            # Nested: this task already holds the single writer; a savepoint lets a
            # raising block undo itself.
            writer.depth += 1
            name = f"statifier_unit_{writer.depth}"
            try:
                session.command(f"SAVEPOINT {name}")
            except BaseException:
                writer.depth -= 1
                raise
            self._savepoint = name
            return
        execution_id = self._execution_id
        wait = self._wait
        lock = writer.lock
        started = 0.0 if wait is None else time.monotonic()
        if wait is None:
            await lock.acquire()
        else:
            try:
                async with asyncio.timeout(wait):
                    await lock.acquire()
            except TimeoutError:
                raise LockTimeout(execution_id, time.monotonic() - started) from None
        try:
            session = runner._own_session()
            deadline = None if wait is None else started + wait
            if runner._joined is not None:
                await runner._take_writer(session, deadline, execution_id)
            else:
                try:  # the usual case: the writer is free
                    session.command("BEGIN IMMEDIATE")
                except sqlite3.OperationalError as error:
                    if not _busy(error):
                        raise
                    await runner._begin(session, deadline, execution_id)
        except BaseException:
            lock.release()
            raise
        writer.task = asyncio.current_task()
        writer.session = session
        writer.depth = 0

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        runner = self._runner
        writer = runner._writer
        session = writer.session
        assert session is not None
        name = self._savepoint
        if name is not None:
            writer.depth -= 1
            if error is not None:
                session.command(f"ROLLBACK TO SAVEPOINT {name}")
            session.command(f"RELEASE SAVEPOINT {name}")
            return
        writer.task = writer.session = None
        try:
            if runner._joined is not None:
                return
            if error is not None:
                session.driver.rollback()
                return
            try:  # the usual case: nothing in the way of the commit
                session.command("COMMIT")
            except sqlite3.OperationalError as failed:
                if not _busy(failed):
                    raise
                await runner._commit(session)
        finally:
            writer.lock.release()
