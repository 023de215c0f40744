"""The one JSON rule on the stream sources, through the consumer runtime, on both
databases: every kind of poisoned message read from Kafka (a Tansu broker), NATS
JetStream and the inbound-events table is dead-lettered at once as malformed, its
reason naming the rule, and its partition moves on: the good message after them is
routed and every position is committed."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import nats
import pytest
import pytest_asyncio
import sqlalchemy as sa
from nats.js.api import StreamConfig
from sqlalchemy.dialects.postgresql import JSONB
from tests.fronts.kafka_broker import (  # noqa: F401 - the fixture
    FAST_GROUP,
    KafkaBroker,
    committed,
    create_topic,
    kafka_broker,
    produce,
    unique,
)
from tests.fronts.nats_server import NatsServer, nats_server  # noqa: F401 - the fixture
from tests.fronts.test_consumer import Flaky, router_of
from tests.router.conftest import RouterDb
from tests.router.racing_router import SOURCE

from statifier.fronts.consumer import StreamConsumer
from statifier.fronts.dead_letters import DeadLetterEntry, TableDeadLetters
from statifier.fronts.kafka import KafkaSource
from statifier.fronts.leases import PartitionLeases
from statifier.fronts.nats import JetStreamSource
from statifier.fronts.source import Source
from statifier.fronts.table_source import TableSource
from statifier.router import ledger
from statifier.sql import migrations

HEAD = b'{"kind": "hit", "key": "a", "n": '
POISONED = [
    (HEAD + b"1e999999}", "a non-finite number (out of range) at position 33"),
    (HEAD + b"NaN}", "a non-finite number (NaN) at position 33"),
    (HEAD + b"-Infinity}", "a non-finite number (-Infinity) at position 33"),
    (HEAD + b'"\\ud800"}', "a lone surrogate U+D800 at position 34"),
    (HEAD + b'"\xed\xa0\x80"}', "a lone surrogate U+D800 at position 34"),
    (HEAD + b"[" * 900 + b"]" * 900 + b"}", "nesting deeper than 128 at position 160"),
]
GOOD = b'{"kind": "hit", "key": "a", "message_id": "good"}'


async def consume(
    router_db: RouterDb,
    source: Source,
    letters: int,
    done: Callable[[], Awaitable[bool]] | None = None,
) -> list[DeadLetterEntry]:
    """Run a consumer over ``source`` until the good message is routed, ``letters``
    dead letters are kept and ``done()`` holds (60 s at most); answers the dead
    letters by position."""
    router = router_of(router_db, Flaky())
    dead = TableDeadLetters(router_db.adapter)
    consumer = StreamConsumer(router, source, malformed=dead, commit_interval=0.05, poll=0.05)
    running = asyncio.create_task(consumer.run())
    try:
        async with asyncio.timeout(60):
            while True:
                routed = await ledger(router)
                entries = await dead.entries()
                if routed and len(entries) >= letters and (done is None or await done()):
                    break
                await asyncio.sleep(0.1)
    finally:
        await consumer.stop()
        await running
    assert [row.outcome for row in await ledger(router)] == ["created_and_delivered"]
    return sorted(entries, key=lambda entry: entry.position)


def assert_named(entries: Sequence[DeadLetterEntry], what: str, rules: Sequence[str]) -> None:
    assert [entry.reason for entry in entries] == [
        f"malformed: the {what} is not JSON: {rule}" for rule in rules
    ]


@pytest.mark.asyncio
async def test_kafka_dead_letters_each_rule_and_reads_on(
    kafka_broker: KafkaBroker,  # noqa: F811 - the fixture
    router_db: RouterDb,
) -> None:
    topic, group = unique("rules"), unique("g")
    create_topic(kafka_broker, topic, 1)
    produce(kafka_broker, topic, [(b"a", value) for value, _ in POISONED] + [(b"a", GOOD)])
    source = KafkaSource(
        kafka_broker.bootstrap,
        group=group,
        topics=[topic],
        source=SOURCE,
        scope="acme",
        settings=FAST_GROUP,
    )
    ends = {0: len(POISONED) + 1}

    async def all_committed() -> bool:
        return await asyncio.to_thread(committed, kafka_broker, group, topic, 1) == ends

    letters = await consume(router_db, source, len(POISONED), all_committed)
    assert_named(letters, "value", [rule for _, rule in POISONED])
    assert [letter.raw for letter in letters] == [value for value, _ in POISONED]


@pytest_asyncio.fixture
async def subjects(nats_server: NatsServer) -> AsyncIterator[tuple[str, str]]:  # noqa: F811
    """A stream of the test's own and its subject prefix."""
    client = await nats.connect(nats_server.url)
    js = client.jetstream()
    token = uuid.uuid4().hex[:8]
    name, prefix = f"rules_{token}", f"rules.{token}"
    await js.add_stream(StreamConfig(name=name, subjects=[f"{prefix}.*"]))
    try:
        yield name, prefix
    finally:
        await js.delete_stream(name)
        await client.close()


@pytest.mark.asyncio
async def test_nats_dead_letters_each_rule_and_reads_on(
    nats_server: NatsServer,  # noqa: F811 - the fixture
    subjects: tuple[str, str],
    router_db: RouterDb,
) -> None:
    name, prefix = subjects
    client = await nats.connect(nats_server.url)
    try:
        js = client.jetstream()
        for value, _ in POISONED:
            await js.publish(f"{prefix}.p0", value)
        last = (await js.publish(f"{prefix}.p0", GOOD)).seq
        leases = PartitionLeases(
            router_db.adapter, group="rules", partitions=["p0"], owner="a", ttl=10.0
        )
        source = JetStreamSource(
            nats_server.url,
            leases,
            stream=name,
            subject_prefix=prefix,
            scope="acme",
            source=SOURCE,
            pull_wait=0.3,
        )
        letters = await consume(router_db, source, len(POISONED))
        info = await js.consumer_info(name, "rules-p0")  # committed as the consumer stopped
    finally:
        await client.close()
    assert info.ack_floor is not None
    assert info.ack_floor.stream_seq == last
    assert_named(letters, "payload", [rule for _, rule in POISONED])


def put_rows(router_db: RouterDb, documents: Sequence[str]) -> None:
    """Rows written past ``append_events`` (which refuses these): each document as the
    database stores it, at positions 1, 2, ... of partition ``0``."""
    table = router_db.store.tables.inbound_events
    given = sa.bindparam("document", type_=sa.Text)
    data = sa.cast(given, JSONB) if router_db.backend == "postgresql" else given
    engine = sa.create_engine(migrations.sync_url(router_db.store.url))
    try:
        with engine.begin() as connection:
            for position, document in enumerate(documents, start=1):
                statement = table.insert().values(
                    partition="0",
                    position=position,
                    scope="acme",
                    source=SOURCE,
                    message_id=f"m{position}",
                    data=data,
                    appended_at=router_db.clock(),
                )
                connection.execute(statement, {"document": document})
    finally:
        engine.dispose()


@pytest.mark.asyncio
async def test_the_table_source_dead_letters_each_rule_and_reads_on(router_db: RouterDb) -> None:
    deep = '{"n": ' + "[" * 900 + "]" * 900 + "}"
    rows: list[tuple[str, str]] = []
    if router_db.backend == "sqlite":
        # jsonb holds no lone surrogate and no number that is not finite (1e400 is
        # written back as its digits): on PostgreSQL only the depth is left to refuse.
        rows += [
            # The driver hands text over, which Python's parser reads into infinity
            # and NaN: the rule refuses them as written again.
            ('{"n": 1e999999}', "a non-finite number (Infinity) at position 6"),
            ('{"n": NaN}', "a non-finite number (NaN) at position 6"),
            ('{"k": "\\ud800"}', "a lone surrogate U+D800 at position 7"),
            ('{"n": ' + "[" * 5000 + "]" * 5000 + "}", "nesting deeper than 128 at position 133"),
            ("{oops", "unexpected byte 0x6F at position 1"),
        ]
    rows.append((deep, "nesting deeper than 128 at position 133"))
    put_rows(router_db, [text for text, _ in rows] + [GOOD.decode()])
    source = TableSource(router_db.adapter, group="rules", partitions=["0"])
    letters = await consume(router_db, source, len(rows))
    check = TableSource(router_db.adapter, group="rules", partitions=["0"])
    assert await check.committed() == {"0": len(rows) + 1}
    assert_named(letters, "data", [rule for _, rule in rows])
