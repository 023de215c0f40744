"""The console's web app over a real database (SQLite and PostgreSQL), through httpx:
sessions and roles, CSRF, escaping, every action and its audit row (one transaction:
an audit insert that fails undoes the action), pagination, the
execution page's diagram and timeline, the live stream; and the ``[console]`` table of
``statifier serve`` and ``statifier console``'s refusals."""

from __future__ import annotations

import asyncio
import contextlib
import html
import io
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from html import unescape
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import sqlalchemy as sa
from tests.console.conftest import ASSIGN_AT, CHECKOUT, RECEIPT, shop_bindings
from tests.persistence.conftest import (  # noqa: F401 - fixtures used by name
    FreshDatabase,
    fresh_database,
    postgresql_store,
    sqlite_store,
)
from tests.router.conftest import (  # noqa: F401 - fixtures used by name
    RouterDb,
    impression_bindings,
    join_chart,
    router_db,
    router_store,
)

from statifier.buckets import bucket_of
from statifier.chart import compile_chart
from statifier.cli import main
from statifier.console.app import TIMELINE_LINKS, Configured, Console, console_app
from statifier.console.audit import Audit, AuditEntry, AuditRow
from statifier.console.auth import COOKIE, Operator, Operators, Role, Sessions
from statifier.console.bulk import BULK_ACTIONS
from statifier.console.live import Live, TooManyClients
from statifier.console.queries import MAX_SEARCH, ConsoleQueries, ExecutionFilter
from statifier.console.timeline import PREVIEW_CHARS
from statifier.core import Event
from statifier.persistence import Executions, Status
from statifier.persistence.sql import SqlTransaction
from statifier.router import (
    BasicHttpLocations,
    InboundEvent,
    OutboxRoute,
    Router,
    RouterConfig,
    StaticResolver,
    TimerWorker,
)
from statifier.router.locations import LocationRotated
from statifier.service import Service
from statifier.service.config_file import load
from statifier.service.settings import ServiceConfigError
from statifier.sql import migrations
from statifier.sql.locations import upgrade_locations

ADA = "ada-token-0123456789abcdef"
"""The operator's token."""
BOB = "bob-token-0123456789abcdef"
"""The read-only operator's token."""
MARKUP = '<script>alert("x")</script><b>bold</b>'
"""A datamodel value a page must show as text."""


@dataclass
class Site:
    """A console over one backend's database, and a client of it."""

    db: RouterDb
    router: Router
    console: Console
    client: httpx.AsyncClient

    async def login(self, token: str) -> None:
        answer = await self.client.post("/console/login", data={"token": token})
        assert answer.status_code == 303, answer.text

    async def page(self, path: str) -> httpx.Response:
        answer = await self.client.get(path)
        assert answer.status_code == 200, answer.text
        return answer

    async def csrf(self, path: str) -> str:
        """The CSRF token of the confirmation form at ``path``."""
        found = re.search(r'name="csrf" value="([^"]+)"', (await self.page(path)).text)
        assert found is not None
        return found.group(1)

    async def impression(self, key: str, message: str | None = None) -> str:
        """Route an impression of ``key``; answers the execution it created."""
        event = InboundEvent(
            scope="web",
            source="ad_events",
            message_id=message or f"m-{key}",
            data={"kind": "impression", "impression_id": key, "shown_at": "now"},
        )
        routed = await self.router.route(event)
        execution_id = getattr(routed.outcomes[0], "execution_id", None)
        assert isinstance(execution_id, str)
        return execution_id

    async def click(self, key: str) -> None:
        """Route a click on the impression of ``key`` (its execution completes)."""
        event = InboundEvent(
            scope="web",
            source="ad_events",
            message_id=f"c-{key}",
            data={"kind": "click", "impression_id": key, "url": "u"},
        )
        await self.router.route(event)

    async def audit_rows(self) -> list[tuple[str, str, str, str]]:
        page = await self.console.audit.entries()
        return [(row.actor, row.action, row.target, row.outcome) for row in page.rows]

    def sql(self, statement: Any) -> Any:
        engine = sa.create_engine(migrations.sync_url(self.db.store.url))
        try:
            with engine.begin() as connection:
                result = connection.execute(statement)
                return result.fetchall() if result.returns_rows else result.rowcount
        finally:
            engine.dispose()


@pytest_asyncio.fixture
async def site(router_db: RouterDb) -> AsyncIterator[Site]:  # noqa: F811 - the fixture
    store = router_db.store
    upgrade_locations(migrations.sync_url(store.url), store.tables)
    options = store.tables.options
    where = f"{options.schema}." if options.schema else ""
    engine = sa.create_engine(migrations.sync_url(store.url))
    try:
        with engine.begin() as connection:  # outside the tables the fixture empties
            connection.execute(sa.text(f"DELETE FROM {where}{options.name('locations')}"))
    finally:
        engine.dispose()
    async with _site_on(router_db) as site:
        yield site


@contextlib.asynccontextmanager
async def _site_on(db: RouterDb) -> AsyncIterator[Site]:
    """A console over ``db`` with a router of its own (nothing cached yet)."""
    router = db.router(
        impression_bindings(),
        basichttp=BasicHttpLocations("http://127.0.0.1:9/basichttp"),
    )
    operators = Operators(
        [Operator("ada", ADA, Role.OPERATOR), Operator("bob", BOB, Role.READ_ONLY)]
    )
    adapter = db.adapter
    console = Console(
        queries=ConsoleQueries(adapter.engine, adapter.tables),
        audit=Audit(adapter.engine, adapter.tables),
        router=router,
        sessions=Sessions(operators, key=b"k" * 32),
        configured=Configured(bindings=impression_bindings()),
        scopes={},
        live_interval=0.05,
    )
    transport = httpx.ASGITransport(app=console_app(console))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        yield Site(db, router, console, client)


def _lit(page: str) -> list[str]:
    """The states the page's diagram lights."""
    diagram = page.split('id="diagram"', 1)[1].split("</section>", 1)[0]
    assert "<svg" in diagram
    return re.findall(r'<g class="state active" data-state="([^"]+)"', diagram)


# Sessions, roles, CSRF.


PAGES = (
    "/console/executions",
    "/console/executions/ex_1",
    "/console/routing",
    "/console/failures",
    "/console/audit",
)


@pytest.mark.asyncio
async def test_without_a_session_every_page_sends_to_login_and_events_answer_401(
    site: Site,
) -> None:
    for path in PAGES:
        answer = await site.client.get(path)
        assert answer.status_code == 303, path
        assert answer.headers["location"].startswith("/console/login?next=")
    assert (await site.client.get("/console/events")).status_code == 401
    execution_id = await site.impression("k1")
    refused = await site.client.post(f"/console/executions/{execution_id}/cancel", data={})
    assert refused.status_code == 401
    record = await site.router.storage.fetch_execution(execution_id)
    assert record.status is Status.ACTIVE
    login = await site.client.get("/console/login")
    assert login.status_code == 200
    assert 'name="token"' in login.text


@pytest.mark.asyncio
async def test_a_wrong_token_is_refused_and_a_right_one_starts_a_strict_session(
    site: Site,
) -> None:
    wrong = await site.client.post("/console/login", data={"token": "not-a-token-at-all"})
    assert wrong.status_code == 401
    assert COOKIE not in wrong.cookies
    assert "not-a-token-at-all" not in wrong.text  # a posted token is never echoed
    right = await site.client.post(
        "/console/login", data={"token": ADA, "next": "/console/routing"}
    )
    assert right.status_code == 303
    assert right.headers["location"] == "/console/routing"
    cookie = right.headers["set-cookie"]
    for attribute in ("HttpOnly", "SameSite=strict", "Path=/console/"):
        assert attribute.lower() in cookie.lower()
    assert ADA not in cookie
    page = await site.page("/console/executions")
    assert "ada (operator)" in page.text
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy
    assert "script-src 'self';" in policy
    assert "style-src 'self';" in policy  # nothing inline
    assert 'style="' not in page.text


@pytest.mark.asyncio
async def test_login_goes_on_only_to_a_console_page(site: Site) -> None:
    for elsewhere in ("https://evil.example/", "//evil.example/console/", "/console/..//x"):
        answer = await site.client.post("/console/login", data={"token": ADA, "next": elsewhere})
        assert answer.headers["location"] == "/console/executions", elsewhere


@pytest.mark.asyncio
async def test_a_login_posted_from_another_site_is_refused(site: Site) -> None:
    """Login CSRF: another site's page posting an operator token (its own) must not log
    this browser in."""
    host = site.client.base_url.netloc.decode()
    for headers in (
        {"sec-fetch-site": "cross-site"},
        {"sec-fetch-site": "cross-site", "origin": f"http://{host}"},
        {"origin": "https://evil.example"},
        {"origin": "null"},
    ):
        answer = await site.client.post("/console/login", data={"token": ADA}, headers=headers)
        assert answer.status_code == 403, headers
        assert COOKIE not in answer.cookies
        assert "own form" in answer.text
    for headers in (
        {"sec-fetch-site": "same-origin", "origin": f"http://{host}"},
        {"origin": f"http://{host}"},
        {},
    ):
        answer = await site.client.post("/console/login", data={"token": ADA}, headers=headers)
        assert answer.status_code == 303, headers


@pytest.mark.asyncio
async def test_a_forged_or_foreign_cookie_is_no_session(site: Site) -> None:
    await site.login(ADA)
    cookie = site.client.cookies[COOKIE]
    body, _, signature = cookie.partition(".")
    site.client.cookies.clear()
    site.client.cookies.set(COOKIE, body + "." + signature[::-1], path="/console/")
    assert (await site.client.get("/console/executions")).status_code == 303
    other = Sessions(site.console.sessions.operators, key=b"o" * 32)
    site.client.cookies.clear()
    ada = site.console.sessions.operators.named("ada")
    site.client.cookies.set(COOKIE, other.issue(ada), path="/console/")
    assert (await site.client.get("/console/executions")).status_code == 303


@pytest.mark.asyncio
async def test_a_read_only_operator_sees_no_action_and_is_refused_every_one(site: Site) -> None:
    execution_id = await site.impression("k1")
    await site.login(BOB)
    page = await site.page(f"/console/executions/{execution_id}")
    assert 'id="cancel"' not in page.text
    assert 'id="rotate"' not in page.text
    for path in (
        f"/console/executions/{execution_id}/cancel",
        f"/console/executions/{execution_id}/rotate",
        "/console/failures/outbox/1/retry",
        "/console/failures/consumer/1/discard",
    ):
        assert (await site.client.get(path)).status_code == 403, path
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert csrf is not None  # the logout form's: a valid token of this session
        answer = await site.client.post(path, data={"csrf": csrf.group(1)})
        assert answer.status_code == 403, path
    record = await site.router.storage.fetch_execution(execution_id)
    assert record.status is Status.ACTIVE
    assert await site.audit_rows() == []


@pytest.mark.asyncio
async def test_an_action_without_the_sessions_csrf_token_is_refused(site: Site) -> None:
    execution_id = await site.impression("k1")
    await site.login(ADA)
    path = f"/console/executions/{execution_id}/cancel"
    assert (await site.client.post(path, data={})).status_code == 403
    assert (await site.client.post(path, data={"csrf": "guessed"})).status_code == 403
    other = site.console.sessions.read(
        site.console.sessions.issue(site.console.sessions.operators.named("ada"))
    )
    assert other is not None  # another session of the same operator: another token
    assert (await site.client.post(path, data={"csrf": other.csrf})).status_code == 403
    record = await site.router.storage.fetch_execution(execution_id)
    assert record.status is Status.ACTIVE
    assert await site.audit_rows() == []


# What pages show.


@pytest.mark.asyncio
async def test_markup_in_the_datamodel_and_in_keys_is_shown_as_text(site: Site) -> None:
    execution_id = await site.impression(MARKUP)
    await site.login(ADA)
    page = await site.page(f"/console/executions/{execution_id}")
    assert "<script>alert" not in page.text
    assert "<b>bold</b>" not in page.text
    datamodel = page.text.split('id="datamodel"', 1)[1].split("</section>", 1)[0]
    assert "&lt;script&gt;" in datamodel
    assert MARKUP.replace('"', '\\"') in unescape(datamodel)  # as JSON text
    routing = await site.page(f"/console/routing?key={MARKUP}")
    assert "<script>alert" not in routing.text
    assert execution_id in routing.text.split('id="addresses"', 1)[1]


@pytest.mark.asyncio
async def test_the_execution_page_draws_the_chart_lit_and_steps_through_the_log(
    site: Site,
) -> None:
    execution_id = await site.impression("k1")
    await site.login(ADA)
    running = (await site.page(f"/console/executions/{execution_id}")).text
    assert _lit(running) == ["shown"]
    await site.click("k1")
    page = (await site.page(f"/console/executions/{execution_id}")).text
    assert 'id="status" class="status-completed">completed<' in page
    assert _lit(page) == ["joined"]  # the final state it ended in
    timeline = page.split('id="timeline"', 1)[1].split("</section>", 1)[0]
    steps = re.findall(r'class="replay-step" data-step="(\d+)" href="\?step=(\d+)"', timeline)
    assert [int(n) for n, _ in steps] == [0, 1, 2]
    start = (await site.page(f"/console/executions/{execution_id}?step=0")).text
    assert _lit(start) == ["waiting"]
    assert 'aria-current="step"' in start
    first = (await site.page(f"/console/executions/{execution_id}?step=1")).text
    assert 'id="configuration">shown<' in first
    assert _lit(first) == ["shown"]
    assert '"k1"' in unescape(first.split('id="datamodel"', 1)[1].split("</section>", 1)[0])
    assert (await site.client.get(f"/console/executions/{execution_id}?step=9")).status_code == 400
    assert (await site.client.get("/console/executions/ex_missing")).status_code == 404


async def _completed(site: Site) -> tuple[str, str]:
    """An impression clicked (its execution completed): its id and chart's hash."""
    execution_id = await site.impression("k1")
    await site.click("k1")
    record = await site.router.storage.fetch_execution(execution_id)
    return execution_id, record.content_hash


@pytest.mark.asyncio
async def test_an_execution_whose_chart_is_retired_says_so(site: Site) -> None:
    execution_id, content_hash = await _completed(site)
    await site.router.storage.retire_chart(content_hash, "ada", datetime.now(UTC))
    async with _site_on(site.db) as fresh:  # nothing compiled yet
        await fresh.login(ADA)
        page = unescape((await fresh.page(f"/console/executions/{execution_id}")).text)
    assert "The chart is retired: the log cannot be replayed." in page
    assert "The chart is retired." in page


@pytest.mark.asyncio
async def test_an_execution_whose_stored_chart_is_damaged_says_so_and_logs_an_error(
    site: Site, caplog: pytest.LogCaptureFixture
) -> None:
    execution_id, content_hash = await _completed(site)
    charts = site.db.adapter.tables.charts
    changed = site.sql(
        charts.update()
        .where(charts.c.content_hash == content_hash)
        .values(chart_blob=b"<scxml not closed")
    )
    assert changed == 1
    async with _site_on(site.db) as fresh:  # nothing compiled yet
        await fresh.login(ADA)
        page = unescape((await fresh.page(f"/console/executions/{execution_id}")).text)
    assert f"The chart is damaged: the chart {content_hash} no longer compiles" in page
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any(m.startswith(f"console: the stored chart {content_hash} is damaged") for m in errors)


@pytest.mark.asyncio
async def test_a_long_log_lists_the_start_the_end_and_the_steps_around_the_one_shown(
    site: Site,
) -> None:
    counter = compile_chart(
        '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="open">'
        '<datamodel><data id="n" expr="0"/></datamodel><state id="open">'
        '<transition event="hit"><assign location="n" expr="n + 1"/></transition>'
        "</state></scxml>"
    )
    executions = Executions(site.router.storage)
    await executions.create("long-1", counter)
    for _ in range(TIMELINE_LINKS + 50):
        await executions.step("long-1", counter, Event("hit"))
    await site.login(ADA)
    last = TIMELINE_LINKS + 50

    def listed(page: str) -> list[int]:
        timeline = page.split('id="timeline"', 1)[1].split("</section>", 1)[0]
        return [int(n) for n in re.findall(r'class="replay-step" data-step="(\d+)"', timeline)]

    now = (await site.page("/console/executions/long-1")).text
    assert listed(now) == [0, *range(last - TIMELINE_LINKS // 2, last + 1)]
    assert 'class="gap"' in now
    datamodel = now.split('id="datamodel"', 1)[1].split("</section>", 1)[0]
    assert f'<th scope="row">n</th><td><pre>{last}</pre>' in datamodel
    early = (await site.page("/console/executions/long-1?step=5")).text
    assert listed(early) == [*range(TIMELINE_LINKS // 2 + 6), last]
    assert "<pre>5</pre>" in early.split('id="datamodel"', 1)[1].split("</section>", 1)[0]
    assert len(site.console._replays) == 1  # the same log is replayed once


@pytest.mark.asyncio
async def test_the_list_pages_by_cursor_and_filters_by_status(site: Site) -> None:
    made = [await site.impression(f"k{n}") for n in range(3)]
    await site.login(ADA)
    first = (await site.page("/console/executions?size=2")).text
    shown = re.findall(r'data-execution-id="([^"]+)"', first)
    assert len(shown) == 2
    following = re.search(r'class="next-page" rel="next" href="([^"]+)"', first)
    assert following is not None
    second = (await site.page(unescape(following.group(1)))).text
    rest = re.findall(r'data-execution-id="([^"]+)"', second)
    assert sorted(shown + rest) == sorted(made)
    assert "next-page" not in second
    cancelled = (await site.page("/console/executions?status=cancelled")).text
    assert re.findall(r'data-execution-id="([^"]+)"', cancelled) == []
    assert (await site.client.get("/console/executions?status=nope")).status_code == 400
    assert (await site.client.get("/console/executions?cursor=forged")).status_code == 400


@pytest.mark.asyncio
async def test_the_routing_page_counts_and_lists_the_configured_bindings(site: Site) -> None:
    await site.impression("k1")
    await site.impression("k1", message="m-again")  # a second impression: dropped
    site.db.clock.advance(timedelta(minutes=1))
    await site.login(ADA)
    page = (await site.page("/console/routing?window=24h")).text
    chart = page.split('id="counts"', 1)[1].split("</div>", 1)[0]
    assert 'data-binding="impressions_to_join"' in chart
    assert "impressions_to_join" in page.split('id="bindings"', 1)[1]
    dropped = (await site.page("/console/routing?outcome=dropped")).text
    rows = dropped.split('id="ledger-rows"', 1)[1].split("</table>", 1)[0]
    assert re.findall(r'data-outcome="([^"]+)"', rows) == ["dropped"]
    assert (await site.client.get("/console/routing?window=1y")).status_code == 400
    site.console.configured = None  # as statifier console alone knows them
    alone = (await site.page("/console/routing")).text
    assert 'id="none-configured"' in alone
    assert 'id="bindings"' not in alone


@pytest.mark.asyncio
async def test_the_assets_are_the_packages_own_and_need_no_session(site: Site) -> None:
    script = await site.client.get("/console/static/console.js")
    style = await site.client.get("/console/static/console.css")
    assert (script.status_code, style.status_code) == (200, 200)
    for asset in (script.text, style.text):
        assert "http://" not in asset
        assert "https://" not in asset  # nothing fetched from elsewhere (no CDN)
    assert (await site.client.get("/console/static/%2e%2e/app.py")).status_code == 404


# Errors, final states and the timeline: the newcomer's order.


@dataclass
class Shop:
    """A console over the checkout chart, routed with a receipts route and timers."""

    site: Site

    async def send(self, kind: str, order: str, **data: Any) -> str:
        event = InboundEvent(
            scope="web",
            source="shop",
            message_id=f"{kind}-{order}-{sorted(data.items())}",
            data={"kind": kind, "order": order, **data},
        )
        routed = await self.site.router.route(event)
        (execution_id,) = {getattr(o, "execution_id", None) for o in routed.outcomes} - {None}
        assert isinstance(execution_id, str), routed
        return execution_id

    async def fire(self, after: timedelta) -> None:
        self.site.db.clock.advance(after)
        await TimerWorker(self.site.router).fire_due()


@pytest_asyncio.fixture
async def shop(router_db: RouterDb) -> AsyncIterator[Shop]:  # noqa: F811 - the fixture
    adapter = router_db.adapter
    machine = compile_chart(CHECKOUT.format(receipt=RECEIPT), name="order")
    router = router_db.router(
        shop_bindings(),
        resolver=StaticResolver({"order": machine}),
        send_type="shop:route",
        routes={"receipts": (OutboxRoute(adapter, clock=router_db.clock), {"queue": "receipts"})},
    )
    console = Console(
        queries=ConsoleQueries(adapter.engine, adapter.tables),
        audit=Audit(adapter.engine, adapter.tables),
        router=router,
        sessions=Sessions(Operators([Operator("ada", ADA, Role.OPERATOR)]), key=b"k" * 32),
        live_interval=0.05,
    )
    transport = httpx.ASGITransport(app=console_app(console))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        site = Site(router_db, router, console, client)
        await site.login(ADA)
        yield Shop(site)


def _part(page: str, marker: str, end: str = "</section>") -> str:
    return page.split(marker, 1)[1].split(end, 1)[0]


def _listed(page: str) -> list[str]:
    return re.findall(
        r'<tr data-execution-id="([^"]+)"', _part(page, 'id="executions"', "</table>")
    )


@pytest.mark.asyncio
async def test_a_chart_error_shows_on_its_page_in_the_list_and_on_the_failures_page(
    shop: Shop,
) -> None:
    healthy = await shop.send("checkout", "o-1", amount=5, timeout="1h")
    stuck = await shop.send("checkout", "o-2", amount="two", timeout="15s")
    site = shop.site
    page = (await site.page(f"/console/executions/{stuck}")).text
    assert 'id="status" class="status-active">active<' in page
    assert re.search(r'id="error-count"><a href="#errors">1</a>, the last <time', page)
    errors = _part(page, 'id="execution-errors"', "</table>")
    (row,) = re.findall(
        r'<tr class="error-row" data-error="error.execution">(.*?)</tr>', errors, re.S
    )
    cells = [
        unescape(re.sub(r"<[^>]+>", "", cell)).strip()
        for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
    ]
    assert cells[1:7] == [
        "error.execution",
        "<assign>",
        str(ASSIGN_AT[0]),
        str(ASSIGN_AT[1]),
        "'*' expects numbers, got a string",
        "no transition took it",
    ]
    assert '<a class="error-step" href="?step=1#step-1">step 1</a>' in row
    # The step that raised it says so, and made no timer: the rest of the transition
    # never ran (the healthy order's step did make one).
    step = _part(page, 'id="step-1"', "</li>\n  ")
    assert 'class="step raised"' in page
    assert "error.execution at &lt;assign&gt;, line 5, column 7" in step
    assert "step-send" not in step
    assert _part(page, 'id="timers"', "</table>").count("<tr data-send-id") == 0
    other = (await site.page(f"/console/executions/{healthy}")).text
    assert 'id="error-count">none<' in other
    assert _part(other, 'id="timers"', "</table>").count('<tr data-send-id="payment_timeout"') == 1

    listed = (await site.page("/console/executions")).text
    assert re.search(rf'data-execution-id="{stuck}".*?data-errors="1"', listed, re.S)
    assert re.search(rf'data-execution-id="{healthy}".*?data-errors="0"', listed, re.S)
    assert _listed((await site.page("/console/executions?errors=1")).text) == [stuck]

    failures = (await site.page("/console/failures")).text
    section = _part(failures, 'id="chart-error-rows"', "</table>")
    assert f'data-execution-id="{stuck}" data-error="error.execution"' in section
    assert f'href="/console/executions/{stuck}#errors"' in section
    assert "expects numbers" in unescape(section)


@pytest.mark.asyncio
async def test_the_errors_filter_lists_the_newest_error_first_a_page_at_a_time(
    shop: Shop,
) -> None:
    made = [await shop.send("checkout", "o-0", amount=1, timeout="1h")]  # no error
    for n in (1, 2):
        shop.site.db.clock.advance(timedelta(seconds=1))
        made.append(await shop.send("checkout", f"o-{n}", amount="two", timeout="1s"))
    await shop.send("checkout", "o-3", amount=1, timeout="1h")  # never errs
    shop.site.db.clock.advance(timedelta(seconds=1))
    # The oldest order errs last (a second checkout): its error is the newest.
    await shop.send("checkout", "o-0", amount="three")
    site = shop.site
    seen: list[str] = []
    path: str | None = "/console/executions?errors=1&size=2"
    while path is not None:
        page = (await site.page(path)).text
        seen.extend(_listed(page))
        found = re.search(r'class="next-page" rel="next" href="([^"]+)"', page)
        path = unescape(found.group(1)) if found else None
    assert seen == [made[0], made[2], made[1]]  # not the order they were created in
    assert (await site.client.get("/console/executions?errors=yes")).status_code == 400
    # A cursor of the other list is refused, not misread.
    first = (await site.page("/console/executions?size=1")).text
    cursor = re.search(r"cursor=([^&\"]+)", first)
    assert cursor is not None
    wrong = await site.client.get(f"/console/executions?errors=1&cursor={cursor.group(1)}")
    assert wrong.status_code == 400


async def _walked(site: Site, path: str | None) -> list[str]:
    """The executions every page from ``path`` on lists, following the next links."""
    seen: list[str] = []
    while path is not None:
        page = (await site.page(path)).text
        seen.extend(_listed(page))
        found = re.search(r'class="next-page" rel="next" href="([^"]+)"', page)
        path = unescape(found.group(1)) if found else None
    return seen


@pytest.mark.asyncio
async def test_the_list_is_searched_by_key_final_state_and_error_a_page_at_a_time(
    shop: Shop,
) -> None:
    paid = await shop.send("checkout", "o-1", amount=5, timeout="1h")
    await shop.send("pay", "o-1")
    stuck = [await shop.send("checkout", f"s-{n}", amount="two", timeout="1h") for n in range(3)]
    expired = await shop.send("checkout", "o-9", amount=5, timeout="1s")
    await shop.fire(timedelta(seconds=2))
    site = shop.site
    searches = {
        "key=o-1": [paid],
        "key=s-1": [stuck[1]],
        "key=s-1&scope=web": [stuck[1]],
        "key=s-1&scope=elsewhere": [],
        "key=O-1": [],  # exact
        "final=paid": [paid],
        "final=expired": [expired],
        "final=awaiting_payment": [],  # a state it waits in is no final state
        "error=error.execution": stuck[::-1],
        "error=error.communication": [],
        "key=o-1&final=paid": [paid],
        "key=o-1&error=error.execution": [],
        "key=s-2&error=error.execution&status=active": [stuck[2]],
        "key=&final=&error=": [expired, *stuck[::-1], paid],  # empty fields: any
    }
    for query, expected in searches.items():
        assert await _walked(site, f"/console/executions?{query}") == expected, query
    # A page at a time, the search kept in the next page's link.
    first = (await site.page("/console/executions?error=error.execution&size=1")).text
    found = re.search(r'class="next-page" rel="next" href="([^"]+)"', first)
    assert found is not None
    assert "error=error.execution" in unescape(found.group(1))
    paged = await _walked(site, "/console/executions?error=error.execution&size=1")
    assert paged == stuck[::-1]
    # The search is shown in its fields and said above the list, as text.
    page = (await site.page("/console/executions?key=s-1&scope=web&error=%3Cb%3Ex")).text
    assert 'id="search-key" name="key" value="s-1"' in page
    assert 'name="error" value="&lt;b&gt;x"' in page
    said = _part(page, 'id="search-said">', "</p>")
    assert unescape(re.sub(r"<[^>]+>", "", said)) == (
        "Executions addressed by the key s-1 in the scope web whose steps raised <b>x."
    )
    assert "<b>x" not in page
    # Bad input: answered 400 with the reason, never a server error.
    refused = {
        "key=" + "k" * (MAX_SEARCH + 1): f"key: at most {MAX_SEARCH} characters",
        "final=a%00b": "final_state: a NUL character is never stored",
        "error=" + "e" * (MAX_SEARCH + 1): "error: at most",
    }
    for query, reason in refused.items():
        answer = await site.client.get(f"/console/executions?{query}")
        assert answer.status_code == 400, query
        assert reason in unescape(answer.text), query


@pytest.mark.asyncio
async def test_paid_and_expired_orders_are_told_apart_in_the_list_and_on_their_pages(
    shop: Shop,
) -> None:
    paid = await shop.send("checkout", "o-1", amount=5, timeout="1h")
    await shop.send("pay", "o-1")
    expired = await shop.send("checkout", "o-2", amount=5, timeout="1s")
    await shop.fire(timedelta(seconds=2))
    site = shop.site
    listed = (await site.page("/console/executions")).text
    assert re.findall(r'data-final-state="([^"]+)"', listed) == ["expired", "paid"]
    for execution_id, final in ((paid, "paid"), (expired, "expired")):
        page = (await site.page(f"/console/executions/{execution_id}")).text
        assert 'class="status-completed">completed<' in page
        assert f'id="final-state"><code>{final}</code></dd>' in page
        assert 'id="configuration"' not in page  # never an empty configuration
        assert _lit(page) == [final]
        last = page.split('class="replay-step"')[-1]
        assert f"final <code>{final}</code>" in last
    cancelled = await shop.send("checkout", "o-3", amount=5, timeout="1h")
    path = f"/console/executions/{cancelled}/cancel"
    await site.client.post(path, data={"csrf": await site.csrf(path)})
    page = (await site.page(f"/console/executions/{cancelled}")).text
    assert "none: it was cancelled before it reached one" in page
    listed = (await site.page("/console/executions?status=cancelled")).text
    assert "data-final-state" not in listed


@pytest.mark.asyncio
async def test_the_timeline_shows_each_steps_data_errors_and_what_its_sends_made(
    shop: Shop,
) -> None:
    note = MARKUP + "x" * 300
    execution_id = await shop.send("checkout", "o-1", amount=5, timeout="1h", note=note)
    site = shop.site
    page = (await site.page(f"/console/executions/{execution_id}")).text
    step = _part(page, 'id="step-1"', "</li>\n  ")
    assert "<script>" not in page
    preview = _part(step, '<code class="data-preview">', "</code>")
    assert len(unescape(preview)) == PREVIEW_CHARS
    assert '<a class="more" href="?step=1#step-1">more</a>' in step
    sends = re.findall(r'data-kind="(\w+)" data-status="(\w+)"', step)
    assert sends == [("timer", "pending"), ("outbox", "pending")]
    assert "timer <code>payment_timeout</code> <code>payment.timeout</code>: pending, due" in step
    assert "outbox <code>receipts</code>: pending" in step
    timers = _part(page, 'id="timers"', "</table>")
    assert '<a href="?step=1#step-1">step 1</a>' in timers
    outbox = _part(page, 'id="outbox"', "</table>")
    assert '<a href="?step=1#step-1">step 1</a>' in outbox
    whole = (await site.page(f"/console/executions/{execution_id}?step=1")).text
    full = _part(whole, '<pre class="data-full">', "</pre>")
    assert note.replace('"', '\\"') in unescape(full)
    assert "&lt;script&gt;" in full

    await shop.send("pay", "o-1")
    page = (await site.page(f"/console/executions/{execution_id}")).text
    step = _part(page, 'id="step-1"', "</li>\n  ")
    cancelled = 'payment.timeout</code>: cancelled at <a class="fate-step" href="?step=2#step-2">'
    assert cancelled in step
    assert 'class="step-cancel">cancel <code>payment_timeout</code>' in _part(
        page, 'id="step-2"', "</li>\n  "
    )
    assert _part(page, 'id="timers"', "</table>").count("<tr data-send-id") == 0


# Actions and the audit.


@pytest.mark.asyncio
async def test_a_bulk_action_is_previewed_confirmed_and_followed_to_its_end(site: Site) -> None:
    ids = [await site.impression(f"b{n}") for n in range(4)]
    await site.login(ADA)
    listed = (await site.page("/console/executions?scope=web&status=active")).text
    assert 'id="bulk-link" href="/console/bulk?status=active&amp;scope=web"' in listed
    form = (await site.page("/console/bulk?status=active&scope=web")).text
    assert 'id="bulk-form"' in form
    assert 'id="preview"' not in form  # no action chosen: nothing counted
    query = "/console/bulk?action=pause&scope=web"
    previewed = (await site.page(query)).text
    assert 'data-selected="4"' in previewed
    assert "selected to pause." in previewed
    csrf = await site.csrf(query)
    fields = {"csrf": csrf, "action": "pause", "scope": "web", "revision": "", "map": ""}
    moved = await site.client.post("/console/bulk", data=fields | {"confirm": "3"})
    assert moved.status_code == 409  # not the count selected now: confirm again
    assert 'id="preview-changed"' in moved.text
    assert 'data-selected="4"' in moved.text
    for execution_id in ids:  # nothing was done
        assert (await site.router.storage.fetch_execution(execution_id)).status is Status.ACTIVE
    started = await site.client.post("/console/bulk", data=fields | {"confirm": "4"})
    assert started.status_code == 303
    run_page = started.headers["location"]
    assert run_page.startswith("/console/bulk/")
    shown = ""
    for _ in range(200):
        shown = (await site.page(run_page)).text
        if 'data-state="finished"' in shown:
            break
        await asyncio.sleep(0.05)
    assert 'id="run-state">finished<' in shown
    assert '<td data-count="done">4</td>' in shown
    assert '<td data-count="failed">0</td>' in shown
    for execution_id in ids:
        assert (await site.router.storage.fetch_execution(execution_id)).status is Status.PAUSED
    rows = (await site.console.audit.entries()).rows
    assert sorted(r.target for r in rows if r.action == "pause") == sorted(ids)
    assert [(r.actor, r.target) for r in rows if r.action == "bulk"] == [("ada", "pause")]
    assert run_page.rsplit("/", 1)[1] in (await site.page("/console/bulk")).text
    for bad in ("action=delete", "action=migrate", "action=migrate&revision=nope"):
        answer = await site.client.get(f"/console/bulk?{bad}&scope=web")
        assert answer.status_code == 400, bad
    assert (await site.client.get("/console/bulk/nope")).status_code == 404

    async def went_away(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the database went away")

    log = site.console.bulk_runs.log
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(log, "start", went_away)
        failed = await site.client.post("/console/bulk", data=fields | {"confirm": "0"})
    assert failed.status_code == 500  # nothing started: the page and the audit say why
    assert "RuntimeError: the database went away" in failed.text
    rows = (await site.console.audit.entries()).rows
    assert (rows[0].action, rows[0].outcome) == ("bulk", "failed")
    # A run whose process was killed: its row has no end, and no process runs it.
    where = ExecutionFilter(scope="web", status=Status.PAUSED)
    now = site.router.storage.clock()
    await log.start("killed", BULK_ACTIONS["resume"], where, actor="ada", selected=4, now=now)
    interrupted = (await site.page("/console/bulk/killed")).text
    assert 'id="run-unfinished"' in interrupted
    again = re.search(r'id="run-again" href="([^"]+)"', interrupted)
    assert again is not None
    previewed_again = (await site.page(html.unescape(again.group(1)))).text
    assert 'data-selected="4"' in previewed_again
    assert "selected to resume." in previewed_again
    await site.login(BOB)  # a read-only operator sees the count, no confirmation
    read_only = (await site.page("/console/bulk?action=resume&scope=web")).text
    assert 'data-selected="4"' in read_only
    assert 'id="confirm-bulk"' not in read_only
    refused = await site.client.post("/console/bulk", data=fields | {"confirm": "0"})
    assert refused.status_code == 403


@pytest.mark.asyncio
async def test_pause_and_resume_behind_a_confirmation_show_what_waits_and_are_audited(
    site: Site,
) -> None:
    execution_id = await site.impression("k1")
    await site.login(ADA)
    page = await site.page(f"/console/executions/{execution_id}")
    assert 'id="pause"' in page.text
    assert 'id="resume"' not in page.text
    assert 'id="held-panel"' not in page.text
    pause = f"/console/executions/{execution_id}/pause"
    assert 'id="confirm"' in (await site.page(pause)).text
    record = await site.router.storage.fetch_execution(execution_id)
    assert record.status is Status.ACTIVE  # the confirmation page changed nothing
    done = await site.client.post(pause, data={"csrf": await site.csrf(pause)})
    assert done.headers["location"] == f"/console/executions/{execution_id}?done=pause"
    click = InboundEvent(
        scope="web",
        source="ad_events",
        message_id="click-k1",
        data={"kind": "click", "impression_id": "k1", "url": "https://example.com"},
    )
    outcomes = (await site.router.route(click)).outcomes
    assert [o.outcome for o in outcomes] == ["no_match", "held"]
    shown = (await site.page(f"/console/executions/{execution_id}")).text
    assert 'id="status" class="status-paused">paused<' in shown
    assert 'id="resume"' in shown
    assert 'id="pause"' not in shown
    held = shown.split('id="held-events"', 1)[1].split("</table>", 1)[0]
    assert "<code>click.recorded</code>" in held
    assert "<code>click-k1</code>" in held
    resume = f"/console/executions/{execution_id}/resume"
    done = await site.client.post(resume, data={"csrf": await site.csrf(resume)})
    assert done.headers["location"] == f"/console/executions/{execution_id}?done=resume"
    back = (await site.page(done.headers["location"])).text
    assert 'id="held-panel"' not in back
    record = await site.router.storage.fetch_execution(execution_id)
    assert record.status is not Status.PAUSED
    again = await site.client.post(resume, data={"csrf": await site.csrf(resume)})
    assert again.status_code == 409
    assert await site.audit_rows() == [
        ("ada", "resume", execution_id, "refused"),
        ("ada", "resume", execution_id, "done"),
        ("ada", "pause", execution_id, "done"),
    ]


@pytest.mark.asyncio
async def test_cancel_behind_a_confirmation_is_done_once_and_audited(site: Site) -> None:
    execution_id = await site.impression("k1")
    await site.login(ADA)
    page = await site.page(f"/console/executions/{execution_id}")
    assert 'id="cancel"' in page.text
    path = f"/console/executions/{execution_id}/cancel"
    confirm = await site.page(path)
    assert 'id="confirm"' in confirm.text
    record = await site.router.storage.fetch_execution(execution_id)
    assert record.status is Status.ACTIVE  # the confirmation page changed nothing
    done = await site.client.post(path, data={"csrf": await site.csrf(path)})
    assert done.status_code == 303  # back to the execution, which says it was done
    assert done.headers["location"] == f"/console/executions/{execution_id}?done=cancel"
    back = (await site.page(done.headers["location"])).text
    assert 'id="notice"' in back
    assert 'id="status" class="status-cancelled">cancelled<' in back
    record = await site.router.storage.fetch_execution(execution_id)
    assert record.status is Status.CANCELLED
    again = await site.client.post(path, data={"csrf": await site.csrf(path)})
    assert again.status_code == 409
    assert await site.audit_rows() == [
        ("ada", "cancel", execution_id, "refused"),
        ("ada", "cancel", execution_id, "done"),
    ]
    shown = (await site.page(f"/console/executions/{execution_id}")).text
    assert 'id="cancel"' not in shown
    assert "cancel" in shown.split('id="execution-audit"', 1)[1]


@pytest.mark.asyncio
async def test_an_audit_row_that_cannot_be_written_still_gives_the_actions_answer(
    site: Site, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    execution_id = await site.impression("k1")
    await site.login(ADA)
    path = f"/console/executions/{execution_id}/cancel"
    done = await site.client.post(path, data={"csrf": await site.csrf(path)})
    assert done.status_code == 303

    async def broken(self: Audit, entry: AuditEntry) -> AuditRow:
        raise RuntimeError("the audit table is gone")

    monkeypatch.setattr(Audit, "record", broken)
    again = await site.client.post(path, data={"csrf": await site.csrf(path)})
    assert again.status_code == 409  # the refusal, not a bare 500
    assert "Nothing done" in again.text
    said = [r for r in caplog.records if "could not be written" in r.getMessage()]
    assert [r.levelname for r in said] == ["ERROR"]
    assert f"cancel of {execution_id} (refused)" in said[0].getMessage()


@pytest.mark.asyncio
async def test_a_page_that_fails_inside_says_so_and_logs_it_not_blaming_the_request(
    site: Site, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A ``ValueError`` of the console's own (here a stored document that is not JSON)
    is a 500 with its traceback logged, not a 400 that blames the operator's query."""
    await site.login(ADA)

    async def broken(self: ConsoleQueries, *args: object, **kwargs: object) -> object:
        raise ValueError("Expecting value: line 1 column 1 (char 0)")

    monkeypatch.setattr(ConsoleQueries, "executions", broken)
    answer = await site.client.get("/console/executions")
    assert answer.status_code == 500
    assert "ValueError: Expecting value" in answer.text
    [said] = [r for r in caplog.records if "the page /console/executions failed" in r.message]
    assert said.levelname == "ERROR"
    assert said.exc_info is not None
    # A query the page refuses is still the operator's: 400, nothing logged.
    caplog.clear()
    monkeypatch.undo()
    for refused in ("/console/executions?status=nope", "/console/held?after=forged"):
        assert (await site.client.get(refused)).status_code == 400, refused
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


@pytest.mark.asyncio
async def test_outbox_dead_letters_are_retried_and_discarded_and_audited(site: Site) -> None:
    outbox = site.db.store.tables.outbox
    now = datetime.now(UTC)
    for key in ("a", "b"):
        site.sql(
            outbox.insert().values(
                queue="joined",
                key=key,
                payload={"event": "e", "execution_id": "ex_1", "scope": "web"},
                execution_id="ex_1",
                bucket=bucket_of("ex_1"),
                attempts=8,
                next_attempt_at=now,
                dead_at=now,
                last_error="HTTP 500",
                inserted_at=now,
            )
        )
    ids = {key: row_id for row_id, key in site.sql(sa.select(outbox.c.id, outbox.c.key))}
    await site.login(ADA)
    failures = (await site.page("/console/failures")).text
    assert failures.count("/retry") >= 2
    retry = f"/console/failures/outbox/{ids['a']}/retry"
    retried = await site.client.post(retry, data={"csrf": await site.csrf(retry)})
    assert retried.status_code == 303
    assert retried.headers["location"] == "/console/failures?done=retry_outbox"
    discard = f"/console/failures/outbox/{ids['b']}/discard"
    answer = await site.client.post(discard, data={"csrf": await site.csrf(discard)})
    assert answer.status_code == 303
    rows = site.sql(sa.select(outbox.c.key, outbox.c.dead_at, outbox.c.attempts))
    assert [(key, dead, attempts) for key, dead, attempts in rows] == [("a", None, 0)]
    again = await site.client.post(discard, data={"csrf": await site.csrf(discard)})
    assert again.status_code == 409
    pending = f"/console/failures/outbox/{ids['a']}/discard"  # a pending row is kept
    kept = await site.client.post(pending, data={"csrf": await site.csrf(pending)})
    assert kept.status_code == 409
    assert len(site.sql(sa.select(outbox.c.id))) == 1
    assert await site.audit_rows() == [
        ("ada", "discard_outbox", f"outbox:{ids['a']}", "refused"),
        ("ada", "discard_outbox", f"outbox:{ids['b']}", "refused"),
        ("ada", "discard_outbox", f"outbox:{ids['b']}", "done"),
        ("ada", "retry_outbox", f"outbox:{ids['a']}", "done"),
    ]


@pytest.mark.asyncio
async def test_consumer_dead_letters_are_routed_again_or_discarded_and_audited(
    site: Site,
) -> None:
    letters = site.db.store.tables.consumer_dead_letters
    now = datetime.now(UTC)
    envelope = (
        b'{"scope": "web", "source": "ad_events", "message_id": "m-9", "data": '
        b'{"kind": "impression", "impression_id": "k9", "shown_at": "now"}}'
    )
    for raw, message in ((envelope, "m-9"), (b"{oops", None)):
        site.sql(
            letters.insert().values(
                source="inbound",
                partition="0",
                position=1,
                message_id=message,
                reason="failed too often",
                raw=raw,
                dead_at=now,
            )
        )
    ids = [row_id for (row_id,) in site.sql(sa.select(letters.c.id).order_by(letters.c.id))]
    await site.login(ADA)
    retry = f"/console/failures/consumer/{ids[0]}/retry"
    answer = await site.client.post(retry, data={"csrf": await site.csrf(retry)})
    assert answer.status_code == 303, answer.text
    detail = (await site.console.audit.entries()).rows[0].detail
    assert detail is not None
    assert "CreatedAndDelivered" in detail
    routing = (await site.page("/console/routing?key=k9")).text
    assert "ex_" in routing.split('id="addresses"', 1)[1].split("</table>", 1)[0]
    malformed = f"/console/failures/consumer/{ids[1]}/retry"
    refused = await site.client.post(malformed, data={"csrf": await site.csrf(malformed)})
    assert refused.status_code == 409
    discard = f"/console/failures/consumer/{ids[1]}/discard"
    discarded = await site.client.post(discard, data={"csrf": await site.csrf(discard)})
    assert discarded.status_code == 303
    assert site.sql(sa.select(letters.c.id)) == []
    assert [row[1:] for row in await site.audit_rows()] == [
        ("discard_consumer", f"consumer:{ids[1]}", "done"),
        ("retry_consumer", f"consumer:{ids[1]}", "refused"),
        ("retry_consumer", f"consumer:{ids[0]}", "done"),
    ]


@pytest.mark.asyncio
async def test_a_brokers_dead_letter_is_routed_again_under_its_sources_fixed_scope(
    site: Site,
) -> None:
    letters = site.db.store.tables.consumer_dead_letters
    data = b'{"kind": "impression", "impression_id": "k7", "shown_at": "now"}'
    site.sql(
        letters.insert().values(
            source="ad_events",
            partition="scans-0",
            position=41,
            message_id="scans-0@41",
            reason="failed too often",
            raw=data,
            dead_at=datetime.now(UTC),
        )
    )
    ((row_id,),) = site.sql(sa.select(letters.c.id))
    await site.login(ADA)
    retry = f"/console/failures/consumer/{row_id}/retry"
    unknown = await site.client.post(retry, data={"csrf": await site.csrf(retry)})
    assert unknown.status_code == 409  # the console does not know the source's scope
    assert "is not fixed by the configuration" in unknown.text
    assert len(site.sql(sa.select(letters.c.id))) == 1
    site.console.scopes = {"ad_events": "web"}  # as [sources.NAME] scope says
    routed = await site.client.post(retry, data={"csrf": await site.csrf(retry)})
    assert routed.status_code == 303
    assert site.sql(sa.select(letters.c.id)) == []
    found = (await site.page("/console/routing?key=k7&scope=web")).text
    assert "ex_" in found.split('id="addresses"', 1)[1].split("</table>", 1)[0]
    ledger = (await site.page("/console/routing")).text
    assert "scans-0@41" in ledger  # delivered under the letter's own message id


@pytest.mark.asyncio
async def test_a_rotation_shows_the_new_location_once_and_the_old_one_is_dead(
    site: Site,
) -> None:
    execution_id = await site.impression("k1")
    before = await site.router.location(execution_id)
    assert before is not None
    await site.login(ADA)
    path = f"/console/executions/{execution_id}/rotate"
    assert 'id="rotate"' in (await site.page(f"/console/executions/{execution_id}")).text
    answer = await site.client.post(path, data={"csrf": await site.csrf(path)})
    assert answer.status_code == 200
    shown = re.search(r'id="secret">([^<]+)<', answer.text)
    assert shown is not None
    assert shown.group(1).startswith("http://127.0.0.1:9/basichttp/")
    assert shown.group(1) != before
    with pytest.raises(LocationRotated):  # the chart's copy is dead
        await site.router.location(execution_id)
    (row,) = await site.audit_rows()
    assert row == ("ada", "rotate", execution_id, "done")
    audit = (await site.page("/console/audit")).text
    assert shown.group(1) not in audit  # the location is a capability: never kept


# An action and its audit row in one transaction.


class _InjectedAuditError(Exception):
    """Raised by the audit insert in a test, after the insert ran in the action's
    transaction."""


@dataclass
class _Case:
    """One action set up to be taken: its address, its audit target, and the state of
    the database read back (what it is before the act, and must stay if it is undone)."""

    path: str
    target: str
    state: Callable[[], Awaitable[object]]


async def _case(site: Site, action: str) -> _Case:
    now = datetime.now(UTC)
    if action in ("cancel", "rotate"):
        execution_id = await site.impression("k1")

        async def execution() -> object:
            record = await site.router.storage.fetch_execution(execution_id)
            try:
                return record.status, await site.router.location(execution_id)
            except LocationRotated:
                return record.status, "rotated"

        return _Case(f"/console/executions/{execution_id}/{action}", execution_id, execution)
    verb, kind = action.split("_")
    if kind == "outbox":
        outbox = site.db.store.tables.outbox
        site.sql(
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
            )
        )
        ((row,),) = site.sql(sa.select(outbox.c.id))

        async def outbox_rows() -> object:
            return site.sql(sa.select(outbox.c.id, outbox.c.dead_at, outbox.c.attempts))

        return _Case(f"/console/failures/outbox/{row}/{verb}", f"outbox:{row}", outbox_rows)
    letters = site.db.store.tables.consumer_dead_letters
    envelope = (
        b'{"scope": "web", "source": "ad_events", "message_id": "m-9", "data": '
        b'{"kind": "impression", "impression_id": "k9", "shown_at": "now"}}'
    )
    site.sql(
        letters.insert().values(
            source="inbound",
            partition="0",
            position=1,
            message_id="m-9",
            reason="failed too often",
            raw=envelope,
            dead_at=now,
        )
    )
    ((row,),) = site.sql(sa.select(letters.c.id))

    async def letter_rows() -> object:
        return site.sql(sa.select(letters.c.id, letters.c.raw))

    return _Case(f"/console/failures/consumer/{row}/{verb}", f"consumer:{row}", letter_rows)


ACTIONS = (
    "cancel",
    "rotate",
    "retry_outbox",
    "discard_outbox",
    "retry_consumer",
    "discard_consumer",
)


@pytest.mark.asyncio
@pytest.mark.parametrize("action", ACTIONS)
async def test_an_action_whose_audit_insert_fails_is_undone_and_audited_failed(
    site: Site, action: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = await _case(site, action)
    before = await case.state()
    inserts: list[str] = []
    real = Audit.record_in

    async def failing(audit: Audit, tx: SqlTransaction, entry: AuditEntry) -> AuditRow:
        await real(audit, tx, entry)  # the row is written in the action's transaction...
        inserts.append(entry.outcome)
        raise _InjectedAuditError("the audit insert failed")  # ...then the insert fails

    monkeypatch.setattr(Audit, "record_in", failing)
    await site.login(ADA)
    answer = await site.client.post(case.path, data={"csrf": await site.csrf(case.path)})
    assert answer.status_code == 500, answer.text
    assert "_InjectedAuditError" in answer.text
    assert inserts == ["done"]  # the act reached its audit row: its statements had run
    assert await case.state() == before  # and all of it was rolled back
    assert await site.audit_rows() == [("ada", action, case.target, "failed")]

    monkeypatch.undo()
    answer = await site.client.post(case.path, data={"csrf": await site.csrf(case.path)})
    assert answer.status_code in (200, 303), answer.text
    assert await case.state() != before  # done this time
    assert await site.audit_rows() == [
        ("ada", action, case.target, "done"),
        ("ada", action, case.target, "failed"),
    ]
    if action == "retry_consumer":
        # The routing cannot join the row's transaction (see actions.retry_consumer):
        # the failed attempt had routed the event, so the retry was a duplicate.
        detail = (await site.console.audit.entries()).rows[0].detail
        assert detail is not None
        assert "Duplicate" in detail


# Live.


@pytest.mark.asyncio
async def test_the_event_stream_says_changed_when_an_execution_moves(site: Site) -> None:
    await site.login(ADA)

    async def change_then_close() -> None:
        while site.console.live.clients == 0:  # noqa: ASYNC110 - a count, not an event
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # the poller's first probe is the baseline
        await site.impression("k1")
        await asyncio.sleep(0.3)
        site.console.live.close()

    task = asyncio.create_task(change_then_close())
    answer = await site.client.get("/console/events")
    await task
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert answer.text.startswith("retry: ")
    assert "event: changed\ndata: {}\n\n" in answer.text
    assert (await site.client.get("/console/events")).status_code == 503  # closed


@pytest.mark.asyncio
async def test_live_polls_once_for_all_clients_and_bounds_them() -> None:
    calls = 0

    async def probe() -> int:
        nonlocal calls
        calls += 1
        return calls // 3  # moves every third probe

    live = Live(probe, interval=0.01, max_clients=2)
    async with live.subscribe() as one, live.subscribe() as two:
        with pytest.raises(TooManyClients):
            async with live.subscribe():
                pass
        assert await asyncio.wait_for(one.get(), 1) == "changed"
        assert await asyncio.wait_for(two.get(), 1) == "changed"
    stopped = calls
    await asyncio.sleep(0.05)
    assert calls == stopped  # no client, no probe


# The [console] table of statifier serve, and statifier console.


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "statifier.toml"
    path.write_text(text)
    return path


def test_the_console_table_reads_operators_from_the_environment(tmp_path: Path) -> None:
    path = _config(
        tmp_path,
        "[console]\nsession_max_age = 600\n"
        '[console.operators.ada]\ntoken_env = "ADA"\nrole = "operator"\n'
        '[console.operators.bob]\ntoken_env = "BOB"\nrole = "read_only"\n',
    )
    settings = load(path, {"ADA": ADA, "BOB": BOB})
    assert settings.console.enabled
    assert [(o.name, o.role) for o in settings.console.operators] == [
        ("ada", "operator"),
        ("bob", "read_only"),
    ]
    assert ADA not in repr(settings)
    assert not load(_config(tmp_path, "")).console.enabled


@pytest.mark.parametrize(
    ("text", "environ", "said"),
    [
        ("[console]\nport = 1\n", {}, "[console] port: unknown key"),
        (
            '[console.operators.ada]\ntoken_env = "ADA"\n',
            {},
            "[console.operators.ada] token_env: the environment variable ADA is not set",
        ),
        (
            '[console.operators.ada]\ntoken_env = "ADA"\nrole = "root"\n',
            {"ADA": ADA},
            "[console.operators.ada] role: must be one of operator, read_only",
        ),
        (
            '[console.operators.ada]\ntoken_env = "ADA"\n',
            {"ADA": "short"},
            "token_env: the token must be at least 16 characters",
        ),
        (
            '[http]\nhost = "0.0.0.0"\n[console]\n',
            {},
            '[console] operators: a console listening on "0.0.0.0" (not loopback) needs',
        ),
        (
            '[console]\nsession_key_env = "KEY"\n',
            {"KEY": "too short"},
            "[console] session_key_env: the key must be at least 32 bytes",
        ),
    ],
)
def test_the_console_table_refuses_what_cannot_be_safe(
    tmp_path: Path, text: str, environ: dict[str, str], said: str
) -> None:
    with pytest.raises(ServiceConfigError) as refused:
        load(_config(tmp_path, text), environ)
    assert said in str(refused.value)
    for secret in environ.values():
        assert secret not in str(refused.value)


def test_a_front_cannot_take_the_consoles_path(tmp_path: Path) -> None:
    charts = tmp_path / "charts"
    charts.mkdir()
    (charts / "join.scxml").write_text(
        '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="a"><state id="a"/></scxml>'
    )
    text = (
        'charts = "charts"\n[console]\n'
        '[[bindings]]\nid = "b"\nsource = "s"\nmatch = "true"\nkey = "event.k"\n'
        'document = "join"\nevent = "e"\n'
        '[fronts.webhook.w]\npath = "/console/hooks"\nsource = "s"\nscope = "x"\n'
    )
    with pytest.raises(ServiceConfigError, match=r"overlaps the console"):
        load(_config(tmp_path, text))


def test_statifier_console_refuses_a_wide_bind_without_operators(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    assert main(["console", "--database", url, "--host", "0.0.0.0"]) == 2
    assert "(not loopback) needs --operator" in capsys.readouterr().err
    assert main(["console", "--database", url, "--operator", "ada:root:NOPE"]) == 2
    assert "the role is operator or read_only" in capsys.readouterr().err
    assert main(["console", "--database", url]) == 2  # not migrated
    assert "statifier db upgrade" in capsys.readouterr().err
    os.environ.pop("STATIFIER_TEST_NO_SUCH_KEY", None)
    assert main(["console", "--database", url, "--keys-env", "STATIFIER_TEST_NO_SUCH_KEY"]) == 2
    refused = capsys.readouterr().err
    assert refused.startswith("statifier console: ")
    assert "STATIFIER_TEST_NO_SUCH_KEY" in refused


# Served by statifier serve.


SERVED_CHART = (
    '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="open">'
    '<state id="open"><transition event="hit" target="open"/></state></scxml>'
)


def _served_config(directory: Path, database: FreshDatabase, console: str) -> Path:
    schema = "" if database.schema is None else f'schema = "{database.schema}"\n'
    charts = directory / "charts"
    charts.mkdir(exist_ok=True)
    (charts / "hits.scxml").write_text(SERVED_CHART)
    body = (
        'migrate = true\nshutdown_timeout = 5\ncharts = "charts"\n'
        '[[bindings]]\nid = "hits"\nsource = "clicks"\nmatch = "true"\n'
        'key = "event.key"\ndocument = "hits"\nevent = "hit"\n'
        f'[database]\nurl = "{database.url}"\nprefix = "t_"\n{schema}'
        f"[http]\nport = 0\n{console}"
    )
    path = directory / "statifier.toml"
    path.write_text(body)
    return path


@pytest.mark.asyncio
async def test_serve_mounts_the_console_and_an_open_stream_does_not_hold_the_stop(
    fresh_database: FreshDatabase,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    console = '[console]\n[console.operators.ada]\ntoken_env = "ADA"\nrole = "operator"\n'
    settings = load(_served_config(tmp_path, fresh_database, console), {"ADA": ADA})
    out = io.StringIO()
    service = Service(settings, out)
    running = asyncio.create_task(service.run())
    while service.address is None:
        assert not running.done(), running
        await asyncio.sleep(0.02)
    base = f"http://{service.address[0]}:{service.address[1]}"
    assert "/console/" in out.getvalue()
    assert ADA not in out.getvalue()  # a configured token is never printed
    async with httpx.AsyncClient(base_url=base, timeout=5.0) as client:
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/console/events")).status_code == 401
        assert (await client.get("/console/executions")).status_code == 303
        answer = await client.post("/console/login", data={"token": ADA})
        assert answer.status_code == 303
        listed = await client.get("/console/executions")
        assert listed.status_code == 200
        assert 'id="executions"' in listed.text
        routing = await client.get("/console/routing")
        assert "hits" in routing.text.split('id="bindings"', 1)[1]
        served = service._console
        assert served is not None
        async with client.stream("GET", "/console/events") as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            assert served.console.live.clients == 1
        deadline = time.monotonic() + 5
        while served.console.live.clients:
            assert time.monotonic() < deadline, "a stream the browser left stayed open"
            await asyncio.sleep(0.02)
        async with client.stream("GET", "/console/events") as stream:
            started = time.monotonic()
            service.stop()
            assert await asyncio.wait_for(running, 10) == 0
            assert time.monotonic() - started < 4  # the stream ended with the stop


@pytest.mark.asyncio
async def test_serve_without_operators_prints_a_token_for_this_start_only(
    fresh_database: FreshDatabase,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    settings = load(_served_config(tmp_path, fresh_database, "[console]\n"))
    out = io.StringIO()
    service = Service(settings, out)
    running = asyncio.create_task(service.run())
    try:
        while service.address is None:
            assert not running.done(), running
            await asyncio.sleep(0.02)
        found = re.search(r"console login token \(this start only\): (\S+)", out.getvalue())
        assert found is not None
        base = f"http://{service.address[0]}:{service.address[1]}"
        async with httpx.AsyncClient(base_url=base, timeout=5.0) as client:
            answer = await client.post("/console/login", data={"token": found.group(1)})
            assert answer.status_code == 303
            assert "local (operator)" in (await client.get("/console/executions")).text
    finally:
        service.stop()
        assert await asyncio.wait_for(running, 10) == 0


def test_statifier_console_serves_until_sigterm_and_its_token_logs_in(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'alone.db'}"
    migrations.upgrade(url)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "ADA_TOKEN": ADA}
    command = [sys.executable, "-m", "statifier.cli", "console", "--database", url]
    for extra, token in (([], None), (["--operator", "ada:read_only:ADA_TOKEN"], ADA)):
        with (
            (tmp_path / "stderr.txt").open("w") as errors,
            subprocess.Popen(
                [*command, "--port", "0", *extra],
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
                env=env,
            ) as process,
        ):
            try:
                assert process.stdout is not None
                first = process.stdout.readline()
                listening = re.search(r"listening on (http://127\.0\.0\.1:\d+)/console/", first)
                assert listening is not None, first
                if token is None:
                    line = process.stdout.readline()
                    said = re.search(r"login token \(this start only\): (\S+)", line)
                    assert said is not None, line
                    token = said.group(1)
                with httpx.Client(base_url=listening.group(1), timeout=10) as client:
                    assert client.get("/console/executions").status_code == 303
                    login = client.post("/console/login", data={"token": token})
                    assert login.status_code == 303
                    page = client.get("/console/routing")
                    assert page.status_code == 200
                    assert 'id="none-configured"' in page.text
                process.send_signal(signal.SIGTERM)
                assert process.wait(20) == 0
                rest = process.stdout.read()
                assert "stopped" in rest
                assert ADA not in rest  # a configured token is never printed
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        assert ADA not in (tmp_path / "stderr.txt").read_text()


@pytest.mark.asyncio
async def test_under_a_fernet_codec_the_pages_show_what_the_database_keeps_sealed(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    from statifier.persistence import Storage
    from statifier.persistence.fernet import FernetCodec

    codec = FernetCodec([FernetCodec.generate_key()])
    router = Router(
        RouterConfig(
            Storage(router_db.adapter, clock=router_db.clock, codec=codec),
            bindings=impression_bindings(),
            resolver=StaticResolver({"join": join_chart()}),
        )
    )
    console = Console.of(router, Sessions(Operators([Operator("ada", ADA, Role.OPERATOR)])))
    secret = "impression-kept-sealed-42"
    event = InboundEvent(
        scope="web",
        source="ad_events",
        message_id="m-sealed",
        data={"kind": "impression", "impression_id": secret, "shown_at": "now"},
    )
    routed = await router.route(event)
    execution_id = getattr(routed.outcomes[0], "execution_id", None)
    assert isinstance(execution_id, str)
    executions = router_db.adapter.tables.executions
    read = sa.select(executions.c.position_blob).where(executions.c.execution_id == execution_id)
    async with httpx.AsyncClient() as unused:
        stored = Site(router_db, router, console, unused).sql(read)
    assert secret.encode() not in bytes(stored[0][0])
    transport = httpx.ASGITransport(app=console_app(console))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        site = Site(router_db, router, console, client)
        await site.login(ADA)
        page = await site.page(f"/console/executions/{execution_id}")
    datamodel = page.text.split('id="datamodel"', 1)[1].split("</section>", 1)[0]
    assert secret in datamodel
    assert "replay-step" in page.text
