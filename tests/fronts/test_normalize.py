"""Streams that do not carry JSON objects: a host's decode and normalize on every stream
source. What a decode answers is held to JSON values (bytes, datetimes, NaN, deep
nesting and oversize data refused with the reason named); a decode or a normalize that
raises makes the message malformed, naming the exception. Avro records on the suite's
Kafka broker are routed end to end through a consumer, a poison record between them
dead-lettered as malformed with the decoding error while the records after it are
routed; NATS and the inbound-events table read scope and message id from an envelope."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast

import fastavro
import pytest
from tests.fronts.kafka_broker import (
    FAST_GROUP,
    KafkaBroker,
    committed,
    create_topic,
    kafka_broker,  # noqa: F401 - the fixture
    produce,
    unique,
)
from tests.fronts.nats_server import nats_server  # noqa: F401 - the fixture
from tests.fronts.test_consumer import Flaky, router_of
from tests.fronts.test_nats import PARTITIONS, Stream, fetch_exactly, stream  # noqa: F401
from tests.router.conftest import RouterDb
from tests.router.racing_router import DOCUMENT, SOURCE
from tests.router.test_races import count_of, logged_messages

from statifier.expr import Value
from statifier.fronts.consumer import StreamConsumer
from statifier.fronts.dead_letters import TableDeadLetters
from statifier.fronts.kafka import KafkaRecord, KafkaSource, header_scope
from statifier.fronts.leases import PartitionLeases
from statifier.fronts.nats import MESSAGE_ID_HEADER, JetStreamSource, NatsRecord
from statifier.fronts.normalize import Normalized, decoded, normalized_event
from statifier.fronts.source import Malformed, stored_object
from statifier.fronts.table_source import TableSource, append_events
from statifier.router import ConfigError, InboundEvent, address, ledger
from statifier.sql.inbound import EventRow

HIT = fastavro.parse_schema(
    {
        "type": "record",
        "name": "Hit",
        "namespace": "tests.fronts",
        "fields": [
            {"name": "kind", "type": "string"},
            {"name": "key", "type": "string"},
            {"name": "message_id", "type": "string"},
        ],
    }
)
"""The schema both the producer and the source know (no registry: schemaless Avro)."""
POISON = b"not avro at all"
"""Bytes the Avro reader cannot read: ``n`` (0x6E) is a string length of 55."""


def avro(kind: str, key: str, message_id: str) -> bytes:
    written = io.BytesIO()
    fastavro.schemaless_writer(written, HIT, {"kind": kind, "key": key, "message_id": message_id})
    return written.getvalue()


def read_hit(payload: bytes) -> Mapping[str, object]:
    """One Avro ``Hit`` and nothing after it."""
    read = io.BytesIO(payload)
    record = fastavro.schemaless_reader(read, HIT, None)
    if read.tell() != len(payload):
        raise ValueError(f"{len(payload) - read.tell()} bytes after the record")
    assert isinstance(record, dict)
    return record


def by_id(record: KafkaRecord, data: dict[str, Value]) -> Normalized:
    return Normalized(data, message_id=str(data["message_id"]))


def answer(found: object) -> Malformed | dict[str, Value]:
    """What :func:`decoded` makes of a decode answering ``found``."""
    return decoded(
        b"payload", lambda _: cast("Mapping[str, object]", found), max_bytes=1_000, what="value"
    )


def nested(depth: int) -> list[object]:
    top: list[object] = []
    inner = top
    for _ in range(depth):
        deeper: list[object] = []
        inner.append(deeper)
        inner = deeper
    return top


# The value check.


def test_a_decoded_value_that_json_has_no_form_for_is_refused_naming_why() -> None:
    at = datetime(2026, 12, 2, tzinfo=UTC)
    refused = {
        "raw": (b"\x00\x01", "TypeError: Object of type bytes is not JSON serializable"),
        "at": (at, "TypeError: Object of type datetime is not JSON serializable"),
        "nan": (float("nan"), "a non-finite number (NaN) at position 8"),
        "inf": (float("-inf"), "a non-finite number (-Infinity) at position 8"),
        "odd": ("\ud800", "a lone surrogate U+D800 at position 9"),
        "deep": (nested(127), "nesting deeper than 128 at position 136"),
        "abyss": (
            nested(100_000),
            "RecursionError: maximum recursion depth exceeded while encoding a JSON object",
        ),
    }
    for name, (value, reason) in refused.items():
        assert answer({name: value}) == Malformed(f"the decoded value is not JSON: {reason}")
    assert answer([1, 2]) == Malformed("the decoded value is not a mapping: list")
    assert answer("{}") == Malformed("the decoded value is not a mapping: str")
    assert answer({"n": nested(126)}) == {"n": nested(126)}  # 128 deep: as deep as allowed
    # What JSON writes one way is taken that way: tuples are lists, number keys text.
    assert answer({"pair": (1, "é"), 7: None}) == {"pair": [1, "é"], "7": None}


def test_the_payload_is_bounded_before_decoding_and_the_data_after() -> None:
    calls: list[bytes] = []

    def counting(payload: bytes) -> Mapping[str, object]:
        calls.append(payload)
        return {"text": payload.decode()}

    assert decoded(b"x" * 11, counting, max_bytes=10, what="payload") == Malformed(
        "a payload of 11 bytes, over the 10"
    )
    assert calls == []  # never decoded
    # {"text": "xxxx"} is 16 bytes of JSON text: the data a decode answers is bounded too.
    assert decoded(b"x" * 4, counting, max_bytes=10, what="payload") == Malformed(
        "a decoded payload of 16 bytes, over the 10"
    )
    assert decoded(b"x" * 4, counting, max_bytes=16, what="payload") == {"text": "xxxx"}


def test_a_decode_that_raises_makes_the_message_malformed_naming_the_error() -> None:
    assert decoded(POISON, read_hit, max_bytes=1_000, what="value") == Malformed(
        "the value could not be decoded: EOFError: Expected 55 bytes, read 14"
    )
    trailing = avro("hit", "a", "m") + b"\x00"
    assert decoded(trailing, read_hit, max_bytes=1_000, what="value") == Malformed(
        "the value could not be decoded: ValueError: 1 bytes after the record"
    )
    assert decoded(avro("hit", "a", "m"), read_hit, max_bytes=1_000, what="value") == {
        "kind": "hit",
        "key": "a",
        "message_id": "m",
    }


def test_stored_object_names_the_writers_reason() -> None:
    assert stored_object({"at": b"x"}, what="data") == Malformed(
        "the data is not JSON: TypeError: Object of type bytes is not JSON serializable"
    )
    # Measured as UTF-8 (15 bytes), not as the escapes ASCII JSON would write (21).
    assert stored_object({"t": "日本"}, what="data", max_bytes=15) == {"t": "日本"}
    assert stored_object({"t": "日本"}, what="data", max_bytes=14) == Malformed(
        "a data of 15 bytes, over the 14"
    )


# The normalize hook.


def event_of(normalize: Any, data: dict[str, Value] | None = None) -> InboundEvent | Malformed:
    return normalized_event(
        "the record",
        {"n": 1} if data is None else data,
        normalize,
        scope="fixed",
        source="orders",
        message_id="orders/0/7",
        max_bytes=100,
    )


def test_normalize_answers_the_parts_and_what_it_leaves_none_is_the_sources() -> None:
    assert event_of(None) == InboundEvent(
        scope="fixed", source="orders", message_id="orders/0/7", data={"n": 1}
    )
    seen: list[object] = []

    def envelope(record: object, data: dict[str, Value]) -> Normalized:
        seen.append(record)
        return Normalized({"m": data["n"]}, scope="acme", message_id="e-1", source="shop")

    assert event_of(envelope) == InboundEvent(
        scope="acme", source="shop", message_id="e-1", data={"m": 1}
    )
    assert seen == ["the record"]
    assert event_of(lambda r, d: Normalized(d, message_id="e-2")) == InboundEvent(
        scope="fixed", source="orders", message_id="e-2", data={"n": 1}
    )
    no_scope = normalized_event(
        "r", {}, lambda r, d: Normalized(d), scope=None, source="s", message_id="m"
    )
    assert no_scope == Malformed("no scope: normalize answered none and the source has none")


def test_a_normalize_that_raises_or_answers_no_event_makes_the_message_malformed() -> None:
    def missing(record: object, data: dict[str, Value]) -> Normalized:
        return Normalized(data, scope=str(data["tenant"]))

    assert event_of(missing) == Malformed("normalize raised KeyError: 'tenant'")
    assert event_of(lambda r, d: {"scope": "acme"}) == Malformed(
        "normalize answered dict, not Normalized"
    )
    assert event_of(lambda r, d: Normalized({"at": datetime(2026, 1, 1, tzinfo=UTC)})) == (
        Malformed(
            "the normalized data is not JSON: TypeError:"
            " Object of type datetime is not JSON serializable"
        )
    )
    assert event_of(lambda r, d: Normalized({"pad": "x" * 100})) == Malformed(
        "a normalized data of 111 bytes, over the 100"
    )
    assert event_of(lambda r, d: Normalized(d, message_id="")) == Malformed(
        "an inbound event needs a message_id: got ''"
    )

    def in_place(record: object, data: dict[str, Value]) -> Normalized:
        data["raw"] = b"\x00"  # what a careless host does
        return Normalized(data)

    # The data handed back is held to the rule again, even the very mapping handed over.
    assert event_of(in_place) == Malformed(
        "the normalized data is not JSON: TypeError: Object of type bytes is not JSON serializable"
    )


def test_kafka_takes_normalize_or_its_shorthands_never_both() -> None:
    def build(**options: Any) -> KafkaSource:
        return KafkaSource("127.0.0.1:9", group="g", topics=["t"], source="s", **options)

    with pytest.raises(ConfigError, match="not both"):
        build(normalize=by_id, scope_of=header_scope("tenant"))
    with pytest.raises(ConfigError, match="not both"):
        build(normalize=by_id, scope="acme", message_id=lambda record: "m")
    with pytest.raises(ConfigError, match="exactly one of scope and scope_of"):
        build(decode=read_hit)
    assert build(normalize=by_id).name == "kafka:g"  # the scope may come from normalize
    assert build(normalize=by_id, scope="acme", decode=read_hit).name == "kafka:g"


def test_nats_needs_a_scope_or_a_normalize(router_db: RouterDb) -> None:
    leases = PartitionLeases(router_db.adapter, group="g", partitions=["p0"], owner="a")
    with pytest.raises(ConfigError, match="a scope, or a normalize"):
        JetStreamSource("nats://127.0.0.1:9", leases, stream="S", subject_prefix="s", source="x")
    source = JetStreamSource(
        "nats://127.0.0.1:9",
        leases,
        stream="S",
        subject_prefix="s",
        source="x",
        normalize=lambda record, data: Normalized(data, scope="acme"),
    )
    assert source.name == "nats:S"


# On the real brokers and the table.


@pytest.mark.asyncio
async def test_avro_records_are_routed_and_a_poison_record_is_dead_lettered_between_them(
    kafka_broker: KafkaBroker,  # noqa: F811 - the fixture
    router_db: RouterDb,
) -> None:
    topic, group = unique("avro"), unique("g")
    create_topic(kafka_broker, topic, 1)
    values = [
        avro("hit", "a", "a/0"),
        avro("hit", "b", "b/0"),
        POISON,
        avro("hit", "a", "a/1"),
        avro("hit", "a", "a/2"),
    ]
    produce(kafka_broker, topic, [(None, value) for value in values], partition=0)
    source = KafkaSource(
        kafka_broker.bootstrap,
        group=group,
        topics=[topic],
        source=SOURCE,
        scope="acme",
        decode=read_hit,
        normalize=by_id,
        settings=FAST_GROUP,
    )
    router = router_of(router_db, Flaky())
    dead = TableDeadLetters(router_db.adapter)
    consumer = StreamConsumer(router, source, malformed=dead, commit_interval=0.05, poll=0.05)
    running = asyncio.create_task(consumer.run())
    try:
        async with asyncio.timeout(60):
            while True:
                positions = await asyncio.to_thread(committed, kafka_broker, group, topic, 1)
                if positions == {0: 5}:
                    break
                await asyncio.sleep(0.1)
    finally:
        await consumer.stop()
        await running
    assert (consumer.counts.routed, consumer.counts.malformed) == (4, 1)
    [letter] = await dead.entries()
    assert (letter.source, letter.partition, letter.position) == ("kafka:" + group, f"{topic}/0", 2)
    assert letter.reason == (
        "malformed: the value could not be decoded: EOFError: Expected 55 bytes, read 14"
    )
    assert (letter.message_id, letter.raw) == (None, POISON)
    rows = {row.message_id: row.outcome for row in await ledger(router)}
    assert rows == {
        "a/0": "created_and_delivered",
        "b/0": "created_and_delivered",
        "a/1": "delivered",
        "a/2": "delivered",
    }
    a = await address(router, "acme", DOCUMENT, "a")
    b = await address(router, "acme", DOCUMENT, "b")
    assert a is not None
    assert b is not None
    assert await logged_messages(router, a.execution_id) == ["a/0", "a/1", "a/2"]
    assert await logged_messages(router, b.execution_id) == ["b/0"]
    assert await count_of(router, a.execution_id) == 3


@pytest.mark.asyncio
async def test_nats_reads_scope_and_message_id_from_an_envelope(
    stream: Stream,  # noqa: F811 - the fixture
    router_db: RouterDb,
) -> None:
    records: list[NatsRecord] = []

    def envelope(record: NatsRecord, data: dict[str, Value]) -> Normalized:
        records.append(record)
        body = data["body"]
        assert isinstance(body, dict)
        return Normalized(body, scope=str(data["tenant"]), message_id=str(data["id"]))

    def sent(**envelope: object) -> bytes:
        return json.dumps(envelope).encode()

    payloads = [
        sent(tenant="acme", id="e-1", body={"n": 1}),
        sent(id="e-2", body={"n": 2}),  # no tenant
        sent(tenant="umbrella", id="e-3", body={"n": 3}),
    ]
    for n, payload in enumerate(payloads):  # the header's ids are not the events'
        await stream.publish("p1", payload, message_id=f"header-{n}")
    leases = PartitionLeases(
        router_db.adapter, group="billing", partitions=PARTITIONS, owner="a", ttl=2.0
    )
    source = JetStreamSource(
        stream.server.url,
        leases,
        stream=stream.name,
        subject_prefix=stream.prefix,
        source="orders",
        normalize=envelope,
        pull_wait=0.3,
    )
    await source.start(_Quiet())
    try:
        messages = await fetch_exactly(source, 3)
    finally:
        await source.close()
    assert [m.event for m in messages] == [
        InboundEvent(scope="acme", source="orders", message_id="e-1", data={"n": 1}),
        Malformed("normalize raised KeyError: 'tenant'"),
        InboundEvent(scope="umbrella", source="orders", message_id="e-3", data={"n": 3}),
    ]
    first = records[0]
    assert (first.stream, first.subject, first.position) == (
        stream.name,
        f"{stream.prefix}.p1",
        messages[0].position,
    )
    assert first.headers[MESSAGE_ID_HEADER] == "header-0"
    assert first.payload == payloads[0]


@pytest.mark.asyncio
async def test_the_table_source_normalizes_each_row(router_db: RouterDb) -> None:
    adapter = router_db.adapter
    envelopes: list[dict[str, Value]] = [
        {"tenant": "acme", "body": {"n": 1}},
        {"body": {"n": 2}},  # no tenant: the row's scope
        {"tenant": "acme", "body": "not an object"},
    ]
    events = [
        InboundEvent(scope="shop", source="orders", message_id=f"m{n}", data=envelope)
        for n, envelope in enumerate(envelopes)
    ]
    await append_events(adapter, events, partition="0")
    rows: list[EventRow] = []

    def envelope(row: EventRow, data: dict[str, Value]) -> Normalized:
        rows.append(row)
        tenant = data.get("tenant")
        return Normalized(
            data["body"],  # the rule refuses what is not a mapping
            scope=None if tenant is None else str(tenant),
            message_id=f"{row.source}:{row.message_id}",
        )

    source = TableSource(adapter, group="g", partitions=["0"], normalize=envelope)
    await source.start(_Quiet())
    try:
        messages = await source.fetch(10, wait=0.1)
    finally:
        await source.close()
    assert [m.event for m in messages] == [
        InboundEvent(scope="acme", source="orders", message_id="orders:m0", data={"n": 1}),
        InboundEvent(scope="shop", source="orders", message_id="orders:m1", data={"n": 2}),
        Malformed("the normalized data is not a mapping: str"),
    ]
    assert [(row.position, row.scope) for row in rows] == [(1, "shop"), (2, "shop"), (3, "shop")]


class _Quiet:
    """A rebalance listener with nothing to settle."""

    async def assigned(self, partitions: object) -> None:
        pass

    async def revoked(self, partitions: object) -> None:
        pass
