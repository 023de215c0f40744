"""Group commit at its edges: what a batch that goes wrong logs (never a piece of a
body, and never nothing), a service's stop cut short while a batch waits for a lock,
and the window's bound for any number."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from tests.fronts.http_support import LOADED, SCOPE, client, parcel_chart
from tests.persistence.conftest import (  # noqa: F401 - fixtures
    FreshDatabase,
    SqlStore,
    drop_schema,
    postgresql_store,
    sqlite_store,
    unique_name,
)
from tests.router.conftest import Clock, RouterDb, pg_db, router_db, router_store  # noqa: F401
from tests.service.helpers import HITS, HITS_BINDING, database_table, write_config

from statifier.fronts.gather import Gatherer, check_window
from statifier.fronts.webhook import webhook_app
from statifier.persistence.sql import SqlAdapter
from statifier.router import (
    Binding,
    Failed,
    InboundEvent,
    Planned,
    Routed,
    Router,
    StaticResolver,
)
from statifier.router.routing import delivery_locks
from statifier.service import Service, load
from statifier.service.wiring import router_config
from statifier.sql import TableOptions

SOURCE = "parcel_scans"
GATHER_TASK = "statifier.fronts.gather"
CARD = "4111111111111111"
"""A value a body may carry that no log line may show."""


class GatedRouter(Router):
    """The parcel router; its ``route_many`` calls counted, each held until its own
    gate (the n-th call's is ``gates[n]``) is set."""

    def __init__(self, db: RouterDb) -> None:
        super().__init__(db.config([LOADED], resolver=StaticResolver({"parcel": parcel_chart()})))
        self.gates = [asyncio.Event() for _ in range(8)]
        self.calls = 0
        self.running = 0
        self.most_at_once = 0

    async def route_many(
        self, events: Sequence[InboundEvent | Planned], **options: Any
    ) -> list[Routed | Failed]:
        gate = self.gates[self.calls]
        self.calls += 1
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            await gate.wait()
            return await super().route_many(events, **options)
        finally:
            self.running -= 1

    def open_all(self) -> None:
        for gate in self.gates:
            gate.set()


@pytest_asyncio.fixture
async def db(router_db: RouterDb) -> RouterDb:  # noqa: F811 - the imported fixture
    """The router's database of each backend."""
    return router_db


@pytest_asyncio.fixture
async def sqlite_db(sqlite_store: SqlStore) -> AsyncIterator[RouterDb]:  # noqa: F811
    """The router's SQLite database, emptied, with an adapter of its own."""
    sqlite_store.empty()
    adapter = SqlAdapter(sqlite_store.url, sqlite_store.tables)
    try:
        yield RouterDb("sqlite", sqlite_store, adapter, Clock())
    finally:
        await adapter.close()


def event(parcel: str) -> InboundEvent:
    return InboundEvent(
        scope=SCOPE,
        source=SOURCE,
        message_id=f"loaded-{parcel}",
        data={"kind": "loaded", "parcel": parcel},
    )


def body(parcel: str) -> bytes:
    return json.dumps({"kind": "loaded", "parcel": parcel}).encode()


def gather_tasks() -> list[asyncio.Task[Any]]:
    return [task for task in asyncio.all_tasks() if task.get_name() == GATHER_TASK]


async def until(condition: Any, seconds: float = 5.0) -> None:
    """Return once ``condition()`` holds (another task makes it so)."""
    async with asyncio.timeout(seconds):
        while not condition():  # noqa: ASYNC110 - the condition is another task's doing
            await asyncio.sleep(0.005)


# What a batch that goes wrong logs.


@pytest.mark.asyncio
async def test_a_delivery_failing_in_a_batch_logs_no_piece_of_the_posted_body(
    pg_db: RouterDb,  # noqa: F811 - the imported fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No log line, at any level and from any logger, carries a piece of a posted body
    when an event of a group commit's batch fails in the database: the front answers it
    500 and logs the error's type name, as it does for a post routed alone."""
    caplog.set_level(logging.DEBUG, "statifier")
    router = Router(pg_db.config([LOADED], resolver=StaticResolver({"parcel": parcel_chart()})))
    app = webhook_app(router, source=SOURCE, scope=SCOPE, group_commit=0.2)
    # A key PostgreSQL cannot store (a NUL in text): the batch's first, set-based try
    # fails in the database, and the event then fails alone.
    poisoned = body(f"card-{CARD}\x00")
    async with client(app) as http:
        fine, failed = await asyncio.gather(
            http.post("/", content=body("p1")), http.post("/", content=poisoned)
        )
    assert (fine.status_code, failed.status_code) == (200, 500)
    assert CARD not in caplog.text


@pytest.mark.asyncio
async def test_a_batch_cut_short_by_a_cancelled_close_is_logged(
    db: RouterDb, caplog: pytest.LogCaptureFixture
) -> None:
    """Posts answered failed because ``close()`` was cancelled under their batch (a
    shutdown's bound) are not answered 500 in silence: the gatherer logs an error line
    for them, as it does for a batch whose transaction failed."""
    caplog.set_level(logging.WARNING, "statifier")
    router = GatedRouter(db)
    gatherer = Gatherer(router, window=0.01, max_batch=2)
    waiting = [asyncio.create_task(gatherer.route(event(f"p{n}"))) for n in range(3)]
    try:
        await until(lambda: router.calls == 1)  # the first batch is held in route_many
        closing = asyncio.create_task(gatherer.close())
        await asyncio.sleep(0.02)
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        answers = await asyncio.gather(*waiting)
    finally:
        router.open_all()
    assert all(isinstance(answer, Failed) for answer in answers)
    assert gather_tasks() == []
    errors = [r for r in caplog.records if r.name == GATHER_TASK and r.levelno >= logging.ERROR]
    assert errors, "3 posts were answered failed and nothing was logged"


# The service's bound.

SHUTDOWN_TIMEOUT = 1.0
EXIT_SLACK = 3.0
HITS_PLAN = Binding(
    id="hits", source="clicks", match="true", key="event.key", document="hits", event="hit"
).plan
"""The plan of the service's binding (``HITS_BINDING``): its address locks."""


@pytest.mark.asyncio
async def test_a_stop_whose_intake_took_the_bound_does_not_wait_for_a_batch_past_it(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``statifier serve`` stops within ``shutdown_timeout`` (plus slack) when a post's
    batch cannot commit (its address's lock is held elsewhere): what of the fronts'
    lifespans still runs at the bound is cancelled, as the docs say, even when intake
    used the whole bound; the batch is not waited for until its ``lock_wait`` runs
    out."""
    schema = unique_name("statifier_fresh_")
    database = FreshDatabase("postgresql", database_url, schema)
    taken: list[int] = []
    route_many = Router.route_many

    async def counted(self: Router, events: Any, **options: Any) -> Any:
        taken.append(len(events))
        return await route_many(self, events, **options)

    monkeypatch.setattr(Router, "route_many", counted)
    body = f"""
migrate = true
shutdown_timeout = {SHUTDOWN_TIMEOUT}
charts = "charts"
{HITS_BINDING}
{database_table(database)}lock_wait = 20
[http]
port = 0

[fronts.webhook.clicks]
path = "/hooks/clicks"
source = "clicks"
scope = "web"
group_commit_ms = 5
"""
    config = write_config(tmp_path, body, {"hits": HITS})
    settings = load(config)
    service = Service(settings, io.StringIO())
    running = asyncio.create_task(service.run())
    options = TableOptions(prefix="t_", schema=schema, locks=settings.database.locks)
    try:
        async with httpx.AsyncClient(timeout=30.0) as http:
            while service.address is None:
                assert not running.done(), running
                await asyncio.sleep(0.02)
            url = f"http://{service.address[0]}:{service.address[1]}/hooks/clicks"
            async with SqlAdapter(database_url, options) as adapter:
                holder = Router(router_config(settings, adapter))
                async with holder.transaction() as unit:
                    await unit.lock(delivery_locks(HITS_PLAN, "web", "k1", "any"), None)
                    post = asyncio.create_task(http.post(url, json={"key": "k1"}))
                    await until(lambda: bool(taken))  # its batch waits for the lock
                    service.stop()
                    began = time.monotonic()
                    await asyncio.wait({running}, timeout=SHUTDOWN_TIMEOUT + EXIT_SLACK)
                    took = time.monotonic() - began
                    stopped_in_bound = running.done()
                # The lock is free: whatever still waited for it ends now.
                await asyncio.wait_for(running, 30)
            await asyncio.gather(post, return_exceptions=True)
    finally:
        if not running.done():
            running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        drop_schema(database_url, schema)
    assert stopped_in_bound, f"the service was still stopping {took:.1f} s after the stop"


# The window's bound.


def test_a_window_too_large_for_a_float_is_refused_as_out_of_range() -> None:
    """``check_window`` (and so ``Gatherer``, ``webhook_app`` and ``form_app``) refuses
    every window out of range with the ``ValueError`` it documents, an integer too large
    for a float included."""
    with pytest.raises(ValueError, match="a group commit window is over 0 and at most 1"):
        check_window(10**400)
