"""Callable functions: the builtins, and how a host adds its own.

A host function is a :class:`Function` wrapping a plain callable. It receives the
evaluated arguments as a tuple (undefined arguments arrive as :data:`UNDEFINED`)
and returns a value; to fail, it raises :class:`FunctionError` (any other exception
is reported the same way, as an ``EvaluationError`` with the code
``function_raised``). Functions are passed per evaluation in
:class:`~statifier.expr.Options` and shadow same-named builtins.

>>> from statifier.expr import Options, evaluate
>>> double = Function(lambda args: args[0] * 2, arity=1)
>>> evaluate("double(score) > 100", {"score": 60}, Options(functions={"double": double}))
True
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Final

from statifier.expr import jsontext
from statifier.expr.semantics import MAX_INT_BITS, check_size
from statifier.expr.values import Value

__all__ = ["BUILTINS", "CallContext", "Function", "FunctionError"]


class FunctionError(Exception):
    """Raised by a function to fail the evaluation with an ``EvaluationError``.

    The message becomes both the error's ``reason`` and its ``message`` (as the
    conformance corpus spells a function's failure), ``code`` the error's stable
    token (``"function_failed"`` unless given; the builtins use
    ``"invalid_argument"``, ``"invalid_json"``, ``"not_serializable"`` and
    ``"result_too_large"``).
    """

    def __init__(self, message: str, code: str = "function_failed") -> None:
        super().__init__(message)
        self.code = code


class CallContext:
    """What a function declared with ``pass_context=True`` may see.

    Attributes:
        data: the context mapping the evaluation runs against.
        host: the opaque host object given in the options (never readable from source).
        now: the evaluation's clock.
    """

    # A plain slotted class: one is built per call, so construction must be cheap.
    __slots__ = ("data", "host", "now")

    def __init__(
        self, data: Mapping[str, Value], host: object, now: Callable[[], datetime]
    ) -> None:
        self.data = data
        self.host = host
        self.now = now


@dataclass(frozen=True, slots=True)
class Function:
    """A function callable from source.

    Attributes:
        call: ``call(args)``, or ``call(args, context)`` when ``pass_context`` is set.
        arity: the accepted argument count, or a tuple of accepted counts.
        pass_context: whether ``call`` takes a :class:`CallContext` second argument.
    """

    call: Callable[..., Value]
    arity: int | tuple[int, ...]
    pass_context: bool = False

    def accepts(self, count: int) -> bool:
        """Answer whether ``count`` arguments are acceptable."""
        return count == self.arity if isinstance(self.arity, int) else count in self.arity


# The stable codes of the builtins' failures (their reasons are their messages).
_INVALID: Final = "invalid_argument"
_TOO_LARGE: Final = "result_too_large"


def _string(name: str, value: Value) -> str:
    if type(value) is not str:
        raise FunctionError(f"{name} expects a string", _INVALID)
    return value


def _integer(name: str, value: Value) -> int:
    if type(value) is not int:
        raise FunctionError(f"{name} expects an integer", _INVALID)
    return value


def _number(name: str, value: Value) -> int | float:
    if type(value) is not int and type(value) is not float:
        raise FunctionError(f"{name} expects a number", _INVALID)
    return value


def _trim(args: tuple[Value, ...]) -> Value:
    value = args[0]
    if type(value) is str:
        return value.strip()
    raise FunctionError("trim expects a string", _INVALID)


def _len(args: tuple[Value, ...]) -> Value:
    value = args[0]
    if type(value) is str or type(value) is list:
        return len(value)
    raise FunctionError("len expects a string or a list", _INVALID)


def _substring(args: tuple[Value, ...]) -> Value:
    text = _string("substring", args[0])
    start = _integer("substring", args[1])
    if start < 0:
        start = max(len(text) + start, 0)
    if len(args) == 2:
        return text[start:]
    length = _integer("substring", args[2])
    if length < 0:
        raise FunctionError("substring expects a non-negative length", _INVALID)
    return text[start : start + length]


def _concat(args: tuple[Value, ...]) -> Value:
    left, right = args
    if type(left) is not list or type(right) is not list:
        raise FunctionError("concat expects two lists", _INVALID)
    joined: list[Value] = left + right
    check_size(joined, None)
    return joined


def _pow(args: tuple[Value, ...]) -> Value:
    base, exponent = _number("Math.pow", args[0]), _number("Math.pow", args[1])
    if type(base) is int and type(exponent) is int and exponent >= 0:
        if max(base.bit_length(), 1) * exponent > MAX_INT_BITS and abs(base) > 1:
            raise FunctionError(f"Math.pow result wider than {MAX_INT_BITS} bits", _TOO_LARGE)
        result: int = base**exponent
        return result
    try:
        return math.pow(base, exponent)
    except (OverflowError, ValueError):
        raise FunctionError("Math.pow result is not a finite number", _TOO_LARGE) from None


def _sqrt(args: tuple[Value, ...]) -> Value:
    value = _number("Math.sqrt", args[0])
    if value < 0:
        raise FunctionError("Math.sqrt expects a non-negative number", _INVALID)
    if type(value) is int:
        root = math.isqrt(value)
        if root * root == value:
            return root
    try:
        return math.sqrt(value)
    except OverflowError:
        raise FunctionError("Math.sqrt argument too large", _TOO_LARGE) from None


def _rounding(name: str, rule: Callable[[float], int]) -> Callable[[tuple[Value, ...]], Value]:
    def apply(args: tuple[Value, ...]) -> Value:
        value = _number(name, args[0])
        if type(value) is int:
            return value
        if not math.isfinite(value):
            raise FunctionError(f"{name} expects a finite number", _INVALID)
        return rule(value)

    return apply


def _round_half_away(value: float) -> int:
    magnitude = math.floor(abs(value) + 0.5)
    return -magnitude if value < 0 else magnitude


def _extremum(name: str, pick: Callable[[Any, Any], Any]) -> Callable[[tuple[Value, ...]], Value]:
    def apply(args: tuple[Value, ...]) -> Value:
        return pick(_number(name, args[0]), _number(name, args[1]))

    return apply


def _date_part(name: str, part: str) -> Callable[[tuple[Value, ...]], Value]:
    def apply(args: tuple[Value, ...]) -> Value:
        value = args[0]
        if type(value) is not date and type(value) is not datetime:
            raise FunctionError(f"{name} expects a date or a datetime", _INVALID)
        result: int = getattr(value, part)
        return result

    return apply


def _abs(args: tuple[Value, ...]) -> Value:
    return abs(_number("Math.abs", args[0]))


def _json_parse(args: tuple[Value, ...]) -> Value:
    try:
        return jsontext.loads(_string("JSON.parse", args[0]))
    except jsontext.JSONTextError as error:
        raise FunctionError(f"Invalid JSON: {error}", "invalid_json") from None


def _json_stringify(args: tuple[Value, ...]) -> Value:
    try:
        text = jsontext.dumps(args[0])
    except (jsontext.JSONTextError, ValueError) as error:
        raise FunctionError(f"JSON.stringify failed: {error}", "not_serializable") from None
    check_size(text, None)
    return text


def _now(args: tuple[Value, ...], context: CallContext) -> Value:
    return context.now()


def _simple(call: Callable[[tuple[Value, ...]], Value], arity: int | tuple[int, ...]) -> Function:
    return Function(call, arity)


BUILTINS: Final[Mapping[str, Function]] = {
    "len": _simple(_len, 1),
    "upper": _simple(lambda a: _string("upper", a[0]).upper(), 1),
    "lower": _simple(lambda a: _string("lower", a[0]).lower(), 1),
    "trim": _simple(_trim, 1),
    "starts_with": _simple(
        lambda a: _string("starts_with", a[0]).startswith(_string("starts_with", a[1])), 2
    ),
    "ends_with": _simple(
        lambda a: _string("ends_with", a[0]).endswith(_string("ends_with", a[1])), 2
    ),
    "substring": _simple(_substring, (2, 3)),
    "index_of": _simple(lambda a: _string("index_of", a[0]).find(_string("index_of", a[1])), 2),
    "concat": _simple(_concat, 2),
    "Math.abs": _simple(_abs, 1),
    "Math.max": _simple(_extremum("Math.max", max), 2),
    "Math.min": _simple(_extremum("Math.min", min), 2),
    "Math.pow": _simple(_pow, 2),
    "Math.sqrt": _simple(_sqrt, 1),
    "Math.floor": _simple(_rounding("Math.floor", math.floor), 1),
    "Math.ceil": _simple(_rounding("Math.ceil", math.ceil), 1),
    "Math.round": _simple(_rounding("Math.round", _round_half_away), 1),
    "Math.random": _simple(lambda a: random.random(), 0),
    "Date.year": _simple(_date_part("Date.year", "year"), 1),
    "Date.month": _simple(_date_part("Date.month", "month"), 1),
    "Date.day": _simple(_date_part("Date.day", "day"), 1),
    "Date.now": Function(_now, 0, pass_context=True),
    "JSON.parse": _simple(_json_parse, 1),
    "JSON.stringify": _simple(_json_stringify, 1),
}
"""The builtin functions by name."""
