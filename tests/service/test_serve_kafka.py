"""Two ``statifier serve`` processes on one PostgreSQL database and one Kafka consumer
group (Tansu, a topic of four partitions) route thousands of keyed hits produced
before and while they run; each is SIGKILLed once mid-stream and started again.

Afterwards every hit was stepped into its key's execution exactly once (a redelivery
after a kill is answered ``duplicate``), each key's input log holds its hits in the
order they were produced, and the group's committed offsets are the end of every
partition.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tests.fronts.kafka_broker import (
    KafkaBroker,
    committed,
    create_topic,
    fast_group_toml,
    kafka_broker,  # noqa: F401 - the fixture
    produce,
    unique,
)
from tests.persistence.conftest import FreshDatabase, drop_schema, unique_name
from tests.service.helpers import HITS, Served, database_table, start_serve, write_config

from statifier.persistence import Executions
from statifier.persistence.sql import SqlAdapter
from statifier.router import Router, address, ledger
from statifier.service import load
from statifier.service.wiring import router_config
from statifier.sql import TableOptions
from statifier.sql.names import TableNames

PARTITIONS = 4
KEYS = 60
BEFORE = 1_500
"""Hits produced before the services start."""
BATCH, PACE = 100, 0.2
"""While they run, a batch of hits every ``PACE`` seconds..."""
AT_MOST = 9_000
"""...until both were killed and started again, or this many hits in all."""
MOVED = 300
"""Hits stepped by the group after a member was assigned partitions, before it is killed."""
DEADLINE = 80.0
SHUTDOWN_TIMEOUT = 8.0
SCOPE = "web"

BINDING = """
[[bindings]]
id = "hits"
source = "clicks"
match = "true"
key = "event.key"
document = "hits"
event = "hit"
data = ["seq"]
"""


@pytest.fixture
def postgresql_database(database_url: str) -> Iterator[FreshDatabase]:
    """A fresh PostgreSQL schema (dropped afterwards)."""
    schema = unique_name("statifier_kserve_")
    try:
        yield FreshDatabase("postgresql", database_url, schema)
    finally:
        drop_schema(database_url, schema)


def kafka_config(
    directory: Path, database: FreshDatabase, broker: KafkaBroker, topic: str, group: str
) -> Path:
    body = f"""
migrate = true
shutdown_timeout = {SHUTDOWN_TIMEOUT}
charts = "charts"
{BINDING}
{database_table(database)}
[http]
port = 0

[reapers]
enabled = false

[sources.clicks]
kind = "kafka"
scope = "{SCOPE}"
brokers = "{broker.bootstrap}"
topics = ["{topic}"]
group = "{group}"

[sources.clicks.settings]
{fast_group_toml()}

[sources.clicks.consumer]
commit_interval = 0.05
"""
    return write_config(directory, body, {"hits": HITS})


@dataclass(frozen=True)
class Hit:
    """One hit as the topic stored it."""

    partition: int
    offset: int
    key: str
    seq: int


def _record(seq: int) -> tuple[bytes, bytes]:
    key = f"k{seq % KEYS:02d}"
    return key.encode(), json.dumps({"key": key, "seq": seq}).encode()


@dataclass
class Producer:
    """Produces hits in paced batches until told to stop (or :data:`AT_MOST`)."""

    broker: KafkaBroker
    topic: str
    hits: list[Hit] = field(default_factory=list)
    enough: asyncio.Event = field(default_factory=asyncio.Event)

    def batch(self, count: int) -> None:
        first = len(self.hits)
        records = [_record(seq) for seq in range(first, first + count)]
        placed = produce(self.broker, self.topic, records)
        for seq, (partition, offset) in enumerate(placed, start=first):
            self.hits.append(Hit(partition, offset, _record(seq)[0].decode(), seq))

    async def run(self) -> None:
        while not self.enough.is_set() and len(self.hits) < AT_MOST:
            await asyncio.to_thread(self.batch, min(BATCH, AT_MOST - len(self.hits)))
            await asyncio.sleep(PACE)


@dataclass
class Run:
    """The services of one test and what they share."""

    config: Path
    directory: Path
    adapter: SqlAdapter
    router: Router
    served: list[Served] = field(default_factory=list)

    async def start(self, name: str) -> Served:
        served = await start_serve(self.config, self.directory / f"{name}-{len(self.served)}.log")
        self.served.append(served)
        return served

    async def stepped(self) -> int:
        names = TableNames.of(self.adapter.tables)
        async with self.adapter.transaction() as tx:
            cursor = await tx.driver.execute(f"SELECT count(*) FROM {names.routing_ledger}")
            row = await cursor.fetchone()
        assert row is not None
        return int(row[0])

    async def kill_once_both_work(self, victim: Served, other: Served) -> None:
        """SIGKILL ``victim`` once it and ``other`` were both assigned partitions and
        the group stepped :data:`MOVED` hits since: the kill lands mid-stream, in a
        group of two."""
        while not (_assigned(victim) and _assigned(other)):
            for served in (victim, other):
                assert served.process.returncode is None, served.stderr()
            await asyncio.sleep(0.1)
        since = await self.stepped()
        while await self.stepped() < since + MOVED:
            assert victim.process.returncode is None, victim.stderr()
            await asyncio.sleep(0.05)
        victim.process.kill()
        assert await victim.wait(10) == -signal.SIGKILL


def _assigned(served: Served) -> bool:
    """Whether the service's consumer was given a partition (it logs each assignment)."""
    return any(
        "assigned [" in line and "assigned []" not in line for line in served.stderr().splitlines()
    )


def _ends(hits: list[Hit]) -> dict[int, int]:
    ends: dict[int, int] = {}
    for hit in hits:
        ends[hit.partition] = max(ends.get(hit.partition, 0), hit.offset + 1)
    return ends


async def _logged(router: Router, key: str) -> list[int]:
    """The ``seq`` of every hit in the input log of ``key``'s execution, in log order."""
    found = await address(router, SCOPE, "hits", key)
    assert found is not None, key
    seqs = []
    for entry in await Executions(router.storage).inputs(found.execution_id):
        assert entry.event is not None
        data = entry.event.data
        assert isinstance(data, dict)
        seqs.append(int(data["seq"]))
    return seqs


@pytest.mark.asyncio
async def test_two_services_in_one_group_each_killed_once_step_every_hit_once(
    postgresql_database: FreshDatabase,
    kafka_broker: KafkaBroker,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    topic, group = unique("serve-hits"), unique("serve")
    create_topic(kafka_broker, topic, PARTITIONS)
    config = kafka_config(tmp_path, postgresql_database, kafka_broker, topic, group)
    producer = Producer(kafka_broker, topic)
    await asyncio.to_thread(producer.batch, BEFORE)
    settings = load(config)
    options = TableOptions(prefix=settings.database.prefix, schema=settings.database.schema)
    adapter = SqlAdapter(settings.database.url, options)
    began = time.monotonic()
    run = Run(config, tmp_path, adapter, Router(router_config(settings, adapter)))
    producing: asyncio.Task[None] | None = None
    try:
        async with asyncio.timeout(DEADLINE):
            first = await run.start("a")
            producing = asyncio.create_task(producer.run())
            second = await run.start("b")
            await run.kill_once_both_work(first, second)
            killed = [(time.monotonic() - began, len(producer.hits))]
            again = await run.start("a")
            await run.kill_once_both_work(second, again)
            killed.append((time.monotonic() - began, len(producer.hits)))
            last = await run.start("b")
            while not _assigned(last):
                assert last.process.returncode is None, last.stderr()
                await asyncio.sleep(0.1)
            producer.enough.set()
            await producing
            ends = _ends(producer.hits)
            offsets = await asyncio.to_thread(committed, kafka_broker, group, topic, PARTITIONS)
            while offsets != ends:
                await asyncio.sleep(0.2)
                offsets = await asyncio.to_thread(committed, kafka_broker, group, topic, PARTITIONS)
            settled = time.monotonic() - began
        for served in (again, last):
            served.signal(signal.SIGTERM)
        for served in (again, last):
            assert await served.wait(SHUTDOWN_TIMEOUT + 3) == 0, served.stderr()

        hits = producer.hits
        assert len(hits) > BEFORE
        for at, produced in killed:
            assert produced < len(hits), f"a kill at {at:.1f} s came after the last hit"
        rows = await ledger(run.router)
        assert {row.outcome for row in rows} <= {
            "created_and_delivered",
            "delivered",
            "duplicate",
        }
        stepped = Counter(
            row.message_id for row in rows if row.outcome in ("created_and_delivered", "delivered")
        )
        assert stepped == Counter(f"{topic}/{hit.partition}/{hit.offset}" for hit in hits)
        created = [str(row.key) for row in rows if row.outcome == "created_and_delivered"]
        assert sorted(created) == sorted({hit.key for hit in hits})
        for key in sorted({hit.key for hit in hits}):
            mine = sorted((hit for hit in hits if hit.key == key), key=lambda hit: hit.offset)
            assert len({hit.partition for hit in mine}) == 1  # a key's hits share a partition
            assert [hit.seq for hit in mine] == sorted(hit.seq for hit in mine)
            assert await _logged(run.router, key) == [hit.seq for hit in mine]
        duplicates = sum(1 for row in rows if row.outcome == "duplicate")
        print(
            f"{len(hits)} hits; killed at {killed}; all committed at {settled:.1f} s; "
            f"{duplicates} duplicates"
        )
    finally:
        if producing is not None and not producing.done():
            producing.cancel()
            await asyncio.gather(producing, return_exceptions=True)
        for served in run.served:
            if served.process.returncode is None:
                served.process.kill()
                await served.process.wait()
        await adapter.close()


@pytest.mark.asyncio
async def test_a_stop_whose_deliveries_hang_still_commits_and_leaves_the_group_in_time(
    postgresql_database: FreshDatabase,
    kafka_broker: KafkaBroker,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    """Deliveries that do not finish (the dedupe table locked by another session) take
    half of ``shutdown_timeout`` at most: the rest is the last commit's and the close's,
    so the member commits what it did, leaves its group and the process exits 0 in
    time. (With the whole budget to the drain, the stop was cancelled at the bound:
    exit 1, nothing committed since the last interval, the group left to time out.)"""
    import psycopg

    topic, group = unique("stop-hits"), unique("stop")
    create_topic(kafka_broker, topic, PARTITIONS)
    config = kafka_config(tmp_path, postgresql_database, kafka_broker, topic, group)
    first = await asyncio.to_thread(produce, kafka_broker, topic, [_record(n) for n in range(40)])
    ends = Counter(partition for partition, _ in first)
    served = await start_serve(config, tmp_path / "serve.log")
    dedupe = f"{postgresql_database.schema}.t_dedupe"
    try:
        async with asyncio.timeout(DEADLINE):
            seen: dict[int, int] = {}
            while seen != ends:  # polls the broker
                await asyncio.sleep(0.2)
                seen = await asyncio.to_thread(committed, kafka_broker, group, topic, PARTITIONS)
        async with await psycopg.AsyncConnection.connect(postgresql_database.url) as holder:
            await holder.execute(f"LOCK TABLE {dedupe} IN ACCESS EXCLUSIVE MODE")
            await asyncio.to_thread(produce, kafka_broker, topic, [_record(n) for n in range(8)])
            async with await psycopg.AsyncConnection.connect(
                postgresql_database.url, autocommit=True
            ) as watcher:
                waiting = 0
                async with asyncio.timeout(30):
                    while not waiting:  # until a delivery waits for the table
                        await asyncio.sleep(0.1)
                        row = await (
                            await watcher.execute(
                                "SELECT count(*) FROM pg_locks WHERE NOT granted "
                                f"AND relation = '{dedupe}'::regclass"
                            )
                        ).fetchone()
                        waiting = row[0] if row else 0
            sent_at = time.monotonic()
            served.signal(signal.SIGTERM)
            code = await served.wait(SHUTDOWN_TIMEOUT + 3)
            took = time.monotonic() - sent_at
            await holder.rollback()
    finally:
        if served.process.returncode is None:
            served.process.kill()
            await served.process.wait()
    assert code == 0, served.stderr()
    assert took < SHUTDOWN_TIMEOUT + 1, took
    assert "it did not stop in time" not in served.stderr()
    assert committed(kafka_broker, group, topic, PARTITIONS) == ends  # what it did
