"""NotificationLogSource on eventsourcing's PostgreSQL and SQLite recorders: what it
makes of a notification. What it shares with the other source is tested in
test_source_subscription.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from eventsourcing.persistence import StoredEvent
from eventsourcing.popo import POPOApplicationRecorder
from eventsourcing.postgres import PostgresApplicationRecorder
from tests.scriba import source_logs as logs
from tests.scriba.source_logs import ORDERS, Log, Order, read_all

from scriba.sources import EventDecodeError, NotificationLogSource


@pytest.fixture(params=["postgres", "sqlite"])
def log(request: pytest.FixtureRequest) -> Iterator[Log]:
    yield from logs.open_log(request.param, request)


@pytest.fixture
def pg_log(request: pytest.FixtureRequest) -> Iterator[Log]:
    yield from logs.open_log("postgres", request)


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


def test_the_postgresql_recorder_type_is_what_the_fixture_builds(pg_log: Log) -> None:
    assert isinstance(pg_log.app.recorder, PostgresApplicationRecorder)
