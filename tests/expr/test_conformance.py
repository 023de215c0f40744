"""Every source-bearing case of the predicator conformance corpus."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from statifier.expr import ExprError, compile_expression
from statifier.expr.tagged import decode, encode

CORPUS = Path(__file__).parent.parent / "conformance" / "predicator"


def _cases() -> list[dict[str, Any]]:
    cases = []
    for path in sorted((CORPUS / "corpus").glob("tier-*.json")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                case = json.loads(line)
                if case.get("source") is not None:
                    cases.append(case)
    return cases


CASES = _cases()


def _canonical(value: object) -> str:
    # JSON text keeps 1, 1.0 and true apart, which Python's == does not.
    return json.dumps(value, sort_keys=True)


def test_the_corpus_is_all_there() -> None:
    manifest = json.loads((CORPUS / "manifest.json").read_text(encoding="utf-8"))
    total = sum(tier["case_count"] for tier in manifest["tiers"])
    assert total == 250
    assert len(CASES) == 203


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_case(case: dict[str, Any]) -> None:
    compiled = compile_expression(case["source"])
    assert not isinstance(compiled, ExprError), compiled
    result = compiled.evaluate(decode(case["context"]))
    if "expected_error" in case:
        assert isinstance(result, ExprError), f"expected an error, got {result!r}"
        assert {"type": result.kind, "reason": result.reason} == case["expected_error"]
    else:
        assert not isinstance(result, ExprError), result
        assert _canonical(encode(result)) == _canonical(case["expected_result"])
