"""NotificationLogSource on eventsourcing's PostgreSQL and SQLite recorders."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, event
from eventsourcing.persistence import StoredEvent
from eventsourcing.popo import POPOApplicationRecorder
from eventsourcing.postgres import PostgresApplicationRecorder
from psycopg.conninfo import conninfo_to_dict

from scriba import Event, ProjectionKey
from scriba.source import SourceError
from scriba.sources import EventDecodeError, LostLockError, NotificationLogSource
from scriba.sources.standby import AdvisoryLock, lock_path_beside
from statifier import telemetry


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


@dataclass
class Log:
    """An application on one database, and what a test needs to write around it."""

    kind: str
    app: Shop
    table: str  # the events table, qualified and quoted (PostgreSQL) or plain
    url: str | None  # PostgreSQL connection string

    def place(self, count: int, *, ship: bool = False) -> list[Order]:
        orders = [Order(f"sku-{i}") for i in range(count)]
        for order in orders:
            if ship:
                order.ship()
        self.app.save(*orders)
        return orders

    def stored(self) -> StoredEvent:
        """A stored event of a new order, to insert by hand."""
        order = Order("by-hand")
        (placed,) = order.collect_events()
        return self.app.mapper.to_stored_event(placed)

    def source(self, **options: Any) -> NotificationLogSource:
        options.setdefault("poll_interval", 0.01)
        return NotificationLogSource.for_application(self.app, **options)


def _insert_sql(table: str) -> str:
    return (
        f"INSERT INTO {table} (originator_id, originator_version, topic, state) "
        "VALUES (%s, %s, %s, %s) RETURNING notification_id"
    )


def _postgres_log(database_url: str) -> Iterator[Log]:
    schema = f"scriba_src_{uuid.uuid4().hex[:10]}"
    params = conninfo_to_dict(database_url)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    env = {
        "PERSISTENCE_MODULE": "eventsourcing.postgres",
        "POSTGRES_DBNAME": str(params.get("dbname", "postgres")),
        "POSTGRES_HOST": str(params.get("host", "127.0.0.1")),
        "POSTGRES_PORT": str(params.get("port", "5432")),
        "POSTGRES_USER": str(params.get("user", "postgres")),
        "POSTGRES_PASSWORD": str(params.get("password", "")),
        "POSTGRES_SCHEMA": schema,
        "POSTGRES_POOL_SIZE": "3",
    }
    app = Shop(env=env)
    try:
        yield Log("postgres", app, f'"{schema}"."shop_events"', database_url)
    finally:
        app.close()
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def _sqlite_log(tmp_path: Path) -> Iterator[Log]:
    env = {"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(tmp_path / "es.db")}
    app = Shop(env=env)
    try:
        yield Log("sqlite", app, app.recorder.events_table_name, None)  # type: ignore[attr-defined]
    finally:
        app.close()


@pytest.fixture(params=["postgres", "sqlite"])
def log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Log]:
    if request.param == "postgres":
        yield from _postgres_log(request.getfixturevalue("database_url"))
    else:
        yield from _sqlite_log(tmp_path)


@pytest.fixture
def pg_log(database_url: str) -> Iterator[Log]:
    yield from _postgres_log(database_url)


@pytest.fixture
def seen() -> Iterator[list[tuple[str, Mapping[str, Any]]]]:
    """Every standby and subscribed telemetry event, in order."""
    events: list[tuple[str, Mapping[str, Any]]] = []
    handler_id = f"test-{uuid.uuid4().hex}"
    for name in ("scriba.source.standby", "scriba.source.subscribed"):
        telemetry.attach(handler_id, name, lambda n, _m, meta: events.append((n, meta)))
    yield events
    telemetry.detach(handler_id)


async def read_all(source: NotificationLogSource, limit: int = 100) -> list[Event]:
    """Read until a read returns nothing."""
    events: list[Event] = []
    while batch := await source.read(limit):
        events.extend(batch)
    return events


ORDERS = ProjectionKey("orders")


def _holding(source: NotificationLogSource) -> bool:
    # A function, so that mypy does not narrow the property across awaits.
    return source.holding


@pytest.mark.asyncio
async def test_events_come_in_notification_order_decoded(log: Log) -> None:
    orders = log.place(5, ship=True)
    source = log.source()
    await source.subscribe(ORDERS, after=0)
    events = await read_all(source, limit=3)
    await source.close()

    assert [e.position for e in events] == list(range(1, 11))
    assert [e.stream_id for e in events[:2]] == [str(orders[0].id)] * 2
    assert [e.type for e in events[:2]] == ["Order.Placed", "Order.Shipped"]
    assert events[0].id == f"{orders[0].id}:1"
    assert events[1].id == f"{orders[0].id}:2"
    placed = events[0].data
    assert type(placed).__qualname__ == "Order.Placed"
    assert placed.sku == "sku-0"
    assert events[0].occurred_at == placed.timestamp
    assert events[0].occurred_at.tzinfo is not None
    assert events[1].metadata == {
        "topic": f"{Order.__module__}:Order.Shipped",
        "originator_version": 2,
    }


@pytest.mark.asyncio
async def test_resumes_after_the_position_given(log: Log) -> None:
    log.place(6)
    source = log.source()
    await source.subscribe(ORDERS, after=4)
    events = await read_all(source)
    await source.close()
    assert [e.position for e in events] == [5, 6]


@pytest.mark.asyncio
async def test_a_read_returns_at_most_limit_and_the_next_one_continues(log: Log) -> None:
    log.place(7)
    source = log.source()
    await source.subscribe(ORDERS, after=0)
    sizes: list[int] = []
    positions: list[int] = []
    while batch := await source.read(3):
        sizes.append(len(batch))
        positions.extend(e.position for e in batch)
    log.place(2)  # arrive later: the same subscription sees them
    positions.extend(e.position for e in await read_all(source))
    await source.close()
    assert sizes == [3, 3, 1]
    assert positions == list(range(1, 10))


@pytest.mark.asyncio
async def test_without_a_mapper_data_is_the_stored_state(log: Log) -> None:
    log.place(1)
    source = NotificationLogSource(log.app.recorder, poll_interval=0.01)
    await source.subscribe(ORDERS, after=0)
    (event_,) = await read_all(source)
    await source.close()
    assert isinstance(event_.data, bytes)
    assert b"sku-0" in event_.data


@pytest.mark.asyncio
async def test_an_event_that_cannot_be_decoded_stops_the_source_there(log: Log) -> None:
    log.place(1)
    stored = log.stored()
    broken = StoredEvent(stored.originator_id, 1, "tests.nowhere:Gone", stored.state)
    log.app.recorder.insert_events([broken])
    source = log.source()
    await source.subscribe(ORDERS, after=0)
    assert [e.position for e in await source.read(1)] == [1]
    with pytest.raises(EventDecodeError) as raised:
        await source.read(10)
    assert raised.value.position == 2
    await source.close()


@pytest.mark.asyncio
async def test_acknowledging_past_what_was_read_is_refused(log: Log) -> None:
    log.place(3)
    source = log.source()
    await source.subscribe(ORDERS, after=0)
    await source.read(2)
    await source.acknowledge(1)
    await source.acknowledge(2)
    with pytest.raises(ValueError, match="only events up to 2"):
        await source.acknowledge(3)
    assert source.acknowledged == 2
    await source.close()


@pytest.mark.asyncio
async def test_a_cancelled_read_loses_nothing(log: Log) -> None:
    log.place(4)
    source = log.source()
    await source.subscribe(ORDERS, after=0)
    task = asyncio.create_task(source.read(10))
    await asyncio.sleep(0)  # the read is now in its worker thread
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    events = await read_all(source)
    await source.close()
    assert [e.position for e in events] == [1, 2, 3, 4]


def test_only_the_postgresql_and_sqlite_recorders_are_read() -> None:
    with pytest.raises(TypeError, match="POPOApplicationRecorder"):
        NotificationLogSource(POPOApplicationRecorder())


@pytest.mark.asyncio
async def test_reading_before_subscribing_is_an_error(log: Log) -> None:
    source = log.source()
    with pytest.raises(SourceError, match="before subscribe"):
        await source.read(1)
    with pytest.raises(ValueError, match="limit"):
        await source.read(0)


# --- gaps ----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_postgresql_a_straggler_holds_reading_back_until_it_commits(pg_log: Log) -> None:
    """A lower notification id committing after a higher one is visible: the source
    stops before the gap, and delivers both in order once the straggler commits."""
    assert pg_log.url is not None
    pg_log.place(2)
    source = pg_log.source()
    await source.subscribe(ORDERS, after=0)
    assert [e.position for e in await read_all(source)] == [1, 2]

    first, second = pg_log.stored(), pg_log.stored()
    with (
        psycopg.connect(pg_log.url) as straggler,
        psycopg.connect(pg_log.url, autocommit=True) as other,
    ):
        row = straggler.execute(
            _insert_sql(pg_log.table),
            [first.originator_id, 1, first.topic, first.state],
        ).fetchone()
        assert row == (3,)  # drawn, not committed
        other.execute(
            _insert_sql(pg_log.table), [second.originator_id, 1, second.topic, second.state]
        )  # 4 commits and is visible
        for _ in range(3):
            assert await source.read(10) == []  # never 4 while 3 may still come
        straggler.commit()
        events = await read_all(source)
    await source.close()
    assert [e.position for e in events] == [3, 4]
    assert [e.stream_id for e in events] == [str(first.originator_id), str(second.originator_id)]


@pytest.mark.asyncio
async def test_postgresql_a_rolled_back_gap_is_passed_once_its_writer_ended(pg_log: Log) -> None:
    assert pg_log.url is not None
    stored, later = pg_log.stored(), pg_log.stored()
    with psycopg.connect(pg_log.url) as aborted, psycopg.connect(pg_log.url, autocommit=True) as c:
        aborted.execute(
            _insert_sql(pg_log.table), [stored.originator_id, 1, stored.topic, stored.state]
        )
        c.execute(_insert_sql(pg_log.table), [later.originator_id, 1, later.topic, later.state])
        source = pg_log.source()
        await source.subscribe(ORDERS, after=0)
        assert await source.read(10) == []
        aborted.rollback()
        events = await read_all(source)
    await source.close()
    assert [e.position for e in events] == [2]


@pytest.mark.asyncio
async def test_old_gaps_do_not_slow_a_catch_up(log: Log) -> None:
    """Gaps whose writers are long gone (here: rows deleted) are passed in one read."""
    log.place(10)
    if log.kind == "postgres":
        assert log.url is not None
        with psycopg.connect(log.url, autocommit=True) as conn:
            conn.execute(f"DELETE FROM {log.table} WHERE notification_id IN (3, 4, 7)")
    else:
        with log.app.recorder.datastore.transaction(commit=True) as cursor:  # type: ignore[attr-defined]
            cursor.execute(f"DELETE FROM {log.table} WHERE rowid IN (3, 4, 7)")
    source = log.source()
    await source.subscribe(ORDERS, after=0)
    events = await source.read(100)
    await source.close()
    assert [e.position for e in events] == [1, 2, 5, 6, 8, 9, 10]


# --- one reader per projection -------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_second_subscription_stands_by_and_takes_over_on_release(
    log: Log, seen: list[tuple[str, Mapping[str, Any]]]
) -> None:
    log.place(3)
    holder, standby = log.source(), log.source()
    await holder.subscribe(ORDERS, after=0)
    await standby.subscribe(ORDERS, after=1)
    assert holder.holding
    assert not _holding(standby)
    for _ in range(3):
        assert await standby.read(10) == []
    assert [e.position for e in await read_all(holder)] == [1, 2, 3]
    # Another version of the same name is another projection: no contention.
    other_version = log.source()
    await other_version.subscribe(ProjectionKey("orders", 2), after=0)
    assert other_version.holding
    await other_version.close()

    await holder.close()
    assert [e.position for e in await read_all(standby)] == [2, 3]
    assert _holding(standby)
    await standby.close()
    source_name = {"source": "eventsourcing", "name": "orders"}
    assert [(n, {k: m[k] for k in ("source", "name")}) for n, m in seen] == [
        ("scriba.source.subscribed", source_name),
        ("scriba.source.standby", source_name),  # once for the whole standby period
        ("scriba.source.subscribed", source_name),  # version 2
        ("scriba.source.subscribed", source_name),  # the takeover
    ]
    assert [m["after"] for n, m in seen if n == "scriba.source.subscribed"] == [0, 0, 1]
    assert [m["version"] for n, m in seen if n == "scriba.source.subscribed"] == [1, 2, 1]


@pytest.mark.asyncio
async def test_postgresql_a_holder_whose_connection_dies_is_replaced(pg_log: Log) -> None:
    """The server releases the advisory lock of a dead connection; the standby takes
    over, and the old holder learns it lost the projection on its next read."""
    assert pg_log.url is not None
    pg_log.place(2)
    holder = pg_log.source(lock_check_interval=0.0)
    standby = pg_log.source()
    await holder.subscribe(ORDERS, after=0)
    await standby.subscribe(ORDERS, after=0)
    assert await standby.read(10) == []
    lock = holder.lock
    assert isinstance(lock, AdvisoryLock)
    assert lock.backend_pid is not None
    with psycopg.connect(pg_log.url, autocommit=True) as admin:
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
    """The kernel drops the flock of a killed process; the standby takes over."""
    for log in _sqlite_log(tmp_path):
        log.place(2)
        db_name = log.app.recorder.datastore.pool.db_name  # type: ignore[attr-defined]
        lock_file = lock_path_beside(db_name, ORDERS)
        holder = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _HOLD_FLOCK, str(lock_file), stdout=subprocess.PIPE
        )
        try:
            assert holder.stdout is not None
            assert await holder.stdout.readline() == b"held\n"
            standby = log.source()
            await standby.subscribe(ORDERS, after=0)
            assert await standby.read(10) == []
            assert not _holding(standby)
            os.kill(holder.pid, signal.SIGKILL)
            await holder.wait()
            assert [e.position for e in await read_all(standby)] == [1, 2]
            await standby.close()
        finally:
            if holder.returncode is None:
                holder.kill()
                await holder.wait()


def test_the_postgresql_recorder_type_is_what_the_fixture_builds(pg_log: Log) -> None:
    assert isinstance(pg_log.app.recorder, PostgresApplicationRecorder)
