"""The HTTP fronts over three stores (a :class:`ShardedRouter` over three SQLite files,
and over three PostgreSQL schemas): a webhook's posts, alone and group committed,
create each parcel's execution in its key's store; a BasicHTTP post reaches its
execution in whichever store holds its location, an unknown token reaches none; with
a store away, a token held elsewhere is still delivered and an unknown one is an
error (the token may be in the store away), not a 404."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from tests.fronts.http_support import LOADED, SCOPE, client, datamodel, parcel_chart
from tests.persistence.conftest import (  # noqa: F401 - fixtures used through SQL_BACKENDS
    SQL_BACKENDS,
    SqlStore,
    postgresql_shards,
    sqlite_shards,
)

from statifier.core import Event
from statifier.fronts.basichttp import basichttp_app
from statifier.fronts.webhook import webhook_app
from statifier.persistence.sql import SqlAdapter
from statifier.router import (
    BasicHttpLocations,
    Delivered,
    RouterConfig,
    ShardedRouter,
    StaticResolver,
    ledger,
)
from statifier.sql.locations import downgrade_locations, upgrade_locations

pytestmark = pytest.mark.asyncio

BASE = "https://depot.example/scxml/"
FORM = {"content-type": "application/x-www-form-urlencoded"}
PARCELS = [f"p{number}" for number in range(12)]


def _config(adapter: SqlAdapter) -> RouterConfig:
    return RouterConfig(
        adapter,
        bindings=[LOADED],
        resolver=StaticResolver({"parcel": parcel_chart()}),
        basichttp=BasicHttpLocations(base_url=BASE),
    )


@pytest_asyncio.fixture(params=SQL_BACKENDS)
async def adapters(request: pytest.FixtureRequest) -> AsyncIterator[list[SqlAdapter]]:
    """Three empty stores, each with the location table (created for the test)."""
    stores: list[SqlStore] = request.getfixturevalue(f"{request.param}_shards")
    for store in stores:
        store.empty()
        upgrade_locations(store.url, store.tables)
    opened = [SqlAdapter(store.url, store.tables) for store in stores]
    try:
        yield opened
    finally:
        for adapter in opened:
            await adapter.close()
        for store in stores:
            downgrade_locations(store.url, store.tables)


async def _load(router: ShardedRouter, *, group_commit: float | None) -> dict[str, str]:
    """Every parcel loaded through a webhook app over ``router``, the posts concurrent:
    each parcel's execution id."""
    app = webhook_app(router, source="parcel_scans", scope=SCOPE, group_commit=group_commit)
    async with app.router.lifespan_context(app), client(app) as http:
        answers = await asyncio.gather(
            *(http.post("/", json={"kind": "loaded", "parcel": p}) for p in PARCELS)
        )
    assert [answer.status_code for answer in answers] == [200] * len(PARCELS)
    ids: dict[str, str] = {}
    for number, each in enumerate(router.routers):
        for row in await ledger(each):
            assert row.outcome == "created_and_delivered", row
            assert row.key is not None
            assert row.execution_id is not None
            assert row.key not in ids, f"{row.key} created twice (store {number})"
            ids[row.key] = row.execution_id
    assert sorted(ids) == sorted(PARCELS)
    return ids


@pytest.mark.parametrize("group_commit", [None, 0.005], ids=["alone", "group-commit"])
async def test_a_webhook_over_three_stores_creates_each_execution_in_its_keys_store(
    adapters: list[SqlAdapter], group_commit: float | None
) -> None:
    router = ShardedRouter(_config(adapters[0]), adapters)
    ids = await _load(router, group_commit=group_commit)
    for parcel, execution_id in ids.items():
        home = router.router_of_address(SCOPE, "parcel", parcel)
        assert router.router_of_execution(execution_id) is home
        assert (await home.storage.fetch_execution(execution_id)).id == execution_id
    held = [len(await each.storage.list_executions()) for each in router.routers]
    assert sum(held) == len(PARCELS)
    assert all(held)  # the keys spread over every store


async def test_a_basichttp_post_reaches_its_execution_in_the_store_of_its_location(
    adapters: list[SqlAdapter],
) -> None:
    router = ShardedRouter(_config(adapters[0]), adapters)
    ids = await _load(router, group_commit=None)
    async with client(basichttp_app(router)) as http:
        for parcel, execution_id in ids.items():
            home = router.router_of_execution(execution_id)
            location = await home.location(execution_id)
            assert location is not None
            token = location.removeprefix(BASE)
            answer = await http.post(f"/{token}", content=b"_scxmleventname=scanned", headers=FORM)
            assert answer.status_code == 204, (parcel, answer.text)
            assert (await datamodel(home, execution_id))["scans"] == 1
        unknown = await http.post(f"/{'a' * 43}", content=b"_scxmleventname=scanned", headers=FORM)
        assert unknown.status_code == 404


async def test_with_a_store_away_a_token_held_elsewhere_is_delivered_one_of_its_bucket_raises(
    sqlite_shards: list[SqlStore],  # noqa: F811 - the imported fixture
    tmp_path: Path,
) -> None:
    for store in sqlite_shards:
        store.empty()
        upgrade_locations(store.url, store.tables)
    adapters = [SqlAdapter(store.url, store.tables) for store in sqlite_shards]
    away = SqlAdapter(f"sqlite:///{tmp_path / 'missing' / 'store.db'}")
    try:
        whole = ShardedRouter(_config(adapters[0]), adapters)
        ids = await _load(whole, group_commit=None)
        placed = [(p, i) for p, i in ids.items() if whole.shard_map.store_of_id(i) != 2]
        parcel, execution_id = placed[0]
        location = await whole.router_of_execution(execution_id).location(execution_id)
        assert location is not None
        broken = ShardedRouter(_config(adapters[0]), [adapters[0], adapters[1], away])
        scanned = Event(name="scanned")
        outcome = await broken.deliver_post(location.removeprefix(BASE), scanned)
        assert isinstance(outcome, Delivered), (parcel, outcome)
        # A token carries its bucket: only the store holding the bucket is asked.
        held_here = f"{'b' * 43}.{broken.shard_map.ranges[0][0]:03x}"
        held_away = f"{'b' * 43}.{broken.shard_map.ranges[2][0]:03x}"
        assert await broken.deliver_post(held_here, scanned) is None
        with pytest.raises(Exception, match="unable to open database file"):
            await broken.deliver_post(held_away, scanned)
        # One minted before tokens carried their bucket is asked of every store.
        with pytest.raises(Exception, match="unable to open database file"):
            await broken.deliver_post("b" * 43, scanned)
        async with client(basichttp_app(broken)) as http:
            for token, status in ((held_here, 404), (held_away, 500), ("b" * 43, 500)):
                answer = await http.post(f"/{token}", content=b"_scxmleventname=x", headers=FORM)
                assert answer.status_code == status, token  # 500: it may be in the store away
    finally:
        await away.close()
        for adapter in adapters:
            await adapter.close()
        for store in sqlite_shards:
            downgrade_locations(store.url, store.tables)
