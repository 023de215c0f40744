"""The SQL target: read models, cursors and dead letters committed in one transaction.

:class:`SqlTarget` implements :class:`scriba.target.Target` on PostgreSQL and SQLite.

- PostgreSQL runs on an asyncio engine over psycopg 3 (``postgresql+psycopg``).
- SQLite runs on a plain (synchronous) engine over the standard ``sqlite3`` module,
  and its calls run inline on the event loop: a statement takes microseconds, far less
  than handing it to a thread would cost. A whole batch runs without yielding to the
  loop, so nothing else in the process can interleave with its transaction. On an
  engine made from a URL (:func:`statifier.sql.engines.sqlite_engine`, which durable
  executions use too) each transaction begins with ``BEGIN IMMEDIATE``, and a lock
  held by another connection is waited for without blocking the loop, up to the
  connection's ``timeout`` (5 seconds by default); then the batch fails as
  ``TRANSIENT``. An engine you pass is used as you configured it.

Each batch is one transaction: first the fence (below), then the handlers' operations
in order, then one cursor upsert per stream that keeps the greater position
(``GREATEST`` on PostgreSQL, ``MAX`` on SQLite), then the dead letters. If anything
fails, all of it rolls back and :class:`~scriba.target.ApplyFailed` says which kind of
failure it was (:func:`scriba.sql.failures.classify`).

Fencing. :meth:`SqlTarget.claim` raises the projection's ``generation`` in the
projections table and returns it; a batch given that ``fence`` begins with
``UPDATE projections SET generation = generation WHERE ... AND generation = :fence``.
No row updated means another reader has claimed the projection since: the transaction
rolls back and the batch fails ``FENCED``. The update takes the row's lock (on SQLite
the database's), so a claim waits for a batch of the older generation in flight and
every batch after the claim sees the new generation: a deposed reader's commit
applies nothing. A watermark is fenced the same way, and ``reset`` raises the
generation in the transaction that clears the cursors.

The tables must exist (:func:`scriba.sql.upgrade`); the target never changes a schema.

>>> import asyncio, datetime
>>> import sqlalchemy as sa
>>> from scriba import Event, Insert, ProjectionKey
>>> from scriba.sql import upgrade
>>> engine = sa.create_engine("sqlite://")
>>> upgrade(engine)
>>> orders = sa.Table("orders", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True))
>>> orders.create(engine)
>>> async def demo():
...     target = SqlTarget(engine)
...     shop = ProjectionKey("shop")
...     await target.open(shop)
...     at = datetime.datetime(2024, 5, 1, tzinfo=datetime.UTC)
...     placed = Event("e1", "order-1", "OrderPlaced", {"id": 1}, 1, at)
...     await target.apply_batch(shop, [(placed, Insert(orders, {"id": 1}))], {"order-1": 1}, [])
...     return await target.stream_position(shop, "order-1")
>>> asyncio.run(demo())
1
>>> engine.dispose()
"""

from __future__ import annotations

import itertools
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine

from scriba.event import Event, ProjectionKey
from scriba.operations import Delete, Execute, Insert, Multi, Operation, Update
from scriba.sql.dead_letter_rows import dead_letter_row, stored_dead_letter
from scriba.sql.failures import classify
from scriba.sql.tables import DEFAULT_PREFIX, NAME_LENGTH, Tables, define_tables
from scriba.target import (
    ApplyFailed,
    DeadLetter,
    DeadLetterStats,
    FailureKind,
    ResetCounts,
    StoredDeadLetter,
    Watermark,
)
from statifier.sql.engines import (
    busy_wait,
    database_url,
    new_async_engine,
    retry_busy,
    sqlite_engine,
)
from statifier.sql.sqlite import BEGIN_WRITE

__all__ = ["SchemaNotReadyError", "SqlTarget"]

T = TypeVar("T")
Work = Callable[[sa.Connection], T]

_MAX_MESSAGE: Final = 2_000


class SchemaNotReadyError(RuntimeError):
    """scriba's tables are missing or unreadable: run :func:`scriba.sql.upgrade` (with
    the same prefix and schema) before starting a projection.

    Attributes:
        cause: the database error that showed it.
    """

    def __init__(self, message: str, cause: BaseException):
        super().__init__(message)
        self.cause = cause


class SqlTarget:
    """A :class:`~scriba.target.Target` on PostgreSQL or SQLite.

    Args:
        database: a URL (``postgresql://...``, ``postgresql+psycopg://...``,
            ``sqlite:///path``), an :class:`~sqlalchemy.ext.asyncio.AsyncEngine` for
            PostgreSQL, or a synchronous :class:`~sqlalchemy.Engine` for SQLite. An
            engine given is the caller's: :meth:`close` leaves it open.
        prefix: the prefix of scriba's tables (as given to :func:`scriba.sql.upgrade`).
        schema: the schema of scriba's tables, ``None`` for the default one.
        clock: gives the current time (timezone-aware) for ``updated_at`` columns and
            dead letters.
        engine_options: passed to SQLAlchemy when the target makes its engine from a URL
            (``pool_size``, ``connect_args``...).

    Raises:
        ValueError: the URL is not a PostgreSQL or SQLite one, or the prefix or schema
            is not a plain identifier.
        TypeError: a synchronous engine for a database other than SQLite (it would
            block the event loop on the network).
    """

    def __init__(
        self,
        database: str | sa.URL | sa.Engine | AsyncEngine,
        *,
        prefix: str = DEFAULT_PREFIX,
        schema: str | None = None,
        clock: Callable[[], datetime] | None = None,
        engine_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.tables: Tables = define_tables(prefix, schema)
        self._clock = clock or _utc_now
        self._runner = _runner_for(database, dict(engine_options or {}))
        self._upsert = _cursor_upsert(self.tables.positions, self._runner.dialect)
        self._watermark_upsert = _watermark_upsert(self.tables.watermarks, self._runner.dialect)
        self._claim = _claim_upsert(self.tables.projections, self._runner.dialect)

    @property
    def dialect(self) -> str:
        """``"postgresql"`` or ``"sqlite"``."""
        return self._runner.dialect

    async def open(self, projection: ProjectionKey) -> None:
        """Check that scriba's tables answer; change nothing.

        Raises:
            ValueError: the projection name is longer than 255 characters.
            SchemaNotReadyError: a table is missing or unreadable.
            sqlalchemy.exc.DBAPIError: the database does not answer.
        """
        if len(projection.name) > NAME_LENGTH:
            raise ValueError(f"a projection name is at most {NAME_LENGTH} characters long")
        tables = (
            self.tables.positions,
            self.tables.watermarks,
            self.tables.dead_letters,
            self.tables.projections,
        )

        def probe(connection: sa.Connection) -> None:
            for table in tables:
                connection.execute(sa.select(sa.literal(1)).select_from(table).limit(0))

        try:
            await self._runner.run(probe)
        except sa.exc.DBAPIError as error:
            if classify(error) is not FailureKind.STRUCTURAL:
                raise
            raise SchemaNotReadyError(
                f"scriba's tables (prefix {self.tables.prefix!r}, schema "
                f"{self.tables.schema!r}) are not ready; run scriba.sql.upgrade: "
                f"{_describe(error)}",
                error,
            ) from error

    def accepts(self, operation: Operation) -> bool:
        """Every operation, except an ``Update`` that sets nothing and an ``Update`` or
        ``Delete`` with an empty ``where`` (which would touch every row: write that as
        an ``Execute`` if it is meant); a ``Multi`` if it accepts all it holds."""
        if isinstance(operation, Multi):
            return all(self.accepts(inner) for inner in operation.operations)
        if isinstance(operation, Update):
            return bool(operation.where) and bool(operation.values)
        if isinstance(operation, Delete):
            return bool(operation.where)
        return isinstance(operation, Insert | Execute)

    async def load_positions(self, projection: ProjectionKey, limit: int) -> dict[str, int]:
        """Up to ``limit`` cursors of ``projection``, the most advanced first."""
        positions = self.tables.positions
        query = (
            sa.select(positions.c.stream_id, positions.c.position)
            .where(*_projection_filter(positions, projection))
            .order_by(positions.c.position.desc())
            .limit(_non_negative(limit))
        )

        def read(connection: sa.Connection) -> dict[str, int]:
            return {row.stream_id: row.position for row in connection.execute(query)}

        return await self._runner.run(read)

    async def stream_position(self, projection: ProjectionKey, stream_id: str) -> int | None:
        """The committed cursor of ``stream_id``, or ``None``."""
        positions = self.tables.positions
        query = sa.select(positions.c.position).where(
            *_projection_filter(positions, projection), positions.c.stream_id == stream_id
        )

        def read(connection: sa.Connection) -> int | None:
            position: int | None = connection.execute(query).scalar_one_or_none()
            return position

        return await self._runner.run(read)

    async def claim(self, projection: ProjectionKey) -> int:
        """Raise the projection's generation by one (from 0: the first claim is 1) and
        return it; batches and watermarks fenced by an older one fail from now on."""
        statement = self._claim

        def claim(connection: sa.Connection) -> int:
            row = {
                "projection_name": projection.name,
                "projection_version": projection.version,
                "generation": 1,
                "claimed_at": self._clock(),
            }
            return int(connection.execute(statement, row).scalar_one())

        return await self._runner.run(claim)

    async def generation(self, projection: ProjectionKey) -> int:
        """The projection's current generation (0 before the first claim)."""
        table = self.tables.projections
        query = sa.select(table.c.generation).where(*_projection_filter(table, projection))

        def read(connection: sa.Connection) -> int:
            return int(connection.execute(query).scalar_one_or_none() or 0)

        return await self._runner.run(read)

    async def apply_batch(
        self,
        projection: ProjectionKey,
        applied: Sequence[tuple[Event, Operation]],
        advances: Mapping[str, int],
        dead_letters: Sequence[DeadLetter],
        *,
        fence: int | None = None,
    ) -> None:
        """Commit the batch in one transaction (see the module's description), if
        ``fence`` (when given) is still the projection's generation.

        Consecutive inserts into one table with the same columns go to the database
        as one ``executemany``; everything else runs one statement per operation, in
        order.

        Raises:
            ApplyFailed: nothing was committed; ``kind`` comes from
                :func:`scriba.sql.failures.classify` (``FENCED`` when the fence
                failed), ``cause`` is the error.
        """
        if not (applied or advances or dead_letters):
            return
        now = self._clock()
        cursor_rows = [
            {
                "projection_name": projection.name,
                "projection_version": projection.version,
                "stream_id": stream_id,
                "position": position,
                "updated_at": now,
            }
            # A fixed order takes row locks in the same order in every transaction.
            for stream_id, position in sorted(advances.items())
        ]
        letter_rows = [dead_letter_row(projection, letter, now) for letter in dead_letters]
        operations = [operation for _, op in applied for operation in _flatten(op)]
        upsert, dead_letter_insert = self._upsert, self.tables.dead_letters.insert()

        check_fence = self._fence_check(projection, fence)

        def commit(connection: sa.Connection) -> None:
            check_fence(connection)
            for statement, parameters in _statements(operations):
                connection.execute(statement, parameters)
            if cursor_rows:
                connection.execute(upsert, cursor_rows)
            if letter_rows:
                connection.execute(dead_letter_insert, letter_rows)

        try:
            await self._runner.run(commit)
        except Exception as error:  # every failure reaches the engine classified
            kind = classify(error)
            raise ApplyFailed(kind, f"{kind.value}: {_describe(error)}", error) from error

    async def save_watermark(
        self,
        projection: ProjectionKey,
        position: int,
        occurred_at: datetime | None,
        *,
        fence: int | None = None,
    ) -> None:
        """Store the watermark; a position below the stored one changes nothing.

        Raises:
            ValueError: ``occurred_at`` is a naive datetime.
            ApplyFailed: of kind ``FENCED``: ``fence`` is no longer the generation.
        """
        if occurred_at is not None and occurred_at.utcoffset() is None:
            raise ValueError(f"a watermark's occurred_at must be timezone-aware: {occurred_at!r}")
        row = {
            "projection_name": projection.name,
            "projection_version": projection.version,
            "position": position,
            "occurred_at": occurred_at,
            "updated_at": self._clock(),
        }
        statement = self._watermark_upsert
        check_fence = self._fence_check(projection, fence)

        def save(connection: sa.Connection) -> None:
            check_fence(connection)
            connection.execute(statement, row)

        await self._runner.run(save)

    async def watermark(self, projection: ProjectionKey) -> Watermark | None:
        """The stored watermark of ``projection``, or ``None``."""
        watermarks = self.tables.watermarks
        query = sa.select(
            watermarks.c.position, watermarks.c.occurred_at, watermarks.c.updated_at
        ).where(*_projection_filter(watermarks, projection))

        def read(connection: sa.Connection) -> Watermark | None:
            row = connection.execute(query).one_or_none()
            return None if row is None else Watermark(row.position, row.occurred_at, row.updated_at)

        return await self._runner.run(read)

    async def dead_letters(self, projection: ProjectionKey, limit: int) -> list[StoredDeadLetter]:
        """The newest ``limit`` dead letters of ``projection``, newest first."""
        table = self.tables.dead_letters
        query = (
            sa.select(table)
            .where(*_projection_filter(table, projection))
            .order_by(table.c.id.desc())
            .limit(_non_negative(limit))
        )

        def read(connection: sa.Connection) -> list[StoredDeadLetter]:
            return [stored_dead_letter(row) for row in connection.execute(query)]

        return await self._runner.run(read)

    async def dead_letter_stats(self, projection: ProjectionKey) -> DeadLetterStats:
        """How many dead letters ``projection`` has, by kind, and their position span."""
        table = self.tables.dead_letters
        query = (
            sa.select(
                table.c.error_kind,
                sa.func.count().label("n"),
                sa.func.min(table.c.position).label("first"),
                sa.func.max(table.c.position).label("last"),
            )
            .where(*_projection_filter(table, projection))
            .group_by(table.c.error_kind)
        )

        def read(connection: sa.Connection) -> DeadLetterStats:
            rows = connection.execute(query).all()
            return DeadLetterStats(
                total=sum(row.n for row in rows),
                by_kind={row.error_kind: row.n for row in rows},
                first_position=min((row.first for row in rows), default=None),
                last_position=max((row.last for row in rows), default=None),
            )

        return await self._runner.run(read)

    async def reset(self, projection: ProjectionKey, *, dead_letters: bool) -> ResetCounts:
        """Delete the projection's cursors and watermark, and its dead letters if asked,
        and raise its generation (so no reader still about commits against the cleared
        cursors), in one transaction; the read model is left alone."""
        tables = self.tables
        claim = self._claim
        claim_row = {
            "projection_name": projection.name,
            "projection_version": projection.version,
            "generation": 1,
            "claimed_at": self._clock(),
        }

        def delete(connection: sa.Connection, table: sa.Table) -> int:
            result = connection.execute(
                sa.delete(table).where(*_projection_filter(table, projection))
            )
            return int(result.rowcount)

        def clear(connection: sa.Connection) -> ResetCounts:
            connection.execute(claim, claim_row)
            return ResetCounts(
                positions=delete(connection, tables.positions),
                watermarks=delete(connection, tables.watermarks),
                dead_letters=delete(connection, tables.dead_letters) if dead_letters else 0,
            )

        return await self._runner.run(clear)

    async def close(self) -> None:
        """Dispose of the engine if the target made it. Idempotent."""
        await self._runner.close()

    def _fence_check(
        self, projection: ProjectionKey, fence: int | None
    ) -> Callable[[sa.Connection], None]:
        """What checks ``fence`` first thing in a transaction (nothing when ``None``)."""
        if fence is None:
            return _unchecked
        table = self.tables.projections
        statement = (
            sa.update(table)
            .where(*_projection_filter(table, projection), table.c.generation == fence)
            # A no-op write, for the row lock: a claim waits for this transaction.
            .values(generation=table.c.generation)
        )

        def check(connection: sa.Connection) -> None:
            if connection.execute(statement).rowcount != 1:
                raise ApplyFailed(
                    FailureKind.FENCED,
                    f"generation {fence} of projection {projection.name!r} "
                    f"v{projection.version} was superseded by another reader's claim",
                )

        return check


class _Runner(Protocol):
    dialect: str

    async def run(self, work: Work[T]) -> T: ...

    async def close(self) -> None: ...


class _InlineRunner:
    """Runs work on a synchronous engine, in the calling coroutine, without awaiting."""

    def __init__(self, engine: sa.Engine, owned: bool):
        self.dialect = engine.dialect.name
        self._engine = engine
        self._owned = owned

    async def run(self, work: Work[T]) -> T:
        with self._engine.connect() as connection:
            wait = busy_wait(connection)
            if wait is not None:
                # An engine of statifier.sql.engines: SQLite's busy wait is off, so the
                # write lock is waited for here, on the loop, never inside a C call.
                driver = connection.connection.driver_connection
                assert isinstance(driver, sqlite3.Connection)
                deadline = time.monotonic() + wait
                await retry_busy(lambda: driver.execute(BEGIN_WRITE), deadline)
            with connection.begin():
                return work(connection)

    async def close(self) -> None:
        if self._owned:
            self._engine.dispose()


class _AsyncRunner:
    """Runs work on an asyncio engine; SQLAlchemy adapts the synchronous work to it."""

    def __init__(self, engine: AsyncEngine, owned: bool):
        self.dialect = engine.dialect.name
        self._engine = engine
        self._owned = owned

    async def run(self, work: Work[T]) -> T:
        async with self._engine.begin() as connection:
            return await connection.run_sync(work)

    async def close(self) -> None:
        if self._owned:
            await self._engine.dispose()


def _runner_for(
    database: str | sa.URL | sa.Engine | AsyncEngine, options: dict[str, Any]
) -> _Runner:
    if isinstance(database, AsyncEngine):
        _supported(database.dialect.name)
        return _AsyncRunner(database, owned=False)
    if isinstance(database, sa.Engine):
        if database.dialect.name != "sqlite":
            raise TypeError(
                "give scriba an AsyncEngine (postgresql+psycopg) for "
                f"{database.dialect.name}: a synchronous one would block the event loop"
            )
        return _InlineRunner(database, owned=False)
    if not isinstance(database, str | sa.URL):
        raise TypeError(f"a SqlTarget needs a URL or an engine, not {database!r}")
    url = database_url(database)
    if url.get_backend_name() == "sqlite":
        return _InlineRunner(sqlite_engine(url, **options), owned=True)
    return _AsyncRunner(new_async_engine(url, **options), owned=True)


def _supported(dialect: str) -> None:
    if dialect not in ("postgresql", "sqlite"):
        raise ValueError(f"scriba works with PostgreSQL and SQLite, not {dialect!r}")


def _cursor_upsert(positions: sa.Table, dialect: str) -> sa.Executable:
    insert = postgresql.insert(positions) if dialect == "postgresql" else sqlite.insert(positions)
    greatest = sa.func.greatest if dialect == "postgresql" else sa.func.max
    return insert.on_conflict_do_update(
        index_elements=["projection_name", "projection_version", "stream_id"],
        set_={
            "position": greatest(positions.c.position, insert.excluded.position),
            "updated_at": insert.excluded.updated_at,
        },
    )


def _unchecked(connection: sa.Connection) -> None:
    del connection


def _claim_upsert(projections: sa.Table, dialect: str) -> sa.Executable:
    insert = (
        postgresql.insert(projections) if dialect == "postgresql" else sqlite.insert(projections)
    )
    return insert.on_conflict_do_update(
        index_elements=["projection_name", "projection_version"],
        set_={
            "generation": projections.c.generation + 1,
            "claimed_at": insert.excluded.claimed_at,
        },
    ).returning(projections.c.generation)


def _watermark_upsert(watermarks: sa.Table, dialect: str) -> sa.Executable:
    insert = postgresql.insert(watermarks) if dialect == "postgresql" else sqlite.insert(watermarks)
    return insert.on_conflict_do_update(
        index_elements=["projection_name", "projection_version"],
        set_={
            "position": insert.excluded.position,
            "occurred_at": insert.excluded.occurred_at,
            "updated_at": insert.excluded.updated_at,
        },
        # Never backwards; an equal position refreshes updated_at (the flush on idle).
        where=watermarks.c.position <= insert.excluded.position,
    )


def _projection_filter(table: sa.Table, projection: ProjectionKey) -> tuple[Any, Any]:
    return (
        table.c.projection_name == projection.name,
        table.c.projection_version == projection.version,
    )


def _flatten(operation: Operation) -> Iterator[Operation]:
    if isinstance(operation, Multi):
        for inner in operation.operations:
            yield from _flatten(inner)
    else:
        yield operation


def _statements(operations: Sequence[Operation]) -> Iterator[tuple[sa.Executable, Any]]:
    """The statements for ``operations``, in order; runs of inserts into one table with
    the same columns become one statement with many parameter sets."""

    def insert_shape(operation: Operation) -> object:
        if isinstance(operation, Insert):
            return (operation.table, tuple(operation.values))
        return None

    for shape, group in itertools.groupby(operations, key=insert_shape):
        if shape is not None:
            inserts = [op for op in group if isinstance(op, Insert)]
            table = inserts[0].table
            # Checked because SQLAlchemy drops unknown keys of many parameter sets.
            yield table.insert(), [_checked(table, op.values) for op in inserts]
            continue
        for operation in group:
            yield _statement(operation)


def _statement(operation: Operation) -> tuple[sa.Executable, Any]:
    if isinstance(operation, Update):
        table = operation.table
        statement = sa.update(table).where(*_equalities(table, operation.where))
        return statement.values(_checked(table, operation.values)), None
    if isinstance(operation, Delete):
        table = operation.table
        return sa.delete(table).where(*_equalities(table, operation.where)), None
    if isinstance(operation, Execute):
        return operation.statement, None
    raise TypeError(f"not an operation a SqlTarget applies: {operation!r}")


def _equalities(table: sa.Table, where: Mapping[str, Any]) -> list[Any]:
    return [_column(table, name) == value for name, value in where.items()]


def _checked(table: sa.Table, values: Mapping[str, Any]) -> dict[str, Any]:
    for name in values:
        _column(table, name)
    return dict(values)


def _column(table: sa.Table, name: str) -> sa.Column[Any]:
    try:
        return table.c[name]
    except KeyError:
        raise sa.exc.ArgumentError(f"table {table.name!r} has no column {name!r}") from None


def _non_negative(limit: int) -> int:
    if type(limit) is not int or limit < 0:
        raise ValueError(f"a limit is a non-negative int, not {limit!r}")
    return limit


def _describe(error: BaseException) -> str:
    # SQLAlchemy's message repeats the statement and every parameter; the driver's
    # own message is the part worth reading.
    cause = error.orig if isinstance(error, sa.exc.StatementError) else error
    text = " ".join(f"{type(cause).__name__}: {cause}".split())
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


def _utc_now() -> datetime:
    return datetime.now(UTC)
