"""The expression language: safe, non-evaluating expressions and statement programs.

Source text is parsed and compiled to closures; nothing is ever handed to Python's
``eval`` or ``exec``. Every failure comes back as an error value with a reason token
and a source span. ``undefined`` (absent) and ``null`` (present, empty) are distinct.

>>> from statifier.expr import compile_expression, evaluate, UNDEFINED
>>> evaluate("user.age > 18", {"user": {"age": 30}})
True
>>> evaluate("user.missing > 18", {"user": {}}) is UNDEFINED
True
>>> error = evaluate("1 + true")
>>> error.kind, error.reason
('TypeMismatchError', 'add')
"""

from statifier.expr.api import (
    Expression,
    Options,
    Program,
    ProgramResult,
    compile_expression,
    compile_program,
    evaluate,
    execute,
)
from statifier.expr.durations import parse as parse_duration
from statifier.expr.errors import ExprError, ExpressionError, ParseError, unwrap
from statifier.expr.functions import CallContext, Function, FunctionError
from statifier.expr.lexer import parse_date, parse_datetime
from statifier.expr.location import assign, resolve
from statifier.expr.parser import Limits
from statifier.expr.values import UNDEFINED, Duration, Value

__all__ = [
    "UNDEFINED",
    "CallContext",
    "Duration",
    "ExprError",
    "Expression",
    "ExpressionError",
    "Function",
    "FunctionError",
    "Limits",
    "Options",
    "ParseError",
    "Program",
    "ProgramResult",
    "Value",
    "assign",
    "compile_expression",
    "compile_program",
    "evaluate",
    "execute",
    "parse_date",
    "parse_datetime",
    "parse_duration",
    "resolve",
    "unwrap",
]
