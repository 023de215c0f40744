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
    Execution,
    Expression,
    Options,
    Program,
    compile_expression,
    compile_program,
    evaluate,
    execute,
    system_clock,
)
from statifier.expr.durations import parse as parse_duration
from statifier.expr.errors import (
    EvaluationError,
    ExprError,
    ExpressionError,
    LocationError,
    ParseError,
    Span,
    TypeMismatchError,
    UndefinedVariableError,
    unwrap,
)
from statifier.expr.functions import BUILTINS, CallContext, Function, FunctionError
from statifier.expr.lexer import parse_date, parse_datetime
from statifier.expr.location import Location, Path, assign, compile_location, put, resolve
from statifier.expr.parser import Limits
from statifier.expr.values import UNDEFINED, Duration, Undefined, Value, type_name

__all__ = [
    "BUILTINS",
    "UNDEFINED",
    "CallContext",
    "Duration",
    "EvaluationError",
    "Execution",
    "ExprError",
    "Expression",
    "ExpressionError",
    "Function",
    "FunctionError",
    "Limits",
    "Location",
    "LocationError",
    "Options",
    "ParseError",
    "Path",
    "Program",
    "Span",
    "TypeMismatchError",
    "Undefined",
    "UndefinedVariableError",
    "Value",
    "assign",
    "compile_expression",
    "compile_location",
    "compile_program",
    "evaluate",
    "execute",
    "parse_date",
    "parse_datetime",
    "parse_duration",
    "put",
    "resolve",
    "system_clock",
    "type_name",
    "unwrap",
]
