"""``statifier serve`` over several stores (``[database] shards``): the file's URLs read
and refused; in process, over three SQLite files, the inbound-events table's events
each stepped once in its key's store, a schedule's fires delivered in the stores their
keys are in, the HTTP API sending to and listing every store's executions, a webhook's
posts stepped in their keys' stores and a BasicHTTP post reaching its execution in
whichever store holds its location; over three PostgreSQL
servers of the test's own, a store whose server stops named by readiness until it is
back."""

from __future__ import annotations

import asyncio
import io
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from tests.fronts.http_support import datamodel
from tests.service.helpers import HITS, HITS_BINDING, running, write_config
from tests.service.own_postgres import servers

from statifier.cli import main
from statifier.fronts.table_source import append_events
from statifier.persistence.shards import ShardMap
from statifier.persistence.sql import SqlAdapter
from statifier.router import InboundEvent, ShardedRouter, ledger
from statifier.service import ServiceConfigError, load
from statifier.service.bucket_leases import slice_name, slices_of
from statifier.service.service import Service, prepare_database
from statifier.service.settings import ServiceSettings
from statifier.service.wiring import router_config
from statifier.sql import TableOptions, migrations
from statifier.sql.places import Place, serving_since, write_place
from statifier.sql.routing import LedgerRow

SHUTDOWN_TIMEOUT = 8.0
KEYS = [f"k{number}" for number in range(12)]


def _shards(folder: Path, count: int = 3) -> str:
    urls = ", ".join(f'"sqlite:///{folder / f"store{n}.db"}"' for n in range(count))
    return f'[database]\nshards = [{urls}]\nprefix = "t_"\n'


def _body(folder: Path, more: str = "") -> str:
    return f"""
migrate = true
shutdown_timeout = {SHUTDOWN_TIMEOUT}
charts = "charts"
{HITS_BINDING}
{_shards(folder)}
[http]
port = 0

[sources.inbound]
kind = "table"
partitions = ["0"]

[sources.inbound.consumer]
commit_interval = 0.05
{more}"""


def _refused(tmp_path: Path, body: str, environ: dict[str, str] | None = None) -> str:
    config = write_config(tmp_path, body, {"hits": HITS})
    with pytest.raises(ServiceConfigError) as refused:
        load(config, environ or {})
    return str(refused.value)


@pytest.mark.parametrize(
    ("database", "said"),
    [
        ('shards = ["sqlite:///a.db"]', "must list 2 to 64 non-empty strings"),
        ('shards = ["sqlite:///a.db", "sqlite:///a.db"]', "names one store twice"),
        ('shards = ["sqlite:///a.db", 3]', "must list 2 to 64 non-empty strings"),
        (
            'url = "sqlite:///a.db"\nshards = ["sqlite:///b.db", "sqlite:///c.db"]',
            "give one of url, url_env, shards and shards_env, not url too",
        ),
        ('shards_env = ["STORE_A", "STORE_B"]', "the environment variable STORE_B is not set"),
        ('shards = ["sqlite:///a.db", "mysql://b"]', "shards"),
    ],
)
def test_the_stores_urls_are_read_and_refused_naming_the_key(
    tmp_path: Path, database: str, said: str
) -> None:
    body = f'charts = "charts"\n{HITS_BINDING}\n[database]\n{database}\n'
    message = _refused(tmp_path, body, {"STORE_A": "sqlite:///x.db"})
    assert "[database]" in message
    assert said in message


def test_the_stores_urls_from_the_environment_stay_out_of_repr(tmp_path: Path) -> None:
    body = f'charts = "charts"\n{HITS_BINDING}\n[database]\nshards_env = ["STORE_A", "STORE_B"]\n'
    config = write_config(tmp_path, body, {"hits": HITS})
    secret = "postgresql://user:hunter2@db.internal/one"
    environ = {"STORE_A": secret, "STORE_B": "postgresql://user:hunter2@db.internal/two"}
    settings = load(config, environ)
    assert settings.database.urls == (secret, environ["STORE_B"])
    assert settings.database.url == secret
    assert "hunter2" not in repr(settings)


def _router(settings: ServiceSettings, adapters: list[SqlAdapter]) -> ShardedRouter:
    return ShardedRouter(router_config(settings, adapters[0]), adapters)


@pytest.mark.asyncio
async def test_a_service_over_three_stores_steps_each_event_once_in_its_keys_store(
    tmp_path: Path,
) -> None:
    schedule = """
[schedules.sweep]
every = "PT1S"
source = "clicks"
scope = "web"
data = { key = "swept" }
"""
    config = write_config(tmp_path, _body(tmp_path, schedule), {"hits": HITS})
    settings = load(config)
    options = TableOptions(prefix="t_")
    async with running(config) as (_, base), httpx.AsyncClient(timeout=5.0) as client:
        await _ready(client, base)
        adapters = [SqlAdapter(url, options) for url in settings.database.urls]
        try:
            router = _router(settings, adapters)
            events = [
                InboundEvent(
                    scope="web", source="clicks", message_id=f"t{n}", data={"key": KEYS[n % 12]}
                )
                for n in range(36)
            ]
            await append_events(adapters[0], events, partition="0")
            async with asyncio.timeout(30):
                while True:
                    rows = [row for each in router.routers for row in await ledger(each)]
                    stepped = sorted(str(r.message_id) for r in rows if r.binding_id == "hits")
                    swept = any(m.startswith("sweep/") for m in stepped)
                    if swept and len([m for m in stepped if m.startswith("t")]) >= 36:
                        break
                    await asyncio.sleep(0.05)
            # Every event once, in its key's store only.
            for number, each in enumerate(router.routers):
                for row in await ledger(each):
                    if str(row.message_id).startswith("t"):
                        assert row.key is not None
                        assert router.router_of_address("web", "hits", row.key) is each, number
            assert [m for m in stepped if m.startswith("t")] == sorted(f"t{n}" for n in range(36))
            held = [len(await each.storage.list_executions()) for each in router.routers]
            assert sum(held) == 13  # twelve keys and the sweep's
            assert all(held)
        finally:
            for adapter in adapters:
                await adapter.close()


@pytest.mark.asyncio
async def test_readiness_names_a_store_whose_server_stops_until_it_is_back(
    tmp_path: Path,
) -> None:
    with servers(3) as three:
        urls = ", ".join(f'"{server.url}"' for server in three)
        database = f'[database]\nshards = [{urls}]\nprefix = "t_"\n'
        body = _body(tmp_path).replace(_shards(tmp_path), database)
        config = write_config(tmp_path, body, {"hits": HITS})
        async with running(config) as (_, base), httpx.AsyncClient(timeout=5.0) as client:
            await _ready(client, base)
            await asyncio.to_thread(three[2].stop)
            async with asyncio.timeout(30):
                while True:
                    answer = await client.get(f"{base}/readyz")
                    reasons = answer.json().get("reasons", [])
                    if answer.status_code == 503 and any(
                        r.startswith("database (store 2): ") for r in reasons
                    ):
                        break
                    await asyncio.sleep(0.1)
            others = ("database (store 0)", "database (store 1)")
            assert not any(reason.startswith(others) for reason in reasons)
            assert not any("127.0.0.1" in reason for reason in reasons)
            await asyncio.to_thread(three[2].start)
            await _ready(client, base)


@pytest.mark.asyncio
async def test_the_api_over_three_stores_routes_reads_and_lists_every_stores_executions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = "ops-token-" + "o" * 24
    monkeypatch.setenv("OPS_TOKEN", token)
    api = '[api.tokens.ops]\ntoken_env = "OPS_TOKEN"\nscopes = ["*"]\nrights = "write"\n'
    config = write_config(tmp_path, _body(tmp_path, api), {"hits": HITS})
    settings = load(config)
    headers = {"Authorization": f"Bearer {token}"}
    async with running(config) as (_, base), httpx.AsyncClient(timeout=5.0) as client:
        await _ready(client, base)
        ids: dict[str, str] = {}
        for key in KEYS:
            body = {"source": "clicks", "scope": "web", "data": {"key": key}}
            answer = await client.post(f"{base}/api/events", json=body, headers=headers)
            assert answer.status_code == 200, answer.text
            (outcome,) = answer.json()["outcomes"]
            ids[key] = outcome["execution_id"]
        listed = await client.get(f"{base}/api/executions?limit=5", headers=headers)
        seen = [row["id"] for row in listed.json()["executions"]]
        cursor = listed.json()["next_cursor"]
        while cursor is not None:
            page = await client.get(
                f"{base}/api/executions", params={"limit": 5, "cursor": cursor}, headers=headers
            )
            seen.extend(row["id"] for row in page.json()["executions"])
            cursor = page.json()["next_cursor"]
        assert sorted(seen) == sorted(ids.values())
        sent = await client.post(
            f"{base}/api/executions/{ids['k3']}/events", json={"event": "hit"}, headers=headers
        )
        assert sent.json()["outcome"]["outcome"] == "delivered", sent.text
        adapters = [SqlAdapter(url, TableOptions(prefix="t_")) for url in settings.database.urls]
        try:
            router = _router(settings, adapters)
            for key, execution_id in ids.items():
                home = router.router_of_address("web", "hits", key)
                assert router.router_of_execution(execution_id) is home
                assert len(await home.storage.inputs(execution_id)) == (2 if key == "k3" else 1)
            held = [len(await each.storage.list_executions()) for each in router.routers]
            assert all(held)
        finally:
            for adapter in adapters:
                await adapter.close()


@pytest.mark.asyncio
async def test_the_http_fronts_over_three_stores_step_each_post_in_its_keys_store(
    tmp_path: Path,
) -> None:
    fronts = """
[fronts.webhook.clicks]
path = "/hooks"
source = "clicks"
scope = "web"

[fronts.basichttp.events]
path = "/basichttp"
base_url = "http://127.0.0.1/basichttp"
"""
    config = write_config(tmp_path, _body(tmp_path, fronts), {"hits": HITS})
    settings = load(config)
    async with running(config) as (_, base), httpx.AsyncClient(timeout=5.0) as client:
        await _ready(client, base)
        for key in KEYS:
            posted = await client.post(f"{base}/hooks", json={"key": key})
            assert posted.status_code == 200, posted.text
        adapters = [SqlAdapter(url, TableOptions(prefix="t_")) for url in settings.database.urls]
        try:
            router = _router(settings, adapters)
            rows = [await ledger(each) for each in router.routers]
            assert all(rows)  # the keys spread over every store
            for key in KEYS:
                home = router.router_of_address("web", "hits", key)
                found = [(n, r) for n, of in enumerate(rows) for r in of if r.key == key]
                ((number, row),) = found  # once, in its key's store only
                assert router.routers[number] is home
                assert row.outcome == "created_and_delivered"
                assert row.execution_id is not None
                location = await home.location(row.execution_id)
                assert location is not None
                token = location.rsplit("/", 1)[1]
                posted = await client.post(
                    f"{base}/basichttp/{token}", data={"_scxmleventname": "hit"}
                )
                assert posted.status_code == 204, posted.text
                assert (await datamodel(home, row.execution_id))["hits"] == 2
        finally:
            for adapter in adapters:
                await adapter.close()


@pytest.mark.asyncio
async def test_each_stores_reaper_deletes_its_ranges_ledger_rows_past_the_days_kept(
    tmp_path: Path,
) -> None:
    # Each store's reaper deletes the ledger rows of its own buckets written before
    # ledger_days: a recent row stays, and so does an old row of another store's
    # buckets (which no store's reaper is given).
    reapers = "[reapers]\ninterval = 0.2\nledger_days = 30\n"
    config = write_config(tmp_path, _body(tmp_path, reapers), {"hits": HITS})
    settings = load(config)
    options = TableOptions(prefix="t_")
    now = datetime.now(UTC)
    old, recent = now - timedelta(days=31), now - timedelta(days=29)
    adapters = [SqlAdapter(url, options) for url in settings.database.urls]
    try:
        for url in settings.database.urls:
            migrations.upgrade(url, options)
        router = _router(settings, adapters)
        misplaced = next(
            k for k in KEYS if router.router_of_address("web", "hits", k) is not router.routers[0]
        )
        for key in KEYS:
            at = router.router_of_address("web", "hits", key)
            async with at.transaction() as unit:
                for message_id, written in ((f"old-{key}", old), (f"recent-{key}", recent)):
                    await unit.sql.record(_ledger_row(message_id, key, written))
        async with router.routers[0].transaction() as unit:
            await unit.sql.record(_ledger_row("old-elsewhere", misplaced, old))
        async with running(config) as (_, base), httpx.AsyncClient(timeout=5.0) as client:
            await _ready(client, base)
            async with asyncio.timeout(30):
                while True:
                    kept = [
                        sorted(str(row.message_id) for row in await ledger(each))
                        for each in router.routers
                    ]
                    if not any(m.startswith("old-k") for store in kept for m in store):
                        break
                    await asyncio.sleep(0.05)
        assert sorted(m for store in kept for m in store) == sorted(
            [f"recent-{key}" for key in KEYS] + ["old-elsewhere"]
        )
        assert "old-elsewhere" in kept[0]
    finally:
        for adapter in adapters:
            await adapter.close()


@pytest.mark.asyncio
async def test_with_bucket_leases_each_store_leases_its_own_ranges_slices(
    tmp_path: Path,
) -> None:
    # Each store's slices are leased in that store: its range of the map cut in four,
    # every slice held by the one service, whose workers run over the store's range.
    leases = "[bucket_leases]\nenabled = true\nslices = 4\n"
    config = write_config(tmp_path, _body(tmp_path, leases), {"hits": HITS})
    settings = load(config)
    ranges = ShardMap.even(3).ranges
    async with running(config) as (_, base), httpx.AsyncClient(timeout=5.0) as client:
        await _ready(client, base)
        async with asyncio.timeout(10):
            held = _bucket_leases(settings)
            while not all(len(store) == 4 for store in held):
                await asyncio.sleep(0.05)
                held = _bucket_leases(settings)
        answer = (await client.get(f"{base}/readyz")).json()
    assert answer == {"status": "ready"}
    owners = {owner for store in held for _, owner in store}
    assert len(owners) == 1
    for number, store in enumerate(held):
        assert {name for name, _ in store} == {
            slice_name(piece) for piece in slices_of(ranges[number], 4)
        }


def _bucket_leases(settings: ServiceSettings) -> list[set[tuple[str, str | None]]]:
    """Each store's bucket slices and their holders, as its lease table has them."""
    held = []
    for url in settings.database.urls:
        engine = sa.create_engine(url)
        try:
            with engine.connect() as connection:
                rows = connection.execute(
                    sa.text(
                        "SELECT partition, owner FROM t_partition_leases "
                        "WHERE consumer_group LIKE 'statifier.buckets/%' AND owner IS NOT NULL"
                    )
                )
                held.append({(row.partition, row.owner) for row in rows})
        finally:
            engine.dispose()
    return held


def _ledger_row(message_id: str, key: str, at: datetime) -> LedgerRow:
    return LedgerRow(
        "hits",
        message_id=message_id,
        scope="web",
        source="clicks",
        outcome="delivered",
        reason=None,
        document="hits",
        key=key,
        execution_id=None,
        inserted_at=at,
    )


async def _ready(client: httpx.AsyncClient, base: str) -> None:
    """Wait (30 s at most) until the service answers ready."""
    async with asyncio.timeout(30):
        while (await client.get(f"{base}/readyz")).status_code != 200:  # noqa: ASYNC110
            await asyncio.sleep(0.05)


def test_a_service_over_stores_listed_in_other_places_than_they_hold_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, _body(tmp_path), {"hits": HITS})
    prepare_database(load(config))  # each store takes its place
    listed = _shards(tmp_path)
    stores = [f'"sqlite:///{tmp_path / f"store{n}.db"}"' for n in range(3)]
    reordered = listed.replace(", ".join(stores), ", ".join(reversed(stores)))
    assert reordered != listed
    config.write_text(_body(tmp_path).replace(listed, reordered), encoding="utf-8")
    assert main(["serve", str(config)]) == 2
    said = capsys.readouterr().err
    assert said.startswith(
        "statifier serve: store 0 of 3 holds place 2 of 3: the list of stores changed "
        "without statifier reshard"
    )
    assert "store2.db" not in said  # a store is named by its place, never its URL


@pytest.mark.asyncio
async def test_a_service_stops_by_itself_once_a_reshard_marks_one_of_its_stores(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, _body(tmp_path), {"hits": HITS})
    settings = load(config)
    options = TableOptions(prefix="t_")
    urls = settings.database.urls

    def on_store(number: int, work: Any) -> Any:
        engine = sa.create_engine(migrations.sync_url(urls[number]))
        try:
            with engine.begin() as connection:
                return work(connection)
        finally:
            engine.dispose()

    service = Service(settings, io.StringIO())
    running_service = asyncio.create_task(service.run())
    try:
        async with asyncio.timeout(30):
            while service.address is None:  # noqa: ASYNC110 - migrated and listening
                await asyncio.sleep(0.05)
            while any(  # noqa: ASYNC110 - the service says it serves each store
                on_store(n, lambda c: serving_since(c, options, datetime.now(UTC))) is None
                for n in range(3)
            ):
                await asyncio.sleep(0.2)
        # A reshard refuses stores a service runs on, naming the first.
        moved = ["reshard", *[a for url in urls for a in ("--from", url)]]
        moved += [a for url in urls for a in ("--to", url)]
        assert main([*moved, "--prefix", "t_"], io.StringIO()) == 2
        said = capsys.readouterr().err
        assert "statifier reshard: store 0 of --from is served: a service said so" in said
        # What a reshard does first: the service stops by itself, with exit status 3.
        on_store(1, lambda c: write_place(c, options, Place(1, 3, "moving"), datetime.now(UTC)))
        assert await asyncio.wait_for(running_service, 30) == 3
    finally:
        service.stop()
        await asyncio.gather(running_service, return_exceptions=True)
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any(
        m.startswith("store 1: statifier reshard is moving its buckets; the service stops")
        for m in errors
    ), errors
