"""The service's stream consumers over real brokers the tests start (Kafka: Tansu;
NATS JetStream): what is produced is routed, and what was routed is committed by the
time the service has stopped; and its other HTTP fronts: a form post under an HMAC
signature, and the BasicHTTP front's table and mount."""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import nats
import pytest
import pytest_asyncio
from nats.js import JetStreamContext
from nats.js.api import StreamConfig
from tests.fronts.kafka_broker import (  # noqa: F401 - the fixture
    KafkaBroker,
    committed,
    create_topic,
    fast_group_toml,
    kafka_broker,
    produce,
    unique,
)
from tests.fronts.nats_server import NatsServer, nats_server  # noqa: F401 - the fixture
from tests.service.helpers import HITS, HITS_BINDING, running, until, write_config

from statifier.fronts.nats import MESSAGE_ID_HEADER
from statifier.persistence.sql import SqlAdapter
from statifier.router import LedgerRow, Router, ledger
from statifier.service import load
from statifier.service.wiring import router_config

EVENTS = 12


def served(tmp_path: Path, tables: str) -> Path:
    url = f"sqlite:///{tmp_path / 'service.db'}"
    body = (
        f'migrate = true\nshutdown_timeout = 8\ncharts = "charts"\n{HITS_BINDING}\n'
        f'[database]\nurl = "{url}"\n[http]\nport = 0\n{tables}'
    )
    return write_config(tmp_path, body, {"hits": HITS})


async def rows_of(config: Path) -> list[LedgerRow]:
    settings = load(config)
    async with SqlAdapter(settings.database.url) as adapter:
        router = Router(router_config(settings, adapter))
        return await ledger(router)


@pytest.mark.asyncio
async def test_a_kafka_source_is_consumed_and_committed(
    kafka_broker: KafkaBroker,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    topic, group = unique("clicks"), unique("serve")
    create_topic(kafka_broker, topic, 2)
    tables = f"""
[sources.clicks]
kind = "kafka"
scope = "web"
brokers = "{kafka_broker.bootstrap}"
topics = ["{topic}"]
group = "{group}"

[sources.clicks.settings]
{fast_group_toml()}

[sources.clicks.consumer]
commit_interval = 0.05
"""
    config = served(tmp_path, tables)
    records = [
        (f"k{n % 3}".encode(), json.dumps({"key": f"k{n % 3}"}).encode()) for n in range(EVENTS)
    ]
    placed = produce(kafka_broker, topic, records)

    async def all_routed() -> bool:
        return len(await rows_of(config)) == EVENTS

    async with running(config):
        await until(all_routed, 60)
    ends: dict[int, int] = {}
    for partition, offset in placed:
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    assert committed(kafka_broker, group, topic, 2) == ends
    rows = await rows_of(config)
    assert sorted(str(row.message_id) for row in rows) == sorted(
        f"{topic}/{partition}/{offset}" for partition, offset in placed
    )


@dataclass
class Stream:
    """A JetStream stream of one test's own over the subjects ``<prefix>.*``."""

    server: NatsServer
    js: JetStreamContext
    name: str
    prefix: str

    async def publish(self, partition: str, payload: bytes, message_id: str) -> int:
        headers = {MESSAGE_ID_HEADER: message_id}
        ack = await self.js.publish(f"{self.prefix}.{partition}", payload, headers=headers)
        return int(ack.seq)

    async def ack_floor(self, group: str, partition: str) -> int:
        info = await self.js.consumer_info(self.name, f"{group}-{partition}")
        assert info.ack_floor is not None
        return int(info.ack_floor.stream_seq or 0)


@pytest_asyncio.fixture
async def stream(nats_server: NatsServer) -> AsyncIterator[Stream]:  # noqa: F811 - the fixture
    client = await nats.connect(nats_server.url)
    js = client.jetstream()
    token = uuid.uuid4().hex[:8]
    name, prefix = f"serve_{token}", f"serve.{token}"
    await js.add_stream(StreamConfig(name=name, subjects=[f"{prefix}.*"]))
    try:
        yield Stream(nats_server, js, name, prefix)
    finally:
        await js.delete_stream(name)
        await client.close()


@pytest.mark.asyncio
async def test_a_nats_source_is_consumed_and_acknowledged(
    stream: Stream,
    tmp_path: Path,
) -> None:
    group = unique("serve")
    tables = f"""
[sources.clicks]
kind = "nats"
scope = "web"
servers = ["{stream.server.url}"]
stream = "{stream.name}"
subject_prefix = "{stream.prefix}"
partitions = ["p0", "p1"]
group = "{group}"

[sources.clicks.consumer]
commit_interval = 0.05
"""
    config = served(tmp_path, tables)
    sequences = {"p0": 0, "p1": 0}
    for n in range(EVENTS):
        partition = f"p{n % 2}"
        payload = json.dumps({"key": f"k{n % 3}"}).encode()
        sequences[partition] = await stream.publish(partition, payload, f"m{n}")

    async def all_routed() -> bool:
        return len(await rows_of(config)) == EVENTS

    async with running(config):
        await until(all_routed, 60)
    assert {p: await stream.ack_floor(group, p) for p in sequences} == sequences
    rows = await rows_of(config)
    assert sorted(str(row.message_id) for row in rows) == sorted(f"m{n}" for n in range(EVENTS))


@pytest.mark.asyncio
async def test_a_form_front_checks_its_signature_and_routes_what_is_signed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_FORM_SECRET", "form-secret-1")
    tables = """
[fronts.form.signup]
path = "/forms/signup"
source = "clicks"
scope = "web"

[fronts.form.signup.hmac]
secret_env = "TEST_FORM_SECRET"
header = "X-Signature"
prefix = "sha256="
"""
    config = served(tmp_path, tables)
    body = b"key=k1&plan=pro"
    good = "sha256=" + hmac.new(b"form-secret-1", body, hashlib.sha256).hexdigest()
    form = {"content-type": "application/x-www-form-urlencoded"}
    async with running(config) as (_, base), httpx.AsyncClient(timeout=5.0) as client:
        forged = await client.post(
            f"{base}/forms/signup", content=body, headers={**form, "X-Signature": "sha256=00"}
        )
        assert forged.status_code == 401
        signed = await client.post(
            f"{base}/forms/signup", content=body, headers={**form, "X-Signature": good}
        )
        assert signed.status_code == 200
    rows = await rows_of(config)
    assert [row.binding_id for row in rows] == ["hits"]


@pytest.mark.asyncio
async def test_a_basichttp_front_gets_its_table_and_answers_at_its_path(tmp_path: Path) -> None:
    tables = """
[fronts.basichttp.events]
path = "/basichttp"
base_url = "http://127.0.0.1/basichttp"
"""
    config = served(tmp_path, tables)
    async with running(config) as (_, base), httpx.AsyncClient(timeout=5.0) as client:
        unknown = await client.post(f"{base}/basichttp/{'a' * 43}", data={"_scxmleventname": "e"})
        assert unknown.status_code == 404  # no execution has that token
        assert (await client.get(f"{base}/basichttp/x")).status_code == 405
        assert (await client.get(f"{base}/readyz")).json() == {"status": "ready"}
