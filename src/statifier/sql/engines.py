"""Database URLs, engines and SQLite's settings, as every SQL module here opens them:
durable executions (:mod:`statifier.persistence.sql`), the migrations, and scriba.

PostgreSQL goes through psycopg 3 (``postgresql+psycopg``), whichever spelling the URL
uses; SQLite through the standard library's ``sqlite3``.

SQLite is opened so that it never blocks the event loop: its own busy wait is switched
off (``busy_timeout`` 0), and a caller that finds the database locked by another
connection waits with :func:`retry_busy`, sleeping on the loop between attempts. The
alternative, SQLite's busy timeout (the ``sqlite3`` default is 5 seconds), sleeps inside
the C call: every other task of the process, the one that holds the lock included if
it is awaiting something, stands still until the timeout runs out. So the timeout a
connection was opened with (``connect_args={"timeout": ...}``) becomes the bound of the
asynchronous wait (:func:`busy_wait`), not a sleep on the loop.

Every engine is made by :func:`new_engine` or :func:`new_async_engine`, which keep a
failed statement's parameters out of its error's text (SQLAlchemy's
``hide_parameters``): that text reaches logs, the console and stored errors
(``last_error``), and the parameters are the events' payloads, tokens included. The
statement itself stays, and the database's own words (decision 0133).

>>> database_url("postgresql://postgres@localhost/app").drivername
'postgresql+psycopg'
>>> database_url("sqlite:///state.db").drivername
'sqlite'
>>> database_url("mysql://localhost/app")
Traceback (most recent call last):
...
ValueError: PostgreSQL (psycopg 3) and SQLite (sqlite3) are supported, not 'mysql'
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, Final, TypeVar
from urllib.parse import quote

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from statifier.sql.dialect import Dialect
from statifier.sql.postgres import POSTGRES
from statifier.sql.sqlite import SQLITE

__all__ = [
    "BUSY_WAIT",
    "TablesMissing",
    "busy_wait",
    "configure_sqlite",
    "database_url",
    "dialect_of",
    "dispose",
    "is_busy",
    "lasts_one_connection",
    "missing_table",
    "new_async_engine",
    "new_engine",
    "open_engine",
    "retry_busy",
    "run_on",
    "set_busy_timeout",
    "sqlite_engine",
    "sync_engine",
    "tables_missing",
    "url_dialect",
]

_T = TypeVar("_T")

_DRIVERS: Final = {
    "postgresql": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",
    "postgresql+psycopg": "postgresql+psycopg",
    "sqlite": "sqlite",
    "sqlite+pysqlite": "sqlite",
}

BUSY_WAIT: Final = "statifier.busy_wait"
"""The key, in a pooled SQLite connection's ``info``, of the seconds a caller may wait
for the database's lock (the ``timeout`` the connection was opened with)."""

# SQLite returns SQLITE_BUSY (5, and extended codes whose low byte is 5) at once when
# busy_timeout is 0. The first retry comes soon (a commit takes about 0.1 ms in WAL),
# later ones less often.
_SQLITE_BUSY: Final = 5
_SQLITE_BUSY_SNAPSHOT: Final = 517  # SQLITE_BUSY | (2 << 8)
_FIRST_BACKOFF: Final = 0.0005
_LAST_BACKOFF: Final = 0.005


class TablesMissing(RuntimeError):  # noqa: N818 - names the finding
    """The database lacks a table statifier needs: it was never migrated, or not up to
    the revision that builds that table.

    Attributes:
        table: the missing table, as the database named it (``statifier_charts``).
    """

    def __init__(self, table: str) -> None:
        super().__init__(
            f"the database has no table {table}: run `statifier db upgrade` "
            "(or statifier.sql.migrations.upgrade) on it first"
        )
        self.table = table


_UNDEFINED_TABLE: Final = "42P01"
_NO_SUCH_TABLE: Final = re.compile(r"no such table: (\S+)")
_NO_RELATION: Final = re.compile(r'relation "([^"]+)" does not exist')


def missing_table(error: BaseException) -> str | None:
    """The table ``error`` says does not exist (SQLite's ``no such table``, PostgreSQL's
    ``UndefinedTable``, raw or wrapped by SQLAlchemy), else ``None``."""
    cause = getattr(error, "orig", None)
    if isinstance(error, sa.exc.DBAPIError) and isinstance(cause, BaseException):
        error = cause
    if isinstance(error, sqlite3.OperationalError):
        found = _NO_SUCH_TABLE.search(str(error))
        return None if found is None else found.group(1)
    if getattr(error, "sqlstate", None) == _UNDEFINED_TABLE:
        relation = _NO_RELATION.search(str(error))
        return relation.group(1) if relation is not None else "(unnamed)"
    return None


def tables_missing(error: BaseException | None, names: Collection[str]) -> TablesMissing | None:
    """The :class:`TablesMissing` to raise for ``error`` when it says one of ``names``
    (table names, with or without a schema) does not exist, else ``None``: an error
    about a table of the caller's own stays as it is."""
    if error is None:
        return None
    table = missing_table(error)
    if table is None:
        return None
    bare = {name.rpartition(".")[2] for name in names}
    return TablesMissing(table) if table.rpartition(".")[2] in bare else None


def database_url(url: str | sa.URL) -> sa.URL:
    """Parse ``url`` and name the driver: psycopg 3 for PostgreSQL (it serves synchronous
    and asyncio engines alike), ``sqlite3`` for SQLite.

    Raises:
        ValueError: the URL is not a PostgreSQL or SQLite one, or names another driver
            (``sqlite+aiosqlite``, ``postgresql+asyncpg``...).
        sqlalchemy.exc.ArgumentError: the URL cannot be parsed.
    """
    parsed = sa.make_url(url)
    driver = _DRIVERS.get(parsed.drivername)
    if driver is None:
        raise ValueError(
            f"PostgreSQL (psycopg 3) and SQLite (sqlite3) are supported, not {parsed.drivername!r}"
        )
    return parsed.set(drivername=driver)


def configure_sqlite(connection: sqlite3.Connection) -> float:
    """Put a ``sqlite3`` connection under the caller's transaction control
    (``isolation_level`` ``None``: nothing begins or commits behind its back) and switch
    SQLite's busy wait off. Returns the busy timeout it had, in seconds: the bound the
    caller's own asynchronous wait keeps."""
    (timeout_ms,) = connection.execute("PRAGMA busy_timeout").fetchone()
    connection.isolation_level = None
    set_busy_timeout(connection, 0)
    return int(timeout_ms) / 1000


def set_busy_timeout(connection: sqlite3.Connection, seconds: float) -> None:
    """Set how long SQLite itself waits, blocking, for another connection's lock on
    ``connection`` (to the millisecond); 0: it returns busy at once."""
    connection.execute(f"PRAGMA busy_timeout = {round(seconds * 1000):d}")


def new_engine(url: str | sa.URL, **options: Any) -> sa.Engine:
    """:func:`sqlalchemy.create_engine` of ``url`` with ``options``, its errors without
    their statements' parameters (see the module docstring).

    >>> engine = new_engine("sqlite://")
    >>> with engine.connect() as connection:
    ...     connection.execute(sa.text("INSERT INTO nowhere VALUES (:token)"), {"token": "s3cret"})
    Traceback (most recent call last):
    ...
    sqlalchemy.exc.OperationalError: (sqlite3.OperationalError) no such table: nowhere
    [SQL: INSERT INTO nowhere VALUES (?)]
    [SQL parameters hidden due to hide_parameters=True]
    ...
    >>> engine.dispose()
    """
    return sa.create_engine(url, hide_parameters=True, **options)


def new_async_engine(url: str | sa.URL, **options: Any) -> AsyncEngine:
    """:func:`~sqlalchemy.ext.asyncio.create_async_engine` of ``url`` with ``options``,
    its errors without their statements' parameters (as :func:`new_engine`)."""
    return create_async_engine(url, hide_parameters=True, **options)


def sqlite_engine(url: str | sa.URL, *, wal: bool = True, **options: Any) -> sa.Engine:
    """A synchronous engine on ``sqlite3`` whose connections never busy-wait on the loop
    and use WAL on a file (readers never wait for the writer; ``wal=False`` leaves the
    journal as it is, for a connection that may not write).

    Each connection is configured by :func:`configure_sqlite` once, when it opens, and
    keeps its former busy timeout in ``info[BUSY_WAIT]``. ``Connection.begin()`` on the
    engine emits ``BEGIN`` (unless a transaction is already open on the driver), so a
    transaction begun through SQLAlchemy is a real one. ``options`` go to
    :func:`sqlalchemy.create_engine`.
    """
    parsed = database_url(url)
    if parsed.get_backend_name() != "sqlite":
        raise ValueError(f"not a SQLite URL: {parsed!r}")
    engine = new_engine(parsed, **options)
    in_memory = parsed.database in (None, "", ":memory:")

    @sa.event.listens_for(engine, "connect")
    def _connect(driver: sqlite3.Connection, record: Any) -> None:
        record.info[BUSY_WAIT] = configure_sqlite(driver)
        if wal and not in_memory:
            _switch_to_wal(driver)

    @sa.event.listens_for(engine, "begin")
    def _begin(connection: sa.Connection) -> None:
        driver = connection.connection.driver_connection
        assert isinstance(driver, sqlite3.Connection)
        if not driver.in_transaction:
            driver.execute("BEGIN")

    return engine


WAL_SWITCH_WAIT_MS: Final = 5_000


def _switch_to_wal(driver: sqlite3.Connection) -> None:
    """Put a file database in WAL mode. The first switch needs the database to itself
    for a moment, so a connection opening while another process writes to a database
    not yet in WAL waits for it here, at most ``WAL_SWITCH_WAIT_MS``: the one wait that
    blocks, once per connection as it opens, instead of failing the open at once."""
    set_busy_timeout(driver, WAL_SWITCH_WAIT_MS / 1000)
    try:
        driver.execute("PRAGMA journal_mode = WAL")
    finally:
        set_busy_timeout(driver, 0)


def busy_wait(connection: sa.Connection) -> float | None:
    """The seconds a caller may wait for SQLite's lock on ``connection``: what
    :func:`sqlite_engine` kept for it, ``None`` for a connection it did not open."""
    wait = connection.info.get(BUSY_WAIT)
    return None if wait is None else float(wait)


def is_busy(error: BaseException) -> bool:
    """Whether ``error`` is SQLite saying another connection holds the lock, so that
    trying again later can succeed. ``SQLITE_BUSY_SNAPSHOT`` is not: a transaction that
    read before another connection committed can never become the writer, and waiting
    would spin until the deadline (or forever)."""
    if not isinstance(error, sqlite3.OperationalError):
        return False
    code = getattr(error, "sqlite_errorcode", None)
    if code is None:  # pragma: no cover - Python builds without the attribute
        return "locked" in str(error) or "busy" in str(error)
    return int(code) & 0xFF == _SQLITE_BUSY and int(code) != _SQLITE_BUSY_SNAPSHOT


async def retry_busy(
    attempt: Callable[[], _T],
    deadline: float | None,
    on_timeout: Callable[[sqlite3.OperationalError], BaseException] | None = None,
) -> _T:
    """Call ``attempt`` until SQLite stops answering busy, sleeping on the loop (never
    blocking it) between tries, and return what it returns.

    Past ``deadline`` (a :func:`time.monotonic` time; ``None``: no bound) the last busy
    error is raised, or ``on_timeout(error)`` if given. Any other error is raised at once.
    """
    backoff = _FIRST_BACKOFF
    while True:
        try:
            return attempt()
        except sqlite3.OperationalError as error:
            if not is_busy(error):
                raise
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                if on_timeout is None:
                    raise
                raise on_timeout(error) from None
        pause = backoff if deadline is None else min(backoff, deadline - now)
        await asyncio.sleep(pause)
        backoff = min(backoff * 2, _LAST_BACKOFF)


def open_engine(url: str | sa.URL, *, pool_size: int = 5) -> sa.Engine | AsyncEngine:
    """An engine of the database ``url`` names: an async engine of at most
    ``pool_size`` pooled connections on PostgreSQL (psycopg 3), a synchronous one on
    SQLite (:func:`sqlite_engine`). The caller disposes it (:func:`dispose`).

    Raises:
        ValueError: a database other than PostgreSQL or SQLite.
    """
    parsed = database_url(url)
    if parsed.get_backend_name() == "sqlite":
        return sqlite_engine(parsed)
    return new_async_engine(parsed, pool_size=pool_size)


def sync_engine(url: str | sa.URL) -> sa.Engine:
    """A synchronous engine of the database ``url`` names: :func:`sqlite_engine` on
    SQLite (so that a transaction begun through SQLAlchemy is a real one), psycopg 3 on
    PostgreSQL. The caller disposes it.

    Raises:
        ValueError: a database other than PostgreSQL or SQLite.
        MissingExtra: PostgreSQL without psycopg (the postgres extra).
    """
    from statifier.extras import MissingExtra

    parsed = database_url(url)
    if parsed.get_backend_name() == "sqlite":
        return sqlite_engine(parsed)
    try:
        return new_engine(parsed)
    except ModuleNotFoundError as missing:
        raise MissingExtra.of(missing) from missing


def read_only_engine(url: str | sa.URL, *, pool_size: int = 2) -> sa.Engine | AsyncEngine:
    """An engine of the database ``url`` names whose connections the database itself
    keeps from writing: a SQLite file opened with ``mode=ro`` (one connection, its
    journal left as it is: the switch to WAL would be a write), PostgreSQL sessions
    with ``default_transaction_read_only`` on (at most ``pool_size`` of them). The
    caller disposes it (:func:`dispose`).

    Raises:
        ValueError: a database other than PostgreSQL or SQLite, or SQLite in memory
            (nothing recorded there outlives its connection, so nothing is there to
            read).
    """
    parsed = database_url(url)
    if parsed.get_backend_name() != "sqlite":
        read_only = {"options": "-c default_transaction_read_only=on"}
        return new_async_engine(parsed, pool_size=pool_size, connect_args=read_only)
    path = parsed.database
    if path in (None, "", ":memory:") or path.startswith("file:"):
        raise ValueError(f"a read-only engine reads a SQLite file, not {parsed!r}")
    located = f"file:{quote(str(Path(path).absolute()))}?mode=ro"

    def connect() -> sqlite3.Connection:
        return sqlite3.connect(located, uri=True, check_same_thread=False)

    return sqlite_engine(parsed, wal=False, creator=connect, poolclass=sa.pool.StaticPool)


def url_dialect(url: str | sa.URL) -> Dialect:
    """The dialect of the database ``url`` names.

    Raises:
        ValueError: a database other than PostgreSQL or SQLite (:func:`database_url`).
    """
    return SQLITE if database_url(url).get_backend_name() == "sqlite" else POSTGRES


def lasts_one_connection(url: str | sa.URL) -> bool:
    """Whether ``url`` names a database that lives only as long as its connection
    (SQLite in memory): nothing written there outlives the process's connection.

    Raises:
        ValueError: a database other than PostgreSQL or SQLite (:func:`database_url`).
    """
    parsed = database_url(url)
    return parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:")


def dialect_of(engine: sa.Engine | AsyncEngine) -> Dialect:
    """The dialect of ``engine``'s database: an async engine is PostgreSQL's (psycopg),
    a synchronous one SQLite's.

    Raises:
        ValueError: an async engine on another database than PostgreSQL, or a
            synchronous one on another than SQLite.
    """
    if isinstance(engine, AsyncEngine):
        if engine.dialect.name != POSTGRES.name:
            raise ValueError("an AsyncEngine is for PostgreSQL; give SQLite a sync Engine")
        return POSTGRES
    if engine.dialect.name != SQLITE.name:
        raise ValueError("a sync Engine is for SQLite; give PostgreSQL an AsyncEngine")
    return SQLITE


async def dispose(engine: sa.Engine | AsyncEngine) -> None:
    """Close every pooled connection of ``engine``."""
    if isinstance(engine, AsyncEngine):
        await engine.dispose()
    else:
        engine.dispose()


async def run_on(
    engine: sa.Engine | AsyncEngine, work: Callable[[sa.Connection], _T], *, write: bool = False
) -> _T:
    """Run ``work`` on a connection of ``engine`` in one transaction, rolled back after
    a read and committed after a ``write``; return what it returns.

    On an async engine ``work`` runs in the driver's greenlet
    (:meth:`~sqlalchemy.ext.asyncio.AsyncConnection.run_sync`); on a synchronous
    SQLite engine it runs inline, and is tried again, waiting on the loop, while
    another connection holds the database's lock (bounded by the connection's
    timeout: :func:`~statifier.sql.engines.retry_busy`).

    Raises:
        sqlite3.OperationalError: SQLite stayed locked past the connection's timeout.
        sqlalchemy.exc.DBAPIError: any other failure of the database.
    """
    if isinstance(engine, AsyncEngine):
        async with engine.connect() as connection:
            answer = await connection.run_sync(work)
            if write:
                await connection.commit()
            return answer
    with engine.connect() as sync:
        wait = busy_wait(sync)

        def attempt() -> _T:
            try:
                answer = work(sync)
                if write:
                    sync.commit()
                return answer
            except sa.exc.DBAPIError as error:
                # retry_busy knows the driver's error; SQLAlchemy wraps it.
                cause = error.orig
                if cause is not None and is_busy(cause):
                    raise cause from None
                raise
            finally:
                sync.rollback()

        deadline = None if wait is None else time.monotonic() + wait
        return await retry_busy(attempt, deadline)
