"""The logs the source tests read: a notification log and an event table, each on
PostgreSQL (a schema or table of the test's own, dropped afterwards) and on SQLite
(a file under the test's ``tmp_path``).

:class:`Log` and :class:`Table` both satisfy :class:`EventLog`, so that a scenario
every :class:`~scriba.sources.subscription.SubscribedSource` must pass is written once
and run on each source and each database.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import psycopg
import pytest
import sqlalchemy as sa
from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, event
from eventsourcing.persistence import StoredEvent
from psycopg.conninfo import conninfo_to_dict

from scriba import Event, ProjectionKey
from scriba.sources import NewEvent, NotificationLogSource, SqlTableSource, append, event_table
from scriba.sources.subscription import SubscribedSource

ORDERS = ProjectionKey("orders")
AT = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Row:
    """What a test wrote by hand: where it landed, and the event a source makes of it."""

    position: int
    id: str
    stream_id: str


class Pending(Protocol):
    """A transaction of its own on PostgreSQL, writing one event at a time."""

    def write(self) -> Row: ...

    def commit(self) -> None: ...

    def rollback(self) -> None: ...


class EventLog(Protocol):
    """What the scenarios shared by both sources need of the log they read."""

    @property
    def kind(self) -> str:
        """``"postgres"`` or ``"sqlite"``."""
        ...

    @property
    def url(self) -> str | None:
        """The PostgreSQL connection string (on PostgreSQL)."""
        ...

    @property
    def source_name(self) -> str:
        """What the source's telemetry calls it."""
        ...

    @property
    def database_file(self) -> str:
        """The SQLite file (on SQLite)."""
        ...

    def write(self, count: int) -> None:
        """Commit ``count`` events, at the next positions."""

    def delete(self, positions: Sequence[int]) -> None:
        """Delete the events at ``positions`` (leaving gaps no writer will fill)."""

    def pending(self) -> AbstractContextManager[Pending]:
        """A transaction of its own, closed on exit (PostgreSQL only)."""
        ...

    def source(self, **options: Any) -> SubscribedSource:
        """A source on this log, polling every 10 ms unless ``options`` say otherwise."""
        ...


async def read_all(source: SubscribedSource, limit: int = 100) -> list[Event]:
    """Read until a read returns nothing."""
    events: list[Event] = []
    while batch := await source.read(limit):
        events.extend(batch)
    return events


def holding(source: SubscribedSource) -> bool:
    # A function, so that mypy does not narrow the property across awaits.
    return source.holding


# --- a notification log of eventsourcing ---------------------------------------------------


class Order(Aggregate):
    @event("Placed")
    def __init__(self, sku: str) -> None:
        self.sku = sku
        self.shipped = False

    @event("Shipped")
    def ship(self) -> None:
        self.shipped = True


class Shop(Application[uuid.UUID]):
    name = "shop"


def eventsourcing_postgres_env(database_url: str, schema: str) -> dict[str, str]:
    """The environment of an application recording in ``schema`` of ``database_url``."""
    params = conninfo_to_dict(database_url)
    return {
        "PERSISTENCE_MODULE": "eventsourcing.postgres",
        "POSTGRES_DBNAME": str(params.get("dbname", "postgres")),
        "POSTGRES_HOST": str(params.get("host", "127.0.0.1")),
        "POSTGRES_PORT": str(params.get("port", "5432")),
        "POSTGRES_USER": str(params.get("user", "postgres")),
        "POSTGRES_PASSWORD": str(params.get("password", "")),
        "POSTGRES_SCHEMA": schema,
    }


@dataclass
class Log:
    """An application on one database, and what a test needs to write around it."""

    kind: str
    app: Shop
    table: str  # the events table, qualified and quoted (PostgreSQL) or plain
    url: str | None  # PostgreSQL connection string
    source_name = "eventsourcing"

    @property
    def database_file(self) -> str:
        return str(self.app.recorder.datastore.pool.db_name)  # type: ignore[attr-defined]

    def place(self, count: int, *, ship: bool = False) -> list[Order]:
        orders = [Order(f"sku-{i}") for i in range(count)]
        for order in orders:
            if ship:
                order.ship()
        self.app.save(*orders)
        return orders

    def write(self, count: int) -> None:
        self.place(count)

    def stored(self) -> StoredEvent:
        """A stored event of a new order, to insert by hand."""
        order = Order("by-hand")
        (placed,) = order.collect_events()
        return self.app.mapper.to_stored_event(placed)

    def delete(self, positions: Sequence[int]) -> None:
        listed = ", ".join(str(int(p)) for p in positions)
        if self.kind == "postgres":
            assert self.url is not None
            with psycopg.connect(self.url, autocommit=True) as conn:
                conn.execute(f"DELETE FROM {self.table} WHERE notification_id IN ({listed})")
        else:
            with self.app.recorder.datastore.transaction(commit=True) as cursor:  # type: ignore[attr-defined]
                cursor.execute(f"DELETE FROM {self.table} WHERE rowid IN ({listed})")

    @contextmanager
    def pending(self) -> Iterator[Pending]:
        assert self.url is not None
        with psycopg.connect(self.url) as conn:
            yield _PendingNotification(self, conn)

    def source(self, **options: Any) -> NotificationLogSource:
        options.setdefault("poll_interval", 0.01)
        return NotificationLogSource.for_application(self.app, **options)


@dataclass
class _PendingNotification:
    log: Log
    conn: psycopg.Connection[Any]

    def write(self) -> Row:
        stored = self.log.stored()
        row = self.conn.execute(
            f"INSERT INTO {self.log.table} (originator_id, originator_version, topic, state) "
            "VALUES (%s, %s, %s, %s) RETURNING notification_id",
            [stored.originator_id, 1, stored.topic, stored.state],
        ).fetchone()
        assert row is not None
        return Row(row[0], f"{stored.originator_id}:1", str(stored.originator_id))

    def commit(self) -> None:
        self.conn.commit()

    def rollback(self) -> None:
        self.conn.rollback()


def postgres_log(database_url: str) -> Iterator[Log]:
    schema = f"scriba_src_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    env = {**eventsourcing_postgres_env(database_url, schema), "POSTGRES_POOL_SIZE": "3"}
    app = Shop(env=env)
    try:
        yield Log("postgres", app, f'"{schema}"."shop_events"', database_url)
    finally:
        app.close()
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def sqlite_log(tmp_path: Path) -> Iterator[Log]:
    env = {"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(tmp_path / "es.db")}
    app = Shop(env=env)
    try:
        yield Log("sqlite", app, app.recorder.events_table_name, None)  # type: ignore[attr-defined]
    finally:
        app.close()


# --- an event table of the application's own -----------------------------------------------


@dataclass
class Table:
    """An event table on one database, with a synchronous engine to write it."""

    kind: str
    engine: sa.Engine  # for writing
    table: sa.Table
    url: str
    source_name = "sql_table"
    _next: int = field(default=0, init=False)  # the index of the next event append writes

    @property
    def database_file(self) -> str:
        return self.engine.url.database or ""

    def append(self, count: int, *, streams: int = 3, start: int | None = None) -> list[int]:
        """Commit events ``e<start>`` onwards (by default, after the last appended)."""
        first = self._next if start is None else start
        events = [
            NewEvent(
                f"e{i}",
                f"s{i % streams}",
                "Happened",
                {"n": i},
                AT + timedelta(seconds=i),
                {"by": "test"},
            )
            for i in range(first, first + count)
        ]
        self._next = max(self._next, first + count)
        with self.engine.begin() as connection:
            return append(connection, self.table, events)

    def write(self, count: int) -> None:
        self.append(count)

    def delete(self, positions: Sequence[int]) -> None:
        with self.engine.begin() as connection:
            connection.execute(self.table.delete().where(self.table.c.position.in_(positions)))

    @contextmanager
    def pending(self) -> Iterator[Pending]:
        with self.engine.connect() as connection, connection.begin() as transaction:
            yield _PendingRow(self.table, connection, transaction)

    def source(self, **options: Any) -> SqlTableSource:
        options.setdefault("poll_interval", 0.01)
        if self.kind == "postgres":
            return SqlTableSource(self.url, self.table, **options)
        return SqlTableSource(self.engine, self.table, **options)


@dataclass
class _PendingRow:
    table: sa.Table
    connection: sa.Connection
    transaction: sa.RootTransaction

    def write(self) -> Row:
        id_ = f"by-hand-{uuid.uuid4().hex[:8]}"
        (position,) = append(self.connection, self.table, [NewEvent(id_, "s", "T", {}, AT)])
        return Row(position, id_, "s")

    def commit(self) -> None:
        self.transaction.commit()

    def rollback(self) -> None:
        self.transaction.rollback()


def postgres_table(database_url: str) -> Iterator[Table]:
    url = sa.make_url(database_url).set(drivername="postgresql+psycopg")
    engine = sa.create_engine(url)
    table = event_table(sa.MetaData(), f"scriba_src_{uuid.uuid4().hex[:10]}")
    table.create(engine)
    try:
        yield Table("postgres", engine, table, database_url)
    finally:
        table.drop(engine)
        engine.dispose()


def sqlite_table(tmp_path: Path) -> Iterator[Table]:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    engine = sa.create_engine(url)
    table = event_table(sa.MetaData())
    table.create(engine)
    try:
        yield Table("sqlite", engine, table, url)
    finally:
        engine.dispose()


# --- on either database, for fixtures --------------------------------------------------------


def open_log(kind: str, request: pytest.FixtureRequest) -> Iterator[Log]:
    """A notification log on ``kind`` (``"postgres"`` or ``"sqlite"``), for a fixture."""
    if kind == "postgres":
        yield from postgres_log(request.getfixturevalue("database_url"))
    else:
        yield from sqlite_log(request.getfixturevalue("tmp_path"))


def open_table(kind: str, request: pytest.FixtureRequest) -> Iterator[Table]:
    """An event table on ``kind`` (``"postgres"`` or ``"sqlite"``), for a fixture."""
    if kind == "postgres":
        yield from postgres_table(request.getfixturevalue("database_url"))
    else:
        yield from sqlite_table(request.getfixturevalue("tmp_path"))
