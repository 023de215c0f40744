"""A router transaction that loses a conflict is run again from its start
(:func:`statifier.router.transaction.retried`), on PostgreSQL: a serialization failure
(SQLSTATE 40001) or a deadlock (40P01) rolls the attempt back and runs it again, a
bounded number of times; what the attempt wrote is undone with it, so the committed
attempt's delivery is the only one. Any other error, a caller's transaction and SQLite
are attempted once.

The conflicts are the server's own: a hook runs ``RAISE EXCEPTION ... USING ERRCODE``
on the transaction's connection, so the error reaches the router through the driver as
a real conflict does."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
import pytest_asyncio
import sqlalchemy as sa
from tests.persistence.conftest import SqlStore
from tests.router.conftest import Clock, RouterDb

from statifier import telemetry
from statifier.chart import Machine, compile_chart
from statifier.core import Event
from statifier.persistence import Discarded, Executions, Stepped
from statifier.persistence.sql import SqlAdapter, SqlTransaction
from statifier.router import (
    Binding,
    CreatedAndDelivered,
    Dedupe,
    Entry,
    Failed,
    InboundEvent,
    Mode,
    Routed,
    Router,
    StaticResolver,
    address,
    ledger,
)
from statifier.router.flow_worker import FlowWorker
from statifier.router.routes import IdempotencyKey
from statifier.router.timer_queue import TimerEntry, TimerKind
from statifier.router.timer_worker import TimerWorker
from statifier.router.transaction import Delivering
from statifier.sql import migrations

SCOPE = "tenant_a"

COUNTER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="open">
  <datamodel><data id="ticks" expr="0"/></datamodel>
  <state id="open">
    <transition event="tick" target="open">
      <assign location="ticks" expr="ticks + 1"/>
    </transition>
  </state>
</scxml>"""
"""Counts every tick: its datamodel says how many steps committed."""

TICKS = Binding(
    id="ticks",
    source="meter",
    match="true",
    key="event.meter",
    document="counter",
    event="tick",
    dedupe=Dedupe(timedelta(minutes=10)),
)

_CHART: list[Machine] = []


def counter() -> Machine:
    if not _CHART:
        _CHART.append(compile_chart(COUNTER))
    return _CHART[0]


def tick(message_id: str, meter: str) -> InboundEvent:
    return InboundEvent(scope=SCOPE, source="meter", message_id=message_id, data={"meter": meter})


def raise_sqlstate(sqlstate: str) -> str:
    """A statement after which the server answers ``sqlstate``, as it does a conflict."""
    return f"DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '{sqlstate}'; END $$"


@dataclass
class Conflicts:
    """Hooks that make the server fail a transaction on their first ``times`` calls:
    ``on_step`` after the step wrote (the delivery's claim, address, execution and
    input are in the transaction by then), ``on_begin`` before anything of the
    delivery. ``error``, when given, is raised instead (an error of the host's)."""

    sqlstate: str = "40001"
    times: int = 2
    error: Exception | None = None
    steps: int = 0
    begins: int = 0

    async def _fail(self, tx: SqlTransaction) -> None:
        if self.error is not None:
            raise self.error
        await tx.driver.execute(raise_sqlstate(self.sqlstate))

    async def on_begin(self, tx: SqlTransaction, scope: str, entry: Entry) -> None:
        self.begins += 1
        if self.begins <= self.times:
            await self._fail(tx)

    async def on_step(
        self, executions: Executions, execution_id: str, machine: Machine | None, event: Event
    ) -> Stepped | Discarded:
        stepped = await executions.step(execution_id, machine, event)
        self.steps += 1
        if self.steps <= self.times:
            # The storage is bound to the delivery's transaction: this is a part of it.
            bound = executions.storage.adapter
            assert isinstance(bound, SqlAdapter)
            async with bound.transaction() as tx:
                await self._fail(tx)
        return stepped


def router_with(db: RouterDb, conflicts: Conflicts, *, hook: str, **options: Any) -> Router:
    """A counter router whose ``hook`` (``on_begin`` or ``on_step``) fails as
    ``conflicts`` says."""
    if hook == "on_step":
        options.update(on_step=conflicts.on_step)
    else:
        options.update(on_begin=conflicts.on_begin)
    return db.router([TICKS], resolver=StaticResolver({"counter": counter()}), **options)


def table_rows(db: RouterDb, name: str) -> int:
    """How many rows one of the database's tables holds (read on its own connection)."""
    table: sa.Table = getattr(db.store.tables, name)
    engine = sa.create_engine(migrations.sync_url(db.store.url))
    try:
        with engine.connect() as connection:
            return len(connection.execute(sa.select(table)).all())
    finally:
        engine.dispose()


def counts(db: RouterDb) -> dict[str, int]:
    names = ("routing_ledger", "addresses", "dedupe", "executions", "inputs")
    return {name: table_rows(db, name) for name in names}


async def ticks_of(router: Router, meter: str) -> tuple[int, int]:
    """The meter's execution's tick count and the length of its input log."""
    found = await address(router, SCOPE, "counter", meter)
    assert found is not None
    record = await router.adapter.fetch_execution(found.execution_id)
    assert record is not None
    ticks = router.storage.load(record, counter()).datamodel["ticks"]
    assert isinstance(ticks, int)
    inputs = await Executions(router.storage).inputs(found.execution_id)
    return ticks, len(inputs)


@pytest.fixture
def retries(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING, logger="statifier.router.transaction")
    return caplog


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "statifier.router.transaction"
    ]


# --- one delivery ----------------------------------------------------------------------


@pytest.mark.parametrize("sqlstate", ["40001", "40P01"], ids=["serialization", "deadlock"])
@pytest.mark.asyncio
async def test_a_delivery_that_loses_a_conflict_twice_is_stepped_once(
    pg_db: RouterDb, sqlstate: str, retries: pytest.LogCaptureFixture
) -> None:
    """The first two attempts step the execution and then fail: both are rolled back,
    and the third's step is the only one (one tick, one input, one claim, one ledger
    row)."""
    conflicts = Conflicts(sqlstate, times=2)
    router = router_with(pg_db, conflicts, hook="on_step")
    routed = await router.route(tick("m1", "meter_1"))
    assert conflicts.steps == 3
    (outcome,) = routed.outcomes
    assert isinstance(outcome, CreatedAndDelivered)
    assert await ticks_of(router, "meter_1") == (1, 1)
    assert counts(pg_db) == {
        "routing_ledger": 1,
        "addresses": 1,
        "dedupe": 1,
        "executions": 1,
        "inputs": 1,
    }
    (row,) = await ledger(router)
    assert (row.message_id, row.execution_id) == ("m1", outcome.execution_id)
    logged = said(retries)
    assert len(logged) == 2
    assert f"SQLSTATE {sqlstate} on attempt 1 of 5" in logged[0]
    assert f"SQLSTATE {sqlstate} on attempt 2 of 5" in logged[1]
    # The execution exists now: a second event steps it once more, retried again.
    conflicts.steps, conflicts.times = 0, 1
    await router.route(tick("m2", "meter_1"))
    assert conflicts.steps == 2
    assert await ticks_of(router, "meter_1") == (2, 2)


@pytest.mark.asyncio
async def test_after_the_last_attempt_the_error_is_raised_and_nothing_was_written(
    pg_db: RouterDb,
) -> None:
    conflicts = Conflicts("40001", times=99)
    router = router_with(pg_db, conflicts, hook="on_step", transaction_attempts=3)
    with pytest.raises(psycopg.errors.SerializationFailure):
        await router.route(tick("m1", "meter_1"))
    assert conflicts.steps == 3
    assert counts(pg_db) == dict.fromkeys(counts(pg_db), 0)


@pytest.mark.asyncio
async def test_one_attempt_runs_nothing_again(pg_db: RouterDb) -> None:
    conflicts = Conflicts("40001", times=1)
    router = router_with(pg_db, conflicts, hook="on_step", transaction_attempts=1)
    with pytest.raises(psycopg.errors.SerializationFailure):
        await router.route(tick("m1", "meter_1"))
    assert conflicts.steps == 1


@pytest.mark.parametrize(
    "error",
    [None, RuntimeError("the host's own failure")],
    ids=["unique_violation", "python_error"],
)
@pytest.mark.asyncio
async def test_an_error_that_is_no_conflict_is_attempted_once(
    pg_db: RouterDb, error: Exception | None, retries: pytest.LogCaptureFixture
) -> None:
    conflicts = Conflicts("23505", times=1, error=error)
    router = router_with(pg_db, conflicts, hook="on_step")
    expected = psycopg.errors.UniqueViolation if error is None else RuntimeError
    with pytest.raises(expected):
        await router.route(tick("m1", "meter_1"))
    assert conflicts.steps == 1
    assert counts(pg_db) == dict.fromkeys(counts(pg_db), 0)
    assert said(retries) == []


@pytest.mark.asyncio
async def test_a_conflict_in_on_begin_is_retried_and_on_begin_runs_again(
    pg_db: RouterDb,
) -> None:
    """``on_begin`` runs first in every attempt: a host hook acts again on a retry."""
    conflicts = Conflicts("40001", times=2)
    router = router_with(pg_db, conflicts, hook="on_begin")
    await router.route(tick("m1", "meter_1"))
    assert conflicts.begins == 3
    assert await ticks_of(router, "meter_1") == (1, 1)


# --- a caller's transaction -----------------------------------------------------------


@pytest.mark.asyncio
async def test_in_a_callers_transaction_nothing_is_retried(pg_db: RouterDb) -> None:
    """The transaction is the caller's: the conflict is raised to it at once, and the
    caller rolls back."""
    conflicts = Conflicts("40001", times=1)
    router = router_with(pg_db, conflicts, hook="on_step")
    engine = router.adapter.engine
    assert not isinstance(engine, sa.Engine)
    async with engine.connect() as connection:
        await connection.begin()
        with pytest.raises(psycopg.errors.SerializationFailure):
            await router.route(tick("m1", "meter_1"), connection=connection)
        await connection.rollback()
    assert conflicts.steps == 1
    assert counts(pg_db) == dict.fromkeys(counts(pg_db), 0)


@pytest.mark.asyncio
async def test_in_transaction_answers_the_committed_attempts_result(pg_db: RouterDb) -> None:
    """``Router.in_transaction`` itself: every attempt runs the work anew; the answer is
    the last one's. Given a connection, the work runs once."""
    router = pg_db.router([TICKS], resolver=StaticResolver({"counter": counter()}))
    attempts: list[int] = []

    async def work(unit: Any) -> int:
        attempts.append(len(attempts) + 1)
        if len(attempts) < 3:
            await unit.tx.driver.execute(raise_sqlstate("40P01"))
        return attempts[-1]

    assert await router.in_transaction(work) == 3
    attempts.clear()
    engine = router.adapter.engine
    assert not isinstance(engine, sa.Engine)
    async with engine.connect() as connection:
        await connection.begin()
        with pytest.raises(psycopg.errors.DeadlockDetected):
            await router.in_transaction(work, connection=connection)
        await connection.rollback()
    assert attempts == [1]


# --- a batch ---------------------------------------------------------------------------


@pytest.mark.parametrize("hook", ["on_step", "on_begin"], ids=["at_once", "one_by_one"])
@pytest.mark.asyncio
async def test_a_batch_whose_first_attempt_fails_answers_and_steps_each_event_once(
    pg_db: RouterDb, hook: str, retries: pytest.LogCaptureFixture
) -> None:
    """Without ``on_begin`` the batch settles at once, with it one event at a time at
    savepoints; either way the conflict (the first event's, in the first attempt) runs
    the whole batch again, and each event's answer is the committed attempt's."""
    conflicts = Conflicts("40001", times=1)
    router = router_with(pg_db, conflicts, hook=hook)
    events = [tick("m1", "meter_1"), tick("m2", "meter_2"), tick("m3", "meter_1")]
    answers = await router.route_many(events)
    assert [type(answer) for answer in answers] == [Routed, Routed, Routed]
    assert [answer.event.message_id for answer in answers] == ["m1", "m2", "m3"]
    assert [
        [o.outcome for o in answer.outcomes] for answer in answers if isinstance(answer, Routed)
    ] == [
        ["created_and_delivered"],
        ["created_and_delivered"],
        ["delivered"],
    ]
    assert await ticks_of(router, "meter_1") == (2, 2)
    assert await ticks_of(router, "meter_2") == (1, 1)
    assert counts(pg_db) == {
        "routing_ledger": 3,
        "addresses": 2,
        "dedupe": 3,
        "executions": 2,
        "inputs": 3,
    }
    assert [row.message_id for row in await ledger(router)] == ["m1", "m2", "m3"]
    # The whole batch was run again, not settled again one event at a time.
    (logged,) = said(retries)
    assert "SQLSTATE 40001 on attempt 1 of 5" in logged


@pytest.mark.asyncio
async def test_a_batch_out_of_attempts_answers_its_events_failed_as_before(
    pg_db: RouterDb,
) -> None:
    """On the last attempt a conflict is answered as any failure is: the event whose
    delivery raised is :class:`Failed`, alone, and the others commit."""
    conflicts = Conflicts("40001", times=3)
    router = router_with(pg_db, conflicts, hook="on_begin", transaction_attempts=2)
    answers = await router.route_many([tick("m1", "meter_1"), tick("m2", "meter_2")])
    # Attempt 1: m1's on_begin fails, the batch is run again. Attempt 2 (the last):
    # m1's fails again and is its answer; m2's third call fails too.
    assert [type(answer) for answer in answers] == [Failed, Failed]
    failed = answers[0]
    assert isinstance(failed, Failed)
    assert isinstance(failed.error, psycopg.errors.SerializationFailure)
    assert counts(pg_db) == dict.fromkeys(counts(pg_db), 0)
    conflicts.begins, conflicts.times = 0, 0
    answers = await router.route_many([tick("m1", "meter_1"), tick("m2", "meter_2")])
    assert [type(answer) for answer in answers] == [Routed, Routed]


# --- a timer fire ------------------------------------------------------------------------


@pytest_asyncio.fixture
async def timer_reports() -> AsyncIterator[list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []
    telemetry.attach(
        "serialization-retry", "statifier.router.timer", lambda _, m, meta: seen.append(dict(meta))
    )
    try:
        yield seen
    finally:
        telemetry.detach("serialization-retry")


def timer(execution_id: str, n: int, due_at: datetime, scope: str | None = None) -> TimerEntry:
    """Timer ``n`` of ``execution_id``, a tick, fired under ``scope``."""
    key = IdempotencyKey(
        execution_id,
        send_id=f"t{n}",
        macrostep=n,
        microstep=1,
        round=0,
        content_index=0,
        ordinal=0,
    )
    return TimerEntry(
        execution_id=execution_id,
        send_id=f"t{n}",
        key=key,
        due_at=due_at,
        step_position=0,
        kind=TimerKind.EXTERNAL,
        event=Event("tick"),
        scope=scope,
    )


async def with_timers(router: Router, *timers: TimerEntry) -> None:
    """Create each timer's execution (a counter), then schedule the timers in order."""
    queue = router.timers
    assert queue is not None
    now = router.storage.clock()
    async with router.transaction() as unit:
        executions = unit.executions(Delivering(None, now))
        for execution_id in dict.fromkeys(one.execution_id for one in timers):
            await executions.create(execution_id, counter())
    async with router.transaction() as unit:
        for one in timers:
            await queue.schedule(unit.tx, one)


async def ticked(router: Router, execution_id: str) -> tuple[int, int]:
    """The execution's tick count and the length of its input log."""
    record = await router.adapter.fetch_execution(execution_id)
    assert record is not None
    ticks = router.storage.load(record, counter()).datamodel["ticks"]
    assert isinstance(ticks, int)
    return ticks, len(await Executions(router.storage).inputs(execution_id))


@pytest.mark.asyncio
async def test_a_timer_fire_that_loses_a_conflict_fires_once(
    pg_db: RouterDb, timer_reports: list[dict[str, Any]]
) -> None:
    """The batch at once takes the row, then the fire's ``on_begin`` conflicts twice:
    both attempts are rolled back (the row put back), the third fires it, and only its
    fire is reported."""
    conflicts = Conflicts("40001", times=2)
    router = router_with(pg_db, conflicts, hook="on_begin", timers_elsewhere=True)
    now = pg_db.clock.now
    await with_timers(router, timer("ex_1", 1, now))
    worker = TimerWorker(router)
    assert await worker.fire_due(now) == 1
    assert conflicts.begins == 3
    assert await ticked(router, "ex_1") == (1, 1)
    assert [report["outcome"] for report in timer_reports] == ["fired"]
    assert await worker.next_due() is None


@pytest.mark.asyncio
async def test_timers_fired_one_by_one_are_fired_and_reported_once_after_a_conflict(
    pg_db: RouterDb, timer_reports: list[dict[str, Any]]
) -> None:
    """A fire that raises sends its batch one by one; there the first fire conflicts,
    and the one-by-one transaction is run again whole: each timer fires (or fails)
    once, and each is reported once."""
    begun: list[str] = []

    async def on_begin(tx: SqlTransaction, scope: str, entry: Entry) -> None:
        begun.append(scope)
        if scope == "bad" and begun.count("bad") <= 2:
            raise RuntimeError("the bad tenant is refused")  # at once, then one by one
        if scope == "" and begun.count("") == 2:
            # The first fire one by one, in the first attempt.
            await tx.driver.execute(raise_sqlstate("40001"))

    router = pg_db.router(
        [TICKS],
        resolver=StaticResolver({"counter": counter()}),
        on_begin=on_begin,
        timers_elsewhere=True,
    )
    now = pg_db.clock.now
    await with_timers(router, timer("ex_1", 1, now), timer("ex_bad", 2, now, "bad"))
    await with_timers(router, timer("ex_2", 3, now))
    worker = TimerWorker(router, retry=10.0)
    assert await worker.fire_due(now) == 2
    # at once: ex_1, bad (refused); one by one: ex_1 (conflict); run again: ex_1, bad
    # (refused), bad (its retry's scope), ex_2.
    assert begun == ["", "bad", "", "", "bad", "bad", ""]
    assert await ticked(router, "ex_1") == (1, 1)
    assert await ticked(router, "ex_2") == (1, 1)
    assert await ticked(router, "ex_bad") == (0, 0)
    assert [(report["execution_id"], report["outcome"]) for report in timer_reports] == [
        ("ex_1", "fired"),
        ("ex_bad", "failed"),
        ("ex_2", "fired"),
    ]
    assert await worker.next_due() == now + timedelta(seconds=10)


# --- a flush of a debounce binding ------------------------------------------------------


@pytest.mark.asyncio
async def test_a_flush_that_loses_a_conflict_delivers_once(pg_db: RouterDb) -> None:
    """The flow worker's flush conflicts twice after its ``on_begin``: the held events
    are delivered once, by the third attempt, and reported once without an error."""
    flows: list[str] = []

    async def on_begin(tx: SqlTransaction, scope: str, entry: Entry) -> None:
        if entry is Entry.FLOW:
            flows.append(scope)
            if len(flows) <= 2:
                await tx.driver.execute(raise_sqlstate("40001"))

    debounced = replace(TICKS, mode=Mode.DEBOUNCE, window=timedelta(seconds=30))
    router = pg_db.router(
        [debounced], resolver=StaticResolver({"counter": counter()}), on_begin=on_begin
    )
    now = pg_db.clock.now
    for n in range(3):
        routed = await router.route(tick(f"m{n}", "meter_1"), now=now)
        assert [outcome.outcome for outcome in routed.outcomes] == ["buffered"]
    flushed = await FlowWorker(router).flush_due(now=now + timedelta(seconds=30))
    assert [(made.key, made.delivered, made.error) for made in flushed] == [("meter_1", 3, None)]
    assert flows == [SCOPE] * 3
    assert await ticks_of(router, "meter_1") == (1, 1)
    assert [row.outcome for row in await ledger(router)] == [
        "buffered",
        "buffered",
        "buffered",
        "created_and_delivered",
    ]


# --- SQLite --------------------------------------------------------------------------------


@pytest_asyncio.fixture
async def sqlite_db(sqlite_store: SqlStore) -> AsyncIterator[RouterDb]:
    sqlite_store.empty()
    adapter = SqlAdapter(sqlite_store.url, sqlite_store.tables)
    try:
        yield RouterDb("sqlite", sqlite_store, adapter, Clock())
    finally:
        await adapter.close()


class ConflictError(Exception):
    """An error that says SQLSTATE 40001, as a driver's would: SQLite never raises one,
    so here it can only come from the host."""

    sqlstate = "40001"


@pytest.mark.asyncio
async def test_on_sqlite_nothing_is_retried(sqlite_db: RouterDb) -> None:
    conflicts = Conflicts("40001", times=1, error=ConflictError("not a lost conflict"))
    router = router_with(sqlite_db, conflicts, hook="on_step")
    with pytest.raises(ConflictError):
        await router.route(tick("m1", "meter_1"))
    assert conflicts.steps == 1
