"""Everything ``statifier validate`` says about a chart, each finding located.

:func:`check` compiles the chart as :func:`~statifier.chart.compile_chart` does and
reports, in source order, one :class:`Finding` per thing it found:

- **errors**: every problem that rejects the chart, and everything the compiler keeps
  only because SCXML defers it to run time, where it is certain to raise
  ``error.execution`` when reached: an expression that does not parse (a ``<data
  expr>``, an ``<assign expr>`` or ``location``, a ``<script>``, a ``namelist`` entry,
  any ``...expr`` attribute) and a ``<foreach>`` variable that cannot name one;
- **warnings**: a read of a datamodel root that nothing declares: not a ``<data id>``,
  a ``<foreach item>`` or ``index``, a variable a ``<script>`` assigns, nor a system
  variable (``_event``, ``_sessionid``, ``_name``, ``_ioprocessors``, ``_x``); functions
  (``In``, ``len``, ...) are calls, never reads. The same for an ``<assign location>`` or
  ``idlocation`` whose root nothing declares. In a chart such a read raises
  ``error.execution``, unless a host seeds the variable when it starts the chart
  (an invocation's ``<param>``, a datamodel override), which is why it is a warning.

An expression's finding is placed where it happens inside the attribute's value (or
the script's body), not at the element: the reader gives the element's line and
column, and the position inside is counted over the source text, so an entity
(``&lt;``, ``&#10;``) counts as the one character it stands for, a line break inside
an attribute moves to the next line, and ``CDATA`` sections in a script are looked
through. A script read from a ``src`` file is placed at its element.

>>> chart = '''<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="idle">
...   <datamodel><data id="count" expr="0"/></datamodel>
...   <state id="idle">
...     <transition event="go" cond="cout &gt; 1" target="runing"/>
...     <onentry><assign location="count" expr="count +"/></onentry>
...   </state>
...   <state id="running"/>
... </scxml>'''
>>> for finding in check(chart):
...     print(finding.format("door.scxml"))
door.scxml:4:5: error: no state has the id 'runing'; did you mean 'running'?
door.scxml:4:34: warning: <transition cond> reads 'cout', which no <data> declares; \
did you mean 'count'?
door.scxml:5:52: error: <assign expr> does not parse: Expected an expression but found \
the end of the input
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from dataclasses import dataclass, fields, is_dataclass
from typing import Final, Literal

from statifier.chart import model as m
from statifier.chart.compiler import SCXML_NS, Loader, Written, _build
from statifier.chart.reader import (
    DEFAULT_READ_LIMITS,
    Element,
    ReadLimits,
    XMLProblem,
    start_tag_end,
    utf8,
)
from statifier.expr import Expression, ParseError, Program, nodes
from statifier.expr.errors import Span
from statifier.expr.location import Location

__all__ = ["SYSTEM_VARIABLES", "Finding", "Severity", "check"]

Severity = Literal["error", "warning"]

SYSTEM_VARIABLES: Final = frozenset({"_event", "_sessionid", "_name", "_ioprocessors", "_x"})
"""The datamodel roots a chart reads without declaring them."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing :func:`check` found: how serious, what, and where (1-based)."""

    severity: Severity
    message: str
    line: int
    column: int

    def format(self, name: str) -> str:
        """``NAME:LINE:COLUMN: SEVERITY: MESSAGE``, the one line ``validate`` prints."""
        return f"{name}:{self.line}:{self.column}: {self.severity}: {self.message}"


def check(
    source: bytes | str,
    *,
    loader: Loader | None = None,
    limits: ReadLimits = DEFAULT_READ_LIMITS,
) -> tuple[Finding, ...]:
    """Every finding about ``source``, in source order; empty when there is nothing to
    say. A chart whose findings are all warnings compiles."""
    try:
        data = utf8(source)
        root, builder, _machine = _build(data, loader, limits)
    except XMLProblem as unreadable:
        return (Finding("error", unreadable.message, unreadable.line, unreadable.column),)
    placed = {id(w.problem): w for w in builder.written if w.problem is not None}
    findings: list[Finding] = []
    for problem in (*builder.problems, *builder.deferred):
        written = placed.get(id(problem))
        line, column = problem.line, problem.column
        if written is not None and isinstance(written.compiled, ParseError):
            line, column = _inside(data, written, written.compiled.span)
        findings.append(Finding("error", problem.message, line, column))
    declared = _declared(root, builder.data, builder.written)
    findings.extend(_undeclared(data, builder.written, declared))
    return tuple(sorted(findings, key=lambda finding: (finding.line, finding.column)))


# -- reads of undeclared roots ---------------------------------------------------------


def _declared(root: Element, data: list[m.DataElement], written: list[Written]) -> frozenset[str]:
    names = set(SYSTEM_VARIABLES)
    names.update(element.id for element in data)
    for element in _elements(root):
        if element.local == "foreach" and element.namespace == SCXML_NS:
            names.update(
                element.attributes[key] for key in ("item", "index") if key in element.attributes
            )
    for entry in written:
        if isinstance(entry.compiled, Program):
            for statement in _statements(entry.compiled.tree.statements):
                if isinstance(statement, nodes.Assign):
                    names.add(_root(statement.target).name)
    return frozenset(names)


def _undeclared(data: bytes, written: list[Written], declared: frozenset[str]) -> Iterator[Finding]:
    for entry in written:
        compiled = entry.compiled
        if isinstance(compiled, ParseError):
            continue
        what = f"<{entry.element.local} {entry.attribute}>"
        if entry.attribute == "body":
            what = f"<{entry.element.local}>"
        seen: set[str] = set()
        for identifier, writes in _roots(compiled, entry.role):
            name = identifier.name
            if name in declared or name in seen:
                continue
            seen.add(name)
            verb = "writes" if writes else "reads"
            message = f"{what} {verb} {name!r}, which no <data> declares{_near(name, declared)}"
            line, column = _inside(data, entry, identifier.span)
            yield Finding("warning", message, line, column)


def _near(name: str, declared: frozenset[str]) -> str:
    close = difflib.get_close_matches(name, sorted(declared), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _roots(
    compiled: Expression | Program | Location, role: str
) -> Iterator[tuple[nodes.Identifier, bool]]:
    """Each root variable the expression names, and whether it writes it (a location's
    root) rather than reads it; a script's assignments declare, so are left out."""
    if isinstance(compiled, Program):
        for statement in _statements(compiled.tree.statements):
            if isinstance(statement, nodes.Assign):
                target: nodes.Expression = statement.target
                while isinstance(target, nodes.Access | nodes.Index):
                    if isinstance(target, nodes.Index):
                        yield from ((found, False) for found in _identifiers(target.key))
                    target = target.target
                yield from ((found, False) for found in _identifiers(statement.value))
            elif isinstance(statement, nodes.ExprStatement):
                yield from ((found, False) for found in _identifiers(statement.expression))
            else:
                yield from ((found, False) for found in _identifiers(statement.condition))
        return
    if isinstance(compiled, Location) and role == "location":
        node: nodes.Expression = compiled.tree
        while isinstance(node, nodes.Access | nodes.Index):
            if isinstance(node, nodes.Index):
                yield from ((found, False) for found in _identifiers(node.key))
            node = node.target
        assert isinstance(node, nodes.Identifier)
        yield node, True
        return
    yield from ((found, False) for found in _identifiers(compiled.tree))


def _statements(statements: tuple[nodes.Statement, ...]) -> Iterator[nodes.Statement]:
    """Every statement, those nested in ``if`` and ``while`` blocks included, in order."""
    for statement in statements:
        yield statement
        if isinstance(statement, nodes.If):
            yield from _statements(statement.then.statements)
            if statement.otherwise is not None:
                yield from _statements(statement.otherwise.statements)
        elif isinstance(statement, nodes.While):
            yield from _statements(statement.body.statements)


def _identifiers(node: object) -> Iterator[nodes.Identifier]:
    """The variable reads in an expression tree, in source order."""
    if isinstance(node, nodes.Identifier):
        yield node
    elif isinstance(node, tuple):
        for item in node:
            yield from _identifiers(item)
    elif is_dataclass(node) and not isinstance(node, type):
        for field in fields(node):
            if field.name not in ("span", "spans"):
                yield from _identifiers(getattr(node, field.name))


def _root(node: nodes.Expression) -> nodes.Identifier:
    while isinstance(node, nodes.Access | nodes.Index):
        node = node.target
    assert isinstance(node, nodes.Identifier)
    return node


def _elements(element: Element) -> Iterator[Element]:
    yield element
    for child in element.children:
        yield from _elements(child)


# -- positions inside an attribute or a body ---------------------------------------------

_SPACE: Final = " \t\r\n"


def _inside(data: bytes, written: Written, span: Span | None) -> tuple[int, int]:
    """The line and column in the document of ``span`` (an expression's, relative to
    the compiled text), or the element's when it cannot be placed."""
    element = written.element
    fallback = (element.line, element.column)
    if written.offset is None or span is None:
        return fallback
    line, column = span.line, span.column
    if written.attribute == "body":
        value = element.text
    else:
        value = element.attributes.get(written.attribute, "")
    # The compiled text starts at ``offset`` in the value: count its lines from there.
    lines = value[written.offset :].split("\n")
    decoded = written.offset + sum(len(text) + 1 for text in lines[: line - 1]) + column - 1
    tag_end = start_tag_end(data, element.start)
    tag = data[element.start : tag_end].decode("utf-8")
    if written.attribute == "body":
        chunk = data[element.start : max(element.end, tag_end)].decode("utf-8")
        raw = _in_body(chunk, len(tag), decoded)
    else:
        chunk = tag
        bounds = _value_bounds(tag, written.attribute)
        raw = None if bounds is None else _in_value(tag, *bounds, decoded)
    if raw is None:
        return fallback
    before = chunk[:raw].replace("\r\n", "\n").replace("\r", "\n")
    breaks = before.count("\n")
    if not breaks:
        return element.line, element.column + len(before)
    return element.line + breaks, len(before) - before.rindex("\n")


def _value_bounds(tag: str, attribute: str) -> tuple[int, int] | None:
    """Where the raw value of ``attribute`` starts and ends in the start tag ``tag``."""
    position = 1
    while position < len(tag) and tag[position] not in _SPACE + "/>":
        position += 1  # the element's name
    while True:
        while position < len(tag) and tag[position] in _SPACE:
            position += 1
        if position >= len(tag) or tag[position] in "/>":
            return None
        start = position
        while position < len(tag) and tag[position] not in _SPACE + "=/>":
            position += 1
        name = tag[start:position]
        while position < len(tag) and tag[position] in _SPACE + "=":
            position += 1
        if position >= len(tag) or tag[position] not in "\"'":
            return None
        end = tag.find(tag[position], position + 1)
        if end < 0:
            return None
        if name == attribute:
            return position + 1, end
        position = end + 1


_REFERENCE: Final = re.compile(r"&[^;&<]*;")


def _step(raw: str, position: int) -> int:
    """Past one character of the value as the reader gives it: a reference, a line
    break written ``\\r\\n``, or one character."""
    if raw[position] == "&":
        found = _REFERENCE.match(raw, position)
        if found is not None:
            return found.end()
    if raw.startswith("\r\n", position):
        return position + 2
    return position + 1


def _in_value(raw: str, start: int, end: int, decoded: int) -> int:
    position, count = start, 0
    while position < end and count < decoded:
        position = _step(raw, position)
        count += 1
    return position


def _in_body(raw: str, start: int, decoded: int) -> int | None:
    """Where the ``decoded``-th character of the element's text is, looking through
    CDATA sections, comments and processing instructions; ``None`` past a child."""
    position, count, cdata = start, 0, False
    while position < len(raw):
        if cdata:
            if raw.startswith("]]>", position):
                position, cdata = position + 3, False
                continue
        elif raw.startswith("<![CDATA[", position):
            position, cdata = position + 9, True
            continue
        elif raw.startswith("<!--", position):
            position = raw.find("-->", position) + 3
            if position < 3:
                return None
            continue
        elif raw.startswith("<?", position):
            position = raw.find("?>", position) + 2
            if position < 2:
                return None
            continue
        if count == decoded:
            return position
        if not cdata and raw[position] == "<":
            return None
        if cdata:
            position += 2 if raw.startswith("\r\n", position) else 1
        else:
            position = _step(raw, position)
        count += 1
    return None
