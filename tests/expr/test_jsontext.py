"""The one JSON rule (``statifier.expr.jsontext.loads``): each rule refused with its
name and position, the same rule behind ``JSON.parse``, and a property: the parser
accepts exactly the texts that are valid JSON, finite, free of lone surrogates and
within the bounds, and answers what Python's own parser answers for them."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statifier.expr import evaluate
from statifier.expr.errors import EvaluationError
from statifier.expr.jsontext import MAX_JSON_DEPTH, JSONTextError, dumps, loads

REFUSED: list[tuple[str | bytes, str, str]] = [
    ("{oops", "syntax", "unexpected byte 0x6F at position 1"),
    ("[1,]", "syntax", "unexpected byte 0x5D at position 3"),
    ("", "syntax", "unexpected end of input at position 0"),
    (b"\xff\xfe{}", "utf-8", "invalid UTF-8 at position 0"),
    (b'{"a": "\xc3"}', "utf-8", "invalid UTF-8 at position 7"),
    (b'{"k": "\xed\xa0\x80"}', "surrogate", "a lone surrogate U+D800 at position 7"),
    ('{"k": "\ud800"}', "surrogate", "a lone surrogate U+D800 at position 7"),
    ('{"k": "\\ud800"}', "surrogate", "a lone surrogate U+D800 at position 7"),
    ('["\\udc00"]', "surrogate", "a lone surrogate U+DC00 at position 2"),
    ('["\\ud800\\u0041"]', "surrogate", "a lone surrogate U+D800 at position 2"),
    ('{"n": 1e999999}', "non-finite", "a non-finite number (out of range) at position 6"),
    ("[-1.5e400]", "non-finite", "a non-finite number (out of range) at position 1"),
    ('{"n": NaN}', "non-finite", "a non-finite number (NaN) at position 6"),
    ("[Infinity]", "non-finite", "a non-finite number (Infinity) at position 1"),
    ("[1, -Infinity]", "non-finite", "a non-finite number (-Infinity) at position 4"),
    ("[" * 129 + "]" * 129, "depth", "nesting deeper than 128 at position 128"),
    ('{"a":' * 129 + "1" + "}" * 129, "depth", "nesting deeper than 128 at position 640"),
    ("9" * 5000, "size", "number too long at position 0"),
]


@pytest.mark.parametrize(("text", "rule", "message"), REFUSED)
def test_each_rule_is_refused_by_name_and_position(
    text: str | bytes, rule: str, message: str
) -> None:
    with pytest.raises(JSONTextError) as refused:
        loads(text)
    assert (refused.value.rule, str(refused.value)) == (rule, message)


def test_within_the_rules_everything_json_is_taken() -> None:
    assert loads('["\\ud83d\\ude00", "é", "\\u00e9"]') == ["\U0001f600", "é", "é"]
    assert loads(b'{"n": 1e-999999, "m": -0, "big": 1e308}') == {"n": 0.0, "m": 0, "big": 1e308}
    assert loads("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) is not None
    assert loads("9" * 4000) == int("9" * 4000)


def test_a_size_bound_counts_the_utf8_bytes() -> None:
    assert loads('"éé"', max_bytes=6) == "éé"
    with pytest.raises(JSONTextError) as refused:
        loads('"ééé"', max_bytes=6)
    assert (refused.value.rule, str(refused.value)) == ("size", "8 bytes, over the 6")


def test_json_parse_in_expressions_keeps_the_same_rule() -> None:
    for text, reason in (
        ('{"k": "\\ud800"}', "Invalid JSON: a lone surrogate U+D800 at position 7"),
        ("1e400", "Invalid JSON: a non-finite number (out of range) at position 0"),
    ):
        error = evaluate("JSON.parse(t)", {"t": text})
        assert isinstance(error, EvaluationError)
        assert error.reason == reason


# The property: exactly what Python's strict parser takes and a strict check of the
# value keeps.


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _within(value: object, depth: int) -> bool:
    """Finite numbers, strings that are UTF-8, containers at most 128 deep."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, list):
        return depth < MAX_JSON_DEPTH and all(_within(item, depth + 1) for item in value)
    if isinstance(value, dict):
        return depth < MAX_JSON_DEPTH and all(
            _within(key, depth + 1) and _within(item, depth + 1) for key, item in value.items()
        )
    return True


def reference(text: str | bytes, max_bytes: int | None) -> tuple[bool, object]:
    """Whether the rule takes ``text``, and its value, by Python's own parser."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if max_bytes is not None and len(data) > max_bytes:
        return False, None
    try:
        value = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return False, None
    return (True, value) if _within(value, 0) else (False, None)


def same(left: object, right: object) -> bool:
    """Equal, and of the same types all the way down (1 is not 1.0, -0.0 is not 0.0)."""
    if type(left) is not type(right):
        return False
    if isinstance(left, dict):
        assert isinstance(right, dict)
        return left.keys() == right.keys() and all(same(left[k], right[k]) for k in left)
    if isinstance(left, list):
        assert isinstance(right, list)
        return len(left) == len(right) and all(map(same, left, right))
    if isinstance(left, float):
        assert isinstance(right, float)
        return left == right and math.copysign(1, left) == math.copysign(1, right)
    return left == right


# Drawn apart from the other characters: inside one alphabet, surrogates would be
# 2,048 code points among a million and almost never drawn.
SURROGATES = st.characters(categories=["Cs"])
STRINGS = st.lists(st.characters() | SURROGATES, max_size=6).map("".join)
NUMBER_TEXT = st.from_regex(
    r"-?(0|[1-9][0-9]{0,3})(\.[0-9]{1,3})?([eE][+-]?[0-9]{1,7})?", fullmatch=True
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()  # NaN and the infinities included
    | STRINGS
)
VALUES = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(STRINGS, children, max_size=4)
    ),
    max_leaves=12,
)
WRITTEN = st.builds(
    lambda value, ascii_only: json.dumps(value, ensure_ascii=ascii_only, allow_nan=True),
    VALUES,
    st.booleans(),
)
NESTED = st.builds(
    lambda depth, kind, inner: (
        "[" * depth + inner + "]" * depth if kind else '{"k":' * depth + inner + "}" * depth
    ),
    st.integers(MAX_JSON_DEPTH - 3, MAX_JSON_DEPTH + 3),
    st.booleans(),
    st.sampled_from(["1", "[]", "{}", '"x"', "NaN"]),
)
FRAGMENTS = st.text(
    st.sampled_from(list('[]{}",:0123456789.eE+- \\utrfalsnNIy\ud800é')), max_size=16
)
SPLICED = st.builds(
    lambda text, at, piece: text[: at % (len(text) + 1)] + piece + text[at % (len(text) + 1) :],
    WRITTEN,
    st.integers(0, 1_000),
    FRAGMENTS | NUMBER_TEXT,
)
TEXTS: st.SearchStrategy[str | bytes] = (
    WRITTEN
    | NESTED
    | NUMBER_TEXT
    | FRAGMENTS
    | SPLICED
    | st.binary(max_size=16)
    | WRITTEN.map(lambda text: text.encode("utf-8", "surrogatepass"))
)


@settings(
    max_examples=600,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(TEXTS, st.none() | st.integers(0, 400))
def test_the_parser_takes_exactly_finite_valid_json_within_the_bounds(
    text: str | bytes, max_bytes: int | None
) -> None:
    taken, expected = reference(text, max_bytes)
    if not taken:
        with pytest.raises(JSONTextError):
            loads(text, max_bytes=max_bytes)
        return
    value = loads(text, max_bytes=max_bytes)
    assert same(value, expected), f"{text!r}: {value!r} is not {expected!r}"
    assert same(loads(dumps(value)), value)
