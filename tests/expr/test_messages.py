"""Error messages in the user's words; reason tokens as the corpus spells them; a
stable code for every error (issue 17, item 3)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from statifier.expr import ExprError, Function, FunctionError, Options, evaluate, execute
from statifier.expr.errors import EvaluationError

CORPUS = Path(__file__).parent.parent / "conformance" / "predicator"


def _opcodes() -> set[str]:
    """Every instruction name of the original's instruction set, as the corpus lists
    them, less the ones a user writes as operators (``and``, ``in``...)."""
    names: set[str] = set()
    for path in sorted((CORPUS / "corpus").glob("tier-*.json")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                for instruction in json.loads(line).get("instructions") or []:
                    names.add(instruction[0])
    return names - {"and", "or", "not", "in", "contains"} | {
        "logical_not",
        "logical_and",
        "logical_or",
        "function_call",
        "relative_date",
    }


OPCODES = _opcodes()
_WORD = re.compile(r"[A-Za-z_]+")


def opcode_names_in(message: str) -> set[str]:
    return {word for word in _WORD.findall(message) if word in OPCODES}


def test_the_opcode_list_holds_the_jumps() -> None:
    assert {"jump_if_falsy_or_pop", "jump_if_true_or_pop", "pop_jump_if_falsy"} <= OPCODES
    assert {"add", "unary_bang", "bracket_access", "store"} <= OPCODES


def _corpus_sources() -> list[tuple[str, dict[str, object]]]:
    from statifier.expr.tagged import decode

    cases = []
    for path in [*sorted((CORPUS / "corpus").glob("tier-*.json")), *CORPUS.glob("*.jsonl")]:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                case = json.loads(line)
                if case.get("source") is not None and "expected_error" in case:
                    cases.append((case["source"], decode(case["context"])))
    return cases


MORE = [
    "1 and true",
    "1 && true",
    "true AND 2",
    "'a' || true",
    "0 OR true",
    "not 5",
    "NOT 5",
    "!5",
    "1 == !5",
    "1 + true",
    "'a' - 1",
    "true * 2",
    "[] / 2",
    "5 % 1.5",
    "[1][true]",
    "{'a': 1}[[1]]",
    "1 in 'abc'",
    "'abc' contains 1",
    "nope(1)",
    "len(1, 2)",
    "len(1)",
    "trim(1)",
    "JSON.parse('x')",
    "Math.sqrt(-1)",
    "Math.pow(10, 100000)",
    "Date.year(1)",
]
PROGRAMS = ["if 1 { x = 1 }", "while 'a' { x = 1 }", "x = {}; x[[1]] = 2", "x = 1 / 0"]


def _errors() -> list[ExprError]:
    found: list[ExprError] = []
    for source, context in [*_corpus_sources(), *((source, {}) for source in MORE)]:
        result = evaluate(source, context)
        if isinstance(result, ExprError):
            found.append(result)
    for source in PROGRAMS:
        run = execute(source, {})
        assert not isinstance(run, ExprError)
        assert run.error is not None
        found.append(run.error)
    return found


def test_no_error_message_names_an_internal_opcode() -> None:
    errors = _errors()
    assert len(errors) >= 55
    leaks = {error.message: opcode_names_in(error.message) for error in errors}
    assert {message: names for message, names in leaks.items() if names} == {}


@pytest.mark.parametrize(
    ("source", "reason", "message"),
    [
        ("1 and true", "jump_if_falsy_or_pop", "'and' expects a boolean, got an integer"),
        ("1 && true", "jump_if_falsy_or_pop", "'&&' expects a boolean, got an integer"),
        ("true and 1 AND true", "jump_if_falsy_or_pop", "'AND' expects a boolean, got an integer"),
        ("'a' or true", "jump_if_true_or_pop", "'or' expects a boolean, got a string"),
        ("'a' || true", "jump_if_true_or_pop", "'||' expects a boolean, got a string"),
        ("not 5", "logical_not", "'not' expects a boolean, got an integer"),
        ("!5", "logical_not", "'!' expects a boolean, got an integer"),
        ("1 == !5", "unary_bang", "'!' expects a boolean, got an integer"),
        ("1 + true", "add", "'+' expects numbers or strings, got a boolean"),
        ("'a' - 1", "subtract", "'-' expects numbers or dates, got a string"),
        ("5 % 1.5", "modulo", "'%' expects integers, got a float"),
        ("[1][true]", "bracket_access", "a list index must be an integer, got a boolean"),
        ("1 in 'abc'", "in", "'in' expects a list on its right, got a string"),
        ("null and true", None, None),
    ],
)
def test_operators_are_named_as_written_and_reasons_stay(
    source: str, reason: str | None, message: str | None
) -> None:
    result = evaluate(source)
    if reason is None:
        assert result is None  # null short-circuits and
        return
    assert isinstance(result, ExprError)
    assert (result.reason, result.message, result.code) == (reason, message, reason)


def test_conditions_name_their_statement() -> None:
    run = execute("if 1 { x = 1 }", {})
    assert not isinstance(run, ExprError)
    assert run.error is not None
    assert run.error.reason == "pop_jump_if_falsy"
    assert run.error.message == "the condition of 'if' must be a boolean, got an integer"
    run = execute("while 'a' { x = 1 }", {})
    assert not isinstance(run, ExprError)
    assert run.error is not None
    assert run.error.message == "the condition of 'while' must be a boolean, got a string"


@pytest.mark.parametrize(
    ("source", "code"),
    [
        ("nope(1)", "unknown_function"),
        ("len(1, 2)", "wrong_arity"),
        ("len(1)", "invalid_argument"),
        ("trim(1)", "invalid_argument"),
        ("substring('a', 0, -1)", "invalid_argument"),
        ("Math.sqrt(-1)", "invalid_argument"),
        ("Math.pow(10, 100000)", "result_too_large"),
        ("Date.year(1)", "invalid_argument"),
        ("JSON.parse('x')", "invalid_json"),
    ],
)
def test_every_function_error_has_a_stable_code(source: str, code: str) -> None:
    result = evaluate(source)
    assert isinstance(result, EvaluationError)
    assert result.code == code
    # The corpus spells a function's failure with its message as the reason.
    assert result.reason == result.message


def test_the_corpus_reason_of_an_unknown_function_is_kept() -> None:
    result = evaluate("nope(1)")
    assert isinstance(result, EvaluationError)
    assert (result.reason, result.code) == ("Unknown function: nope", "unknown_function")


def test_a_host_function_chooses_its_code() -> None:
    def refuse(args: tuple[object, ...]) -> object:
        raise FunctionError("amount must be positive", "negative_amount")

    def plain(args: tuple[object, ...]) -> object:
        raise FunctionError("no")

    def buggy(args: tuple[object, ...]) -> object:
        raise KeyError("k")

    functions = {
        "refuse": Function(refuse, 1),
        "plain": Function(plain, 1),
        "buggy": Function(buggy, 1),
    }
    options = Options(functions=functions)
    codes = {}
    for name in functions:
        result = evaluate(f"{name}(1)", {}, options)
        assert isinstance(result, EvaluationError)
        codes[name] = (result.reason, result.code)
    assert codes == {
        "refuse": ("amount must be positive", "negative_amount"),
        "plain": ("no", "function_failed"),
        "buggy": ("function_raised", "function_raised"),
    }


def test_code_defaults_to_the_reason_and_is_not_compared() -> None:
    error = EvaluationError("division_by_zero", "Division by zero")
    assert error.code == "division_by_zero"
    assert EvaluationError("x", "y", code="z") == EvaluationError("x", "y")
