"""Location expressions: resolve, put and assign (guides/location-expressions.md)."""

from __future__ import annotations

import copy
from typing import Any, cast

import pytest

from statifier.expr import UNDEFINED, ParseError, assign, nodes, resolve
from statifier.expr import location as location_module
from statifier.expr.errors import LocationError
from statifier.expr.location import put

REASONS = {
    "not_assignable",
    "invalid_node",
    "undefined_variable",
    "invalid_key",
    "computed_key",
    "not_a_container",
    "invalid_index",
}

DATA: dict[str, Any] = {
    "index": 2,
    "i": 1,
    "k": "name",
    "f": 1.5,
    "b": True,
    "n": None,
    "l": [0],
    "cursor": {"row": 3},
    "rows": [5, 6],
    "items": [1, 2],
    "user": {"id": 1},
}


def ids(table: list[tuple[Any, ...]]) -> list[str]:
    return [str(row[0]) for row in table]


def location_error(result: object) -> LocationError:
    assert isinstance(result, LocationError), f"expected a LocationError, got {result!r}"
    assert result.kind == "LocationError"
    assert result.reason in REASONS
    return result


# -- resolve ----------------------------------------------------------------------------

PATHS: list[tuple[str, tuple[str | int, ...]]] = [
    ("user", ("user",)),
    ("score", ("score",)),
    ("user.profile.name", ("user", "profile", "name")),
    ("config.database.host", ("config", "database", "host")),
    ("items[0]", ("items", 0)),
    ("user['profile']", ("user", "profile")),
    ('data["key"]', ("data", "key")),
    ("data['users'][index]['profile']", ("data", "users", 2, "profile")),
    ("user.settings['theme']", ("user", "settings", "theme")),
    ("data['users'][0].profile", ("data", "users", 0, "profile")),
    ("user.profile.settings['theme']", ("user", "profile", "settings", "theme")),
    ("data['users'][2]['name']", ("data", "users", 2, "name")),
    ("items[i]", ("items", 1)),
    ("a.b[k]", ("a", "b", "name")),
    ("items[cursor.row]", ("items", 3)),
    ("items[rows[1]]", ("items", 6)),
    ("items[(0)]", ("items", 0)),
    ("(user).name", ("user", "name")),
    ("missing.x", ("missing", "x")),
    ("user['if']", ("user", "if")),
    ("NULL.x", ("NULL", "x")),
]


@pytest.mark.parametrize(("source", "path"), PATHS, ids=ids(PATHS))
def test_resolve_valid_targets(source: str, path: tuple[str | int, ...]) -> None:
    resolved = resolve(source, DATA)
    assert resolved == path
    assert type(resolved) is tuple


NOT_ASSIGNABLE = [
    "42",
    '"hello"',
    "true",
    "null",
    "undefined",
    "#2024-01-15#",
    "#2024-01-15T10:00:00Z#",
    "3d",
    "3d ago",
    "len(name)",
    "upper(role)",
    "Math.max(a, b)",
    "score + 1",
    "-score",
    "!flag",
    "not flag",
    "score > 85",
    'name == "John"',
    "a and b",
    "a or b",
    "x in [1]",
    "[1, 2]",
    "{a: 1}",
    "score::string",
    "(a + b).c",
    "len(x).y",
    "[1][0]",
]


@pytest.mark.parametrize("source", NOT_ASSIGNABLE)
def test_not_assignable(source: str) -> None:
    error = location_error(resolve(source, DATA))
    assert error.reason == "not_assignable"
    assert error.span is not None


@pytest.mark.parametrize(
    "source", ["items[missing_var]", "items[missing.x]", "a[zz][c]", "a[0][zz]"]
)
def test_undefined_variable_in_a_bracket_key(source: str) -> None:
    error = location_error(resolve(source, DATA))
    assert error.reason == "undefined_variable"


def test_an_undefined_variable_error_points_at_the_key() -> None:
    error = location_error(resolve("items[missing_var]", {}))
    assert error.span is not None
    assert (error.span.line, error.span.column) == (1, 7)


INVALID_KEYS = [
    "items[f]",
    "items[b]",
    "items[n]",
    "items[l]",
    "items[cursor]",
    "items[cursor.missing]",
    "items[1.5]",
    "items[true]",
    "items[null]",
    "items[undefined]",
]


@pytest.mark.parametrize("source", INVALID_KEYS)
def test_invalid_key(source: str) -> None:
    assert location_error(resolve(source, DATA)).reason == "invalid_key"


COMPUTED_KEYS = [
    "items[i + 1]",
    "items[len(k)]",
    "items[-i]",
    "items['a' + 'b']",
    "items[k::integer]",
    "items[[0]]",
    "items[i > 0]",
    "items[Math.max(1, 2)]",
]


@pytest.mark.parametrize("source", COMPUTED_KEYS)
def test_computed_key(source: str) -> None:
    assert location_error(resolve(source, DATA)).reason == "computed_key"


def test_a_negative_literal_index_resolves_and_then_fails_as_invalid_index() -> None:
    # guides/location-expressions.md: context_assign(%{"items" => [1, 2]},
    # "items[-1]", "x") is an :invalid_index error - the negative literal is a
    # literal index, not a computed key.
    assert resolve("items[-1]", DATA) == ("items", -1)
    error = location_error(assign({"items": [1, 2]}, "items[-1]", "x"))
    assert error.reason == "invalid_index"


@pytest.mark.parametrize("source", ["x = 1", "1 +", "items[", "", "if x { }"])
def test_source_that_does_not_parse_gives_a_parse_error(source: str) -> None:
    assert isinstance(resolve(source, DATA), ParseError)
    assert isinstance(assign({}, source, 1), ParseError)


def test_invalid_node_is_a_documented_reason() -> None:
    # A node the resolver does not know cannot come from source: every node the
    # parser builds is either a location or refused as not_assignable.
    assert LocationError.__doc__ is not None
    assert "invalid_node" in LocationError.__doc__
    unknown = cast(nodes.Expression, object())
    with pytest.raises(location_module.LocationFailure) as raised:
        location_module._path(unknown, {})
    assert raised.value.error.reason == "invalid_node"


# -- put ----------------------------------------------------------------------------------

PUTS: list[tuple[str, dict[str, Any], tuple[str | int, ...], object, dict[str, Any]]] = [
    ("nested maps", {}, ("user", "profile", "name"), "Ada", {"user": {"profile": {"name": "Ada"}}}),
    ("root", {"a": 1}, ("a",), 2, {"a": 2}),
    ("list vivified", {}, ("items", 0), "x", {"items": ["x"]}),
    ("padding", {"items": [1]}, ("items", 2), "x", {"items": [1, UNDEFINED, "x"]}),
    ("list then map", {}, ("d", "users", 0, "name"), "A", {"d": {"users": [{"name": "A"}]}}),
    ("siblings kept", {"u": {"id": 1}}, ("u", "name"), "A", {"u": {"id": 1, "name": "A"}}),
    ("leaf map overwritten", {"u": {"a": {"b": 1}}}, ("u", "a"), 3, {"u": {"a": 3}}),
    ("leaf list overwritten", {"u": [1, 2]}, ("u",), [], {"u": []}),
    ("through null", {"a": None}, ("a", "b"), 1, {"a": {"b": 1}}),
    ("through undefined", {"a": UNDEFINED}, ("a", 1), 1, {"a": [UNDEFINED, 1]}),
    ("into padding", {"a": [0]}, ("a", 2, "k"), 1, {"a": [0, UNDEFINED, {"k": 1}]}),
    (
        "deep existing",
        {"a": {"b": [1, {"c": 2}]}},
        ("a", "b", 1, "c"),
        3,
        {"a": {"b": [1, {"c": 3}]}},
    ),
    ("value undefined", {}, ("a",), UNDEFINED, {"a": UNDEFINED}),
    ("value none", {}, ("a", "b"), None, {"a": {"b": None}}),
]


@pytest.mark.parametrize(("name", "data", "path", "value", "expected"), PUTS, ids=ids(PUTS))
def test_put(
    name: str,
    data: dict[str, Any],
    path: tuple[str | int, ...],
    value: object,
    expected: dict[str, Any],
) -> None:
    before = copy.deepcopy(data)
    result = put(data, path, value)
    assert result == expected
    assert data == before


PUT_ERRORS: list[tuple[str, dict[str, Any], list[Any], str]] = [
    ("scalar interior", {"user": 5}, ["user", "profile", "name"], "not_a_container"),
    ("string interior", {"a": "str"}, ["a", "x"], "not_a_container"),
    ("index into scalar", {"a": 5}, ["a", 0], "not_a_container"),
    ("index into string", {"a": "abc"}, ["a", 0], "not_a_container"),
    ("bool interior", {"a": {"b": True}}, ["a", "b", "c"], "not_a_container"),
    ("list element scalar", {"a": [1]}, ["a", 0, "x"], "not_a_container"),
    ("negative leaf", {"a": [1]}, ["a", -1], "invalid_index"),
    ("negative interior", {"a": [[1]]}, ["a", -1, 0], "invalid_index"),
    ("negative fresh", {}, ["a", -2], "invalid_index"),
    ("empty path", {}, [], "not_assignable"),
    ("float step", {"a": {}}, ["a", 1.5], "invalid_key"),
    ("none step", {"a": {}}, ["a", None], "invalid_key"),
]


@pytest.mark.parametrize(("name", "data", "path", "reason"), PUT_ERRORS, ids=ids(PUT_ERRORS))
def test_put_errors(name: str, data: dict[str, Any], path: list[Any], reason: str) -> None:
    before = copy.deepcopy(data)
    error = location_error(put(data, path, "v"))
    assert error.reason == reason
    assert data == before


# -- assign ----------------------------------------------------------------------------

ASSIGNS: list[tuple[str, dict[str, Any], object, dict[str, Any]]] = [
    ("user.profile.name", {}, "Ada", {"user": {"profile": {"name": "Ada"}}}),
    ("data['users'][0].name", {}, "Ada", {"data": {"users": [{"name": "Ada"}]}}),
    ("user.name", {"user": {"id": 1}}, "Ada", {"user": {"id": 1, "name": "Ada"}}),
    ("items[2]", {"items": [1]}, "x", {"items": [1, UNDEFINED, "x"]}),
    ("items[i]", {"items": [1, 2], "i": 0}, 9, {"items": [9, 2], "i": 0}),
    ("m[k]", {"m": {}, "k": "key"}, 1, {"m": {"key": 1}, "k": "key"}),
    ("m.x", {"m": {"x": [1, 2]}}, {"new": 1}, {"m": {"x": {"new": 1}}}),
    ("score", {"score": 1}, 2, {"score": 2}),
]


@pytest.mark.parametrize(("source", "data", "value", "expected"), ASSIGNS, ids=ids(ASSIGNS))
def test_assign(source: str, data: dict[str, Any], value: object, expected: dict[str, Any]) -> None:
    before = copy.deepcopy(data)
    assert assign(data, source, value) == expected
    assert data == before


@pytest.mark.parametrize(
    ("source", "data", "reason"),
    [
        ("user.profile.name", {"user": 5}, "not_a_container"),
        ("items[k]", {"items": [1, 2], "k": -1}, "invalid_index"),
        ("items[missing]", {"items": []}, "undefined_variable"),
        ("items[i + 1]", {"items": [], "i": 0}, "computed_key"),
        ("items[f]", {"items": [], "f": 0.5}, "invalid_key"),
        ("len(name)", {}, "not_assignable"),
        ("42", {}, "not_assignable"),
    ],
)
def test_assign_errors(source: str, data: dict[str, Any], reason: str) -> None:
    before = copy.deepcopy(data)
    assert location_error(assign(data, source, "v")).reason == reason
    assert data == before


def test_writes_copy_the_containers_on_the_path() -> None:
    tags = ["a"]
    profile: dict[str, Any] = {"tags": tags, "name": "x"}
    data: dict[str, Any] = {"user": {"profile": profile}, "other": {"k": 1}}
    result = assign(data, "user.profile.tags[1]", "b")
    assert isinstance(result, dict)
    assert result["user"]["profile"]["tags"] == ["a", "b"]
    assert tags == ["a"]
    assert profile == {"tags": ["a"], "name": "x"}
    assert result is not data
    assert result["user"] is not data["user"]
    assert result["user"]["profile"] is not profile
    assert result["other"] == {"k": 1}


def test_repeated_assignment_composes() -> None:
    data: dict[str, Any] = {}
    for source, value in [("a.b", 1), ("a.c[1]", 2), ("a.b", 3), ("d", [])]:
        result = assign(data, source, value)
        assert isinstance(result, dict)
        data = result
    assert data == {"a": {"b": 3, "c": [UNDEFINED, 2]}, "d": []}
