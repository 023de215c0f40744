"""Statement programs: assignment, control flow, the loop budget and partial contexts.

Checks language.md "Statements and control flow", isa.md 2 "Two execution modes",
isa.md 5 ``store`` and the SCXML error-semantics design note (execute returns the
context as of the last completed statement alongside the error).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from datetime import date
from typing import Any, cast

import pytest

from statifier.expr import (
    UNDEFINED,
    ExprError,
    Options,
    ParseError,
    ProgramResult,
    compile_program,
    execute,
)
from statifier.expr.errors import EvaluationError, TypeMismatchError, UndefinedVariableError
from statifier.expr.tagged import encode


def typed(value: object) -> str:
    return json.dumps(encode(value), sort_keys=True)


def run(
    source: str, context: Mapping[str, Any] | None = None, options: Options | None = None
) -> ProgramResult:
    result = execute(source, {} if context is None else context, options or Options())
    assert not isinstance(result, ParseError), f"{source!r} did not parse: {result}"
    return result


def ok(
    source: str, context: Mapping[str, Any] | None = None, options: Options | None = None
) -> dict[str, Any]:
    result = run(source, context, options)
    assert result.error is None, f"{source!r} failed: {result.error}"
    return result.context


def failed(
    source: str, context: Mapping[str, Any] | None = None, options: Options | None = None
) -> ProgramResult:
    result = run(source, context, options)
    assert result.error is not None, f"{source!r} succeeded with {result.context}"
    return result


def ids(table: list[tuple[Any, ...]]) -> list[str]:
    return [str(row[0]) for row in table]


# -- assignment and auto-vivification (isa.md 5 store, location-expressions guide) ----

ASSIGNMENTS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("x = 1", {}, {"x": 1}),
    ("x = 1; x = x + 1", {}, {"x": 2}),
    ("x = 'a'; y = x + 'b'", {}, {"x": "a", "y": "ab"}),
    ("x = null", {}, {"x": None}),
    ("x = undefined", {}, {"x": UNDEFINED}),
    ("x = user.gone", {"user": {}}, {"user": {}, "x": UNDEFINED}),
    ("x = [1, {a: 2}]", {}, {"x": [1, {"a": 2}]}),
    ("x = #2024-01-15# + 1d", {}, {"x": date(2024, 1, 16)}),
    ("a.b.c = 1", {}, {"a": {"b": {"c": 1}}}),
    ("a[2] = 'x'", {}, {"a": [UNDEFINED, UNDEFINED, "x"]}),
    ("a[0] = 'x'", {}, {"a": ["x"]}),
    ("a[0].b = 1", {}, {"a": [{"b": 1}]}),
    ("a.b[1] = 1", {}, {"a": {"b": [UNDEFINED, 1]}}),
    ("a['k'] = 1", {}, {"a": {"k": 1}}),
    ("data['users'][0].name = 'Ada'", {}, {"data": {"users": [{"name": "Ada"}]}}),
    ("items[3] = 9", {"items": [1, 2]}, {"items": [1, 2, UNDEFINED, 9]}),
    ("items[0] = 9", {"items": [1, 2]}, {"items": [9, 2]}),
    ("items[2] = 3", {"items": [1, 2]}, {"items": [1, 2, 3]}),
    ("user.name = 'Ada'", {"user": {"id": 1}}, {"user": {"id": 1, "name": "Ada"}}),
    ("user = 5", {"user": {"id": 1}}, {"user": 5}),
    ("user.tags = 'none'", {"user": {"tags": [1]}}, {"user": {"tags": "none"}}),
    ("n.x = 1", {"n": None}, {"n": {"x": 1}}),
    ("n[1] = 1", {"n": None}, {"n": [UNDEFINED, 1]}),
    ("u.x = 1", {"u": UNDEFINED}, {"u": {"x": 1}}),
    ("m.a.b = 1", {"m": {"a": None}}, {"m": {"a": {"b": 1}}}),
    ("l[1].x = 1", {"l": [0, UNDEFINED]}, {"l": [0, {"x": 1}]}),
    ("items[i] = 'z'", {"items": ["a", "b"], "i": 1}, {"items": ["a", "z"], "i": 1}),
    ("items[i + 1] = 'z'", {"items": ["a"], "i": 0}, {"items": ["a", "z"], "i": 0}),
    ("m[k] = 1", {"m": {}, "k": "key"}, {"m": {"key": 1}, "k": "key"}),
    ("m[k + '2'] = 1", {"m": {}, "k": "key"}, {"m": {"key2": 1}, "k": "key"}),
    ("user['if'] = 1", {"user": {}}, {"user": {"if": 1}}),
    ("NULL = 1; Undefined = 2", {}, {"NULL": 1, "Undefined": 2}),
    ("x = [1]; x[0] = x", {}, {"x": [[1]]}),
]


@pytest.mark.parametrize(("source", "context", "expected"), ASSIGNMENTS, ids=ids(ASSIGNMENTS))
def test_assignment(source: str, context: dict[str, Any], expected: dict[str, Any]) -> None:
    assert typed(ok(source, context)) == typed(expected)


def test_padding_uses_the_undefined_singleton() -> None:
    result = ok("a[2] = 1")
    assert result["a"][0] is UNDEFINED
    assert result["a"][1] is UNDEFINED


def test_assigned_values_are_readable_by_later_statements() -> None:
    result = ok("a.b = 2; c = a.b * 10; d = a['b'] + c")
    assert result == {"a": {"b": 2}, "c": 20, "d": 22}


@pytest.mark.parametrize(
    "source",
    [
        "undefined = 3",
        "null = 3",
        "true = 3",
        "false = 3",
        "if = 3",
        "else = 3",
        "while = 3",
        "user.if = 3",
        "user.null = 1",
        "user.undefined = 1",
        "x = {if: 1}",
        "len(x) = 3",
        "x + 1 = 3",
        "1 = 2",
        "'a' = 1",
        "[x] = 1",
        "x::string = 1",
        "-x = 1",
        "y = x = 1",
        "x = 1 y = 2",
        "x = ",
        "= 1",
        "x = 1;;",
        ";",
        "{ x = 1 }",
        "else { }",
    ],
)
def test_statements_that_do_not_parse(source: str) -> None:
    result = compile_program(source)
    assert isinstance(result, ParseError), result


@pytest.mark.parametrize("source", ["if x = 1 { }", "while x = 1 { }", "y = (x = 1)"])
def test_an_equals_sign_in_expression_position_names_double_equals(source: str) -> None:
    # language.md: "a bare = in expression position is a parse error naming ==".
    result = compile_program(source)
    assert isinstance(result, ParseError)
    assert "==" in result.message, result.message


# -- if / else / else if (language.md "if/else") --------------------------------------

BRANCHES: list[tuple[str, int, str]] = [
    ("if s > 10 { g = 'A' }", 11, "A"),
    ("if s > 10 { g = 'A' }", 5, "unset"),
    ("if s > 10 { g = 'A' } else { g = 'B' }", 5, "B"),
    ("if s > 10 { g = 'A' } else if s > 4 { g = 'B' } else { g = 'C' }", 11, "A"),
    ("if s > 10 { g = 'A' } else if s > 4 { g = 'B' } else { g = 'C' }", 5, "B"),
    ("if s > 10 { g = 'A' } else if s > 4 { g = 'B' } else { g = 'C' }", 1, "C"),
    ("if s > 10 { g = 'A' } else if s > 4 { g = 'B' }", 1, "unset"),
    ("if s > 10 { g = 'A' } else { if s > 4 { g = 'B' } else { g = 'C' } }", 5, "B"),
    ("if s > 0 { if s > 3 { g = 'big' } else { g = 'small' } }", 2, "small"),
    ("if (s > 0) { g = 'paren' }", 2, "paren"),
    ("if s > 0 and s < 3 { g = 'and' }", 2, "and"),
]


@pytest.mark.parametrize(
    ("source", "score", "grade"),
    BRANCHES,
    ids=[f"{row[0]}|s={row[1]}" for row in BRANCHES],
)
def test_if_else(source: str, score: int, grade: str) -> None:
    result = ok(f"g = 'unset'; {source}", {"s": score})
    assert result["g"] == grade


@pytest.mark.parametrize("a", [True, False])
@pytest.mark.parametrize("b", [True, False])
def test_else_if_is_sugar_for_a_nested_if(a: bool, b: bool) -> None:
    chained = ok("if a { r = 1 } else if b { r = 2 } else { r = 3 }", {"a": a, "b": b})
    nested = ok("if a { r = 1 } else { if b { r = 2 } else { r = 3 } }", {"a": a, "b": b})
    assert chained == nested


@pytest.mark.parametrize(
    ("condition", "taken"),
    [
        ("true", True),
        ("false", False),
        ("null", False),
        ("undefined", False),
        ("user.gone", False),
        ("n", False),
        ("1 > 'a'", False),
    ],
)
def test_if_condition_falsy_values_skip_the_branch(condition: str, taken: bool) -> None:
    result = ok(f"if {condition} {{ r = 'then' }} else {{ r = 'else' }}", {"user": {}, "n": None})
    assert result["r"] == ("then" if taken else "else")


@pytest.mark.parametrize("condition", ["1", "'true'", "[]", "{}", "0", "3d"])
@pytest.mark.parametrize("keyword", ["if", "while"])
def test_a_non_boolean_condition_is_a_type_mismatch(keyword: str, condition: str) -> None:
    result = failed(f"before = 1; {keyword} {condition} {{ after = 1 }}; later = 1")
    assert isinstance(result.error, TypeMismatchError)
    assert result.error.expected == "boolean"
    assert result.context == {"before": 1}


@pytest.mark.parametrize(
    "source",
    [
        "if true x = 1",
        "if true { x = 1 } else x = 2",
        "while true x = 1",
        "if true { x = 1 ",
        "if { }",
        "while { }",
    ],
)
def test_braces_are_mandatory(source: str) -> None:
    assert isinstance(compile_program(source), ParseError)


@pytest.mark.parametrize(
    "source",
    [
        "if c { } a = 1",
        "if c { }; a = 1",
        "while false { } a = 1",
        "a = 1;",
        "if c { }; a = 1;",
        "if c { x = 1; } a = 1",
        "if c { x = 1; y = 2 } a = 1",
        "if c { if c { } } a = 1",
    ],
)
def test_a_closing_brace_ends_a_statement(source: str) -> None:
    result = ok(source, {"c": False})
    assert result["a"] == 1


def test_an_empty_program_and_empty_blocks_do_nothing() -> None:
    assert ok("", {"a": 1}) == {"a": 1}
    assert ok("if true { } else { }", {"a": 1}) == {"a": 1}
    assert ok("while false { }", {"a": 1}) == {"a": 1}


def test_braces_introduce_no_scope() -> None:
    assert ok("x = 1; if x > 0 { y = 2 } else { y = 3 }") == {"x": 1, "y": 2}
    assert ok("if true { inner = 1 }; outer = inner + 1") == {"inner": 1, "outer": 2}
    assert ok("i = 0; while i < 3 { i = i + 1; last = i }") == {"i": 3, "last": 3}


# -- while and the loop budget (language.md "while", "The loop budget") ---------------

LOOPS: list[tuple[str, dict[str, Any]]] = [
    ("i = 0; while i < 3 { i = i + 1 }", {"i": 3}),
    ("i = 0; while false { i = i + 1 }", {"i": 0}),
    ("t = 0; i = 1; while i <= 4 { t = t + i; i = i + 1 }", {"t": 10, "i": 5}),
    ("s = ''; while len(s) < 3 { s = s + 'a' }", {"s": "aaa"}),
    ("l = []; while len(l) < 2 { l = l + [len(l)] }", {"l": [0, 1]}),
    ("i = 0; while i < 10 { i = i + 1; if i == 4 { i = 100 } }", {"i": 100}),
    (
        "i = 0; n = 0; while i < 3 { j = 0; while j < 2 { n = n + 1; j = j + 1 }; i = i + 1 }",
        {"i": 3, "j": 2, "n": 6},
    ),
    ("while u { x = 1 }", {"u": UNDEFINED}),
]


@pytest.mark.parametrize(("source", "expected"), LOOPS, ids=ids(LOOPS))
def test_while(source: str, expected: dict[str, Any]) -> None:
    assert typed(ok(source, {"u": UNDEFINED} if "u" in expected else {})) == typed(expected)


def _exceeded(result: ProgramResult) -> None:
    assert isinstance(result.error, EvaluationError), result.error
    assert result.error.reason == "loop_budget_exceeded"
    assert result.error.span is not None


def test_the_default_budget_is_ten_thousand_back_edges() -> None:
    assert ok("i = 0; while i < 10000 { i = i + 1 }") == {"i": 10000}
    _exceeded(failed("i = 0; while i < 10001 { i = i + 1 }"))


def test_an_endless_loop_stops_with_loop_budget_exceeded() -> None:
    _exceeded(failed("while true { }", {}, Options(loop_budget=5)))


@pytest.mark.parametrize("budget", [0, 1, 2, 5, 17])
def test_a_budget_of_n_allows_exactly_n_back_edges(budget: int) -> None:
    options = Options(loop_budget=budget)
    assert ok(f"i = 0; while i < {budget} {{ i = i + 1 }}", {}, options) == {"i": budget}
    _exceeded(failed(f"i = 0; while i < {budget + 1} {{ i = i + 1 }}", {}, options))


def test_budget_zero_forbids_any_back_edge_but_not_straight_line_code() -> None:
    options = Options(loop_budget=0)
    assert ok("x = 1; if x > 0 { y = 2 }; while false { }", {}, options) == {"x": 1, "y": 2}
    result = failed("i = 0; while true { i = i + 1 }", {}, options)
    _exceeded(result)
    assert result.context == {"i": 1}


def test_the_budget_is_shared_across_loops() -> None:
    two_loops = "i = 0; while i < 4 { i = i + 1 }; j = 0; while j < 4 { j = j + 1 }"
    assert ok(two_loops, {}, Options(loop_budget=8)) == {"i": 4, "j": 4}
    result = failed(two_loops, {}, Options(loop_budget=7))
    _exceeded(result)
    assert result.context["i"] == 4


def test_inner_loop_back_edges_count_against_the_same_budget() -> None:
    nested = "i = 0; while i < 3 { j = 0; while j < 3 { j = j + 1 }; i = i + 1 }"
    assert ok(nested, {}, Options(loop_budget=12)) == {"i": 3, "j": 3}
    _exceeded(failed(nested, {}, Options(loop_budget=11)))


def test_every_execution_gets_the_whole_budget() -> None:
    program = compile_program("i = 0; while i < 5 { i = i + 1 }")
    assert not isinstance(program, ParseError)
    options = Options(loop_budget=5)
    for _ in range(3):
        result = program.execute({}, options)
        assert result.error is None
        assert result.context == {"i": 5}


def test_an_exhausted_loop_keeps_the_writes_it_made() -> None:
    result = failed("i = 0; while true { i = i + 1 }; after = 1", {}, Options(loop_budget=5))
    _exceeded(result)
    assert result.context == {"i": 6}


# -- partial context on error (design/*-scxml-error-semantics.md) ---------------------


def test_writes_before_the_failing_statement_are_kept() -> None:
    result = failed("x = 1; y = 1 / 0; z = 3")
    assert isinstance(result.error, EvaluationError)
    assert result.error.reason == "division_by_zero"
    assert result.context == {"x": 1}


def test_a_failure_inside_a_branch_keeps_earlier_writes_in_the_branch() -> None:
    result = failed("a = 1; if true { b = 2; c = nope(); d = 4 }; e = 5")
    assert result.context == {"a": 1, "b": 2}


def test_the_input_mapping_and_its_containers_are_never_mutated() -> None:
    context: dict[str, Any] = {"user": {"tags": ["a"], "name": "x"}, "items": [1, [2]]}
    snapshot = copy.deepcopy(context)
    ids_before = (id(context["user"]), id(context["user"]["tags"]), id(context["items"][1]))
    for source in [
        "user.tags[1] = 'b'; user.name = 'A'; items[1][0] = 9; items[5] = 1",
        "user.tags[1] = 'b'; user.name = 'A'; items[1][0] = 9; 1 / 0",
        "user = 1; items = 2",
        "user.tags[0].x = 1",
    ]:
        result = run(source, context)
        assert result.context is not context
        assert context == snapshot, source
    assert ids_before == (id(context["user"]), id(context["user"]["tags"]), id(context["items"][1]))
    result = run("user.tags[1] = 'b'; items[1][0] = 9", context)
    assert result.context["user"]["tags"] == ["a", "b"]
    assert result.context["items"] == [1, [9]]


def test_a_failed_run_still_leaves_the_input_alone() -> None:
    context: dict[str, Any] = {"m": {"k": [1]}}
    result = failed("m.k[0] = 2; m.k[-1] = 3", context)
    assert result.context == {"m": {"k": [2]}}
    assert context == {"m": {"k": [1]}}


# -- store errors (isa.md 5 store) ----------------------------------------------------

STORE_ERRORS: list[tuple[str, str, str]] = [
    ("s.x = 1", "EvaluationError", "not_a_container"),
    ("s[0] = 1", "EvaluationError", "not_a_container"),
    ("text.x = 1", "EvaluationError", "not_a_container"),
    ("text[0] = 'b'", "EvaluationError", "not_a_container"),
    ("flag.x.y = 1", "EvaluationError", "not_a_container"),
    ("user.name.first = 'A'", "EvaluationError", "not_a_container"),
    ("items[0].x = 1", "EvaluationError", "not_a_container"),
    ("items[-1] = 9", "EvaluationError", "invalid_index"),
    ("items[0 - 3] = 9", "EvaluationError", "invalid_index"),
    ("nested[0][-2] = 9", "EvaluationError", "invalid_index"),
    ("items[1.5] = 1", "TypeMismatchError", "store"),
    ("items[true] = 1", "TypeMismatchError", "store"),
    ("user[null] = 1", "TypeMismatchError", "store"),
    ("user[[1]] = 1", "TypeMismatchError", "store"),
    ("user[user.gone] = 1", "TypeMismatchError", "store"),
]


@pytest.mark.parametrize(("source", "kind", "reason"), STORE_ERRORS, ids=ids(STORE_ERRORS))
def test_store_errors(source: str, kind: str, reason: str) -> None:
    context = {
        "s": 5,
        "text": "abc",
        "flag": True,
        "user": {"name": "Ada"},
        "items": [1, 2],
        "nested": [[1]],
    }
    before = copy.deepcopy(context)
    result = failed(f"ok = 1; {source}; after = 1", context)
    assert result.error is not None
    assert (result.error.kind, result.error.reason) == (kind, reason)
    assert result.context == {**before, "ok": 1}


def test_an_unbound_key_in_a_store_names_the_variable() -> None:
    result = failed("items[i + 1] = 3", {"items": []})
    assert isinstance(result.error, UndefinedVariableError)
    assert result.error.variable == "i"


# -- protected roots (architecture.md Evaluator, isa.md 2) -----------------------------

PROTECTED = Options(protected_roots=frozenset({"cfg", "fresh"}))


@pytest.mark.parametrize(
    "source",
    ["cfg = 1", "cfg.a = 1", "cfg['a'] = 1", "cfg.a[0] = 2", "cfg.new.deep = 1", "fresh = 1"],
)
def test_protected_roots_refuse_writes(source: str) -> None:
    context = {"cfg": {"a": [1]}}
    result = failed(f"x = 1; {source}; y = 2", context, PROTECTED)
    assert isinstance(result.error, EvaluationError)
    assert result.error.reason == "protected_root"
    assert result.error.span is not None
    assert result.context == {"cfg": {"a": [1]}, "x": 1}


def test_protected_roots_stay_readable_and_other_roots_writable() -> None:
    result = ok("copy = cfg.a; other.x = cfg.a[0] + 1", {"cfg": {"a": [1]}}, PROTECTED)
    assert result == {"cfg": {"a": [1]}, "copy": [1], "other": {"x": 2}}


def test_segment_types_are_checked_before_the_protection() -> None:
    result = failed("cfg[1.5] = 1", {"cfg": {}}, PROTECTED)
    assert isinstance(result.error, TypeMismatchError)
    assert result.error.reason == "store"


# -- the value of a program (isa.md 2 "Two execution modes") --------------------------

VALUES: list[tuple[str, object]] = [
    ("1; 2; x = 3", 2),
    ("x = 1", UNDEFINED),
    ("", UNDEFINED),
    ("x = 1; x + 1", 2),
    ("if true { 5 }", 5),
    ("if false { 5 } else { 6 }", 6),
    ("if false { 5 }", UNDEFINED),
    ("i = 0; while i < 3 { i = i + 1; i * 10 }", 30),
    ("'a'; null", None),
    ("user.gone", UNDEFINED),
    ("[1, 2] + [3]", [1, 2, 3]),
]


@pytest.mark.parametrize(("source", "expected"), VALUES, ids=ids(VALUES))
def test_value_is_the_last_expression_statement(source: str, expected: object) -> None:
    result = run(source, {"user": {}})
    assert result.error is None
    assert typed(result.value) == typed(expected)


def test_value_on_error_is_the_last_completed_expression_statement() -> None:
    result = failed("7; x = 1; 1 / 0")
    assert result.value == 7
    assert result.context == {"x": 1}


def test_execute_and_compile_program_agree() -> None:
    source = "total = 0; i = 1; while i <= 3 { total = total + i; i = i + 1 }; total"
    program = compile_program(source)
    assert not isinstance(program, ParseError)
    direct = execute(source, {})
    assert not isinstance(direct, ParseError)
    compiled = program.execute()
    assert compiled == direct
    assert compiled.context == {"total": 6, "i": 4}
    assert compiled.value == 6
    assert compiled.error is None


def test_programs_are_not_expressions() -> None:
    program = compile_program("x = 1")
    assert not isinstance(program, ExprError)
    assert program.source == "x = 1"


def test_on_unbound_error_applies_to_program_loads() -> None:
    strict = Options(on_unbound="error")
    result = failed("x = 1; y = [missing]", {}, strict)
    assert isinstance(result.error, UndefinedVariableError)
    assert result.error.variable == "missing"
    assert result.context == {"x": 1}
    assert ok("y = [missing]", {})["y"] == [UNDEFINED]
    assert ok("x = 1; y = x", {}, strict) == {"x": 1, "y": 1}


# -- Options validation (language.md "The loop budget", on_unbound) -------------------


@pytest.mark.parametrize("policy", ["bogus", "Error", "", None, 1])
def test_a_bad_on_unbound_policy_raises_value_error(policy: object) -> None:
    with pytest.raises(ValueError, match="on_unbound"):
        Options(on_unbound=cast(Any, policy))


@pytest.mark.parametrize("budget", [-1, -100, 1.5, 2.0, "5", None, True, False])
def test_a_bad_loop_budget_raises_value_error(budget: object) -> None:
    with pytest.raises(ValueError, match="loop_budget"):
        Options(loop_budget=cast(Any, budget))


@pytest.mark.parametrize("budget", [0, 1, 10_000, 10**9])
def test_good_loop_budgets_are_accepted(budget: int) -> None:
    assert Options(loop_budget=budget).loop_budget == budget


def test_default_options() -> None:
    options = Options()
    assert options.on_unbound == "undefined"
    assert options.loop_budget == 10_000
    assert options.protected_roots == frozenset()
    assert options.builtins is True
