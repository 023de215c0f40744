"""Schedules' fire times and catch-up decisions, pure: property-tested against a walk
over every fire time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statifier.router import CatchUp, InboundEvent, Schedule, ScheduleError
from statifier.router.schedules import fire_id, next_step

BASE = datetime(2026, 1, 1, tzinfo=UTC)


def _every(seconds: int, **more: object) -> Schedule:
    return Schedule(
        name="s",
        source="clock",
        scope="t",
        every=timedelta(seconds=seconds),
        **more,  # type: ignore[arg-type]
    )


def _passes(schedule: Schedule, pending: datetime, now: datetime) -> tuple[list[datetime], int]:
    """Step the schedule at ``now`` until its next fire is after ``now``, as a worker's
    pass does: the fires made, and how many were let pass."""
    made: list[datetime] = []
    skipped = 0
    for _ in range(20_000):
        if pending > now:
            return made, skipped
        step = next_step(schedule, pending, now)
        assert step.next_fire_at > pending
        if step.fire is not None:
            assert not made or step.fire > made[-1]  # in order, each once
            made.append(step.fire)
        skipped += step.skipped
        pending = step.next_fire_at
    raise AssertionError("the pass did not end")


@settings(max_examples=300, deadline=None)
@given(
    every=st.integers(30, 4000),
    grace=st.integers(0, 3000),
    window_extra=st.integers(0, 50_000),
    lateness=st.integers(0, 200_000),
    policy=st.sampled_from(list(CatchUp)),
    offset=st.integers(0, 4000),
)
def test_a_pass_makes_exactly_the_fires_its_policy_names(
    every: int, grace: int, window_extra: int, lateness: int, policy: CatchUp, offset: int
) -> None:
    schedule = _every(
        every,
        start=BASE + timedelta(seconds=offset),
        grace=timedelta(seconds=grace),
        catch_up_window=timedelta(seconds=grace + window_extra),
        catch_up=policy,
    )
    pending = schedule.after(BASE + timedelta(days=1))
    now = pending + timedelta(seconds=lateness)
    every_fire = list(schedule.fires(pending, now + timedelta(microseconds=1)))
    on_time = [f for f in every_fire if f >= now - schedule.grace]
    within = [f for f in every_fire if now - schedule.catch_up_window <= f < now - schedule.grace]
    expected = {
        CatchUp.SKIP: on_time,
        CatchUp.ONE: within[-1:] + on_time,
        CatchUp.ALL: within + on_time,
    }[policy]
    made, skipped = _passes(schedule, pending, now)
    assert made == expected
    assert skipped == len(every_fire) - len(made)


@settings(max_examples=60, deadline=None)
@given(
    lateness_minutes=st.integers(0, 3 * 24 * 60),
    policy=st.sampled_from(list(CatchUp)),
)
def test_a_cron_pass_agrees_with_the_walk(lateness_minutes: int, policy: CatchUp) -> None:
    schedule = Schedule.from_mapping(
        "hourly",
        {
            "cron": "17 */3 * * *",
            "timezone": "America/New_York",
            "source": "clock",
            "scope": "t",
            "catch_up": policy.value,
            "catch_up_window": "PT12H",
            "grace": "PT5M",
        },
    )
    pending = schedule.after(datetime(2026, 3, 7, tzinfo=UTC))  # across the March change
    now = pending + timedelta(minutes=lateness_minutes)
    every_fire = list(schedule.fires(pending, now + timedelta(microseconds=1)))
    on_time = [f for f in every_fire if f >= now - schedule.grace]
    within = [f for f in every_fire if now - schedule.catch_up_window <= f < now - schedule.grace]
    expected = {
        CatchUp.SKIP: on_time,
        CatchUp.ONE: within[-1:] + on_time,
        CatchUp.ALL: within + on_time,
    }[policy]
    made, skipped = _passes(schedule, pending, now)
    assert made == expected
    assert skipped == len(every_fire) - len(made)


def test_every_counts_from_its_start_and_each_fire_has_one_identity() -> None:
    schedule = _every(600, start=datetime(2026, 1, 1, 0, 5, tzinfo=UTC))
    assert schedule.after(datetime(2026, 1, 1, 0, 0, tzinfo=UTC)) == datetime(
        2026, 1, 1, 0, 5, tzinfo=UTC
    )
    assert schedule.after(datetime(2026, 1, 1, 0, 5, tzinfo=UTC)) == datetime(
        2026, 1, 1, 0, 15, tzinfo=UTC
    )
    fire = datetime(2026, 1, 1, 0, 15, tzinfo=UTC)
    assert schedule.event(fire) == InboundEvent(
        scope="t",
        source="clock",
        message_id="s/2026-01-01T00:15:00Z",
        data={"schedule": "s", "fire_time": "2026-01-01T00:15:00Z"},
    )
    assert fire_id("s", fire.astimezone()) == "s/2026-01-01T00:15:00Z"


def test_a_definition_round_trips_through_its_json() -> None:
    for entry in (
        {"cron": "0 9 * * MON-FRI", "timezone": "Europe/Paris", "data": {"report": "daily"}},
        {"every": "PT90S", "start": "2026-02-01T00:00:30+01:00", "catch_up": "all"},
        {"every": "P1DT2H", "catch_up": "one", "catch_up_window": "P2D", "grace": "PT10S"},
    ):
        schedule = Schedule.from_mapping("x", {"source": "s", "scope": "t", **entry})
        again = Schedule.from_mapping("x", schedule.as_json())
        assert again == schedule


@pytest.mark.parametrize(
    ("name", "entry", "says"),
    [
        ("a/b", {"every": "PT1M"}, "letters, digits"),
        ("x", {}, "cron or every"),
        ("x", {"cron": "* * * * *", "every": "PT1M"}, "cron or every"),
        ("x", {"every": "PT0.5S"}, "at least a second"),
        ("x", {"every": "P1M"}, "not a duration"),
        ("x", {"cron": "61 * * * *"}, "minute"),
        ("x", {"cron": "* * * * *", "timezone": "Mars/Olympus"}, "time zone"),
        ("x", {"every": "PT1M", "catch_up": "some"}, "skip, one or all"),
        ("x", {"every": "PT1M", "grace": "PT1H", "catch_up_window": "PT1M"}, "not below"),
        ("x", {"every": "PT1M", "data": {"schedule": 1}}, "'schedule'"),
        ("x", {"every": "PT1M", "data": {"big": "x" * 70_000}}, "characters as JSON"),
        ("x", {"every": "PT1M", "data": [1]}, "must be a table"),
        ("x", {"every": "PT1M", "start": "2026-01-01T00:00:00"}, "offset"),
        ("x", {"every": "PT1M", "paused": "yes"}, "true or false"),
        ("x", {"every": "PT1M", "when": "now"}, "unknown field 'when'"),
    ],
)
def test_a_schedule_that_cannot_work_is_refused_with_a_reason(
    name: str, entry: dict[str, object], says: str
) -> None:
    with pytest.raises(ScheduleError, match=says):
        Schedule.from_mapping(name, {"source": "s", "scope": "t", **entry})


def test_source_and_scope_are_required() -> None:
    with pytest.raises(ScheduleError, match="source is required"):
        Schedule.from_mapping("x", {"every": "PT1M", "scope": "t"})
    with pytest.raises(ScheduleError, match="scope is required"):
        Schedule.from_mapping("x", {"every": "PT1M", "source": "s"})
