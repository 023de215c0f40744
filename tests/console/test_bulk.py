"""Bulk actions on each database: a filter's executions previewed, then paused,
resumed or cancelled one by one, each with its audit row; a bulk cancel SIGKILLed
midway and run again: each execution cancelled once, with one row (2,000 executions in
the suite, 10,000 with ``BULK_CRASH_EXECUTIONS=10000``)."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from tests.child_processes import signal_child
from tests.persistence.conftest import (  # noqa: F401 - fixtures used by name
    fresh_database,
    postgresql_store,
    sqlite_store,
)
from tests.router.conftest import (  # noqa: F401 - fixtures used by name
    RouterDb,
    router_db,
    router_store,
)
from tests.router.racing_router import SCOPE, hit
from tests.router.test_races import COUNTER, counter_router

from statifier import telemetry
from statifier.api import Api, ApiToken, Rights
from statifier.buckets import bucket_of, outbox_bucket
from statifier.chart import compile_chart
from statifier.console.actions import Done
from statifier.console.app import Console
from statifier.console.audit import Audit
from statifier.console.auth import Operator, Operators, Role, Sessions
from statifier.console.bulk import (
    BULK_ACTIONS,
    BulkProgress,
    bulk_action,
    migration,
    preview,
    run_bulk,
    stored_migration,
)
from statifier.console.bulk_runs import STOPPED, BulkLog, BulkRuns, action_of, run_recorded
from statifier.console.queries import ConsoleQueries, ExecutionFilter
from statifier.persistence import ChartNotFound, DatabaseDown, Status
from statifier.router import Router
from statifier.sql import migrations

CANCELLER = Path(__file__).with_name("bulk_cancelling.py")
CRASH_EXECUTIONS = int(os.environ.get("BULK_CRASH_EXECUTIONS", "2000"))
"""How many executions the crash test cancels; BULK_CRASH_EXECUTIONS=10000 runs 10,000."""


async def _made(router: Router, count: int) -> list[str]:
    """``count`` counters of the race scope, one per key: their execution ids."""
    made: list[str] = []
    events = [hit(f"k{n}/0", f"k{n}") for n in range(count)]
    for start in range(0, count, 500):
        for answer in await router.route_many(events[start : start + 500]):
            (outcome,) = answer.outcomes  # type: ignore[union-attr]
            made.append(outcome.execution_id)  # type: ignore[union-attr,arg-type]
    return made


def _into(seen: list[BulkProgress]) -> Callable[[BulkProgress], Awaitable[None]]:
    async def told(progress: BulkProgress) -> None:
        seen.append(progress)

    return told


def _statuses(db: RouterDb) -> Counter[str]:
    engine = sa.create_engine(migrations.sync_url(db.store.url))
    executions = db.store.tables.executions
    try:
        with engine.connect() as connection:
            rows = connection.execute(sa.select(executions.c.status))
            return Counter(row.status for row in rows)
    finally:
        engine.dispose()


def _rows_per_target(db: RouterDb, action: str) -> Counter[str]:
    engine = sa.create_engine(migrations.sync_url(db.store.url))
    audit = db.store.tables.console_audit
    try:
        with engine.connect() as connection:
            rows = connection.execute(sa.select(audit.c.target).where(audit.c.action == action))
            return Counter(row.target for row in rows)
    finally:
        engine.dispose()


@pytest.mark.asyncio
async def test_a_filter_is_previewed_then_paused_resumed_and_cancelled_each_with_its_row(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    router = counter_router(router_db)
    made = await _made(router, 30)
    for execution_id in made[:5]:
        assert await router.pause(execution_id)
    adapter = router_db.adapter
    queries = ConsoleQueries(adapter.engine, adapter.tables)
    audit = Audit(adapter.engine, adapter.tables)
    everything = ExecutionFilter(scope=SCOPE)
    pause, resume, cancel = (BULK_ACTIONS[name] for name in ("pause", "resume", "cancel"))
    assert await preview(queries, pause, everything) == 25
    assert await preview(queries, resume, everything) == 5
    assert await preview(queries, cancel, everything) == 30
    assert await preview(queries, cancel, ExecutionFilter(key="k7")) == 1
    seen: list[BulkProgress] = []
    paused = await run_bulk(
        router, queries, audit, pause, everything, actor="ada", page=7, progress=_into(seen)
    )
    # The 5 paused before were never selected: not walked, not counted skipped.
    assert (paused.selected, paused.done, paused.skipped, paused.failed) == (25, 25, 0, 0)
    assert [p.seen for p in seen] == [7, 14, 21, 25]
    assert _statuses(router_db) == {"paused": 30}
    resumed = await run_bulk(router, queries, audit, resume, everything, actor="ada")
    assert (resumed.done, resumed.skipped) == (30, 0)
    one = await run_bulk(router, queries, audit, cancel, ExecutionFilter(key="k7"), actor="bo")
    assert (one.selected, one.done) == (1, 1)
    assert _statuses(router_db) == {"active": 29, "cancelled": 1}
    assert _rows_per_target(router_db, "pause") == Counter(dict.fromkeys(made[5:], 1))
    assert sum(_rows_per_target(router_db, "resume").values()) == 30
    assert _rows_per_target(router_db, "bulk") == {"pause": 1, "resume": 1, "cancel": 1}
    with pytest.raises(ValueError, match="unknown bulk action 'delete'"):
        bulk_action("delete")


def _sql(db: RouterDb, statement: sa.Executable) -> list[sa.Row[object]]:
    engine = sa.create_engine(migrations.sync_url(db.store.url))
    try:
        with engine.begin() as connection:
            result = connection.execute(statement)
            return list(result) if result.returns_rows else []
    finally:
        engine.dispose()


def _audit_rows(db: RouterDb, action: str) -> list[tuple[str, str]]:
    audit = db.store.tables.console_audit
    rows = _sql(db, sa.select(audit.c.target, audit.c.outcome).where(audit.c.action == action))
    return sorted((str(row.target), str(row.outcome)) for row in rows)


@pytest.mark.asyncio
async def test_a_bulk_retry_re_arms_the_dead_outbox_rows_of_each_execution_it_selects(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    router = counter_router(router_db)
    made = await _made(router, 6)
    outbox = router_db.store.tables.outbox
    now = datetime.now(UTC)
    rows = [  # (key, execution, dead): two dead rows of one, one of another, one pending
        ("a", made[0], True),
        ("b", made[0], True),
        ("c", made[1], True),
        ("d", made[2], False),
        ("e", None, True),  # a hand-off outside an execution: no filter selects it
    ]
    for key, execution_id, dead in rows:
        _sql(
            router_db,
            outbox.insert().values(
                queue="joined",
                key=key,
                payload={"event": "e"},
                execution_id=execution_id,
                bucket=outbox_bucket("joined", key)
                if execution_id is None
                else bucket_of(execution_id),
                attempts=8 if dead else 0,
                next_attempt_at=now,
                dead_at=now if dead else None,
                last_error="HTTP 500" if dead else None,
                inserted_at=now,
            ),
        )
    adapter = router_db.adapter
    queries = ConsoleQueries(adapter.engine, adapter.tables)
    audit = Audit(adapter.engine, adapter.tables)
    retry = BULK_ACTIONS["retry"]
    assert await preview(queries, retry, ExecutionFilter(scope=SCOPE)) == 2
    assert await preview(queries, retry, ExecutionFilter(key="k1")) == 1
    done = await run_bulk(router, queries, audit, retry, ExecutionFilter(scope=SCOPE), actor="ada")
    assert (done.selected, done.done, done.skipped, done.failed) == (
        2,
        2,
        0,
        0,
    )  # only the 2 selected are walked
    after = _sql(router_db, sa.select(outbox.c.key, outbox.c.dead_at, outbox.c.attempts))
    assert sorted((row.key, row.dead_at is None, row.attempts) for row in after) == [
        ("a", True, 0),
        ("b", True, 0),
        ("c", True, 0),
        ("d", True, 0),
        ("e", False, 8),
    ]
    assert _audit_rows(router_db, "retry") == sorted([(made[0], "done"), (made[1], "done")])
    again = await run_bulk(router, queries, audit, retry, ExecutionFilter(scope=SCOPE), actor="ada")
    assert (again.selected, again.done, again.skipped) == (0, 0, 0)


RENAMED = COUNTER.replace(b'"counting"', b'"tallying"')
"""A revision of the counter whose one state has another id: carried only with a map."""


@pytest.mark.asyncio
async def test_a_bulk_migrate_moves_each_execution_once_parks_what_cannot_move_and_keeps_pauses(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    router = counter_router(router_db)
    made = await _made(router, 10)
    cancel, pause = BULK_ACTIONS["cancel"], BULK_ACTIONS["pause"]
    adapter = router_db.adapter
    queries = ConsoleQueries(adapter.engine, adapter.tables)
    audit = Audit(adapter.engine, adapter.tables)
    for key in ("k0", "k1"):
        await run_bulk(router, queries, audit, cancel, ExecutionFilter(key=key), actor="ada")
    await run_bulk(router, queries, audit, pause, ExecutionFilter(key="k2"), actor="ada")
    everything = ExecutionFilter(scope=SCOPE)

    renamed = migration(compile_chart(RENAMED))
    assert await preview(queries, renamed, everything) == 8  # the two cancelled are not
    parked = await run_bulk(router, queries, audit, renamed, everything, actor="ada")
    # The two cancelled were not selected: not walked, not counted skipped.
    assert (parked.done, parked.parked, parked.skipped, parked.failed) == (0, 8, 0, 0)
    assert _statuses(router_db) == {"needs_migration": 7, "paused": 1, "cancelled": 2}
    assert _audit_rows(router_db, "migrate") == sorted((i, "parked") for i in made[2:])

    mapped = migration(compile_chart(RENAMED), state_map={"counting": "tallying"})
    moved = await run_bulk(router, queries, audit, mapped, everything, actor="bo")
    assert (moved.done, moved.parked, moved.skipped) == (8, 0, 0)
    assert _statuses(router_db) == {"active": 7, "paused": 1, "cancelled": 2}
    executions = router_db.store.tables.executions
    hashes = _sql(router_db, sa.select(executions.c.execution_id, executions.c.content_hash))
    target = mapped.revision
    assert {row.execution_id for row in hashes if row.content_hash == target} == set(made[2:])
    assert await preview(queries, mapped, everything) == 0
    again = await run_bulk(router, queries, audit, mapped, everything, actor="bo")
    assert (again.done, again.skipped) == (0, 0)  # nothing selected, nothing walked
    assert Counter(target for target, _ in _audit_rows(router_db, "migrate")) == Counter(
        dict.fromkeys(made[2:], 2)
    )

    # A migration selects the executions of its revision's chart name alone.
    named = migration(compile_chart(RENAMED, name="counter"))
    assert named.narrowed(everything) == ExecutionFilter(scope=SCOPE, document="counter")
    assert named.narrowed(ExecutionFilter(document="other")) is None
    assert await preview(queries, named, ExecutionFilter(document="other")) == 0
    assert BULK_ACTIONS["cancel"].narrowed(everything) == everything

    # What a stored revision is, a bulk migrate finds by its hash; the moved ones step on.
    stored = await stored_migration(router, str(target))
    assert (stored.revision, stored.name) == (target, "migrate")
    with pytest.raises(ChartNotFound):
        await stored_migration(router, "0" * 64)
    revisions = await queries.revisions()
    assert target in {revision.content_hash for revision in revisions}
    resumed = await router.resume(made[2])
    assert resumed is not None
    record = await router.storage.find_execution(made[2])
    assert record is not None
    assert (record.status, record.content_hash) == (Status.ACTIVE, target)


@pytest.mark.asyncio
async def test_a_recorded_run_keeps_its_row_in_step_and_is_made_again_from_it(
    router_db: RouterDb,  # noqa: F811 - the fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="statifier.console")
    router = counter_router(router_db)
    made = await _made(router, 12)
    adapter = router_db.adapter
    queries = ConsoleQueries(adapter.engine, adapter.tables)
    audit = Audit(adapter.engine, adapter.tables)
    log = BulkLog(adapter.engine, adapter.tables)
    where = ExecutionFilter(scope=SCOPE, metadata={})
    mapped = migration(compile_chart(RENAMED), state_map={"counting": "tallying"}, data={"n": 0})
    now = router.storage.clock()
    await log.start("r1", mapped, where, actor="ada", selected=12, now=now)
    seen: list[BulkProgress] = []
    reported: list[tuple[Mapping[str, float], Mapping[str, object]]] = []
    telemetry.attach(
        "bulk-test", "statifier.console.bulk_run", lambda _, m, d: reported.append((m, d))
    )
    try:
        done = await run_recorded(
            router,
            queries,
            audit,
            log,
            "r1",
            mapped,
            where,
            actor="ada",
            selected=12,
            progress=_into(seen),
        )
    finally:
        telemetry.detach("bulk-test")
    assert (done.done, done.skipped) == (12, 0)
    ((measured, said),) = reported
    assert (measured["selected"], measured["done"], measured["failed"]) == (12, 12, 0)
    assert said == {
        "action": "migrate",
        "run_id": "r1",
        "actor": "ada",
        "outcome": "finished",
        "error": None,
    }
    row = await log.get("r1")
    assert row is not None
    assert (row.action, row.revision, dict(row.state_map), dict(row.data)) == (
        "migrate",
        mapped.revision,
        {"counting": "tallying"},
        {"n": 0},
    )
    assert (row.progress, row.finished, row.error) == (done, True, None)
    assert row.where == where
    again = await action_of(router, row)
    assert (again.name, again.revision, again.state_map) == (
        "migrate",
        mapped.revision,
        {"counting": "tallying"},
    )
    assert [run.run_id for run in await log.latest()] == ["r1"]
    assert await log.get("nope") is None

    # A run cancelled midway (its server stopping) says so in its row.
    runs = BulkRuns(router, queries, audit, log)
    run_id = await runs.start(BULK_ACTIONS["pause"], where, actor="bo", selected=12)
    assert runs.running(run_id)
    await runs.close()
    stopped = await log.get(run_id)
    assert stopped is not None
    assert runs.state(stopped) == "stopped"  # cancelled before it came to any execution
    assert stopped.error is not None
    assert stopped.error.startswith("stopped:")
    assert not runs.running(run_id)
    assert len(made) == 12
    # Each run's start and end is a line of the log, with its counts.
    assert [r.getMessage() for r in caplog.records if "bulk" in r.getMessage()] == [
        "console: bulk migrate run r1 by ada finished: 12 done, 0 skipped, 0 failed",
        f"console: bulk pause run {run_id} by bo started: 12 selected",
        f"console: bulk pause run {run_id} by bo stopped: 0 done, 0 skipped, 0 failed ({STOPPED})",
    ]


@pytest.mark.asyncio
async def test_a_bulk_cancel_killed_midway_and_run_again_cancels_each_once(
    router_db: RouterDb,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    router = counter_router(router_db)
    made = await _made(router, CRASH_EXECUTIONS)
    chart = tmp_path / "counter.scxml"
    chart.write_bytes(COUNTER)
    options = router_db.store.tables.options

    async def run(kill_after_pages: int | None, again: str | None = None) -> tuple[int, str]:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(CANCELLER),
            router_db.store.url,
            options.prefix,
            options.schema or "-",
            str(chart),
            *([again] if again else []),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert process.stdout is not None
        assert await asyncio.wait_for(process.stdout.readline(), 60) == b"ready\n"
        started = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
        assert started.startswith("run "), started
        pages = 0
        while kill_after_pages is not None:
            line = await asyncio.wait_for(process.stdout.readline(), 300)
            assert line.startswith(b"page "), line
            pages += 1
            if pages == kill_after_pages:
                await asyncio.sleep(random.Random(pages).uniform(0.0, 0.3))  # inside a page
                signal_child(process, signal.SIGKILL)
                break
        code = await asyncio.wait_for(process.wait(), 600)
        if code != -signal.SIGKILL:
            assert code == 0, (await process.stderr.read()).decode()  # type: ignore[union-attr]
        return code, started.split()[1]

    code, killed = await run(kill_after_pages=3)
    assert code == -signal.SIGKILL
    midway = _statuses(router_db)
    assert 0 < midway["cancelled"] < CRASH_EXECUTIONS, midway
    rows = _rows_per_target(router_db, "cancel")
    assert set(rows.values()) == {1}  # what was done has its one row
    assert len(rows) == midway["cancelled"]
    log = BulkLog(router_db.adapter.engine, router_db.adapter.tables)
    interrupted = await log.get(killed)
    assert interrupted is not None
    assert interrupted.finished_at is None  # no end: the row says it was cut short
    assert 0 < interrupted.progress.done <= midway["cancelled"]  # as of its last page
    # Run again from its row, in another process: the rest is done, nothing twice.
    code, finished = await run(kill_after_pages=None, again=killed)
    assert code == 0
    ended = await log.get(finished)
    assert ended is not None
    assert (ended.finished, ended.error, ended.progress.done) == (
        True,
        None,
        CRASH_EXECUTIONS - midway["cancelled"],
    )
    assert _statuses(router_db) == {"cancelled": CRASH_EXECUTIONS}
    assert _rows_per_target(router_db, "cancel") == Counter(dict.fromkeys(made, 1))
    assert _rows_per_target(router_db, "bulk") == {"cancel": 1}  # the run that finished
    print(f"{midway['cancelled']} of {CRASH_EXECUTIONS} cancelled when killed; the rest after")


@pytest.mark.asyncio
async def test_a_bulk_run_lets_the_event_loop_run_and_is_cancelled_midway(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    router = counter_router(router_db)
    await _made(router, 50)
    adapter = router_db.adapter
    queries = ConsoleQueries(adapter.engine, adapter.tables)
    audit = Audit(adapter.engine, adapter.tables)
    ticks = 0

    async def ticking() -> None:  # another task of the server: it must get turns
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    beside = asyncio.create_task(ticking())
    run = asyncio.create_task(
        run_bulk(
            router,
            queries,
            audit,
            BULK_ACTIONS["pause"],
            ExecutionFilter(scope=SCOPE),
            actor="ada",
            page=10,
        )
    )
    while _statuses(router_db)["paused"] < 5 and not run.done():  # noqa: ASYNC110 - polled
        await asyncio.sleep(0)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    beside.cancel()
    assert ticks > 5  # the loop ran other tasks while the run went
    assert 0 < _statuses(router_db)["paused"] < 50  # stopped midway, not run to its end


@pytest.mark.asyncio
async def test_a_run_stopped_midway_records_what_it_did_but_the_one_in_flight(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    # Its counts were written once a page: a run stopped before the end of its page
    # recorded the page before's, short of what it had done by up to a page. Now the
    # execution being acted on when the stop came (its commit under way) at most.
    router = counter_router(router_db)
    await _made(router, 50)
    adapter = router_db.adapter
    queries = ConsoleQueries(adapter.engine, adapter.tables)
    audit = Audit(adapter.engine, adapter.tables)
    log = BulkLog(adapter.engine, adapter.tables)
    runs = BulkRuns(router, queries, audit, log)
    where = ExecutionFilter(scope=SCOPE)
    run_id = await runs.start(BULK_ACTIONS["pause"], where, actor="bo", selected=50)
    async with asyncio.timeout(30):
        while _statuses(router_db).get("paused", 0) < 5:  # noqa: ASYNC110 - polled
            await asyncio.sleep(0)
    await runs.close()
    stopped = await log.get(run_id)
    assert stopped is not None
    assert runs.state(stopped) == "stopped"
    paused = _statuses(router_db).get("paused", 0)
    assert 5 <= paused < 50  # within its first page of 200
    assert paused - 1 <= stopped.progress.done <= paused


@pytest.mark.asyncio
async def test_a_database_that_does_not_answer_stops_the_run_not_each_execution(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    # Counted failed one by one, each after its wait for a connection, a page of 200
    # would take minutes and log 200 errors for one outage.
    router = counter_router(router_db)
    await _made(router, 10)
    adapter = router_db.adapter
    queries = ConsoleQueries(adapter.engine, adapter.tables)
    audit = Audit(adapter.engine, adapter.tables)
    tried: list[str] = []

    async def act(router: Router, execution_id: str, **_: object) -> Done:
        tried.append(execution_id)
        raise DatabaseDown("no connection within 5 s: the server does not answer")

    down = replace(BULK_ACTIONS["pause"], act=act)
    with pytest.raises(DatabaseDown):
        await run_bulk(router, queries, audit, down, ExecutionFilter(scope=SCOPE), actor="ada")
    assert len(tried) == 1
    assert _statuses(router_db) == {"active": 10}
    # The run's own row says it stopped and why (it was missing: only a run that
    # reached its end wrote one).
    ((target, outcome),) = _audit_rows(router_db, "bulk")
    assert (target, outcome) == ("pause", "stopped")
    audit_table = router_db.store.tables.console_audit
    (detail,) = _sql(
        router_db, sa.select(audit_table.c.detail).where(audit_table.c.action == "bulk")
    )
    assert "stopped (DatabaseDown: no connection within 5 s" in detail.detail


@pytest.mark.asyncio
async def test_a_cancelled_run_writes_its_row_saying_so(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    # A server stopping or Ctrl-C cancels the run between two executions: what was
    # done has its rows, and the run its own, outcome stopped, with its counts.
    router = counter_router(router_db)
    await _made(router, 5)
    adapter = router_db.adapter
    queries = ConsoleQueries(adapter.engine, adapter.tables)
    audit = Audit(adapter.engine, adapter.tables)
    pause = BULK_ACTIONS["pause"]
    second = asyncio.Event()

    async def act(router: Router, execution_id: str, **given: Any) -> Done:
        if len(_audit_rows(router_db, "pause")) == 2:
            second.set()
            await asyncio.Event().wait()  # held until cancelled
        return await pause.act(router, execution_id, **given)

    where = ExecutionFilter(scope=SCOPE)
    run = asyncio.create_task(
        run_bulk(router, queries, audit, replace(pause, act=act), where, actor="ada")
    )
    async with asyncio.timeout(30):
        await second.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert len(_audit_rows(router_db, "pause")) == 2
    assert _audit_rows(router_db, "bulk") == [("pause", "stopped")]
    audit_table = router_db.store.tables.console_audit
    (row,) = _sql(router_db, sa.select(audit_table.c.detail).where(audit_table.c.action == "bulk"))
    assert row.detail == (
        "bulk pause of 5 selected: 2 done, 0 skipped, 0 failed; stopped (cancelled) before the rest"
    )


@pytest.mark.asyncio
async def test_a_console_and_an_api_over_the_same_stores_see_each_others_runs_going(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    # A server's console and API each had stores of their own: a run the API started
    # read as "unfinished" on the console (interrupted: run it again) while it ran,
    # and the console's on the API. The service hands the API the console's stores.
    router = counter_router(router_db)
    await _made(router, 1000)
    operators = Operators([Operator("ada", "ada-token-0123456789abcdef", Role.OPERATOR)])
    console = Console.of(router, Sessions(operators, key=b"k" * 32))
    token = "ops-token-0123456789abcdef"
    with pytest.raises(ValueError, match="not the router's"):
        Api(counter_router(router_db), tokens=[ApiToken("ops", token, ("*",), Rights.WRITE)],
            stores=console.stores)  # fmt: skip
    api = Api(router, tokens=[ApiToken("ops", token, ("*",), Rights.WRITE)], stores=console.stores)
    headers = {"Authorization": f"Bearer {token}"}
    transport = httpx.ASGITransport(app=api.app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            body = {"action": "pause", "filter": {"scope": SCOPE}}
            preview = await client.post("/bulk", json=body, headers=headers)
            assert preview.json()["selected"] == 1000, preview.text
            started = await client.post("/bulk", json={**body, "confirm": 1000}, headers=headers)
            assert started.status_code == 202, started.text
            job = started.json()["job"]
            # A thousand pauses take longer than this turn of the loop.
            assert console.bulk_runs.running(job)
            run = await console.bulk_runs.log.get(job)
            assert run is not None
            assert console.bulk_runs.state(run) == "running"
            async with asyncio.timeout(60):
                while (await client.get(f"/bulk/{job}", headers=headers)).json()[  # noqa: ASYNC110 - polled
                    "state"
                ] == "running":
                    await asyncio.sleep(0.05)
            assert (await client.get(f"/bulk/{job}", headers=headers)).json()["done"] == 1000
    finally:
        await api.close()
        console.close()
