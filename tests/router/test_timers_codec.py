"""Timer payloads under the configuration's blob codec, on both databases: the event's
data is not readable in the timers table, the worker fires the timer with its data,
and a queue without the codec refuses the sealed row, typed."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from tests.router.conftest import RouterDb
from tests.router.test_timers import COUNT, LOCK_WAIT, SECOND, TICK, chart, create, entry, logged

from statifier.core import Event
from statifier.persistence import Storage, UndecodableBlob
from statifier.persistence.codec import SEALED
from statifier.persistence.fernet import FernetCodec
from statifier.router import RouterConfig, StaticResolver
from statifier.router.timer_worker import TimerWorker
from statifier.router.timers import SqlTimerQueue
from statifier.sql import migrations

MARKER = "TIMER-MARKER-3e8f"


def sealed_config(router_db: RouterDb, key: str) -> RouterConfig:
    storage = Storage(router_db.adapter, clock=router_db.clock, codec=FernetCodec([key]))
    return RouterConfig(
        storage,
        bindings=[],
        resolver=StaticResolver({"tick": chart(TICK), "count": chart(COUNT)}),
        lock_wait=LOCK_WAIT,
    )


@pytest.mark.asyncio
async def test_a_sealed_timer_payload_fires_with_its_data(router_db: RouterDb) -> None:
    key = FernetCodec.generate_key()
    config = sealed_config(router_db, key)
    assert isinstance(config.timers, SqlTimerQueue)
    assert config.timers.codec is config.storage.codec
    await create(config, "tick", "ex_1")
    now = router_db.clock.now
    secret = Event("tick", data={"card": MARKER})
    async with config.transaction() as unit:
        await config.timers.schedule(unit.tx, entry("ex_1", 1, now + SECOND, event=secret))

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
    async with config.transaction() as unit:
        with pytest.raises(UndecodableBlob, match="the payload of timer 't1' of 'ex_1'"):
            await plain.claim(unit.tx, now + SECOND, 10)

    assert await TimerWorker(config).fire_due(now + SECOND) == 1
    assert await logged(config, "ex_1") == [("timer", "tick", {"card": MARKER})]
