"""The console over three stores (a :class:`ShardedRouter` over three SQLite files, and
over three PostgreSQL schemas): every store's executions listed once, newest first,
and each one's page opened from its store; pause, resume and cancel acting in the
execution's store, their audit rows there, and the audit page merging the stores'
rows newest first; a dead letter's links naming its store (a bad store a 400); a bulk
run counted and run in every store under one run; the held events of every store
merged by address, page after page; the leases shown store by store; a revision tried
on every store's executions (selected, limited and sampled as over one database), its
divergence drawn from the execution's own store."""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import pytest_asyncio
import sqlalchemy as sa
from tests.console.conftest import CHECKOUT, shop_bindings
from tests.persistence.conftest import (  # noqa: F401 - fixtures used through SQL_BACKENDS
    SQL_BACKENDS,
    SqlStore,
    postgresql_shards,
    sqlite_shards,
)

from statifier.buckets import bucket_of
from statifier.chart import compile_chart
from statifier.console.app import Console, console_app
from statifier.console.audit import Audit
from statifier.console.auth import Operator, Operators, Role, Sessions
from statifier.fronts.leases import PartitionLeases
from statifier.persistence import Status
from statifier.persistence.sql import SqlAdapter
from statifier.router import (
    Binding,
    FlowWorker,
    InboundEvent,
    Mode,
    Router,
    RouterConfig,
    ShardedRouter,
    StaticResolver,
)
from statifier.shadow import Selection, shadow_replay_stores
from statifier.sql import migrations

pytestmark = pytest.mark.asyncio

ADA = "ada-token-0123456789abcdef"
ORDERS = [f"o-{number}" for number in range(12)]
NOTES = Binding(
    id="notes",
    source="desk",
    match="true",
    key="event.order",
    document="order",
    event="note",
    mode=Mode.DEBOUNCE,
    window=timedelta(hours=1),
)
"""Holds a desk's notes on an order for an hour (no flow worker runs here)."""


@dataclass
class Site:
    """A console over three stores, and a client of it."""

    stores: list[SqlStore]
    router: ShardedRouter
    console: Console
    client: httpx.AsyncClient

    async def page(self, path: str) -> str:
        answer = await self.client.get(path)
        assert answer.status_code == 200, answer.text
        return answer.text

    async def post(self, path: str) -> httpx.Response:
        """Confirm the action at ``path`` with its form's CSRF token."""
        found = re.search(r'name="csrf" value="([^"]+)"', await self.page(path))
        assert found is not None
        return await self.client.post(path, data={"csrf": found.group(1)})

    async def checkout(self, order: str) -> str:
        """Route a checkout of ``order``; answer the execution it created."""
        event = InboundEvent(
            scope="web",
            source="shop",
            message_id=f"checkout-{order}",
            data={"kind": "checkout", "order": order, "amount": 5, "timeout": "1h"},
        )
        routed = await self.router.route(event)
        execution_id = getattr(routed.outcomes[0], "execution_id", None)
        assert isinstance(execution_id, str)
        return execution_id

    async def orders(self) -> dict[str, str]:
        return {order: await self.checkout(order) for order in ORDERS}

    def home(self, execution_id: str) -> Router:
        return self.router.router_of_execution(execution_id)

    def number(self, execution_id: str) -> int:
        return self.router.routers.index(self.home(execution_id))

    async def audit_of(self, router: Router) -> list[tuple[str, str, str]]:
        """The audit rows written in ``router``'s store, newest first."""
        audit = Audit(router.adapter.engine, router.adapter.tables)
        return [(r.action, r.target, r.outcome) for r in (await audit.entries(size=100)).rows]

    def sql(self, number: int, statement: Any) -> Any:
        engine = sa.create_engine(migrations.sync_url(self.stores[number].url))
        try:
            with engine.begin() as connection:
                result = connection.execute(statement)
                return result.fetchall() if result.returns_rows else result.rowcount
        finally:
            engine.dispose()


@pytest_asyncio.fixture(params=SQL_BACKENDS)
async def site(request: pytest.FixtureRequest) -> AsyncIterator[Site]:
    stores: list[SqlStore] = request.getfixturevalue(f"{request.param}_shards")
    for store in stores:
        store.empty()
    adapters = [SqlAdapter(store.url, store.tables) for store in stores]
    machine = compile_chart(CHECKOUT.format(receipt=""), name="order")
    config = RouterConfig(
        adapters[0],
        bindings=[*shop_bindings(), NOTES],
        resolver=StaticResolver({"order": machine}),
    )
    router = ShardedRouter(config, adapters)
    sessions = Sessions(Operators([Operator("ada", ADA, Role.OPERATOR)]), key=b"k" * 32)
    console = Console.of(router, sessions, live_interval=0.05)
    transport = httpx.ASGITransport(app=console_app(console))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            answer = await client.post("/console/login", data={"token": ADA})
            assert answer.status_code == 303, answer.text
            yield Site(stores, router, console, client)
    finally:
        console.close()
        await console.stores.close()
        for adapter in adapters:
            await adapter.close()


def _listed(page: str) -> list[str]:
    return re.findall(r'<tr data-execution-id="([^"]+)"', page)


def _next(page: str) -> str | None:
    found = re.search(r'href="(/console/executions\?[^"]*cursor=[^"]+)"', page)
    return None if found is None else found.group(1).replace("&amp;", "&")


async def test_every_stores_executions_are_listed_once_and_open_from_their_store(
    site: Site,
) -> None:
    ids = await site.orders()
    assert {site.number(execution_id) for execution_id in ids.values()} == {0, 1, 2}
    seen: list[str] = []
    path: str | None = "/console/executions?size=5"
    while path is not None:
        page = await site.page(path)
        seen.extend(_listed(page))
        path = _next(page)
    assert sorted(seen) == sorted(ids.values())
    assert len(seen) == len(set(seen))
    # Newest first: the orders were created one after another.
    assert seen == [ids[order] for order in reversed(ORDERS)]
    for order, execution_id in ids.items():
        page = await site.page(f"/console/executions/{execution_id}")
        assert f"Execution {execution_id}" in page
        assert order in page  # its address, read in its store
        assert "awaiting_payment" in page  # its position, loaded with its store's chart
    bad = await site.client.get("/console/executions?cursor=garbage")
    assert bad.status_code == 400
    missing = await site.client.get("/console/executions/ex_nothing")
    assert missing.status_code == 404


async def test_actions_run_in_the_executions_store_and_the_audit_page_merges(
    site: Site,
) -> None:
    ids = await site.orders()
    by_store: dict[int, str] = {}
    for execution_id in ids.values():
        by_store.setdefault(site.number(execution_id), execution_id)
    first, second, third = (by_store[number] for number in range(3))
    for path in (
        f"/console/executions/{first}/pause",
        f"/console/executions/{second}/cancel",
        f"/console/executions/{first}/resume",
        f"/console/executions/{third}/pause",
    ):
        answer = await site.post(path)
        assert answer.status_code == 303, answer.text
    again = await site.post(f"/console/executions/{second}/cancel")
    assert again.status_code == 409  # ended already: refused, and recorded so
    statuses = {
        execution_id: (await site.home(execution_id).storage.fetch_execution(execution_id)).status
        for execution_id in (first, second, third)
    }
    assert statuses == {first: Status.ACTIVE, second: Status.CANCELLED, third: Status.PAUSED}
    # Each row in its execution's store, the refusal's too.
    assert await site.audit_of(site.router.routers[0]) == [
        ("resume", first, "done"),
        ("pause", first, "done"),
    ]
    assert await site.audit_of(site.router.routers[1]) == [
        ("cancel", second, "refused"),
        ("cancel", second, "done"),
    ]
    assert await site.audit_of(site.router.routers[2]) == [("pause", third, "done")]
    # The audit page: every store's rows, newest first, a page at a time.
    shown: list[tuple[str, str]] = []
    audit: str | None = "/console/audit?size=2"
    while audit is not None:
        page = await site.page(audit)
        body = page.split("<tbody", 1)[1].split("</tbody>", 1)[0]
        shown.extend(re.findall(r"<td>(pause|resume|cancel)</td>\s*<td>([^<]+)</td>", body))
        found = re.search(r'href="(/console/audit\?[^"]*cursor=[^"]+)"', page)
        audit = None if found is None else found.group(1).replace("&amp;", "&")
    assert shown == [
        ("cancel", second),
        ("pause", third),
        ("resume", first),
        ("cancel", second),
        ("pause", first),
    ]
    execution_page = await site.page(f"/console/executions/{second}")
    assert execution_page.count("refused") >= 1  # its own actions, read in its store


def _letter(number: int) -> dict[str, Any]:
    envelope = (
        b'{"scope": "web", "source": "shop", "message_id": "late-o-100", "data": '
        b'{"kind": "checkout", "order": "o-100", "amount": 2, "timeout": "1h"}}'
    )
    return {
        "source": "inbound",
        "partition": "0",
        "position": number,
        "message_id": "late-o-100",
        "reason": "failed too often",
        "raw": envelope,
        "dead_at": datetime.now(UTC),
    }


async def test_an_executions_page_reads_its_own_store_alone(site: Site) -> None:
    # One execution is read in its bucket's store: its page, its rows and its audit
    # rows. A store that cannot be read (its audit table gone here; a stopped server
    # in production) leaves the other stores' executions' pages whole.
    ids = await site.orders()
    by_store: dict[int, str] = {}
    for execution_id in ids.values():
        by_store.setdefault(site.number(execution_id), execution_id)
    paused = await site.post(f"/console/executions/{by_store[0]}/pause")
    assert paused.status_code == 303, paused.text
    audit = site.stores[2].tables.console_audit
    site.sql(2, sa.text(f"ALTER TABLE {_qualified(audit)} RENAME TO {audit.name}_away"))
    try:
        for number in (0, 1):
            page = await site.page(f"/console/executions/{by_store[number]}")
            assert f"Execution {by_store[number]}" in page
        assert "pause" in await site.page(f"/console/executions/{by_store[0]}")
        broken = await site.client.get(f"/console/executions/{by_store[2]}")
        assert broken.status_code == 500
    finally:
        away = f"{audit.schema}.{audit.name}_away" if audit.schema else f"{audit.name}_away"
        site.sql(2, sa.text(f"ALTER TABLE {away} RENAME TO {audit.name}"))


def _qualified(table: sa.Table) -> str:
    return f"{table.schema}.{table.name}" if table.schema else table.name


async def test_a_dead_letters_links_name_its_store_and_a_bad_store_is_400(site: Site) -> None:
    letters = site.stores[2].tables.consumer_dead_letters
    site.sql(2, letters.insert().values(_letter(1)))
    ((letter,),) = site.sql(2, sa.select(letters.c.id))
    outbox = site.stores[1].tables.outbox
    now = datetime.now(UTC)
    site.sql(
        1,
        outbox.insert().values(
            queue="joined",
            key="a",
            payload={"event": "e", "execution_id": "ex_1", "scope": "web"},
            execution_id="ex_1",
            bucket=bucket_of("ex_1"),
            attempts=8,
            next_attempt_at=now,
            dead_at=now,
            last_error="HTTP 500",
            inserted_at=now,
        ),
    )
    ((row,),) = site.sql(1, sa.select(outbox.c.id))
    failures = await site.page("/console/failures")
    assert f"/console/failures/consumer/2.{letter}/retry" in failures
    assert f"/console/failures/outbox/1.{row}/retry" in failures
    for bad in (f"{letter}", f"3.{letter}", f"x.{letter}", "2.", f"-1.{letter}"):
        for method in ("GET", "POST"):
            answer = await site.client.request(
                method, f"/console/failures/consumer/{bad}/retry", data={"csrf": "whatever"}
            )
            assert answer.status_code == 400, (bad, method, answer.text)
    assert site.sql(2, sa.select(letters.c.id)) == [(letter,)]
    # The outbox row is store 1's: store 0 has none of that id.
    elsewhere = await site.post(f"/console/failures/outbox/0.{row}/retry")
    assert elsewhere.status_code == 409
    retried = await site.post(f"/console/failures/outbox/1.{row}/retry")
    assert retried.status_code == 303, retried.text
    assert site.sql(1, sa.select(outbox.c.dead_at, outbox.c.attempts)) == [(None, 0)]
    # The letter's event is routed by the sharded router: its order's execution lands
    # in its key's store, whichever store held the letter.
    answer = await site.post(f"/console/failures/consumer/2.{letter}/retry")
    assert answer.status_code == 303, answer.text
    assert site.sql(2, sa.select(letters.c.id)) == []
    home = site.router.router_of_address("web", "order", "o-100")
    assert home is not site.router.routers[2]  # routed across stores, not in the letter's
    (created,) = await home.storage.list_executions()
    assert site.home(created.id) is home
    assert (await site.audit_of(site.router.routers[2]))[0][:2] == (
        "retry_consumer",
        f"consumer:2.{letter}",
    )
    assert (await site.audit_of(site.router.routers[1]))[0][:2] == (
        "retry_outbox",
        f"outbox:1.{row}",
    )
    assert (await site.audit_of(site.router.routers[0]))[0][:3] == (
        "retry_outbox",
        f"outbox:0.{row}",
        "refused",
    )


async def test_a_bulk_run_counts_and_acts_in_every_store_under_one_run(site: Site) -> None:
    ids = await site.orders()
    query = "/console/bulk?action=pause&scope=web"
    previewed = await site.page(query)
    assert 'data-selected="12"' in previewed
    found = re.search(r'name="csrf" value="([^"]+)"', previewed)
    assert found is not None
    fields = {"csrf": found.group(1), "action": "pause", "scope": "web", "revision": "", "map": ""}
    moved = await site.client.post("/console/bulk", data=fields | {"confirm": "11"})
    assert moved.status_code == 409
    started = await site.client.post("/console/bulk", data=fields | {"confirm": "12"})
    assert started.status_code == 303, started.text
    run_page = started.headers["location"]
    shown = ""
    for _ in range(400):
        shown = await site.page(run_page)
        if 'data-state="finished"' in shown:
            break
        await asyncio.sleep(0.05)
    assert '<td data-count="done">12</td>' in shown, shown
    assert '<td data-count="failed">0</td>' in shown
    for execution_id in ids.values():
        record = await site.home(execution_id).storage.fetch_execution(execution_id)
        assert record.status is Status.PAUSED
    listed = await site.page("/console/bulk")
    assert listed.count(run_page.rsplit("/", 1)[1]) >= 1


async def test_the_leases_are_shown_store_by_store(site: Site) -> None:
    # Each store's services share its bucket range by slices of their own.
    for number, router in enumerate(site.router.routers[:2]):
        slices = PartitionLeases(
            router.adapter,
            group="statifier.buckets/2",
            partitions=["a", "b"],
            owner=f"svc-{number}",
        )
        await slices.claim()
    page = await site.page("/console/leases")
    sections = re.findall(
        r'<section class="store" data-store="(\d)">(.*?)\n</section>', page, re.DOTALL
    )
    # Numbered from 0, as readiness ("database (store 2)"), the logs and the failures'
    # links ("2.17") number them.
    assert [number for number, _ in sections] == ["0", "1", "2"]
    for number, section in sections[:2]:
        assert f"<h2>Store {number}</h2>" in section
        assert f'<tr data-member="svc-{number}" data-alive="1">' in section
        assert section.count('data-state="held"') == 2
    assert "Nothing is leased in this store" in sections[2][1]


async def test_a_store_that_does_not_answer_is_named_and_the_others_leases_shown(
    site: Site,
) -> None:
    ids = await site.orders()
    for number, router in enumerate(site.router.routers[:2]):
        slices = PartitionLeases(
            router.adapter, group="statifier.buckets/2", partitions=["a"], owner=f"svc-{number}"
        )
        await slices.claim()
    leases = site.stores[2].tables.partition_leases
    executions = site.stores[1].tables.executions
    with _renamed(site, 2, leases), _renamed(site, 1, executions):
        page = await site.page("/console/leases")
        sections = dict(
            re.findall(
                r'<section class="store" data-store="(\d)">(.*?)\n</section>', page, re.DOTALL
            )
        )
        assert 'data-member="svc-0"' in sections["0"]
        assert 'data-member="svc-1"' in sections["1"]
        assert "This store failed to answer" in sections["2"]
        # A list that needs every store names the one that failed, not a host.
        for path in ("/console/executions", "/console/executions?document=order"):
            listed = await site.client.get(path)
            assert listed.status_code == 503, listed.text
            assert "store 1 of 3 failed" in listed.text
        # A bulk run is refused the same way, as a page: never the server's bare 500.
        form = await site.page("/console/bulk")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form)
        assert csrf is not None
        started = await site.client.post(
            "/console/bulk",
            data={"csrf": csrf.group(1), "action": "pause", "confirm": str(len(ids))},
        )
        assert started.status_code == 503, started.text
        assert started.headers["content-type"].startswith("text/html")
        assert "store 1 of 3 failed" in started.text
        # One execution is read in its own store: the failing one is named; the
        # others' pages open.
        by_store = {site.number(execution_id): execution_id for execution_id in ids.values()}
        failing = await site.client.get(f"/console/executions/{by_store[1]}")
        assert failing.status_code == 503, failing.text
        assert "store 1 of 3 failed" in failing.text
        assert "it holds this execution" in failing.text
        assert (await site.client.get(f"/console/executions/{by_store[0]}")).status_code == 200
    listed = await site.client.get("/console/executions")
    assert listed.status_code == 200


@contextlib.contextmanager
def _renamed(site: Site, number: int, table: sa.Table) -> Iterator[None]:
    """``table`` of store ``number`` out of the way while the block runs: the store
    answers none of the reads that need it, as a stopped server would not."""
    schema = f"{table.schema}." if table.schema else ""
    site.sql(number, sa.text(f"ALTER TABLE {schema}{table.name} RENAME TO {table.name}_away"))
    try:
        yield
    finally:
        site.sql(number, sa.text(f"ALTER TABLE {schema}{table.name}_away RENAME TO {table.name}"))


async def test_the_held_events_of_every_store_are_merged_by_address(site: Site) -> None:
    keys = sorted(f"n-{number:02}" for number in range(12))
    for number, key in enumerate(keys):
        event = InboundEvent(
            scope="web", source="desk", message_id=f"note-{number}", data={"order": key}
        )
        routed = await site.router.route(event)
        assert [outcome.outcome for outcome in routed.outcomes] == ["buffered"]
    held = [(await FlowWorker(router).totals())[0] for router in site.router.routers]
    assert all(held)  # the addresses spread over every store
    assert sum(held) == len(keys)
    seen: list[list[str]] = []
    path: str | None = "/console/held?size=5"
    while path is not None:
        page = await site.page(path)
        seen.append(
            re.findall(r'<tr data-binding="notes" data-scope="web" data-key="([^"]*)"', page)
        )
        assert '<span data-total="addresses">12</span>' in page
        found = re.search(r'<a class="next-page" rel="next" href="([^"]+)"', page)
        path = None if found is None else found.group(1).replace("&amp;", "&")
    assert [len(rows) for rows in seen] == [5, 5, 2]
    assert [key for rows in seen for key in rows] == keys


async def test_a_replay_over_the_stores_selects_as_over_one_database(site: Site) -> None:
    ids = list((await site.orders()).values())  # oldest first
    urls = [store.url for store in site.stores]
    tables = [store.tables.options for store in site.stores]
    revision = compile_chart(CHECKOUT.format(receipt=""), name="order")

    async def replayed(selection: Selection) -> list[str]:
        summary = await shadow_replay_stores(urls, revision, selection, tables=tables)
        assert summary.all_same
        return [result.execution_id for result in summary.results]

    assert await replayed(Selection()) == ids
    assert await replayed(Selection(limit=5)) == ids[:5]
    drawn = set(random.Random(7).sample(ids, 4))
    assert await replayed(Selection(sample=4, seed=7)) == [i for i in ids if i in drawn]
    assert await replayed(Selection(document="nothing")) == []
    with pytest.raises(ValueError, match="3 store URLs with 2 tables' options"):
        await shadow_replay_stores(urls, revision, tables=tables[:2])


async def test_a_revision_is_tried_on_every_stores_executions(site: Site) -> None:
    ids = await site.orders()
    page = await site.page("/console/revisions")
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None
    tripled = CHECKOUT.format(receipt="").replace("* 2", "* 3").encode()
    answer = await site.client.post(
        "/console/revisions",
        data={"csrf": found.group(1)},
        files={"chart": ("order.scxml", tripled)},
    )
    assert answer.status_code == 303, answer.text
    path = answer.headers["location"]
    shown = ""
    for _ in range(400):
        shown = await site.page(path)
        if 'id="job-state">running<' not in shown:
            break
        await asyncio.sleep(0.05)
    assert 'id="job-state">done<' in shown, shown
    assert f'id="progress-text">{len(ORDERS)} of {len(ORDERS)} executions<' in shown
    listed = re.findall(r'class="result" data-execution-id="([^"]+)" data-verdict="(\w+)"', shown)
    assert sorted(listed) == sorted((execution_id, "diverged") for execution_id in ids.values())
    last = next(i for i in ids.values() if site.number(i) == 2)  # a chart of the last store
    parted = await site.page(f"{path}?execution={last}")
    assert 'id="old-configuration">awaiting_payment<' in parted
    # The schedules live in the first store: their page is served.
    assert "Schedules" in await site.page("/console/schedules")
