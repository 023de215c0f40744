"""The console's leases page on each database (SQLite and PostgreSQL), through httpx:
leases taken by real claims (:class:`~statifier.fronts.leases.PartitionLeases`, as a
stream source's members and the services of ``[bucket_leases]`` take them) shown group
by group, with each member and what it holds and each partition's holder and state;
a member that stops renewing leaves its partitions expired, one that gives them up
leaves them free, and the page says they wait; names are escaped; the empty page says
nothing is leased.

And in a real browser (headless Chromium against ``statifier serve`` with
``[bucket_leases]``): an operator opens the page from the navigation and reads the
service's own slices, each held by it."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta

import httpx
import pytest
import pytest_asyncio
import tests.console.conftest as console_conftest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from tests.console.conftest import READER_TOKEN, ServedConsole
from tests.console.test_browser import _follow, _log_in
from tests.persistence.conftest import (  # noqa: F401 - fixtures used by name
    postgresql_store,
    sqlite_store,
)
from tests.router.conftest import (  # noqa: F401 - fixtures used by name
    RouterDb,
    router_db,
    router_store,
)

from statifier.console.app import Console, console_app
from statifier.console.audit import Audit
from statifier.console.auth import Operator, Operators, Role, Sessions
from statifier.console.queries import ConsoleQueries
from statifier.fronts.leases import PartitionLeases
from statifier.router import Router, StaticResolver

BOB = "bob-token-0123456789abcdef"
"""A read-only operator's token: the page needs no more."""
MARKUP = '<script>alert("x")</script>'
SLICES = ["0000-0512", "0512-1024"]
"""The slices of ``[bucket_leases] slices = 2``."""


@dataclass
class Site:
    db: RouterDb
    client: httpx.AsyncClient

    def leases(self, group: str, owner: str, partitions: list[str]) -> PartitionLeases:
        """A member of ``group`` on the site's database, on its clock, 15 s ttl."""
        return PartitionLeases(
            self.db.adapter,
            group=group,
            partitions=partitions,
            owner=owner,
            ttl=15.0,
            clock=self.db.clock,
        )

    async def page(self) -> str:
        answer = await self.client.get("/console/leases")
        assert answer.status_code == 200, answer.text
        return answer.text


def _console(router: Router) -> Console:
    adapter = router.adapter
    return Console(
        queries=ConsoleQueries(adapter.engine, adapter.tables),
        audit=Audit(adapter.engine, adapter.tables),
        router=router,
        sessions=Sessions(Operators([Operator("bob", BOB, Role.READ_ONLY)]), key=b"k" * 32),
    )


@pytest_asyncio.fixture
async def site(router_db: RouterDb) -> AsyncIterator[Site]:  # noqa: F811 - the fixture
    router = router_db.router([], resolver=StaticResolver({}))
    transport = httpx.ASGITransport(app=console_app(_console(router)))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        answer = await client.post("/console/login", data={"token": BOB})
        assert answer.status_code == 303
        yield Site(router_db, client)


def _group(page: str, group: str) -> str:
    found = re.search(
        rf'<section class="lease-group" data-group="{re.escape(group)}".*?</section>',
        page,
        re.DOTALL,
    )
    assert found is not None, group
    return found.group(0)


def _states(section: str) -> dict[str, tuple[str, str]]:
    """Each partition's state and holder (``-`` for none), by partition."""
    rows = re.findall(
        r'<tr data-partition="([^"]+)" data-state="([^"]+)">(.*?)</tr>', section, re.DOTALL
    )
    found = {}
    for partition, state, row in rows:
        owner = re.search(r'<td class="owner">(?:<code>)?(.*?)(?:</code>)?</td>', row, re.DOTALL)
        assert owner is not None
        found[partition] = (state, "-" if owner.group(1) == "&ndash;" else owner.group(1))
    return found


def _members(section: str) -> dict[str, tuple[bool, int]]:
    """Each member's liveness and how many partitions it holds, by name."""
    rows = re.findall(
        r'<tr data-member="([^"]+)" data-alive="([01])">.*?data-count="holds">(\d+)</td>',
        section,
        re.DOTALL,
    )
    return {owner: (alive == "1", int(holds)) for owner, alive, holds in rows}


@pytest.mark.asyncio
async def test_the_page_shows_who_holds_what_and_what_waits(site: Site) -> None:
    page = await site.page()
    assert "Nothing is leased: no service shares this store's work by leases" in page
    assert 'aria-current="page">Leases</a>' in page

    # Two services share the bucket slices; one member reads a source's partitions.
    ada = site.leases("statifier.buckets/2", "svc-ada", SLICES)
    bob = site.leases("statifier.buckets/2", "svc-bob", SLICES)
    reader = site.leases("billing", MARKUP, ["p0", "p1", "p2"])
    await ada.claim()
    await bob.claim()
    await ada.release((await ada.claim()).surplus)  # bob's fair share
    await bob.claim()  # takes it
    await reader.claim()
    assert len(ada.held) == len(bob.held) == 1

    page = await site.page()
    assert "Nothing is leased" not in page
    slices = _group(page, "statifier.buckets/2")
    assert "bucket slices" in slices
    assert 'data-waiting="0"' in slices
    assert "every one held" in slices
    assert _members(slices) == {"svc-ada": (True, 1), "svc-bob": (True, 1)}
    assert _states(slices) == {
        next(iter(ada.held)): ("held", "svc-ada"),
        next(iter(bob.held)): ("held", "svc-bob"),
    }
    assert "held, 15.0 s left" in slices
    source = _group(page, "billing")
    assert "source partitions" in source
    assert MARKUP not in page
    escaped = "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;"
    assert {state for state, _ in _states(source).values()} == {"held"}
    assert {owner for _, owner in _states(source).values()} == {escaped}

    # Nobody renews for 20 s: every slice has expired, and waits.
    site.db.clock.advance(timedelta(seconds=20))
    page = await site.page()
    slices = _group(page, "statifier.buckets/2")
    assert 'data-waiting="2"' in slices  # neither renewed in 20 s
    assert "2 held by no member: their work waits" in slices
    states = _states(slices)
    assert {state for state, _ in states.values()} == {"expired"}
    assert "expired 5.0 s ago: waits" in slices
    assert _members(slices) == {"svc-ada": (False, 0), "svc-bob": (False, 0)}

    # Ada claims again: bob is gone, so she holds both slices.
    await ada.claim()
    slices = _group(await site.page(), "statifier.buckets/2")
    assert _states(slices) == dict.fromkeys(SLICES, ("held", "svc-ada"))
    assert _members(slices) == {"svc-ada": (True, 2)}

    # The reader gives its partitions up: free, and they wait.
    await reader.leave()
    source = _group(await site.page(), "billing")
    assert {state for state, _ in _states(source).values()} == {"free"}
    assert "3 held by no member" in source
    assert "free: waits" in source


@pytest.mark.asyncio
async def test_the_page_needs_a_session(router_db: RouterDb) -> None:  # noqa: F811
    router = router_db.router([], resolver=StaticResolver({}))
    transport = httpx.ASGITransport(app=console_app(_console(router)))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        answer = await client.get("/console/leases")
    assert answer.status_code == 303
    assert answer.headers["location"].startswith("/console/login?next=")


@pytest.fixture
def served_leasing_console(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> ServedConsole:
    """``statifier serve`` as :func:`~tests.console.conftest.served_console` starts it,
    sharing its workers by four leased slices of its buckets."""
    leasing = "\n[bucket_leases]\nenabled = true\nslices = 4\n"
    monkeypatch.setattr(console_conftest, "CONFIG", console_conftest.CONFIG + leasing)
    served: ServedConsole = request.getfixturevalue("served_console")
    return served


def test_an_operator_reads_which_service_holds_the_slices(
    served_leasing_console: ServedConsole, browser: WebDriver
) -> None:
    _log_in(browser, served_leasing_console, READER_TOKEN)
    _follow(browser, browser.find_element(By.ID, "nav-leases"))
    assert browser.find_element(By.TAG_NAME, "h1").text == "Leases"
    group = '[data-group="statifier.buckets/4"]'
    deadline = time.monotonic() + 20
    while not browser.find_elements(By.CSS_SELECTOR, f'{group}[data-waiting="0"]'):
        # The service's first claim comes as it starts: reload until it shows.
        assert time.monotonic() < deadline, browser.page_source
        time.sleep(0.3)
        browser.refresh()
    states = [
        (row.get_attribute("data-partition"), row.get_attribute("data-state"))
        for row in browser.find_elements(
            By.CSS_SELECTOR, f"{group} table.leases tr[data-partition]"
        )
    ]
    assert states == [
        ("0000-0256", "held"),
        ("0256-0512", "held"),
        ("0512-0768", "held"),
        ("0768-1024", "held"),
    ]
    members = browser.find_elements(By.CSS_SELECTOR, f"{group} table.members tr[data-member]")
    assert len(members) == 1
    assert members[0].get_attribute("data-alive") == "1"
    assert members[0].find_element(By.CSS_SELECTOR, "td[data-count=holds]").text == "4"
    owners = browser.find_elements(By.CSS_SELECTOR, f"{group} table.leases td.owner")
    assert {owner.text for owner in owners} == {members[0].get_attribute("data-member")}
