"""Faults a running service lives through, each asserting that every event is stepped
exactly once afterwards and that ``/readyz`` reported the outage (503 naming the cause
while it lasted, 200 after):

- the Kafka broker killed (``SIGKILL``: no connection closed cleanly, the member's
  session still alive) and started again: a Tansu process on an ``s3://`` storage
  engine (:mod:`tests.fronts.object_store`), so the broker started again keeps its
  topics, records and committed offsets; the log stays bounded meanwhile;
- the database stopped for 20 seconds and started again: a PostgreSQL server of the
  test's own (:mod:`tests.service.own_postgres`); a webhook post during the outage is
  answered 500 well within its deadline, and the first delivery after the server is
  back comes within seconds (printed).

The third fault, a member assigned back its paused partition, is in
``tests/fronts/test_kafka.py``: the source reads every record of it again
(``test_a_paused_partition_revoked_and_assigned_back_is_read_again``), and a consumer
steps each record exactly once
(``test_a_consumer_whose_paused_partition_moves_away_and_back_steps_each_record_once``).
The member holds a partition all along, so readiness has no outage to report there.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.fronts.kafka_broker import (
    KafkaBroker,
    create_topic,
    fast_group_toml,
    kafka_broker,  # noqa: F401 - the fixture
    produce,
    start_kafka_broker,
    stop_kafka_broker,
    unique,
)
from tests.fronts.object_store import ObjectStore, object_store, s3_environment
from tests.service.helpers import HITS, running, write_config
from tests.service.own_postgres import OwnPostgres, own_postgres  # noqa: F401 - the fixture

from statifier.persistence.sql import SqlAdapter
from statifier.router import Router, ledger
from statifier.service import load
from statifier.service.wiring import router_config
from statifier.sql import TableOptions

SCOPE = "web"
KEYS = 10
WAIT = 60.0
"""The longest any condition of these tests is waited for."""

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
def store() -> Iterator[ObjectStore]:
    yield from object_store()


def _config(directory: Path, database_url: str, broker: str, topic: str, group: str) -> Path:
    body = f"""
migrate = true
shutdown_timeout = 10
charts = "charts"
{BINDING}
[database]
url = "{database_url}"
prefix = "t_"

[http]
port = 0

[reapers]
enabled = false

[fronts.webhook.clicks]
path = "/hooks/clicks"
source = "clicks"
scope = "{SCOPE}"

[sources.clicks]
kind = "kafka"
scope = "{SCOPE}"
brokers = "{broker}"
topics = ["{topic}"]
group = "{group}"
commit_timeout = 2

[sources.clicks.settings]
{fast_group_toml()}
"reconnect.backoff.max.ms" = 1000

[sources.clicks.consumer]
commit_interval = 0.05
"""
    return write_config(directory, body, {"hits": HITS})


def _hits(first: int, count: int) -> list[tuple[bytes, bytes]]:
    records = []
    for seq in range(first, first + count):
        key = f"k{seq % KEYS}"
        records.append((key.encode(), json.dumps({"key": key, "seq": seq}).encode()))
    return records


def _router(config: Path) -> tuple[SqlAdapter, Router]:
    settings = load(config)
    options = TableOptions(prefix=settings.database.prefix, schema=settings.database.schema)
    adapter = SqlAdapter(settings.database.url, options)
    return adapter, Router(router_config(settings, adapter))


async def _stepped(router: Router) -> Counter[str]:
    """How often each message was stepped into its execution (duplicates aside)."""
    rows = await ledger(router)
    assert {row.outcome for row in rows} <= {"created_and_delivered", "delivered", "duplicate"}
    return Counter(
        str(row.message_id) for row in rows if row.outcome in ("created_and_delivered", "delivered")
    )


async def _until_stepped(router: Router, expected: set[str]) -> None:
    deadline = time.monotonic() + WAIT
    while set(await _stepped(router)) != expected:
        assert time.monotonic() < deadline, "not every event was stepped in time"
        await asyncio.sleep(0.1)


async def _readiness(client: httpx.AsyncClient, base: str) -> tuple[int, list[str]]:
    answer = await client.get(f"{base}/readyz")
    body: dict[str, Any] = answer.json()
    reasons: list[str] = body.get("reasons", [])
    return answer.status_code, reasons


async def _until_ready(client: httpx.AsyncClient, base: str) -> None:
    deadline = time.monotonic() + WAIT
    while (answer := await _readiness(client, base))[0] != 200:
        assert time.monotonic() < deadline, f"never ready again: {answer}"
        await asyncio.sleep(0.1)


async def _until_unready(client: httpx.AsyncClient, base: str, cause: str) -> list[str]:
    """Poll ``/readyz`` until it answers 503 with a reason containing ``cause``."""
    deadline = time.monotonic() + WAIT
    while True:
        status, reasons = await _readiness(client, base)
        if status == 503 and any(cause in reason for reason in reasons):
            return reasons
        assert time.monotonic() < deadline, f"/readyz never said {cause!r}: {status} {reasons}"
        await asyncio.sleep(0.1)


def _ids(topic: str, placed: list[tuple[int, int]]) -> set[str]:
    return {f"{topic}/{partition}/{offset}" for partition, offset in placed}


@pytest.mark.asyncio
async def test_the_kafka_broker_killed_and_started_again(
    store: ObjectStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    environment = s3_environment(store)
    broker = start_kafka_broker(tmp_path, storage="s3://tansu/", environment=environment)
    port = int(broker.bootstrap.rsplit(":", 1)[1])
    topic, group = unique("hits"), unique("faults")
    config = _config(
        tmp_path, f"sqlite:///{tmp_path / 'faults.db'}", broker.bootstrap, topic, group
    )
    adapter, router = _router(config)
    caplog.set_level(logging.WARNING, "statifier")
    try:
        create_topic(broker, topic, 2)
        before = await asyncio.to_thread(produce, broker, topic, _hits(0, 40))
        async with running(config) as (_, base), httpx.AsyncClient(timeout=15.0) as client:
            await _until_stepped(router, _ids(topic, before))
            await _until_ready(client, base)

            stop_kafka_broker(broker, grace=0)  # SIGKILL: no connection is closed cleanly
            stopped = time.monotonic()
            lines = len(caplog.records)
            reasons = await _until_unready(client, base, "source clicks: no broker answers")
            assert not any(broker.bootstrap in reason for reason in reasons)
            await asyncio.sleep(max(0.0, 8.0 - (time.monotonic() - stopped)))
            outage = [
                r for r in caplog.records[lines:] if r.name.startswith("statifier.fronts.kafka")
            ]

            broker = start_kafka_broker(
                tmp_path, port=port, storage="s3://tansu/", environment=environment
            )
            after = await asyncio.to_thread(produce, broker, topic, _hits(40, 40))
            await _until_ready(client, base)
            await _until_stepped(router, _ids(topic, before) | _ids(topic, after))
            stepped = await _stepped(router)
        assert set(stepped.values()) == {1}
        assert len(stepped) == 80
        # About 8 s of a broker that does not answer: a few lines, not one per attempt.
        assert len(outage) <= 12, [r.getMessage() for r in outage]
        print(f"{len(outage)} Kafka log lines in 8 s without a broker")
    finally:
        stop_kafka_broker(broker)
        await adapter.close()


OUTAGE = 20.0


@pytest.mark.asyncio
async def test_the_database_stopped_20_seconds_and_started_again(
    own_postgres: OwnPostgres,  # noqa: F811 - the fixture
    kafka_broker: KafkaBroker,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    topic, group = unique("hits"), unique("faults")
    create_topic(kafka_broker, topic, 2)
    config = _config(tmp_path, own_postgres.url, kafka_broker.bootstrap, topic, group)
    adapter, router = _router(config)
    try:
        before = await asyncio.to_thread(produce, kafka_broker, topic, _hits(0, 30))
        async with running(config) as (_, base), httpx.AsyncClient(timeout=15.0) as client:
            await _until_stepped(router, _ids(topic, before))
            await _until_ready(client, base)

            await asyncio.to_thread(own_postgres.stop)
            stopped = time.monotonic()
            await _until_unready(client, base, "database:")
            during = await asyncio.to_thread(produce, kafka_broker, topic, _hits(30, 30))
            # Posts while the database is away are refused (500, the database's error)
            # well within their deadline (10 s), not answered 503 when it runs out.
            refused: list[tuple[int, float]] = []
            for seq in (-1, -2):
                posted = time.monotonic()
                answer = await client.post(f"{base}/hooks/clicks", json={"key": "k0", "seq": seq})
                refused.append((answer.status_code, time.monotonic() - posted))
            assert [status for status, _ in refused] == [500, 500], refused
            assert max(seconds for _, seconds in refused) < 8.0, refused
            await asyncio.sleep(max(0.0, OUTAGE - (time.monotonic() - stopped)))

            await asyncio.to_thread(own_postgres.start)
            back = time.monotonic()
            await _until_stepped_any(router, _ids(topic, during))
            first_delivery = time.monotonic() - back
            await _until_ready(client, base)
            await _until_stepped(router, _ids(topic, before) | _ids(topic, during))
            stepped = await _stepped(router)
        assert set(stepped.values()) == {1}
        assert len(stepped) == 60
        assert first_delivery < 5.0, first_delivery
        print(
            f"posts during the outage answered {refused}; the first delivery "
            f"{first_delivery:.2f} s after the server accepted connections again"
        )
    finally:
        await adapter.close()


async def _until_stepped_any(router: Router, wanted: set[str]) -> None:
    """Wait until one of ``wanted`` is stepped (the database's reads may fail at first:
    the test's own pool reconnects too)."""
    deadline = time.monotonic() + WAIT
    while True:
        try:
            if wanted & set(await _stepped(router)):
                return
        except Exception:  # noqa: BLE001 - the test's reader reconnecting
            pass
        assert time.monotonic() < deadline, "nothing was delivered after the database came back"
        await asyncio.sleep(0.02)
