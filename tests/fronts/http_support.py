"""What the HTTP fronts' tests share: the router's databases (both backends), with
the opt-in location table created for the test and dropped after it, the parcel
chart, an httpx client over an ASGI app, and a reader of the ledger."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest_asyncio
import sqlalchemy as sa
import uvicorn
from tests.persistence.conftest import (  # noqa: F401 - fixtures router_store reads
    postgresql_store,
    sqlite_store,
)
from tests.router.conftest import RouterDb, router_db, router_store  # noqa: F401

from statifier.chart import Machine, compile_chart
from statifier.expr import Value
from statifier.router import Binding, LedgerRow, Router, StaticResolver, ledger
from statifier.sql import migrations
from statifier.sql.locations import downgrade_locations, upgrade_locations
from statifier.sql.tables import define_locations

SCOPE = "depot_7"
FORM_TYPE = "application/x-www-form-urlencoded"

PARCEL = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="depot">
  <datamodel>
    <data id="where" expr="_ioprocessors['basichttp'].location"/>
    <data id="scans" expr="0"/>
    <data id="note" expr="null"/>
  </datamodel>
  <state id="depot">
    <transition event="loaded" target="on_van"/>
  </state>
  <state id="on_van">
    <transition event="scanned" target="on_van">
      <assign location="scans" expr="scans + 1"/>
      <assign location="note" expr="_event.data"/>
    </transition>
    <transition event="delivered" target="doorstep"/>
  </state>
  <final id="doorstep"/>
</scxml>"""
"""A parcel loaded onto a van: each ``scanned`` counts (and keeps its data), and
``delivered`` finishes it; ``where`` is the location the execution started with."""

LOADED = Binding(
    id="parcels_loaded",
    source="parcel_scans",
    match="event.kind == 'loaded'",
    key="event.parcel",
    document="parcel",
    event="loaded",
)
"""Creates one parcel execution per parcel id."""

_PARCEL: list[Machine] = []


def parcel_chart() -> Machine:
    """The parcel chart, compiled once."""
    if not _PARCEL:
        _PARCEL.append(compile_chart(PARCEL))
    return _PARCEL[0]


def parcel_router(db: RouterDb, bindings: list[Binding], **options: Any) -> Router:
    """A router routing ``bindings`` to the parcel chart (document ``parcel``)."""
    options.setdefault("resolver", StaticResolver({"parcel": parcel_chart()}))
    config = db.config(bindings, **options)
    return Router(config)


@pytest_asyncio.fixture
async def located_db(router_db: RouterDb) -> AsyncIterator[RouterDb]:  # noqa: F811
    """The router's database of each backend, with the location table created for the
    test (it is opt-in) and dropped after it."""
    url, tables = router_db.store.url, router_db.store.tables
    upgrade_locations(url, tables)
    try:
        yield router_db
    finally:
        downgrade_locations(url, tables)


def location_rows(db: RouterDb) -> list[tuple[Any, ...]]:
    """Every row of the location table, as stored."""
    table = define_locations(db.store.tables)
    engine = sa.create_engine(migrations.sync_url(db.store.url))
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(sa.select(table))]
    finally:
        engine.dispose()


def client(app: Any) -> httpx.AsyncClient:
    """An httpx client over ``app``, in process."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://front")


async def datamodel(router: Router, execution_id: str) -> Mapping[str, Value]:
    """The datamodel of the execution's stored position."""
    storage = router.storage
    record = await storage.fetch_execution(execution_id)
    return storage.load(record, await storage.machine(record.content_hash)).datamodel


async def rows_of(router: Router, binding_id: str) -> list[LedgerRow]:
    """The ledger rows filed under ``binding_id``, oldest first."""
    return [row for row in await ledger(router) if row.binding_id == binding_id]


@asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """``app`` on 127.0.0.1 (an ephemeral port) through uvicorn; yields its base URL."""
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=0,
            log_config=None,
            log_level="warning",
            access_log=False,
            lifespan="off",
            ws="none",
            http="h11",
        )
    )
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            assert not task.done(), "uvicorn did not start"
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=10)


async def slow_post(app: Any, path: str, content_type: str = FORM_TYPE) -> int:
    """POST ``path`` to ``app`` over raw ASGI with a body that never finishes; answer
    the status."""
    sent: list[dict[str, Any]] = []
    first = True

    async def receive() -> dict[str, Any]:
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": b"_scxmleventname=", "more_body": True}
        await asyncio.sleep(5)
        return {"type": "http.request", "body": b"scanned", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", content_type.encode())],
        "client": ("127.0.0.1", 1),
        "server": ("front", 80),
    }
    await asyncio.wait_for(app(scope, receive, send), timeout=2)
    return int(next(m["status"] for m in sent if m["type"] == "http.response.start"))
