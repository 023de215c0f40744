"""Outbox rows under a blob codec, on both databases: the event's data is not readable
in the outbox table, the drain hands the sink the decoded event, a drain without the
codec dead-letters the row as unreadable, and a configuration's codec reaches its drain
and its BasicHTTP-free routes alike."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from tests.router.conftest import RouterDb

from statifier.core import Event
from statifier.persistence import Storage
from statifier.persistence.codec import SEALED
from statifier.persistence.fernet import FernetCodec
from statifier.router import OutboxDrain, OutboxRoute, Router, RouterConfig, StaticResolver
from statifier.router.outbox import OutboxMessage
from statifier.router.routes import IdempotencyKey
from statifier.sql import migrations

MARKER = "OUTBOX-MARKER-c41a"
KEY = IdempotencyKey("ex_1", send_id="book", macrostep=1, microstep=1, round=0,
                     content_index=0, ordinal=0)  # fmt: skip


def stored_payloads(router_db: RouterDb) -> list[Any]:
    table = router_db.store.tables.outbox
    engine = sa.create_engine(migrations.sync_url(router_db.store.url))
    try:
        with engine.connect() as connection:
            return [row[0] for row in connection.execute(sa.select(table.c.payload))]
    finally:
        engine.dispose()


@pytest.mark.asyncio
async def test_a_sealed_outbox_row_reaches_its_sink_decoded(router_db: RouterDb) -> None:
    codec = FernetCodec([FernetCodec.generate_key()])
    route = OutboxRoute(router_db.adapter, codec=codec)
    event = Event("pickup.requested", data={"card": MARKER}, sendid="book")
    async with router_db.adapter.transaction() as tx:
        await route.deliver({"queue": "pickups"}, event, KEY, tx)

    (payload,) = stored_payloads(router_db)
    assert MARKER not in str(payload)
    assert payload["key"] == str(KEY)  # what is looked up stays plain
    assert SEALED in payload["event"]

    config = RouterConfig(
        Storage(router_db.adapter, codec=codec),
        bindings=[],
        resolver=StaticResolver({}),
    )
    router = Router(config)
    seen: list[OutboxMessage] = []
    drain = OutboxDrain(router.storage, {"pickups": seen.append})  # the configuration's codec
    assert drain.codec is codec
    (listed,) = await drain.pending()
    assert listed.event.data == {"card": MARKER}
    report = await drain.drain_once()
    assert (report.claimed, report.sent) == (1, 1)
    assert [(m.key, m.event.name, m.event.data) for m in seen] == [
        (str(KEY), "pickup.requested", {"card": MARKER})
    ]


@pytest.mark.asyncio
async def test_a_drain_without_the_codec_dead_letters_the_row(router_db: RouterDb) -> None:
    codec = FernetCodec([FernetCodec.generate_key()])
    event = Event("pickup.requested", data={"card": MARKER}, sendid="book")
    await OutboxRoute(router_db.adapter, codec=codec).hand_off(None, "pickups", KEY, event)
    called: list[OutboxMessage] = []
    plain = OutboxDrain(router_db.adapter, {"pickups": called.append})
    report = await plain.drain_once()
    assert (report.claimed, report.dead) == (1, 1)
    assert called == []
    (dead,) = await OutboxDrain(router_db.adapter, {}, codec=codec).dead_letters()
    assert dead.last_error == (
        f"the payload is unreadable: the event of outbox row {str(KEY)!r} is encoded, "
        "and no codec was given"
    )
    assert dead.event.data == {"card": MARKER}  # read back with the codec
