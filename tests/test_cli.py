"""The ``statifier`` command line."""

from __future__ import annotations

import io
import json

import pytest

from statifier.cli import main


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    status = main(list(argv), out)
    return status, out.getvalue()


def test_demo_evaluates_rules_and_a_program() -> None:
    status, text = run("demo")
    assert status == 0
    assert 'event.kind == "impression" and len(event.id) > 0\n    => true' in text
    assert '=> {"score": 10, "tier": true}' in text
    assert "the gateway called back: completed" in text
    assert "replayed from its input log to the same position: True" in text
    assert "second run over the whole log again: 4 rows" in text
    service = text[text.index("6. The whole service") :]
    assert "POST /hooks/carrier  (the carrier retries)  -> 200" in service
    assert "the overdue timer fired" in service
    assert "(its BasicHTTP location)  delivered -> 204" in service
    assert "completed in delivered" in service
    assert "scans_to_parcel  dlv_1            duplicate" in service
    assert "warehouse  parcel.delivered" in service
    assert service.endswith("stopped as on SIGTERM: exit status 0\n")


def test_expr_prints_tagged_json() -> None:
    assert run("expr", "1 + 1") == (0, "2\n")
    assert run("expr", "user.missing", "--context", '{"user": {}}') == (
        0,
        '{"$type": "undefined"}\n',
    )
    _status, text = run("expr", "#2024-01-15# + 3d")
    assert json.loads(text) == {"$type": "date", "value": "2024-01-18"}


def test_expr_reads_tagged_context_and_fixed_clock() -> None:
    context = '{"t": {"$type": "datetime", "value": "2026-01-05T00:00:00Z"}}'
    status, text = run("expr", "t > 3d ago", "--context", context, "--now", "2026-01-07T00:00:00Z")
    assert (status, text) == (0, "true\n")


def test_expr_error_is_json_with_exit_status_one() -> None:
    status, text = run("expr", "missing + 1")
    assert status == 1
    assert json.loads(text) == {
        "error": {
            "type": "UndefinedVariableError",
            "reason": "unbound_variable",
            "message": "Undefined variable: missing",
            "line": 1,
            "column": 1,
        }
    }
    status, text = run("expr", "score >> 85")
    assert status == 1
    assert json.loads(text)["error"]["type"] == "ParseError"


def test_program_mode_prints_context_and_value() -> None:
    status, text = run("expr", "x = 1; y = x + 1; y * 2", "--program")
    assert status == 0
    assert json.loads(text) == {"context": {"x": 1, "y": 2}, "value": 4}
    status, text = run("expr", "x = 1; y = x / 0", "--program")
    assert status == 1
    assert json.loads(text)["context"] == {"x": 1}
    assert json.loads(text)["error"]["reason"] == "division_by_zero"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["expr", "1", "--context", "not json"], "--context"),
        (["expr", "1", "--context", "[1]"], "--context"),
        (["expr", "1", "--now", "yesterday"], "--now"),
    ],
)
def test_unusable_arguments_exit_with_two(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _ = run(*argv)
    assert status == 2
    assert message in capsys.readouterr().err
