"""The HTTP API over three stores (a :class:`ShardedRouter` over three SQLite files, and
over three PostgreSQL schemas): each order's execution lives in its key's store and is
read, sent to, paused, resumed, cancelled and waited on there, its audit row in that
store; the list walks every store's executions once, newest first; a bulk action
counts every store, runs in each under one job, and its progress sums them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import pytest_asyncio
from tests.console.conftest import CHECKOUT, shop_bindings
from tests.persistence.conftest import (  # noqa: F401 - fixtures used through SQL_BACKENDS
    SQL_BACKENDS,
    SqlStore,
    postgresql_shards,
    sqlite_shards,
)

from statifier.api import Api, ApiToken, Rights
from statifier.chart import compile_chart
from statifier.console.audit import Audit
from statifier.persistence import Status
from statifier.persistence.sql import SqlAdapter
from statifier.router import RouterConfig, ShardedRouter, StaticResolver

pytestmark = pytest.mark.asyncio

OPS = "ops-token-" + "o" * 24
SHOP = "shop-token-" + "s" * 24
ORDERS = [f"o-{number}" for number in range(12)]


@dataclass
class Shop:
    router: ShardedRouter
    client: httpx.AsyncClient

    async def call(self, method: str, path: str, token: str = OPS, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"}
        return await self.client.request(method, path, headers=headers, **kwargs)

    async def checkout(self, order: str) -> dict[str, Any]:
        body = {
            "source": "shop",
            "scope": "web",
            "data": {"kind": "checkout", "order": order, "amount": 5, "timeout": "1h"},
        }
        answer = await self.call("POST", "/events", json=body)
        assert answer.status_code == 200, answer.text
        (outcome,) = [o for o in answer.json()["outcomes"] if o["binding"] == "checkouts"]
        found: dict[str, Any] = outcome
        return found


@pytest_asyncio.fixture(params=SQL_BACKENDS)
async def shop(request: pytest.FixtureRequest) -> AsyncIterator[Shop]:
    stores: list[SqlStore] = request.getfixturevalue(f"{request.param}_shards")
    for store in stores:
        store.empty()
    adapters = [SqlAdapter(store.url, store.tables) for store in stores]
    machine = compile_chart(CHECKOUT.format(receipt=""), name="order")
    config = RouterConfig(
        adapters[0], bindings=shop_bindings(), resolver=StaticResolver({"order": machine})
    )
    router = ShardedRouter(config, adapters)
    api = Api(
        router,
        tokens=[
            ApiToken("ops", OPS, ("*",), Rights.WRITE),
            ApiToken("shop", SHOP, ("web",), Rights.WRITE),
        ],
        visible={"order": ["total"]},
        poll=0.05,
    )
    transport = httpx.ASGITransport(app=api.app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            yield Shop(router, client)
    finally:
        await api.close()
        for adapter in adapters:
            await adapter.close()


async def _orders(shop: Shop) -> dict[str, str]:
    """Checkout every order; answer each order's execution id."""
    ids: dict[str, str] = {}
    for order in ORDERS:
        outcome = await shop.checkout(order)
        assert outcome["outcome"] == "created_and_delivered", outcome
        ids[order] = outcome["execution_id"]
    return ids


async def test_an_execution_is_read_and_acted_on_in_its_keys_store(shop: Shop) -> None:
    ids = await _orders(shop)
    router = shop.router
    stores_used = set()
    for order, execution_id in ids.items():
        home = router.router_of_address("web", "order", order)
        assert router.router_of_execution(execution_id) is home
        assert await home.storage.find_execution(execution_id) is not None
        others = [each for each in router.routers if each is not home]
        for other in others:
            assert await other.storage.find_execution(execution_id) is None
        stores_used.add(router.routers.index(home))
        read = await shop.call("GET", f"/executions/{execution_id}")
        assert read.status_code == 200, read.text
        assert read.json()["addresses"] == [{"scope": "web", "document": "order", "key": order}]
    assert stores_used == {0, 1, 2}

    # Pause, a send held, resume, pay: each in the execution's store, audited there.
    paying = ids["o-3"]
    assert (await shop.call("POST", f"/executions/{paying}/pause")).status_code == 200
    held = await shop.call("POST", f"/executions/{paying}/events", json={"event": "checkout"})
    assert held.json()["outcome"]["outcome"] == "held"
    resumed = await shop.call("POST", f"/executions/{paying}/resume")
    assert resumed.status_code == 200, resumed.text
    waiting = asyncio.create_task(shop.call("GET", f"/executions/{paying}/wait?end=true"))
    paid = await shop.call("POST", f"/executions/{paying}/events", json={"event": "pay"})
    assert paid.json()["outcome"]["execution"]["status"] == "completed"
    waited = await waiting
    assert waited.json()["reached"] is True
    cancelled = await shop.call("POST", f"/executions/{ids['o-4']}/cancel")
    assert cancelled.json()["execution"]["status"] == "cancelled"
    again = await shop.call("POST", f"/executions/{ids['o-4']}/cancel")
    assert again.status_code == 409
    missing = await shop.call("POST", "/executions/ex_nothing/cancel")
    assert missing.status_code == 404
    for execution_id, actions in ((paying, {"pause", "resume"}), (ids["o-4"], {"cancel"})):
        home = router.router_of_execution(execution_id)
        for each in router.routers:
            audit = Audit(each.adapter.engine, each.adapter.tables)
            found = {
                row.action
                for row in (await audit.entries(size=100)).rows
                if row.target == execution_id
            }
            assert found == (actions if each is home else set())


async def test_the_list_walks_every_stores_executions_once_newest_first(shop: Shop) -> None:
    ids = await _orders(shop)
    seen: list[dict[str, Any]] = []
    cursor = None
    while True:
        query = "/executions?limit=5" + ("" if cursor is None else f"&cursor={cursor}")
        page = await shop.call("GET", query)
        assert page.status_code == 200, page.text
        seen.extend(page.json()["executions"])
        cursor = page.json()["next_cursor"]
        if cursor is None:
            break
    assert sorted(row["id"] for row in seen) == sorted(ids.values())
    created = [(row["created_at"], row["id"]) for row in seen]
    assert created == sorted(created, key=lambda item: item[0], reverse=True)
    scoped = await shop.call("GET", "/executions?scope=web&limit=100", SHOP)
    assert len(scoped.json()["executions"]) == 12
    bad = await shop.call("GET", "/executions?cursor=garbage")
    assert bad.status_code == 400


async def test_a_bulk_action_runs_in_every_store_under_one_job(shop: Shop) -> None:
    ids = await _orders(shop)
    body: dict[str, Any] = {"action": "cancel", "filter": {"scope": "web"}}
    preview = await shop.call("POST", "/bulk", json=body)
    assert preview.json() == {"action": "cancel", "selected": 12}
    changed = await shop.call("POST", "/bulk", json={**body, "confirm": 11})
    assert changed.status_code == 409
    started = await shop.call("POST", "/bulk", json={**body, "confirm": 12})
    assert started.status_code == 202, started.text
    job = started.json()["job"]
    async with asyncio.timeout(30):
        while True:
            progress = (await shop.call("GET", f"/bulk/{job}")).json()
            if progress["state"] != "running":
                break
            await asyncio.sleep(0.05)
    assert progress["state"] == "finished", progress
    assert (progress["selected"], progress["done"], progress["failed"]) == (12, 12, 0)
    assert progress["finished"] is True
    for execution_id in ids.values():
        home = shop.router.router_of_execution(execution_id)
        record = await home.storage.find_execution(execution_id)
        assert record is not None
        assert record.status is Status.CANCELLED
    missing = await shop.call("GET", "/bulk/nothing")
    assert missing.status_code == 404
