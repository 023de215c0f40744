"""The tagged JSON encoding of values, as used by the conformance corpus.

Plain JSON carries integers, floats, strings, booleans, lists, maps and null as
themselves. The four values JSON cannot tell apart from those are objects with a
``$type`` key::

    {"$type": "undefined"}
    {"$type": "date", "value": "2026-08-06"}
    {"$type": "datetime", "value": "2026-08-06T12:00:00Z"}
    {"$type": "duration", "value": {"years": 0, ..., "milliseconds": 0}}

>>> from datetime import date
>>> encode([date(2026, 8, 6), UNDEFINED])
[{'$type': 'date', 'value': '2026-08-06'}, {'$type': 'undefined'}]
>>> decode({"$type": "duration", "value": {"days": 3}})
Duration(years=0, months=0, weeks=0, days=3, hours=0, minutes=0, seconds=0, milliseconds=0)
"""

from __future__ import annotations

from datetime import date, datetime

from statifier.expr.lexer import parse_date, parse_datetime
from statifier.expr.values import (
    DURATION_UNITS,
    UNDEFINED,
    Duration,
    Undefined,
    Value,
    format_datetime,
)

__all__ = ["TaggedValueError", "decode", "encode"]


class TaggedValueError(ValueError):
    """The JSON is not a valid tagged encoding."""


def encode(value: Value) -> object:
    """A JSON-ready form of ``value``.

    Raises:
        TaggedValueError: a map carries its own ``"$type"`` key (it would decode
            wrongly), or a value outside the language's domain.
    """
    kind = type(value)
    if kind is dict:
        if "$type" in value:
            raise TaggedValueError("a map with a '$type' key cannot be encoded unambiguously")
        return {str(key): encode(item) for key, item in value.items()}
    if kind is list:
        return [encode(item) for item in value]
    if kind is Undefined:
        return {"$type": "undefined"}
    if kind is datetime:
        return {"$type": "datetime", "value": format_datetime(value)}
    if kind is date:
        return {"$type": "date", "value": value.isoformat()}
    if kind is Duration:
        components = value.as_dict()
        if not components["milliseconds"]:
            del components["milliseconds"]
        return {"$type": "duration", "value": components}
    if value is None or kind in (bool, int, float, str):
        return value
    raise TaggedValueError(f"{kind.__name__} is not a value of the language")


def decode(data: object) -> Value:
    """The value a tagged JSON form stands for.

    Raises:
        TaggedValueError: an unknown ``$type`` or a malformed tagged value.
    """
    if isinstance(data, list):
        return [decode(item) for item in data]
    if not isinstance(data, dict):
        return data
    if "$type" not in data:
        return {key: decode(item) for key, item in data.items()}
    tag, raw = data["$type"], data.get("value")
    if tag == "undefined":
        return UNDEFINED
    if tag == "date" and isinstance(raw, str) and (day := parse_date(raw)) is not None:
        return day
    if tag == "datetime" and isinstance(raw, str) and (moment := parse_datetime(raw)) is not None:
        return moment
    if (
        tag == "duration"
        and isinstance(raw, dict)
        and set(raw) <= set(DURATION_UNITS)
        and all(type(amount) is int for amount in raw.values())
    ):
        return Duration(**raw)
    raise TaggedValueError(f"malformed tagged value: {data!r}")
