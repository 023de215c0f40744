"""Documented semantics of the expression language beyond the conformance corpus.

Each section names the part of the predicator documentation it checks. Results are
compared through the tagged JSON encoding, which keeps ``1``, ``1.0`` and ``true``
apart (Python's ``==`` does not).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any

import pytest

from statifier.expr import (
    UNDEFINED,
    CallContext,
    Duration,
    ExprError,
    Function,
    FunctionError,
    Options,
    ParseError,
    compile_expression,
    evaluate,
)
from statifier.expr.errors import EvaluationError, TypeMismatchError, UndefinedVariableError
from statifier.expr.functions import BUILTINS
from statifier.expr.tagged import encode

NOW = datetime(2024, 6, 15, 12, 0, tzinfo=UTC)


def _clock() -> datetime:
    return NOW


OPTIONS = Options(clock=_clock)
STRICT = Options(clock=_clock, on_unbound="error")


def typed(value: object) -> str:
    """A canonical text for a value that keeps integers, floats and booleans apart."""
    return json.dumps(encode(value), sort_keys=True)


def run(source: str, context: Mapping[str, Any] | None = None, options: Options = OPTIONS) -> Any:
    return evaluate(source, {} if context is None else context, options)


def value_of(
    source: str, context: Mapping[str, Any] | None = None, options: Options = OPTIONS
) -> Any:
    result = run(source, context, options)
    assert not isinstance(result, ExprError), f"{source!r} failed: {result}"
    return result


def error_of(
    source: str, context: Mapping[str, Any] | None = None, options: Options = OPTIONS
) -> ExprError:
    result = run(source, context, options)
    assert isinstance(result, ExprError), f"{source!r} gave {result!r}, expected an error"
    return result


def check(
    source: str,
    expected: object,
    context: Mapping[str, Any] | None = None,
    options: Options = OPTIONS,
) -> None:
    actual = value_of(source, context, options)
    assert typed(actual) == typed(expected), f"{source!r}: got {actual!r}, want {expected!r}"


def ids(table: list[tuple[Any, ...]]) -> list[str]:
    return [str(row[0]) for row in table]


# -- null and undefined (language.md "Null and undefined", isa.md 3 and 5) -------------

NULLS: dict[str, Any] = {"x": None, "y": None, "u": UNDEFINED, "user": {"data": None}}

NULL_COMPARISONS: list[tuple[str, object]] = [
    ("null === undefined", False),
    ("null == undefined", UNDEFINED),
    ("null === null", True),
    ("null == null", UNDEFINED),
    ("null !== null", False),
    ("null != null", UNDEFINED),
    ("x === y", True),
    ("x == y", UNDEFINED),
    ("x === undefined", False),
    ("x == undefined", UNDEFINED),
    ("x === null", True),
    ("x !== null", False),
    ("x > 1", UNDEFINED),
    ("x <= 1", UNDEFINED),
    ("x == 0", UNDEFINED),
    ("x != 0", UNDEFINED),
    ("x === 0", False),
    ("x == false", UNDEFINED),
    ('x == ""', UNDEFINED),
    ("u === undefined", True),
    ("u === null", False),
    ("u == undefined", UNDEFINED),
    ("undefined == undefined", UNDEFINED),
    ("undefined === undefined", True),
    ("undefined !== 1", True),
    ("user.data === null", True),
    ("user.data === undefined", False),
    ("user.gone === undefined", True),
    ("user.gone === null", False),
    ("x.foo", UNDEFINED),
    ('x["foo"]', UNDEFINED),
    ("x[0]", UNDEFINED),
]


@pytest.mark.parametrize(("source", "expected"), NULL_COMPARISONS, ids=ids(NULL_COMPARISONS))
def test_null_and_undefined_comparisons(source: str, expected: object) -> None:
    check(source, expected, NULLS)


NULL_MEMBERSHIP: list[tuple[str, object]] = [
    ("x in [y]", True),
    ("null in [null]", True),
    ("null in [1, 2]", False),
    ("null in []", False),
    ("[1, null] contains null", True),
    ("[1, 2] contains x", False),
    ("null in [undefined]", False),
    ("undefined in [undefined]", UNDEFINED),
    ("undefined in [null]", UNDEFINED),
    ("u in [1]", UNDEFINED),
    ("1 in u", UNDEFINED),
    ("[1] contains u", UNDEFINED),
    ("u contains 1", UNDEFINED),
    ("user.gone in [1, 2]", UNDEFINED),
]


@pytest.mark.parametrize(("source", "expected"), NULL_MEMBERSHIP, ids=ids(NULL_MEMBERSHIP))
def test_membership_treats_null_as_a_value_and_propagates_undefined(
    source: str, expected: object
) -> None:
    check(source, expected, NULLS)


def test_membership_needs_a_list_even_for_null() -> None:
    error = error_of("1 in x", NULLS)
    assert isinstance(error, TypeMismatchError)
    assert (error.reason, error.expected, error.got) == ("in", "list", "null")
    error = error_of("x contains 1", NULLS)
    assert isinstance(error, TypeMismatchError)
    assert (error.reason, error.got) == ("contains", "null")


FALSINESS: list[tuple[str, object]] = [
    ("x and true", None),
    ("x and false", None),
    ("x or true", True),
    ("x or false", False),
    ("x or 5", 5),
    ("u and true", UNDEFINED),
    ("u or true", True),
    ('u or "fallback"', "fallback"),
    ("user.gone and true", UNDEFINED),
    ("user.gone or null", None),
    ("false and x", False),
    ("true and x", None),
    ("true and u", UNDEFINED),
    ("true and 5", 5),
    ("false or [1]", [1]),
    ("true or 5", True),
    ("false and 5", False),
    ("true and true and null", None),
    ("false or false or undefined", UNDEFINED),
]


@pytest.mark.parametrize(("source", "expected"), FALSINESS, ids=ids(FALSINESS))
def test_and_or_treat_false_null_and_undefined_as_falsy(source: str, expected: object) -> None:
    check(source, expected, NULLS)


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("1 and true", "jump_if_falsy_or_pop"),
        ('"yes" and true', "jump_if_falsy_or_pop"),
        ("[] or true", "jump_if_true_or_pop"),
        ("0 or true", "jump_if_true_or_pop"),
    ],
)
def test_and_or_refuse_a_non_boolean_left_operand(source: str, reason: str) -> None:
    error = error_of(source)
    assert isinstance(error, TypeMismatchError)
    assert (error.reason, error.expected) == (reason, "boolean")


def _counting(calls: list[int]) -> Options:
    def boom(args: tuple[Any, ...]) -> Any:
        calls.append(1)
        raise FunctionError("never runs")

    return Options(clock=_clock, functions={"boom": Function(boom, 0)})


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("false and boom()", False),
        ("null and boom()", None),
        ("undefined and boom()", UNDEFINED),
        ("true or boom()", True),
        ("false and boom() and boom()", False),
        ("true or boom() or boom()", True),
    ],
)
def test_short_circuit_never_evaluates_the_skipped_side(source: str, expected: object) -> None:
    calls: list[int] = []
    check(source, expected, {}, _counting(calls))
    assert calls == []


def test_the_right_side_runs_when_not_short_circuited() -> None:
    calls: list[int] = []
    error = error_of("true and boom()", {}, _counting(calls))
    assert isinstance(error, EvaluationError)
    assert error.message == "never runs"
    assert calls == [1]


NULL_REJECTED: list[tuple[str, str]] = [
    ("not x", "logical_not"),
    ("!x", "logical_not"),  # a leading ! is not, as in the original
    ("true == !x", "unary_bang"),  # after an operator ! is the tight unary
    ("-x", "unary_minus"),
    ("x + 1", "add"),
    ("1 + x", "add"),
    ("x - 1", "subtract"),
    ("x * 2", "multiply"),
    ("x / 2", "divide"),
    ("x % 2", "modulo"),
]


@pytest.mark.parametrize(("source", "reason"), NULL_REJECTED, ids=ids(NULL_REJECTED))
def test_null_is_a_type_mismatch_for_not_minus_and_arithmetic(source: str, reason: str) -> None:
    error = error_of(source, NULLS)
    assert isinstance(error, TypeMismatchError), error
    assert (error.reason, error.got) == (reason, "null")


CAST_TYPES = ("integer", "float", "string", "boolean", "date", "datetime", "duration")


@pytest.mark.parametrize("target", CAST_TYPES)
@pytest.mark.parametrize("operand", ["x", "null", "u", "undefined", "user.gone"])
def test_casting_null_or_undefined_is_undefined(operand: str, target: str) -> None:
    check(f"{operand}::{target}", UNDEFINED, NULLS)


# -- unbound roots (language.md "Unbound roots vs. missing paths, and on_unbound") -----

UNBOUND = "unbound"
UNBOUND_TABLE: list[tuple[str, object, object]] = [
    ("missing OR true", True, UNBOUND),
    ("[missing]", [UNDEFINED], UNBOUND),
    ("{'a': missing}", {"a": UNDEFINED}, UNBOUND),
    ("missing", UNBOUND, UNBOUND),
    ("missing == 5", UNBOUND, UNBOUND),
    ("not missing", UNBOUND, UNBOUND),
    ("missing + 1", UNBOUND, UNBOUND),
    ("-missing", UNBOUND, UNBOUND),
    ("missing in [1]", UNBOUND, UNBOUND),
    ("missing.deeper", UNBOUND, UNBOUND),
    ("missing::integer", UNBOUND, UNBOUND),
    ("missing == undefined", UNBOUND, UNBOUND),
    ("missing === undefined", True, UNBOUND),
    ("missing !== undefined", False, UNBOUND),
    ("false AND missing", False, False),
    ("true OR missing", True, True),
    ("undefined", UNDEFINED, UNDEFINED),
    ("undefined === undefined", True, True),
    ("null", None, None),
]


@pytest.mark.parametrize(
    ("source", "default", "under_error"), UNBOUND_TABLE, ids=ids(UNBOUND_TABLE)
)
def test_unbound_root_policy_table(source: str, default: object, under_error: object) -> None:
    for options, expected in ((OPTIONS, default), (STRICT, under_error)):
        if isinstance(expected, str) and expected == UNBOUND:
            error = error_of(source, {}, options)
            assert isinstance(error, UndefinedVariableError), error
            assert (error.reason, error.variable) == ("unbound_variable", "missing")
        else:
            check(source, expected, {}, options)


@pytest.mark.parametrize("options", [OPTIONS, STRICT], ids=["default", "on_unbound=error"])
def test_a_missing_nested_path_is_undefined_under_either_policy(options: Options) -> None:
    context = {"user": {"profile": {}}, "items": [1]}
    check("user.age", UNDEFINED, context, options)
    check("user.profile.name", UNDEFINED, context, options)
    check("items[5]", UNDEFINED, context, options)
    check("user.age === undefined", True, context, options)
    check("user.age == 5", UNDEFINED, context, options)


@pytest.mark.parametrize("options", [OPTIONS, STRICT], ids=["default", "on_unbound=error"])
def test_a_root_bound_to_undefined_is_not_unbound(options: Options) -> None:
    context = {"x": UNDEFINED}
    check("x", UNDEFINED, context, options)
    check("x === undefined", True, context, options)
    check("x == 5", UNDEFINED, context, options)
    check("[x]", [UNDEFINED], context, options)


def test_a_missing_path_under_an_unbound_root_still_names_the_root() -> None:
    error = error_of("user.age", {})
    assert isinstance(error, UndefinedVariableError)
    assert error.variable == "user"


def test_the_reported_variable_is_the_one_that_was_unbound() -> None:
    error = error_of("present + absent", {"present": 1})
    assert isinstance(error, UndefinedVariableError)
    assert error.variable == "absent"
    assert error.span is not None
    assert (error.span.line, error.span.column) == (1, 11)


def test_on_unbound_error_does_not_fire_on_bound_or_skipped_loads() -> None:
    check("a + 1", 2, {"a": 1}, STRICT)
    check("a OR missing", True, {"a": True}, STRICT)


# -- reject vs. propagate, per operator (language.md table) ---------------------------

GONE: dict[str, Any] = {"user": {}}

REJECTING: list[tuple[str, str]] = [
    ("user.gone + 1", "add"),
    ("1 + user.gone", "add"),
    ('"a" + user.gone', "add"),
    ("user.gone - 1", "subtract"),
    ("1 - user.gone", "subtract"),
    ("user.gone * 2", "multiply"),
    ("2 * user.gone", "multiply"),
    ("user.gone / 2", "divide"),
    ("2 / user.gone", "divide"),
    ("user.gone % 2", "modulo"),
    ("2 % user.gone", "modulo"),
    ("-user.gone", "unary_minus"),
    ("not user.gone", "logical_not"),
    ("!user.gone", "logical_not"),  # a leading ! is not, as in the original
    ("true == !user.gone", "unary_bang"),
]


@pytest.mark.parametrize(("source", "reason"), REJECTING, ids=ids(REJECTING))
def test_operators_that_reject_undefined(source: str, reason: str) -> None:
    error = error_of(source, GONE)
    assert isinstance(error, TypeMismatchError), error
    assert (error.reason, error.got) == (reason, "undefined")


PROPAGATING: list[tuple[str, object]] = [
    ("user.gone > 1", UNDEFINED),
    ("1 < user.gone", UNDEFINED),
    ("user.gone >= 1", UNDEFINED),
    ("user.gone <= 1", UNDEFINED),
    ("user.gone == 1", UNDEFINED),
    ("user.gone != 1", UNDEFINED),
    ("user.gone == user.gone", UNDEFINED),
    ("user.gone === undefined", True),
    ("user.gone === 1", False),
    ("user.gone !== 1", True),
    ("user.gone !== undefined", False),
    ("user.gone and true", UNDEFINED),
    ("user.gone or true", True),
    ("user.gone in [1]", UNDEFINED),
    ("[1] contains user.gone", UNDEFINED),
    ("user.gone::string", UNDEFINED),
]


@pytest.mark.parametrize(("source", "expected"), PROPAGATING, ids=ids(PROPAGATING))
def test_operators_that_propagate_or_handle_undefined(source: str, expected: object) -> None:
    check(source, expected, GONE)


# -- equality (language.md "Mismatched comparisons", isa.md 5 compare) ----------------

EQUALITY: list[tuple[str, object]] = [
    ("1 == 1.0", True),
    ("1 != 1.0", False),
    ("1 === 1.0", False),
    ("1 !== 1.0", True),
    ("2.5 === 2.5", True),
    ("1 < 2.0", True),
    ("[1, 2] == [1.0, 2.0]", True),
    ("[1, 2] === [1.0, 2.0]", False),
    ("{a: 1} == {a: 1.0}", True),
    ("{a: 1} === {a: 1.0}", False),
    ("{a: 1, b: 2} == {b: 2, a: 1}", True),
    ("{a: 1} == {a: 1, b: 2}", False),
    ("{a: 1} != {a: 2}", True),
    ("[1, [2, 3]] == [1, [2, 3]]", True),
    ("[] == []", True),
    ("true == 1", UNDEFINED),
    ('"1" == 1', UNDEFINED),
    ('1 != "1"', UNDEFINED),
    ('"a" < 1', UNDEFINED),
    ("[1] == 1", UNDEFINED),
    ("{a: 1} == [1]", UNDEFINED),
    ("true > 0", UNDEFINED),
    ('1 === "1"', False),
    ("true !== 1", True),
    ("[1] === [1]", True),
    ('"abc" === "abc"', True),
]


@pytest.mark.parametrize(("source", "expected"), EQUALITY, ids=ids(EQUALITY))
def test_strict_and_non_strict_equality(source: str, expected: object) -> None:
    check(source, expected)


DATE_COMPARISONS: list[tuple[str, object]] = [
    ("#2024-01-15# == #2024-01-15T00:00:00Z#", True),
    ("#2024-01-15# != #2024-01-15T00:00:00Z#", False),
    ("#2024-01-15# === #2024-01-15T00:00:00Z#", False),
    ("#2024-01-15# !== #2024-01-15T00:00:00Z#", True),
    ("#2024-01-15# == #2024-01-15T00:00:01Z#", False),
    ("#2024-01-15# < #2024-01-15T00:00:01Z#", True),
    ("#2024-01-15# > #2024-01-14T23:59:59Z#", True),
    ("#2024-01-15T00:00:00Z# >= #2024-01-15#", True),
    ("#2024-01-15# in [#2024-01-15T00:00:00Z#]", True),
    ("[#2024-01-15T00:00:00Z#] contains #2024-01-15#", True),
    ("#2024-01-15# in [#2024-01-15T12:00:00Z#]", False),
    ("#2024-01-15T01:00:00+01:00# == #2024-01-15T00:00:00Z#", True),
    ("#2024-01-15T01:00:00+01:00# > #2024-01-14T23:59:00Z#", True),
    ("#2024-02-01# > #2024-01-31#", True),
    ("#2023-12-31# < #2024-01-01#", True),
    ("#2024-01-15# == #2024-01-15#", True),
    ('#2024-01-15# == "2024-01-15"', UNDEFINED),
    ("#2024-01-15# > 5", UNDEFINED),
    ("d == #2024-01-15#", True),
    ("d == t", False),
    ("d < t", True),
    ("t::date == d", True),
]


@pytest.mark.parametrize(("source", "expected"), DATE_COMPARISONS, ids=ids(DATE_COMPARISONS))
def test_dates_and_datetimes_compare_chronologically(source: str, expected: object) -> None:
    context = {"d": date(2024, 1, 15), "t": datetime(2024, 1, 15, 9, 30, tzinfo=UTC)}
    check(source, expected, context)


def test_a_context_datetime_in_another_zone_compares_as_its_instant() -> None:
    plus_two = timezone(timedelta(hours=2))
    context = {"t": datetime(2024, 1, 15, 2, 0, tzinfo=plus_two)}
    check("t == #2024-01-15T00:00:00Z#", True, context)
    check("t == #2024-01-15#", True, context)
    check("t::string", "2024-01-15T00:00:00Z", context)


DURATION_EQUALITY: list[tuple[str, object]] = [
    ("3d === 3d", True),
    ("3d !== 4d", True),
    ("3d in [1d, 3d]", True),
    ("3d == 3d", True),
    ("3d != 3d", False),
    ("3d != 4d", True),
    ('"30m3d"::duration == 3d30m', True),
    ("2w3d == 2w4d", False),
]


@pytest.mark.parametrize(("source", "expected"), DURATION_EQUALITY, ids=ids(DURATION_EQUALITY))
def test_durations_are_maps_so_equality_is_well_defined(source: str, expected: object) -> None:
    # isa.md 3: a duration is a map with eight keys; isa.md 5 compare: EQ/NE on two
    # maps are well-defined (only the ordering operators are unspecified for maps).
    check(source, expected)


# -- ordering (isa.md 5 compare, "Ordering on a matched pair") ------------------------

ORDERING: list[tuple[str, object]] = [
    ("[1, 2] < [1, 3]", True),
    ("[1, 3] > [1, 2]", True),
    ("[1] < [1, 2]", True),
    ("[1, 2] > [1]", True),
    ("[] < [1]", True),
    ("[2] > [1, 5]", True),
    ("[1, 2] <= [1, 2]", True),
    ("[1, 2] >= [1, 2]", True),
    ("[1, 2] < [1, 2]", False),
    ("[1.5] > [1]", True),
    ('["a", "b"] < ["a", "c"]', True),
    ("[[1, 2]] < [[1, 3]]", True),
    ('"abc" < "abd"', True),
    ('"B" < "a"', True),
    ('"Z" < "a"', True),
    ('"é" > "z"', True),
    ('"10" < "9"', True),
    ('"" < "a"', True),
    ('"ab" > "a"', True),
    ("false < true", True),
    ("true > false", True),
    ("true >= true", True),
    ("-1 < 0", True),
    ("2.5 > 2", True),
    ("3 <= 2.99", False),
]


@pytest.mark.parametrize(("source", "expected"), ORDERING, ids=ids(ORDERING))
def test_ordering_by_type(source: str, expected: object) -> None:
    check(source, expected)


@pytest.mark.parametrize("source", ["1 < 2 < 3", "1 == 1 == true", "a in b in c"])
def test_comparisons_do_not_chain(source: str) -> None:
    assert isinstance(compile_expression(source), ParseError)


# -- + with mixed operands (language.md "What + does with mixed operands") ------------

PLUS: list[tuple[str, object]] = [
    ("'Hello' + ' World'", "Hello World"),
    ("'Count: ' + 42", "Count: 42"),
    ("42 + ' items'", "42 items"),
    ('"x" + 1.5', "x1.5"),
    ('1.5 + "x"', "1.5x"),
    ('"v" + 2.0', "v2.0"),
    ('"n" + -3', "n-3"),
    ('"n=" + (1 + 2)', "n=3"),
    ('"n=" + 1 + 2', "n=12"),
    ('1 + 2 + "x"', "3x"),
    ('"" + 0', "0"),
    ("[1, 2] + [3]", [1, 2, 3]),
    ("[] + []", []),
    ('["a"] + [1, null]', ["a", 1, None]),
    ("2 + 3", 5),
    ("2 + 3.5", 5.5),
]


@pytest.mark.parametrize(("source", "expected"), PLUS, ids=ids(PLUS))
def test_plus_concatenates_strings_numbers_and_lists(source: str, expected: object) -> None:
    check(source, expected)


@pytest.mark.parametrize(
    "source",
    [
        '"a" + true',
        "true + 1",
        '"a" + null',
        '"a" + [1]',
        '[1] + "a"',
        "[1, 2] + 3",
        "3 + [1]",
        '"a" + {b: 1}',
        "{a: 1} + {b: 2}",
        '"a" + 3d',
        '"a" + #2024-01-15#',
        "true + false",
    ],
)
def test_plus_refuses_every_other_pairing(source: str) -> None:
    error = error_of(source)
    assert isinstance(error, TypeMismatchError), error
    assert error.reason == "add"


def test_subtraction_does_not_concatenate() -> None:
    for source in ['"ab" - "b"', "[1, 2] - [2]"]:
        error = error_of(source)
        assert isinstance(error, TypeMismatchError)
        assert error.reason == "subtract"


# -- division and modulo (language.md arithmetic table, isa.md 5 divide/modulo) -------

DIVISION: list[tuple[str, object]] = [
    ("7 / 2", 3),
    ("-7 / 2", -3),
    ("7 / -2", -3),
    ("-7 / -2", 3),
    ("1 / 3", 0),
    ("-1 / 3", 0),
    ("6 / 3", 2),
    ("10 / 3", 3),
    ("10 / 3.0", 10 / 3.0),
    ("-7 / 2.0", -3.5),
    ("7.0 / 2", 3.5),
    ("6.0 / 3", 2.0),
    ("7 % 3", 1),
    ("-7 % 3", -1),
    ("7 % -3", 1),
    ("-7 % -3", -1),
    ("6 % 3", 0),
    ("-6 % 3", 0),
    ("0 % 5", 0),
    ("-(7 / 2)", -3),
    ("2 + 3 * 4", 14),
    ("(2 + 3) * 4", 20),
    ("10 - 4 - 3", 3),
    ("100 / 10 / 5", 2),
    ("2 * 3 % 4", 2),
    ("-2 * 3", -6),
    ("--3", 3),
    ("- -3", 3),
]


@pytest.mark.parametrize(("source", "expected"), DIVISION, ids=ids(DIVISION))
def test_integer_division_truncates_toward_zero(source: str, expected: object) -> None:
    check(source, expected)


@pytest.mark.parametrize("left", [-9, -7, -1, 0, 1, 7, 9])
@pytest.mark.parametrize("right", [-4, -2, 1, 3, 5])
def test_quotient_and_remainder_are_consistent(left: int, right: int) -> None:
    # Truncating division pairs with a remainder that takes the dividend's sign.
    check(f"({left} / {right}) * {right} + {left} % {right}", left)
    remainder = value_of(f"{left} % {right}")
    assert remainder == 0 or (remainder > 0) == (left > 0)
    assert abs(remainder) < abs(right)


@pytest.mark.parametrize(
    ("source", "kind", "reason"),
    [
        ("1.5 / 0", "EvaluationError", "division_by_zero"),
        ("null / 0", "EvaluationError", "division_by_zero"),
        ('"a" / 0.0', "EvaluationError", "division_by_zero"),
        ('"a" % 0', "EvaluationError", "modulo_by_zero"),
        ("x % 0", "EvaluationError", "modulo_by_zero"),
        ("7.5 % 2", "TypeMismatchError", "modulo"),
        ("7 % 2.5", "TypeMismatchError", "modulo"),
        ('"6" / 2', "TypeMismatchError", "divide"),
        ("true * 2", "TypeMismatchError", "multiply"),
        ("-true", "TypeMismatchError", "unary_minus"),
        ('-"1"', "TypeMismatchError", "unary_minus"),
        ("-[1]", "TypeMismatchError", "unary_minus"),
    ],
)
def test_arithmetic_errors(source: str, kind: str, reason: str) -> None:
    error = error_of(source, {"x": None})
    assert (error.kind, error.reason) == (kind, reason)


# -- dates and durations in arithmetic (isa.md 5 add/subtract) ------------------------

DATE_ARITHMETIC: list[tuple[str, object]] = [
    ("#2024-01-15# + 3d", date(2024, 1, 18)),
    ("3d + #2024-01-15#", date(2024, 1, 18)),
    ("#2024-02-28# + 2d", date(2024, 3, 1)),
    ("#2023-02-28# + 1d", date(2023, 3, 1)),
    ("#2024-01-15# - 1w", date(2024, 1, 8)),
    ("#2024-01-15# + 2w3d", date(2024, 2, 1)),
    ("#2024-01-15# + 48h", date(2024, 1, 17)),
    ("#2024-01-31# + 1mo", date(2024, 3, 1)),
    ("#2023-01-01# + 1y", date(2024, 1, 1)),
    ("#2024-01-01# + 1y", date(2024, 12, 31)),
    ("#2024-03-01# - 1mo", date(2024, 1, 31)),
    ("#2024-01-15T10:30:00Z# + 2h", datetime(2024, 1, 15, 12, 30, tzinfo=UTC)),
    ("#2024-01-15T10:30:00Z# - 2h", datetime(2024, 1, 15, 8, 30, tzinfo=UTC)),
    ("2h + #2024-01-15T10:30:00Z#", datetime(2024, 1, 15, 12, 30, tzinfo=UTC)),
    ("#2024-01-15T23:00:00Z# + 2h", datetime(2024, 1, 16, 1, 0, tzinfo=UTC)),
    ("#2024-01-15T10:30:00Z# + 1.5s", datetime(2024, 1, 15, 10, 30, 1, 500000, tzinfo=UTC)),
    ("#2024-01-15T10:30:00Z# + 250ms", datetime(2024, 1, 15, 10, 30, 0, 250000, tzinfo=UTC)),
    ("#2024-01-15T10:30:00Z# - 1d30m", datetime(2024, 1, 14, 10, 0, tzinfo=UTC)),
    ("#2024-01-15T00:00:00Z# + 1mo", datetime(2024, 2, 14, tzinfo=UTC)),
    ("#2024-01-15# - #2024-01-10#", Duration(days=5)),
    ("#2024-01-10# - #2024-01-15#", Duration(days=-5)),
    ("#2024-01-15T10:00:00Z# - #2024-01-15T08:00:00Z#", Duration(seconds=7200)),
    ("#2024-01-15T12:00:00Z# - #2024-01-15#", Duration(seconds=43200)),
    ("#2024-01-16# - #2024-01-15T12:00:00Z#", Duration(seconds=43200)),
    ("(#2024-01-15# + 3d) - #2024-01-15#", Duration(days=3)),
    ("#2024-01-15# + 3d > #2024-01-17#", True),
]


@pytest.mark.parametrize(("source", "expected"), DATE_ARITHMETIC, ids=ids(DATE_ARITHMETIC))
def test_date_and_duration_arithmetic(source: str, expected: object) -> None:
    check(source, expected)


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("#2024-01-15# + 3", "add"),
        ("3d + 3d", "add"),
        ("3d - 1d", "subtract"),
        ("1d - #2024-01-15#", "subtract"),
        ("#2024-01-15# - 3", "subtract"),
        ("#2024-01-15# * 2", "multiply"),
        ("3d * 2", "multiply"),
        ("#2024-01-15# + null", "add"),
    ],
)
def test_date_arithmetic_type_errors(source: str, reason: str) -> None:
    error = error_of(source)
    assert isinstance(error, TypeMismatchError), error
    assert error.reason == reason


@pytest.mark.parametrize("source", ["#9999-12-31# + 1d", "#0001-01-01# - 1d"])
def test_date_arithmetic_out_of_range_is_an_error_value(source: str) -> None:
    assert isinstance(error_of(source), EvaluationError)


# -- duration literals (architecture.md grammar, isa.md 5 duration) -------------------

DURATIONS: list[tuple[str, Duration]] = [
    ("3d", Duration(days=3)),
    ("3days", Duration(days=3)),
    ("1day", Duration(days=1)),
    ("2w", Duration(weeks=2)),
    ("2weeks", Duration(weeks=2)),
    ("1week", Duration(weeks=1)),
    ("1y", Duration(years=1)),
    ("2years", Duration(years=2)),
    ("1year", Duration(years=1)),
    ("3mo", Duration(months=3)),
    ("1month", Duration(months=1)),
    ("6months", Duration(months=6)),
    ("4h", Duration(hours=4)),
    ("1hour", Duration(hours=1)),
    ("4hours", Duration(hours=4)),
    ("15m", Duration(minutes=15)),
    ("15min", Duration(minutes=15)),
    ("1minute", Duration(minutes=1)),
    ("15minutes", Duration(minutes=15)),
    ("30s", Duration(seconds=30)),
    ("30sec", Duration(seconds=30)),
    ("1second", Duration(seconds=1)),
    ("30seconds", Duration(seconds=30)),
    ("500ms", Duration(milliseconds=500)),
    ("1millisecond", Duration(milliseconds=1)),
    ("500milliseconds", Duration(milliseconds=500)),
    ("2w3d", Duration(weeks=2, days=3)),
    ("1y2mo3w4d5h6m7s8ms", Duration(1, 2, 3, 4, 5, 6, 7, 8)),
    ("1year2months", Duration(years=1, months=2)),
    ("1d12h", Duration(days=1, hours=12)),
    ("90m", Duration(minutes=90)),
    ("1.5s", Duration(seconds=1, milliseconds=500)),
    ("1.5h", Duration(hours=1, minutes=30)),
    ("0.5d", Duration(hours=12)),
    ("0.25s", Duration(milliseconds=250)),
    ("1.5w", Duration(weeks=1, days=3, hours=12)),
    ("0.5mo", Duration(days=15)),
    ("0.5y", Duration(days=182, hours=12)),
    ("2.5days", Duration(days=2, hours=12)),
    ("1s2s", Duration(seconds=2)),
    ("0s", Duration()),
]


@pytest.mark.parametrize(("source", "expected"), DURATIONS, ids=ids(DURATIONS))
def test_duration_literals(source: str, expected: Duration) -> None:
    check(source, expected)


@pytest.mark.parametrize(
    "source",
    [
        "3 days",
        "3 d",
        "2 weeks",
        "3x",
        "3dd",
        "3D",
        "0.5ms",
        "1.5s200ms",
        "1.5s1s",
    ],
)
def test_malformed_duration_literals_are_parse_errors(source: str) -> None:
    assert isinstance(compile_expression(source), ParseError)


# -- relative dates with an injected clock (language.md "Dates", isa.md relative_date)

RELATIVE: list[tuple[str, datetime]] = [
    ("3d ago", datetime(2024, 6, 12, 12, 0, tzinfo=UTC)),
    ("2w from now", datetime(2024, 6, 29, 12, 0, tzinfo=UTC)),
    ("next 1mo", datetime(2024, 7, 15, 12, 0, tzinfo=UTC)),
    ("last 1y", datetime(2023, 6, 16, 12, 0, tzinfo=UTC)),
    ("1h30m ago", datetime(2024, 6, 15, 10, 30, tzinfo=UTC)),
    ("next 2h", datetime(2024, 6, 15, 14, 0, tzinfo=UTC)),
    ("last 1d", datetime(2024, 6, 14, 12, 0, tzinfo=UTC)),
    ("90s from now", datetime(2024, 6, 15, 12, 1, 30, tzinfo=UTC)),
    ("1.5d ago", datetime(2024, 6, 14, 0, 0, tzinfo=UTC)),
    ("3days ago", datetime(2024, 6, 12, 12, 0, tzinfo=UTC)),
    ("Date.now()", NOW),
]


@pytest.mark.parametrize(("source", "expected"), RELATIVE, ids=ids(RELATIVE))
def test_relative_dates_use_the_injected_clock(source: str, expected: datetime) -> None:
    actual = value_of(source)
    assert type(actual) is datetime
    assert actual == expected
    assert actual.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("d > 3d ago", True),
        ("e > 3d ago", False),
        ("e < 3d ago", True),
        ("t > 1h ago", True),
        ("t < 1h from now", True),
        ("(3d ago)::string", "2024-06-12T12:00:00Z"),
        ("(3d ago)::date", date(2024, 6, 12)),
        ("Date.now() - 3d ago", Duration(seconds=3 * 86400)),
        ("next 1d > last 1d", True),
        ("3d ago == Date.now() - 3d", True),
    ],
)
def test_relative_dates_meet_context_dates(source: str, expected: object) -> None:
    context = {
        "d": date(2024, 6, 13),
        "e": date(2024, 6, 12),
        "t": datetime(2024, 6, 15, 11, 30, tzinfo=UTC),
    }
    check(source, expected, context)


def test_the_clock_is_read_at_evaluation_time() -> None:
    moments = iter([datetime(2020, 1, 1, tzinfo=UTC), datetime(2030, 1, 1, tzinfo=UTC)])
    options = Options(clock=lambda: next(moments))
    compiled = compile_expression("1d ago")
    assert not isinstance(compiled, ParseError)
    assert compiled.evaluate({}, options) == datetime(2019, 12, 31, tzinfo=UTC)
    assert compiled.evaluate({}, options) == datetime(2029, 12, 31, tzinfo=UTC)


# -- casts (language.md "Type Casts", isa.md 5 cast) ----------------------------------

CAST_CONTEXT: dict[str, Any] = {
    "i": 42,
    "f": -1.5,
    "b": True,
    "d": date(2026, 8, 9),
    "t": datetime(2026, 8, 9, 10, 30, tzinfo=UTC),
    "u": Duration(weeks=2, days=3),
    "l": [1, 2],
    "m": {"a": 1},
    "n": None,
}
U = UNDEFINED
MIDNIGHT = datetime(2026, 8, 9, tzinfo=UTC)
MATRIX: list[tuple[str, tuple[object, ...]]] = [
    # source: integer, float, string, boolean, date, datetime, duration
    ("i", (42, 42.0, "42", U, U, U, U)),
    ("f", (-1, -1.5, "-1.5", U, U, U, U)),
    ("b", (U, U, "true", True, U, U, U)),
    ("d", (U, U, "2026-08-09", U, date(2026, 8, 9), MIDNIGHT, U)),
    ("t", (U, U, "2026-08-09T10:30:00Z", U, date(2026, 8, 9), CAST_CONTEXT["t"], U)),
    ("u", (U, U, "2w3d", U, U, U, Duration(weeks=2, days=3))),
    ("l", (U, U, U, U, U, U, U)),
    ("m", (U, U, U, U, U, U, U)),
    ("n", (U, U, U, U, U, U, U)),
]
MATRIX_CASES = [
    pytest.param(f"{name}::{target}", expected, id=f"{name}::{target}")
    for name, row in MATRIX
    for target, expected in zip(CAST_TYPES, row, strict=True)
]


@pytest.mark.parametrize(("source", "expected"), MATRIX_CASES)
def test_conversion_matrix(source: str, expected: object) -> None:
    check(source, expected, CAST_CONTEXT)


STRING_PARSES: list[tuple[str, object]] = [
    ('"-7"::integer', -7),
    ('"007"::integer', 7),
    ('"-0"::integer', 0),
    ('"+7"::integer', U),
    ('" 7"::integer', U),
    ('"7 "::integer', U),
    ('"4_2"::integer', U),
    ('"1.0"::integer', U),
    ('""::integer', U),
    ('"٣"::integer', U),
    ('"3"::float', 3.0),
    ('"-2.25"::float', -2.25),
    ('"1e3"::float', U),
    ('".5"::float', U),
    ('"5."::float', U),
    ('"+1.5"::float', U),
    ('"NaN"::float', U),
    ('"inf"::float', U),
    ('"true"::boolean', True),
    ('"false"::boolean', False),
    ('"True"::boolean', U),
    ('"1"::boolean', U),
    ('"yes"::boolean', U),
    ('" true"::boolean', U),
    ('"2026-08-09"::date', date(2026, 8, 9)),
    ('"2024-02-29"::date', date(2024, 2, 29)),
    ('"2023-02-29"::date', U),
    ('"2026-8-9"::date', U),
    ('"2026-08-09T10:00:00Z"::date', U),
    ('"2026-08-09T10:00:00Z"::datetime', datetime(2026, 8, 9, 10, 0, tzinfo=UTC)),
    ('"2026-08-09T12:00:00+02:00"::datetime::string', "2026-08-09T10:00:00Z"),
    ('"2026-08-09T00:30:00-01:00"::datetime::date', date(2026, 8, 9)),
    ('"2026-08-09T23:30:00-01:00"::datetime::date', date(2026, 8, 10)),
    ('"2026-08-09T10:00:00"::datetime', U),
    ('"2026-08-09"::datetime', U),
    ('"2026-08-09"::date::datetime', MIDNIGHT),
    ('"2026-08-09T12:00:00.5Z"::datetime::string', "2026-08-09T12:00:00.500000Z"),
    ('"2026-08-09T12:00:00.000Z"::datetime::string', "2026-08-09T12:00:00Z"),
    ('"2026-08-09T12:00:00.1234567Z"::datetime::string', "2026-08-09T12:00:00.123456Z"),
    ('"42\\n"::integer', U),
    ('"abc"::string', "abc"),
]


@pytest.mark.parametrize(("source", "expected"), STRING_PARSES, ids=ids(STRING_PARSES))
def test_string_parses_are_anchored(source: str, expected: object) -> None:
    check(source, expected)


DURATION_CASTS: list[tuple[str, object]] = [
    ('"30m3d"::duration::string', "3d30m"),
    ('"30m3d"::duration', Duration(days=3, minutes=30)),
    ('"1s2s"::duration', Duration(seconds=3)),
    ('"1s2s"::duration::string', "3s"),
    ('"0.5mo"::duration', Duration(days=15)),
    ('"0.5y"::duration', Duration(days=182, hours=12)),
    ('"1.5s"::duration::string', "1s500ms"),
    ('"1.5s200ms"::duration::string', "1s700ms"),
    ('"0.25s"::duration', Duration(milliseconds=250)),
    ('"1.0s"::duration', Duration(seconds=1)),
    ('"0.5s"::duration', Duration(milliseconds=500)),
    ('"0.5ms"::duration', U),
    ('".5s"::duration', U),
    ('"1.s"::duration', U),
    ('"1d "::duration', U),
    ('" 1d"::duration', U),
    ('"1d 2h"::duration', U),
    ('"-1d"::duration', U),
    ('"+1d"::duration', U),
    ('"1D"::duration', U),
    ('"d"::duration', U),
    ('"1"::duration', U),
    ('""::duration', U),
    ('"0s"::duration', Duration()),
    ('"0s"::duration::string', "0s"),
    ('"1y2mo3w4d5h6m7s8ms"::duration::string', "1y2mo3w4d5h6m7s8ms"),
    ('"8ms7s6m5h4d3w2mo1y"::duration::string', "1y2mo3w4d5h6m7s8ms"),
    ('"90m"::duration::string', "90m"),
    ("0s::string", "0s"),
    ("1.5h::string", "1h30m"),
    ("2w3d::string::duration === 2w3d", True),
]


@pytest.mark.parametrize(("source", "expected"), DURATION_CASTS, ids=ids(DURATION_CASTS))
def test_duration_parse_is_a_canonicaliser(source: str, expected: object) -> None:
    check(source, expected)


NUMERIC_CASTS: list[tuple[str, object]] = [
    ("1.9::integer", 1),
    ("(-1.9)::integer", -1),
    ("-1.9::integer", -1),
    ("0.5::integer", 0),
    ("42::float", 42.0),
    ("big::float", 9007199254740992.0),
    ("big::float::integer", 9007199254740992),
    ("2.5::string", "2.5"),
    ("0.1::string", "0.1"),
    ("3.0::string", "3.0"),
    ("(-7)::string", "-7"),
    ('-"1"::integer', -1),
    ('"42"::integer::float', 42.0),
    ('"42"::integer::float::string', "42.0"),
    ("1::boolean", U),
    ("0::boolean", U),
    ("true::integer", U),
    ("false::float", U),
    ("[1, 2]::string", U),
    ("{a: 1}::string", U),
    ("5::date", U),
    ("5::duration", U),
]


@pytest.mark.parametrize(("source", "expected"), NUMERIC_CASTS, ids=ids(NUMERIC_CASTS))
def test_numeric_casts_and_cast_precedence(source: str, expected: object) -> None:
    check(source, expected, {"big": 2**53 + 1})


def test_a_cast_binds_tighter_than_unary_minus() -> None:
    # "-7::string" negates the string "7".
    error = error_of("-7::string")
    assert (error.kind, error.reason) == ("TypeMismatchError", "unary_minus")


@pytest.mark.parametrize("source", ["1::list", "1::map", "1::int", "1::Integer", "1::", "1::5"])
def test_unknown_cast_types_are_parse_errors_naming_the_accepted_ones(source: str) -> None:
    error = compile_expression(source)
    assert isinstance(error, ParseError)
    if source != "1::5":
        assert "integer" in error.message
        assert "duration" in error.message


def test_a_bad_cast_inside_a_comparison_is_undefined_not_an_error() -> None:
    check("'abc'::integer > 5", UNDEFINED)
    check("'abc'::integer > 5 or true", True)


@pytest.mark.parametrize("target", CAST_TYPES)
def test_casts_are_total_even_for_non_finite_floats(target: str) -> None:
    # isa.md 5 cast: "cast is total over values ... never an error". Source cannot make
    # an infinity (float overflow is an error), but a host's context can hold one.
    for value in (math.inf, -math.inf, math.nan):
        result = evaluate(f"x::{target}", {"x": value})
        assert not isinstance(result, ExprError), f"{value}::{target} gave {result}"
    overflow = run("(Math.pow(2.0, 1023) * 2.0)::" + target)
    assert isinstance(overflow, EvaluationError)
    assert overflow.reason == "result_too_large"


# -- builtin functions (language.md "Builtin Functions") ------------------------------

FUNCTIONS: list[tuple[str, object]] = [
    ("len('hello')", 5),
    ("len('')", 0),
    ("len('héllo')", 5),
    ("upper('world')", "WORLD"),
    ("upper('MiXeD 1')", "MIXED 1"),
    ("lower('WORLD')", "world"),
    ("trim('  hi  ')", "hi"),
    ("trim('\\t\\nhi\\n')", "hi"),
    ("trim('a b')", "a b"),
    ("starts_with('hello world', 'hello')", True),
    ("starts_with('hello world', 'world')", False),
    ("starts_with('abc', '')", True),
    ("ends_with('report.csv', '.csv')", True),
    ("ends_with('report.csv', '.txt')", False),
    ("substring('hello world', 6)", "world"),
    ("substring('hello world', 0, 5)", "hello"),
    ("substring('hello', 1, 3)", "ell"),
    ("substring('hello', 3, 10)", "lo"),
    ("substring('hello', 10)", ""),
    ("substring('hello', 0, 0)", ""),
    ("index_of('hello world', 'world')", 6),
    ("index_of('hello world', 'o')", 4),
    ("index_of('hello world', 'nope')", -1),
    ("index_of('/a/b', '/') == 0", True),
    ("concat([1, 2], [3])", [1, 2, 3]),
    ("concat([], [])", []),
    ("concat(['a'], [[1]])", ["a", [1]]),
    ("concat([1, 2], [3]) == [1, 2] + [3]", True),
    ("Math.abs(-5)", 5),
    ("Math.abs(5)", 5),
    ("Math.abs(-2.5)", 2.5),
    ("Math.max(1, 2)", 2),
    ("Math.max(1, 2.5)", 2.5),
    ("Math.max(3, 2.5)", 3),
    ("Math.min(1.5, 1)", 1),
    ("Math.min(-1, -2)", -2),
    ("Math.pow(2, 10)", 1024),
    ("Math.pow(2, 10) === 1024", True),
    ("Math.pow(2, 0)", 1),
    ("Math.pow(2.0, 3)", 8.0),
    ("Math.pow(2.0, 3) === 8", False),
    ("Math.pow(2, -1)", 0.5),
    ("Math.pow(4, 0.5)", 2.0),
    ("Math.sqrt(144)", 12),
    ("Math.sqrt(144) === 12", True),
    ("Math.sqrt(0)", 0),
    ("Math.sqrt(2.25)", 1.5),
    ("Math.sqrt(16.0)", 4.0),
    ("Math.sqrt(2) > 1.414", True),
    ("Math.floor(3.9)", 3),
    ("Math.floor(-3.1)", -4),
    ("Math.floor(3)", 3),
    ("Math.ceil(3.1)", 4),
    ("Math.ceil(-3.9)", -3),
    ("Math.ceil(3.0)", 3),
    ("Math.round(3.5)", 4),
    ("Math.round(2.5)", 3),
    ("Math.round(2.4)", 2),
    ("Math.round(-2.5)", -3),
    ("Math.round(-2.4)", -2),
    ("Math.round(7)", 7),
    ("Date.year(#2024-03-15#)", 2024),
    ("Date.month(#2024-03-15#)", 3),
    ("Date.day(#2024-03-15#)", 15),
    ("Date.year(#2024-12-31T23:00:00Z#)", 2024),
    ("Date.month(#2024-12-31T23:00:00Z#)", 12),
    ("Date.day(#2024-12-31T23:00:00Z#)", 31),
    ("Date.year(created_at) == 2024", True),
    ("Date.day(3d ago)", 12),
    ("Date.now()", NOW),
    ("Date.now() > #2024-01-01#", True),
    ("Date.year(Date.now())", 2024),
]


@pytest.mark.parametrize(("source", "expected"), FUNCTIONS, ids=ids(FUNCTIONS))
def test_builtin_functions(source: str, expected: object) -> None:
    check(source, expected, {"created_at": date(2024, 3, 15)})


def test_math_random_is_a_float_in_the_unit_interval() -> None:
    for _ in range(50):
        value = value_of("Math.random()")
        assert type(value) is float
        assert 0.0 <= value < 1.0
    check("Math.random() < 1", True)


FUNCTION_ERRORS: list[tuple[str, str]] = [
    ("len(1)", "len"),
    ("upper(1)", "upper"),
    ("lower(null)", "lower"),
    ("trim([1])", "trim"),
    ("starts_with(1, 'a')", "starts_with"),
    ("ends_with('a', 1)", "ends_with"),
    ("substring(1, 0)", "substring"),
    ("substring('abc', '1')", "substring"),
    ("substring('abc', 1.0)", "substring"),
    ("index_of('abc', 1)", "index_of"),
    ("concat([1, 2], 3)", "concat"),
    ("concat('a', 'b')", "concat"),
    ("Math.abs('x')", "Math.abs"),
    ("Math.max(1, 'a')", "Math.max"),
    ("Math.min(null, 1)", "Math.min"),
    ("Math.pow('a', 2)", "Math.pow"),
    ("Math.sqrt(-1)", "Math.sqrt"),
    ("Math.floor('3.5')", "Math.floor"),
    ("Math.ceil(true)", "Math.ceil"),
    ("Math.round(undefined)", "Math.round"),
    ("Date.year('2024-01-01')", "Date.year"),
    ("Date.month(5)", "Date.month"),
    ("Date.day(3d)", "Date.day"),
    ("JSON.parse(1)", "JSON.parse"),
    ("len(missing)", "len"),
]


@pytest.mark.parametrize(("source", "name"), FUNCTION_ERRORS, ids=ids(FUNCTION_ERRORS))
def test_builtin_functions_fail_with_an_evaluation_error(source: str, name: str) -> None:
    error = error_of(source)
    assert isinstance(error, EvaluationError), error
    assert name in error.message
    assert error.span is not None
    assert (error.span.line, error.span.column) == (1, 1)


ARITY: list[tuple[str, str]] = [
    ("len()", "len"),
    ("len('a', 'b')", "len"),
    ("substring('a')", "substring"),
    ("substring('a', 1, 2, 3)", "substring"),
    ("Math.max(1)", "Math.max"),
    ("Math.random(1)", "Math.random"),
    ("Date.now(1)", "Date.now"),
    ("concat([1])", "concat"),
]


@pytest.mark.parametrize(("source", "name"), ARITY, ids=ids(ARITY))
def test_builtin_arity_mismatch(source: str, name: str) -> None:
    error = error_of(source)
    assert isinstance(error, EvaluationError)
    assert name in error.message


@pytest.mark.parametrize("source", ["nope(1)", "Math.nope(1)", "Date.tomorrow()", "a.b.c()"])
def test_unknown_functions(source: str) -> None:
    error = error_of(source)
    assert isinstance(error, EvaluationError)
    name = source.split("(")[0]
    assert error.reason == f"Unknown function: {name}"
    assert name in error.message


def test_every_documented_builtin_is_registered() -> None:
    documented = {
        "len",
        "upper",
        "lower",
        "trim",
        "starts_with",
        "ends_with",
        "substring",
        "index_of",
        "concat",
        "Math.abs",
        "Math.max",
        "Math.min",
        "Math.pow",
        "Math.sqrt",
        "Math.floor",
        "Math.ceil",
        "Math.round",
        "Math.random",
        "Date.year",
        "Date.month",
        "Date.day",
        "Date.now",
        "JSON.parse",
        "JSON.stringify",
    }
    assert documented <= set(BUILTINS)
    assert BUILTINS["substring"].accepts(2)
    assert BUILTINS["substring"].accepts(3)
    assert not BUILTINS["substring"].accepts(1)


JSON_STRINGIFY: list[tuple[str, str]] = [
    ("JSON.stringify({b: 1, a: 2})", '{"a":2,"b":1}'),
    ("JSON.stringify({b: {d: 1, c: 2}, a: [3, 1]})", '{"a":[3,1],"b":{"c":2,"d":1}}'),
    ("JSON.stringify([1, 2.5, null, true, 'x'])", '[1,2.5,null,true,"x"]'),
    ("JSON.stringify('say \"hi\"\\n')", '"say \\"hi\\"\\n"'),
    ("JSON.stringify('é')", '"é"'),
    ("JSON.stringify(null)", "null"),
    ("JSON.stringify(false)", "false"),
    ("JSON.stringify(-3)", "-3"),
    ("JSON.stringify(1.5)", "1.5"),
    ("JSON.stringify({})", "{}"),
    ("JSON.stringify([])", "[]"),
    ("JSON.stringify(#2024-01-15#)", '"2024-01-15"'),
    ("JSON.stringify(#2024-01-15T10:00:00Z#)", '"2024-01-15T10:00:00Z"'),
    ("JSON.stringify(user)", '{"age":30,"name":"John","tags":["a"]}'),
]


@pytest.mark.parametrize(("source", "expected"), JSON_STRINGIFY, ids=ids(JSON_STRINGIFY))
def test_json_stringify_is_compact_with_sorted_keys(source: str, expected: str) -> None:
    check(source, expected, {"user": {"name": "John", "tags": ["a"], "age": 30}})


JSON_PARSE: list[tuple[str, object]] = [
    ("JSON.parse('{\"a\": [1, 2.5, null, true, false]}')", {"a": [1, 2.5, None, True, False]}),
    ("JSON.parse('1') === 1", True),
    ("JSON.parse('1.0') === 1.0", True),
    ("JSON.parse('-0.5')", -0.5),
    ("JSON.parse('1e3')", 1000.0),
    ("JSON.parse('\"x\\\\ny\"')", "x\ny"),
    ("JSON.parse('\"\\\\u00e9\"')", "é"),
    ("JSON.parse('  [ ]  ')", []),
    ("JSON.parse('null')", None),
    ('JSON.parse(\'{"a": {"b": {}}}\').a.b', {}),
    ("JSON.parse(JSON.stringify({k: [1, 'two', null]}))", {"k": [1, "two", None]}),
]


@pytest.mark.parametrize(("source", "expected"), JSON_PARSE, ids=ids(JSON_PARSE))
def test_json_parse(source: str, expected: object) -> None:
    check(source, expected)


JSON_PARSE_ERRORS: list[tuple[str, str]] = [
    ("not json", "Invalid JSON: unexpected byte 0x6F at position 1"),
    ("", "Invalid JSON: unexpected end of input at position 0"),
    ("[1,]", "Invalid JSON: unexpected byte 0x5D at position 3"),
    ("{'a': 1}", "Invalid JSON: unexpected byte 0x27 at position 1"),
    ("1 2", "Invalid JSON: unexpected byte 0x32 at position 2"),
    ("[1", "Invalid JSON: unexpected end of input at position 2"),
    ("01", "Invalid JSON: unexpected byte 0x31 at position 1"),
]


@pytest.mark.parametrize(("text", "message"), JSON_PARSE_ERRORS, ids=ids(JSON_PARSE_ERRORS))
def test_json_parse_error_messages(text: str, message: str) -> None:
    error = error_of("JSON.parse(text)", {"text": text})
    assert isinstance(error, EvaluationError)
    assert (error.reason, error.message) == (message, message)


def test_json_stringify_refuses_non_finite_numbers() -> None:
    error = error_of("JSON.stringify(x)", {"x": math.inf})
    assert isinstance(error, EvaluationError)
    assert "JSON.stringify" in error.message


# -- host functions (guides/custom-functions.md) --------------------------------------


def _double(args: tuple[Any, ...]) -> Any:
    return args[0] * 2


def test_a_host_function_is_called_with_its_arguments() -> None:
    options = Options(functions={"double": Function(_double, 1)})
    check("double(score) > 100", True, {"score": 60}, options)
    check("double(21)", 42, {}, options)


def test_a_host_function_shadows_a_builtin_for_that_evaluation_only() -> None:
    options = Options(functions={"len": Function(lambda args: "custom_result", 1)})
    check("len('anything')", "custom_result", {}, options)
    check("len('hello')", 5)


def test_builtins_can_be_switched_off() -> None:
    options = Options(builtins=False, functions={"double": Function(_double, 1)})
    error = error_of("len('a')", {}, options)
    assert isinstance(error, EvaluationError)
    assert error.reason == "Unknown function: len"
    check("double(2)", 4, {}, options)


def test_pass_context_receives_data_host_and_clock() -> None:
    seen: list[CallContext] = []

    def role(args: tuple[Any, ...], context: CallContext) -> Any:
        seen.append(context)
        host = context.host
        assert isinstance(host, dict)
        return host["role"] == "admin"

    def current(args: tuple[Any, ...], context: CallContext) -> Any:
        return context.data.get("current_user_role", "guest")

    functions = {
        "is_admin": Function(role, 0, pass_context=True),
        "user_role": Function(current, 0, pass_context=True),
    }
    admin = Options(clock=_clock, functions=functions, host={"role": "admin"})
    guest = Options(clock=_clock, functions=functions, host={"role": "guest"})
    data = {"current_user_role": "admin"}
    check("is_admin()", True, data, admin)
    check("is_admin()", False, data, guest)
    check("user_role() == 'admin'", True, data, admin)
    check("user_role()", "guest", {}, admin)
    assert seen[0].data == data
    assert seen[0].now() == NOW


def test_a_function_without_pass_context_gets_only_its_arguments() -> None:
    received: list[tuple[Any, ...]] = []

    def spy(*call: Any) -> Any:
        received.append(call)
        return True

    check("spy(1, 'a')", True, {}, Options(functions={"spy": Function(spy, 2)}))
    assert received == [((1, "a"),)]


def test_undefined_arguments_arrive_as_the_undefined_singleton() -> None:
    received: list[Any] = []

    def spy(args: tuple[Any, ...]) -> Any:
        received.extend(args)
        return len(args)

    options = Options(functions={"spy": Function(spy, (1, 2))})
    check("spy(user.gone)", 1, {"user": {}}, options)
    check("spy(1, missing)", 2, {}, options)
    assert received[0] is UNDEFINED
    assert received[1:] == [1, UNDEFINED]
    assert received[2] is UNDEFINED


def test_function_error_becomes_an_evaluation_error() -> None:
    def divide(args: tuple[Any, ...]) -> Any:
        if args[1] == 0:
            raise FunctionError("Division by zero")
        return args[0] / args[1]

    options = Options(functions={"divide": Function(divide, 2)})
    check("divide(10, 2) == 5", True, {}, options)
    error = error_of("divide(10, 0)", {}, options)
    assert isinstance(error, EvaluationError)
    assert (error.reason, error.message) == ("Division by zero", "Division by zero")
    assert error.span is not None
    assert error.span.column == 1


@pytest.mark.parametrize(
    "exception", [RuntimeError("kaboom"), KeyError("k"), ZeroDivisionError(), TypeError("t")]
)
def test_any_exception_in_a_host_function_becomes_an_evaluation_error(
    exception: Exception,
) -> None:
    def broken(args: tuple[Any, ...]) -> Any:
        raise exception

    error = error_of("1 + broken()", {}, Options(functions={"broken": Function(broken, 0)}))
    assert isinstance(error, EvaluationError)
    assert "broken" in error.message
    assert error.span is not None
    assert error.span.column == 5


def test_host_function_arity() -> None:
    options = Options(
        functions={
            "one": Function(lambda args: 1, 1),
            "some": Function(lambda args: len(args), (0, 2)),
        }
    )
    check("some()", 0, {}, options)
    check("some(1, 2)", 2, {}, options)
    for source in ["one()", "one(1, 2)", "some(1)", "some(1, 2, 3)"]:
        error = error_of(source, {}, options)
        assert isinstance(error, EvaluationError), source
        assert source.split("(")[0] in error.message
    assert Function(lambda args: 1, (0, 2)).accepts(2)
    assert not Function(lambda args: 1, 1).accepts(0)


def test_a_dotted_host_function_name() -> None:
    options = Options(functions={"Geo.distance": Function(lambda args: args[0] - args[1], 2)})
    check("Geo.distance(10, 4)", 6, {}, options)


# -- object literals (language.md "Data Types") ---------------------------------------

OBJECTS: list[tuple[str, object]] = [
    ("{}", {}),
    ('{name: "John", age: 30}', {"name": "John", "age": 30}),
    ('{user: {role: "admin"}}', {"user": {"role": "admin"}}),
    ('{"a b": 1}', {"a b": 1}),
    ("{'single': 1}", {"single": 1}),
    ('{"null": 1}', {"null": 1}),
    ("{'undefined': 1}", {"undefined": 1}),
    ('{"if": 1, "else": 2, "while": 3}', {"if": 1, "else": 2, "while": 3}),
    ('{"true": 1}', {"true": 1}),
    ("{NULL: 1, Undefined: 2}", {"NULL": 1, "Undefined": 2}),
    ("{a: 1 + 2, b: [x, null], c: x > 1}", {"a": 3, "b": [5, None], "c": True}),
    ("{a: 1}.a", 1),
    ('{a: 1}["a"]', 1),
    ("{a: {b: [10, 20]}}.a.b[1]", 20),
    ("{a: 1}.b", UNDEFINED),
    ("{a: user.gone}", {"a": UNDEFINED}),
]


@pytest.mark.parametrize(("source", "expected"), OBJECTS, ids=ids(OBJECTS))
def test_object_literals(source: str, expected: object) -> None:
    check(source, expected, {"x": 5, "user": {}})


@pytest.mark.parametrize(
    "source", ["{a 1}", "{1: 2}", "{a: }", "{a: 1", "{a: 1 b: 2}", "{,}", "{a: 1,}"]
)
def test_malformed_object_literals_are_parse_errors(source: str) -> None:
    # architecture.md grammar: object -> "{" (object_entry ("," object_entry)*)? "}"
    # (no trailing comma, exactly as for lists).
    assert isinstance(compile_expression(source), ParseError)


# -- reserved words (language.md "Reserved words") ------------------------------------

RESERVED_EXPRESSIONS = [
    "{null: 1}",
    "{undefined: 1}",
    "{true: 1}",
    "{false: 1}",
    "{if: 1}",
    "{else: 1}",
    "{while: 1}",
    "user.if",
    "user.else",
    "user.while",
    "user.null",
    "user.undefined",
    "user.true",
    "if",
    "while",
    "else",
]


@pytest.mark.parametrize("source", RESERVED_EXPRESSIONS)
def test_reserved_words_are_parse_errors(source: str) -> None:
    result = compile_expression(source)
    assert isinstance(result, ParseError), result
    assert result.reason == "syntax"


@pytest.mark.parametrize("name", ["NULL", "Null", "UNDEFINED", "Undefined", "If", "WHILE"])
def test_only_lowercase_spellings_are_reserved(name: str) -> None:
    check(name, 7, {name: 7})
    check(f"user.{name}", 8, {"user": {name: 8}})


@pytest.mark.parametrize("key", ["if", "else", "while", "null", "undefined", "true"])
def test_reserved_words_can_be_reached_with_brackets(key: str) -> None:
    check(f'user["{key}"]', 1, {"user": {key: 1}})


# -- '=' and control flow in expression mode (language.md, architecture.md) -----------


@pytest.mark.parametrize(
    ("source", "column"),
    [("x = 1", 3), ("user.name = 'x'", 11), ("a == 1 = 2", 8), ("(x = 1)", 4), ("[x = 1]", 4)],
)
def test_assignment_in_an_expression_is_a_parse_error_naming_equality(
    source: str, column: int
) -> None:
    error = compile_expression(source)
    assert isinstance(error, ParseError)
    assert "==" in error.message
    assert error.span is not None
    assert (error.span.line, error.span.column) == (1, column)


@pytest.mark.parametrize(
    "source", ["if x { }", "if x { y = 1 } else { y = 2 }", "while x { }", "1 + if"]
)
def test_control_flow_in_an_expression_is_a_parse_error(source: str) -> None:
    error = compile_expression(source)
    assert isinstance(error, ParseError)
    keyword = "while" if "while" in source else "if"
    assert keyword in error.message
    assert "program" in error.message


# -- error spans (language.md "Positions and spans on errors") ------------------------

SPANS: list[tuple[str, str, int, int]] = [
    ("unbound + 1", "UndefinedVariableError", 1, 1),
    ("1 + unbound", "UndefinedVariableError", 1, 5),
    ("not unbound", "UndefinedVariableError", 1, 5),
    ("score >> 85", "ParseError", 1, 8),
    ("score AND", "ParseError", 1, 10),
    ("score >>", "ParseError", 1, 8),
    ("1 @ 2", "ParseError", 1, 3),
    ("'unterminated", "ParseError", 1, 1),
    ("#2024-13-01#", "ParseError", 1, 1),
    ("10 / 0", "EvaluationError", 1, 4),
    ("1 + true", "TypeMismatchError", 1, 3),
    ("nope()", "EvaluationError", 1, 1),
    ("1 +\n  2 +\n   foo", "UndefinedVariableError", 3, 4),
    ("1 +\n  (2 >> 3)", "ParseError", 2, 7),
    ("'a\nb' + \n\n  true", "TypeMismatchError", 2, 4),
    ("[1,\n 2,\n 3] + x", "TypeMismatchError", 3, 5),
    ("x\n  =\n 1", "ParseError", 2, 3),
]


@pytest.mark.parametrize(("source", "kind", "line", "column"), SPANS, ids=ids(SPANS))
def test_errors_point_at_the_blamed_token(source: str, kind: str, line: int, column: int) -> None:
    error = error_of(source, {"score": 1, "x": 5})
    assert error.kind == kind, error
    assert error.span is not None
    assert (error.span.line, error.span.column) == (line, column)


def test_a_span_covers_the_whole_token() -> None:
    error = error_of("unbound + 1")
    assert error.span is not None
    assert (error.span.end_line, error.span.end_column) == (1, 8)


def test_compile_errors_are_the_same_values_as_evaluate_errors() -> None:
    compiled = compile_expression("score >> 85")
    evaluated = evaluate("score >> 85", {"score": 1})
    assert isinstance(compiled, ParseError)
    assert compiled == evaluated
    assert compiled.kind == "ParseError"


# -- robustness at the numeric edges --------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "Math.pow(10, 400) * 1.5",
        "Math.pow(10, 400) + 0.5",
        '"a" + Math.pow(10, 5000)',
    ],
)
def test_numeric_overflow_is_a_reasoned_error_not_an_internal_one(source: str) -> None:
    # errors.py: every failure carries a reason token; "internal_error" is the
    # defensive catch-all for an unexpected Python exception.
    error = error_of(source)
    assert error.reason != "internal_error", error
