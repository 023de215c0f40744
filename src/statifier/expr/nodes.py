"""The syntax tree: frozen dataclasses, one per construct, each with its span."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeAlias

from statifier.expr.errors import Span
from statifier.expr.values import Duration, Value

__all__ = [
    "Access",
    "Assign",
    "Binary",
    "Block",
    "Call",
    "Cast",
    "Compare",
    "ExprStatement",
    "Expression",
    "Identifier",
    "If",
    "Index",
    "ListLiteral",
    "Literal",
    "Logical",
    "ObjectLiteral",
    "Program",
    "RelativeDate",
    "Statement",
    "Unary",
    "While",
]


@dataclass(frozen=True, slots=True)
class Literal:
    """A constant: number, string, boolean, null, undefined, date, datetime, duration."""

    value: Value
    span: Span


@dataclass(frozen=True, slots=True)
class Identifier:
    """A root variable read from the context."""

    name: str
    span: Span


@dataclass(frozen=True, slots=True)
class Access:
    """``target.name``."""

    target: Expression
    name: str
    span: Span


@dataclass(frozen=True, slots=True)
class Index:
    """``target[key]``."""

    target: Expression
    key: Expression
    span: Span


@dataclass(frozen=True, slots=True)
class Cast:
    """``operand::type_name``."""

    operand: Expression
    type_name: str
    span: Span


@dataclass(frozen=True, slots=True)
class Unary:
    """``-operand``, ``!operand`` or ``not operand`` (``op`` is ``-``, ``!``, ``not``).

    ``word`` is the operator as the source spelled it (``NOT``, or ``!`` for a loose
    ``!`` whose ``op`` is ``not``), for messages; not compared.
    """

    op: str
    operand: Expression
    span: Span
    word: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class Binary:
    """A chain of arithmetic at one precedence, applied left to right:
    ``a - b + c`` has ``ops`` ``("-", "+")``. ``spans`` holds each operator's span."""

    ops: tuple[str, ...]
    operands: tuple[Expression, ...]
    spans: tuple[Span, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class Compare:
    """Comparison or membership: ``op`` is ``> < >= <= == != === !== in contains``."""

    op: str
    left: Expression
    right: Expression
    span: Span


@dataclass(frozen=True, slots=True)
class Logical:
    """A chain of short-circuit ``and`` or ``or``: ``a and b and c`` is one node.

    ``spans`` holds the span of each operator word, one fewer than ``operands``, and
    ``words`` each operator as the source spelled it (``and``, ``&&``, ``AND``), for
    messages; not compared.
    """

    op: str
    operands: tuple[Expression, ...]
    spans: tuple[Span, ...]
    span: Span
    words: tuple[str, ...] = field(default=(), compare=False)


@dataclass(frozen=True, slots=True)
class Call:
    """A function call; ``name`` may be dotted (``Math.abs``)."""

    name: str
    args: tuple[Expression, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class ListLiteral:
    """``[a, b, c]``."""

    items: tuple[Expression, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class ObjectLiteral:
    """``{key: value, ...}``; later duplicate keys win."""

    entries: tuple[tuple[str, Expression], ...]
    span: Span


@dataclass(frozen=True, slots=True)
class RelativeDate:
    """``3d ago``, ``2w from now``, ``next 1mo``, ``last 1y``.

    ``direction`` is ``+1`` (future) or ``-1`` (past).
    """

    duration: Duration
    direction: int
    span: Span


Expression: TypeAlias = (
    Literal
    | Identifier
    | Access
    | Index
    | Cast
    | Unary
    | Binary
    | Compare
    | Logical
    | Call
    | ListLiteral
    | ObjectLiteral
    | RelativeDate
)


@dataclass(frozen=True, slots=True)
class ExprStatement:
    """An expression evaluated for its value."""

    expression: Expression
    span: Span


@dataclass(frozen=True, slots=True)
class Assign:
    """``location = value``; ``target`` is an Identifier/Access/Index chain."""

    target: Identifier | Access | Index
    value: Expression
    span: Span


@dataclass(frozen=True, slots=True)
class Block:
    """``{ statements }``: groups statements without opening a scope."""

    statements: tuple[Statement, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class If:
    """``if cond { ... } else { ... }``; ``else if`` nests another If in the else block."""

    condition: Expression
    then: Block
    otherwise: Block | None
    span: Span


@dataclass(frozen=True, slots=True)
class While:
    """``while cond { ... }``."""

    condition: Expression
    body: Block
    span: Span


Statement: TypeAlias = ExprStatement | Assign | If | While


@dataclass(frozen=True, slots=True)
class Program:
    """A sequence of statements."""

    statements: tuple[Statement, ...]
    span: Span
