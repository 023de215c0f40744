"""The console's "try a revision" page over a real database (SQLite and PostgreSQL),
through httpx: a chart uploaded behind the session and its CSRF token, replayed on the
recorded executions in the background (read-only: no row changes), its progress, its
counts, a divergence drawn on both charts; refusals (an invalid chart, one too large, a
bad filter, too many replays) shown on the page and logged; jobs that expire."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import pytest_asyncio
import sqlalchemy as sa
from tests.persistence.conftest import (  # noqa: F401 - fixtures used by name
    postgresql_rows_store,
    postgresql_store,
    sqlite_store,
)
from tests.router.conftest import (  # noqa: F401 - fixtures used by name
    RouterDb,
    pg_db,
    pg_store,
    router_db,
    router_store,
)

from statifier.chart import ReadLimits, compile_chart
from statifier.console.app import MAX_UPLOAD_BYTES, Console, console_app
from statifier.console.audit import Audit
from statifier.console.auth import Operator, Operators, Role, Sessions
from statifier.console.queries import ConsoleQueries
from statifier.console.revisions import JobState, Revisions, TooManyJobs
from statifier.core import Event
from statifier.persistence import Executions
from statifier.shadow import Selection
from statifier.sql import TableOptions, migrations

ADA = "ada-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef"

CART = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="cart">
<datamodel><data id="total" expr="0"/></datamodel>
<state id="cart">
  <transition event="add" cond="_event.data.amount &gt; 100" target="review">
    <assign location="total" expr="total + _event.data.amount"/>
  </transition>
  <transition event="add"><assign location="total" expr="total + _event.data.amount"/></transition>
  <transition event="checkout" target="paying"/>
</state>
<state id="review"><transition event="approve" target="cart"/></state>
<state id="paying" initial="card">
  <state id="card"><transition event="paid" target="done"/></state>
</state>
<final id="done"/>
</scxml>"""
"""A cart: an add over 100 goes to review, a checkout to paying (its card step)."""

GUARD = CART.replace("&gt; 100", "&gt; 50")
"""The revision whose review takes adds over 50: an add of 60 parts there."""

RAISES = CART.replace(
    '<transition event="checkout" target="paying"/>',
    '<transition event="checkout" target="paying"><log expr="nothing.there"/></transition>',
)
"""The revision whose checkout raises an error without changing anything else."""

SCRIPTS: dict[str, list[tuple[str, int | None]]] = {
    "cart-60": [("add", 60)],
    "cart-5": [("add", 5), ("checkout", None)],
    "cart-150": [("add", 150), ("approve", None)],
}
"""Three carts: the first parts on GUARD, the second raises on RAISES."""


@dataclass
class Site:
    db: RouterDb
    console: Console
    client: httpx.AsyncClient

    async def login(self, token: str = ADA) -> str:
        """Log in; answers the session's CSRF token (the form's)."""
        answer = await self.client.post("/console/login", data={"token": token})
        assert answer.status_code == 303, answer.text
        return self.csrf((await self.page("/console/revisions")).text)

    async def page(self, path: str) -> httpx.Response:
        answer = await self.client.get(path)
        assert answer.status_code == 200, answer.text
        return answer

    @staticmethod
    def csrf(page: str) -> str:
        found = re.search(r'name="csrf" value="([^"]+)"', page)
        assert found is not None
        return found.group(1)

    async def upload(
        self,
        csrf: str | None,
        chart: bytes | None,
        filename: str = "cart.scxml",
        **fields: str,
    ) -> httpx.Response:
        data = dict(fields)
        if csrf is not None:
            data["csrf"] = csrf
        # No file chosen: a browser sends the part, empty and nameless.
        part = ("", b"", "application/octet-stream") if chart is None else (filename, chart)
        return await self.client.post("/console/revisions", data=data, files={"chart": part})

    async def finished(self, path: str) -> str:
        """The job page at ``path`` once the job has ended."""
        for _ in range(400):
            text = (await self.page(path)).text
            if 'id="job-state">running<' not in text:
                assert "data-poll" not in text
                return text
            await asyncio.sleep(0.05)
        raise AssertionError(f"{path} still runs")

    def rows(self) -> dict[str, int]:
        """The number of rows of every table: the replay must change none."""
        engine = sa.create_engine(migrations.sync_url(self.db.store.url))
        tables = self.db.store.tables
        try:
            with engine.connect() as connection:
                return {
                    table.name: connection.execute(
                        sa.select(sa.func.count()).select_from(table)
                    ).scalar_one()
                    for table in tables.metadata.sorted_tables
                    if table.schema == tables.options.schema
                }
        finally:
            engine.dispose()


def console_of(db: RouterDb, **options: Any) -> Console:
    router = db.router([])
    adapter = db.adapter
    operators = Operators(
        [Operator("ada", ADA, Role.OPERATOR), Operator("bob", BOB, Role.READ_ONLY)]
    )
    return Console(
        queries=ConsoleQueries(adapter.engine, adapter.tables),
        audit=Audit(adapter.engine, adapter.tables),
        router=router,
        sessions=Sessions(operators, key=b"k" * 32),
        **options,
    )


async def record(db: RouterDb, console: Console) -> None:
    """The carts of SCRIPTS, recorded on CART (named ``cart``)."""
    cart = compile_chart(CART, name="cart")
    executions = Executions(console.stores.first.router.storage)
    for execution_id, script in SCRIPTS.items():
        await executions.create(execution_id, cart)
        for name, amount in script:
            data = None if amount is None else {"amount": amount}
            await executions.step(execution_id, cart, Event(name, data=data))


@pytest_asyncio.fixture
async def site(router_db: RouterDb) -> AsyncIterator[Site]:  # noqa: F811 - the fixture
    console = console_of(router_db)
    await record(router_db, console)
    transport = httpx.ASGITransport(app=console_app(console))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            yield Site(router_db, console, client)
    finally:
        console.close()


def _lit(page: str, figure: str) -> list[str]:
    drawn = page.split(f'id="{figure}"', 1)[1].split("</figure>", 1)[0]
    assert "<svg" in drawn
    return re.findall(r'<g class="state active" data-state="([^"]+)"', drawn)


@pytest.mark.asyncio
async def test_without_a_session_the_page_sends_to_login_and_an_upload_is_refused(
    site: Site,
) -> None:
    answer = await site.client.get("/console/revisions")
    assert answer.status_code == 303
    assert answer.headers["location"].startswith("/console/login?next=")
    refused = await site.upload(None, GUARD.encode())
    assert refused.status_code == 401
    assert site.console.revisions.jobs() == []
    assert (await site.client.get("/console/revisions/anything")).status_code == 303


@pytest.mark.asyncio
async def test_an_upload_without_the_sessions_csrf_token_starts_nothing(site: Site) -> None:
    await site.login()
    for csrf in (None, "guessed"):
        answer = await site.upload(csrf, GUARD.encode())
        assert answer.status_code == 403, csrf
    assert site.console.revisions.jobs() == []


@pytest.mark.asyncio
async def test_a_revision_replays_in_the_background_and_shows_where_it_parts_on_both_charts(
    site: Site,
) -> None:
    before = site.rows()
    csrf = await site.login(BOB)  # a read-only operator may try: nothing is written
    answer = await site.upload(csrf, GUARD.encode())
    assert answer.status_code == 303, answer.text
    path = answer.headers["location"]
    assert path.startswith("/console/revisions/")
    page = await site.finished(path)
    assert 'id="job-state">done<' in page
    assert 'id="progress-text">3 of 3 executions<' in page
    counts = dict(re.findall(r'<td data-verdict="([a-z_]+)">(\d+)</td>', page))
    assert counts == {"same": "2", "diverged": "1", "new_errors": "0", "untrusted": "0"}
    listed = re.findall(r'class="result" data-execution-id="([^"]+)" data-verdict="(\w+)"', page)
    assert listed == [("cart-60", "diverged")]
    assert "after input 1 (add): configuration<" in page
    shown = (await site.page(f"{path}?execution=cart-60")).text
    assert 'id="old-configuration">cart<' in shown
    assert 'id="new-configuration">review<' in shown
    assert _lit(shown, "diagram-old") == ["cart"]
    assert _lit(shown, "diagram-new") == ["review"]
    assert "entry 0, event <code>add</code>" in shown
    assert site.rows() == before  # read-only: no row written, not even an audit row
    jobs = (await site.page("/console/revisions")).text
    assert re.search(r'data-job="[^"]+" data-state="done"', jobs)
    unknown = await site.client.get(f"{path}?execution=nobody")
    assert unknown.status_code == 400


@pytest.mark.asyncio
async def test_new_errors_and_the_filter_are_reported(site: Site) -> None:
    csrf = await site.login()
    answer = await site.upload(csrf, RAISES.encode(), filename="C:\\charts\\cart.scxml")
    page = await site.finished(answer.headers["location"])
    listed = re.findall(r'class="result" data-execution-id="([^"]+)" data-verdict="(\w+)"', page)
    assert listed == [("cart-5", "new_errors")]
    assert "1 new error<" in page
    shown = (await site.page(f"{answer.headers['location']}?execution=cart-5")).text
    assert "error.execution" in shown.split('id="new-errors"', 1)[1]
    assert "They never part." in shown
    # The filter: a sample of one, a status, a created window; another document.
    filtered = await site.upload(
        csrf, GUARD.encode(), status="active", sample="1", created_after="2000-01-01"
    )
    page = await site.finished(filtered.headers["location"])
    assert 'id="progress-text">1 of 1 executions<' in page
    assert "status active, created from" in page
    other = await site.upload(csrf, GUARD.encode(), document="no_such_chart")
    page = await site.finished(other.headers["location"])
    assert 'id="none-selected"' in page


@pytest.mark.asyncio
async def test_an_invalid_chart_a_missing_one_and_a_bad_filter_are_refused_on_the_form(
    site: Site, caplog: pytest.LogCaptureFixture
) -> None:
    csrf = await site.login()
    caplog.set_level(logging.WARNING, logger="statifier.console")
    cases: list[tuple[bytes | None, dict[str, str], str]] = [
        (b"<scxml><nope", {}, "cart.scxml:1:8: unclosed token"),
        (b'<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="x"/>', {}, "initial"),
        (None, {}, "choose a chart file"),
        (CART.encode(), {"sample": "many"}, "sample: a number"),
        (CART.encode(), {"status": "asleep"}, "status: not a status"),
        (CART.encode(), {"created_before": "noon"}, "created before: not"),
    ]
    page = ""
    for chart, fields, said in cases:
        answer = await site.upload(csrf, chart, **fields)
        assert answer.status_code == 400, (fields, answer.text)
        page = answer.text
        refused = page.split('id="refused"', 1)[1].split("</p>", 1)[0]
        assert said in refused, (said, refused)
        assert 'id="revision-form"' in page  # the form again
    assert 'value="noon"' in page  # with the fields as they were sent
    logged = [r.getMessage() for r in caplog.records if "a revision from ada" in r.getMessage()]
    assert len(logged) == len(cases)
    assert site.console.revisions.jobs() == []


@pytest.mark.asyncio
async def test_a_chart_over_the_read_limit_and_a_body_over_the_bound_are_413(
    site: Site, caplog: pytest.LogCaptureFixture
) -> None:
    csrf = await site.login()
    caplog.set_level(logging.WARNING, logger="statifier.console")
    limit = ReadLimits().max_bytes
    padded = CART.replace("<scxml ", "<scxml " + " " * (limit - len(CART) + 1), 1).encode()
    assert limit < len(padded) < MAX_UPLOAD_BYTES
    answer = await site.upload(csrf, padded)
    assert answer.status_code == 413
    assert f"over the {limit} a chart may have" in answer.text
    huge = await site.upload(csrf, b" " * MAX_UPLOAD_BYTES + CART.encode())
    assert huge.status_code == 413
    assert f"over {MAX_UPLOAD_BYTES} bytes" in huge.text
    assert sum("a revision from ada" in r.getMessage() for r in caplog.records) == 2
    not_multipart = await site.client.post("/console/revisions", data={"csrf": csrf})
    assert not_multipart.status_code == 400
    assert "multipart/form-data" in not_multipart.text
    assert site.console.revisions.jobs() == []


@pytest.mark.asyncio
async def test_a_replay_that_fails_says_why_on_its_page_and_in_the_log(
    site: Site, caplog: pytest.LogCaptureFixture, tmp_path: Any
) -> None:
    absent = f"sqlite:///{tmp_path / 'absent.db'}"  # mode=ro does not create it
    site.console.revisions = Revisions(absent, TableOptions(prefix="t_"))
    csrf = await site.login()
    caplog.set_level(logging.ERROR, logger="statifier.console")
    answer = await site.upload(csrf, GUARD.encode())
    page = await site.finished(answer.headers["location"])
    assert 'id="job-state">failed<' in page
    error = page.split('id="job-error"', 1)[1].split("</p>", 1)[0]
    assert "OperationalError" in error
    assert any("shadow replay" in r.getMessage() and r.exc_info for r in caplog.records)


@pytest.mark.asyncio
async def test_jobs_beyond_the_bound_are_refused_and_finished_ones_expire(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    now = [0.0]
    console = console_of(router_db)
    await record(router_db, console)
    revisions = Revisions(
        router_db.store.url,
        router_db.store.tables.options,
        max_running=1,
        max_kept=2,
        ttl=60,
        clock=lambda: now[0],
    )
    revision = compile_chart(GUARD, name="cart")
    first = revisions.start("ada", revision, Selection())
    with pytest.raises(TooManyJobs):
        revisions.start("ada", revision, Selection())
    assert first.selection.limit == 5_000  # bounded however it was asked
    await revisions.wait(first)
    assert first.state is JobState.DONE
    assert first.summary is not None
    assert len(first.summary.results) == 3
    jobs = [first]
    for _ in range(2):
        jobs.append(revisions.start("ada", revision, Selection()))
        await revisions.wait(jobs[-1])
    # At most two kept: the oldest finished one went first.
    assert [job.id for job in revisions.jobs()] == [jobs[2].id, jobs[1].id]
    assert revisions.get(first.id) is None
    now[0] += 61
    assert revisions.jobs() == []


@pytest.mark.asyncio
async def test_the_job_page_expires_with_its_job(router_db: RouterDb) -> None:  # noqa: F811
    console = console_of(router_db, revision_ttl=0.2)
    await record(router_db, console)
    transport = httpx.ASGITransport(app=console_app(console))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        site = Site(router_db, console, client)
        csrf = await site.login()
        answer = await site.upload(csrf, GUARD.encode())
        await site.finished(answer.headers["location"])
        await asyncio.sleep(0.3)
        gone = await client.get(answer.headers["location"])
        assert gone.status_code == 404
        assert "expired" in gone.text


@pytest.mark.asyncio
async def test_a_running_replay_shows_its_progress_and_a_second_is_refused(
    pg_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    """PostgreSQL alone: a lock held on the executions table keeps the first replay
    running (SQLite's readers never wait for a writer)."""
    console = console_of(pg_db, revision_jobs=1)
    await record(pg_db, console)
    table = pg_db.store.tables.executions
    engine = sa.create_engine(migrations.sync_url(pg_db.store.url))
    transport = httpx.ASGITransport(app=console_app(console))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            site = Site(pg_db, console, client)
            csrf = await site.login()
            with engine.begin() as connection:
                where = f"{table.schema}.{table.name}" if table.schema else table.name
                connection.execute(sa.text(f"LOCK TABLE {where} IN ACCESS EXCLUSIVE MODE"))
                answer = await site.upload(csrf, GUARD.encode())
                path = answer.headers["location"]
                running = (await site.page(path)).text
                assert 'id="job-state">running<' in running
                assert 'data-poll="1000"' in running
                assert 'id="progress-text">0 of ? executions<' in running
                refused = await site.upload(csrf, GUARD.encode())
                assert refused.status_code == 429
                assert "replays are running" in refused.text
            page = await site.finished(path)
            assert 'id="progress-text">3 of 3 executions<' in page
    finally:
        engine.dispose()
        console.close()


@pytest.mark.asyncio
async def test_a_stopped_replay_ends_after_the_execution_it_is_on_and_says_so(
    pg_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    """PostgreSQL alone, as above: one job stopped on its own, then the console
    closed with another running."""
    console = console_of(pg_db)
    await record(pg_db, console)
    table = pg_db.store.tables.executions
    engine = sa.create_engine(migrations.sync_url(pg_db.store.url))
    revision = compile_chart(GUARD, name="cart")
    revisions = console.revisions
    where = f"{table.schema}.{table.name}"
    lock = sa.text(f"LOCK TABLE {where} IN ACCESS EXCLUSIVE MODE")
    try:
        with engine.begin() as connection:
            connection.execute(lock)
            stopped = revisions.start("ada", revision, Selection())
            await asyncio.sleep(0.2)  # its thread waits on the lock
            assert revisions.running == 1
            stopped.stop()
        await revisions.wait(stopped)  # the lock is gone: it replays one, then ends
        assert stopped.state is JobState.STOPPED
        assert (stopped.done, stopped.summary) == (0, None)
        with engine.begin() as connection:
            connection.execute(lock)
            closed = revisions.start("ada", revision, Selection())
            await asyncio.sleep(0.2)
            console.close()
            await revisions.wait(closed)
            assert closed.state is JobState.STOPPED
        assert stopped.error == closed.error == "the console stopped before the replay finished"
        assert revisions.running == 0
    finally:
        engine.dispose()
