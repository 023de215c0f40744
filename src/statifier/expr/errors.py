"""Errors of the expression language: plain values, never raised at the caller.

Every failure is one of five frozen dataclasses sharing :class:`ExprError`. Each
carries a ``reason`` token (the vocabulary of the predicator conformance corpus, so
``"division_by_zero"``, ``"unbound_variable"``, or the name of the failing operation
such as ``"add"`` or ``"jump_if_falsy_or_pop"``), a ``code`` (a stable token from a
closed vocabulary: the ``reason``, except for a failing function, whose ``reason`` the
corpus spells as its message), a ``message`` in the user's words (operators and
functions as the source wrote them: ``'and'``, ``len``; free wording, not a contract)
and, where the failure belongs to a piece of source, a :class:`Span`.

A caller that prefers exceptions uses :func:`unwrap`:

>>> from statifier.expr import evaluate
>>> error = evaluate("1 / 0")
>>> error.reason, error.span.column
('division_by_zero', 3)
>>> error = evaluate("1 and true")
>>> error.reason, error.message
('jump_if_falsy_or_pop', "'and' expects a boolean, got an integer")
>>> error = evaluate("nope(1)")
>>> error.reason, error.code
('Unknown function: nope', 'unknown_function')
>>> unwrap(evaluate("1 + 1"))
2
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

__all__ = [
    "EvaluationError",
    "ExprError",
    "ExpressionError",
    "LocationError",
    "ParseError",
    "Span",
    "TypeMismatchError",
    "UndefinedVariableError",
    "unwrap",
]


@dataclass(frozen=True, slots=True)
class Span:
    """A stretch of source: 1-based line and column of its start, and of its end.

    The end is exclusive, so a one-character token at column 5 spans columns 5 to 6.
    """

    line: int
    column: int
    end_line: int
    end_column: int

    def __str__(self) -> str:
        return f"{self.line}:{self.column}"


@dataclass(frozen=True, slots=True)
class ExprError:
    """Base of every expression-language error value.

    Attributes:
        reason: the conformance corpus's token (``"add"``, ``"jump_if_falsy_or_pop"``;
            for a failing function, the message, as the corpus spells it).
        message: what went wrong in the user's words.
        span: where in the source, if the failure belongs to a piece of it.
        code: a stable token for matching in code (see ``docs/expressions.md``): the
            ``reason``, except for a failing function (``"unknown_function"``,
            ``"wrong_arity"``, ``"invalid_argument"``...). Keyword-only; left out, it is
            the ``reason``. Not compared: two errors equal on their other fields are
            equal.
    """

    reason: str
    message: str
    span: Span | None = None
    code: str = field(default="", kw_only=True, compare=False)

    def __post_init__(self) -> None:
        if not self.code:
            object.__setattr__(self, "code", self.reason)

    @property
    def kind(self) -> str:
        """The error's category name, e.g. ``"TypeMismatchError"``."""
        return type(self).__name__

    def __str__(self) -> str:
        where = f" at {self.span}" if self.span is not None else ""
        return f"{self.kind}{where}: {self.message}"


@dataclass(frozen=True, slots=True)
class ParseError(ExprError):
    """The source is not a well-formed expression or program (or exceeds a limit)."""


@dataclass(frozen=True, slots=True)
class EvaluationError(ExprError):
    """Evaluation failed: division by zero, a failing function, an exhausted budget."""


@dataclass(frozen=True, slots=True)
class TypeMismatchError(ExprError):
    """An operator refused an operand's type. ``reason`` names the operation."""

    expected: str = ""
    got: str = ""


@dataclass(frozen=True, slots=True)
class UndefinedVariableError(ExprError):
    """A root variable the evaluation needed was not bound in the context."""

    variable: str = ""


@dataclass(frozen=True, slots=True)
class LocationError(ExprError):
    """A location expression cannot be written to.

    ``reason`` is one of ``not_assignable``, ``invalid_node``, ``undefined_variable``,
    ``invalid_key``, ``computed_key``, ``not_a_container`` and ``invalid_index``.
    """


class ExpressionError(Exception):
    """Raised by :func:`unwrap` to turn an error value into an exception."""

    def __init__(self, error: ExprError) -> None:
        super().__init__(str(error))
        self.error = error


T = TypeVar("T")


def unwrap(result: T | ExprError) -> T:
    """Return ``result`` unless it is an error value, which is raised instead.

    Raises:
        ExpressionError: carrying the error value as ``.error``.
    """
    if isinstance(result, ExprError):
        raise ExpressionError(result)
    return result
