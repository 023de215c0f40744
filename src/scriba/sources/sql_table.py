"""A source reading an event table of the application's own (an outbox, a ledger).

:func:`event_table` defines the table (SQLAlchemy Core); :func:`append` writes events
to it inside the caller's transaction, so an application can record its events
atomically with its own writes; :class:`SqlTableSource` reads them back in
``position`` order:

================ =====================================================================
``position``     bigint, assigned by the database on insert (the global order)
``id``           unique event id (redelivery keeps it)
``stream_id``    the stream, e.g. an order id
``type``         the event type name
``data``         JSON (``jsonb`` on PostgreSQL)
``metadata``     JSON object
``occurred_at``  timestamp with time zone (stored as UTC)
================ =====================================================================

PostgreSQL is read over psycopg 3's asyncio connection (one of the source's own), with
the query compiled by SQLAlchemy once: SQLAlchemy's result layer cost more per event
than the driver's own read. SQLite is read through a plain engine, inline on the event
loop: a local read takes microseconds, less than a hop to a thread would cost.

A position comes from a sequence on PostgreSQL, handed out at insert and visible only
at commit, so a lower one can become visible after a higher one. The source never
reads past a missing position while a transaction that could still fill it runs (see
:mod:`scriba.sources.gaps`). On SQLite writers are serialized and ``AUTOINCREMENT``
never reuses a position, so gaps are only ever permanent.

As with every scriba source, one process at a time reads a projection; another stands
by until the holder lets go (:mod:`scriba.sources.standby`).

>>> import asyncio, datetime
>>> engine = sa.create_engine("sqlite://")
>>> events = event_table(sa.MetaData())
>>> events.create(engine)
>>> at = datetime.datetime(2024, 5, 1, tzinfo=datetime.UTC)
>>> with engine.begin() as connection:
...     append(connection, events, [NewEvent("e1", "order-1", "OrderPlaced", {"sku": "A"}, at)])
[1]
>>> async def demo():
...     source = SqlTableSource(engine, events)
...     await source.subscribe(ProjectionKey("orders"), after=0)
...     (event,) = await source.read(10)
...     await source.close()
...     return event.position, event.type, event.data
>>> asyncio.run(demo())
(1, 'OrderPlaced', {'sku': 'A'})
>>> engine.dispose()
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import psycopg
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from scriba.event import Event, ProjectionKey
from scriba.source import SourceError
from scriba.sources.gaps import (
    MAX_READS_PER_CALL,
    PG_RUNNING_SQL,
    PG_WRITERS_SQL,
    GapTracker,
)
from scriba.sources.standby import AdvisoryLock, FileLock, ProjectionLock, lock_key
from scriba.sources.subscription import SubscribedSource
from scriba.sql.tables import autoincrement_id
from statifier.sql.engines import new_engine
from statifier.sql.types import json_document

__all__ = ["NewEvent", "SqlTableSource", "append", "append_async", "event_table"]

DEFAULT_TABLE: Final = "scriba_events"


def event_table(
    metadata: sa.MetaData, name: str = DEFAULT_TABLE, *, schema: str | None = None
) -> sa.Table:
    """The event table ``name`` in ``metadata`` (create it with ``metadata.create_all``
    or a migration of the application's)."""
    return sa.Table(
        name,
        metadata,
        sa.Column("position", autoincrement_id(), primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(255), nullable=False, unique=True),
        sa.Column("stream_id", sa.String(255), nullable=False),
        sa.Column("type", sa.String(255), nullable=False),
        sa.Column("data", json_document(), nullable=False),
        sa.Column("metadata", json_document(), nullable=False),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False),
        schema=schema,
        sqlite_autoincrement=True,
    )


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append; the table gives it its position.

    ``occurred_at`` must be timezone-aware (it is stored as UTC).
    """

    id: str
    stream_id: str
    type: str
    data: Any
    occurred_at: datetime
    metadata: Mapping[str, Any] = field(default_factory=dict)


def _rows(events: Sequence[NewEvent]) -> list[dict[str, Any]]:
    rows = []
    for event in events:
        if event.occurred_at.tzinfo is None:
            raise ValueError(f"event {event.id!r}: occurred_at must be timezone-aware")
        rows.append(
            {
                "id": event.id,
                "stream_id": event.stream_id,
                "type": event.type,
                "data": event.data,
                "metadata": dict(event.metadata),
                "occurred_at": event.occurred_at.astimezone(UTC),
            }
        )
    return rows


def append(connection: sa.Connection, table: sa.Table, events: Sequence[NewEvent]) -> list[int]:
    """Insert ``events`` in order inside ``connection``'s transaction; their positions.

    Raises:
        ValueError: an ``occurred_at`` is naive.
        sqlalchemy.exc.IntegrityError: an event id is already in the table.
    """
    if not events:
        return []
    statement = table.insert().returning(table.c.position, sort_by_parameter_order=True)
    return list(connection.execute(statement, _rows(events)).scalars())


async def append_async(
    connection: AsyncConnection, table: sa.Table, events: Sequence[NewEvent]
) -> list[int]:
    """:func:`append` on an asyncio connection."""
    if not events:
        return []
    statement = table.insert().returning(table.c.position, sort_by_parameter_order=True)
    return list((await connection.execute(statement, _rows(events))).scalars())


def _conninfo(url: sa.URL) -> str:
    """The libpq connection string of a SQLAlchemy PostgreSQL URL."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


class SqlTableSource(SubscribedSource):
    """Reads an :func:`event_table` in ``position`` order.

    Subscribing, standing by, acknowledging and closing are those of
    :class:`~scriba.sources.subscription.SubscribedSource`; closing also disposes of an
    engine this source made.

    Args:
        database: a URL (``postgresql://...`` or ``sqlite:///path``), a synchronous
            :class:`~sqlalchemy.Engine` for SQLite, or an
            :class:`~sqlalchemy.ext.asyncio.AsyncEngine` for PostgreSQL (only its URL
            is used: the source opens two connections of its own, one to read and
            one to hold the projection lock). An engine given stays the caller's; one
            made from a SQLite URL is disposed by :meth:`close`.
        table: the event table (from :func:`event_table`).
        poll_interval, lock_check_interval, lock_path: as for
            :class:`~scriba.sources.subscription.SubscribedSource`.

    Raises:
        ValueError: a URL of another database.
        TypeError: a synchronous engine for a database other than SQLite (it would
            block the event loop on the network), or an asyncio engine for SQLite.
    """

    def __init__(
        self,
        database: str | sa.URL | sa.Engine | AsyncEngine,
        table: sa.Table,
        *,
        poll_interval: float = 0.1,
        lock_check_interval: float = 1.0,
        lock_path: str | None = None,
    ):
        self._owned = False
        self._conninfo: str | None = None  # PostgreSQL
        self._sync_engine: sa.Engine | None = None  # SQLite
        if isinstance(database, str | sa.URL):
            url = sa.make_url(database)
            backend = url.get_backend_name()
            if backend == "postgresql":
                self._conninfo = _conninfo(url)
            elif backend == "sqlite":
                self._sync_engine = new_engine(url.set(drivername="sqlite"))
                self._owned = True
            else:
                raise ValueError(
                    f"SqlTableSource reads PostgreSQL or SQLite, not {url.drivername!r}"
                )
        elif isinstance(database, AsyncEngine):
            if database.dialect.name != "postgresql":
                raise TypeError("an asyncio engine is for PostgreSQL; give SQLite a plain engine")
            self._conninfo = _conninfo(database.url)
        elif database.dialect.name == "sqlite":
            self._sync_engine = database
        else:
            raise TypeError(
                f"give SqlTableSource an AsyncEngine for {database.dialect.name}: "
                "a synchronous one would block the event loop on the network"
            )
        self._read_conn: psycopg.AsyncConnection[Any] | None = None
        self._table = table
        # Columns in the order _to_event unpacks them.
        self._select = (
            sa.select(
                table.c.position,
                table.c.id,
                table.c.stream_id,
                table.c.type,
                table.c.data,
                table.c.metadata,
                table.c.occurred_at,
            )
            .where(table.c.position > sa.bindparam("after"))
            .order_by(table.c.position)
            .limit(sa.bindparam("limit"))
        )
        # PostgreSQL reads go to the driver with this SQL, compiled once: SQLAlchemy's
        # result layer cost more per event than psycopg's own read (bench/projections).
        pg_dialect = postgresql.psycopg.dialect()  # type: ignore[no-untyped-call]
        self._select_sql = str(self._select.compile(dialect=pg_dialect))
        self._table_sql = pg_dialect.identifier_preparer.format_table(table)
        self._head_query = sa.select(sa.func.max(table.c.position))
        self._head_sql = str(self._head_query.compile(dialect=pg_dialect))
        super().__init__(
            "sql_table",
            gaps_can_fill=self._conninfo is not None,
            poll_interval=poll_interval,
            lock_check_interval=lock_check_interval,
            lock_path=lock_path,
        )

    async def close(self) -> None:
        """Release the projection lock, and the engine if this source made it."""
        await super().close()
        await self._drop_read_connection()
        if self._owned and self._sync_engine is not None:
            self._owned = False
            self._sync_engine.dispose()

    # --- internals ----------------------------------------------------------------------

    def _make_lock(self, projection: ProjectionKey) -> ProjectionLock:
        if self._conninfo is not None:
            conninfo = self._conninfo

            async def connect() -> psycopg.AsyncConnection[Any]:
                return await psycopg.AsyncConnection.connect(conninfo, autocommit=True)

            return AdvisoryLock(connect, lock_key(projection))
        assert self._sync_engine is not None
        return FileLock(self._lock_file(self._sync_engine.url.database or "", projection))

    async def _head(self) -> int | None:
        if self._conninfo is not None:
            # A connection of its own: the read connection belongs to the reads, and a
            # head is asked for rarely (by ``info``).
            async with await psycopg.AsyncConnection.connect(
                self._conninfo, autocommit=True
            ) as conn:
                cursor = await conn.execute(self._head_sql)
                row = await cursor.fetchone()
                return int(row[0]) if row is not None and row[0] is not None else 0
        assert self._sync_engine is not None
        with self._sync_engine.connect() as conn:
            highest = conn.execute(self._head_query).scalar()
        return int(highest) if highest is not None else 0

    async def _read_batch(self, tracker: GapTracker, limit: int) -> list[Event]:
        try:
            if self._conninfo is not None:
                return await self._read_postgres(self._conninfo, tracker, limit)
            assert self._sync_engine is not None
            return self._read_sqlite(self._sync_engine, tracker, limit)
        except psycopg.Error as exc:
            await self._drop_read_connection()  # the next read connects again
            raise SourceError(f"reading {self._table.name} failed: {exc}") from exc
        except sa.exc.SQLAlchemyError as exc:
            raise SourceError(f"reading {self._table.name} failed: {exc}") from exc

    async def _drop_read_connection(self) -> None:
        conn, self._read_conn = self._read_conn, None
        if conn is not None:
            await conn.close()

    async def _read_postgres(self, conninfo: str, tracker: GapTracker, limit: int) -> list[Event]:
        if self._read_conn is None or self._read_conn.closed:
            self._read_conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        conn = self._read_conn
        out: list[Event] = []
        for _ in range(MAX_READS_PER_CALL):
            cursor = await conn.execute(
                self._select_sql, {"after": tracker.cursor, "limit": limit - len(out)}, prepare=True
            )
            rows = await cursor.fetchall()
            accepted = tracker.accept([row[0] for row in rows])
            out.extend(self._to_event(row) for row in rows[:accepted])
            if not tracker.blocked or len(out) >= limit:
                break
            writers = tracker.fenced_writers
            if writers is None:
                found = await conn.execute(PG_WRITERS_SQL, (self._table_sql,))
                tracker.fence(rows[-1][0], frozenset(r[0] for r in await found.fetchall()))
                writers = tracker.fenced_writers
            if writers:
                running = await conn.execute(PG_RUNNING_SQL, (list(writers),))
                if await running.fetchone() is not None:
                    break
            tracker.close_gaps()
        return out

    def _read_sqlite(self, engine: sa.Engine, tracker: GapTracker, limit: int) -> list[Event]:
        with engine.connect() as conn:
            rows = conn.execute(self._select, {"after": tracker.cursor, "limit": limit}).all()
        accepted = tracker.accept([row[0] for row in rows])
        return [self._to_event(row) for row in rows[:accepted]]

    @staticmethod
    def _to_event(row: Sequence[Any]) -> Event:
        position, id_, stream_id, type_, data, metadata, occurred_at = row
        if occurred_at.tzinfo is None:  # SQLite keeps no zone; append stored UTC
            occurred_at = occurred_at.replace(tzinfo=UTC)
        return Event(id_, stream_id, type_, data, position, occurred_at, metadata)
