"""Syntax the original implementation accepts beyond its documentation.

``&&`` and ``||``; ``!`` as ``not`` where a term begins; duration literals with spaced
parts; and ``else if`` chains that are not nesting. Checked here as parse trees,
precedence, error reasons and spans; the evaluated cases are in
``tests/conformance/predicator/statifier-extensions.jsonl``.
"""

from __future__ import annotations

import pytest

from statifier.expr import Duration, Limits, ParseError, Program, compile_program, evaluate, execute
from statifier.expr import nodes as n
from statifier.expr.errors import ExprError, Span, TypeMismatchError
from statifier.expr.lexer import tokenize
from statifier.expr.parser import parse_expression, parse_program


def tree(source: str) -> n.Expression:
    result = parse_expression(source)
    assert not isinstance(result, ParseError), result
    return result


def parse_error(source: str, limits: Limits | None = None) -> ParseError:
    result = parse_program(source, limits) if limits else parse_expression(source)
    assert isinstance(result, ParseError), result
    return result


def at(column: int, width: int = 1, line: int = 1) -> Span:
    return Span(line, column, line, column + width)


def shape(node: object) -> object:
    """A tree without spans, for comparing structure."""
    if isinstance(node, n.Identifier):
        return node.name
    if isinstance(node, n.Literal):
        return node.value
    if isinstance(node, n.Unary):
        return (node.op, shape(node.operand))
    if isinstance(node, n.Compare):
        return (node.op, shape(node.left), shape(node.right))
    if isinstance(node, n.Logical | n.Binary):
        op = node.op if isinstance(node, n.Logical) else node.ops
        return (op, *(shape(operand) for operand in node.operands))
    if isinstance(node, n.ListLiteral):
        return ["list", *(shape(item) for item in node.items)]
    if isinstance(node, n.Call):
        return (node.name, *(shape(arg) for arg in node.args))
    if isinstance(node, n.Index):
        return ("[]", shape(node.target), shape(node.key))
    if isinstance(node, n.ObjectLiteral):
        return {key: shape(value) for key, value in node.entries}
    raise AssertionError(f"no shape for {node!r}")


# -- && and || ----------------------------------------------------------------------------


def test_double_ampersand_and_bar_are_operator_tokens() -> None:
    tokens = tokenize("a&&b||c")
    assert [(t.kind, t.value, t.span) for t in tokens[1:4:2]] == [
        ("op", "&&", at(2, 2)),
        ("op", "||", at(5, 2)),
    ]


@pytest.mark.parametrize("source", ["a & b", "a | b", "a &| b"])
def test_a_single_ampersand_or_bar_is_a_syntax_error(source: str) -> None:
    error = parse_error(source)
    assert error.span is not None
    assert (error.reason, error.span.column) == ("syntax", 3)
    assert "Unexpected character" in error.message


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("a && b", ("and", "a", "b")),
        ("a || b", ("or", "a", "b")),
        ("a || b && c", ("or", "a", ("and", "b", "c"))),
        ("a && b || c", ("or", ("and", "a", "b"), "c")),
        ("a and b && c", ("and", "a", "b", "c")),
        ("a || b or c", ("or", "a", "b", "c")),
        ("a && b and c || d", ("or", ("and", "a", "b", "c"), "d")),
        ("x > 1 && y < 2", ("and", (">", "x", 1), ("<", "y", 2))),
        ("not a && b", ("and", ("not", "a"), "b")),
        ("a in xs || b", ("or", ("in", "a", "xs"), "b")),
    ],
)
def test_double_spellings_share_the_precedence_of_the_words(source: str, expected: object) -> None:
    assert shape(tree(source)) == expected


def test_a_mixed_chain_keeps_each_operators_span() -> None:
    node = tree("a and b && c")
    assert isinstance(node, n.Logical)
    assert node.spans == (at(3, 3), at(9, 2))
    assert node.span == at(3, 3)


@pytest.mark.parametrize(
    ("source", "reason", "column"),
    [
        ("1 && true", "jump_if_falsy_or_pop", 3),
        ("true && 1 && true", "jump_if_falsy_or_pop", 11),
        ("'a' || true", "jump_if_true_or_pop", 5),
        ("false || 2 || true", "jump_if_true_or_pop", 12),
    ],
)
def test_double_spellings_fail_with_the_reasons_of_the_words(
    source: str, reason: str, column: int
) -> None:
    error = evaluate(source)
    assert isinstance(error, TypeMismatchError)
    assert (error.reason, error.span) == (reason, at(column, 2))


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("null && 1 / 0", None),
        ("false && missing", False),
        ("true || 1 / 0", True),
        ("false || 'x'", "x"),
        ("true && 7", 7),
    ],
)
def test_double_spellings_short_circuit_to_an_operand(source: str, expected: object) -> None:
    assert evaluate(source) == expected


# -- ! ------------------------------------------------------------------------------------


def test_a_leading_bang_is_not_and_binds_loosely() -> None:
    node = tree("!x > 3")
    assert node == n.Unary(
        "not",
        n.Compare(">", n.Identifier("x", at(2)), n.Literal(3, at(6)), at(4)),
        at(1),
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("!x > 3", ("not", (">", "x", 3))),
        ("!x + 1 == 2", ("not", ("==", (("+",), "x", 1), 2))),
        ("!x in xs", ("not", ("in", "x", "xs"))),
        ("!!x", ("not", ("not", "x"))),
        ("!not x", ("not", ("not", "x"))),
        ("not !x > 3", ("not", ("not", (">", "x", 3)))),
        ("!-x", ("not", ("-", "x"))),
        ("!x && y", ("and", ("not", "x"), "y")),
        ("y && !x > 3", ("and", "y", ("not", (">", "x", 3)))),
        ("y and !x > 3", ("and", "y", ("not", (">", "x", 3)))),
        ("y || !x > 3", ("or", "y", ("not", (">", "x", 3)))),
        ("y or !x > 3", ("or", "y", ("not", (">", "x", 3)))),
        ("(!x > 3)", ("not", (">", "x", 3))),
        ("[1, !x > 3]", ["list", 1, ("not", (">", "x", 3))]),
        ("[!x > 3]", ["list", ("not", (">", "x", 3))]),
        ("f(1, !x > 3)", ("f", 1, ("not", (">", "x", 3)))),
        ("xs[!x > 3]", ("[]", "xs", ("not", (">", "x", 3)))),
        ("{a: !x > 3}", {"a": ("not", (">", "x", 3))}),
    ],
)
def test_bang_where_a_term_begins_is_not(source: str, expected: object) -> None:
    assert shape(tree(source)) == expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("y == !x", ("==", "y", ("!", "x"))),
        ("y > !x + 1", (">", "y", (("+",), ("!", "x"), 1))),
        ("y in !x", ("in", "y", ("!", "x"))),
        ("1 + !x", (("+",), 1, ("!", "x"))),
        ("1 * !x", (("*",), 1, ("!", "x"))),
        ("-!x", ("-", ("!", "x"))),
        ("!x == !y", ("not", ("==", "x", ("!", "y")))),
    ],
)
def test_bang_after_an_operator_stays_tight(source: str, expected: object) -> None:
    assert shape(tree(source)) == expected


def test_bang_begins_terms_in_programs_too() -> None:
    program = parse_program("r = !x > 3; if !x > 3 { r = 1 }; !x > 3")
    assert not isinstance(program, ParseError)
    assign, branch, last = program.statements
    assert isinstance(assign, n.Assign)
    assert isinstance(branch, n.If)
    assert isinstance(last, n.ExprStatement)
    for node in (assign.value, branch.condition, last.expression):
        assert shape(node) == ("not", (">", "x", 3))


@pytest.mark.parametrize(
    ("source", "reason", "column"),
    [
        ("!5", "logical_not", 1),
        ("!x", "logical_not", 1),
        ("true && !5", "logical_not", 9),
        ("(!5)", "logical_not", 2),
        ("[!5]", "logical_not", 2),
        ("true == !5", "unary_bang", 9),
        ("1 + !5", "unary_bang", 5),
        ("-!5", "unary_bang", 2),
    ],
)
def test_a_loose_bang_fails_as_not_and_a_tight_one_as_bang(
    source: str, reason: str, column: int
) -> None:
    error = evaluate(source, {"x": None})
    assert isinstance(error, TypeMismatchError), error
    assert (error.reason, error.span) == (reason, at(column))


@pytest.mark.parametrize(("x", "expected"), [(5, False), (1, True)])
def test_a_loose_bang_negates_the_comparison(x: int, expected: bool) -> None:
    assert evaluate("!x > 3", {"x": x}) is expected


def test_a_bang_with_nothing_after_it_is_a_syntax_error() -> None:
    error = parse_error("true && !")
    assert error.span is not None
    assert (error.reason, error.span.column) == ("syntax", 10)


# -- durations with spaced parts ----------------------------------------------------------


def literal(source: str) -> n.Literal:
    node = tree(source)
    assert isinstance(node, n.Literal)
    return node


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("3d 8h", Duration(days=3, hours=8)),
        ("3d  8h", Duration(days=3, hours=8)),
        ("3d\t8h", Duration(days=3, hours=8)),
        (
            "1w 2d 3h 4m 5s 6ms",
            Duration(weeks=1, days=2, hours=3, minutes=4, seconds=5, milliseconds=6),
        ),
        ("1w2d 3h4m", Duration(weeks=1, days=2, hours=3, minutes=4)),
        ("1.5h 10s", Duration(hours=1, minutes=30, seconds=10)),
        ("2 days 3h", None),
        ("1h 2h", Duration(hours=2)),
        ("1y 2mo", Duration(years=1, months=2)),
    ],
)
def test_duration_parts_may_be_spaced(source: str, expected: Duration | None) -> None:
    result = parse_expression(source)
    if expected is None:
        assert isinstance(result, ParseError)
    else:
        assert isinstance(result, n.Literal)
        assert result.value == expected


def test_a_spaced_duration_is_one_token_spanning_every_part() -> None:
    assert literal("3d 8h").span == at(1, 5)
    (token, eof) = tokenize("3d\n 8h")
    assert (token.kind, token.span, token.text) == ("duration", Span(1, 1, 2, 4), "3d\n 8h")
    assert eof.kind == "eof"


@pytest.mark.parametrize(
    ("source", "duration", "direction"),
    [
        ("1d 2h ago", Duration(days=1, hours=2), -1),
        ("1d 2h from now", Duration(days=1, hours=2), 1),
        ("next 1d 12h", Duration(days=1, hours=12), 1),
        ("last 1d 12h", Duration(days=1, hours=12), -1),
    ],
)
def test_spaced_durations_make_relative_dates(
    source: str, duration: Duration, direction: int
) -> None:
    node = tree(source)
    assert isinstance(node, n.RelativeDate)
    assert (node.duration, node.direction) == (duration, direction)


def test_a_spaced_duration_ends_where_a_number_has_no_unit() -> None:
    error = parse_error("3d 8")
    assert (error.reason, error.span) == ("syntax", at(4))
    assert shape(tree("[3d 4h, 8]")) == ["list", Duration(days=3, hours=4), 8]
    assert shape(tree("3d 4h + 1h")) == (("+",), Duration(days=3, hours=4), Duration(hours=1))


@pytest.mark.parametrize(
    ("source", "span"),
    [
        ("1.5d 12h", at(1, 8)),
        ("2m 1.5d 3m", at(1, 10)),
        ("1.5s 200ms", at(1, 10)),
        ("1.5s 0.5s", at(1, 9)),
        ("0.0s 1s", at(1, 7)),
        ("x > 1.5d 12h", at(5, 8)),
    ],
)
def test_the_duplicate_unit_check_covers_the_whole_literal(source: str, span: Span) -> None:
    error = parse_error(source)
    assert (error.reason, error.span) == ("syntax", span)
    assert "given twice" in error.message


@pytest.mark.parametrize(
    ("source", "span", "message"),
    [
        ("1s 0.5ms", at(4, 5), "not a whole number of milliseconds"),
        ("1d 8x", at(4, 2), "Unknown duration unit 'x'"),
        ("1d 2days 8xy", at(10, 3), "Unknown duration unit 'xy'"),
    ],
)
def test_a_bad_part_is_blamed_on_that_part(source: str, span: Span, message: str) -> None:
    error = parse_error(source)
    assert (error.reason, error.span) == ("syntax", span)
    assert message in error.message


def test_without_a_fraction_a_repeated_unit_still_takes_its_last_value() -> None:
    assert literal("1h 2h").value == Duration(hours=2)
    assert literal("1h2h").value == Duration(hours=2)


# -- else-if chains -----------------------------------------------------------------------


def chain(branches: int, final_else: bool = True) -> str:
    source = "if x == 0 { r = 0 }"
    source += "".join(f" else if x == {i} {{ r = {i} }}" for i in range(1, branches))
    return source + (" else { r = -1 }" if final_else else "")


@pytest.mark.parametrize("branches", [2, 31, 32, 33, 64, 65, 100, 256])
def test_an_else_if_chain_is_not_nesting(branches: int) -> None:
    program = compile_program(chain(branches))
    assert isinstance(program, Program), program
    for x in (0, branches // 2, branches - 1):
        assert program.execute({"x": x}).context["r"] == x
    assert program.execute({"x": branches}).context["r"] == -1


def test_a_chain_counts_as_one_level_of_nesting() -> None:
    tight = Limits(max_depth=6)
    assert isinstance(compile_program(chain(40), tight), Program)
    # Written out with braces, the same choice is real nesting and counts.
    nested = "if x == 0 { r = 0 }" + " else { if x == 1 { r = 1 }" * 10 + " }" * 10
    error = compile_program(nested, tight)
    assert isinstance(error, ParseError)
    assert error.reason == "too_deep"


def test_nesting_inside_a_branch_still_counts() -> None:
    tight = Limits(max_depth=6)
    deep = "if a { r = 1 } else if b { " + "if c { " * 6 + "r = 2" + " }" * 6 + " }"
    error = compile_program(deep, tight)
    assert isinstance(error, ParseError)
    assert error.reason == "too_deep"


def test_a_chain_longer_than_max_branches_is_too_deep() -> None:
    error = parse_error(chain(257), Limits())
    assert error.reason == "too_deep"
    assert "257" not in error.message
    assert "256" in error.message
    # Blamed on the first ``if`` past the limit.
    offending = chain(257).rindex("if x == 256")
    assert error.span == at(offending + 1, 2)
    assert isinstance(compile_program(chain(3), Limits(max_branches=3)), Program)
    assert parse_error(chain(4), Limits(max_branches=3)).reason == "too_deep"


def test_else_if_desugars_to_an_else_block_holding_the_next_if() -> None:
    program = parse_program("if a { } else if b { } else { r = 1 }")
    assert not isinstance(program, ParseError)
    (first,) = program.statements
    assert isinstance(first, n.If)
    assert first.span == at(1, 2)
    assert first.otherwise is not None
    (second,) = first.otherwise.statements
    assert isinstance(second, n.If)
    assert second.span == at(15, 2)
    assert first.otherwise.span == second.span
    assert second.otherwise is not None
    assert second.otherwise.span == at(29)  # its own {


def test_a_long_chain_runs_without_deep_recursion() -> None:
    limits = Limits(max_source_length=200_000, max_branches=5_000)
    source = chain(3_000, final_else=False)
    program = compile_program(source, limits)
    assert isinstance(program, Program)
    assert program.execute({"x": 2_999}).context["r"] == 2_999
    run = execute("x = 7; " + chain(10) + "; r")
    assert not isinstance(run, ExprError)
    assert run.value == 7
