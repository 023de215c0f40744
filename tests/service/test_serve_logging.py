"""``statifier serve``'s ``[logging]`` and ``[otel]`` tables: a real serve process
with ``format = "json"`` and ``events = true`` writes every log line to stderr as JSON,
a webhook post's delivery among them with its execution, binding and message ids as
fields, and neither the HMAC secret nor the database password anywhere; in process,
``[otel] enabled`` turns the delivery into a span on the global providers, both
bridges are gone once the service stopped, and without the ``otel`` extra the service
refuses to start, naming it."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tests.child_processes import signal_child
from tests.persistence.conftest import FreshDatabase, drop_schema, unique_name
from tests.service.helpers import HITS, HITS_BINDING, running, start_serve, write_config

from statifier import telemetry
from statifier.extras import MissingExtra
from statifier.persistence.sql import SqlAdapter
from statifier.router import LedgerRow, Router, ledger
from statifier.service import Service, load
from statifier.service.wiring import router_config
from statifier.sql import TableOptions

SECRET = "hmac-secret-5d1e0b"
PASSWORD = "db-pass-77c2f9"
DELIVERY = "statifier.router.delivery"


def logging_config(directory: Path, database: str, tables: str) -> Path:
    body = f"""
migrate = true
shutdown_timeout = 8
charts = "charts"
{HITS_BINDING}
{database}
[http]
port = 0

[fronts.webhook.clicks]
path = "/hooks/clicks"
source = "clicks"
scope = "web"
provider_id_header = "X-Event-Id"

[fronts.webhook.clicks.hmac]
secret_env = "TEST_SERVE_HMAC_SECRET"
prefix = "sha256="
{tables}
"""
    return write_config(directory, body, {"hits": HITS})


def signed(body: bytes, message_id: str) -> dict[str, str]:
    signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    return {"content-type": "application/json", "X-Signature": signature, "X-Event-Id": message_id}


@pytest.fixture
def with_password(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """The test server's URL with a password (the server does not ask for it) in
    ``TEST_SERVE_DATABASE_URL``, and a fresh schema; the HMAC secret in
    ``TEST_SERVE_HMAC_SECRET``."""
    url = sa.make_url(database_url).set(password=PASSWORD).render_as_string(hide_password=False)
    assert PASSWORD in url
    monkeypatch.setenv("TEST_SERVE_DATABASE_URL", url)
    monkeypatch.setenv("TEST_SERVE_HMAC_SECRET", SECRET)
    schema = unique_name("statifier_logs_")
    try:
        yield url, schema
    finally:
        drop_schema(database_url, schema)


async def ledger_of(url: str, schema: str | None, config: Path) -> list[LedgerRow]:
    adapter = SqlAdapter(url, TableOptions(prefix="t_", schema=schema))
    try:
        return await ledger(Router(router_config(load(config), adapter)))
    finally:
        await adapter.close()


@pytest.mark.asyncio
async def test_json_logs_carry_each_delivery_with_its_ids_and_never_a_secret(
    with_password: tuple[str, str], tmp_path: Path
) -> None:
    url, schema = with_password
    database = (
        f'[database]\nurl_env = "TEST_SERVE_DATABASE_URL"\nprefix = "t_"\nschema = "{schema}"'
    )
    tables = '[logging]\nformat = "json"\nlevel = "info"\nevents = true\n'
    config = logging_config(tmp_path, database, tables)
    served = await start_serve(config, tmp_path / "serve.log")
    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            body = json.dumps({"key": "k1"}).encode()
            answer = await client.post(
                f"{served.url}/hooks/clicks", content=body, headers=signed(body, "m-1")
            )
            assert answer.status_code == 200, served.stderr()
            forged = await client.post(
                f"{served.url}/hooks/clicks",
                content=body,
                headers={**signed(body, "m-2"), "X-Signature": "sha256=00"},
            )
            assert forged.status_code == 401
        served.signal(signal.SIGTERM)
        assert await served.wait(11) == 0, served.stderr()
    finally:
        if served.process.returncode is None:
            signal_child(served.process)
            await served.process.wait()
    text = served.stderr()
    assert SECRET not in text
    assert PASSWORD not in text
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]  # every line
    assert {"time", "level", "logger", "message"} <= set(lines[0])
    assert any(line["message"].startswith("stopping: intake first") for line in lines)
    [row] = await ledger_of(url, schema, config)
    deliveries = [line for line in lines if line.get("telemetry") == DELIVERY]
    assert [
        (line["logger"], line["binding_id"], line["message_id"], line["execution_id"])
        for line in deliveries
    ] == [("statifier.events", "hits", "m-1", row.execution_id)]
    assert deliveries[0]["outcome"] == "created_and_delivered"
    assert deliveries[0]["measurements"]["duration"] > 0


@pytest.fixture
def sdk_providers(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """An SDK tracer and meter provider standing for the process's global ones (which
    a process sets only once); answers the spans' exporter."""
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: tracer_provider)
    monkeypatch.setattr(metrics, "get_meter_provider", lambda: meter_provider)
    try:
        yield spans
    finally:
        tracer_provider.shutdown()
        meter_provider.shutdown()


@pytest.mark.asyncio
async def test_otel_and_event_logs_run_while_the_service_runs(
    sdk_providers: InMemorySpanExporter,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("TEST_SERVE_HMAC_SECRET", SECRET)
    database = FreshDatabase("sqlite", f"sqlite:///{tmp_path / 'otel.db'}", None)
    tables = "[logging]\nevents = true\n[otel]\nenabled = true\n"
    config = logging_config(tmp_path, f'[database]\nurl = "{database.url}"\nprefix = "t_"', tables)
    assert not telemetry.enabled(DELIVERY)
    caplog.set_level(logging.INFO, logger="statifier.events")
    async with running(config) as (_, base), httpx.AsyncClient(timeout=10.0) as client:
        assert telemetry.enabled(DELIVERY)
        body = json.dumps({"key": "k1"}).encode()
        answer = await client.post(
            f"{base}/hooks/clicks", content=body, headers=signed(body, "m-1")
        )
        assert answer.status_code == 200
    assert not telemetry.enabled(DELIVERY)  # both bridges uninstalled at the stop
    [row] = await ledger_of(database.url, None, config)
    [span] = [s for s in sdk_providers.get_finished_spans() if s.name == DELIVERY]
    attributes: dict[str, Any] = dict(span.attributes or {})
    assert (attributes["message_id"], attributes["binding_id"]) == ("m-1", "hits")
    assert attributes["execution_id"] == row.execution_id
    records = [r for r in caplog.records if getattr(r, "telemetry", None) == DELIVERY]
    shown = [(getattr(r, "message_id", None), getattr(r, "execution_id", None)) for r in records]
    assert shown == [("m-1", row.execution_id)]


@pytest.mark.asyncio
async def test_otel_without_its_extra_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_SERVE_HMAC_SECRET", SECRET)
    url = f"sqlite:///{tmp_path / 'none.db'}"
    tables = "[logging]\nevents = true\n[otel]\nenabled = true\n"
    config = logging_config(tmp_path, f'[database]\nurl = "{url}"\nprefix = "t_"', tables)
    monkeypatch.delitem(sys.modules, "statifier.observability.otel", raising=False)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # import opentelemetry fails
    with pytest.raises(MissingExtra) as missing:
        await Service(load(config)).run()
    assert missing.value.extra == "otel"
    assert str(missing.value) == "OpenTelemetry needs the otel extra: pip install 'statifier[otel]'"
    assert not telemetry.enabled(DELIVERY)  # nothing stays installed
    assert not (tmp_path / "none.db").exists()  # refused before the database was opened
