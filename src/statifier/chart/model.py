"""The compiled chart: an immutable :class:`Machine` and the parts it is made of.

States are numbered in document order, index 0 being the ``<scxml>`` root, and each
knows the highest index in its own subtree (``last``), so "is ``d`` a descendant of
``a``" is ``a < d <= last(a)``. Transitions, executable content and data elements are
numbered too, so effects and causes can name them by integer.

Expressions are compiled once, here. One that fails to parse is kept as its
``ParseError`` when the specification defers the failure to run time (it then raises
``error.execution`` when reached); other failures reject the chart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Literal, TypeAlias

from statifier.expr import Expression, Function, ParseError, Program, Value
from statifier.expr.location import Location as ExprLocation

__all__ = [
    "Assign",
    "Block",
    "Cancel",
    "ChartIdentity",
    "Content",
    "ContentNode",
    "DataElement",
    "DoneData",
    "Expr",
    "Foreach",
    "If",
    "Invoke",
    "LocationExpr",
    "Log",
    "Machine",
    "Param",
    "Raise",
    "Script",
    "Send",
    "SourceLocation",
    "StateNode",
    "Transition",
]


@dataclass(frozen=True, slots=True)
class SourceLocation:
    """Line and column (1-based) of an element or attribute in the chart source."""

    line: int
    _: KW_ONLY
    column: int

    def __str__(self) -> str:
        return f"{self.line}:{self.column}"


@dataclass(frozen=True, slots=True)
class Expr:
    """An attribute's expression: compiled, or the ParseError kept for run time.

    ``state_test`` names the state when the whole expression is ``In('id')``, which
    the interpreter decides without evaluating anything.
    """

    source: str
    compiled: Expression | ParseError
    where: SourceLocation
    state_test: str | None = None


@dataclass(frozen=True, slots=True)
class LocationExpr:
    """A location attribute (``location``, ``idlocation``, a namelist entry)."""

    source: str
    compiled: ExprLocation | ParseError
    where: SourceLocation


@dataclass(frozen=True, slots=True)
class Param:
    """``<param name expr|location>``."""

    name: str
    expr: Expr | None
    location: LocationExpr | None
    where: SourceLocation


@dataclass(frozen=True, slots=True)
class Content:
    """``<content expr>`` or inline content (folded to a value at compile time).

    ``markup`` holds an inline child document's source (for ``<invoke>``), if any.
    """

    expr: Expr | None
    value: Value
    markup: str | None
    where: SourceLocation


@dataclass(frozen=True, slots=True)
class Raise:
    index: int
    event: str
    where: SourceLocation


@dataclass(frozen=True, slots=True)
class Log:
    index: int
    label: str | None
    expr: Expr | None
    where: SourceLocation


@dataclass(frozen=True, slots=True)
class Assign:
    index: int
    location: LocationExpr
    expr: Expr | None
    content: Content | None
    where: SourceLocation


@dataclass(frozen=True, slots=True)
class If:
    """``<if>`` with its ``<elseif>``/``<else>`` branches; an else has no condition."""

    index: int
    branches: tuple[tuple[Expr | None, Block], ...]
    where: SourceLocation


@dataclass(frozen=True, slots=True)
class Foreach:
    index: int
    array: Expr
    item: str
    index_name: str | None
    body: Block
    where: SourceLocation


@dataclass(frozen=True, slots=True)
class Script:
    index: int
    program: Program | ParseError | None
    src: str | None
    where: SourceLocation


@dataclass(frozen=True, slots=True)
class Send:
    index: int
    event: str | None
    eventexpr: Expr | None
    target: str | None
    targetexpr: Expr | None
    type: str | None
    typeexpr: Expr | None
    id: str | None
    idlocation: LocationExpr | None
    delay: str | None
    delayexpr: Expr | None
    namelist: tuple[LocationExpr, ...]
    params: tuple[Param, ...]
    content: Content | None
    where: SourceLocation


@dataclass(frozen=True, slots=True)
class Cancel:
    index: int
    sendid: str | None
    sendidexpr: Expr | None
    where: SourceLocation


ContentNode: TypeAlias = Raise | Log | Assign | If | Foreach | Script | Send | Cancel
Block: TypeAlias = tuple[ContentNode, ...]


@dataclass(frozen=True, slots=True)
class Invoke:
    """``<invoke>``: started by the host when its state is stable after a macrostep."""

    index: int
    type: str | None
    typeexpr: Expr | None
    src: str | None
    srcexpr: Expr | None
    id: str | None
    idlocation: LocationExpr | None
    namelist: tuple[LocationExpr, ...]
    params: tuple[Param, ...]
    content: Content | None
    autoforward: bool
    finalize: Block
    where: SourceLocation


@dataclass(frozen=True, slots=True)
class DoneData:
    params: tuple[Param, ...]
    content: Content | None


@dataclass(frozen=True, slots=True)
class DataElement:
    """``<data id expr|src>`` or inline content; ``state`` is where it was declared."""

    index: int
    id: str
    expr: Expr | None
    src: str | None
    content: Content | None
    state: int
    where: SourceLocation


StateKind: TypeAlias = Literal["scxml", "state", "parallel", "final", "history"]


@dataclass(frozen=True, slots=True)
class StateNode:
    """One state. ``children`` are its state children (no histories) in document order.

    ``ancestors`` lists proper ancestors nearest first, ending with the root.
    """

    index: int
    id: str | None
    kind: StateKind
    parent: int
    last: int
    children: tuple[int, ...]
    histories: tuple[int, ...]
    ancestors: tuple[int, ...]
    transitions: tuple[int, ...]
    initial_transition: int | None
    history_deep: bool
    onentry: tuple[Block, ...]
    onexit: tuple[Block, ...]
    invokes: tuple[Invoke, ...]
    donedata: DoneData | None
    data: tuple[int, ...]
    where: SourceLocation
    is_atomic: bool
    is_compound: bool


@dataclass(frozen=True, slots=True)
class Transition:
    """A transition. ``events`` holds each descriptor as its dot-separated tokens
    (a trailing ``*`` dropped); empty for an eventless transition."""

    index: int
    source: int
    targets: tuple[int, ...]
    events: tuple[tuple[str, ...], ...]
    event_text: str | None
    cond: Expr | None
    internal: bool
    content: Block
    where: SourceLocation


@dataclass(frozen=True, slots=True)
class ChartIdentity:
    """What a stored position is checked against: the SHA-256 of the exact source
    bytes (``"sha256:<hex>"``), plus an optional name and version."""

    content_hash: str
    _: KW_ONLY
    name: str | None = None
    version: str | None = None


@dataclass(frozen=True, slots=True, eq=False)
class Machine:
    """A compiled chart. Immutable; build with :func:`statifier.chart.compile_chart`."""

    states: tuple[StateNode, ...]
    transitions: tuple[Transition, ...]
    data: tuple[DataElement, ...]
    scripts: tuple[Script, ...]
    ids: Mapping[str, int]
    name: str | None
    datamodel: str
    late_binding: bool
    identity: ChartIdentity
    source: bytes
    warnings: tuple[str, ...] = ()
    has_eventless: bool = True
    """Whether any state has an eventless transition (if not, none is ever looked for)."""
    has_invokes: bool = True
    """Whether any state has an ``<invoke>``."""
    memo: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)
    """Derived facts the interpreter computes once and reuses (e.g. which transitions an
    event can select from a state); pure functions of the chart, so sharing is safe."""
    functions: Mapping[str, Function] = field(default_factory=dict, compare=False, repr=False)
    """The host's expression functions, by name, that the chart's conditions, values and
    scripts may call besides the builtins (see ``compile_chart(functions=...)``). Not
    part of the identity: the chart's source is; a host passes the same functions
    wherever it compiles the chart again."""

    def state_id(self, index: int) -> str | None:
        """The author's id of a state (``None`` for the root and unnamed states)."""
        return self.states[index].id

    def __repr__(self) -> str:
        digest = self.identity.content_hash[:19]
        return f"<Machine {self.name or ''} {digest} {len(self.states)} states>"
