"""From SCXML source to a :class:`~statifier.chart.model.Machine`.

:func:`compile_chart` reads the document safely, checks it and builds the machine,
collecting every problem it finds (with line and column) before it gives up, so an
author sees all of them at once.

Where a malformed expression is reported follows the statechart notes: a bad ``cond``,
``<log expr>``, ``<content expr>``, ``<foreach array>`` or ``<param>`` rejects the
chart; a bad ``<data expr>``, ``<assign>``, ``<script>`` body, ``namelist`` entry or
other dynamic attribute is kept and raises ``error.execution`` when it is reached (it is
listed among the machine's warnings). A chart declaring ``datamodel="ecmascript"`` is
evaluated with the same expression language, so there every malformed expression
rejects the chart.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Final, Literal

from statifier.chart import model as m
from statifier.chart.reader import (
    DEFAULT_READ_LIMITS,
    Element,
    ReadLimits,
    XMLProblem,
    read,
    start_tag_end,
    utf8,
)
from statifier.expr import (
    UNDEFINED,
    ExprError,
    Expression,
    Function,
    Options,
    ParseError,
    Program,
    Value,
    compile_expression,
    compile_program,
    nodes,
)
from statifier.expr.errors import LocationError
from statifier.expr.location import Location, compile_location

__all__ = ["SCXML_NS", "InvalidChart", "Loader", "Problem", "compile_chart", "validate"]

SCXML_NS: Final = "http://www.w3.org/2005/07/scxml"
DATAMODELS: Final = frozenset({"predicator", "ecmascript", "null"})

Loader = Callable[[str], str]
"""Fetches the text behind a ``src`` attribute; the host decides what it may reach."""

_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a chart, and where."""

    message: str
    _: KW_ONLY
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.line}:{self.column}: {self.message}"


class InvalidChart(Exception):  # noqa: N818 - the name says what the caller got
    """The chart cannot be compiled; ``problems`` lists every reason, in source order."""

    def __init__(self, problems: tuple[Problem, ...]) -> None:
        super().__init__("\n".join(str(problem) for problem in problems))
        self.problems = problems


def compile_chart(
    source: bytes | str,
    *,
    name: str | None = None,
    version: str | None = None,
    loader: Loader | None = None,
    limits: ReadLimits = DEFAULT_READ_LIMITS,
    functions: Mapping[str, Function] | None = None,
) -> m.Machine:
    """Compile SCXML ``source`` into a Machine.

    Args:
        source: the document; its exact bytes (UTF-8 for a ``str``) define the chart's
            identity.
        name, version: optional labels carried in the identity.
        loader: fetches ``<data src>`` and ``<script src>``; without one those
            elements raise ``error.execution`` and nothing is ever fetched.
        limits: bounds on the document's size, depth and element count.
        functions: host expression functions the chart may call, by name (they shadow
            builtins of the same name; ``In`` is the chart's own). Like every part of a
            chart they must be pure: a durable execution replays its inputs through
            them, and the interpreter may memoise a step whose conditions called them
            only by their results.

    Raises:
        InvalidChart: with every problem found.
        ValueError: a function named ``In``, or a value that is not a ``Function``.
    """
    chosen = _host_functions(functions)
    try:
        data = utf8(source)
        _root, builder, machine = _build(data, loader, limits, name, version)
    except XMLProblem as problem:
        raise InvalidChart(
            (Problem(problem.message, line=problem.line, column=problem.column),)
        ) from None
    if builder.problems:
        raise InvalidChart(tuple(sorted(builder.problems, key=lambda p: (p.line, p.column))))
    assert machine is not None
    return replace(machine, functions=chosen) if chosen else machine


def _host_functions(functions: Mapping[str, Function] | None) -> dict[str, Function]:
    chosen = dict(functions or {})
    for name, function in chosen.items():
        if name == "In":
            raise ValueError("'In' is the chart's own function; a host function needs another name")
        if not isinstance(function, Function):
            raise ValueError(f"host function {name!r} is {function!r}, not a Function")
    return chosen


def validate(source: bytes | str, *, loader: Loader | None = None) -> tuple[Problem, ...]:
    """Every problem with ``source``; empty when it compiles."""
    try:
        compile_chart(source, loader=loader)
    except InvalidChart as invalid:
        return invalid.problems
    return ()


def _build(
    data: bytes,
    loader: Loader | None,
    limits: ReadLimits = DEFAULT_READ_LIMITS,
    name: str | None = None,
    version: str | None = None,
) -> tuple[Element, _Builder, m.Machine | None]:
    """Read and compile ``data``: the root element, the builder (its ``problems``,
    ``deferred`` and ``written``, which :mod:`statifier.chart.validation` reads too) and
    the machine, ``None`` when there are problems.

    Raises:
        XMLProblem: the document cannot be read.
    """
    root = read(data, limits)
    builder = _Builder(data, loader)
    machine = builder.build(root, m.ChartIdentity(_content_hash(data), name=name, version=version))
    return root, builder, machine


def _content_hash(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(slots=True)
class _State:
    """A state while the tree is being numbered; frozen into a StateNode at the end."""

    index: int
    element: Element
    kind: m.StateKind
    parent: int
    id: str | None
    children: list[int] = field(default_factory=list)
    histories: list[int] = field(default_factory=list)
    transitions: list[int] = field(default_factory=list)
    initial_transition: int | None = None
    onentry: list[m.Block] = field(default_factory=list)
    onexit: list[m.Block] = field(default_factory=list)
    invokes: list[m.Invoke] = field(default_factory=list)
    donedata: m.DoneData | None = None
    data: list[int] = field(default_factory=list)
    last: int = 0


@dataclass(slots=True)
class _PendingTransition:
    index: int
    source: int
    element: Element | None
    target_ids: list[str]
    events: tuple[tuple[str, ...], ...]
    event_text: str | None
    cond: m.Expr | None
    internal: bool
    content: m.Block
    where: m.SourceLocation


@dataclass(frozen=True, slots=True)
class Written:
    """An expression as the chart writes it, kept while compiling for the checks of
    :mod:`statifier.chart.validation`.

    ``attribute`` is the attribute holding it (``"body"`` for a ``<script>``'s text);
    ``offset`` is where the compiled text starts inside the attribute's value (or the
    body), ``None`` when the text came from elsewhere (a ``src``). ``role`` says what
    it does with the datamodel: ``expr`` and ``read`` (a ``namelist`` entry, a
    ``<param location>``) read every variable they name, ``location`` writes its root
    and reads only its indexes, ``program`` writes the roots it assigns. ``problem`` is
    the problem (or deferred failure) its failing to parse was reported as.
    """

    element: Element
    attribute: str
    offset: int | None
    compiled: Expression | Program | Location | ParseError
    role: Literal["expr", "read", "location", "program"]
    problem: Problem | None = None


_STATE_TAGS: Final = frozenset({"state", "parallel", "final", "history"})
_CONTENT_TAGS: Final = frozenset(
    {"raise", "log", "assign", "if", "elseif", "else", "foreach", "script", "send", "cancel"}
)


class _Builder:
    def __init__(self, source: bytes, loader: Loader | None) -> None:
        self.source = source
        self.loader = loader
        self.problems: list[Problem] = []
        # What is kept for run time, where it raises error.execution (machine.warnings).
        self.deferred: list[Problem] = []
        self.written: list[Written] = []
        self.states: list[_State] = []
        self.transitions: list[_PendingTransition] = []
        self.data: list[m.DataElement] = []
        self.content_count = 0
        self.ids: dict[str, int] = {}
        self.strict_expressions = False
        # Transitions synthesised for a state's default initial child, by index.
        self._anonymous_targets: dict[int, tuple[int, ...]] = {}

    # -- reporting -------------------------------------------------------------------

    def problem(self, element: Element, message: str) -> Problem:
        found = Problem(message, line=element.line, column=element.column)
        self.problems.append(found)
        return found

    def defer(self, element: Element, message: str) -> Problem:
        found = Problem(message, line=element.line, column=element.column)
        self.deferred.append(found)
        return found

    @staticmethod
    def where(element: Element) -> m.SourceLocation:
        return m.SourceLocation(element.line, column=element.column)

    # -- expressions -----------------------------------------------------------------

    def expr(self, element: Element, attribute: str, *, deferred: bool = False) -> m.Expr | None:
        """Compile an expression attribute, or None when absent."""
        text = element.attributes.get(attribute)
        if text is None:
            return None
        compiled = compile_expression(text)
        if isinstance(compiled, ParseError):
            failed = self._expression_failed(element, attribute, compiled, deferred)
            self.written.append(Written(element, attribute, 0, compiled, "expr", failed))
            return m.Expr(text, compiled, self.where(element))
        self.written.append(Written(element, attribute, 0, compiled, "expr"))
        return m.Expr(text, compiled, self.where(element), _state_test(compiled.tree))

    def _expression_failed(
        self, element: Element, attribute: str, error: ExprError, deferred: bool
    ) -> Problem:
        message = f"<{element.local} {attribute}> does not parse: {error.message}"
        if deferred and not self.strict_expressions:
            return self.defer(element, message)
        return self.problem(element, message)

    def location(
        self,
        element: Element,
        attribute: str,
        text: str | None = None,
        *,
        deferred: bool = True,
        offset: int = 0,
        role: Literal["read", "location"] = "location",
    ) -> m.LocationExpr | None:
        """Compile a location attribute (or ``text``, found at ``offset`` inside it)."""
        text = element.attributes.get(attribute) if text is None else text
        if text is None:
            return None
        stripped = text.strip()
        offset += len(text) - len(text.lstrip())
        compiled = compile_location(stripped)
        failed = None
        if isinstance(compiled, LocationError):
            compiled = ParseError(compiled.reason, compiled.message, compiled.span)
        if isinstance(compiled, ParseError):
            failed = self._expression_failed(element, attribute, compiled, deferred)
        self.written.append(Written(element, attribute, offset, compiled, role, failed))
        return m.LocationExpr(text, compiled, self.where(element))

    # -- the document ----------------------------------------------------------------

    def build(self, root: Element, identity: m.ChartIdentity) -> m.Machine | None:
        if root.tag != f"{{{SCXML_NS}}}scxml":
            self.problem(root, f"the root element must be <scxml> in namespace {SCXML_NS}")
            return None
        attributes = root.attributes
        datamodel = attributes.get("datamodel", "predicator")
        if datamodel not in DATAMODELS:
            self.problem(
                root, f"unknown datamodel {datamodel!r}; use predicator, ecmascript or null"
            )
        self.strict_expressions = datamodel == "ecmascript"
        binding = attributes.get("binding", "early")
        if binding not in ("early", "late"):
            self.problem(root, f"binding must be 'early' or 'late', not {binding!r}")
        version = attributes.get("version")
        if version is not None and version != "1.0":
            self.problem(root, f"version must be '1.0', not {version!r}")
        self._check_attributes(
            root, {"initial", "name", "version", "datamodel", "binding", "exmode"}
        )
        scripts: list[m.Script] = []
        self._state(root, "scxml", -1, scripts)
        self._resolve()
        if datamodel == "null" and self.data:
            self.problem(root, "a chart with datamodel='null' cannot declare <data>")
        if self.problems:
            return None
        return self._freeze(root, identity, datamodel, binding == "late", scripts)

    def _check_attributes(self, element: Element, allowed: set[str]) -> None:
        for attribute in element.attribute_order:
            if attribute.startswith(("{", "xmlns")):
                continue
            if attribute not in allowed:
                self.problem(element, f"<{element.local}> has no attribute {attribute!r}")

    def _children(self, element: Element) -> list[Element]:
        children = []
        for child in element.children:
            if child.namespace != SCXML_NS:
                continue  # foreign elements are extensions and are ignored
            children.append(child)
        return children

    def _state(
        self, element: Element, kind: m.StateKind, parent: int, scripts: list[m.Script]
    ) -> int:
        index = len(self.states)
        state_id = element.attributes.get("id")
        if kind == "scxml":
            state_id = None
        elif state_id is not None:
            if not state_id or any(c.isspace() for c in state_id):
                self.problem(element, f"invalid state id {state_id!r}")
            elif state_id in self.ids:
                self.problem(element, f"duplicate state id {state_id!r}")
            else:
                self.ids[state_id] = index
        state = _State(index, element, kind, parent, state_id)
        self.states.append(state)
        allowed = {
            "scxml": set(),
            "state": {"id", "initial"},
            "parallel": {"id"},
            "final": {"id"},
            "history": {"id", "type"},
        }[kind]
        if kind != "scxml":
            self._check_attributes(element, allowed)
        if kind == "history":
            self._history(state)
            state.last = index
            return index
        initial_child: Element | None = None
        for child in self._children(element):
            tag = child.local
            if tag in _STATE_TAGS and kind != "final":
                if kind == "scxml" and tag == "history":
                    self.problem(child, "<history> cannot be a child of <scxml>")
                    continue
                child_index = self._state(child, tag, index, scripts)  # type: ignore[arg-type]
                (state.histories if tag == "history" else state.children).append(child_index)
            elif tag == "transition" and kind in ("state", "parallel"):
                state.transitions.append(self._transition(child, index))
            elif tag == "initial" and kind == "state":
                if initial_child is not None:
                    self.problem(child, "a state has at most one <initial>")
                initial_child = child
                # Compiled here so that its content is numbered in document order.
                state.initial_transition = self._initial_element(state, child)
            elif tag == "onentry" and kind != "scxml":
                state.onentry.append(self._block(child))
            elif tag == "onexit" and kind != "scxml":
                state.onexit.append(self._block(child))
            elif tag == "datamodel" and kind != "final":
                self._datamodel(child, index)
            elif tag == "invoke" and kind in ("state", "parallel"):
                state.invokes.append(self._invoke(child, len(state.invokes)))
            elif tag == "donedata" and kind == "final":
                if state.donedata is not None:
                    self.problem(child, "a <final> has at most one <donedata>")
                state.donedata = self._donedata(child)
            elif tag == "script" and kind == "scxml":
                node = self._script(child)
                scripts.append(node)
            else:
                self.problem(child, f"<{tag}> is not allowed inside <{element.local}>")
        state.last = len(self.states) - 1
        if kind in ("scxml", "state"):
            self._initial(state, initial_child)
        return index

    def _history(self, state: _State) -> None:
        element = state.element
        kind = element.attributes.get("type", "shallow")
        if kind not in ("shallow", "deep"):
            self.problem(element, f"history type must be 'shallow' or 'deep', not {kind!r}")
        transitions = [c for c in self._children(element) if c.local == "transition"]
        others = [c for c in self._children(element) if c.local != "transition"]
        for other in others:
            self.problem(other, f"<{other.local}> is not allowed inside <history>")
        if len(transitions) != 1:
            self.problem(element, "a <history> needs exactly one default <transition>")
            return
        transition = transitions[0]
        if "event" in transition.attributes or "cond" in transition.attributes:
            self.problem(transition, "a history's default transition has no event or cond")
        state.transitions.append(self._transition(transition, state.index))

    def _initial_element(self, state: _State, element: Element) -> int | None:
        transitions = [c for c in self._children(element) if c.local == "transition"]
        if len(transitions) != 1:
            self.problem(element, "<initial> needs exactly one <transition>")
            return None
        child = transitions[0]
        if "event" in child.attributes or "cond" in child.attributes:
            self.problem(child, "an <initial> transition has no event or cond")
        if "target" not in child.attributes:
            self.problem(child, "an <initial> transition needs a target")
        return self._transition(child, state.index)

    def _initial(self, state: _State, element: Element | None) -> None:
        """Check the initial state, synthesising the initial transition of an
        ``initial`` attribute or of the first child (an ``<initial>`` element was
        compiled where it appeared)."""
        attribute = state.element.attributes.get("initial")
        if element is not None and attribute is not None:
            self.problem(element, "a state cannot have both an initial attribute and <initial>")
        if element is not None:
            return
        if not state.children:
            if attribute is not None:
                self.problem(state.element, "an atomic state cannot have an initial attribute")
            return
        targets = attribute.split() if attribute is not None else []
        if attribute is not None and not targets:
            self.problem(state.element, "the initial attribute names no state")
        if not targets:
            first = self.states[state.children[0]]
            targets = [first.id] if first.id is not None else []
            index = len(self.transitions)
            self.transitions.append(
                _PendingTransition(
                    index,
                    state.index,
                    None,
                    [],
                    (),
                    None,
                    None,
                    False,
                    (),
                    self.where(state.element),
                )
            )
            self._anonymous_targets[index] = (state.children[0],)
            state.initial_transition = index
            return
        index = len(self.transitions)
        self.transitions.append(
            _PendingTransition(
                index,
                state.index,
                state.element,
                targets,
                (),
                None,
                None,
                False,
                (),
                self.where(state.element),
            )
        )
        state.initial_transition = index

    def _transition(self, element: Element, source: int) -> int:
        self._check_attributes(element, {"event", "cond", "target", "type"})
        event_text = element.attributes.get("event")
        events: tuple[tuple[str, ...], ...] = ()
        if event_text is not None:
            descriptors = event_text.split()
            if not descriptors:
                self.problem(element, "the event attribute names no event")
            events = tuple(_descriptor(text) for text in descriptors)
        kind = element.attributes.get("type", "external")
        if kind not in ("internal", "external"):
            self.problem(element, f"transition type must be 'internal' or 'external', not {kind!r}")
        index = len(self.transitions)
        pending = _PendingTransition(
            index,
            source,
            element,
            element.attributes.get("target", "").split(),
            events,
            event_text,
            self.expr(element, "cond"),
            kind == "internal",
            (),
            self.where(element),
        )
        self.transitions.append(pending)
        pending.content = self._block(element)
        return index

    # -- executable content ----------------------------------------------------------

    def _next_content(self) -> int:
        self.content_count += 1
        return self.content_count - 1

    def _block(self, container: Element) -> m.Block:
        nodes: list[m.ContentNode] = []
        for child in self._children(container):
            node = self._content(child)
            if node is not None:
                nodes.append(node)
        return tuple(nodes)

    def _content(self, element: Element) -> m.ContentNode | None:
        tag = element.local
        where = self.where(element)
        if tag == "raise":
            self._check_attributes(element, {"event"})
            event = element.attributes.get("event")
            if not event:
                self.problem(element, "<raise> needs an event")
            return m.Raise(self._next_content(), event or "", where)
        if tag == "log":
            self._check_attributes(element, {"label", "expr"})
            return m.Log(
                self._next_content(),
                element.attributes.get("label"),
                self.expr(element, "expr"),
                where,
            )
        if tag == "assign":
            return self._assign(element)
        if tag == "if":
            return self._if(element)
        if tag == "foreach":
            return self._foreach(element)
        if tag == "script":
            return self._script(element)
        if tag == "send":
            return self._send(element)
        if tag == "cancel":
            self._check_attributes(element, {"sendid", "sendidexpr"})
            self._exclusive(element, "sendid", "sendidexpr", required=True)
            return m.Cancel(
                self._next_content(),
                element.attributes.get("sendid"),
                self.expr(element, "sendidexpr", deferred=True),
                where,
            )
        self.problem(element, f"<{tag}> is not executable content")
        return None

    def _exclusive(self, element: Element, *names: str, required: bool = False) -> None:
        present = [name for name in names if name in element.attributes]
        if len(present) > 1:
            self.problem(element, f"<{element.local}> takes only one of {', '.join(names)}")
        if required and not present:
            self.problem(element, f"<{element.local}> needs one of {', '.join(names)}")

    def _assign(self, element: Element) -> m.Assign:
        self._check_attributes(element, {"location", "expr"})
        index = self._next_content()
        location = self.location(element, "location")
        if location is None:
            self.problem(element, "<assign> needs a location")
            location = m.LocationExpr(
                "", ParseError("syntax", "missing location"), self.where(element)
            )
        content = None
        if "expr" in element.attributes and (element.text.strip() or self._children(element)):
            self.problem(element, "<assign> takes an expr or content, not both")
        if "expr" not in element.attributes:
            content = self._inline_content(element)
        return m.Assign(
            index, location, self.expr(element, "expr", deferred=True), content, self.where(element)
        )

    def _if(self, element: Element) -> m.If:
        self._check_attributes(element, {"cond"})
        index = self._next_content()
        branches: list[tuple[m.Expr | None, m.Block]] = []
        condition = self.expr(element, "cond")
        if condition is None:
            self.problem(element, "<if> needs a cond")
        current: list[m.ContentNode] = []
        seen_else = False
        for child in self._children(element):
            if child.local in ("elseif", "else"):
                if seen_else:
                    self.problem(child, f"<{child.local}> after <else>")
                branches.append((condition, tuple(current)))
                current = []
                if child.local == "elseif":
                    self._check_attributes(child, {"cond"})
                    condition = self.expr(child, "cond")
                    if condition is None:
                        self.problem(child, "<elseif> needs a cond")
                else:
                    self._check_attributes(child, set())
                    condition = None
                    seen_else = True
                continue
            node = self._content(child)
            if node is not None:
                current.append(node)
        branches.append((condition, tuple(current)))
        return m.If(index, tuple(branches), self.where(element))

    def _foreach(self, element: Element) -> m.Foreach:
        self._check_attributes(element, {"array", "item", "index"})
        index = self._next_content()
        array = self.expr(element, "array")
        if array is None:
            self.problem(element, "<foreach> needs an array")
            array = m.Expr("", ParseError("syntax", "missing array"), self.where(element))
        item = element.attributes.get("item", "")
        if "item" not in element.attributes:
            self.problem(element, "<foreach> needs an item")
        index_name = element.attributes.get("index")
        for name in (item, index_name):
            if name is not None and not _IDENTIFIER.fullmatch(name):
                # Kept for run time: the specification raises error.execution here.
                self.defer(element, f"illegal foreach variable {name!r}")
        body = self._block(element)
        return m.Foreach(index, array, item, index_name, body, self.where(element))

    def _script(self, element: Element) -> m.Script:
        self._check_attributes(element, {"src"})
        index = self._next_content()
        src = element.attributes.get("src")
        text = element.text
        if src is not None and text.strip():
            self.problem(element, "<script> takes src or a body, not both")
        if src is not None:
            if self.loader is None:
                return m.Script(index, None, src, self.where(element))
            text = self._load(element, src)
        program = compile_program(text)
        failed = None
        if isinstance(program, ParseError):
            failed = self._expression_failed(element, "body", program, deferred=True)
        offset = None if src is not None else 0
        self.written.append(Written(element, "body", offset, program, "program", failed))
        return m.Script(index, program, src, self.where(element))

    def _load(self, element: Element, src: str) -> str:
        assert self.loader is not None
        try:
            return self.loader(src)
        except Exception as error:  # noqa: BLE001 - the loader is host code
            self.problem(element, f"cannot load {src!r}: {error}")
            return ""

    def _send(self, element: Element) -> m.Send:
        self._check_attributes(
            element,
            {
                "event",
                "eventexpr",
                "target",
                "targetexpr",
                "type",
                "typeexpr",
                "id",
                "idlocation",
                "delay",
                "delayexpr",
                "namelist",
            },
        )
        for pair in (
            ("event", "eventexpr"),
            ("target", "targetexpr"),
            ("type", "typeexpr"),
            ("id", "idlocation"),
            ("delay", "delayexpr"),
        ):
            self._exclusive(element, *pair)
        index = self._next_content()
        params = self._params(element)
        content = self._content_child(element)
        if content is not None and (params or "namelist" in element.attributes):
            self.problem(element, "<send> takes <content> or namelist/<param>, not both")
        if (
            "event" not in element.attributes
            and "eventexpr" not in element.attributes
            and content is None
        ):
            self.problem(element, "<send> needs an event, an eventexpr or <content>")
        return m.Send(
            index,
            element.attributes.get("event"),
            self.expr(element, "eventexpr", deferred=True),
            element.attributes.get("target"),
            self.expr(element, "targetexpr", deferred=True),
            element.attributes.get("type"),
            self.expr(element, "typeexpr", deferred=True),
            element.attributes.get("id"),
            self.location(element, "idlocation"),
            element.attributes.get("delay"),
            self.expr(element, "delayexpr", deferred=True),
            self._namelist(element),
            params,
            content,
            self.where(element),
        )

    def _namelist(self, element: Element) -> tuple[m.LocationExpr, ...]:
        text = element.attributes.get("namelist")
        if text is None:
            return ()
        entries = []
        for name in re.finditer(r"\S+", text):
            entry = self.location(
                element, "namelist", name.group(), offset=name.start(), role="read"
            )
            assert entry is not None
            entries.append(entry)
        return tuple(entries)

    def _params(self, element: Element) -> tuple[m.Param, ...]:
        params = []
        for child in self._children(element):
            if child.local != "param":
                continue
            self._check_attributes(child, {"name", "expr", "location"})
            self._exclusive(child, "expr", "location", required=True)
            name = child.attributes.get("name")
            if not name:
                self.problem(child, "<param> needs a name")
            params.append(
                m.Param(
                    name or "",
                    self.expr(child, "expr"),
                    self.location(child, "location", deferred=False, role="read"),
                    self.where(child),
                )
            )
        return tuple(params)

    def _content_child(self, element: Element) -> m.Content | None:
        found = [c for c in self._children(element) if c.local == "content"]
        if len(found) > 1:
            self.problem(found[1], f"<{element.local}> has at most one <content>")
        if not found:
            return None
        child = found[0]
        self._check_attributes(child, {"expr"})
        expr = self.expr(child, "expr")
        if expr is not None and (child.text.strip() or child.children):
            self.problem(child, "<content> takes an expr or a body, not both")
        if expr is not None:
            return m.Content(expr, None, None, self.where(child))
        return self._inline_content(child, collapse=True)

    def _inline_content(self, element: Element, *, collapse: bool = False) -> m.Content:
        markup = None
        if element.children:
            first, last = element.children[0], element.children[-1]
            markup = self.source[first.start : last.end].decode("utf-8")
            if (
                first.tag == f"{{{SCXML_NS}}}scxml"
                and b"xmlns"
                not in self.source[first.start : start_tag_end(self.source, first.start)]
            ):
                # An inline chart inherits the namespace; written out on its own it
                # needs the declaration to stay a chart.
                markup = markup.replace("<scxml", f'<scxml xmlns="{SCXML_NS}"', 1)
            return m.Content(None, markup, markup, self.where(element))
        value = fold_text(element.text, collapse=collapse)
        return m.Content(None, value, None, self.where(element))

    def _invoke(self, element: Element, position: int) -> m.Invoke:
        self._check_attributes(
            element,
            {"type", "typeexpr", "src", "srcexpr", "id", "idlocation", "namelist", "autoforward"},
        )
        for pair in (("type", "typeexpr"), ("src", "srcexpr"), ("id", "idlocation")):
            self._exclusive(element, *pair)
        autoforward = element.attributes.get("autoforward", "false")
        if autoforward not in ("true", "false"):
            self.problem(element, f"autoforward must be 'true' or 'false', not {autoforward!r}")
        finalize: m.Block = ()
        for child in self._children(element):
            if child.local == "finalize":
                finalize = self._block(child)
            elif child.local not in ("param", "content"):
                self.problem(child, f"<{child.local}> is not allowed inside <invoke>")
        content = self._content_child(element)
        if content is not None and ("src" in element.attributes or "srcexpr" in element.attributes):
            self.problem(element, "<invoke> takes src/srcexpr or <content>, not both")
        return m.Invoke(
            position,
            element.attributes.get("type"),
            self.expr(element, "typeexpr", deferred=True),
            element.attributes.get("src"),
            self.expr(element, "srcexpr", deferred=True),
            element.attributes.get("id"),
            self.location(element, "idlocation"),
            self._namelist(element),
            self._params(element),
            content,
            autoforward == "true",
            finalize,
            self.where(element),
        )

    def _donedata(self, element: Element) -> m.DoneData:
        params = self._params(element)
        content = self._content_child(element)
        if content is not None and params:
            self.problem(element, "<donedata> takes <content> or <param>s, not both")
        return m.DoneData(params, content)

    def _datamodel(self, element: Element, state: int) -> None:
        for child in self._children(element):
            if child.local != "data":
                self.problem(child, f"<{child.local}> is not allowed inside <datamodel>")
                continue
            self._check_attributes(child, {"id", "expr", "src"})
            self._exclusive(child, "expr", "src")
            data_id = child.attributes.get("id")
            if not data_id:
                self.problem(child, "<data> needs an id")
                continue
            has_body = bool(child.text.strip() or child.children)
            if has_body and ("expr" in child.attributes or "src" in child.attributes):
                self.problem(child, "<data> takes expr, src or a body, only one")
            src = child.attributes.get("src")
            content = self._inline_content(child) if has_body else None
            if src is not None and self.loader is not None:
                loaded = self._load(child, src)
                content = m.Content(None, fold_text(loaded), None, self.where(child))
                src = None
            index = len(self.data)
            self.data.append(
                m.DataElement(
                    index,
                    data_id,
                    self.expr(child, "expr", deferred=True),
                    src,
                    content,
                    state,
                    self.where(child),
                )
            )
            self.states[state].data.append(index)

    # -- linking and freezing ----------------------------------------------------------

    def _resolve(self) -> None:
        for pending in self.transitions:
            if pending.index in self._anonymous_targets:
                continue
            element = pending.element or self.states[pending.source].element
            for target in pending.target_ids:
                if target not in self.ids:
                    self.problem(element, f"no state has the id {target!r}{self._near(target)}")
        for state in self.states:
            if state.initial_transition is None:
                continue
            pending = self.transitions[state.initial_transition]
            for target_index in self._targets(pending):
                if not state.index < target_index <= state.last:
                    where = pending.element or state.element
                    self.problem(where, "an initial target must be a descendant of its state")

    def _near(self, target: str) -> str:
        """``; did you mean 'running'?`` for the closest state id, if one is close."""
        close = difflib.get_close_matches(target, self.ids, n=1)
        return f"; did you mean {close[0]!r}?" if close else ""

    def _targets(self, pending: _PendingTransition) -> tuple[int, ...]:
        if pending.index in self._anonymous_targets:
            return self._anonymous_targets[pending.index]
        return tuple(self.ids[t] for t in pending.target_ids if t in self.ids)

    def _freeze(
        self,
        root: Element,
        identity: m.ChartIdentity,
        datamodel: str,
        late_binding: bool,
        scripts: list[m.Script],
    ) -> m.Machine:
        transitions = tuple(
            m.Transition(
                p.index,
                p.source,
                self._targets(p),
                p.events,
                p.event_text,
                p.cond,
                p.internal,
                p.content,
                p.where,
            )
            for p in self.transitions
        )
        states: list[m.StateNode] = []
        for state in self.states:
            ancestors: list[int] = []
            parent = state.parent
            while parent >= 0:
                ancestors.append(parent)
                parent = self.states[parent].parent
            states.append(
                m.StateNode(
                    state.index,
                    state.id,
                    state.kind,
                    state.parent,
                    state.last,
                    tuple(state.children),
                    tuple(state.histories),
                    tuple(ancestors),
                    tuple(state.transitions),
                    state.initial_transition,
                    state.kind == "history" and state.element.attributes.get("type") == "deep",
                    tuple(state.onentry),
                    tuple(state.onexit),
                    tuple(state.invokes),
                    state.donedata,
                    tuple(state.data),
                    self.where(state.element),
                    state.kind in ("state", "final") and not state.children,
                    state.kind in ("state", "scxml") and bool(state.children),
                )
            )
        return m.Machine(
            tuple(states),
            transitions,
            tuple(self.data),
            tuple(scripts),
            dict(self.ids),
            root.attributes.get("name"),
            datamodel,
            late_binding,
            identity,
            self.source,
            tuple(str(deferred) for deferred in self.deferred),
            has_eventless=any(
                not transitions[t].events
                for state in states
                if state.kind != "history"
                for t in state.transitions
            ),
            has_invokes=any(state.invokes for state in states),
        )


def _state_test(tree: object) -> str | None:
    """The state id when an expression is exactly ``In('id')``."""
    if (
        isinstance(tree, nodes.Call)
        and tree.name == "In"
        and len(tree.args) == 1
        and isinstance(tree.args[0], nodes.Literal)
        and type(tree.args[0].value) is str
    ):
        return tree.args[0].value
    return None


def _descriptor(text: str) -> tuple[str, ...]:
    """An event descriptor's tokens: ``"error.*"`` and ``"error."`` both match like
    ``"error"``; ``"*"`` matches every event (no tokens)."""
    tokens = text.split(".")
    if tokens and tokens[-1] in ("*", ""):
        tokens.pop()
    return tuple(tokens)


def fold_text(text: str, *, collapse: bool = False) -> Value:
    """Inline text as a value: a literal when it reads as one, else the trimmed text
    (with runs of whitespace collapsed to one space when ``collapse`` is set, as for
    event data).

    >>> fold_text(" [1, 2, 3] "), fold_text("hello"), fold_text(" a   b ", collapse=True)
    ([1, 2, 3], 'hello', 'a b')
    """
    stripped = text.strip()
    if not stripped:
        return UNDEFINED
    compiled = compile_expression(stripped)
    if not isinstance(compiled, ParseError):
        value = compiled.evaluate({}, _LITERAL_ONLY)
        if not isinstance(value, ExprError):
            return value
    return " ".join(stripped.split()) if collapse else stripped


_LITERAL_ONLY: Final = Options(on_unbound="error", builtins=False)
