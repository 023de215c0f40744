"""``value::type``: total conversions between the seven scalar types.

A conversion that cannot produce the target type gives undefined, never an error;
undefined casts to undefined. There is no bridge between booleans and numbers, and
lists, maps and null convert to nothing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import date, datetime
from typing import Final

from statifier.expr import durations
from statifier.expr.lexer import parse_date, parse_datetime
from statifier.expr.semantics import format_number
from statifier.expr.values import (
    UNDEFINED,
    Duration,
    Undefined,
    Value,
    format_datetime,
    midnight_utc,
    to_utc,
)

__all__ = ["cast"]

_INTEGER: Final = re.compile(r"-?[0-9]+")
_FLOAT: Final = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")


def _to_integer(value: Value) -> Value:
    kind = type(value)
    if kind is int:
        return value
    if kind is float:
        return int(value) if math.isfinite(value) else UNDEFINED
    if kind is str and _INTEGER.fullmatch(value):
        try:
            return int(value)
        except ValueError:  # past the interpreter's integer-parsing limit
            return UNDEFINED
    return UNDEFINED


def _to_float(value: Value) -> Value:
    kind = type(value)
    if kind is float:
        return value
    if kind is int:
        try:
            return float(value)
        except OverflowError:
            return UNDEFINED
    if kind is str and _FLOAT.fullmatch(value):
        return float(value)
    return UNDEFINED


def _to_string(value: Value) -> Value:
    kind = type(value)
    if kind is str:
        return value
    if kind is int and -(10**18) < value < 10**18:
        return str(value)
    if kind is float and not math.isfinite(value):
        return UNDEFINED
    if kind is int or kind is float:
        try:
            return format_number(value)
        except ValueError:  # past the interpreter's integer-printing limit
            return UNDEFINED
    if kind is bool:
        return "true" if value else "false"
    if kind is date:
        return value.isoformat()
    if kind is datetime:
        return format_datetime(value)
    if kind is Duration:
        return str(value)
    return UNDEFINED


def _to_boolean(value: Value) -> Value:
    if type(value) is bool:
        return value
    if value == "true" and type(value) is str:
        return True
    if value == "false" and type(value) is str:
        return False
    return UNDEFINED


def _to_date(value: Value) -> Value:
    kind = type(value)
    if kind is date:
        return value
    if kind is datetime:
        return to_utc(value).date()
    if kind is str:
        parsed = parse_date(value)
        return UNDEFINED if parsed is None else parsed
    return UNDEFINED


def _to_datetime(value: Value) -> Value:
    kind = type(value)
    if kind is datetime:
        return to_utc(value)
    if kind is date:
        return midnight_utc(value)
    if kind is str:
        parsed = parse_datetime(value)
        return UNDEFINED if parsed is None else parsed
    return UNDEFINED


def _to_duration(value: Value) -> Value:
    kind = type(value)
    if kind is Duration:
        return value
    if kind is str:
        parsed = durations.parse(value)
        return UNDEFINED if parsed is None else parsed
    return UNDEFINED


CONVERTERS: Final[dict[str, Callable[[Value], Value]]] = {
    "integer": _to_integer,
    "float": _to_float,
    "string": _to_string,
    "boolean": _to_boolean,
    "date": _to_date,
    "datetime": _to_datetime,
    "duration": _to_duration,
}


def cast(value: Value, type_name: str) -> Value:
    """Convert ``value`` to ``type_name`` (one of the seven scalar type names).

    >>> cast("42", "integer"), cast("42\\n", "integer"), cast(-1.5, "integer")
    (42, UNDEFINED, -1)
    >>> cast("2026-08-09", "date").isoformat()
    '2026-08-09'
    """
    if type(value) is Undefined:
        return value
    return CONVERTERS[type_name](value)
