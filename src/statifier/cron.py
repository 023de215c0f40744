"""Cron expressions of five fields, and when they fire in a time zone.

A :class:`Cron` is parsed once (:meth:`Cron.parse`) and answers the instants it fires
at: :meth:`Cron.next_after` the first one after an instant, :meth:`Cron.between` every
one in a range (a catch-up after downtime, a backfill), :meth:`Cron.fires` all of them
from an instant on. The fields are those of cron:

=============  ==========  =====================================
field          values      names
=============  ==========  =====================================
minute         0-59
hour           0-23
day of month   1-31
month          1-12        ``JAN``-``DEC``
day of week    0-7         ``SUN``-``SAT`` (0 and 7 are Sunday)
=============  ==========  =====================================

Each field is ``*`` or a comma-separated list of a value, a range ``a-b``, either with a
step (``*/15``, ``1-30/2``; ``5/10`` is ``5-59/10`` in the minute field). When both the
day of month and the day of week are restricted (neither starts with ``*``), a day
matches if either does, as in cron; otherwise both must. ``@yearly`` (``@annually``),
``@monthly``, ``@weekly``, ``@daily`` (``@midnight``) and ``@hourly`` stand for their
usual fields.

The fields are read in the wall-clock time of the time zone given, which its daylight
saving time changes. A wall-clock time a change skips (02:30 on the night clocks go
from 02:00 to 03:00) fires once, at the instant the change ends (03:00); a wall-clock
time a change repeats (01:30 when clocks go back from 02:00 to 01:00) fires once, at
its first occurrence. Every instant answered is an aware UTC datetime on a whole
minute.

>>> from datetime import datetime, UTC
>>> nightly = Cron.parse("30 2 * * *")
>>> nightly.next_after(datetime(2026, 3, 28, 12, 0, tzinfo=UTC), "Europe/Berlin")
datetime.datetime(2026, 3, 29, 1, 0, tzinfo=datetime.timezone.utc)
>>> Cron.parse("0 0 29 2 *").next_after(datetime(2026, 1, 1, tzinfo=UTC), "UTC")
datetime.datetime(2028, 2, 29, 0, 0, tzinfo=datetime.timezone.utc)
>>> Cron.parse("0 0 30 2 *")
Traceback (most recent call last):
...
statifier.cron.CronError: '0 0 30 2 *': never fires (no month has that day)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["MAX_CRON_LENGTH", "Cron", "CronError", "zone"]

MAX_CRON_LENGTH: Final = 200
"""The longest expression :meth:`Cron.parse` reads."""

_MACROS: Final = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS: Final = {
    name: number
    for number, name in enumerate(
        ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"), 1
    )
}
_DAYS: Final = {
    name: number for number, name in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))
}
_LONGEST_MONTH: Final = {
    1: 31,
    2: 29,
    3: 31,
    4: 30,
    5: 31,
    6: 30,
    7: 31,
    8: 31,
    9: 30,
    10: 31,
    11: 30,
    12: 31,
}
_MINUTE: Final = timedelta(minutes=1)
_MARGIN: Final = timedelta(hours=3)
"""More than any change of a wall clock (two hours at most, today)."""
_SEARCH_YEARS: Final = 29
"""How far :meth:`Cron.next_after` looks: past the longest wait a valid expression
has (a 29 February that is also a given weekday comes back within 28 years)."""


class CronError(ValueError):
    """An expression that is not one, or that never fires; ``str()`` says where."""


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    low: int
    high: int
    names: dict[str, int] | None = None


_FIELDS: Final = (
    _Field("minute", 0, 59),
    _Field("hour", 0, 23),
    _Field("day of month", 1, 31),
    _Field("month", 1, 12, _MONTHS),
    _Field("day of week", 0, 7, _DAYS),
)


@dataclass(frozen=True, slots=True)
class Cron:
    """A parsed expression: the values each field allows.

    Attributes:
        text: the expression as given.
        minutes, hours, days, months: the values allowed.
        weekdays: the days of the week allowed, 0 (Sunday) to 6.
        days_restricted, weekdays_restricted: whether the field did not start with
            ``*`` (both restricted: a day matches if either matches).
    """

    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    days_restricted: bool
    weekdays_restricted: bool

    @classmethod
    def parse(cls, text: str) -> Cron:
        """Read ``text`` (five fields, or a macro such as ``@daily``).

        Raises:
            CronError: not five fields, a value out of its field's range, a step of
                0, a range backwards, over :data:`MAX_CRON_LENGTH` characters, or an
                expression that never fires (``0 0 30 2 *``).
        """
        given: object = text  # from a configuration file: any type
        if not isinstance(given, str) or len(given) > MAX_CRON_LENGTH:
            raise CronError(f"a cron expression is a text of at most {MAX_CRON_LENGTH} characters")
        fields = _MACROS.get(text.strip().lower(), text).split()
        if len(fields) != len(_FIELDS):
            raise CronError(
                f"{text!r}: five fields (minute hour day month weekday), not {len(fields)}"
            )
        values = [_values(given, field, text) for given, field in zip(fields, _FIELDS, strict=True)]
        minutes, hours, days, months, weekdays = values
        cron = cls(
            text,
            minutes,
            hours,
            days,
            months,
            frozenset(day % 7 for day in weekdays),
            not fields[2].startswith("*"),
            not fields[4].startswith("*"),
        )
        if not cron.weekdays_restricted and not any(
            day <= _LONGEST_MONTH[month] for day in days for month in months
        ):
            raise CronError(f"{text!r}: never fires (no month has that day)")
        return cron

    def matches_day(self, day: date) -> bool:
        """Whether ``day`` is one the expression fires on (at some hour and minute)."""
        if day.month not in self.months:
            return False
        in_month = day.day in self.days
        in_week = (day.isoweekday() % 7) in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return in_month or in_week
        return in_month and in_week

    def wall_times(self, start: datetime) -> Iterator[datetime]:
        """The wall-clock times the expression names from ``start`` (naive, a wall
        clock's) on, in order, for 29 years (a time zone's changes are
        :meth:`next_after`'s)."""
        times = [
            time(hour, minute) for hour in sorted(self.hours) for minute in sorted(self.minutes)
        ]
        day = start.date()
        last = day + timedelta(days=366 * _SEARCH_YEARS)
        while day <= last:
            if self.matches_day(day):
                for moment in times:
                    wall = datetime.combine(day, moment)
                    if wall >= start:
                        yield wall
            day += timedelta(days=1)

    def fires(self, after: datetime, timezone: str | ZoneInfo = "UTC") -> Iterator[datetime]:
        """The instants after ``after`` (aware) the expression fires at in
        ``timezone`` (a name from the IANA database, or a :class:`~zoneinfo.ZoneInfo`),
        in order, each once, as aware UTC datetimes, for 29 years.

        Raises:
            ValueError: ``after`` is naive.
            CronError: an unknown time zone.
        """
        if after.tzinfo is None or after.utcoffset() is None:
            raise ValueError("a cron's fires are asked after an aware datetime")
        tz = zone(timezone)
        since = after.astimezone(UTC)
        # Start on the wall clock a little before the instant: a change may have set
        # it back, and a repeated wall time fires at its first occurrence.
        start = since.astimezone(tz).replace(tzinfo=None, second=0, microsecond=0) - _MARGIN
        last = None
        for wall in self.wall_times(start):
            fired = _instant(wall, tz)
            # Wall times a change skips all fire at its end: once.
            if fired > since and fired != last:
                last = fired
                yield fired

    def next_after(self, instant: datetime, timezone: str | ZoneInfo = "UTC") -> datetime:
        """The first instant after ``instant`` (aware) the expression fires at in
        ``timezone``, as an aware UTC datetime (see :meth:`fires`).

        Raises:
            ValueError: ``instant`` is naive.
            CronError: an unknown time zone, or no fire within 29 years (an
                expression whose days of the week and month never meet in its months).
        """
        for fired in self.fires(instant, timezone):
            return fired
        raise CronError(f"{self.text!r}: does not fire within {_SEARCH_YEARS} years")

    def between(
        self, start: datetime, end: datetime, timezone: str | ZoneInfo = "UTC"
    ) -> Iterator[datetime]:
        """The instants in ``(start, end]`` the expression fires at, in order (aware
        UTC datetimes): a catch-up after downtime, a backfill. One pass over the
        wall-clock times, much cheaper than :meth:`next_after` asked again for each.

        >>> hourly = Cron.parse("0 * * * *")
        >>> start = datetime(2026, 10, 24, 23, 30, tzinfo=UTC)
        >>> [f.isoformat() for f in hourly.between(start, start + timedelta(hours=2))]
        ['2026-10-25T00:00:00+00:00', '2026-10-25T01:00:00+00:00']
        >>> sum(1 for _ in Cron.parse("*/5 * * * *").between(start, start + timedelta(days=7)))
        2016

        Raises:
            ValueError: a naive ``start`` or ``end``.
            CronError: an unknown time zone.
        """
        if end.tzinfo is None or end.utcoffset() is None:
            raise ValueError("between takes aware datetimes")
        for fired in self.fires(start, timezone):
            if fired > end:
                return
            yield fired


def zone(timezone: str | ZoneInfo) -> ZoneInfo:
    """``timezone`` as a :class:`~zoneinfo.ZoneInfo`.

    Raises:
        CronError: a name the IANA database does not know.
    """
    if isinstance(timezone, ZoneInfo):
        return timezone
    try:
        return ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise CronError(f"unknown time zone {timezone!r}") from None


def _values(given: str, field: _Field, text: str) -> frozenset[int]:
    allowed: set[int] = set()
    for item in given.split(","):
        allowed.update(_item(item, field, text))
    return frozenset(allowed)


def _item(item: str, field: _Field, text: str) -> range:
    body, slash, step_text = item.partition("/")
    step = 1
    if slash:
        if not step_text.isdigit() or int(step_text) == 0:
            raise CronError(
                f"{text!r}: the {field.name} step {step_text!r} is not a whole number of at least 1"
            )
        step = int(step_text)
    if body == "*":
        low, high = field.low, field.high
    else:
        first, dash, last = body.partition("-")
        low = _value(first, field, text)
        high = _value(last, field, text) if dash else (field.high if slash else low)
        if high < low:
            raise CronError(f"{text!r}: the {field.name} range {body!r} runs backwards")
    return range(low, high + 1, step)


def _value(token: str, field: _Field, text: str) -> int:
    named = None if field.names is None else field.names.get(token.upper())
    if named is not None:
        return named
    if not token.isdigit() or not field.low <= int(token) <= field.high:
        raise CronError(f"{text!r}: {token!r} is not a {field.name} ({field.low}-{field.high})")
    return int(token)


def _instant(wall: datetime, tz: ZoneInfo) -> datetime:
    """The instant a wall-clock time names in ``tz``: its first occurrence when a
    change repeats it, the end of the change when a change skips it."""
    first = wall.replace(tzinfo=tz, fold=0)
    if first.astimezone(UTC).astimezone(tz).replace(tzinfo=None) == wall:
        return first.astimezone(UTC)
    # Skipped: fold=0 reads it with the offset before the change, which lands after
    # the change, and fold=1 with the offset after it, which lands before: the change
    # is the first whole minute between the two that has the later offset.
    late = first.astimezone(UTC)
    early = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    offset = late.astimezone(tz).utcoffset()
    moment = early.replace(second=0, microsecond=0)
    while moment < late and moment.astimezone(tz).utcoffset() != offset:
        moment += _MINUTE
    return moment
