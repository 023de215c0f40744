"""SqlTableSource, event_table and append on PostgreSQL and SQLite."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytest_asyncio
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from scriba import Event, ProjectionKey
from scriba.source import SourceError
from scriba.sources import (
    LostLockError,
    NewEvent,
    SqlTableSource,
    append,
    append_async,
    event_table,
)
from scriba.sources.standby import AdvisoryLock, lock_path_beside
from statifier import telemetry

ORDERS = ProjectionKey("orders")
AT = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


@dataclass
class Table:
    """An event table on one database, with a synchronous engine to write it."""

    kind: str
    engine: sa.Engine  # for writing
    table: sa.Table
    url: str

    def append(self, count: int, *, streams: int = 3, start: int = 0) -> list[int]:
        events = [
            NewEvent(
                f"e{i}",
                f"s{i % streams}",
                "Happened",
                {"n": i},
                AT + timedelta(seconds=i),
                {"by": "test"},
            )
            for i in range(start, start + count)
        ]
        with self.engine.begin() as connection:
            return append(connection, self.table, events)

    def source(self, **options: Any) -> SqlTableSource:
        options.setdefault("poll_interval", 0.01)
        if self.kind == "postgres":
            return SqlTableSource(self.url, self.table, **options)
        return SqlTableSource(self.engine, self.table, **options)


def _postgres_table(database_url: str) -> Iterator[Table]:
    url = sa.make_url(database_url).set(drivername="postgresql+psycopg")
    engine = sa.create_engine(url)
    table = event_table(sa.MetaData(), f"scriba_src_{uuid.uuid4().hex[:10]}")
    table.create(engine)
    try:
        yield Table("postgres", engine, table, database_url)
    finally:
        table.drop(engine)
        engine.dispose()


def _sqlite_table(tmp_path: Path) -> Iterator[Table]:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    engine = sa.create_engine(url)
    table = event_table(sa.MetaData())
    table.create(engine)
    try:
        yield Table("sqlite", engine, table, url)
    finally:
        engine.dispose()


@pytest.fixture(params=["postgres", "sqlite"])
def events(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Table]:
    if request.param == "postgres":
        yield from _postgres_table(request.getfixturevalue("database_url"))
    else:
        yield from _sqlite_table(tmp_path)


@pytest.fixture
def pg_events(database_url: str) -> Iterator[Table]:
    yield from _postgres_table(database_url)


async def read_all(source: SqlTableSource, limit: int = 100) -> list[Event]:
    """Read until a read returns nothing."""
    got: list[Event] = []
    while batch := await source.read(limit):
        got.extend(batch)
    return got


def _holding(source: SqlTableSource) -> bool:
    # A function, so that mypy does not narrow the property across awaits.
    return source.holding


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


@pytest.mark.asyncio
async def test_resumes_after_the_position_given_and_sees_later_appends(events: Table) -> None:
    events.append(6)
    source = events.source()
    await source.subscribe(ORDERS, after=4)
    assert [e.position for e in await read_all(source)] == [5, 6]
    events.append(2, start=6)
    assert [e.position for e in await read_all(source)] == [7, 8]
    await source.close()


@pytest.mark.asyncio
async def test_a_read_returns_at_most_limit(events: Table) -> None:
    events.append(7)
    source = events.source()
    await source.subscribe(ORDERS, after=0)
    sizes = []
    while batch := await source.read(3):
        sizes.append(len(batch))
    await source.close()
    assert sizes == [3, 3, 1]


@pytest.mark.asyncio
async def test_acknowledging_past_what_was_read_is_refused(events: Table) -> None:
    events.append(3)
    source = events.source()
    await source.subscribe(ORDERS, after=0)
    await source.read(2)
    await source.acknowledge(2)
    with pytest.raises(ValueError, match="only events up to 2"):
        await source.acknowledge(3)
    assert source.acknowledged == 2
    await source.close()


@pytest.mark.asyncio
async def test_old_gaps_are_passed_in_one_read(events: Table) -> None:
    events.append(10)
    with events.engine.begin() as connection:
        connection.execute(events.table.delete().where(events.table.c.position.in_([3, 4, 7])))
    source = events.source()
    await source.subscribe(ORDERS, after=0)
    got = await source.read(100)
    await source.close()
    assert [e.position for e in got] == [1, 2, 5, 6, 8, 9, 10]


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


@pytest.mark.asyncio
async def test_reading_before_subscribing_is_an_error(events: Table) -> None:
    source = events.source()
    with pytest.raises(SourceError, match="before subscribe"):
        await source.read(1)
    with pytest.raises(ValueError, match="limit"):
        await source.read(0)
    await source.close()


# --- the straggler -------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_postgresql_a_straggler_holds_reading_back_until_it_commits(
    pg_events: Table,
) -> None:
    """Position 3 is drawn by a transaction held open while 4 commits: the source
    delivers neither until 3 commits, then both, in order."""
    pg_events.append(2)
    source = pg_events.source()
    await source.subscribe(ORDERS, after=0)
    assert [e.position for e in await read_all(source)] == [1, 2]
    with pg_events.engine.connect() as straggler, straggler.begin() as held:
        assert append(straggler, pg_events.table, [NewEvent("late", "s", "T", {}, AT)]) == [3]
        assert pg_events.append(1, start=100) == [4]  # committed and visible
        for _ in range(3):
            assert await source.read(10) == []
        held.commit()
    got = await read_all(source)
    await source.close()
    assert [(e.position, e.id) for e in got] == [(3, "late"), (4, "e100")]


@pytest.mark.asyncio
async def test_postgresql_a_rolled_back_gap_is_passed_once_its_writer_ended(
    pg_events: Table,
) -> None:
    source = pg_events.source()
    await source.subscribe(ORDERS, after=0)
    with pg_events.engine.connect() as aborted, aborted.begin() as held:
        append(aborted, pg_events.table, [NewEvent("never", "s", "T", {}, AT)])
        pg_events.append(1)  # position 2
        assert await source.read(10) == []
        held.rollback()
    assert [e.position for e in await read_all(source)] == [2]
    await source.close()


@pytest.mark.asyncio
async def test_postgresql_unrelated_transactions_do_not_hold_a_gap(pg_events: Table) -> None:
    """Only transactions that write the event table can fill a gap in it."""
    pg_events.append(3)
    with pg_events.engine.begin() as connection:
        connection.execute(pg_events.table.delete().where(pg_events.table.c.position == 2))
    with pg_events.engine.connect() as unrelated, unrelated.begin():
        unrelated.execute(sa.text("CREATE TEMPORARY TABLE scratch (x int)"))
        unrelated.execute(sa.text("INSERT INTO scratch VALUES (1)"))
        source = pg_events.source()
        await source.subscribe(ORDERS, after=0)
        assert [e.position for e in await source.read(10)] == [1, 3]
        await source.close()


# --- one reader per projection -------------------------------------------------------------


@pytest.fixture
def seen() -> Iterator[list[tuple[str, Mapping[str, Any]]]]:
    found: list[tuple[str, Mapping[str, Any]]] = []
    handler_id = f"test-{uuid.uuid4().hex}"
    for name in ("scriba.source.standby", "scriba.source.subscribed"):
        telemetry.attach(handler_id, name, lambda n, _m, meta: found.append((n, meta)))
    yield found
    telemetry.detach(handler_id)


@pytest.mark.asyncio
async def test_a_second_subscription_stands_by_and_takes_over_on_release(
    events: Table, seen: list[tuple[str, Mapping[str, Any]]]
) -> None:
    events.append(3)
    holder, standby = events.source(), events.source()
    await holder.subscribe(ORDERS, after=0)
    await standby.subscribe(ORDERS, after=2)
    assert _holding(holder)
    assert not _holding(standby)
    for _ in range(3):
        assert await standby.read(10) == []
    assert len(await read_all(holder)) == 3
    await holder.close()
    assert [e.position for e in await read_all(standby)] == [3]
    assert _holding(standby)
    await standby.close()
    assert [(n, m["source"], m.get("after")) for n, m in seen] == [
        ("scriba.source.subscribed", "sql_table", 0),
        ("scriba.source.standby", "sql_table", None),
        ("scriba.source.subscribed", "sql_table", 2),
    ]


@pytest.mark.asyncio
async def test_postgresql_a_holder_whose_connection_dies_is_replaced(pg_events: Table) -> None:
    pg_events.append(2)
    holder = pg_events.source(lock_check_interval=0.0)
    standby = pg_events.source()
    await holder.subscribe(ORDERS, after=0)
    await standby.subscribe(ORDERS, after=0)
    assert await standby.read(10) == []
    lock = holder.lock
    assert isinstance(lock, AdvisoryLock)
    assert lock.backend_pid is not None
    with psycopg.connect(pg_events.url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [lock.backend_pid])
    assert [e.position for e in await read_all(standby)] == [1, 2]
    with pytest.raises(LostLockError):
        await holder.read(10)
    await holder.close()
    await standby.close()


_HOLD_FLOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(60)
"""


@pytest.mark.asyncio
async def test_sqlite_a_holder_process_that_dies_is_replaced(tmp_path: Path) -> None:
    for events in _sqlite_table(tmp_path):
        events.append(2)
        lock_file = lock_path_beside(str(tmp_path / "events.db"), ORDERS)
        holder = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _HOLD_FLOCK, str(lock_file), stdout=subprocess.PIPE
        )
        try:
            assert holder.stdout is not None
            assert await holder.stdout.readline() == b"held\n"
            standby = events.source()
            await standby.subscribe(ORDERS, after=0)
            assert await standby.read(10) == []
            os.kill(holder.pid, signal.SIGKILL)
            await holder.wait()
            assert [e.position for e in await read_all(standby)] == [1, 2]
            await standby.close()
        finally:
            if holder.returncode is None:
                holder.kill()
                await holder.wait()
