"""The value domain of the expression language.

Values are plain Python objects, so a context built from ``json.loads`` output can be
evaluated without conversion:

============  ==========================================================
language      Python
============  ==========================================================
integer       ``int`` (never ``bool``)
float         ``float``
string        ``str``
boolean       ``bool``
list          ``list``
map           ``dict`` with ``str`` keys
date          ``datetime.date``
datetime      ``datetime.datetime``, timezone-aware, normalised to UTC
duration      :class:`Duration`
null          ``None``
undefined     :data:`UNDEFINED`
============  ==========================================================

``null`` and ``undefined`` are distinct: ``null`` is a value that is present and
empty, ``undefined`` is the absence of a value (a missing key, a failed cast).

>>> UNDEFINED is Undefined.instance()
True
>>> type_name(3), type_name(True), type_name(None), type_name(UNDEFINED)
('integer', 'boolean', 'null', 'undefined')
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any, Final, TypeAlias

if TYPE_CHECKING:
    from statifier.expr.errors import Span

__all__ = [
    "UNDEFINED",
    "Duration",
    "Undefined",
    "Value",
    "format_datetime",
    "is_undefined",
    "midnight_utc",
    "to_utc",
    "type_name",
]


class Undefined:
    """The type of :data:`UNDEFINED`, the absent value.

    Every ``Undefined`` compares equal to every other and is falsy in Python. The
    evaluator internally uses instances that remember which unbound root variable
    produced them, so that an undefined result can be reported as an
    ``UndefinedVariableError`` naming that variable; such instances never leave the
    evaluator: results, containers and host function arguments only ever hold the
    :data:`UNDEFINED` singleton.
    """

    __slots__ = ("root", "span")

    _instance: Undefined | None = None

    def __init__(self, root: str | None = None, span: Span | None = None) -> None:
        self.root = root
        self.span = span

    @classmethod
    def instance(cls) -> Undefined:
        """Return the shared :data:`UNDEFINED` singleton."""
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def __repr__(self) -> str:
        return "UNDEFINED"

    def __bool__(self) -> bool:
        return False

    def __eq__(self, other: object) -> bool:
        return type(other) is Undefined

    def __hash__(self) -> int:
        return hash(Undefined)

    def __reduce__(self) -> str:
        return "UNDEFINED"


UNDEFINED: Final[Undefined] = Undefined.instance()


def is_undefined(value: object) -> bool:
    """Answer whether ``value`` is the undefined value."""
    return type(value) is Undefined


DURATION_UNITS: Final = (
    "years",
    "months",
    "weeks",
    "days",
    "hours",
    "minutes",
    "seconds",
    "milliseconds",
)


@dataclass(frozen=True, slots=True)
class Duration:
    """A calendar-free span of time with eight independent components.

    Components are kept as written (``90m`` stays 90 minutes). Arithmetic against
    dates uses the language's fixed approximations: a month is 30 days and a year
    365 days.

    >>> Duration(days=3, hours=2).total_milliseconds()
    266400000
    >>> str(Duration(weeks=2, days=3))
    '2w3d'
    """

    years: int = 0
    months: int = 0
    weeks: int = 0
    days: int = 0
    hours: int = 0
    minutes: int = 0
    seconds: int = 0
    milliseconds: int = 0

    def total_seconds(self) -> int:
        """The whole seconds this duration spans, ignoring milliseconds."""
        return (
            self.seconds
            + self.minutes * 60
            + self.hours * 3_600
            + self.days * 86_400
            + self.weeks * 604_800
            + self.months * 2_592_000
            + self.years * 31_536_000
        )

    def total_milliseconds(self) -> int:
        """The milliseconds this duration spans."""
        return self.total_seconds() * 1_000 + self.milliseconds

    def as_dict(self) -> dict[str, int]:
        """All eight components by name, zeros included."""
        return {unit: getattr(self, unit) for unit in DURATION_UNITS}

    def __str__(self) -> str:
        parts = [
            f"{getattr(self, unit)}{suffix}"
            for unit, suffix in zip(DURATION_UNITS, _SUFFIXES, strict=True)
            if getattr(self, unit) > 0
        ]
        return "".join(parts) or "0s"


_SUFFIXES: Final = ("y", "mo", "w", "d", "h", "m", "s", "ms")

# A value of the language. Kept as ``Any`` at this level because lists and maps nest
# arbitrarily; the table in the module docstring is the contract.
Value: TypeAlias = Any

_TYPE_NAMES: Final[dict[type, str]] = {
    int: "integer",
    float: "float",
    str: "string",
    bool: "boolean",
    list: "list",
    dict: "map",
    date: "date",
    datetime: "datetime",
    Duration: "duration",
    type(None): "null",
    Undefined: "undefined",
}


def type_name(value: object) -> str:
    """The language's name for the type of ``value`` (``"unknown"`` outside the domain)."""
    return _TYPE_NAMES.get(type(value), "unknown")


def to_utc(moment: datetime) -> datetime:
    """Normalise a datetime to UTC; a naive datetime is taken to be UTC already."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    if moment.utcoffset():
        return moment.astimezone(UTC)
    return moment


def midnight_utc(day: date) -> datetime:
    """The first instant of ``day`` in UTC: how a date meets a datetime."""
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def format_datetime(moment: datetime) -> str:
    """ISO 8601 in UTC with ``Z``; six fraction digits when the fraction is not zero.

    >>> from datetime import UTC
    >>> format_datetime(datetime(2026, 8, 9, 12, 0, 0, 500000, tzinfo=UTC))
    '2026-08-09T12:00:00.500000Z'
    """
    moment = to_utc(moment)
    # isoformat, unlike strftime("%Y"), always writes four digits of year.
    text = moment.replace(microsecond=0, tzinfo=None).isoformat()
    if moment.microsecond:
        text += f".{moment.microsecond:06d}"
    return text + "Z"
