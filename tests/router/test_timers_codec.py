"""Timer payloads under the configuration's blob codec, on both databases: the event's
data is not readable in the timers table, the worker fires the timer with its data,
and a queue without the codec refuses the sealed row, typed."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from tests.router.conftest import RouterDb
from tests.router.test_timers import (
    COUNT,
    LOCK_WAIT,
    SECOND,
    TICK,
    chart,
    create,
    entry,
    logged,
)

from statifier import telemetry
from statifier.core import Event
from statifier.persistence import Storage, UndecodableBlob
from statifier.persistence.codec import SEALED
from statifier.persistence.fernet import FernetCodec
from statifier.router import Router, RouterConfig, StaticResolver
from statifier.router.timer_worker import TimerWorker
from statifier.router.timers import SqlTimerQueue, UnreadableTimer
from statifier.sql import migrations

MARKER = "TIMER-MARKER-3e8f"
TIMER_EVENT = "statifier.router.timer"


def sealed_router(router_db: RouterDb, *keys: str) -> Router:
    """The timer router sealing with the first of ``keys``, opening with any."""
    storage = Storage(router_db.adapter, clock=router_db.clock, codec=FernetCodec(list(keys)))
    return Router(
        RouterConfig(
            storage,
            bindings=[],
            resolver=StaticResolver({"tick": chart(TICK), "count": chart(COUNT)}),
            lock_wait=LOCK_WAIT,
        )
    )


@pytest.mark.asyncio
async def test_a_sealed_timer_payload_fires_with_its_data(router_db: RouterDb) -> None:
    key = FernetCodec.generate_key()
    router = sealed_router(router_db, key)
    assert isinstance(router.timers, SqlTimerQueue)
    assert router.timers.codec is router.storage.codec
    await create(router, "tick", "ex_1")
    now = router_db.clock.now
    secret = Event("tick", data={"card": MARKER})
    async with router.transaction() as unit:
        await router.timers.schedule(unit.tx, entry("ex_1", 1, now + SECOND, event=secret))

    table = router_db.store.tables.timers
    engine = sa.create_engine(migrations.sync_url(router_db.store.url))
    try:
        with engine.connect() as connection:
            (payload,) = connection.execute(sa.select(table.c.payload)).one()
    finally:
        engine.dispose()
    assert list(payload) == [SEALED]
    assert MARKER not in str(payload)

    # A queue without the codec cannot read the row: refused, typed, naming the timer.
    plain = SqlTimerQueue(router_db.adapter)
    with pytest.raises(UndecodableBlob, match="the payload of timer 't1' of 'ex_1'"):
        async with router.transaction() as unit:  # rolled back: the row stays
            await plain.take_due(unit.tx, now + SECOND, 10)
    async with router.transaction() as unit:
        [unreadable] = await plain.claim(unit.tx, now + SECOND, 10)
    assert isinstance(unreadable, UnreadableTimer)
    assert (unreadable.execution_id, unreadable.send_id) == ("ex_1", "t1")
    assert "the payload of timer 't1' of 'ex_1'" in str(unreadable.error)

    assert await TimerWorker(router).fire_due(now + SECOND) == 1
    assert await logged(router, "ex_1") == [("timer", "tick", {"card": MARKER})]


@pytest.mark.asyncio
async def test_a_timer_sealed_under_a_missing_key_waits_and_the_others_fire(
    router_db: RouterDb,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker whose codec lacks the key of one row fires every other due timer, keeps
    that row (due again ``retry`` later, reported as failed), and fires it once a
    worker with the key runs."""
    key, other = FernetCodec.generate_key(), FernetCodec.generate_key()
    router = sealed_router(router_db, key)
    assert router.timers is not None
    await create(router, "count", "ex_1", "ex_2")
    now = router_db.clock.now
    elsewhere = SqlTimerQueue(router_db.adapter, FernetCodec([other]))
    async with router.transaction() as unit:
        await elsewhere.schedule(unit.tx, entry("ex_1", 1, now))
        await router.timers.schedule(unit.tx, entry("ex_2", 2, now))
        await router.timers.schedule(unit.tx, entry("ex_2", 3, now))

    reports: list[dict[str, Any]] = []
    telemetry.attach("codec_test", TIMER_EVENT, lambda _, m, meta: reports.append({**m, **meta}))
    try:
        assert await TimerWorker(router, retry=30).fire_due(now) == 2
    finally:
        telemetry.detach("codec_test")
    assert [data["k"] for _, _, data in await logged(router, "ex_2")] == [2, 3]
    assert await logged(router, "ex_1") == []
    [failed] = [r for r in reports if r["outcome"] == "failed"]
    assert (failed["execution_id"], failed["send_id"]) == ("ex_1", "t1")
    assert "UndecodableBlob" in failed["error"]
    assert await TimerWorker(router).next_due() == now + 30 * SECOND  # kept, put off
    [said] = [r for r in caplog.records if "cannot be read here" in r.getMessage()]
    assert said.levelname == "WARNING"
    assert "'t1' of execution ex_1" in said.getMessage()

    both = sealed_router(router_db, key, other)
    assert await TimerWorker(both).fire_due(now + 30 * SECOND) == 1
    assert [data["k"] for _, _, data in await logged(both, "ex_1")] == [1]
