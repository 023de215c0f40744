"""Retiring a key reaches the rows still waiting, on both databases: after
``rewrite_blobs`` with the new key first, a pending timer, an outbox row, an inbound
event and a dead letter sealed under the old key are all read with the new key alone."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from tests.fronts.test_codec_tables import first_message
from tests.router.conftest import RouterDb
from tests.router.test_timers import COUNT, LOCK_WAIT, TICK, chart, create, entry, logged

from statifier.core import Event
from statifier.fronts.dead_letters import DeadLetterEntry, TableDeadLetters
from statifier.fronts.source import Malformed
from statifier.fronts.table_source import append_events
from statifier.persistence import Storage, UndecodableBlob
from statifier.persistence.fernet import FernetCodec
from statifier.router import (
    InboundEvent,
    OutboxDrain,
    OutboxRoute,
    Router,
    RouterConfig,
    StaticResolver,
)
from statifier.router.outbox import OutboxMessage
from statifier.router.routes import IdempotencyKey
from statifier.router.timer_worker import TimerWorker
from statifier.sql.blobs import rewrite_blobs

KEY = IdempotencyKey("ex_1", send_id="book", macrostep=1, microstep=1, round=0,
                     content_index=0, ordinal=0)  # fmt: skip
RAW = b'{"pan": "4111"}'


def sealed(router_db: RouterDb, codec: FernetCodec) -> Router:
    return Router(
        RouterConfig(
            Storage(router_db.adapter, clock=router_db.clock, codec=codec),
            bindings=[],
            resolver=StaticResolver({"tick": chart(TICK), "count": chart(COUNT)}),
            lock_wait=LOCK_WAIT,
        )
    )


@pytest.mark.asyncio
async def test_a_rewrite_moves_the_waiting_rows_to_the_new_key(router_db: RouterDb) -> None:
    old, new = FernetCodec.generate_key(), FernetCodec.generate_key()
    under_old = FernetCodec([old])
    router = sealed(router_db, under_old)
    assert router.timers is not None
    await create(router, "count", "ex_1")
    now = router_db.clock.now
    async with router.transaction() as unit:
        await router.timers.schedule(unit.tx, entry("ex_1", 1, now))
    event = Event("pickup.requested", data={"card": "4111"}, sendid="book")
    route = OutboxRoute(router_db.adapter, codec=under_old)
    await route.hand_off(None, "pickups", KEY, event, now=now)
    inbound = InboundEvent(scope="shop", source="cards", message_id="m-1", data={"pan": "4111"})
    await append_events(router_db.adapter, [inbound], partition="a", codec=under_old)
    at = datetime(2026, 1, 1, tzinfo=UTC)
    letter = DeadLetterEntry("cards", "0", 7, "m-9", "malformed: no scope", RAW, at)
    await TableDeadLetters(router_db.adapter, under_old).put(letter)

    under_new = FernetCodec([new])
    # Before the rewrite the new key alone cannot read them.
    assert isinstance((await first_message(router_db, "g", under_new)).event, Malformed)
    with pytest.raises(UndecodableBlob):
        await TableDeadLetters(router_db.adapter, under_new).entries()

    store = router_db.store
    counts = await asyncio.to_thread(
        rewrite_blobs, store.url, FernetCodec([new, old]).rotate, store.tables
    )
    waiting = ("timers.payload", "outbox.payload.event", "inbound_events.data")
    assert [counts[name] for name in (*waiting, "consumer_dead_letters.raw")] == [1, 1, 1, 1]

    later = sealed(router_db, under_new)
    assert await TimerWorker(later).fire_due(now) == 1
    assert [data["k"] for _, _, data in await logged(later, "ex_1")] == [1]
    seen: list[OutboxMessage] = []
    report = await OutboxDrain(later.storage, {"pickups": seen.append}).drain_once()
    assert (report.claimed, report.sent) == (1, 1)
    assert [(m.event.name, m.event.data) for m in seen] == [("pickup.requested", {"card": "4111"})]
    read = (await first_message(router_db, "g", under_new)).event
    assert isinstance(read, InboundEvent)
    assert read.data == {"pan": "4111"}
    [kept] = await TableDeadLetters(router_db.adapter, under_new).entries()
    assert kept.raw == RAW
