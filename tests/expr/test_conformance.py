"""Every source-bearing case of the predicator conformance corpus, and the project's own.

The vendored corpus lives in ``corpus/tier-*.json`` and is counted exactly, so a
missing or altered file is noticed. The project's own cases live beside it in
``statifier-*.jsonl`` files: the same JSON-lines format, ids prefixed ``statifier/``,
for syntax the original accepts that its corpus does not pin (the corpus leaves
surface syntax and parse errors out). Two additions to the format: a case with
``"mode": "program"`` is compiled as a statement program and compared on the value
of its last expression statement, and ``expected_error`` may name a ``ParseError``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from statifier.expr import ExprError, compile_expression, compile_program
from statifier.expr.tagged import decode, encode

CORPUS = Path(__file__).parent.parent / "conformance" / "predicator"


def _read(paths: list[Path]) -> list[dict[str, Any]]:
    cases = []
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                case = json.loads(line)
                if case.get("source") is not None:
                    cases.append(case)
    return cases


def _cases() -> list[dict[str, Any]]:
    return _read(sorted((CORPUS / "corpus").glob("tier-*.json")))


CASES = _cases()
OWN_FILES = sorted(CORPUS.glob("statifier-*.jsonl"))
OWN_CASES = _read(OWN_FILES)


def _canonical(value: object) -> str:
    # JSON text keeps 1, 1.0 and true apart, which Python's == does not.
    return json.dumps(value, sort_keys=True)


def test_the_corpus_is_all_there() -> None:
    manifest = json.loads((CORPUS / "manifest.json").read_text(encoding="utf-8"))
    total = sum(tier["case_count"] for tier in manifest["tiers"])
    assert total == 250
    assert len(CASES) == 203


def test_the_projects_own_cases_are_found_and_named_apart() -> None:
    assert [path.name for path in OWN_FILES] == ["statifier-extensions.jsonl"]
    ids = [case["id"] for case in OWN_CASES]
    assert len(ids) == len(set(ids)) >= 39
    assert all(case_id.startswith("statifier/") for case_id in ids)
    assert not set(ids) & {case["id"] for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_case(case: dict[str, Any]) -> None:
    compiled = compile_expression(case["source"])
    assert not isinstance(compiled, ExprError), compiled
    result = compiled.evaluate(decode(case["context"]))
    _check(case, result)


@pytest.mark.parametrize("case", OWN_CASES, ids=[case["id"] for case in OWN_CASES])
def test_own_case(case: dict[str, Any]) -> None:
    context = decode(case["context"])
    result: object
    if case.get("mode") == "program":
        program = compile_program(case["source"])
        if isinstance(program, ExprError):
            result = program
        else:
            run = program.execute(context)
            result = run.value if run.error is None else run.error
    else:
        compiled = compile_expression(case["source"])
        result = compiled if isinstance(compiled, ExprError) else compiled.evaluate(context)
    _check(case, result)


def _check(case: dict[str, Any], result: object) -> None:
    if "expected_error" in case:
        assert isinstance(result, ExprError), f"expected an error, got {result!r}"
        assert {"type": result.kind, "reason": result.reason} == case["expected_error"]
    else:
        assert not isinstance(result, ExprError), result
        assert _canonical(encode(result)) == _canonical(case["expected_result"])
