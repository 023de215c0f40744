"""A Kafka run over three PostgreSQL servers of the test's own, a
:class:`~statifier.router.ShardedRouter` over them behind one stream consumer: one
server is stopped in the middle of the run. The other stores' keys keep flowing, the
stopped store's resume when it returns, every record is stepped exactly once, and the
group's commits reach the end of every partition."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Awaitable, Callable

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
from tests.router.racing_router import DOCUMENT, HITS, SCOPE, SOURCE
from tests.service.own_postgres import servers

from statifier.buckets import address_bucket
from statifier.chart import compile_chart
from statifier.fronts.consumer import StreamConsumer
from statifier.fronts.kafka import KafkaSource
from statifier.persistence.sql import SqlAdapter
from statifier.router import RouterConfig, ShardedRouter, StaticResolver, ledger
from statifier.sql import migrations

COUNTER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="on">
<datamodel><data id="n" expr="0"/></datamodel>
<state id="on">
  <transition event="hit"><assign location="n" expr="n + 1"/></transition>
</state>
</scxml>"""

KEYS = [f"k{number}" for number in range(24)]
PARTITIONS = 2
EARLY, LATE = 60, 120
"""Records produced before the server stops, and while it is stopped."""


def _records(first: int, count: int) -> list[tuple[bytes | None, bytes | None]]:
    records: list[tuple[bytes | None, bytes | None]] = []
    for number in range(first, first + count):
        key = KEYS[number % len(KEYS)]
        data = {"kind": "hit", "key": key, "message_id": f"m{number}"}
        records.append((key.encode(), json.dumps(data).encode()))
    return records


async def _stepped(router: ShardedRouter, store: int) -> Counter[str]:
    rows = await ledger(router.routers[store])
    return Counter(
        str(row.message_id) for row in rows if row.outcome in ("created_and_delivered", "delivered")
    )


async def _counts(router: ShardedRouter) -> dict[str, int]:
    counts: dict[str, int] = {}
    for key in KEYS:
        held = router.router_of_address(SCOPE, DOCUMENT, key)
        async with held.transaction() as unit:
            found = await unit.sql.find_address(SCOPE, DOCUMENT, key)
            assert found is not None
            record = await unit.storage.fetch_execution(found.execution_id)
            machine = await unit.storage.machine(record.content_hash)
            counts[key] = int(unit.storage.load(record, machine).datamodel["n"])
    return counts


async def _until(check: Callable[[], Awaitable[bool]], seconds: float) -> None:
    async with asyncio.timeout(seconds):
        while not await check():  # noqa: ASYNC110 - polls the stores' ledgers
            await asyncio.sleep(0.1)


@pytest.mark.asyncio
async def test_a_stopped_server_holds_up_its_own_keys_alone_and_nothing_is_lost_or_twice(
    kafka_broker: KafkaBroker,  # noqa: F811 - the imported fixture
) -> None:
    topic, group = unique("hits"), unique("g")
    create_topic(kafka_broker, topic, PARTITIONS)
    with servers(3) as three:
        for server in three:
            await asyncio.to_thread(migrations.upgrade, server.url)
        adapters = [SqlAdapter(server.url) for server in three]
        config = RouterConfig(
            adapters[0],
            bindings=[HITS],
            resolver=StaticResolver({DOCUMENT: compile_chart(COUNTER, name=DOCUMENT)}),
            lock_wait=10.0,
        )
        router = ShardedRouter(config, adapters)
        store_of = {
            key: router.shard_map.store_of(address_bucket(SCOPE, DOCUMENT, key)) for key in KEYS
        }
        assert set(store_of.values()) == {0, 1, 2}
        source = KafkaSource(
            kafka_broker.bootstrap,
            group=group,
            topics=[topic],
            source=SOURCE,
            scope=SCOPE,
            message_id=lambda record: json.loads(record.value)["message_id"],
            settings=FAST_GROUP,
        )
        consumer = StreamConsumer(router, source, lanes=2, batch_size=8, commit_interval=0.05)
        running = asyncio.create_task(consumer.run())
        try:
            produce(kafka_broker, topic, _records(0, EARLY))
            await _until(lambda: _all_in(router, 0, EARLY, store_of, {0, 1, 2}), 60)
            await asyncio.to_thread(three[2].stop)
            produce(kafka_broker, topic, _records(EARLY, LATE))
            # The other stores' keys flow while the third store is away...
            await _until(lambda: _all_in(router, 0, EARLY + LATE, store_of, {0, 1}), 60)
            away = [
                f"m{n}" for n in range(EARLY, EARLY + LATE) if store_of[KEYS[n % len(KEYS)]] == 2
            ]
            assert away
            # The away store's events are not acknowledged: the commits stop short.
            assert consumer.counts.committed < EARLY + LATE
            # ... and its own resume once it is back.
            await asyncio.to_thread(three[2].start)
            await _until(lambda: _all_in(router, 0, EARLY + LATE, store_of, {0, 1, 2}), 90)
            async with asyncio.timeout(30):
                while consumer.counts.committed < EARLY + LATE:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
        finally:
            await consumer.stop()
            await running
        try:
            stepped: Counter[str] = Counter()
            for store in range(3):
                stepped += await _stepped(router, store)
            assert stepped == Counter({f"m{n}": 1 for n in range(EARLY + LATE)})
            expected = Counter(KEYS[n % len(KEYS)] for n in range(EARLY + LATE))
            assert await _counts(router) == dict(expected)
            ends = committed(kafka_broker, group, topic, PARTITIONS)
            assert sum(ends.values()) == EARLY + LATE
        finally:
            for adapter in adapters:
                await adapter.close()


async def _all_in(
    router: ShardedRouter, first: int, end: int, store_of: dict[str, int], stores: set[int]
) -> bool:
    """Whether every record ``first <= n < end`` whose key is in ``stores`` is stepped."""
    wanted = {f"m{n}" for n in range(first, end) if store_of[KEYS[n % len(KEYS)]] in stores}
    seen: set[str] = set()
    for store in stores:
        seen |= set(await _stepped(router, store))
    return wanted <= seen
