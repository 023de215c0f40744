"""Schedules on each database: put, fired through the bindings once each, missed fires
caught up by policy, failures recorded and retried, paused and resumed, backfilled,
and two workers sharing the table."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

import pytest
from tests.persistence.conftest import (  # noqa: F401 - fixtures used by name
    postgresql_store,
    sqlite_store,
)
from tests.router.conftest import (  # noqa: F401 - fixtures used by name
    RouterDb,
    pg_db,
    router_db,
    router_store,
)
from tests.router.test_races import count_of, counter_chart

from statifier import telemetry
from statifier.persistence import DatabaseDown
from statifier.router import (
    Binding,
    CreatedAndDelivered,
    Delivered,
    Duplicate,
    Resolved,
    Router,
    Schedule,
    ScheduleError,
    Scheduler,
    StaticResolver,
    address,
)

START = datetime(2026, 9, 19, 8, 0, tzinfo=UTC)
"""The clock of :class:`~tests.router.conftest.RouterDb` starts here."""

TICKS = Binding(
    id="ticks",
    source="clock",
    match="true",
    key="event.schedule",
    document="counter",
    event="hit",
)


def _router(db: RouterDb, document: str = "counter") -> Router:
    resolver = StaticResolver({document: counter_chart()})
    return db.router([TICKS], resolver=resolver)


def _schedule(name: str = "tick", /, **entry: object) -> Schedule:
    fields: dict[str, object] = {"every": "PT1M", "source": "clock", "scope": "t"}
    fields.update(entry)
    fields = {key: value for key, value in fields.items() if value is not None}
    return Schedule.from_mapping(name, fields)


async def _count(router: Router, name: str = "tick") -> object:
    found = await address(router, "t", "counter", name)
    if found is None:
        return 0
    return await count_of(router, found.execution_id)


@pytest.mark.asyncio
async def test_each_fire_is_routed_once_with_its_time_as_its_id(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    router = _router(router_db)
    scheduler = Scheduler(router)
    state = await scheduler.put(_schedule())
    assert state.next_fire_at == START + timedelta(minutes=1)
    assert (state.fired, state.skipped, state.paused) == (0, 0, False)
    assert await scheduler.fire_due() == []  # nothing due yet
    assert await scheduler.next_due() == START + timedelta(minutes=1)

    router_db.clock.advance(timedelta(minutes=1, seconds=3))
    (made,) = await scheduler.fire_due()
    assert made.fire_time == START + timedelta(minutes=1)
    assert made.routed is not None
    assert made.routed.event.message_id == "tick/2026-09-19T08:01:00Z"
    assert made.routed.event.data == {"schedule": "tick", "fire_time": "2026-09-19T08:01:00Z"}
    assert isinstance(made.routed.outcomes[0], CreatedAndDelivered)
    assert await scheduler.fire_due() == []  # made: the row moved on
    router_db.clock.advance(timedelta(minutes=1))
    (second,) = await scheduler.fire_due()
    assert second.routed is not None
    assert isinstance(second.routed.outcomes[0], Delivered)
    assert await _count(router) == 2
    after = await scheduler.get("tick")
    assert after is not None
    assert after.fired == 2
    assert after.last_fire_at == START + timedelta(minutes=2)
    assert after.last_made_at == START + timedelta(minutes=2, seconds=3)
    assert after.next_fire_at == START + timedelta(minutes=3)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("policy", "made"),
    [
        ("skip", ["08:10"]),
        ("one", ["08:09", "08:10"]),
        ("all", ["08:05", "08:06", "08:07", "08:08", "08:09", "08:10"]),
    ],
)
async def test_missed_fires_are_caught_up_as_the_policy_says(
    router_db: RouterDb,  # noqa: F811 - the fixture
    policy: str,
    made: list[str],
) -> None:
    router = _router(router_db)
    scheduler = Scheduler(router)
    await scheduler.put(_schedule(catch_up=policy, catch_up_window="PT5M30S"))
    # Down for ten minutes: the fires of 08:01 to 08:10 came due, 08:10 on time.
    router_db.clock.advance(timedelta(minutes=10, seconds=20))
    reports = await scheduler.fire_due()
    fired = [r.fire_time.strftime("%H:%M") for r in reports if r.fire_time is not None]
    assert fired == made
    state = await scheduler.get("tick")
    assert state is not None
    assert (state.fired, state.skipped) == (len(made), 10 - len(made))
    assert state.next_fire_at == START + timedelta(minutes=11)
    assert await _count(router) == len(made)


@pytest.mark.asyncio
async def test_a_failed_fire_is_recorded_retried_later_and_then_made(
    router_db: RouterDb,  # noqa: F811 - the fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[dict[str, object]] = []
    telemetry.attach(
        "scheduler-test", "statifier.router.schedule", lambda n, m, meta: seen.append(dict(meta))
    )
    try:
        broken = Scheduler(_router(router_db, document="elsewhere"), retry=timedelta(seconds=10))
        await broken.put(_schedule())
        router_db.clock.advance(timedelta(minutes=1))
        with caplog.at_level(logging.ERROR, "statifier.router.scheduler"):
            (failed,) = await broken.fire_due()
        assert failed.error is not None
        assert "UnresolvedDocument" in failed.error
        assert "schedule 'tick': the fire at 2026-09-19T08:01:00+00:00 failed" in caplog.text
        state = await broken.get("tick")
        assert state is not None
        assert (state.failures, state.fired) == (1, 0)
        assert state.last_error == failed.error
        assert state.due_at == START + timedelta(minutes=1, seconds=10)
        assert state.next_fire_at == START + timedelta(minutes=1)  # the fire waits
        assert await broken.fire_due() == []  # not again before its retry

        fixed = Scheduler(_router(router_db))
        router_db.clock.advance(timedelta(seconds=10))
        (made,) = await fixed.fire_due()
        assert made.fire_time == START + timedelta(minutes=1)
        state = await fixed.get("tick")
        assert state is not None
        assert (state.failures, state.fired, state.last_error) == (0, 1, None)
    finally:
        telemetry.detach("scheduler-test")
    assert [meta["outcome"] for meta in seen] == ["failed", "made"]


class _Down:
    """A resolver whose database does not answer, as the store a fire goes to when
    its server is stopped."""

    def __call__(self, scope: str, document: str) -> Resolved:
        raise DatabaseDown("no connection within 5 s: the server does not answer")


@pytest.mark.asyncio
async def test_a_fire_whose_database_does_not_answer_is_tried_every_retry_not_later(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    # Doubled, the waits after four failures would reach 80 s past the store's return.
    down = Scheduler(router_db.router([TICKS], resolver=_Down()), retry=timedelta(seconds=5))
    await down.put(_schedule())
    router_db.clock.advance(timedelta(minutes=1))
    for failures in range(1, 5):
        (failed,) = await down.fire_due()
        assert failed.error is not None
        assert "DatabaseDown: no connection within 5 s" in failed.error
        state = await down.get("tick")
        assert state is not None
        assert state.failures == failures
        assert state.due_at == router_db.clock() + timedelta(seconds=5)
        router_db.clock.advance(timedelta(seconds=5))
    # A failure of the fire itself keeps doubling (the test above and the next).


class _Switched:
    """A resolver that fails while ``broken``."""

    def __init__(self) -> None:
        self.broken = True
        self.charts = StaticResolver({"counter": counter_chart()})

    def __call__(self, scope: str, document: str) -> Resolved:
        if self.broken:
            raise LookupError(f"no chart for document {document!r} (switched off)")
        return self.charts(scope, document)


@pytest.mark.asyncio
async def test_a_schedule_whose_step_failed_is_failing_until_its_fire_is_made(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    """`failing()` names the schedules whose last step here failed: a made fire, a
    pause or a removal takes one off, and so does another process's made fire, seen
    by `run` once the retry is due."""
    switch = _Switched()
    scheduler = Scheduler(router_db.router([TICKS], resolver=switch), retry=timedelta(seconds=10))
    for name in ("tick", "tock", "tack"):
        await scheduler.put(_schedule(name))
    assert scheduler.failing() == ()
    router_db.clock.advance(timedelta(minutes=1))  # 08:01
    assert all(report.error for report in await scheduler.fire_due())
    assert scheduler.failing() == ("tack", "tick", "tock")
    assert await scheduler.pause("tock") is True
    assert await scheduler.remove("tack") is True
    assert scheduler.failing() == ("tick",)
    switch.broken = False  # repaired
    router_db.clock.advance(timedelta(seconds=10))
    (made,) = await scheduler.fire_due()
    assert made.fire_time == START + timedelta(minutes=1)
    assert scheduler.failing() == ()

    switch.broken = True  # for new executions: tick's has its chart
    await scheduler.put(_schedule("tuck"))
    router_db.clock.advance(timedelta(seconds=50))  # 08:02
    reports = await scheduler.fire_due()
    assert [(r.name, r.error is None) for r in reports] == [("tick", True), ("tuck", False)]
    assert scheduler.failing() == ("tuck",)
    other = Scheduler(_router(router_db))  # another process's, its charts sound
    router_db.clock.advance(timedelta(seconds=10))
    (made,) = await other.fire_due()
    assert (made.name, made.fire_time) == ("tuck", START + timedelta(minutes=2))
    assert scheduler.failing() == ("tuck",)  # not seen yet
    stop = asyncio.Event()
    running = asyncio.create_task(scheduler.run(stop))
    try:
        async with asyncio.timeout(10):
            while scheduler.failing():  # noqa: ASYNC110 - a state, not an event
                await asyncio.sleep(0.01)
    finally:
        stop.set()
        await running
    state = await scheduler.get("tuck")
    assert state is not None
    assert (state.fired, state.failures) == (1, 0)


@pytest.mark.asyncio
async def test_a_failure_not_recorded_because_the_schedule_changed_is_still_logged(
    router_db: RouterDb,  # noqa: F811 - the fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A fire fails and the schedule changes before the failure is recorded (the race
    this stages by hand): the row stays as the change left it, the failure is logged."""
    router = _router(router_db)
    scheduler = Scheduler(router)
    await scheduler.put(_schedule())
    async with router.transaction() as unit:
        claimed = await scheduler.table.locked(unit.tx.driver, "tick")
    assert claimed is not None
    router_db.clock.advance(timedelta(seconds=1))
    assert await scheduler.pause("tick") is True  # the change, after the claim
    with caplog.at_level(logging.ERROR, "statifier.router.scheduler"):
        await scheduler._failed(claimed, "ConnectionError: gone", router_db.clock.now)
    assert "(not recorded: the schedule changed meanwhile): ConnectionError: gone" in caplog.text
    state = await scheduler.get("tick")
    assert state is not None
    assert (state.failures, state.last_error) == (0, None)


@pytest.mark.asyncio
async def test_a_paused_schedule_makes_no_fire_and_resumes_from_now(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    router = _router(router_db)
    scheduler = Scheduler(router)
    await scheduler.put(_schedule(catch_up="all"))
    assert await scheduler.pause("tick") is True
    assert await scheduler.pause("tick") is False
    router_db.clock.advance(timedelta(minutes=30, seconds=5))
    assert await scheduler.fire_due() == []
    assert await scheduler.next_due() is None
    assert await scheduler.resume("tick") is True
    assert await scheduler.resume("tick") is False
    state = await scheduler.get("tick")
    assert state is not None
    assert not state.paused
    assert state.next_fire_at == START + timedelta(minutes=31)  # the pause's fires are gone
    with pytest.raises(ScheduleError, match="no schedule 'nope'"):
        await scheduler.pause("nope")
    with pytest.raises(ScheduleError, match="no schedule 'nope'"):
        await scheduler.resume("nope")


@pytest.mark.asyncio
async def test_pages_go_past_schedules_that_cannot_be_read_and_name_them(
    router_db: RouterDb,  # noqa: F811 - the fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    import sqlalchemy as sa

    from statifier.sql import migrations

    scheduler = Scheduler(_router(router_db))
    for name in ("a", "b", "c"):
        await scheduler.put(_schedule(name))
    table = router_db.adapter.tables.schedules
    engine = sa.create_engine(migrations.sync_url(router_db.store.url))
    try:
        with engine.begin() as connection:
            spoiled = table.update().where(table.c.name == "b").values(definition={"every": 7})
            connection.execute(spoiled)
    finally:
        engine.dispose()
    pages = []
    after = ""
    while True:
        page = await scheduler.page(after=after, limit=1)
        pages.append(([s.schedule.name for s in page.states], page.unreadable, page.last))
        if page.last is None:
            break
        after = page.last
    # A page of nothing readable is not the end: "c" comes after it.
    assert pages == [(["a"], [], "a"), ([], ["b"], "b"), (["c"], [], "c"), ([], [], None)]
    assert [s.schedule.name for s in await scheduler.states()] == ["a", "c"]
    said = [r for r in caplog.records if "its stored definition cannot be read" in r.message]
    assert {r.levelname for r in said} == {"ERROR"}


@pytest.mark.asyncio
async def test_putting_again_keeps_state_and_moves_the_next_fire_only_for_new_times(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    scheduler = Scheduler(_router(router_db))
    await scheduler.put(_schedule(paused=True))
    router_db.clock.advance(timedelta(seconds=30))
    again = await scheduler.put(_schedule(data={"note": "new data"}))
    assert again.paused  # an operator's pause outlives a restart with the file
    assert again.schedule.data == {"note": "new data"}
    assert again.next_fire_at == START + timedelta(minutes=1)
    retimed = await scheduler.put(_schedule(every="PT7M"))
    assert retimed.next_fire_at == START + timedelta(minutes=7)
    assert await scheduler.put(_schedule(every="PT7M")) == retimed  # nothing changed
    fresh = await scheduler.put(_schedule("other", paused=True))
    assert fresh.paused
    assert [state.schedule.name for state in await scheduler.states()] == ["other", "tick"]
    assert [state.schedule.name for state in await scheduler.states(after="other")] == ["tick"]
    assert await scheduler.remove("tick") is True
    assert await scheduler.remove("tick") is False
    assert await scheduler.get("tick") is None


@pytest.mark.asyncio
async def test_a_backfill_makes_a_past_range_and_a_fire_made_already_is_a_duplicate(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    router = _router(router_db)
    scheduler = Scheduler(router)
    await scheduler.put(_schedule())
    router_db.clock.advance(timedelta(minutes=2, seconds=30))
    reports = await scheduler.fire_due()  # 08:01 missed (skipped), 08:02 on time
    assert [r.fire_time for r in reports] == [None, START + timedelta(minutes=2)]
    routed = await scheduler.backfill("tick", START, START + timedelta(minutes=3))
    assert [r.event.message_id for r in routed] == [
        "tick/2026-09-19T08:00:00Z",
        "tick/2026-09-19T08:01:00Z",
        "tick/2026-09-19T08:02:00Z",
    ]
    assert isinstance(routed[2].outcomes[0], Duplicate)
    assert await _count(router) == 3
    with pytest.raises(ScheduleError, match="at most 10000 fires"):
        await scheduler.backfill("tick", START - timedelta(days=10), START)
    with pytest.raises(ScheduleError, match="after its start"):
        await scheduler.backfill("tick", START, START)
    with pytest.raises(ScheduleError, match="no schedule"):
        await scheduler.backfill("nope", START - timedelta(hours=1), START)


@pytest.mark.asyncio
async def test_a_cron_in_a_time_zone_fires_once_through_a_change_of_the_clocks(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    router = _router(router_db)
    scheduler = Scheduler(router)
    night = datetime(2026, 10, 24, 22, 0, tzinfo=UTC)  # Paris sets its clocks back at 3:00
    paris: dict[str, object] = {"cron": "30 2 * * *", "timezone": "Europe/Paris", "every": None}
    await scheduler.put(_schedule(catch_up="all", catch_up_window="P3D", **paris), now=night)
    reports = await scheduler.fire_due(now=night + timedelta(days=2))
    # 02:30 came twice on the 25th: fired at its first; once on the 26th.
    assert [r.fire_time for r in reports] == [
        datetime(2026, 10, 25, 0, 30, tzinfo=UTC),
        datetime(2026, 10, 26, 1, 30, tzinfo=UTC),
    ]


@pytest.mark.asyncio
async def test_two_workers_make_each_fire_once(
    pg_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    routers = [_router(pg_db) for _ in range(2)]
    first = Scheduler(routers[0])
    for n in range(40):
        await first.put(_schedule(f"s{n}", catch_up="all"))
    pg_db.clock.advance(timedelta(minutes=5, seconds=1))
    passes = await asyncio.gather(*(Scheduler(r).fire_due() for r in routers for _ in range(2)))
    made = [(r.name, r.fire_time) for reports in passes for r in reports if r.fire_time]
    assert len(made) == len(set(made)) == 40 * 5
    for n in range(40):
        assert await _count(routers[0], f"s{n}") == 5


@pytest.mark.asyncio
async def test_a_catch_up_backlog_does_not_starve_the_fires_of_other_schedules(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    # Each step takes a quarter of a second: a backlog of 40 fires is 10 s of work.
    moments = iter(START + timedelta(seconds=0.25 * n) for n in range(10_000))
    router = _router(router_db)
    scheduler = Scheduler(router, clock=lambda: next(moments))
    backlog = _schedule("backlog", every="PT1S", catch_up="all")
    beat = _schedule("beat", every="PT1S", grace="PT2S")
    await scheduler.put(backlog, now=START - timedelta(seconds=40))
    await scheduler.put(beat, now=START - timedelta(seconds=1))
    await scheduler.fire_due()
    state = await scheduler.get("beat")
    assert state is not None
    assert state.skipped == 0  # a worker ran throughout: none of its fires was missed
    assert state.fired >= 5
