"""Durations: literal units, the string canonicaliser, and date arithmetic.

The arithmetic follows the language's fixed approximations (a month is 30 days, a
year 365 days) rather than calendar arithmetic, so results never depend on which
month a date falls in.
"""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta
from fractions import Fraction
from typing import Final

from statifier.expr.values import Duration

__all__ = [
    "UNIT_FIELDS",
    "add_to_date",
    "add_to_datetime",
    "build",
    "parse",
]

# Every spelling a duration unit may take, mapped to the Duration field it sets.
UNIT_FIELDS: Final[dict[str, str]] = {
    "y": "years",
    "year": "years",
    "years": "years",
    "mo": "months",
    "month": "months",
    "months": "months",
    "w": "weeks",
    "week": "weeks",
    "weeks": "weeks",
    "d": "days",
    "day": "days",
    "days": "days",
    "h": "hours",
    "hour": "hours",
    "hours": "hours",
    "m": "minutes",
    "min": "minutes",
    "minute": "minutes",
    "minutes": "minutes",
    "s": "seconds",
    "sec": "seconds",
    "second": "seconds",
    "seconds": "seconds",
    "ms": "milliseconds",
    "millisecond": "milliseconds",
    "milliseconds": "milliseconds",
}

_MS_PER: Final[dict[str, int]] = {
    "years": 365 * 86_400_000,
    "months": 30 * 86_400_000,
    "weeks": 7 * 86_400_000,
    "days": 86_400_000,
    "hours": 3_600_000,
    "minutes": 60_000,
    "seconds": 1_000,
    "milliseconds": 1,
}

# A fractional remainder is spread over these units only, largest first: it never
# climbs back into weeks, months or years.
_REMAINDER_FIELDS: Final = ("days", "hours", "minutes", "seconds", "milliseconds")


def expand(number: str, field: str) -> dict[str, int] | None:
    """Expand ``number`` of unit ``field`` into whole components.

    ``number`` is decimal text, optionally with a fraction (``"1.5"``). Returns the
    components to add, or ``None`` when the fraction is not a whole number of
    milliseconds.

    >>> expand("1.5", "seconds")
    {'seconds': 1, 'milliseconds': 500}
    >>> expand("0.5", "months")
    {'days': 15}
    >>> expand("0.5", "milliseconds") is None
    True
    """
    whole_text, _, fraction_text = number.partition(".")
    parts: dict[str, int] = {}
    whole = int(whole_text)
    if whole or not fraction_text:
        parts[field] = whole
    if fraction_text:
        remainder = Fraction(int(fraction_text), 10 ** len(fraction_text)) * _MS_PER[field]
        if remainder.denominator != 1:
            return None
        left = int(remainder)
        for name in _REMAINDER_FIELDS:
            amount, left = divmod(left, _MS_PER[name])
            if amount:
                parts[name] = parts.get(name, 0) + amount
    return parts


def build(components: dict[str, int]) -> Duration:
    """A Duration from a field-to-amount mapping (missing fields are zero)."""
    return Duration(**components)


_STRING_FORM: Final = re.compile(r"(?:[0-9]+(?:\.[0-9]+)?(?:ms|mo|y|w|d|h|m|s))+")
_STRING_PAIR: Final = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|mo|y|w|d|h|m|s)")


def parse(text: str) -> Duration | None:
    """Parse the ``::duration`` string form, or return ``None``.

    Units may come in any order and repeat; repeated units accumulate.

    >>> str(parse("30m3d"))
    '3d30m'
    >>> str(parse("1.5s200ms"))
    '1s700ms'
    >>> parse("1d ") is None
    True
    """
    if _STRING_FORM.fullmatch(text) is None:
        return None
    totals: dict[str, int] = {}
    try:
        for match in _STRING_PAIR.finditer(text):
            parts = expand(match.group(1), UNIT_FIELDS[match.group(2)])
            if parts is None:
                return None
            for name, amount in parts.items():
                totals[name] = totals.get(name, 0) + amount
    except ValueError:  # a number past the interpreter's integer-parsing limit
        return None
    return build(totals)


def _whole_days(duration: Duration) -> int:
    clock_seconds = duration.hours * 3_600 + duration.minutes * 60 + duration.seconds
    return (
        duration.days
        + duration.weeks * 7
        + duration.months * 30
        + duration.years * 365
        + int(clock_seconds / 86_400)
    )


def add_to_date(day: date, duration: Duration, sign: int) -> date:
    """Shift a date by whole days; the clock part counts only in complete days.

    Raises:
        OverflowError: the result falls outside the representable years 1 to 9999.
    """
    return day + timedelta(days=sign * _whole_days(duration))


def add_to_datetime(moment: datetime, duration: Duration, sign: int) -> datetime:
    """Shift a datetime by the duration's length in milliseconds.

    Raises:
        OverflowError: the result falls outside the representable years 1 to 9999.
    """
    return moment + timedelta(milliseconds=sign * duration.total_milliseconds())
