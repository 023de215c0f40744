"""Publish-time contracts: what a chart's sends and the router's bindings will meet at
run time, checked before the chart or the configuration ships.

:func:`check` reads a :class:`~statifier.router.RouterConfig`, the compiled chart of
the document being published and the host's declarations, and returns a
:class:`Contracts` report of five lists. It is pure: it touches no database, calls
no resolver and evaluates no expression, so a host runs it when it saves a revision,
in CI (``statifier check``), or in an editor, and decides itself whether a finding
blocks the publish.

``unsupported_types``
    A ``<send>`` whose literal ``type`` the executions are not started with: not the
    SCXML processor (or no type at all), not the router's ``send_type``, not one of
    ``config.chart_start_options.send_types``. At run time the send raises
    ``error.execution``.
``unregistered_routes``
    A ``<send>`` of the router's type that never reaches the route its literal
    ``target`` names: ``unregistered`` when no such route is registered (or no target
    is written), ``no_timer_queue`` when it writes a literal ``delay`` to a registered
    route and the configuration has no timer queue. At run time both are refused, and
    the sender hears ``error.communication``.
``unchecked``
    What the check saw but cannot judge, never passed silently: a ``typeexpr``; a
    ``targetexpr`` on a send of the router's type; a ``delayexpr`` to a registered
    route with no timer queue; an execution-target send whose event is an
    ``eventexpr`` (or missing: ``no_event``) or whose ``document`` param is not one
    literal string (``document_expr``; ``no_document`` when there is none); and, for
    a configuration with a ``bindings_resolver``, one entry first, with reason
    ``bindings_resolver`` and no location: the bindings were not checked.
``undeclared_events``
    An execution-target send (``<send type="ROUTER_TYPE" target="execution">`` with a
    literal ``event`` and a literal ``document`` param) whose event its receiving
    document does not accept: ``undeclared`` under a declaration,
    ``undeclared_by_computed_set`` when the receiver declares nothing and no
    transition of its chart that can be active takes the event, ``not_published``
    when the receiver has no chart. A delayed one is reported ``delay`` instead,
    whatever its event: the router never delivers a delayed send to an execution.
``undeclared_binding_events``
    An enabled binding whose event its document does not accept (the same three
    reasons), with the binding's id.

**The declarations** map a document to the event names it declares it accepts; the
check is string equality, and ``[]`` accepts nothing. A document mapped to ``None``,
or left out, declares nothing and is judged by its chart: the event is accepted when
a transition of a state that can be active names a descriptor matching it (matched
as the interpreter matches, so ``parcel.*`` takes ``parcel.lost``). Which states can
be active is computed generously (every state a history could restore counts), so
the fallback may pass an event a guarded transition never takes, and never refuses
one that some reachable transition could take. A document with neither a
declaration nor a chart is not published.

**Why this signature.** ``check(config, document, chart, declarations, charts)``:
the compiled :class:`~statifier.chart.Machine` keeps every element's source line and
column, so the chart alone locates its sends and the source text need not be read
again. ``document`` names the chart, because a chart may send to its own document,
which is then judged by the chart being published. ``charts`` are the published
charts of the other documents, for judging the ones the declarations leave out; the
resolver is not asked, because it is keyed by scope and a publish carries none. The
bindings are the configuration's: with a ``bindings_resolver``, check each scope's
bindings with :func:`undeclared_binding_events`.

>>> from statifier.chart import compile_chart
>>> from statifier.persistence.sql import SqlAdapter
>>> from statifier.router import Binding, RouterConfig, StaticResolver
>>> depot = compile_chart('''<scxml xmlns="http://www.w3.org/2005/07/scxml">
...   <state id="holding">
...     <transition event="courier.nobody_home">
...       <send type="myapp:router" target="execution" event="parcel.returned">
...         <param name="document" expr="'parcel'"/>
...         <param name="key" expr="_event.data.parcel_id"/>
...       </send>
...     </transition>
...   </state>
... </scxml>''')
>>> lost = Binding(id="depot_lost", source="depot_feed", match="event.kind == 'lost'",
...                key="event.parcel_id", document="parcel", event="parcel.lost")
>>> config = RouterConfig(SqlAdapter("sqlite://"), bindings=[lost], send_type="myapp:router",
...                       resolver=StaticResolver({"depot": depot}))
>>> report = check(config, "depot", depot, {"parcel": ["parcel.scanned", "parcel.delivered"]})
>>> report.clean
False
>>> for finding in report.findings():
...     print(finding.format("depot.scxml"))
depot.scxml:4:7: undeclared: parcel.returned (parcel)
depot.scxml: undeclared: parcel.lost (parcel) [binding depot_lost]
>>> report.as_json()["undeclared_events"][0]
{'event': 'parcel.returned', 'document': 'parcel', 'reason': 'undeclared', 'location': {...}}
>>> check(config, "depot", depot, {"parcel": None}).undeclared_events[0].reason
'not_published'
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from statifier.chart import Machine
from statifier.chart import model as m
from statifier.core.events import SCXML_SEND_TYPES
from statifier.expr import Expression, parse_duration
from statifier.expr import nodes as expr_nodes
from statifier.router.binding import Binding
from statifier.router.config import RouterConfig
from statifier.router.sending import EXECUTION_TARGET

__all__ = [
    "REASONS",
    "Contracts",
    "Declarations",
    "Finding",
    "Location",
    "accepts",
    "check",
    "undeclared_binding_events",
]

Declarations = Mapping[str, Sequence[str] | None]
"""Document -> the event names it declares it accepts (``None``: declares nothing, so
its chart is the contract)."""

REASONS: Final = {
    "unsupported_types": frozenset({"unsupported_type"}),
    "unregistered_routes": frozenset({"unregistered", "no_timer_queue"}),
    "unchecked": frozenset(
        {
            "bindings_resolver",
            "typeexpr",
            "targetexpr",
            "delayexpr",
            "eventexpr",
            "no_event",
            "document_expr",
            "no_document",
        }
    ),
    "undeclared_events": frozenset(
        {"undeclared", "undeclared_by_computed_set", "not_published", "delay"}
    ),
    "undeclared_binding_events": frozenset(
        {"undeclared", "undeclared_by_computed_set", "not_published"}
    ),
}
"""Every reason each list of a report may carry."""


@dataclass(frozen=True, slots=True)
class Location:
    """Where a ``<send>`` element starts in its chart: 1-based line and column."""

    line: int
    column: int

    def as_json(self) -> dict[str, int]:
        return {"line": self.line, "column": self.column}


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One entry of a :class:`Contracts` report.

    Attributes:
        reason: why it is reported (see :data:`REASONS`).
        event: the event concerned: the send's literal event, or the binding's;
            ``None`` when the send writes none it can be read from.
        document: the receiving document for ``undeclared_events`` and
            ``undeclared_binding_events``; for the other lists, the document whose
            chart holds the send.
        location: the ``<send>`` element's start; ``None`` for a binding and for the
            ``bindings_resolver`` entry.
        binding_id: the binding, for ``undeclared_binding_events``.
        route: the route a send of the router's type names (``unregistered_routes``;
            ``None`` when it writes no target).
        type: the unsupported send type (``unsupported_types``).
    """

    reason: str
    event: str | None = None
    document: str | None = None
    location: Location | None = None
    binding_id: str | None = None
    route: str | None = None
    type: str | None = None

    def as_json(self) -> dict[str, Any]:
        """``{"event", "document", "reason"}`` and ``"binding_id"`` for a binding's
        finding, ``"location"`` (``{"line", "column"}`` or ``null``) for every other;
        ``"route"`` and ``"type"`` too where the finding has one."""
        data: dict[str, Any] = {
            "event": self.event,
            "document": self.document,
            "reason": self.reason,
        }
        if self.binding_id is not None:
            data["binding_id"] = self.binding_id
        else:
            data["location"] = None if self.location is None else self.location.as_json()
        if self.route is not None:
            data["route"] = self.route
        if self.type is not None:
            data["type"] = self.type
        return data

    def format(self, file: str) -> str:
        """One line: ``FILE:LINE:COL: reason: event (document)``, then the route, the
        type or the binding in brackets (no ``LINE:COL`` without a location)."""
        at = self.location
        where = file if at is None else f"{file}:{at.line}:{at.column}"
        text = f"{where}: {self.reason}: {self.event or '-'} ({self.document or '-'})"
        if self.route is not None:
            text += f" [route {self.route}]"
        if self.type is not None:
            text += f" [type {self.type}]"
        if self.binding_id is not None:
            text += f" [binding {self.binding_id}]"
        return text


@dataclass(frozen=True, slots=True)
class Contracts:
    """The report of :func:`check`: five lists, each in document order (bindings in
    the configuration's order)."""

    unsupported_types: tuple[Finding, ...] = ()
    unregistered_routes: tuple[Finding, ...] = ()
    unchecked: tuple[Finding, ...] = ()
    undeclared_events: tuple[Finding, ...] = ()
    undeclared_binding_events: tuple[Finding, ...] = ()

    @property
    def clean(self) -> bool:
        """Whether every list is empty."""
        return not any(self.lists().values())

    def lists(self) -> dict[str, tuple[Finding, ...]]:
        """The five lists by name, in report order."""
        return {
            "unsupported_types": self.unsupported_types,
            "unregistered_routes": self.unregistered_routes,
            "unchecked": self.unchecked,
            "undeclared_events": self.undeclared_events,
            "undeclared_binding_events": self.undeclared_binding_events,
        }

    def findings(self) -> Iterator[Finding]:
        """Every entry: the sends' in document order, then the bindings'."""
        sends = [f for entries in self.lists().values() for f in entries if f.location]
        sends.sort(key=lambda f: (f.location.line, f.location.column) if f.location else (0, 0))
        yield from (f for f in self.unchecked if f.location is None)
        yield from sends
        yield from self.undeclared_binding_events

    def as_json(self) -> dict[str, list[dict[str, Any]]]:
        """The five lists as plain JSON values (what a publish case's ``contracts``
        compares with)."""
        report = {name: [f.as_json() for f in entries] for name, entries in self.lists().items()}
        for entry in report["unregistered_routes"]:
            entry.setdefault("route", None)  # a send that writes no target names none
        return report


def check(
    config: RouterConfig,
    document: str,
    chart: Machine,
    declarations: Declarations,
    charts: Mapping[str, Machine] | None = None,
) -> Contracts:
    """Every publish-time check over the chart of ``document`` and the configuration.

    Args:
        config: the router's configuration: its ``send_type``, ``routes``,
            ``timer_queue``, ``start_options``, and its bindings (or resolver).
        document: the document ``chart`` is published as.
        chart: its compiled chart.
        declarations: document -> the event names it declares (``None``: none).
        charts: the published charts of other documents, by document; a document
            left out of both ``declarations`` and ``charts`` is not published.

    Raises:
        TypeError: a declaration that is not a list of strings (or ``None``).
    """
    contract = _Receivers(document, chart, declarations, charts or {})
    supported = SCXML_SEND_TYPES | config.chart_start_options.send_types
    if config.send_type is not None:
        supported = supported | {config.send_type}
    unsupported: list[Finding] = []
    routes: list[Finding] = []
    unchecked: list[Finding] = []
    undeclared: list[Finding] = []
    if config.bindings is None:
        unchecked.append(Finding(reason="bindings_resolver"))
    for send in sorted(_sends(chart), key=lambda node: (node.where.line, node.where.column)):
        where = Location(send.where.line, send.where.column)
        if send.typeexpr is not None:
            unchecked.append(_at(send, document, where, "typeexpr"))
            continue
        if send.type is not None and send.type not in supported:
            unsupported.append(
                Finding(
                    reason="unsupported_type",
                    event=send.event,
                    document=document,
                    location=where,
                    type=send.type,
                )
            )
            continue
        if config.send_type is None or send.type != config.send_type:
            continue
        if send.targetexpr is not None:
            unchecked.append(_at(send, document, where, "targetexpr"))
        elif send.target == EXECUTION_TARGET:
            _execution_target(send, where, contract, unchecked, undeclared)
        else:
            _route(config, send, document, where, routes, unchecked)
    bindings = () if config.bindings is None else _binding_findings(config.bindings, contract)
    return Contracts(
        tuple(unsupported), tuple(routes), tuple(unchecked), tuple(undeclared), tuple(bindings)
    )


def undeclared_binding_events(
    bindings: Iterable[Binding],
    declarations: Declarations,
    charts: Mapping[str, Machine] | None = None,
) -> tuple[Finding, ...]:
    """Every enabled binding whose event its document does not accept, in order.

    ``declarations`` and ``charts`` are read as :func:`check` reads them. A host whose
    bindings differ by scope (a ``bindings_resolver``) calls this once per scope.

    >>> b = Binding(id="b", source="s", match="true", key="event.id", document="d",
    ...             event="go")
    >>> [f.reason for f in undeclared_binding_events([b], {"d": ["stop"]})]
    ['undeclared']
    >>> undeclared_binding_events([b], {"d": ["go"]})
    ()
    """
    return _binding_findings(bindings, _Receivers(None, None, declarations, charts or {}))


def _binding_findings(bindings: Iterable[Binding], contract: _Receivers) -> tuple[Finding, ...]:
    findings = []
    for binding in bindings:
        if not binding.enabled:
            continue
        reason = contract.judge(binding.document, binding.event)
        if reason is not None:
            findings.append(
                Finding(
                    reason=reason,
                    event=binding.event,
                    document=binding.document,
                    binding_id=binding.id,
                )
            )
    return tuple(findings)


def accepts(chart: Machine, event: str) -> bool:
    """Whether a transition of a state of ``chart`` that can be active names a
    descriptor matching ``event`` (the computed contract of a document that declares
    nothing).

    >>> from statifier.chart import compile_chart
    >>> chart = compile_chart('<scxml xmlns="http://www.w3.org/2005/07/scxml">'
    ...     '<state id="a"><transition event="parcel.*" target="b"/></state>'
    ...     '<state id="b"/><state id="c"><transition event="never"/></state></scxml>')
    >>> accepts(chart, "parcel.lost"), accepts(chart, "parcel"), accepts(chart, "never")
    (True, True, False)
    """
    return _matches(_vocabulary(chart), event)


# The execution target and routes.


def _execution_target(
    send: m.Send,
    where: Location,
    contract: _Receivers,
    unchecked: list[Finding],
    undeclared: list[Finding],
) -> None:
    sender = contract.document
    if send.eventexpr is not None:
        unchecked.append(_at(send, sender, where, "eventexpr"))
        return
    if not send.event:
        unchecked.append(_at(send, sender, where, "no_event"))
        return
    document, why = _literal_document(send)
    if document is None:
        unchecked.append(_at(send, sender, where, why))
        return
    if send.delayexpr is not None or _delayed(send.delay):
        reason: str | None = "delay"
    else:
        reason = contract.judge(document, send.event)
    if reason is not None:
        undeclared.append(
            Finding(reason=reason, event=send.event, document=document, location=where)
        )


def _literal_document(send: m.Send) -> tuple[str | None, str]:
    """The receiving document of exactly one ``<param name="document" expr="'name'"/>``
    and no namelist entry of that name, or ``None`` and why not: ``no_document``, or
    ``document_expr`` (an expression, a location, a namelist entry, two params, or
    ``<content>``, whose value is not read here)."""
    params = [param for param in send.params if param.name == "document"]
    listed = [entry for entry in send.namelist if entry.source == "document"]
    if not params and not listed:
        return None, "document_expr" if send.content is not None else "no_document"
    if len(params) == 1 and not listed and params[0].expr is not None:
        compiled = params[0].expr.compiled
        if isinstance(compiled, Expression) and isinstance(compiled.tree, expr_nodes.Literal):
            value = compiled.tree.value
            if isinstance(value, str) and value:
                return value, ""
    return None, "document_expr"


def _route(
    config: RouterConfig,
    send: m.Send,
    document: str,
    where: Location,
    routes: list[Finding],
    unchecked: list[Finding],
) -> None:
    name = send.target
    registered = (
        name is not None
        and name in config.routes
        and ":" not in name  # a transport, never a route: refused at run time
        and not name.startswith("#")
    )
    if not registered:
        routes.append(
            Finding(
                reason="unregistered",
                event=send.event,
                document=document,
                location=where,
                route=name,
            )
        )
    elif config.timer_queue is None and _delayed(send.delay):
        routes.append(
            Finding(
                reason="no_timer_queue",
                event=send.event,
                document=document,
                location=where,
                route=name,
            )
        )
    elif config.timer_queue is None and send.delayexpr is not None:
        unchecked.append(_at(send, document, where, "delayexpr"))


def _at(send: m.Send, document: str | None, where: Location, reason: str) -> Finding:
    return Finding(reason=reason, event=send.event, document=document, location=where)


def _delayed(delay: str | None) -> bool:
    """Whether a literal ``delay`` holds a send back (``"0s"`` does not; one that does
    not parse fails the send with ``error.execution`` before the router sees it)."""
    if delay is None:
        return False
    text = delay.strip()
    duration = parse_duration("0" + text if text.startswith(".") else text)
    return duration is not None and duration.total_milliseconds() > 0


def _sends(chart: Machine) -> Iterator[m.Send]:
    """Every ``<send>`` of the chart (not of inline child documents)."""
    blocks: list[m.Block] = []
    for state in chart.states:
        blocks.extend(state.onentry)
        blocks.extend(state.onexit)
        blocks.extend(invoke.finalize for invoke in state.invokes)
    blocks.extend(transition.content for transition in chart.transitions)
    while blocks:
        for node in blocks.pop():
            if isinstance(node, m.Send):
                yield node
            elif isinstance(node, m.If):
                blocks.extend(body for _, body in node.branches)
            elif isinstance(node, m.Foreach):
                blocks.append(node.body)


# The receivers.


class _Receivers:
    """Returns whether a document accepts an event: by its declaration, else by its
    chart, else it is not published."""

    def __init__(
        self,
        document: str | None,
        chart: Machine | None,
        declarations: Declarations,
        charts: Mapping[str, Machine],
    ) -> None:
        self.document = document
        self.declared: dict[str, frozenset[str] | None] = {}
        for name, events in declarations.items():
            self.declared[name] = None if events is None else _names(name, events)
        self.charts = dict(charts)
        if document is not None and chart is not None:
            self.charts[document] = chart
        self._vocabularies: dict[str, tuple[tuple[str, ...], ...]] = {}

    def judge(self, document: str, event: str) -> str | None:
        """``None`` when ``document`` accepts ``event``, else the reason it does not."""
        declared = self.declared.get(document)
        if declared is not None:
            return None if event in declared else "undeclared"
        chart = self.charts.get(document)
        if chart is None:
            return "not_published"
        if document not in self._vocabularies:
            self._vocabularies[document] = _vocabulary(chart)
        return (
            None if _matches(self._vocabularies[document], event) else "undeclared_by_computed_set"
        )


def _names(document: str, events: object) -> frozenset[str]:
    if isinstance(events, str | bytes) or not isinstance(events, Iterable):
        raise TypeError(f"the declaration of {document!r} must be a list of event names")
    names = list(events)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"the declaration of {document!r} holds {name!r}, not a name")
    return frozenset(names)


def _vocabulary(chart: Machine) -> tuple[tuple[str, ...], ...]:
    """The event descriptors of every transition whose state can be active."""
    active = _can_be_active(chart)
    return tuple(
        descriptor
        for transition in chart.transitions
        if transition.source in active
        for descriptor in transition.events
    )


def _matches(descriptors: tuple[tuple[str, ...], ...], event: str) -> bool:
    tokens = event.split(".")
    return any(
        len(descriptor) <= len(tokens) and tuple(tokens[: len(descriptor)]) == descriptor
        for descriptor in descriptors
    )


def _can_be_active(chart: Machine) -> set[int]:
    """The states some run of the chart can enter, over-approximated: entering a state
    enters its ancestors, a parallel state's children, a compound's initial targets;
    a transition of a state that can be active enters its targets; a history state
    may restore any state below its parent."""
    states = chart.states
    targets: dict[int, list[int]] = {}
    for transition in chart.transitions:
        targets.setdefault(transition.source, []).extend(transition.targets)
    seen = {0}
    pending = [0]
    while pending:
        state = states[pending.pop()]
        reached: list[int] = [*state.ancestors, *targets.get(state.index, ())]
        if state.kind == "parallel":
            reached.extend(state.children)
        elif state.kind == "history":
            reached.extend(range(state.parent + 1, states[state.parent].last + 1))
        elif state.is_compound and state.initial_transition is None and state.children:
            reached.append(state.children[0])  # the initial transition is among targets
        for index in reached:
            if index not in seen:
                seen.add(index)
                pending.append(index)
    return seen
