"""Catching up after a long downtime: a cron schedule's missed fires are counted in one
pass over its fire times (not one ``Schedule.after`` each), and past
``MAX_COUNTED`` the count stops and says it is a lower bound, the step otherwise the
same."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
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

from statifier.cron import Cron
from statifier.router import Binding, Schedule, Scheduler, StaticResolver
from statifier.router import schedules as schedules_module
from statifier.router.schedules import Step, next_step

JAN = datetime(2026, 1, 1, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def _cron(text: str, **entry: object) -> Schedule:
    fields: dict[str, object] = {"cron": text, "source": "clock", "scope": "t"}
    fields.update(entry)
    return Schedule.from_mapping("c", fields)


@pytest.fixture
def few_afters(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Fail a test that asks ``Cron.next_after`` more than a few times (one call per
    missed fire is what made a long catch-up block the event loop)."""
    calls = [0]
    original: Callable[..., datetime] = Cron.next_after

    def counted(self: Cron, instant: datetime, timezone: str | ZoneInfo = "UTC") -> datetime:
        calls[0] += 1
        assert calls[0] <= 20, "one Cron.next_after call per missed fire"
        return original(self, instant, timezone)

    monkeypatch.setattr(Cron, "next_after", counted)
    return calls


def test_a_minutely_cron_thirty_days_behind_is_counted_in_one_pass(
    few_afters: list[int],
) -> None:
    pending = JAN + MINUTE  # the first fire missed: 00:01 on 1 January
    now = pending + timedelta(days=30)  # 00:01 on 31 January
    on_time = datetime(2026, 1, 31, tzinfo=UTC)  # within the minute's grace
    # skip: everything before the first fire on time is let pass.
    assert next_step(_cron("* * * * *"), pending, now) == Step(None, 30 * 1440 - 1, on_time)
    # one: the latest missed fire is made, the others counted.
    latest = on_time - MINUTE
    one = next_step(_cron("* * * * *", catch_up="one"), pending, now)
    assert one == Step(latest, 30 * 1440 - 2, on_time)
    # all: the fires older than the window (a day) are counted; the next is its first.
    reach = now - timedelta(days=1)
    every = next_step(_cron("* * * * *", catch_up="all"), pending, now)
    assert every == Step(None, 29 * 1440, reach)
    # In a time zone, through a change of its clocks (Paris, 29 March): every minute
    # is a fire, the wall clock's skipped hour none.
    paris = _cron("* * * * *", timezone="Europe/Paris")
    march = datetime(2026, 3, 1, tzinfo=UTC)
    step = next_step(paris, march, march + timedelta(days=30, minutes=1))
    assert step == Step(None, 30 * 1440, march + timedelta(days=30))
    assert few_afters[0] <= 8


@pytest.mark.parametrize(
    ("text", "later"),
    [
        ("* * * * *", timedelta(days=40)),
        # Every minute of the first morning of each month: the latest missed fire is
        # two weeks before the step, found looking back further and further.
        ("* 0-11 1 * *", timedelta(days=105)),
    ],
)
@pytest.mark.parametrize("policy", ["skip", "one", "all"])
@pytest.mark.parametrize("window", ["P1D", "P30D"])
def test_past_max_counted_the_count_is_a_lower_bound_and_the_step_the_same(
    monkeypatch: pytest.MonkeyPatch, text: str, later: timedelta, policy: str, window: str
) -> None:
    schedule = _cron(text, catch_up=policy, catch_up_window=window)
    pending = schedule.after(JAN)
    now = pending + later
    counted = next_step(schedule, pending, now)
    assert not counted.at_least
    assert counted.skipped > 1000
    monkeypatch.setattr(schedules_module, "MAX_COUNTED", 1000)
    capped = next_step(schedule, pending, now)
    assert capped.at_least
    assert (capped.fire, capped.next_fire_at) == (counted.fire, counted.next_fire_at)
    assert 999 <= capped.skipped <= 1000 < counted.skipped


def test_an_every_schedule_is_never_counted_one_by_one() -> None:
    beat = Schedule.from_mapping("b", {"every": "PT1S", "source": "clock", "scope": "t"})
    pending = beat.after(JAN)
    step = next_step(beat, pending, pending + timedelta(days=400))
    assert step.skipped == 400 * 86400 - 60
    assert not step.at_least


TICKS = Binding(
    id="ticks",
    source="clock",
    match="true",
    key="event.schedule",
    document="counter",
    event="hit",
)


@pytest.mark.asyncio
async def test_the_worker_says_how_many_fires_it_let_pass_or_at_least_how_many(
    router_db: RouterDb,  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    resolver = StaticResolver({"counter": counter_chart()})
    scheduler = Scheduler(router_db.router([TICKS], resolver=resolver))
    later = JAN + timedelta(days=30, seconds=30)
    on_time = datetime(2026, 1, 31, tzinfo=UTC)
    for name in ("minutely", "capped"):
        entry = {"cron": "* * * * *", "source": "clock", "scope": "t", "paused": True}
        await scheduler.put(Schedule.from_mapping(name, entry), now=JAN)
    assert await scheduler.resume("minutely", now=JAN)
    with caplog.at_level(logging.WARNING, "statifier.router.scheduler"):
        reports = await scheduler.fire_due(now=later)
    steps = [(r.name, r.fire_time, r.skipped, r.at_least) for r in reports]
    assert steps == [
        ("minutely", None, 30 * 1440 - 1, False),
        ("minutely", on_time, 0, False),
    ]
    assert "schedule 'minutely' let 43199 missed fires pass (catch_up skip)" in caplog.text
    state = await scheduler.get("minutely")
    assert state is not None
    assert (state.skipped, state.fired, state.last_fire_at) == (43199, 1, on_time)

    monkeypatch.setattr(schedules_module, "MAX_COUNTED", 1000)
    assert await scheduler.resume("capped", now=JAN)
    caplog.clear()
    with caplog.at_level(logging.WARNING, "statifier.router.scheduler"):
        reports = await scheduler.fire_due(now=later)
    steps = [(r.name, r.fire_time, r.skipped, r.at_least) for r in reports]
    assert steps == [("capped", None, 1000, True), ("capped", on_time, 0, False)]
    assert "schedule 'capped' let at least 1000 missed fires pass" in caplog.text
