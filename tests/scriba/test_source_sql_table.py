"""SqlTableSource, event_table and append on PostgreSQL and SQLite: what is stored
and what the source makes of it. What the source shares with the other one is tested
in test_source_subscription.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta, timezone

import pytest
import pytest_asyncio
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from tests.scriba import source_logs as logs
from tests.scriba.source_logs import AT, ORDERS, Table, read_all

from scriba import Event
from scriba.sources import NewEvent, SqlTableSource, append, append_async


@pytest.fixture(params=["postgres", "sqlite"])
def events(request: pytest.FixtureRequest) -> Iterator[Table]:
    yield from logs.open_table(request.param, request)


@pytest.fixture
def pg_events(request: pytest.FixtureRequest) -> Iterator[Table]:
    yield from logs.open_table("postgres", request)


@pytest.mark.asyncio
async def test_events_come_in_position_order_with_their_fields(events: Table) -> None:
    assert events.append(5) == [1, 2, 3, 4, 5]
    source = events.source()
    await source.subscribe(ORDERS, after=0)
    got = await read_all(source, limit=2)
    await source.close()
    assert [e.position for e in got] == [1, 2, 3, 4, 5]
    assert got[4] == Event(
        id="e4",
        stream_id="s1",
        type="Happened",
        data={"n": 4},
        position=5,
        occurred_at=AT + timedelta(seconds=4),
        metadata={"by": "test"},
    )
    assert got[4].occurred_at.tzinfo is not None


def test_append_refuses_naive_times_and_duplicate_ids(events: Table) -> None:
    naive = NewEvent("x", "s", "T", {}, datetime(2024, 1, 1))  # noqa: DTZ001 - on purpose
    with events.engine.begin() as connection, pytest.raises(ValueError, match="timezone-aware"):
        append(connection, events.table, [naive])
    events.append(1)
    with pytest.raises(sa.exc.IntegrityError), events.engine.begin() as connection:
        append(connection, events.table, [NewEvent("e0", "s", "T", {}, AT)])
    with events.engine.begin() as connection:
        assert append(connection, events.table, []) == []


@pytest.mark.asyncio
async def test_times_in_other_zones_are_stored_as_utc(events: Table) -> None:
    plus_two = timezone(timedelta(hours=2))
    with events.engine.begin() as connection:
        append(connection, events.table, [NewEvent("z", "s", "T", [1], AT.astimezone(plus_two))])
    source = events.source()
    await source.subscribe(ORDERS, after=0)
    (got,) = await read_all(source)
    await source.close()
    assert got.occurred_at == AT
    assert got.data == [1]


@pytest_asyncio.fixture
async def pg_async_engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(sa.make_url(database_url).set(drivername="postgresql+psycopg"))
    yield engine
    await engine.dispose()


@pytest.mark.asyncio
async def test_append_async_and_a_caller_owned_engine(
    pg_events: Table, pg_async_engine: AsyncEngine
) -> None:
    async with pg_async_engine.begin() as connection:
        positions = await append_async(
            connection, pg_events.table, [NewEvent("a", "s", "T", {}, AT)]
        )
        assert await append_async(connection, pg_events.table, []) == []
    assert positions == [1]
    source = SqlTableSource(pg_async_engine, pg_events.table, poll_interval=0.01)
    await source.subscribe(ORDERS, after=0)
    assert [e.id for e in await read_all(source)] == ["a"]
    await source.close()
    async with pg_async_engine.connect() as connection:  # still usable: it is ours
        assert (await connection.execute(sa.text("select 1"))).scalar() == 1


def test_engines_that_do_not_fit_are_refused(pg_events: Table) -> None:
    with pytest.raises(TypeError, match="AsyncEngine"):
        SqlTableSource(pg_events.engine, pg_events.table)
    with pytest.raises(ValueError, match="mysql"):
        SqlTableSource("mysql://localhost/db", pg_events.table)
