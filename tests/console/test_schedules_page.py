"""The console's schedules page on each database (SQLite and PostgreSQL), through httpx:
every schedule a page at a time by name, of one scope when asked, each with its times,
fires, counts, last error (escaped) and state (running, paused, failing, late,
unreadable); pause and resume behind the confirmation, with the session's CSRF token,
each with its audit row in the act's own transaction; refusals (paused already,
running already, no such schedule) and failures answered and audited.

And in a real browser (headless Chromium against ``statifier serve``): an operator
pauses a schedule from the page and resumes it. With ``STATIFIER_SCREENSHOTS=1`` it
writes ``docs/console/schedules.png``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import pytest_asyncio
import sqlalchemy as sa
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions
from tests.console.conftest import OPERATOR_TOKEN, ServedConsole
from tests.console.test_browser import _audited, _follow, _log_in, _screenshot, _wait
from tests.persistence.conftest import (  # noqa: F401 - fixtures used by name
    postgresql_store,
    sqlite_store,
)
from tests.router.conftest import (  # noqa: F401 - fixtures used by name
    RouterDb,
    router_db,
    router_store,
)

from statifier.console import schedules as schedule_actions
from statifier.console.actions import Done, Refused
from statifier.console.app import Console, console_app
from statifier.console.audit import Audit
from statifier.console.auth import Operator, Operators, Role, Sessions
from statifier.console.queries import ConsoleQueries
from statifier.persistence.sql import SqlAdapter, SqlTransaction
from statifier.router import (
    Binding,
    Router,
    RouterConfig,
    Schedule,
    Scheduler,
    StaticResolver,
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

TICKS = Binding(
    id="ticks",
    source="clock",
    match="true",
    key="event.schedule",
    document="counter",
    event="hit",
)
"""Routes every fire of source ``clock`` to a ``counter`` chart that no resolver here
knows: each such fire fails (``UnresolvedDocument``), as a missing chart would in
production. Fires of source ``quiet`` match no binding and are made (routed to
nothing)."""


@dataclass
class Site:
    """A console over one backend's database, a scheduler over the same router, and a
    client of the console."""

    db: RouterDb
    router: Router
    scheduler: Scheduler
    console: Console
    client: httpx.AsyncClient

    async def login(self, token: str) -> None:
        answer = await self.client.post("/console/login", data={"token": token})
        assert answer.status_code == 303, answer.text

    async def page(self, path: str) -> str:
        answer = await self.client.get(path)
        assert answer.status_code == 200, answer.text
        return answer.text

    async def csrf(self, path: str) -> str:
        """The CSRF token of the confirmation form at ``path``."""
        found = re.search(r'name="csrf" value="([^"]+)"', await self.page(path))
        assert found is not None
        return found.group(1)

    async def confirm(self, path: str) -> httpx.Response:
        """Post the confirmation form at ``path``, with its CSRF token."""
        return await self.client.post(path, data={"csrf": await self.csrf(path)})

    async def put(self, name: str, **entry: object) -> None:
        fields: dict[str, object] = {"source": "quiet", "scope": "ops"}
        fields.update(entry)
        await self.scheduler.put(Schedule.from_mapping(name, fields))

    async def audit_rows(self) -> list[tuple[str, str, str, str, str | None]]:
        page = await self.console.audit.entries()
        return [(r.actor, r.action, r.target, r.outcome, r.detail) for r in page.rows]

    def sql(self, statement: Any) -> None:
        engine = sa.create_engine(migrations.sync_url(self.db.store.url))
        try:
            with engine.begin() as connection:
                connection.execute(statement)
        finally:
            engine.dispose()


@pytest_asyncio.fixture
async def site(router_db: RouterDb) -> AsyncIterator[Site]:  # noqa: F811 - the fixture
    router = router_db.router([TICKS], resolver=StaticResolver({}))
    operators = Operators(
        [Operator("ada", ADA, Role.OPERATOR), Operator("bob", BOB, Role.READ_ONLY)]
    )
    adapter = router_db.adapter
    console = Console(
        queries=ConsoleQueries(adapter.engine, adapter.tables),
        audit=Audit(adapter.engine, adapter.tables),
        router=router,
        sessions=Sessions(operators, key=b"k" * 32),
    )
    scheduler = Scheduler(router, retry=timedelta(seconds=30), max_retry=timedelta(minutes=5))
    transport = httpx.ASGITransport(app=console_app(console))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        yield Site(router_db, router, scheduler, console, client)


def _rows(page: str) -> dict[str, tuple[str, str]]:
    """Each listed schedule's state and its row's markup, by name, in page order."""
    found = re.findall(
        r'<tr data-schedule="([^"]+)" data-state="([^"]+)">(.*?)</tr>', page, re.DOTALL
    )
    return {name: (state, row) for name, state, row in found}


def _states(page: str) -> dict[str, str]:
    return {name: state for name, (state, _) in _rows(page).items()}


def _cell(row: str, kind: str) -> str:
    """The text of the row's cell of class ``kind``, its tags dropped."""
    found = re.search(rf'<td class="{kind}[^"]*"[^>]*>(.*?)</td>', row, re.DOTALL)
    assert found is not None, (kind, row)
    return " ".join(re.sub(r"<[^>]+>", " ", found.group(1)).split())


def _next(page: str) -> str | None:
    found = re.search(r'<a class="next-page" rel="next" href="([^"]+)"', page)
    return None if found is None else found.group(1).replace("&amp;", "&")


async def _five(site: Site) -> None:
    """Five schedules at 08:00, then, at 08:01:03, the due ones stepped: ``c-minutely``
    made its fire, ``e:broken.tick`` failed (its chart is missing)."""
    await site.put("a-nightly", cron="0 2 * * *", timezone="Europe/Paris", scope="shop")
    await site.put("b-quarterly", every="PT15M", start="2026-09-01T00:05:00Z", scope="shop")
    await site.put("c-minutely", every="PT1M")
    await site.put("d-hourly", every="PT1H", paused=True)
    await site.put("e:broken.tick", every="PT1M", source="clock")
    site.db.clock.advance(timedelta(minutes=1, seconds=3))
    reports = {report.name: report for report in await site.scheduler.fire_due()}
    assert reports["c-minutely"].error is None
    assert "UnresolvedDocument" in (reports["e:broken.tick"].error or "")


# The page.


@pytest.mark.asyncio
async def test_the_page_lists_each_schedule_with_its_times_fires_counts_and_state(
    site: Site,
) -> None:
    await _five(site)
    await site.login(ADA)
    page = await site.page("/console/schedules")
    assert 'id="nav-schedules" aria-current="page"' in page
    rows = _rows(page)
    assert list(rows) == ["a-nightly", "b-quarterly", "c-minutely", "d-hourly", "e:broken.tick"]
    assert _states(page) == {
        "a-nightly": "running",
        "b-quarterly": "running",
        "c-minutely": "running",
        "d-hourly": "paused",
        "e:broken.tick": "failing",
    }
    nightly = rows["a-nightly"][1]
    assert _cell(nightly, "scope") == "shop"
    assert _cell(nightly, "times") == "0 2 * * * Europe/Paris"
    # 02:00 in Paris, summer time: midnight UTC.
    assert _cell(nightly, "next-fire") == "2026-09-20 00:00:00"
    assert _cell(nightly, "last-fire") == "none yet"
    quarterly = rows["b-quarterly"][1]
    assert _cell(quarterly, "times") == "every 15m from 2026-09-01 00:05:00"
    assert _cell(quarterly, "next-fire") == "2026-09-19 08:05:00"
    minutely = rows["c-minutely"][1]
    assert _cell(minutely, "times") == "every 1m"  # counted from the epoch: no start shown
    assert _cell(minutely, "last-fire") == "2026-09-19 08:01:00 made 2026-09-19 08:01:03"
    assert _cell(minutely, "next-fire") == "2026-09-19 08:02:00"
    assert 'data-count="fired">1<' in minutely
    broken = rows["e:broken.tick"][1]
    assert 'data-count="failures">1<' in broken
    assert 'data-count="fired">0<' in broken
    assert "UnresolvedDocument" in _cell(broken, "last-error")
    # The fire at 08:01 waits; a worker tries it again 30 s after it failed.
    assert _cell(broken, "next-fire") == "2026-09-19 08:01:00 tried again 2026-09-19 08:01:33"
    # The operator's buttons: pause a running schedule, resume a paused one.
    assert 'href="/console/schedules/a-nightly/pause"' in nightly
    assert 'href="/console/schedules/d-hourly/resume"' in rows["d-hourly"][1]
    assert "/pause" not in rows["d-hourly"][1]
    assert 'href="/console/schedules/e%3Abroken.tick/pause"' in broken

    # Six minutes on and no worker: the two due before 08:06 are late; a failing one is
    # said failing however late; a paused one is never late.
    site.db.clock.advance(timedelta(minutes=6))
    later = await site.page("/console/schedules")
    assert _states(later) == {
        "a-nightly": "running",
        "b-quarterly": "late",
        "c-minutely": "late",
        "d-hourly": "paused",
        "e:broken.tick": "failing",
    }
    assert "due 2026-09-19 08:02:00" in _cell(_rows(later)["c-minutely"][1], "state")


@pytest.mark.asyncio
async def test_pages_follow_the_names_and_keep_the_scope_asked_for(site: Site) -> None:
    await _five(site)
    await site.put("f-markup", every="PT1H", scope=MARKUP)
    await site.login(BOB)  # a read-only operator reads every page
    seen: list[list[str]] = []
    path: str | None = "/console/schedules?size=2"
    while path is not None:
        page = await site.page(path)
        seen.append(list(_rows(page)))
        path = _next(page)
    assert seen == [
        ["a-nightly", "b-quarterly"],
        ["c-minutely", "d-hourly"],
        ["e:broken.tick", "f-markup"],
    ]
    seen = []
    path = "/console/schedules?scope=ops&size=2"
    while path is not None:
        page = await site.page(path)
        assert 'name="scope" value="ops"' in page
        seen.append(list(_rows(page)))
        path = _next(page)
        assert path is None or "scope=ops" in path
    assert seen == [["c-minutely", "d-hourly"], ["e:broken.tick"]]
    assert list(_rows(await site.page("/console/schedules?scope=shop"))) == [
        "a-nightly",
        "b-quarterly",
    ]
    nowhere = await site.page("/console/schedules?scope=elsewhere")
    assert _rows(nowhere) == {}
    assert "No schedule in this scope." in nowhere
    # A scope holding markup is shown, and filtered on, as text.
    answer = await site.client.get("/console/schedules", params={"scope": MARKUP})
    assert answer.status_code == 200
    marked = answer.text
    assert list(_rows(marked)) == ["f-markup"]
    assert MARKUP not in marked
    assert _cell(_rows(marked)["f-markup"][1], "scope").startswith("&lt;script&gt;alert(")
    too_long = await site.client.get("/console/schedules", params={"scope": "x" * 501})
    assert too_long.status_code == 400
    assert "scope: 1 to 500 characters" in too_long.text
    assert (await site.client.get("/console/schedules?size=0")).status_code == 400


@pytest.mark.asyncio
async def test_a_last_error_and_an_unreadable_definition_are_shown_as_text(
    site: Site,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await _five(site)
    table = site.db.store.tables.schedules
    site.sql(table.update().where(table.c.name == "e:broken.tick").values(last_error=MARKUP))
    # A definition no Schedule reads (a minute 61), as another version might have left.
    unreadable = {"cron": "61 * * * *", "timezone": "UTC", "source": "quiet", "scope": "ops"}
    site.sql(table.update().where(table.c.name == "d-hourly").values(definition=unreadable))
    await site.login(ADA)
    page = await site.page("/console/schedules")
    assert MARKUP not in page
    broken = _rows(page)["e:broken.tick"][1]
    assert '<span class="error">&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;' in broken
    state, hourly = _rows(page)["d-hourly"]
    assert state == "unreadable"  # the scheduler's own list leaves it out; here it shows
    assert "schedule &#39;d-hourly&#39;" in _cell(hourly, "times")
    assert "61" in _cell(hourly, "times")
    # Resuming it fails: answered 500 with why, logged, and audited.
    path = "/console/schedules/d-hourly/resume"
    with caplog.at_level(logging.ERROR, "statifier.console"):
        failed = await site.confirm(path)
    assert failed.status_code == 500
    assert "ScheduleError: schedule &#39;d-hourly&#39;" in failed.text
    assert "console: schedule.resume of d-hourly failed" in caplog.text
    ((actor, action, target, outcome, detail),) = await site.audit_rows()
    assert (actor, action, target, outcome) == ("ada", "schedule.resume", "d-hourly", "failed")
    assert detail is not None
    assert detail.startswith("ScheduleError: schedule 'd-hourly'")
    state_after = _states(await site.page("/console/schedules"))["d-hourly"]
    assert state_after == "unreadable"  # still paused: nothing was written


# Pause and resume.


@pytest.mark.asyncio
async def test_pause_and_resume_behind_a_confirmation_each_with_its_audit_row(
    site: Site,
) -> None:
    await site.put("a-nightly", cron="0 2 * * *", timezone="Europe/Paris", scope="shop")
    await site.login(ADA)
    pause = "/console/schedules/a-nightly/pause"
    confirmation = await site.page(pause)
    assert 'id="confirm"' in confirmation
    assert "Schedule a-nightly makes no fire until it is resumed" in confirmation
    state = await site.scheduler.get("a-nightly")
    assert state is not None
    assert not state.paused  # the confirmation page changed nothing

    done = await site.confirm(pause)
    assert done.status_code == 303
    assert done.headers["location"] == "/console/schedules?done=schedule.pause"
    back = await site.page(done.headers["location"])
    assert 'id="notice"' in back
    assert "Done: the schedule was paused" in back
    assert _states(back) == {"a-nightly": "paused"}
    assert 'href="/console/schedules/a-nightly/resume"' in back
    state = await site.scheduler.get("a-nightly")
    assert state is not None
    assert state.paused

    again = await site.confirm(pause)
    assert again.status_code == 409
    assert "schedule &#39;a-nightly&#39; is paused already" in again.text

    # Two days paused: the fires they held are not made; the next is after now.
    site.db.clock.advance(timedelta(days=2))
    resume = "/console/schedules/a-nightly/resume"
    assert "The fires its pause covered are not made" in await site.page(resume)
    resumed = await site.confirm(resume)
    assert resumed.headers["location"] == "/console/schedules?done=schedule.resume"
    state = await site.scheduler.get("a-nightly")
    assert state is not None
    assert not state.paused
    assert state.next_fire_at == datetime(2026, 9, 22, 0, 0, tzinfo=UTC)
    assert _states(await site.page("/console/schedules")) == {"a-nightly": "running"}
    twice = await site.confirm(resume)
    assert twice.status_code == 409
    assert "schedule &#39;a-nightly&#39; is running already" in twice.text

    assert await site.audit_rows() == [
        (
            "ada",
            "schedule.resume",
            "a-nightly",
            "refused",
            "schedule 'a-nightly' is running already",
        ),
        (
            "ada",
            "schedule.resume",
            "a-nightly",
            "done",
            "resumed schedule 'a-nightly': its next fire is at 2026-09-22 00:00:00 UTC",
        ),
        ("ada", "schedule.pause", "a-nightly", "refused", "schedule 'a-nightly' is paused already"),
        ("ada", "schedule.pause", "a-nightly", "done", "paused schedule 'a-nightly'"),
    ]


@pytest.mark.asyncio
async def test_a_paused_schedule_makes_no_fire_and_a_resumed_one_fires_again(
    site: Site,
) -> None:
    await site.put("c-minutely", every="PT1M")
    await site.login(ADA)
    await site.confirm("/console/schedules/c-minutely/pause")
    site.db.clock.advance(timedelta(minutes=5, seconds=1))
    assert await site.scheduler.fire_due() == []
    await site.confirm("/console/schedules/c-minutely/resume")
    assert await site.scheduler.fire_due() == []  # its next fire is after the resume
    site.db.clock.advance(timedelta(minutes=1))
    (made,) = await site.scheduler.fire_due()
    assert made.fire_time == START + timedelta(minutes=6)


@pytest.mark.asyncio
async def test_a_schedule_that_is_not_there_is_answered_and_audited(site: Site) -> None:
    await site.login(ADA)
    for verb in ("pause", "resume"):
        answer = await site.confirm(f"/console/schedules/nope/{verb}")
        assert answer.status_code == 409
        assert "no schedule &#39;nope&#39;" in answer.text
    assert await site.audit_rows() == [
        ("ada", "schedule.resume", "nope", "refused", "no schedule 'nope'"),
        ("ada", "schedule.pause", "nope", "refused", "no schedule 'nope'"),
    ]
    assert (await site.client.get("/console/schedules/nope/delete")).status_code == 404


@pytest.mark.asyncio
async def test_pause_and_resume_need_the_confirmation_a_session_and_the_operator_role(
    site: Site,
) -> None:
    await site.put("a-nightly", cron="0 2 * * *", timezone="Europe/Paris", scope="shop")
    pause = "/console/schedules/a-nightly/pause"
    # No session: the page and the confirmation send to the login form; a post is 401.
    for path in ("/console/schedules", pause):
        answer = await site.client.get(path)
        assert answer.status_code == 303
        assert answer.headers["location"].startswith("/console/login?next=")
    assert (await site.client.post(pause, data={})).status_code == 401
    # An operator's post without the session's CSRF token, or with a guessed one.
    await site.login(ADA)
    assert (await site.client.post(pause, data={})).status_code == 403
    refused = await site.client.post(pause, data={"csrf": "guessed"})
    assert refused.status_code == 403
    assert "The form was not this session" in refused.text
    # A read-only operator sees no button, and is refused the confirmation and the act.
    csrf = await site.csrf(pause)
    await site.login(BOB)
    page = await site.page("/console/schedules")
    assert _states(page) == {"a-nightly": "running"}
    assert "/pause" not in page
    assert (await site.client.get(pause)).status_code == 403
    assert (await site.client.post(pause, data={"csrf": csrf})).status_code == 403
    state = await site.scheduler.get("a-nightly")
    assert state is not None
    assert not state.paused
    assert await site.audit_rows() == []


@pytest.mark.asyncio
async def test_an_audit_row_that_cannot_be_written_undoes_the_pause_and_the_resume(
    site: Site,
) -> None:
    await site.put("a-nightly", cron="0 2 * * *", timezone="Europe/Paris", scope="shop")
    written: list[str] = []

    async def broken(tx: SqlTransaction, done: Done) -> None:
        raise OSError("the audit table cannot be written")

    async def record(tx: SqlTransaction, done: Done) -> None:
        written.append(done.summary)

    async def paused() -> bool:
        state = await site.scheduler.get("a-nightly")
        assert state is not None
        return state.paused

    with pytest.raises(OSError, match="cannot be written"):
        await schedule_actions.pause(site.router, "a-nightly", record=broken)
    assert not await paused()
    await schedule_actions.pause(site.router, "a-nightly", record=record)
    assert await paused()
    with pytest.raises(OSError, match="cannot be written"):
        await schedule_actions.resume(site.router, "a-nightly", record=broken)
    assert await paused()
    with pytest.raises(Refused, match="paused already"):
        await schedule_actions.pause(site.router, "a-nightly", record=record)
    await schedule_actions.resume(site.router, "a-nightly", record=record)
    assert not await paused()
    assert written == [
        "paused schedule 'a-nightly'",
        "resumed schedule 'a-nightly': its next fire is at 2026-09-20 00:00:00 UTC",
    ]


# In a real browser.


def _put_schedules(database: str) -> None:
    """Five schedules in the served database: two running, one of them with a fire
    made, one paused, one whose fire failed (its chart is missing) and is tried again
    in an hour; none due for hours, so a worker, if the service runs one, leaves them
    as they are."""

    async def put() -> None:
        async with SqlAdapter(database) as adapter:
            config = RouterConfig(adapter, bindings=[TICKS], resolver=StaticResolver({}))
            retry = timedelta(hours=1)
            scheduler = Scheduler(Router(config), retry=retry, max_retry=retry)
            now = datetime.now(UTC)
            for name, entry in (
                ("nightly.export", {"cron": "0 2 * * *", "timezone": "Europe/Paris"}),
                ("six-hourly", {"every": "PT6H", "start": "2026-01-01T00:15:00Z"}),
                ("weekly:report", {"cron": "0 7 * * 1", "timezone": "UTC", "paused": True}),
            ):
                schedule = Schedule.from_mapping(
                    name, {**entry, "source": "quiet", "scope": "shop"}
                )
                await scheduler.put(schedule, now=now)
            # Their first fires 30 s ago: on time (within their minute of grace), so
            # made now: the heartbeat's routes to nothing, the broken one's fails.
            first = (now - timedelta(seconds=30)).isoformat()
            for name, source, every in (
                ("heartbeat", "quiet", "PT6H"),
                ("ticks.broken", "clock", "PT1M"),
            ):
                entry = {"every": every, "start": first, "source": source, "scope": "ops"}
                schedule = Schedule.from_mapping(name, entry)
                await scheduler.put(schedule, now=now - timedelta(seconds=31))
            made = {report.name: report for report in await scheduler.fire_due(now=now)}
            assert made["heartbeat"].error is None
            assert made["ticks.broken"].error is not None

    asyncio.run(put())


def _row_state(browser: WebDriver, name: str) -> str:
    row = browser.find_element(By.CSS_SELECTOR, f'#schedules tr[data-schedule="{name}"]')
    return str(row.get_attribute("data-state"))


def test_an_operator_pauses_a_schedule_from_the_page_and_resumes_it(
    served_console: ServedConsole, browser: WebDriver
) -> None:
    """From the navigation to the schedules page; *Pause* on a running schedule, its
    confirmation, the page again with the schedule paused; *Resume*, the same way back.
    Each act has its audit row."""
    served = served_console
    _put_schedules(served.database)
    _log_in(browser, served, OPERATOR_TOKEN)
    _follow(browser, browser.find_element(By.ID, "nav-schedules"))
    states = {
        str(row.get_attribute("data-schedule")): str(row.get_attribute("data-state"))
        for row in browser.find_elements(By.CSS_SELECTOR, "#schedules tr[data-schedule]")
    }
    assert states == {
        "heartbeat": "running",
        "nightly.export": "running",
        "six-hourly": "running",
        "ticks.broken": "failing",
        "weekly:report": "paused",
    }
    error = browser.find_element(
        By.CSS_SELECTOR, '#schedules tr[data-schedule="ticks.broken"] td.last-error'
    )
    assert "UnresolvedDocument" in error.text

    nightly = '#schedules tr[data-schedule="nightly.export"]'
    _follow(browser, browser.find_element(By.CSS_SELECTOR, f"{nightly} a.pause-schedule"))
    assert "Pause this schedule?" in browser.find_element(By.TAG_NAME, "h1").text
    _follow(browser, browser.find_element(By.ID, "confirm"))
    _wait(browser).until(expected_conditions.url_contains("done=schedule.pause"))
    assert "the schedule was paused" in browser.find_element(By.ID, "notice").text
    assert _row_state(browser, "nightly.export") == "paused"
    _screenshot(browser, "schedules.png")

    _follow(browser, browser.find_element(By.CSS_SELECTOR, f"{nightly} a.resume-schedule"))
    _follow(browser, browser.find_element(By.ID, "confirm"))
    _wait(browser).until(expected_conditions.url_contains("done=schedule.resume"))
    assert _row_state(browser, "nightly.export") == "running"
    assert _audited(served.database, "nightly.export") == [
        ("ada", "schedule.resume", "done"),
        ("ada", "schedule.pause", "done"),
    ]
