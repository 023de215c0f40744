"""Cron expressions: what they parse to, what they refuse, and when they fire, in time
zones whose clocks change (a skipped hour fires once at its end, a repeated one once
at its first occurrence), on leap days, and, for any expression and instant drawn, at
exactly the minutes a plain walk over every minute finds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statifier.cron import MAX_CRON_LENGTH, Cron, CronError


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def test_fields_lists_ranges_steps_names_and_macros() -> None:
    cron = Cron.parse("*/15 9-17/4 1,15 JAN-mar mon-FRI")
    assert cron.minutes == {0, 15, 30, 45}
    assert cron.hours == {9, 13, 17}
    assert cron.days == {1, 15}
    assert cron.months == {1, 2, 3}
    assert cron.weekdays == {1, 2, 3, 4, 5}
    assert Cron.parse("5/20 * * * 7").minutes == {5, 25, 45}
    assert Cron.parse("0 0 * * 7").weekdays == {0}  # 7 is Sunday, as 0 is
    assert Cron.parse("@daily").minutes == {0}
    assert Cron.parse("@hourly").hours == frozenset(range(24))
    assert Cron.parse("@weekly").weekdays == {0}


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("* * * *", "five fields"),
        ("* * * * * *", "five fields"),
        ("60 * * * *", "'60' is not a minute (0-59)"),
        ("* 24 * * *", "'24' is not a hour (0-23)"),
        ("* * 0 * *", "'0' is not a day of month (1-31)"),
        ("* * * 13 *", "'13' is not a month (1-12)"),
        ("* * * * 8", "'8' is not a day of week (0-7)"),
        ("*/0 * * * *", "step '0' is not a whole number of at least 1"),
        ("10-5 * * * *", "range '10-5' runs backwards"),
        ("* * * FOO *", "'FOO' is not a month"),
        ("-1 * * * *", "'' is not a minute"),
        ("0 0 31 4,6 *", "never fires"),
        ("0 0 30 2 *", "never fires"),
    ],
)
def test_what_is_not_an_expression_is_refused_with_where(text: str, said: str) -> None:
    with pytest.raises(CronError, match=None) as refused:
        Cron.parse(text)
    assert said in str(refused.value)


def test_a_long_text_and_an_unknown_zone_and_a_naive_instant_are_refused() -> None:
    with pytest.raises(CronError, match=f"at most {MAX_CRON_LENGTH}"):
        Cron.parse("0," * MAX_CRON_LENGTH + "0 * * * *")
    with pytest.raises(CronError, match="unknown time zone 'Mars/Olympus'"):
        Cron.parse("@daily").next_after(utc(2026, 1, 1), "Mars/Olympus")
    with pytest.raises(ValueError, match="aware"):
        Cron.parse("@daily").next_after(datetime(2026, 1, 1))  # noqa: DTZ001 - the point


def test_a_day_of_month_and_a_day_of_week_both_given_match_either() -> None:
    friday_or_13th = Cron.parse("0 12 13 * FRI")
    fires = list(friday_or_13th.between(utc(2026, 2, 1), utc(2026, 2, 28)))
    assert [fired.day for fired in fires] == [6, 13, 20, 27]  # 13 Feb 2026 is a Friday
    only_fridays = Cron.parse("0 12 * * FRI")
    assert [f.day for f in only_fridays.between(utc(2026, 3, 1), utc(2026, 3, 31))] == [
        6,
        13,
        20,
        27,
    ]
    thirteenth_or_monday = Cron.parse("0 12 13 3 MON")
    days = [f.day for f in thirteenth_or_monday.between(utc(2026, 3, 1), utc(2026, 3, 31))]
    assert days == [2, 9, 13, 16, 23, 30]


def test_leap_days() -> None:
    leap = Cron.parse("0 0 29 2 *")
    assert leap.next_after(utc(2026, 1, 1)) == utc(2028, 2, 29)
    assert leap.next_after(utc(2096, 3, 1)) == utc(2104, 2, 29)  # 2100 is no leap year
    # 29 February, or a Monday of February: the first Monday of February 2027.
    assert Cron.parse("0 0 29 2 1").next_after(utc(2026, 3, 1)) == utc(2027, 2, 1)


def test_a_wall_time_the_clocks_skip_fires_once_at_the_end_of_the_change() -> None:
    # Berlin, 29 March 2026: 02:00 CET becomes 03:00 CEST (01:00 UTC).
    nightly = Cron.parse("30 2 * * *")
    assert nightly.next_after(utc(2026, 3, 28, 12), "Europe/Berlin") == utc(2026, 3, 29, 1)
    assert nightly.next_after(utc(2026, 3, 29, 1), "Europe/Berlin") == utc(2026, 3, 30, 0, 30)
    quarterly = Cron.parse("*/15 * * * *")
    fires = list(
        quarterly.between(utc(2026, 3, 29, 0, 30), utc(2026, 3, 29, 1, 30), "Europe/Berlin")
    )
    # 02:00, 02:15, 02:30 and 02:45 are skipped: one fire at 03:00 stands for them.
    assert fires == [
        utc(2026, 3, 29, 0, 45),
        utc(2026, 3, 29, 1, 0),
        utc(2026, 3, 29, 1, 15),
        utc(2026, 3, 29, 1, 30),
    ]
    # New York, 8 March 2026: 02:00 EST becomes 03:00 EDT (07:00 UTC).
    two = Cron.parse("0 2 * * *")
    assert two.next_after(utc(2026, 3, 7, 12), "America/New_York") == utc(2026, 3, 8, 7)


def test_a_wall_time_the_clocks_repeat_fires_once_at_its_first_occurrence() -> None:
    # Berlin, 25 October 2026: 03:00 CEST becomes 02:00 CET (01:00 UTC); 02:xx twice.
    nightly = Cron.parse("30 2 * * *")
    assert nightly.next_after(utc(2026, 10, 24, 12), "Europe/Berlin") == utc(2026, 10, 25, 0, 30)
    assert nightly.next_after(utc(2026, 10, 25, 0, 30), "Europe/Berlin") == utc(2026, 10, 26, 1, 30)
    half_hourly = Cron.parse("*/30 * * * *")
    fires = list(
        half_hourly.between(utc(2026, 10, 24, 23, 30), utc(2026, 10, 25, 2, 30), "Europe/Berlin")
    )
    assert fires == [
        utc(2026, 10, 25, 0, 0),  # 02:00 CEST
        utc(2026, 10, 25, 0, 30),  # 02:30 CEST; 02:00 and 02:30 CET have fired already
        utc(2026, 10, 25, 2, 0),  # 03:00 CET
        utc(2026, 10, 25, 2, 30),
    ]


def test_a_half_hour_change_and_a_zone_ahead_of_utc() -> None:
    # Lord Howe, 4 October 2026: 02:00 becomes 02:30 (+10:30 to +11, 15:30 UTC the day before).
    assert Cron.parse("15 2 * * *").next_after(utc(2026, 10, 3, 12), "Australia/Lord_Howe") == utc(
        2026, 10, 3, 15, 30
    )
    # Kolkata never changes; +05:30.
    assert Cron.parse("0 9 * * *").next_after(utc(2026, 1, 1), "Asia/Kolkata") == utc(
        2026, 1, 1, 3, 30
    )
    # Strictly after: 09:00 in Tokyo is midnight UTC, so from then the next day's.
    morning = Cron.parse("0 9 * * *")
    assert morning.next_after(utc(2025, 12, 31, 23), ZoneInfo("Asia/Tokyo")) == utc(2026, 1, 1)
    assert morning.next_after(utc(2026, 1, 1), ZoneInfo("Asia/Tokyo")) == utc(2026, 1, 2)


def _crons() -> st.SearchStrategy[str]:
    def field(low: int, high: int) -> st.SearchStrategy[str]:
        value = st.integers(low, high).map(str)
        span = st.tuples(st.integers(low, high), st.integers(low, high)).map(
            lambda pair: f"{min(pair)}-{max(pair)}"
        )
        step = st.tuples(st.sampled_from(["*", f"{low}"]), st.integers(1, high - low + 1)).map(
            lambda pair: f"{pair[0]}/{pair[1]}"
        )
        one = st.one_of(st.just("*"), value, span, step)
        return st.lists(one, min_size=1, max_size=3).map(",".join)

    return st.tuples(field(0, 59), field(0, 23), field(1, 28), field(1, 12), field(0, 6)).map(
        " ".join
    )


NAIVE_FROM = datetime(2020, 1, 1)  # noqa: DTZ001 - hypothesis draws naive, made UTC below
NAIVE_UNTIL = datetime(2030, 12, 31)  # noqa: DTZ001
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"]


def _matches(cron: Cron, wall: datetime) -> bool:
    return wall.minute in cron.minutes and wall.hour in cron.hours and cron.matches_day(wall.date())


@settings(max_examples=80, deadline=None)
@given(
    text=_crons(),
    start=st.datetimes(min_value=NAIVE_FROM, max_value=NAIVE_UNTIL),
    timezone=st.sampled_from(ZONES),
)
def test_a_fire_is_the_first_minute_after_the_instant_whose_wall_time_matches(
    text: str, start: datetime, timezone: str
) -> None:
    cron = Cron.parse(text)
    after = start.replace(tzinfo=UTC)
    fired = cron.next_after(after, timezone)
    assert fired > after
    assert (fired.second, fired.microsecond) == (0, 0)
    tz = ZoneInfo(timezone)
    wall = fired.astimezone(tz).replace(tzinfo=None)
    changed = (fired - timedelta(minutes=1)).astimezone(tz).utcoffset() != fired.astimezone(
        tz
    ).utcoffset()
    # It fires where its wall time matches, or at the end of a change a match fell in.
    assert _matches(cron, wall) or changed
    # Nothing matched in between, minute by minute (a wall time seen before does not
    # fire again when a change repeats it), within a bounded walk.
    moment = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
    seen = {
        m.astimezone(tz).replace(tzinfo=None) for m in _minutes(after - timedelta(hours=3), after)
    }
    for _ in range(3 * 24 * 60):
        if moment >= fired:
            break
        local = moment.astimezone(tz).replace(tzinfo=None)
        assert not (_matches(cron, local) and local not in seen), (text, timezone, moment)
        seen.add(local)
        moment += timedelta(minutes=1)


def _minutes(start: datetime, end: datetime) -> list[datetime]:
    moment = start.replace(second=0, microsecond=0)
    found = []
    while moment <= end:
        found.append(moment)
        moment += timedelta(minutes=1)
    return found


@settings(max_examples=30, deadline=None)
@given(
    text=_crons(),
    start=st.datetimes(min_value=NAIVE_FROM, max_value=NAIVE_UNTIL),
    timezone=st.sampled_from(ZONES),
)
def test_between_is_next_after_repeated(text: str, start: datetime, timezone: str) -> None:
    cron = Cron.parse(text)
    after = start.replace(tzinfo=UTC)
    end = after + timedelta(days=2)
    listed = list(cron.between(after, end, timezone))
    walked = []
    moment = after
    while True:
        moment = cron.next_after(moment, timezone)
        if moment > end:
            break
        walked.append(moment)
    assert listed == walked
    assert listed == sorted(set(listed))
