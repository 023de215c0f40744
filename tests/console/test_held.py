"""The console's held events page on each database (SQLite and PostgreSQL), through
httpx: the addresses whose debounce, batch and throttle bindings hold events, a page at
a time by binding, scope and key, each with its binding's mode as the router's
bindings say it now (or that it is gone, disabled or unreadable: its events wait), its
key linked to the execution its address names, the events held, when first held and
due (late or not), its failures and last error (escaped); the totals above, the
creates a cap holds among them; the empty page says nothing is held.

And in a real browser (headless Chromium against ``statifier serve`` with a debounce
and a batch binding): an operator opens the page from the navigation, reads the rows
(one whose binding the service does not have, its failure recorded by the service's
flow worker) and follows a key to its execution. With ``STATIFIER_SCREENSHOTS=1`` it
writes ``docs/console/held.png``.
"""

from __future__ import annotations

import asyncio
import html
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import pytest_asyncio
import sqlalchemy as sa
import tests.console.conftest as console_conftest
from markupsafe import escape
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from tests.console.conftest import READER_TOKEN, ServedConsole
from tests.console.test_browser import _follow, _log_in, _no_alert, _screenshot, _wait
from tests.persistence.conftest import (  # noqa: F401 - fixtures used by name
    postgresql_store,
    sqlite_store,
)
from tests.router.conftest import (  # noqa: F401 - fixtures used by name
    RouterDb,
    router_db,
    router_store,
)
from tests.router.test_races import counter_chart

from statifier.console.app import Configured, Console, console_app
from statifier.console.audit import Audit
from statifier.console.auth import Operator, Operators, Role, Sessions
from statifier.console.queries import ConsoleQueries
from statifier.persistence import Storage
from statifier.persistence.sql import SqlAdapter
from statifier.router import (
    Binding,
    Cap,
    FlowWorker,
    InboundEvent,
    Mode,
    Router,
    RouterConfig,
    StaticResolver,
    address,
)
from statifier.sql import migrations

ADA = "ada-token-0123456789abcdef"
"""The operator's token."""
BOB = "bob-token-0123456789abcdef"
"""The read-only operator's token."""
MARKUP = '<script>alert("x")</script><b>bold</b>'
"""Text a page must show as text."""
START = datetime(2026, 9, 19, 8, 0, tzinfo=UTC)
"""Where :class:`~tests.router.conftest.Clock` starts."""

TYPING = Binding(
    id="typing",
    source="editor",
    match="true",
    key="event.doc",
    document="counter",
    event="hit",
    data=("doc", "n"),
    mode=Mode.DEBOUNCE,
    window=timedelta(seconds=30),
    max_wait=timedelta(minutes=5),
)
BULK = Binding(
    id="bulk",
    source="orders",
    match="true",
    key="event.order",
    document="counter",
    event="hit",
    data=("order", "n"),
    mode=Mode.BATCH,
    batch=10,
    window=timedelta(minutes=1),
)
RETIRED = Binding(
    id="retired",
    source="old",
    match="true",
    key="event.doc",
    document="counter",
    event="hit",
    mode=Mode.DEBOUNCE,
    window=timedelta(seconds=5),
)
PINGS = Binding(
    id="pings",
    source="device",
    match="true",
    key="event.device",
    document="counter",
    event="hit",
    mode=Mode.THROTTLE,
    batch=1,
    window=timedelta(minutes=1),
)
SIGNUPS = Binding(
    id="signups",
    source="signup",
    match="true",
    key="event.user",
    document="capped",
    event="hit",
)
"""Creates executions of ``capped``, at most one active: a second create is held."""


@dataclass
class Site:
    """A router over one backend's database whose bindings a test changes (every scope
    routes by :attr:`bindings`; ``ops`` fails to read when :attr:`broken`), a flow
    worker over it, the console, and a client of the console."""

    db: RouterDb
    bindings: list[Binding]
    router: Router
    worker: FlowWorker
    console: Console
    client: httpx.AsyncClient
    broken: bool = False

    async def login(self, token: str) -> None:
        answer = await self.client.post("/console/login", data={"token": token})
        assert answer.status_code == 303, answer.text

    async def page(self, path: str = "/console/held") -> str:
        answer = await self.client.get(path)
        assert answer.status_code == 200, answer.text
        return answer.text

    async def send(self, scope: str, source: str, name: str, value: str, n: int) -> str:
        """Route one event of ``source`` in ``scope`` now; answers its first outcome."""
        event = InboundEvent(
            scope=scope, source=source, message_id=f"{source}-{value}-{n}", data={name: value}
        )
        routed = await self.router.route(event)
        return routed.outcomes[0].outcome

    def sql(self, statement: sa.Executable) -> None:
        engine = sa.create_engine(migrations.sync_url(self.db.store.url))
        try:
            with engine.begin() as connection:
                connection.execute(statement)
        finally:
            engine.dispose()


@pytest_asyncio.fixture
async def site(router_db: RouterDb) -> AsyncIterator[Site]:  # noqa: F811 - the fixture
    bindings = [TYPING, BULK, RETIRED, PINGS, SIGNUPS]
    holder: list[Site] = []

    async def current(scope: str) -> list[Binding]:
        if scope == "ops" and holder and holder[0].broken:
            raise RuntimeError("the bindings service is down")
        return list(bindings)

    storage = Storage(router_db.adapter, clock=router_db.clock)
    chart = counter_chart()
    router = Router(
        RouterConfig(
            storage,
            bindings_resolver=current,
            resolver=StaticResolver({"counter": chart, "capped": chart}),
            caps={"capped": Cap(1)},
        )
    )
    operators = Operators(
        [Operator("ada", ADA, Role.OPERATOR), Operator("bob", BOB, Role.READ_ONLY)]
    )
    adapter = router_db.adapter
    console = Console(
        queries=ConsoleQueries(adapter.engine, adapter.tables),
        audit=Audit(adapter.engine, adapter.tables),
        router=router,
        sessions=Sessions(operators, key=b"k" * 32),
        configured=Configured(bindings=tuple(bindings)),  # served: the bindings are known
    )
    worker = FlowWorker(router, retry=timedelta(seconds=30))
    transport = httpx.ASGITransport(app=console_app(console))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        holder.append(Site(router_db, bindings, router, worker, console, client))
        yield holder[0]


Row = tuple[str, str, str, str]
"""A listed row: its binding, scope and key (as the page's attributes hold them,
unescaped), and its markup, its ``<tr>`` tag included."""


def _rows(page: str) -> list[Row]:
    """The listed rows, in page order."""
    found = re.finditer(
        r'<tr data-binding="([^"]*)" data-scope="([^"]*)" data-key="([^"]*)".*?</tr>',
        page,
        re.DOTALL,
    )
    return [
        (html.unescape(b), html.unescape(s), html.unescape(k), row.group(0))
        for row in found
        for b, s, k in [row.groups()]
    ]


def _row(page: str, binding: str, key: str) -> str:
    """The markup of the row of ``binding`` and ``key``, its ``<tr>`` tag included."""
    (found,) = [
        match.group(0)
        for match in re.finditer(r"<tr data-binding=.*?</tr>", page, re.DOTALL)
        if f'data-binding="{escape(binding)}"' in match.group(0)
        and f'data-key="{escape(key)}"' in match.group(0)
    ]
    return found


def _cell(row: str, kind: str) -> str:
    """The text of the row's cell of class ``kind``, its tags dropped."""
    found = re.search(rf'<td class="{kind}[^"]*"[^>]*>(.*?)</td>', row, re.DOTALL)
    assert found is not None, (kind, row)
    return " ".join(re.sub(r"<[^>]+>", " ", found.group(1)).split())


def _totals(page: str) -> dict[str, int]:
    found = re.findall(r'<span data-total="([^"]+)">(\d+)</span>', page)
    return {name: int(number) for name, number in found}


def _next(page: str) -> str | None:
    found = re.search(r'<a class="next-page" rel="next" href="([^"]+)"', page)
    return None if found is None else html.unescape(found.group(1))


async def _hold(site: Site) -> str:
    """Events held at 08:00:30 and the execution of the document ``d1`` (its first
    debounce, flushed then); answers that execution's id.

    - ``typing`` (debounce, 30 s, at most 5 m), scope ``web``: ``d1`` holds 3, ``d2``
      2 and :data:`MARKUP` 1, each due at 08:01:00;
    - ``bulk`` (batch of 10 or 1 m), scope ``web``: ``o1`` holds 3, due at 08:01:30;
    - ``retired``, scope ``ops``: ``r1`` holds 1 from 08:00:00; its binding was then
      removed, so the flush at 08:00:30 failed (``BindingGone``) and it is due again
      at 08:01:00;
    - ``pings`` (throttle, 1 a minute), scope ``web``: ``p1`` delivered its first and
      holds its second, due when its window closes at 08:01:30;
    - ``signups`` (no mode): ``u2``'s create is held by the cap on ``capped``
      (``u1``'s execution is its one active).
    """
    assert await site.send("web", "editor", "doc", "d1", 0) == "buffered"
    assert await site.send("ops", "old", "doc", "r1", 0) == "buffered"
    site.bindings.remove(RETIRED)
    site.db.clock.advance(timedelta(seconds=30))
    reports = {report.key: report for report in await site.worker.flush_due()}
    assert (reports["d1"].delivered, reports["d1"].error) == (1, None)
    assert (reports["r1"].error or "").startswith("BindingGone: binding 'retired'")
    for n in range(1, 4):
        assert await site.send("web", "editor", "doc", "d1", n) == "buffered"
    for n in range(2):
        assert await site.send("web", "editor", "doc", "d2", n) == "buffered"
    assert await site.send("web", "editor", "doc", MARKUP, 0) == "buffered"
    for n in range(3):
        assert await site.send("web", "orders", "order", "o1", n) == "buffered"
    assert await site.send("web", "device", "device", "p1", 0) == "created_and_delivered"
    assert await site.send("web", "device", "device", "p1", 1) == "buffered"
    assert await site.send("web", "signup", "user", "u1", 0) == "created_and_delivered"
    assert await site.send("web", "signup", "user", "u2", 0) == "buffered"
    found = await address(site.router, "web", "counter", "d1")
    assert found is not None
    return found.execution_id


# The page.


@pytest.mark.asyncio
async def test_the_page_lists_each_address_holding_events_with_its_binding_and_times(
    site: Site,
) -> None:
    execution_id = await _hold(site)
    await site.login(ADA)
    page = await site.page()
    assert 'id="nav-held" aria-current="page"' in page
    assert "<h1>Held events</h1>" in page
    # 6 addresses hold 11 events; one more waits on the cap with its one event.
    assert _totals(page) == {
        "addresses": 6,
        "events": 11,
        "capped-addresses": 1,
        "capped-events": 1,
    }
    rows = _rows(page)
    # By binding, scope and key (the order of keys within a binding and scope is the
    # database's collation; d1 comes before d2 in every one).
    assert [(b, s) for b, s, _, _ in rows] == [
        ("bulk", "web"),
        ("pings", "web"),
        ("retired", "ops"),
        ("typing", "web"),
        ("typing", "web"),
        ("typing", "web"),
    ]
    typing_keys = [k for b, _, k, _ in rows if b == "typing"]
    assert sorted(typing_keys) == sorted(["d1", "d2", MARKUP])
    assert typing_keys.index("d1") < typing_keys.index("d2")

    d1 = _row(page, "typing", "d1")
    assert _cell(d1, "binding") == "typing"
    assert _cell(d1, "mode") == "debounce window 30s, at most 5m"
    assert _cell(d1, "scope") == "web"
    assert _cell(d1, "document") == "counter"
    # Its address names the execution the first flush created: the key links to it.
    assert f'<a href="/console/executions/{execution_id}">d1</a>' in d1
    assert 'data-count="held">3<' in d1
    assert _cell(d1, "first-at") == "2026-09-19 08:00:30"
    assert _cell(d1, "due-at") == "2026-09-19 08:01:00"
    assert 'data-count="failures">0<' in d1
    assert _cell(d1, "last-error") == ""
    assert "data-late" not in d1
    assert "data-gone" not in d1
    d2 = _row(page, "typing", "d2")
    assert "<a " not in _cell(d2, "key")  # no execution yet: the first flush creates it
    assert _cell(d2, "key") == "d2"
    assert 'data-count="held">2<' in d2

    o1 = _row(page, "bulk", "o1")
    assert _cell(o1, "mode") == "batch 10 events or 1m"
    assert 'data-count="held">3<' in o1
    assert _cell(o1, "due-at") == "2026-09-19 08:01:30"

    p1 = _row(page, "pings", "p1")
    assert _cell(p1, "mode") == "throttle 1 per 1m"
    assert 'data-count="held">1<' in p1
    assert _cell(p1, "due-at") == "2026-09-19 08:01:30"  # its window closes

    # The binding is gone: the row says so; the failure the worker recorded is shown.
    r1 = _row(page, "retired", "r1")
    assert 'data-gone="1"' in r1
    assert _cell(r1, "mode") == "binding gone: events wait"
    assert _cell(r1, "scope") == "ops"
    assert _cell(r1, "first-at") == "2026-09-19 08:00:00"
    assert _cell(r1, "due-at") == "2026-09-19 08:01:00"  # 30 s after the failure
    assert 'data-count="failures">1<' in r1
    assert '<td class="count error" data-count="failures">' in r1
    assert html.unescape(_cell(r1, "last-error")) == (
        "BindingGone: binding 'retired' is not an enabled binding of scope 'ops': "
        "its 1 held event wait for it"
    )

    # 45 s on and no worker: the groups due at 08:01:00 are late, the batch is not.
    site.db.clock.advance(timedelta(seconds=45))
    later = await site.page()
    late = {(b, k) for b, _, k, row in _rows(later) if 'data-late="1"' in row}
    # (p1's window closes at 08:01:30: not late either.)
    assert late == {("typing", "d1"), ("typing", "d2"), ("typing", MARKUP), ("retired", "r1")}
    assert _cell(_row(later, "typing", "d1"), "due-at") == "2026-09-19 08:01:00 late"
    assert _cell(_row(later, "bulk", "o1"), "due-at") == "2026-09-19 08:01:30"
    # Due, but by less than the page's grace: not late yet.
    site.db.clock.advance(timedelta(seconds=5))
    assert 'data-late="1"' not in _row(await site.page(), "bulk", "o1")

    # The binding back, but disabled: said so; then a scope whose bindings cannot be
    # read: said so, with why.
    site.bindings.append(replace(RETIRED, enabled=False))
    again = _row(await site.page(), "retired", "r1")
    assert _cell(again, "mode") == "binding disabled: events wait"
    site.broken = True
    broken = _row(await site.page(), "retired", "r1")
    assert 'data-gone="1"' in broken
    assert _cell(broken, "mode") == (
        "bindings of the scope cannot be read "
        "(RuntimeError: the bindings service is down): events wait"
    )
    # Other scopes' rows are as they were. A binding turned to each delivers what it
    # held one by one, when due.
    assert _cell(_row(await site.page(), "bulk", "o1"), "mode") == "batch 10 events or 1m"
    each = replace(BULK, mode=Mode.EACH, window=None, batch=None)
    site.bindings[site.bindings.index(BULK)] = each
    assert _cell(_row(await site.page(), "bulk", "o1"), "mode") == "each one by one when due"

    # A console started alone routes by no binding: it judges none.
    site.console.configured = None
    alone = await site.page()
    assert "data-gone" not in alone
    modes = {_cell(row, "mode") for _, _, _, row in _rows(alone)}
    assert modes == {"unknown: this console knows no bindings"}


@pytest.mark.asyncio
async def test_a_hostile_key_and_last_error_are_shown_as_text(site: Site) -> None:
    await _hold(site)
    table = site.db.store.tables.flow_groups
    site.sql(table.update().where(table.c.key == "r1").values(last_error=MARKUP))
    await site.login(BOB)  # a read-only operator reads the page
    page = await site.page()
    assert MARKUP not in page
    assert "<script>" not in page
    escaped = escape(MARKUP)  # quotes too, as the templates escape them
    marked = _row(page, "typing", MARKUP)
    assert f'data-key="{escaped}"' in marked
    assert f'<td class="key">{escaped}</td>' in marked
    r1 = _row(page, "retired", "r1")
    assert f'<span class="error">{escaped}</span>' in r1


@pytest.mark.asyncio
async def test_pages_follow_the_addresses_in_order(site: Site) -> None:
    await _hold(site)
    await site.login(ADA)
    whole = [(b, s, k) for b, s, k, _ in _rows(await site.page())]
    assert len(whole) == 6
    seen: list[list[tuple[str, str, str]]] = []
    path: str | None = "/console/held?size=2"
    while path is not None:
        page = await site.page(path)
        seen.append([(b, s, k) for b, s, k, _ in _rows(page)])
        # Every page has the totals of all.
        assert _totals(page)["addresses"] == 6
        path = _next(page)
        assert path is None or "size=2" in path
    assert [len(rows) for rows in seen] == [2, 2, 2]
    assert [row for rows in seen for row in rows] == whole
    assert (await site.client.get("/console/held?size=0")).status_code == 400
    for after in ("nope", "[1,2,3]", '["a","b"]', "[" * 5000):
        refused = await site.client.get("/console/held", params={"after": after})
        assert refused.status_code == 400, after
        assert "after: not a position this page made" in refused.text


@pytest.mark.asyncio
async def test_nothing_held_says_so(site: Site) -> None:
    # No session: to the login form.
    answer = await site.client.get("/console/held")
    assert answer.status_code == 303
    assert answer.headers["location"].startswith("/console/login?next=")
    await site.login(ADA)
    page = await site.page()
    assert _rows(page) == []
    assert _totals(page) == {"addresses": 0, "events": 0}
    assert "Nothing is held: no debounce, batch or throttle binding holds an event." in page
    assert "wait on a cap" not in page
    assert _next(page) is None
    # Delivered, the events are no longer held: the page is empty again.
    assert await site.send("web", "editor", "doc", "d1", 0) == "buffered"
    assert _totals(await site.page()) == {"addresses": 1, "events": 1}
    site.db.clock.advance(timedelta(seconds=30))
    await site.worker.flush_due()
    assert "Nothing is held" in await site.page()


# In a real browser.

FLOW_BINDINGS = """
[[bindings]]
id = "scan_digest"
source = "carrier"
match = "true"
key = "event.parcel"
document = "parcel"
event = "scan"
data = ["note"]
mode = "debounce"
window = "PT1H"
max_wait = "PT4H"

[[bindings]]
id = "order_notes"
source = "shop"
match = "event.kind == 'note'"
key = "event.order"
document = "order"
event = "checkout"
data = ["note"]
mode = "batch"
batch = 50
window = "PT30M"
"""
"""Appended to the served configuration: every scan is also held by a debounce of an
hour (``carrier_scans`` delivers it at once and creates the parcel's execution), and
notes on an order are collected in batches of 50 or half an hour."""

LEGACY = Binding(
    id="legacy_scans",
    source="carrier",
    match="true",
    key="event.parcel",
    document="parcel",
    event="scan",
    mode=Mode.DEBOUNCE,
    window=timedelta(seconds=1),
)
"""A binding the service does not have: what it held waits."""


@pytest.fixture
def served_flow_console(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> ServedConsole:
    """``statifier serve`` as :func:`~tests.console.conftest.served_console` starts it,
    its configuration with :data:`FLOW_BINDINGS` too (and its flow worker running)."""
    monkeypatch.setattr(console_conftest, "CONFIG", console_conftest.CONFIG + FLOW_BINDINGS)
    served: ServedConsole = request.getfixturevalue("served_console")
    return served


def _hold_legacy(database: str) -> None:
    """One scan held by :data:`LEGACY`, written by another router over the served
    database; due a second later, when the service's flow worker fails to deliver it."""

    async def hold() -> None:
        async with SqlAdapter(database) as adapter:
            router = Router(RouterConfig(adapter, bindings=[LEGACY], resolver=StaticResolver({})))
            event = InboundEvent(
                scope="depot_7", source="carrier", message_id="legacy-1", data={"parcel": "P-9"}
            )
            routed = await router.route(event)
            assert routed.outcomes[0].outcome == "buffered"

    asyncio.run(hold())


def _legacy_failed(database: str) -> None:
    """Wait until the service's flow worker has recorded its failure on the legacy
    group."""

    async def failures() -> int:
        async with SqlAdapter(database) as adapter:
            router = Router(RouterConfig(adapter, bindings=[], resolver=StaticResolver({})))
            rows = await FlowWorker(router).groups(after=("legacy_scans", "", ""))
            return sum(row.failures for row in rows if row.binding_id == "legacy_scans")

    deadline = time.monotonic() + 20
    while asyncio.run(failures()) == 0:
        assert time.monotonic() < deadline, "the service's flow worker recorded no failure"
        time.sleep(0.2)


def test_an_operator_reads_what_is_held_and_follows_a_key_to_its_execution(
    served_flow_console: ServedConsole, browser: WebDriver
) -> None:
    """From the navigation to the held events page: the totals, a debounce's rows (the
    parcels' keys linked to their executions), a batch's row holding a key of markup
    (shown as text, no script run), and a row whose binding the service does not have,
    with the failure its flow worker recorded; a key followed to its execution."""
    served = served_flow_console
    for n, note in enumerate(("left the hub", "on the van", "at the door")):
        served.scan("P-1", f"p1-{n}", note)
    served.scan("P-2", "p2-0", "left the hub")
    for n in range(2):
        served.order("note", "A-17", f"a17-{n}", note=f"gift wrap {n}")
    served.order("note", MARKUP, "markup-0", note="x")
    _hold_legacy(served.database)
    _legacy_failed(served.database)

    _log_in(browser, served, READER_TOKEN)  # a read-only operator reads it
    _follow(browser, browser.find_element(By.ID, "nav-held"))
    assert browser.find_element(By.TAG_NAME, "h1").text == "Held events"
    totals = {
        str(span.get_attribute("data-total")): span.text
        for span in browser.find_elements(By.CSS_SELECTOR, "#held-totals [data-total]")
    }
    assert totals == {"addresses": "5", "events": "8"}
    rows = browser.find_elements(By.CSS_SELECTOR, "#held-groups tr[data-binding]")
    listed = {
        (str(row.get_attribute("data-binding")), str(row.get_attribute("data-key"))): row
        for row in rows
    }
    assert set(listed) == {
        ("legacy_scans", "P-9"),
        ("order_notes", "A-17"),
        ("order_notes", MARKUP),
        ("scan_digest", "P-1"),
        ("scan_digest", "P-2"),
    }
    p1 = listed[("scan_digest", "P-1")]
    assert p1.find_element(By.CSS_SELECTOR, "td.mode").text == "debounce window 1h, at most 4h"
    assert p1.find_element(By.CSS_SELECTOR, "td[data-count=held]").text == "3"
    notes = listed[("order_notes", "A-17")]
    assert notes.find_element(By.CSS_SELECTOR, "td.mode").text == "batch 50 events or 30m"
    assert notes.find_element(By.CSS_SELECTOR, "td.key").text == "A-17"  # no order yet
    assert listed[("order_notes", MARKUP)].find_element(By.CSS_SELECTOR, "td.key").text == MARKUP
    _no_alert(browser)
    legacy = listed[("legacy_scans", "P-9")]
    assert legacy.find_element(By.CSS_SELECTOR, "td.mode").text == "binding gone: events wait"
    assert int(legacy.find_element(By.CSS_SELECTOR, "td[data-count=failures]").text) >= 1
    assert "BindingGone" in legacy.find_element(By.CSS_SELECTOR, "td.last-error").text
    _screenshot(browser, "held.png")

    link = p1.find_element(By.CSS_SELECTOR, "td.key a")
    execution_id = str(link.get_attribute("href")).rsplit("/", 1)[-1]
    _follow(browser, link)
    _wait(browser).until(lambda _: "/console/executions/" in browser.current_url)
    assert browser.find_element(By.ID, "execution-id").text == execution_id
