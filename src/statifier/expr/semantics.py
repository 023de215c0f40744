"""What each operator does to values: the language's rules in one place.

Functions here take already-evaluated operands and either return a value or raise
:class:`Fail` carrying an error value; the compiler wraps them in closures and the
evaluation entry points turn ``Fail`` back into a returned error. Integers and
booleans are kept apart everywhere (``type(x) is int``), since Python's ``bool`` is
an ``int``.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from datetime import date, datetime
from typing import Any, Final

from statifier.expr import durations
from statifier.expr.errors import (
    EvaluationError,
    ExprError,
    Span,
    TypeMismatchError,
    UndefinedVariableError,
)
from statifier.expr.values import (
    UNDEFINED,
    Duration,
    Undefined,
    Value,
    midnight_utc,
    to_utc,
    type_name,
)

__all__ = [
    "Fail",
    "add",
    "compare",
    "divide",
    "format_number",
    "loose_equal",
    "membership",
    "mismatch",
    "modulo",
    "multiply",
    "negate",
    "strict_equal",
    "subtract",
]

MAX_COLLECTION: Final = 1_000_000
"""Longest string or list an operator may build; beyond it evaluation fails."""

MAX_INT_BITS: Final = 65_536
"""Widest integer multiplication or exponentiation may produce."""


class Fail(Exception):  # noqa: N818 - internal control flow, never escapes evaluation
    """Internal: unwinds evaluation carrying the error value to return."""

    __slots__ = ("error",)

    def __init__(self, error: ExprError) -> None:
        self.error = error


# How a message names each operation the corpus names by an opcode or an internal
# word: as the source writes it. ``and``, ``or`` and ``not`` are named by the spelling
# the source used (``&&``, ``AND``...), which the compiler passes in ``shown``.
_SHOWN: Final[Mapping[str, str]] = {
    "add": "'+'",
    "subtract": "'-'",
    "multiply": "'*'",
    "divide": "'/'",
    "modulo": "'%'",
    "unary_minus": "unary '-'",
    "unary_bang": "'!'",
    "logical_not": "'not'",
    "jump_if_falsy_or_pop": "'and'",
    "jump_if_true_or_pop": "'or'",
    "pop_jump_if_falsy": "a condition",
    "in": "'in'",
    "contains": "'contains'",
}

# What each operation expects, in words (``expected`` keeps the token).
_EXPECTED: Final[Mapping[tuple[str, str], str]] = {
    ("add", "number_or_string"): "numbers or strings",
    ("subtract", "number_or_date"): "numbers or dates",
    ("multiply", "number"): "numbers",
    ("divide", "number"): "numbers",
    ("modulo", "number"): "integers",
    ("in", "list"): "a list on its right",
    ("contains", "list"): "a list on its left",
}

_ARTICLES: Final[Mapping[str, str]] = {
    "integer": "an integer",
    "null": "null",
    "undefined": "undefined",
    "unknown": "a value of no type of the language",
}


def with_article(type_word: str) -> str:
    """``type_word`` with its article: ``an integer``, ``a string``, ``null``."""
    return _ARTICLES.get(type_word, f"a {type_word}")


def mismatch(
    operation: str, expected: str, got: Value, span: Span | None, shown: str | None = None
) -> Fail:
    """The failure for an operand of the wrong type.

    ``operation`` is the reason token (the corpus's); the message names the operator
    as the source wrote it: ``shown`` if given (``'&&'``), else the operator the token
    stands for. An undefined operand that came from an unbound root variable is
    reported as an UndefinedVariableError naming that variable, at the variable's own
    position.
    """
    if type(got) is Undefined and got.root is not None:
        return Fail(
            UndefinedVariableError(
                "unbound_variable",
                f"Undefined variable: {got.root}",
                got.span,
                variable=got.root,
            )
        )
    name = type_name(got)
    return Fail(
        TypeMismatchError(
            operation,
            _mismatch_message(operation, expected, name, shown),
            span,
            expected=expected,
            got=name,
        )
    )


def _mismatch_message(operation: str, expected: str, got: str, shown: str | None) -> str:
    if operation == "bracket_access":
        if expected == "integer":
            return f"a list index must be an integer, got {with_article(got)}"
        return f"a map key must be a string, an integer or a boolean, got {with_article(got)}"
    if operation == "store":
        target = "a key in an assignment's target"
        return f"{target} must be a string or an integer, got {with_article(got)}"
    if operation == "pop_jump_if_falsy":
        where = f"the condition of {shown}" if shown else "a condition"
        return f"{where} must be a boolean, got {with_article(got)}"
    words = _EXPECTED.get((operation, expected)) or with_article(expected)
    return f"{shown or _SHOWN.get(operation, operation)} expects {words}, got {with_article(got)}"


def failure(reason: str, message: str, span: Span | None, code: str = "") -> Fail:
    """An EvaluationError wrapped for raising (``code``: its stable token, if it is not
    the reason)."""
    return Fail(EvaluationError(reason, message, span, code=code))


def _is_number(value: Value) -> bool:
    kind = type(value)
    return kind is int or kind is float


def format_number(value: int | float) -> str:
    """Decimal text for a number; floats in shortest round-trip form (``1.0e20``)."""
    if type(value) is int:
        return str(value)
    text = repr(value)
    if "e" in text:
        mantissa, _, exponent = text.partition("e")
        if "." not in mantissa:
            mantissa += ".0"
        text = f"{mantissa}e{int(exponent)}"
    return text


def check_size(value: str | list[Value], span: Span | None) -> None:
    """Refuse a string or list longer than :data:`MAX_COLLECTION`."""
    if len(value) > MAX_COLLECTION:
        raise failure("result_too_large", f"Result longer than {MAX_COLLECTION} elements", span)


# -- equality and ordering ------------------------------------------------------------


def strict_equal(left: Value, right: Value) -> bool:
    """``===``: equal values of the same type; integer 1 and float 1.0 differ."""
    kind = type(left)
    if kind is not type(right):
        return False
    if kind is list or kind is dict:
        return _Structure(strict=True).equal(left, right)
    return bool(left == right)


def loose_equal(left: Value, right: Value) -> bool:
    """Structural equality, used for collections and membership: numbers compare by
    value, dates meet datetimes at midnight UTC, ``null`` equals ``null`` and, nested in
    a collection, undefined equals undefined. (An undefined operand of ``==`` or ``in``
    itself never gets here: it propagates.)
    """
    return _Structure(strict=False).equal(left, right)


class _Structure:
    """One structural comparison. Pairs of containers already compared are remembered,
    so values that share substructure (``x = [x, x]`` in a loop) compare in time linear
    in the containers that exist, not in the size they would have written out."""

    __slots__ = ("seen", "strict")

    def __init__(self, *, strict: bool) -> None:
        self.strict = strict
        self.seen: set[tuple[int, int]] = set()

    def equal(self, left: Value, right: Value) -> bool:
        kind, other = type(left), type(right)
        if self.strict:
            if kind is not other:
                return False
        else:
            if kind is Undefined or other is Undefined:
                return kind is other
            if _is_number(left) and _is_number(right):
                return bool(left == right)
            if kind is not other:
                if {kind, other} == {date, datetime}:
                    return _as_instant(left) == _as_instant(right)
                return False
        if kind is list or kind is dict:
            if left is right:
                return True
            pair = (id(left), id(right))
            if pair in self.seen:
                return True
            self.seen.add(pair)
            if kind is list:
                return len(left) == len(right) and all(
                    self.equal(a, b) for a, b in zip(left, right, strict=True)
                )
            return left.keys() == right.keys() and all(
                self.equal(value, right[key]) for key, value in left.items()
            )
        if kind is datetime:
            return to_utc(left) == to_utc(right)
        return bool(left == right)


def _as_instant(value: date) -> datetime:
    return to_utc(value) if type(value) is datetime else midnight_utc(value)


def _order(left: Value, right: Value) -> int | None:
    """-1, 0 or 1 for a comparable pair, ``None`` when the types do not match."""
    kind, other = type(left), type(right)
    if (_is_number(left) and _is_number(right)) or (kind is other and kind in (str, bool)):
        return int(left > right) - int(left < right)
    if kind is date or kind is datetime:
        if other is not date and other is not datetime:
            return None
        if kind is date and other is date:
            a, b = left, right
        else:
            a, b = _as_instant(left), _as_instant(right)
        return int(a > b) - int(a < b)
    if kind is list and other is list:
        for a, b in zip(left, right, strict=False):
            if not loose_equal(a, b):
                return _order(a, b)
        return (len(left) > len(right)) - (len(left) < len(right))
    return None


def compare(op: str, left: Value, right: Value) -> Value:
    """A non-strict comparison (``== != > >= < <=``).

    An undefined operand propagates; operands of mismatched types give undefined;
    ``null`` has no peer, so every non-strict comparison with it is undefined.
    """
    if type(left) is Undefined:
        return left
    if type(right) is Undefined:
        return right
    if (op == "==" or op == "!=") and type(left) is type(right) and type(left) in _STRUCTURES:
        return loose_equal(left, right) == (op == "==")
    order = _order(left, right)
    if order is None:
        return UNDEFINED
    if op == "==":
        return order == 0
    if op == "!=":
        return order != 0
    if op == ">":
        return order > 0
    if op == ">=":
        return order >= 0
    if op == "<":
        return order < 0
    return order <= 0


# Values compared as structures: equality is defined, ordering is not (a duration is a
# map of eight components).
_STRUCTURES: Final = (list, dict, Duration)


def membership(element: Value, collection: Value, operation: str, span: Span | None) -> Value:
    """``element in collection`` (``operation`` names the surface operator)."""
    if type(element) is Undefined:
        return element
    if type(collection) is Undefined:
        return collection
    if type(collection) is not list:
        raise mismatch(operation, "list", collection, span)
    return any(loose_equal(element, item) for item in collection)


# -- arithmetic -----------------------------------------------------------------------


def finite(
    compute: Callable[[Any, Any], Any], left: Value, right: Value, span: Span | None
) -> Value:
    """Numeric ``compute(left, right)``, failing cleanly when the result is out of range
    (an integer too large for a float, a float overflowing to infinity)."""
    try:
        result = compute(left, right)
    except OverflowError:
        raise failure("result_too_large", "The result is out of range", span) from None
    if type(result) is float:
        if not math.isfinite(result):
            raise failure("result_too_large", "The result is not a finite number", span)
    elif result.bit_length() > MAX_INT_BITS:
        raise failure("result_too_large", f"Integer wider than {MAX_INT_BITS} bits", span)
    return result


def _text(number: int | float, span: Span | None) -> str:
    try:
        return format_number(number)
    except ValueError:  # past the interpreter's integer-printing limit
        raise failure("result_too_large", "The number is too long to write out", span) from None


def add(left: Value, right: Value, span: Span | None) -> Value:
    """``+``: numbers add; strings (and a string with a number) join; lists join;
    a duration moves a date or datetime."""
    kind, other = type(left), type(right)
    if (kind is int or kind is float) and (other is int or other is float):
        return finite(operator.add, left, right, span)
    if kind is str and other is str:
        result: str = left + right
    elif kind is str and (other is int or other is float):
        result = left + _text(right, span)
    elif other is str and (kind is int or kind is float):
        result = _text(left, span) + right
    elif kind is list and other is list:
        joined: list[Value] = left + right
        check_size(joined, span)
        return joined
    elif other is Duration and (kind is date or kind is datetime):
        return shift(left, right, 1, span)
    elif kind is Duration and (other is date or other is datetime):
        return shift(right, left, 1, span)
    else:
        raise mismatch("add", "number_or_string", left if kind not in _ADDABLE else right, span)
    check_size(result, span)
    return result


_ADDABLE: Final = frozenset({int, float, str, list, date, datetime, Duration})


def shift(moment: date, duration: Duration, sign: int, span: Span | None) -> date:
    """Move a date or datetime by a duration, forwards (1) or back (-1)."""
    try:
        if type(moment) is datetime:
            return durations.add_to_datetime(to_utc(moment), duration, sign)
        return durations.add_to_date(moment, duration, sign)
    except OverflowError:
        raise failure(
            "date_out_of_range", "Date arithmetic left the years 1 to 9999", span
        ) from None


def subtract(left: Value, right: Value, span: Span | None) -> Value:
    """``-``: numbers subtract; date minus date is days; datetime minus datetime is
    seconds; a duration moves a date or datetime back."""
    kind, other = type(left), type(right)
    if (kind is int or kind is float) and (other is int or other is float):
        return finite(operator.sub, left, right, span)
    if kind is date and other is date:
        return Duration(days=(left - right).days)
    if (kind is date or kind is datetime) and (other is date or other is datetime):
        delta = _as_instant(left) - _as_instant(right)
        return Duration(seconds=int(delta.total_seconds()))
    if (kind is date or kind is datetime) and other is Duration:
        return shift(left, right, -1, span)
    bad = right if kind in (int, float, date, datetime) else left
    raise mismatch("subtract", "number_or_date", bad, span)


def multiply(left: Value, right: Value, span: Span | None) -> Value:
    """``*``: numbers only."""
    kind, other = type(left), type(right)
    if (kind is int or kind is float) and (other is int or other is float):
        return finite(operator.mul, left, right, span)
    raise mismatch("multiply", "number", right if _is_number(left) else left, span)


def _is_zero(value: Value) -> bool:
    kind = type(value)
    return (kind is int or kind is float) and value == 0


def divide(left: Value, right: Value, span: Span | None) -> Value:
    """``/``: the zero check comes first; two integers divide truncating toward zero."""
    if _is_zero(right):
        raise failure("division_by_zero", "Division by zero", span)
    kind, other = type(left), type(right)
    if kind is int and other is int:
        quotient = abs(left) // abs(right)
        return quotient if (left < 0) == (right < 0) else -quotient
    if (kind is int or kind is float) and (other is int or other is float):
        return finite(operator.truediv, left, right, span)
    raise mismatch("divide", "number", right if _is_number(left) else left, span)


def modulo(left: Value, right: Value, span: Span | None) -> Value:
    """``%``: integers only; the remainder takes the sign of the dividend."""
    if type(right) is int and right == 0:
        raise failure("modulo_by_zero", "Modulo by zero", span)
    if type(left) is int and type(right) is int:
        remainder = abs(left) % abs(right)
        return -remainder if left < 0 else remainder
    raise mismatch("modulo", "number", right if type(left) is int else left, span)


def negate(value: Value, span: Span | None) -> Value:
    """Unary ``-``: numbers only."""
    kind = type(value)
    if kind is int or kind is float:
        return -value
    raise mismatch("unary_minus", "number", value, span)


def get_property(target: Value, key: Value) -> Value:
    """``target.key``: a miss, or a target that is not a map, gives undefined."""
    if type(target) is dict:
        return target.get(key, UNDEFINED)
    if type(target) is Undefined:
        return target
    if isinstance(target, Mapping):
        return target.get(key, UNDEFINED)
    return UNDEFINED


def get_index(target: Value, key: Value, span: Span | None) -> Value:
    """``target[key]``: maps take string, integer, boolean or undefined keys; lists
    take non-negative integers; anything else indexes to undefined."""
    kind, key_kind = type(target), type(key)
    if kind is list:
        if key_kind is not int:
            raise mismatch("bracket_access", "integer", key, span)
        return target[key] if 0 <= key < len(target) else UNDEFINED
    if kind is dict or (kind is not Undefined and isinstance(target, Mapping)):
        if key_kind is str or key_kind is int or key_kind is bool:
            return target.get(key, UNDEFINED)
        if key_kind is Undefined:
            return UNDEFINED
        raise mismatch("bracket_access", "string", key, span)
    if kind is Undefined:
        return target
    return UNDEFINED
