"""The built-in timer queue and its worker, on SQLite and PostgreSQL: due timers step
their executions (external and internal), route timers reach their route, timers of
ended or missing executions are discarded, a failing fire is retried later without
undoing its batch (the batch, rolled back whole, fires again one by one), workers given
ranges of buckets fire their range's timers alone, a batch is
taken off the queue in one statement, the loop sleeps until the next due time, 10,000
timers fire in due order, a cancel and a fire never both succeed, two worker
processes fire each timer once, and a worker SIGKILLed at random points loses no timer
and fires none twice."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import signal
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.child_processes import signal_child
from tests.persistence.conftest import SqlStore
from tests.router.conftest import RouterDb

from statifier import telemetry
from statifier.buckets import BUCKETS, bucket_of
from statifier.chart import Machine, compile_chart
from statifier.core import Event
from statifier.core import effects as fx
from statifier.persistence import EffectContext, Executions, Executor, Refused, Status
from statifier.persistence.errors import Unstorable
from statifier.persistence.sql import SqlTransaction
from statifier.router import ConfigError, Router, StaticResolver, ledger
from statifier.router.outbox import Backoff
from statifier.router.routes import IdempotencyKey
from statifier.router.timer_queue import TimerEntry, TimerKind
from statifier.router.timer_worker import RouteRetries, TimerWorker
from statifier.router.timers import DueTimer, SqlTimerQueue
from statifier.router.transaction import Delivering
from statifier.sql.names import TableNames


@pytest.fixture(name="router_store")
def _locking_router_store(locking_store: SqlStore) -> SqlStore:
    """Each backend, and PostgreSQL whose locks are rows: these tests are about what
    locks keep apart."""
    return locking_store


TIMER_EVENT = "statifier.router.timer"
PROCESS = Path(__file__).with_name("timer_process.py")
LOCK_WAIT = 30.0
SECOND = timedelta(seconds=1)

TICK = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="s">
  <state id="s">
    <transition event="tick" target="done"/>
    <transition event="inner" cond="_event.type == 'internal'" target="done"/>
  </state>
  <final id="done"/>
</scxml>"""
"""Waits in ``s`` for ``tick`` (or an internal ``inner``), then finishes."""

COUNT = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="s">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="s">
    <transition event="tick"><assign location="n" expr="n + 1"/><log expr="n"/></transition>
    <transition event="noop"/>
  </state>
</scxml>"""
"""Counts ticks (a targetless transition, logging each); ``noop`` does nothing."""

_CHARTS: dict[str, Machine] = {}


def chart(source: str) -> Machine:
    if source not in _CHARTS:
        _CHARTS[source] = compile_chart(source)
    return _CHARTS[source]


@dataclass
class Recorder:
    """A route adapter that records every hand-off; ``answers`` scripts what it says
    for an event name (a ``Refused``, or an exception to raise)."""

    seen: list[tuple[Event, IdempotencyKey]] = field(default_factory=list)
    answers: dict[str, Refused | Exception] = field(default_factory=dict)
    scopes: list[str | None] = field(default_factory=list)

    def deliver(
        self,
        config: Mapping[str, Any],
        event: Event,
        key: IdempotencyKey,
        tx: SqlTransaction | None,
        scope: str | None,
    ) -> Refused | None:
        assert tx is not None  # a fire hands off inside its transaction
        self.scopes.append(scope)
        answer = self.answers.get(event.name)
        if isinstance(answer, Exception):
            raise answer
        if answer is None:
            self.seen.append((event, key))
        return answer


def timer_router(
    router_db: RouterDb, recorder: Recorder | None = None, executor: Executor | None = None
) -> Router:
    options: dict[str, Any] = {} if executor is None else {"executor": executor}
    return router_db.router(
        [],
        resolver=StaticResolver({"tick": chart(TICK), "count": chart(COUNT)}),
        send_type="test:sink",
        routes={"rec": (recorder or Recorder(), {})},
        lock_wait=LOCK_WAIT,
        **options,
    )


def failing_for(*execution_ids: str) -> Executor:
    """An executor that raises on the log of ``execution_ids``' steps (the count
    chart logs on each tick), and performs nothing else."""

    def execute(effect: fx.Effect, context: EffectContext) -> None:
        if isinstance(effect, fx.Log) and context.execution_id in execution_ids:
            raise RuntimeError("the executor is down")

    return execute


def entry(
    execution_id: str,
    n: int,
    due_at: datetime,
    *,
    event: Event | None = None,
    kind: TimerKind = TimerKind.EXTERNAL,
    send_id: str | None = None,
    position: int = 0,
    route: str | None = None,
) -> TimerEntry:
    """Timer ``n`` of ``execution_id``: its key names ``n``, so each ``n`` is one row."""
    key = IdempotencyKey(
        execution_id,
        send_id=send_id or f"t{n}",
        macrostep=n,
        microstep=1,
        round=0,
        content_index=0,
        ordinal=position,
    )
    return TimerEntry(
        execution_id=execution_id,
        send_id=send_id or f"t{n}",
        key=key,
        due_at=due_at,
        step_position=position,
        kind=kind,
        event=event or Event("tick", data={"k": n}),
        route=route,
        scope="tenant" if kind is TimerKind.ROUTE else None,
    )


async def schedule(router: Router, entries: Sequence[TimerEntry]) -> None:
    assert router.timers is not None
    async with router.transaction() as unit:
        for one in entries:
            await router.timers.schedule(unit.tx, one)


async def create(router: Router, document: str, *execution_ids: str) -> None:
    async with router.transaction() as unit:
        executions = unit.executions(Delivering(None, router.storage.clock()))
        for execution_id in execution_ids:
            await executions.create(execution_id, chart(TICK if document == "tick" else COUNT))


def sql_queue(router: Router) -> SqlTimerQueue:
    """The router's timer queue, which these tests' routers keep in SQL."""
    queue = router.timers
    assert isinstance(queue, SqlTimerQueue)
    return queue


async def pending(router: Router) -> list[tuple[str, str, datetime]]:
    """Every pending row's ``(execution_id, send_id, due_at)``, in firing order."""
    queue = sql_queue(router)
    far = datetime(9999, 1, 1, tzinfo=UTC)
    async with router.transaction() as unit:
        claimed = await queue.claim(unit.tx, far, 1_000_000)
    assert all(isinstance(t, DueTimer) for t in claimed)
    return [
        (t.entry.execution_id, t.entry.send_id, t.entry.due_at)
        for t in claimed
        if isinstance(t, DueTimer)
    ]


async def status(router: Router, execution_id: str) -> Status:
    record = await router.adapter.fetch_execution(execution_id)
    assert record is not None
    return record.status


async def logged(router: Router, execution_id: str) -> list[tuple[str, str, Any]]:
    """The execution's input log as ``(via, event name, event data)``."""
    entries = await Executions(router.storage).inputs(execution_id)
    return [(e.via, e.event.name, e.event.data) for e in entries if e.event is not None]


@pytest.fixture
def timer_reports(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """What ``statifier.router.timer`` reports, measurements and metadata merged."""
    if TIMER_EVENT not in telemetry.EVENTS:  # until the catalog names it
        events = {**telemetry.EVENTS, TIMER_EVENT: "a due timer was fired or discarded"}
        monkeypatch.setattr(telemetry, "EVENTS", events)
    seen: list[dict[str, Any]] = []

    def record(name: str, measurements: Mapping[str, float], metadata: Mapping[str, Any]) -> None:
        seen.append({**measurements, **metadata})

    telemetry.attach("test_timers", TIMER_EVENT, record)
    try:
        yield seen
    finally:
        telemetry.detach("test_timers")


# One timer at a time.


@pytest.mark.asyncio
async def test_a_due_external_timer_steps_its_execution_and_a_later_one_waits(
    router_db: RouterDb,
) -> None:
    router = timer_router(router_db)
    await create(router, "tick", "ex_1", "ex_2")
    now = router_db.clock.now
    await schedule(router, [entry("ex_1", 1, now + SECOND), entry("ex_2", 2, now + 60 * SECOND)])
    worker = TimerWorker(router)
    assert await worker.next_due() == now + SECOND

    assert await worker.fire_due(now) == 0  # nothing due yet
    assert await status(router, "ex_1") is Status.ACTIVE
    assert await worker.fire_due(now + SECOND) == 1
    assert await status(router, "ex_1") is Status.COMPLETED
    assert await logged(router, "ex_1") == [("timer", "tick", {"k": 1})]
    assert await status(router, "ex_2") is Status.ACTIVE
    assert [row[:2] for row in await pending(router)] == [("ex_2", "t2")]
    assert await worker.next_due() == now + 60 * SECOND
    assert await ledger(router) == []  # a fire writes no routing-ledger row

    router_db.clock.advance(60 * SECOND)
    assert await worker.fire_due() == 1  # the storage's clock by default
    assert await status(router, "ex_2") is Status.COMPLETED
    assert await worker.next_due() is None


@pytest.mark.asyncio
async def test_an_internal_timer_steps_on_the_internal_queue(router_db: RouterDb) -> None:
    router = timer_router(router_db)
    await create(router, "tick", "ex_1")
    now = router_db.clock.now
    inner = Event("inner", type="internal", sendid="t1")
    await schedule(router, [entry("ex_1", 1, now, event=inner, kind=TimerKind.INTERNAL)])
    assert await TimerWorker(router).fire_due(now) == 1
    assert await status(router, "ex_1") is Status.COMPLETED
    assert [(via, name) for via, name, _ in await logged(router, "ex_1")] == [("timer", "inner")]


@pytest.mark.asyncio
async def test_one_key_scheduled_twice_is_one_row(router_db: RouterDb) -> None:
    router = timer_router(router_db)
    await create(router, "tick", "ex_1")
    now = router_db.clock.now
    await schedule(router, [entry("ex_1", 1, now)])
    await schedule(router, [entry("ex_1", 1, now + SECOND), entry("ex_1", 1, now)])  # redriven
    assert await pending(router) == [("ex_1", "t1", now)]


@pytest.mark.asyncio
async def test_an_entry_whose_event_cannot_be_stored_is_refused_as_unstorable_unwritten(
    router_db: RouterDb,
) -> None:
    # Nested too deep, or an integer too long to write: Unstorable (the send handler
    # refuses the send with it), never a RecursionError or a plain ValueError.
    router = timer_router(router_db)
    now = router_db.clock.now
    deep: Any = 0
    for _ in range(5000):
        deep = [deep]
    for data in (deep, {"n": 2**60_000}):
        with pytest.raises(Unstorable, match="the send's event cannot be stored"):
            await schedule(router, [entry("ex_1", 1, now, event=Event("tick", data=data))])
    assert await pending(router) == []


@pytest.mark.asyncio
async def test_a_cancel_deletes_every_row_of_the_send_and_answers_how_many(
    router_db: RouterDb,
) -> None:
    router = timer_router(router_db)
    now = router_db.clock.now
    await schedule(
        router,
        [
            entry("ex_1", 1, now, send_id="remind"),
            entry("ex_1", 2, now + SECOND, send_id="remind"),  # a second send of the id
            entry("ex_1", 3, now + 2 * SECOND, send_id="remind"),
            entry("ex_1", 4, now, send_id="other"),
            entry("ex_2", 5, now, send_id="remind"),  # another execution's
        ],
    )
    assert router.timers is not None
    async with router.transaction() as unit:
        assert await router.timers.cancel(unit.tx, "ex_1", "remind") == 3
        assert await router.timers.cancel(unit.tx, "ex_1", "nothing") == 0
    assert sorted(row[:2] for row in await pending(router)) == [
        ("ex_1", "other"),
        ("ex_2", "remind"),
    ]


@pytest.mark.asyncio
async def test_timers_of_ended_cancelled_or_missing_executions_are_discarded(
    router_db: RouterDb, timer_reports: list[dict[str, Any]]
) -> None:
    router = timer_router(router_db)
    await create(router, "tick", "finished", "cancelled", "live")
    now = router_db.clock.now
    async with router.transaction() as unit:
        executions = unit.executions(Delivering(None, now))
        await executions.step("finished", None, Event("tick"))
        await executions.cancel("cancelled")
    await schedule(
        router,
        [
            entry("finished", 1, now),
            entry("cancelled", 2, now),
            entry("missing", 3, now),
            entry("live", 4, now + SECOND),
        ],
    )
    assert await TimerWorker(router).fire_due(now + SECOND) == 4  # all off the queue
    assert await pending(router) == []
    outcomes = {(r["execution_id"], r["outcome"], r.get("reason")) for r in timer_reports}
    assert outcomes == {
        ("finished", "discarded", "finished"),
        ("cancelled", "discarded", "finished"),
        ("missing", "discarded", "no_execution"),
        ("live", "fired", None),
    }
    assert await status(router, "live") is Status.COMPLETED
    assert [name for _, name, _ in await logged(router, "finished")] == ["tick"]  # not twice
    lags = sorted(r["lag"] for r in timer_reports)
    assert lags == [0.0, 1.0, 1.0, 1.0]


@pytest.mark.asyncio
async def test_a_parked_execution_keeps_its_timer_until_it_is_unparked(
    router_db: RouterDb, timer_reports: list[dict[str, Any]]
) -> None:
    router = timer_router(router_db)
    await create(router, "tick", "ex_1")
    now = router_db.clock.now
    await schedule(router, [entry("ex_1", 1, now)])
    await Executions(router.storage).park("ex_1")
    worker = TimerWorker(router, retry=30.0)
    assert await worker.fire_due(now) == 0
    assert await pending(router) == [("ex_1", "t1", now + 30 * SECOND)]  # retried later
    assert [(r["outcome"], r["error"].split(":")[0]) for r in timer_reports] == [
        ("failed", "ExecutionParked")
    ]
    await Executions(router.storage).unpark("ex_1")
    assert await worker.fire_due(now + 29 * SECOND) == 0
    assert await worker.fire_due(now + 30 * SECOND) == 1
    assert await status(router, "ex_1") is Status.COMPLETED


# Route timers.


@pytest.mark.asyncio
async def test_a_route_timer_reaches_its_route_under_the_sends_key(router_db: RouterDb) -> None:
    recorder = Recorder()
    router = timer_router(router_db, recorder)
    await create(router, "count", "ex_1")
    now = router_db.clock.now
    due = entry("ex_1", 1, now, kind=TimerKind.ROUTE, route="rec", event=Event("joined"))
    await schedule(router, [due])
    assert await TimerWorker(router).fire_due(now) == 1
    assert recorder.seen == [(Event("joined"), due.key)]
    assert recorder.scopes == ["tenant"]  # the timer's scope reaches the route
    assert await pending(router) == []
    assert await ledger(router) == []


@pytest.mark.asyncio
async def test_a_route_timer_of_an_ended_or_missing_execution_is_discarded_unsent(
    router_db: RouterDb, timer_reports: list[dict[str, Any]]
) -> None:
    recorder = Recorder()
    router = timer_router(router_db, recorder)
    await create(router, "tick", "finished", "cancelled")
    now = router_db.clock.now
    async with router.transaction() as unit:
        executions = unit.executions(Delivering(None, now))
        await executions.step("finished", None, Event("tick"))
        await executions.cancel("cancelled")
    await schedule(
        router,
        [
            entry(name, n, now, kind=TimerKind.ROUTE, route="rec")
            for n, name in enumerate(("finished", "cancelled", "missing"))
        ],
    )
    assert await TimerWorker(router).fire_due(now) == 3
    assert recorder.seen == []
    assert await pending(router) == []
    assert {(r["execution_id"], r["outcome"], r["reason"]) for r in timer_reports} == {
        ("finished", "discarded", "finished"),
        ("cancelled", "discarded", "finished"),
        ("missing", "discarded", "no_execution"),
    }


RETRIES = RouteRetries(attempts=3, backoff=Backoff(base=SECOND, factor=2.0))


@pytest.mark.asyncio
async def test_a_refusing_route_is_asked_again_then_given_up_and_the_chart_hears_of_it(
    router_db: RouterDb, timer_reports: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder(answers={"no": Refused("the sink is full")})
    router = timer_router(router_db, recorder)
    await create(router, "count", "ex_1")
    now = router_db.clock.now
    refused = entry("ex_1", 1, now, kind=TimerKind.ROUTE, route="rec", event=Event("no"))
    await schedule(router, [replace(refused, event=Event("no", sendid="book"))])
    worker = TimerWorker(router, route_retries=RETRIES)
    # The first attempt, then one a second later, then two seconds after that.
    assert await worker.fire_due(now) == 1
    assert await pending(router) == [("ex_1", "t1", now + SECOND)]
    assert await worker.fire_due(now + SECOND) == 1
    assert await pending(router) == [("ex_1", "t1", now + 3 * SECOND)]
    assert await worker.fire_due(now + 2 * SECOND) == 0  # not due yet
    assert await worker.fire_due(now + 3 * SECOND) == 1
    assert await pending(router) == []
    assert [(r["outcome"], r.get("attempt")) for r in timer_reports] == [
        ("retried", "1"),
        ("retried", "2"),
        ("given_up", None),
    ]
    # Given up: a ledger row, and error.communication with the send's id in the chart.
    (row,) = await ledger(router, "ex_1")
    assert (row.binding_id, row.outcome, row.key) == ("route", "send_refused", "rec")
    assert row.reason == ("route_failed: route 'rec': the sink is full (gave up after 3 attempts)")
    log = await logged(router, "ex_1")
    assert [(via, name) for via, name, _ in log] == [("timer", "error.communication")]
    (error,) = await router.storage.errors("ex_1")
    assert (error.name, error.via) == ("error.communication", "timer")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("attempt 1 of 3" in line for line in warnings)
    assert any("was given up" in line for line in warnings)


@pytest.mark.asyncio
async def test_a_route_that_raises_is_asked_again_and_an_unregistered_one_given_up(
    router_db: RouterDb, timer_reports: list[dict[str, Any]]
) -> None:
    recorder = Recorder(answers={"boom": RuntimeError("the sink is down")})
    router = timer_router(router_db, recorder)
    await create(router, "count", "ex_1")
    now = router_db.clock.now
    await schedule(
        router,
        [
            entry("ex_1", 1, now, kind=TimerKind.ROUTE, route="gone"),
            entry("ex_1", 2, now, kind=TimerKind.ROUTE, route="rec", event=Event("boom")),
            entry("ex_1", 3, now, kind=TimerKind.ROUTE, route="rec", event=Event("b")),
        ],
    )
    worker = TimerWorker(router, route_retries=RETRIES)
    assert await worker.fire_due(now) == 3
    # The raise was undone at its own savepoint: the batch stood, "b" was handed off.
    assert [event.name for event, _ in recorder.seen] == ["b"]
    assert await pending(router) == [("ex_1", "t2", now + SECOND)]
    assert [(r["send_id"], r["outcome"], r.get("reason")) for r in timer_reports] == [
        ("t1", "given_up", "no route named 'gone' is registered"),
        ("t2", "retried", "route 'rec': RuntimeError: the sink is down"),
        ("t3", "fired", None),
    ]
    del recorder.answers["boom"]
    assert await worker.fire_due(now + SECOND) == 1
    assert [event.name for event, _ in recorder.seen] == ["b", "boom"]


@pytest.mark.asyncio
async def test_a_fire_that_raises_is_retried_later_and_the_rest_of_its_batch_stands(
    router_db: RouterDb, timer_reports: list[dict[str, Any]]
) -> None:
    router = timer_router(router_db, executor=failing_for("ex_bad"))
    await create(router, "count", "ex_1", "ex_bad", "ex_2")
    now = router_db.clock.now
    await schedule(router, [entry("ex_1", 1, now), entry("ex_bad", 2, now), entry("ex_2", 3, now)])
    worker = TimerWorker(router, retry=10.0)
    assert await worker.fire_due(now) == 2
    # The batch at once stepped ex_1, then raised at ex_bad and was rolled back whole;
    # one by one, ex_1 stepped again, ex_bad failed at its savepoint and ex_2 stood.
    assert await logged(router, "ex_1") == [("timer", "tick", {"k": 1})]
    assert await logged(router, "ex_2") == [("timer", "tick", {"k": 3})]
    assert await logged(router, "ex_bad") == []
    assert await pending(router) == [("ex_bad", "t2", now + 10 * SECOND)]
    # Only what committed is reported: nothing of the batch rolled back.
    assert [r["outcome"] for r in timer_reports] == ["fired", "failed", "fired"]
    assert timer_reports[1]["error"] == "RuntimeError: the executor is down"


@pytest.mark.asyncio
async def test_workers_given_bucket_ranges_fire_their_ranges_timers_alone(
    router_db: RouterDb,
) -> None:
    # Two workers whose ranges cover every bucket between them fire every timer once,
    # each only its own range's; one execution's fire raises, so the low range's batch
    # also goes one by one (the claim path) and keeps to its range.
    ids = [f"ex_{n}" for n in range(24)]
    low = [i for i in ids if bucket_of(i) < BUCKETS // 2]
    high = [i for i in ids if i not in low]
    assert low  # the ids fall on both sides
    assert high
    router = timer_router(router_db, executor=failing_for(low[0]))
    await create(router, "count", *ids)
    now = router_db.clock.now
    await schedule(router, [entry(i, n, now) for n, i in enumerate(ids)])
    first = TimerWorker(router, buckets=(0, BUCKETS // 2), retry=10.0)
    second = TimerWorker(router, buckets=(BUCKETS // 2, BUCKETS))
    assert await second.next_due() == now
    assert await first.fire_due(now) == len(low) - 1  # all but the failing one
    assert sorted(i for i, _, _ in await pending(router)) == sorted([low[0], *high])
    assert await first.next_due() == now + 10 * SECOND  # its retry, in its range
    assert await second.next_due() == now
    assert await second.fire_due(now) == len(high)
    assert [row[0] for row in await pending(router)] == [low[0]]
    for execution_id in ids:
        fired = 0 if execution_id == low[0] else 1
        assert len(await logged(router, execution_id)) == fired, execution_id
    for wrong in ((0, 0), (-1, 4), (512, 1025), (9, 3)):
        with pytest.raises(ConfigError, match="buckets is a range"):
            TimerWorker(router, buckets=wrong)


@pytest.mark.asyncio
async def test_a_batch_that_raises_is_rolled_back_whole_and_fired_one_by_one(
    router_db: RouterDb, timer_reports: list[dict[str, Any]]
) -> None:
    """The steps the batch at once made before the failing timer are undone with it
    and made again one by one: each is in its execution's log once."""
    router = timer_router(router_db, executor=failing_for("ex_9"))
    await create(router, "count", "ex_1", "ex_2", "ex_9")
    now = router_db.clock.now
    await schedule(
        router,
        [
            entry("ex_1", 1, now),
            entry("ex_9", 2, now),
            entry("ex_2", 3, now + SECOND),
            entry("ex_1", 4, now + SECOND),
        ],
    )
    worker = TimerWorker(router, retry=10.0)
    assert await worker.fire_due(now + SECOND) == 3
    assert await logged(router, "ex_1") == [
        ("timer", "tick", {"k": 1}),
        ("timer", "tick", {"k": 4}),
    ]
    assert await logged(router, "ex_2") == [("timer", "tick", {"k": 3})]
    for execution_id, ticks in (("ex_1", 2), ("ex_2", 1)):
        record = await router.adapter.fetch_execution(execution_id)
        assert record is not None
        assert router.storage.load(record, chart(COUNT)).datamodel["n"] == ticks
    assert await pending(router) == [("ex_9", "t2", now + 11 * SECOND)]
    assert [(r["send_id"], r["outcome"]) for r in timer_reports] == [
        ("t1", "fired"),
        ("t2", "failed"),
        ("t3", "fired"),
        ("t4", "fired"),
    ]
    # The next batch has no failing timer: at once again.
    await schedule(router, [entry("ex_2", 5, now + 2 * SECOND)])
    assert await worker.fire_due(now + 2 * SECOND) == 1
    assert [k for _, _, data in await logged(router, "ex_2") for k in [data["k"]]] == [3, 5]


@pytest.mark.asyncio
async def test_a_batch_whose_error_does_not_come_again_one_by_one_says_why(
    router_db: RouterDb, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch that raised once, not because of one timer, fires one by one with no
    failure: the batch's error is logged, since no fire's own warning shows it."""
    failures = ["the executor hiccuped"]

    def hiccup(effect: fx.Effect, context: EffectContext) -> None:
        if isinstance(effect, fx.Log) and failures:
            raise RuntimeError(failures.pop())

    router = timer_router(router_db, executor=hiccup)
    await create(router, "count", "ex_1", "ex_2")
    now = router_db.clock.now
    await schedule(router, [entry("ex_1", 1, now), entry("ex_2", 2, now)])
    with caplog.at_level(logging.WARNING, "statifier.router.timer_worker"):
        assert await TimerWorker(router).fire_due(now) == 2
    said = [r for r in caplog.records if r.name == "statifier.router.timer_worker"]
    assert [r.levelname for r in said] == ["WARNING"]
    assert "fired one at a time with no failure" in said[0].getMessage()
    assert "the executor hiccuped" in said[0].getMessage()
    assert await pending(router) == []


@pytest.mark.asyncio
async def test_take_due_deletes_a_batch_in_firing_order_and_a_rollback_puts_it_back(
    router_db: RouterDb,
) -> None:
    router = timer_router(router_db)
    queue = sql_queue(router)
    now = router_db.clock.now
    await schedule(
        router,
        [
            entry("ex_1", 1, now, position=1),
            entry("ex_2", 2, now - SECOND),
            entry("ex_3", 3, now, position=0),
            entry("ex_4", 4, now),
            entry("ex_5", 5, now + SECOND),  # not due
        ],
    )
    before = await pending(router)

    class UndoError(Exception):
        pass

    async def take_then_undo() -> None:
        async with router.transaction() as unit:
            taken = await queue.take_due(unit.tx, now, 3)
            assert [t.entry.send_id for t in taken.timers] == ["t2", "t1", "t3"]
            assert taken.picked == 3
            assert taken.upcoming == now + SECOND  # the earliest row not due
            assert all(t.locked for t in taken.timers)
            raise UndoError

    with pytest.raises(UndoError):
        await take_then_undo()
    assert await pending(router) == before  # a rollback leaves every row
    async with router.transaction() as unit:
        taken = await queue.take_due(unit.tx, now, 10)
    assert [t.entry.send_id for t in taken.timers] == ["t2", "t1", "t3", "t4"]
    assert taken.picked == 4  # fewer than the limit: no other due row
    assert [row[1] for row in await pending(router)] == ["t5"]
    async with router.transaction() as unit:
        empty = await queue.take_due(unit.tx, now, 10)
        assert (empty.timers, empty.picked, empty.upcoming) == ([], 0, now + SECOND)
        last = await queue.take_due(unit.tx, now + SECOND, 10)
        assert ([t.entry.send_id for t in last.timers], last.upcoming) == (["t5"], None)


@pytest.mark.asyncio
async def test_pending_many_reads_each_executions_first_timers_in_one_statement(
    router_db: RouterDb,
) -> None:
    router = timer_router(router_db)
    queue = sql_queue(router)
    now = router_db.clock.now
    await schedule(
        router,
        [
            entry("ex_a", 1, now + 3 * SECOND),
            entry("ex_b", 2, now),
            entry("ex_a", 3, now + SECOND),
            entry("ex_a", 4, now + 2 * SECOND),
            entry("ex_c", 5, now),  # not asked for
        ],
    )
    async with router.transaction() as unit:
        many = await queue.pending_many(unit.tx, ["ex_a", "ex_b", "ex_none"], 2)
        alone = {e: await queue.pending(unit.tx, e, 2) for e in ("ex_a", "ex_b")}
        assert await queue.pending_many(unit.tx, [], 2) == {}

    def sends(rows: Sequence[Any]) -> list[str]:
        return [row.entry.send_id for row in rows]

    assert {e: sends(rows) for e, rows in many.items()} == {"ex_a": ["t3", "t4"], "ex_b": ["t2"]}
    assert {e: sends(rows) for e, rows in alone.items()} == {e: sends(r) for e, r in many.items()}


@pytest.mark.asyncio
async def test_run_sleeps_until_the_next_due_time_at_most_poll_seconds(
    router_db: RouterDb,
) -> None:
    router = timer_router(router_db)
    await create(router, "count", "ex_1")
    clock = router_db.clock
    start = clock.now
    await schedule(router, [entry("ex_1", 1, start + SECOND), entry("ex_1", 2, start + 3 * SECOND)])
    stop = asyncio.Event()
    naps: list[float] = []

    async def sleep(seconds: float) -> None:
        naps.append(round(seconds, 6))
        clock.advance(timedelta(seconds=seconds))
        if clock.now >= start + 4 * SECOND:
            stop.set()

    worker = TimerWorker(router, poll=1.5, clock=clock, sleep=sleep)
    async with asyncio.timeout(30):
        await worker.run(stop)
    # Nothing due: until t1; t1 fired, t2 is 2 s off: the poll bound, then the rest;
    # t2 fired, nothing pending: the poll bound.
    assert naps == [1.0, 1.5, 0.5, 1.5]
    assert [data["k"] for _, _, data in await logged(router, "ex_1")] == [1, 2]
    assert await pending(router) == []


# Order.


@pytest.mark.asyncio
async def test_ten_thousand_timers_fire_in_due_order(router_db: RouterDb) -> None:
    recorder = Recorder()
    router = timer_router(router_db, recorder)
    now = router_db.clock.now
    chooser = random.Random(1201)
    # About five timers per due instant, scheduled out of due order; among one
    # instant's timers the later-scheduled has the later step position.
    dues = [chooser.randrange(2_000) for _ in range(10_000)]
    positions: dict[int, int] = {}
    entries = []
    for n, due in enumerate(dues):
        position = positions[due] = positions.get(due, -1) + 1
        entries.append(
            entry(
                f"ex_{n % 37}",
                n,
                now + timedelta(milliseconds=due),
                kind=TimerKind.ROUTE,
                route="rec",
                position=position,
                event=Event("tick", data={"n": n}),
            )
        )
    await create(router, "count", *(f"ex_{n}" for n in range(37)))
    await schedule(router, entries)
    worker = TimerWorker(router, batch=500)
    assert await worker.fire_due(now + timedelta(milliseconds=999)) == sum(d < 1000 for d in dues)
    assert await worker.fire_due(now + 2 * SECOND) == sum(d >= 1000 for d in dues)
    fired = [event.data["n"] for event, _ in recorder.seen]
    assert fired == sorted(range(10_000), key=lambda n: (dues[n], n))
    assert await pending(router) == []


# Races and crashes.


@pytest.mark.asyncio
async def test_a_row_held_elsewhere_keeps_the_later_timers_of_its_execution_waiting(
    pg_db: RouterDb,
) -> None:
    """Another worker's claim that did not get an execution's lock still holds the row
    it picked: a worker that gets the lock then must not fire that execution's later
    timers before it. The other executions' timers fire."""
    router = timer_router(pg_db)
    await create(router, "count", "ex_1", "ex_2")
    now = pg_db.clock.now
    await schedule(
        router,
        [
            entry("ex_1", 1, now - 2 * SECOND),
            entry("ex_1", 2, now - SECOND),
            entry("ex_2", 3, now - SECOND),
        ],
    )
    timers = TableNames.of(router.adapter.tables).timers
    async with router.transaction() as other:  # the other worker's claim, on t1 alone
        await other.tx.driver.execute(f"SELECT id FROM {timers} WHERE send_id = 't1' FOR UPDATE")
        fired = await asyncio.create_task(TimerWorker(router).fire_due(now))
        assert fired == 1
        assert [data["k"] for _, _, data in await logged(router, "ex_2")] == [3]
        assert await logged(router, "ex_1") == []
    assert await TimerWorker(router).fire_due(now) == 2
    assert [data["k"] for _, _, data in await logged(router, "ex_1")] == [1, 2]


@pytest.mark.asyncio
async def test_a_cancel_and_a_fire_never_both_succeed(router_db: RouterDb) -> None:
    """Each round, a worker fires a due timer while another transaction steps the
    execution (taking its lock) and cancels the timer, a random moment apart: on
    PostgreSQL two connections, two transactions racing."""
    router = timer_router(router_db)
    await create(router, "count", "ex_1")
    assert router.timers is not None
    timers = router.timers
    worker = TimerWorker(router)
    chooser = random.Random(20261201)
    now = router_db.clock.now
    fired_rounds = cancelled_rounds = 0
    for n in range(200):
        await schedule(router, [entry("ex_1", n, now)])
        delays = [chooser.choice([0.0, 0.0, 0.0005, 0.001, 0.002]) for _ in range(3)]

        async def fire_it(delay: float = delays[0]) -> int:
            await asyncio.sleep(delay)
            return await worker.fire_due(now)

        async def cancel_it(n: int = n, before: float = delays[1], held: float = delays[2]) -> int:
            await asyncio.sleep(before)
            async with router.transaction() as unit:
                executions = unit.executions(Delivering(None, now))
                await executions.step("ex_1", None, Event("noop"))  # the step's lock
                await asyncio.sleep(held)
                return await timers.cancel(unit.tx, "ex_1", f"t{n}")

        async with asyncio.timeout(30):
            fired, cancelled = await asyncio.gather(fire_it(), cancel_it())
        assert (fired, cancelled) in ((1, 0), (0, 1)), f"round {n}: {fired=} {cancelled=}"
        assert await pending(router) == []
        fired_rounds += fired
        cancelled_rounds += cancelled
    record = await router.adapter.fetch_execution("ex_1")
    assert record is not None
    assert router.storage.load(record, chart(COUNT)).datamodel["n"] == fired_rounds
    ticks = [data["k"] for _, name, data in await logged(router, "ex_1") if name == "tick"]
    assert len(ticks) == len(set(ticks)) == fired_rounds
    print(f"{router_db.backend}: fired {fired_rounds}, cancelled {cancelled_rounds}")
    assert fired_rounds  # both sides won some rounds
    assert cancelled_rounds


async def _start(router_db: RouterDb, job: dict[str, Any]) -> asyncio.subprocess.Process:
    options = router_db.store.tables.options
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(PROCESS),
        router_db.store.url,
        options.prefix,
        options.schema or "-",
        json.dumps(job),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    ready = await asyncio.wait_for(process.stdout.readline(), 60)
    if ready.strip() != b"ready":
        _, err = await process.communicate()
        pytest.fail(f"the worker did not start: {err.decode()}")
    return process


async def _wall_clock_timers(
    router: Router, executions: int, per_execution: int
) -> dict[str, list[int]]:
    """``per_execution`` tick timers for each of ``executions`` new counters, all due
    (in the wall clock's past), each execution's in ``k`` order. Answers each
    execution's ``k``s."""
    ids = [f"ex_{i:03d}" for i in range(executions)]
    await create(router, "count", *ids)
    start = datetime.now(UTC) - timedelta(hours=1)
    expected: dict[str, list[int]] = {execution_id: [] for execution_id in ids}
    entries = []
    for k in range(executions * per_execution):
        execution_id = ids[k % executions]
        expected[execution_id].append(k)
        entries.append(entry(execution_id, k, start + timedelta(milliseconds=k)))
    await schedule(router, entries)
    return expected


async def _assert_each_fired_once_in_order(router: Router, expected: dict[str, list[int]]) -> None:
    assert await pending(router) == []
    for execution_id, ks in expected.items():
        log = await logged(router, execution_id)
        assert [data["k"] for _, _, data in log] == ks, execution_id
        assert {via for via, _, _ in log} == {"timer"}
        record = await router.adapter.fetch_execution(execution_id)
        assert record is not None
        assert router.storage.load(record, chart(COUNT)).datamodel["n"] == len(ks)


@pytest.mark.asyncio
async def test_two_worker_processes_fire_every_timer_once(router_db: RouterDb) -> None:
    router = timer_router(router_db)
    expected = await _wall_clock_timers(router, executions=100, per_execution=20)
    job = {"batch": 20, "pause": 0.0, "barrier": True}
    processes = [await _start(router_db, job) for _ in range(2)]
    for process in processes:
        assert process.stdin is not None
        process.stdin.write(b"go\n")
        await process.stdin.drain()
    answers = []
    for process in processes:
        out, err = await asyncio.wait_for(process.communicate(), 120)
        assert process.returncode == 0, err.decode()
        answers.append(json.loads(out.decode().strip().splitlines()[-1])["taken"])
    assert sum(answers) == 2_000  # none fired twice, none left
    print(f"{router_db.backend}: the workers took {answers}")
    await _assert_each_fired_once_in_order(router, expected)


KILLS = 20
MAX_RUNS = 100


@pytest.mark.asyncio
async def test_a_worker_killed_at_random_points_fires_every_timer_once(
    router_db: RouterDb,
) -> None:
    router = timer_router(router_db)
    expected = await _wall_clock_timers(router, executions=40, per_execution=20)
    chooser = random.Random(1212)
    job = {"batch": 4, "pause": 0.001, "barrier": False}
    kills = 0
    for _ in range(MAX_RUNS):
        process = await _start(router_db, job)
        if kills < KILLS:
            await asyncio.sleep(chooser.uniform(0.0, 0.03))
            if process.returncode is None:
                signal_child(process, signal.SIGKILL)
        _, err = await asyncio.wait_for(process.communicate(), 120)
        assert process.returncode in (0, -signal.SIGKILL), err.decode()
        if process.returncode == 0:
            break
        kills += 1
    assert kills >= KILLS
    await _assert_each_fired_once_in_order(router, expected)
