"""The fronts' tables under a blob codec, on both databases: inbound events appended
sealed are handed over decoded (and one the source cannot decode comes over malformed),
and dead letters keep their raw bytes encoded."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from tests.router.conftest import RouterDb

from statifier.fronts.dead_letters import DeadLetterEntry, TableDeadLetters
from statifier.fronts.source import Malformed, Message
from statifier.fronts.table_source import TableSource, append_events
from statifier.persistence import UndecodableBlob
from statifier.persistence.codec import PLAIN, SEALED, BlobCodec
from statifier.persistence.fernet import FernetCodec
from statifier.router import InboundEvent
from statifier.sql import migrations

MARKER = "INBOUND-MARKER-a07d"


class Quiet:
    async def assigned(self, partitions: Any) -> None:
        pass

    async def revoked(self, partitions: Any) -> None:
        pass


def column(router_db: RouterDb, table: sa.Table, name: str) -> list[Any]:
    engine = sa.create_engine(migrations.sync_url(router_db.store.url))
    try:
        with engine.connect() as connection:
            return [row[0] for row in connection.execute(sa.select(table.c[name]))]
    finally:
        engine.dispose()


async def first_message(router_db: RouterDb, group: str, codec: BlobCodec = PLAIN) -> Message:
    """The one message partition ``a`` holds, as ``group`` reads it with ``codec``."""
    source = TableSource(router_db.adapter, group=group, partitions=["a"], codec=codec)
    await source.start(Quiet())
    try:
        (message,) = await source.fetch(10, wait=0.1)
    finally:
        await source.close()
    return message


@pytest.mark.asyncio
async def test_sealed_inbound_events_are_handed_over_decoded(router_db: RouterDb) -> None:
    codec = FernetCodec([FernetCodec.generate_key()])
    event = InboundEvent(scope="shop", source="cards", message_id="m-1", data={"pan": MARKER})
    await append_events(router_db.adapter, [event], partition="a", codec=codec)
    (data,) = column(router_db, router_db.store.tables.inbound_events, "data")
    assert list(data) == [SEALED]
    assert MARKER not in str(data)

    message = await first_message(router_db, "g", codec)
    assert isinstance(message.event, InboundEvent)
    assert message.event.data == {"pan": MARKER}

    # Read without the codec: malformed (the consumer dead-letters it), not plaintext.
    unread = await first_message(router_db, "other")
    assert isinstance(unread.event, Malformed)
    assert "inbound event a/1 is encoded, and no codec was given" in unread.event.reason
    assert MARKER.encode() not in unread.raw


@pytest.mark.asyncio
async def test_dead_letters_keep_their_raw_bytes_encoded(router_db: RouterDb) -> None:
    codec = FernetCodec([FernetCodec.generate_key()])
    letter = DeadLetterEntry(
        "cards", "0", 7, "m-1", "malformed: no scope", f'{{"pan": "{MARKER}"}}'.encode(),
        datetime(2026, 1, 1, tzinfo=UTC),
    )  # fmt: skip
    table = TableDeadLetters(router_db.adapter, codec)
    await table.put(letter)
    (raw,) = column(router_db, router_db.store.tables.consumer_dead_letters, "raw")
    assert MARKER.encode() not in bytes(raw)
    assert await table.entries() == [letter]
    other = TableDeadLetters(router_db.adapter, FernetCodec([FernetCodec.generate_key()]))
    with pytest.raises(UndecodableBlob, match="the dead letter of cards at 0/7"):
        await other.entries()
