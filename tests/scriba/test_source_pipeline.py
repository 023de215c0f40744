"""Both sources end to end through the engine and the SQL target, on both databases.

The acknowledgement defects of the original are what these look for: an
acknowledgement (or watermark) running ahead of an event still in its handler while
later partitions commit, and one stalling at a permanent gap in the positions.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pytest
import sqlalchemy as sa
from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, event
from tests.scriba.source_logs import eventsourcing_postgres_env, holding

from scriba import Event, Insert, Meta, Projection, Result
from scriba.runtime import Scriba
from scriba.source import Source
from scriba.sources import NewEvent, NotificationLogSource, SqlTableSource, append, event_table

if TYPE_CHECKING:
    from tests.scriba.conftest import SqlDatabase


class Ticket(Aggregate):
    @event("Opened")
    def __init__(self, title: str) -> None:
        self.title = title


class Desk(Application[uuid.UUID]):
    name = "desk"


@dataclass
class Setup:
    """A source with ``count`` events waiting, and how to read the read model."""

    make_source: Callable[[], Source]
    positions: list[int]  # of the events, in order
    close: Callable[[], None]


def _read_model(db: SqlDatabase) -> sa.Table:
    table = sa.Table(
        f"projected_{uuid.uuid4().hex[:8]}",
        db.metadata,
        sa.Column("event_id", sa.String(255), primary_key=True),
        sa.Column("position", sa.BigInteger, nullable=False),
    )
    table.create(db.engine)
    return table


def _sql_table(db: SqlDatabase, count: int) -> Setup:
    events = event_table(db.metadata, f"events_{uuid.uuid4().hex[:8]}")
    events.create(db.engine)
    at = datetime(2024, 1, 1, tzinfo=UTC)
    new = [NewEvent(f"e{n}", f"s{n % 7}", "T", {}, at + timedelta(seconds=n)) for n in range(count)]
    with db.engine.begin() as connection:
        positions = append(connection, events, new)
        # Permanent gaps, which must not stall the acknowledgement.
        gone = positions[count // 2 : count // 2 + 3]
        connection.execute(events.delete().where(events.c.position.in_(gone)))
    positions = [p for p in positions if p not in gone]
    database: str | sa.Engine = db.url if db.dialect == "postgresql" else db.engine
    return Setup(
        lambda: SqlTableSource(database, events, poll_interval=0.01), positions, lambda: None
    )


def _notification_log(db: SqlDatabase, count: int) -> Setup:
    if db.dialect == "postgresql":
        conninfo = str(sa.make_url(db.url).set(drivername="postgresql"))
        env = eventsourcing_postgres_env(conninfo, str(db.schema))
    else:
        database = sa.make_url(db.url).database
        env = {"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": f"{database}.es"}
    app = Desk(env=env)
    tickets = [Ticket(f"t{n}") for n in range(count)]
    app.save(*tickets)
    return Setup(
        lambda: NotificationLogSource.for_application(app, poll_interval=0.01),
        list(range(1, count + 1)),
        app.close,
    )


SOURCES = {"sql_table": _sql_table, "notification_log": _notification_log}


@pytest.fixture(params=list(SOURCES))
def source_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def setup(sql_database: SqlDatabase, source_kind: str) -> Iterator[Setup]:
    built = SOURCES[source_kind](sql_database, 60)
    yield built
    built.close()


def _projected(db: SqlDatabase, table: sa.Table) -> list[int]:
    with db.engine.connect() as connection:
        return sorted(connection.execute(sa.select(table.c.position)).scalars())


@pytest.mark.asyncio
async def test_the_acknowledgement_never_passes_an_event_in_its_handler(
    sql_database: SqlDatabase, setup: Setup
) -> None:
    read_model = _read_model(sql_database)
    held = setup.positions[3]
    release, later = asyncio.Event(), asyncio.Event()

    class Tickets(Projection):
        name = f"tickets_{uuid.uuid4().hex[:6]}"
        parallelism = 4
        batch_size = 5
        batch_timeout = 0.01

        async def handle(self, event: Event, meta: Meta) -> Result:
            if event.position == held:
                await release.wait()
            if event.position > held + 10:
                later.set()
            return Insert(read_model, {"event_id": event.id, "position": event.position})

    target = sql_database.target()
    source = setup.make_source()
    async with Scriba() as scriba:
        await scriba.start(Tickets, source=source, target=target)
        async with asyncio.timeout(20):
            await later.wait()
            await asyncio.sleep(1.2)  # past the watermark's throttle
        assert max(_projected(sql_database, read_model)) > held + 10
        acknowledged = _acknowledged(source)
        assert acknowledged < held
        stored = await target.watermark(Tickets.key())
        assert stored is None or stored.position < held
        assert held not in _projected(sql_database, read_model)

        release.set()
        async with asyncio.timeout(20):
            await scriba.wait_until_caught_up(Tickets)
        await scriba.stop(Tickets)
        stored = await target.watermark(Tickets.key())
    await target.close()
    assert _projected(sql_database, read_model) == setup.positions
    assert _acknowledged(source) == setup.positions[-1]  # gaps did not stall it
    assert stored is not None
    assert stored.position == setup.positions[-1]


def _acknowledged(source: Source) -> int:
    assert isinstance(source, SqlTableSource | NotificationLogSource)
    return source.acknowledged


@pytest.mark.asyncio
async def test_a_restart_resumes_from_the_watermark_and_projects_each_event_once(
    sql_database: SqlDatabase, source_kind: str
) -> None:
    read_model = _read_model(sql_database)
    first = SOURCES[source_kind](sql_database, 30)
    seen: list[int] = []

    class Tickets(Projection):
        name = f"tickets_{uuid.uuid4().hex[:6]}"
        parallelism = 3
        batch_timeout = 0.01

        def handle(self, event: Event, meta: Meta) -> Result:
            seen.append(event.position)
            return Insert(read_model, {"event_id": event.id, "position": event.position})

    target = sql_database.target()
    try:
        async with Scriba() as scriba:
            await scriba.start(Tickets, source=first.make_source(), target=target)
            async with asyncio.timeout(20):
                await scriba.wait_until_caught_up(Tickets)
        handled = len(seen)
        async with Scriba() as scriba:
            await scriba.start(Tickets, source=first.make_source(), target=target)
            async with asyncio.timeout(20):
                await scriba.wait_until_caught_up(Tickets)
    finally:
        await target.close()
        first.close()
    assert handled == len(first.positions)
    assert len(seen) == handled  # the second run had nothing to do
    assert _projected(sql_database, read_model) == first.positions


@pytest.mark.asyncio
async def test_a_standby_runtime_takes_over_without_handling_anything_twice(
    sql_database: SqlDatabase,
) -> None:
    """Two runtimes start the same projection; the second stands by while the first
    works, takes over when it stops, redelivers from its stale starting point and
    deduplicates all of it (its cursors are loaded when it first reads, after the lock)."""
    read_model = _read_model(sql_database)
    events = event_table(sql_database.metadata, f"events_{uuid.uuid4().hex[:8]}")
    events.create(sql_database.engine)
    database: str | sa.Engine = (
        sql_database.url if sql_database.dialect == "postgresql" else sql_database.engine
    )
    at = datetime(2024, 1, 1, tzinfo=UTC)

    def add(start: int, count: int) -> None:
        new = [NewEvent(f"e{n}", f"s{n % 5}", "T", {}, at) for n in range(start, start + count)]
        with sql_database.engine.begin() as connection:
            append(connection, events, new)

    handled: dict[str, list[int]] = {"first": [], "second": []}
    reached = {"first": asyncio.Event(), "second": asyncio.Event()}
    wanted = {"first": 50, "second": 10}

    def projection(runtime: str) -> type[Projection]:
        class Tickets(Projection):
            name = "takeover"
            parallelism = 2
            batch_timeout = 0.01

            def handle(self, event: Event, meta: Meta) -> Result:
                handled[runtime].append(event.position)
                if len(handled[runtime]) >= wanted[runtime]:
                    reached[runtime].set()
                return Insert(read_model, {"event_id": event.id, "position": event.position})

        return Tickets

    first, second = projection("first"), projection("second")
    add(0, 30)
    target_one, target_two = sql_database.target(), sql_database.target()
    standby = SqlTableSource(database, events, poll_interval=0.01)
    try:
        async with Scriba() as one, Scriba() as two:
            await one.start(
                first,
                source=SqlTableSource(database, events, poll_interval=0.01),
                target=target_one,
            )
            async with asyncio.timeout(20):
                await one.wait_until_caught_up(first)
            await two.start(second, source=standby, target=target_two)
            add(30, 20)
            async with asyncio.timeout(20):
                await reached["first"].wait()
            assert not holding(standby)
            await one.stop(first)
            add(50, 10)
            async with asyncio.timeout(20):
                await reached["second"].wait()
                await two.wait_until_caught_up(second)
            assert holding(standby)
    finally:
        await target_one.close()
        await target_two.close()
    assert sorted(handled["first"]) == list(range(1, 51))
    assert sorted(handled["second"]) == list(range(51, 61))
    assert _projected(sql_database, read_model) == list(range(1, 61))
