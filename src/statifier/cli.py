"""The ``statifier`` command.

Subcommands:

``statifier demo``
    Runs the main job on the embedded default (no server needed). Today that is the
    expression language: a few rules evaluated against a sample event.

``statifier expr SOURCE [--context JSON] [--program] [--now DATETIME]``
    Evaluates one expression (or, with ``--program``, runs a statement program) and
    prints the result as JSON in the tagged encoding (``{"$type": "undefined"}`` and
    so on). An evaluation error is printed as ``{"error": {...}}`` and exits with 1;
    unusable arguments exit with 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import TextIO

from statifier import expr
from statifier.expr.lexer import parse_datetime
from statifier.expr.tagged import TaggedValueError, decode, encode

__all__ = ["main"]


def _error_json(error: expr.ExprError) -> dict[str, object]:
    details: dict[str, object] = {
        "type": error.kind,
        "reason": error.reason,
        "message": error.message,
    }
    if error.span is not None:
        details["line"], details["column"] = error.span.line, error.span.column
    return {"error": details}


def _dump(data: object, out: TextIO) -> None:
    out.write(json.dumps(data, ensure_ascii=False) + "\n")


def _run_expr(args: argparse.Namespace, out: TextIO) -> int:
    try:
        raw = json.loads(args.context)
        if not isinstance(raw, dict):
            raise TaggedValueError("the context must be a JSON object")
        context = decode(raw)
    except (json.JSONDecodeError, TaggedValueError) as problem:
        sys.stderr.write(f"statifier expr: --context is not a usable JSON object: {problem}\n")
        return 2
    options = expr.Options()
    if args.now is not None:
        fixed = parse_datetime(args.now)
        if fixed is None:
            sys.stderr.write("statifier expr: --now needs an ISO 8601 datetime with an offset\n")
            return 2
        options = expr.Options(clock=lambda: fixed)
    if args.program:
        execution = expr.execute(args.source, context, options)
        if isinstance(execution, expr.ParseError):
            _dump(_error_json(execution), out)
            return 1
        report: dict[str, object] = {
            "context": encode(execution.context),
            "value": encode(execution.value),
        }
        if execution.error is not None:
            report.update(_error_json(execution.error))
        _dump(report, out)
        return 1 if execution.error is not None else 0
    result = expr.evaluate(args.source, context, options)
    if isinstance(result, expr.ExprError):
        _dump(_error_json(result), out)
        return 1
    _dump(encode(result), out)
    return 0


_DEMO_EVENT = {
    "event": {
        "kind": "impression",
        "id": "ev_01",
        "parcel_id": 4711,
        "at": "2026-11-28T09:30:00Z",
        "tags": ["mobile", "eu"],
        "user": {"plan": "pro", "age": 34},
    }
}

_DEMO_RULES = (
    'event.kind == "impression" and len(event.id) > 0',
    "trim(event.parcel_id::string)",
    'event.user.plan in ["pro", "team"] and event.user.age >= 18',
    '"eu" in event.tags',
    "event.at::datetime > 3d ago",
    "event.user.missing",
    "event.user.age / 0",
)


def _run_demo(out: TextIO) -> int:
    out.write("statifier demo: expression rules against one event\n\n")
    out.write(f"event = {json.dumps(_DEMO_EVENT['event'])}\n\n")
    now = datetime.fromisoformat("2026-11-29T12:00:00+00:00")
    options = expr.Options(clock=lambda: now)
    for source in _DEMO_RULES:
        result = expr.evaluate(source, _DEMO_EVENT, options)
        shown = str(result) if isinstance(result, expr.ExprError) else json.dumps(encode(result))
        out.write(f"  {source}\n    => {shown}\n")
    program = "score = 0; if event.user.plan == 'pro' { score = score + 10 }; tier = score > 5"
    execution = expr.execute(program, _DEMO_EVENT, options)
    assert not isinstance(execution, expr.ParseError)
    out.write(f"\n  program: {program}\n")
    written = {name: execution.context[name] for name in ("score", "tier")}
    out.write(f"    => {json.dumps(encode(written))}\n")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="statifier", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="run the demo on the embedded default (no server)")
    evaluate = commands.add_parser("expr", help="evaluate an expression and print it as JSON")
    evaluate.add_argument("source", help="the expression (or program, with --program)")
    evaluate.add_argument("--context", default="{}", help="the context as a JSON object")
    evaluate.add_argument("--program", action="store_true", help="run SOURCE as a program")
    evaluate.add_argument("--now", help="fix the clock (ISO 8601 datetime with an offset)")
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    stream = out if out is not None else sys.stdout
    if args.command == "demo":
        return _run_demo(stream)
    return _run_expr(args, stream)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
