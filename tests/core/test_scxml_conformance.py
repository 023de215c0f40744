"""The W3C SCXML conformance tests that need no live session, through the public API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from statifier.chart import compile_chart
from statifier.core import Event, handle_event, initialize
from statifier.core.effects import Done

CORPUS = Path(__file__).parent.parent / "conformance" / "scxml"


def _cases() -> list[tuple[Path, dict[str, Any]]]:
    cases = []
    for path in sorted(CORPUS.rglob("*.json")):
        case = json.loads(path.read_text(encoding="utf-8"))
        cases.append((path.with_suffix(".scxml"), case))
    return cases


ALL = _cases()
PURE = [(path, case) for path, case in ALL if not case["session_required"]]


def test_the_corpus_is_all_there() -> None:
    assert len(ALL) == 162
    assert len(PURE) == 62


def leaves(state: Any, effects: list[Any]) -> list[str]:
    done = [effect for effect in effects if isinstance(effect, Done)]
    if done:
        return sorted(done[-1].configuration)
    return sorted(state.leaf_configuration())


@pytest.mark.parametrize(("path", "case"), PURE, ids=[case["id"] for _, case in PURE])
def test_chart(path: Path, case: dict[str, Any]) -> None:
    def loader(src: str) -> str:
        # Only files beside the chart, as a careful host would allow.
        name = src.removeprefix("file:")
        assert "/" not in name
        return (path.parent / name).read_text(encoding="utf-8")

    machine = compile_chart(path.read_bytes(), loader=loader)
    state, effects = initialize(machine)
    configuration = leaves(state, effects)
    assert configuration == sorted(case["expected_initial_configuration"])
    for step in case["events"]:
        if state.running:
            state, effects = handle_event(state, Event(step["event"]["name"]))
            configuration = leaves(state, effects)
        assert configuration == sorted(step["expected_configuration"])
