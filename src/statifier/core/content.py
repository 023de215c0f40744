"""Executable content, the datamodel and the errors they raise.

A block runs its elements in document order; the first element that fails raises
``error.execution`` and stops the rest of the block, but writes already made stay
(SCXML has no rollback). A condition that is not exactly ``true`` counts as false, and
one that is not a boolean at all also raises ``error.execution`` without stopping the
block. This module is the only place that turns failures into error events.

A call of the core (one macrostep: ``handle_event``, ``initialize``...) runs at most
:data:`MAX_CONTENT_STEPS` elements of executable content, so an untrusted chart cannot
make one step run without end (nested ``<foreach>`` over long lists); past it, every
block aborts at its next element with ``error.execution``.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Container, Mapping
from typing import Any, Final

from statifier.chart import model as m
from statifier.core import effects as fx
from statifier.core.events import (
    SCXML_INVOKE_TYPE,
    SCXML_INVOKE_TYPES,
    SCXML_PROCESSOR,
    SCXML_SEND_TYPES,
    Event,
    engine_event,
)
from statifier.expr import (
    UNDEFINED,
    Duration,
    ExprError,
    Function,
    FunctionError,
    Options,
    ParseError,
    Program,
    Value,
    parse_duration,
)
from statifier.expr.location import put

__all__ = [
    "CONTENT_BUDGET_EXCEEDED",
    "MAX_CONTENT_STEPS",
    "ConditionContext",
    "ContentRunner",
]

MAX_CONTENT_STEPS: Final = 100_000
"""Elements of executable content one call of the core (one macrostep, or
``initialize``) may run: each element run counts one (``<assign>``, ``<log>``,
``<raise>``, ``<if>``, ``<foreach>``, ``<script>``, ``<send>``, ``<cancel>``), each
``<foreach>`` iteration counts one more (it writes the item) and its body's elements
count again per iteration, and each iteration of a ``<script>``'s ``while`` loops
counts one (charged when the script ends: a script's own loops are bounded by its
loop budget). The element that would go past it is not run: its block
aborts with ``error.execution`` (reason :data:`CONTENT_BUDGET_EXCEEDED`), and so does
every later block of the same call, at its first element. The next call starts afresh.
Counted, not timed, so a step stays a deterministic function of its input."""

CONTENT_BUDGET_EXCEEDED: Final = "content_budget_exceeded"
"""The ``reason`` of the ``error.execution`` a spent :data:`MAX_CONTENT_STEPS` raises."""

_VARIABLE: Final = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


class _Abort(Exception):  # noqa: N818 - internal control flow
    """Stops the current block; carries the ``error.execution`` event's data."""

    def __init__(
        self, data: dict[str, Value], sendid: str | None = None, name: str = "error.execution"
    ) -> None:
        super().__init__(data.get("message"))
        self.data = data
        self.sendid = sendid
        self.name = name


def _no_clock() -> Any:
    raise FunctionError("a chart has no clock: pass the time in event data")


def _no_random(args: tuple[Value, ...]) -> Value:
    raise FunctionError("a chart has no randomness: pass random values in event data")


def _in(args: tuple[Value, ...], call: Any) -> Value:
    state_id = args[0]
    return isinstance(state_id, str) and call.host.is_in(state_id)


_CHART_FUNCTIONS: Final = {
    "In": Function(_in, 1, pass_context=True),
    "Math.random": Function(_no_random, 0),
}
# Statecharts read an undeclared variable as an error, even where the expression could
# absorb it; declared-but-unset variables hold undefined.
CHART_OPTIONS: Final = Options(on_unbound="error", clock=_no_clock, functions=_CHART_FUNCTIONS)


def chart_options(machine: m.Machine) -> Options:
    """The expression options of ``machine``'s content: :data:`CHART_OPTIONS`, with the
    host's functions (``compile_chart(functions=...)``) beside the chart's own; built
    once per machine (a machine never changes)."""
    if not machine.functions:
        return CHART_OPTIONS
    options: Options | None = machine.memo.get(_OPTIONS_MEMO)
    if options is None:
        functions = {**machine.functions, **_CHART_FUNCTIONS}
        options = Options(on_unbound="error", clock=_no_clock, functions=functions)
        machine.memo[_OPTIONS_MEMO] = options
    return options


_OPTIONS_MEMO: Final = "statifier.core.content.options"


class _InConfiguration:
    """The host ``In()`` asks in a :class:`ConditionContext`: a fixed configuration."""

    __slots__ = ("configuration", "ids")

    def __init__(self, ids: Mapping[str, int], configuration: frozenset[int]) -> None:
        self.ids = ids
        self.configuration = configuration

    def is_in(self, state_id: str) -> bool:
        index = self.ids.get(state_id)
        return index is not None and index in self.configuration


class ConditionContext:
    """What a transition condition sees from a position between macrosteps, before
    the event's transitions are taken: the datamodel it is given and one fixed
    configuration (for ``In()``).

    It depends on the configuration alone, so the interpreter keeps one per
    configuration (memo table ``contexts``) instead of building expression options
    on every event. It decides a condition as :meth:`ContentRunner.test` does, but
    where ``test`` would raise ``error.execution`` (a failure, or a value that is not
    a boolean) it returns ``None`` and raises nothing: the caller then has the
    working interpreter test the condition again with ``test``, which raises the
    error (expressions have no side effects, so the second evaluation gives the same
    value).
    """

    __slots__ = ("_host", "options")

    def __init__(self, machine: m.Machine, configuration: frozenset[int]) -> None:
        # The options point at a separate host object, not at self: no reference cycle.
        self._host = _InConfiguration(machine.ids, configuration)
        self.options = chart_options(machine).with_host(self._host)

    def holds(self, expr: m.Expr, datamodel: Mapping[str, Value]) -> bool | None:
        """True only for ``true``, False for ``false``, None if ``test`` would raise."""
        if expr.state_test is not None:
            return self._host.is_in(expr.state_test)
        compiled = expr.compiled
        if isinstance(compiled, ParseError):
            return None
        value = compiled.evaluate(datamodel, self.options)
        if value is True or value is False:
            return value
        return None


class ContentRunner:
    """The state and helpers one interpreter step shares with executable content."""

    def __init__(self, machine: m.Machine) -> None:
        self.bind(machine)
        # The position's fields; resume() or a fresh start fills them in.
        self.configuration: set[int] = set()
        self.internal_queue: deque[Event] = deque()
        # Shared with the states before and after: replaced on change, never mutated.
        self.history: Mapping[int, tuple[int, ...]] = {}
        self.entered: set[int] = set()
        self.states_to_invoke: set[int] = set()
        self.invocations: Mapping[tuple[int, int], str] = {}
        self.datamodel: dict[str, Value] = {}
        self.session_id = "session"
        self.macrostep = self.microstep_count = self.round = 0
        self.send_counter = self.invoke_counter = self.timer_counter = 0
        self.running = True
        self.trace = False
        self.round_budget: int | None = None
        self.send_types: frozenset[str] = frozenset()
        self.invoke_types: frozenset[str] | None = None
        self.routes: Container[str] | None = None

    def bind(self, machine: m.Machine) -> None:
        """What a step takes from the machine rather than from a position, and starts
        empty: all an interpreter resuming a position needs before it fills in every
        field of the position (it skips ``__init__``, whose defaults it would only
        overwrite)."""
        self.machine = machine
        self.states = machine.states
        self.transitions = machine.transitions
        self.memo = machine.memo
        self.effects: list[fx.Effect] = []
        self._options: Options | None = None
        # Every step binds once, before it runs anything: the budget is per step and
        # is not part of the position.
        self.content_left = MAX_CONTENT_STEPS

    @property
    def options(self) -> Options:
        """Expression options whose ``In()`` sees this step's configuration; built on
        first use, since many steps evaluate no expression."""
        if self._options is None:
            self._options = chart_options(self.machine).with_host(self)
        return self._options

    # -- queries used by In() -----------------------------------------------------------

    def is_in(self, state_id: str) -> bool:
        index = self.machine.ids.get(state_id)
        return index is not None and index in self.configuration

    # -- effects and events -------------------------------------------------------------

    def emit(self, kind: type[Any], **fields: Any) -> None:
        self.effects.append(
            kind(
                macrostep=self.macrostep, microstep=self.microstep_count, round=self.round, **fields
            )
        )

    def enqueue_platform(self, name: str, data: Value, sendid: str | None = None) -> None:
        self.internal_queue.append(engine_event(name, "platform", data, sendid))

    def execution_error(self, data: dict[str, Value], sendid: str | None = None) -> None:
        self.enqueue_platform("error.execution", data, sendid)

    # -- evaluation ------------------------------------------------------------------------

    @staticmethod
    def _failure(what: str, where: m.SourceLocation, error: ExprError | str) -> dict[str, Value]:
        if isinstance(error, ExprError):
            return {
                "element": what,
                "reason": error.reason,
                "message": error.message,
                "line": where.line,
                "column": where.column,
            }
        return {
            "element": what,
            "reason": "invalid",
            "message": error,
            "line": where.line,
            "column": where.column,
        }

    def evaluate(self, expr: m.Expr, what: str) -> Value:
        compiled = expr.compiled
        if isinstance(compiled, ParseError):
            raise _Abort(self._failure(what, expr.where, compiled))
        result = compiled.evaluate(self.datamodel, self.options)
        if isinstance(result, ExprError):
            raise _Abort(self._failure(what, expr.where, result))
        return result

    def test(self, expr: m.Expr, what: str) -> bool:
        """A condition: True only for ``true``; anything else is false, and a
        non-boolean or a failure also raises ``error.execution`` (without aborting)."""
        if expr.state_test is not None:
            return self.is_in(expr.state_test)
        try:
            value = self.evaluate(expr, what)
        except _Abort as abort:
            self.execution_error(abort.data)
            return False
        if value is True:
            return True
        if value is not False:
            self.execution_error(
                self._failure(what, expr.where, f"condition gave {value!r}, not a boolean")
            )
        return False

    def read_location(self, location: m.LocationExpr, what: str) -> Value:
        path = self.resolve(location, what)
        if str(path[0]) not in self.datamodel:
            raise _Abort(self._failure(what, location.where, f"{path[0]} is not declared"))
        return _read(self.datamodel, path)

    def resolve(self, location: m.LocationExpr, what: str) -> tuple[str | int, ...]:
        compiled = location.compiled
        if isinstance(compiled, ParseError):
            raise _Abort(self._failure(what, location.where, compiled))
        path = compiled.resolve(self.datamodel)
        if isinstance(path, ExprError):
            raise _Abort(self._failure(what, location.where, path))
        return path

    def assign(
        self,
        location: m.LocationExpr,
        value: Value,
        what: str,
        *,
        content_index: int | None = None,
        data_index: int | None = None,
    ) -> None:
        """Write through a location: the root must be declared and not a system
        variable; emits a DatamodelChange."""
        path = self.resolve(location, what)
        self.write_path(
            path,
            value,
            location.source.strip(),
            location.where,
            what,
            content_index=content_index,
            data_index=data_index,
        )

    def write_path(
        self,
        path: tuple[str | int, ...],
        value: Value,
        source: str,
        where: m.SourceLocation,
        what: str,
        *,
        content_index: int | None = None,
        data_index: int | None = None,
        declare: bool = False,
    ) -> None:
        root = str(path[0])
        if root.startswith("_"):
            raise _Abort(self._failure(what, where, f"{root} is a system variable"))
        if root not in self.datamodel and not declare:
            raise _Abort(self._failure(what, where, f"{root} is not declared in the datamodel"))
        prior = _read(self.datamodel, path)
        written = put(self.datamodel, path, value)
        if isinstance(written, ExprError):
            raise _Abort(self._failure(what, where, written))
        self.datamodel = written
        # emit(), spelt out: the most frequent effect, built without merging keyword
        # dictionaries (0.4 us of 1.8 us per write).
        self.effects.append(
            fx.DatamodelChange(
                macrostep=self.macrostep,
                microstep=self.microstep_count,
                round=self.round,
                path=path,
                location=source,
                new_value=value,
                prior_value=prior,
                content_index=content_index,
                data_index=data_index,
            )
        )

    # -- the datamodel ----------------------------------------------------------------

    def initialize_datamodel(self, overrides: Mapping[str, Value]) -> None:
        machine = self.machine
        datamodel: dict[str, Value] = {element.id: UNDEFINED for element in machine.data}
        datamodel.update(overrides)
        datamodel["_sessionid"] = self.session_id
        datamodel["_name"] = UNDEFINED if machine.name is None else machine.name
        # A host that handles other processors names them in an ``_ioprocessors``
        # override (type -> {"location": ...}); the SCXML entries are always ours.
        hosted = overrides.get("_ioprocessors")
        datamodel["_ioprocessors"] = {
            **(
                {k: v for k, v in hosted.items() if isinstance(v, dict)}
                if isinstance(hosted, dict)
                else {}
            ),
            SCXML_PROCESSOR: {"location": f"#_scxml_{self.session_id}"},
            "scxml": {"location": f"#_scxml_{self.session_id}"},
        }
        datamodel["_event"] = UNDEFINED
        self.datamodel = datamodel
        self.emit(fx.DatamodelInit, datamodel=dict(datamodel))
        self.overridden = frozenset(overrides)
        if machine.late_binding:
            self.bind_data(self.states[0].data)
            self.entered.add(0)
        else:
            self.bind_data(range(len(machine.data)))

    overridden: frozenset[str] = frozenset()
    """Top-level names the host supplied at start: their ``<data>`` is not evaluated."""

    def bind_data(self, indexes: Any) -> None:
        for index in indexes:
            element = self.machine.data[index]
            if element.id in self.overridden:
                continue
            try:
                value = self.data_value(element)
            except _Abort as abort:
                self.execution_error(abort.data)
                continue
            self.datamodel[element.id] = value
            self.emit(
                fx.DatamodelChange,
                path=(element.id,),
                location=element.id,
                new_value=value,
                prior_value=UNDEFINED,
                data_index=index,
            )

    def data_value(self, element: m.DataElement) -> Value:
        if element.expr is not None:
            return self.evaluate(element.expr, "data")
        if element.src is not None:
            raise _Abort(
                self._failure("data", element.where, f"<data src={element.src!r}> is never fetched")
            )
        if element.content is not None:
            return element.content.value
        return UNDEFINED

    # -- blocks ---------------------------------------------------------------------------

    def execute_content(self, block: m.Block, owner: str) -> None:
        """Run a block; the first failing element raises error.execution and ends it."""
        executed: list[int] = []
        try:
            self.run_nodes(block, executed)
        except _Abort as abort:
            self.enqueue_platform(abort.name, abort.data, abort.sendid)
        if self.trace:
            self.emit(fx.TraceContentExecuted, owner=owner, content=tuple(executed))

    def run_nodes(self, block: m.Block, executed: list[int]) -> None:
        for node in block:
            # One local and one attribute read per element: the budget costs next to
            # nothing on ordinary steps. Left negative once spent, so later blocks stop.
            left = self.content_left = self.content_left - 1
            if left < 0:
                raise self._budget_spent(node)
            executed.append(node.index)
            if isinstance(node, m.Raise):
                self.internal_queue.append(engine_event(node.event, "internal"))
            elif isinstance(node, m.Assign):
                self.run_assign(node)
            elif isinstance(node, m.Log):
                value = UNDEFINED if node.expr is None else self.evaluate(node.expr, "log")
                self.emit(fx.Log, label=node.label, value=value, content_index=node.index)
            elif isinstance(node, m.If):
                self.run_if(node, executed)
            elif isinstance(node, m.Foreach):
                self.run_foreach(node, executed)
            elif isinstance(node, m.Script):
                self.run_script(node)
            elif isinstance(node, m.Send):
                self.run_send(node)
            else:
                self.run_cancel(node)

    @staticmethod
    def _budget_spent(node: m.ContentNode) -> _Abort:
        """The abort of ``node``, which the spent :data:`MAX_CONTENT_STEPS` stops."""
        return _Abort(
            {
                "element": type(node).__name__.lower(),
                "reason": CONTENT_BUDGET_EXCEEDED,
                "message": (
                    f"the step ran more than {MAX_CONTENT_STEPS} elements of executable content"
                ),
                "line": node.where.line,
                "column": node.where.column,
            }
        )

    def run_assign(self, node: m.Assign) -> None:
        if node.expr is not None:
            value = self.evaluate(node.expr, "assign")
        elif node.content is not None:
            value = node.content.value
        else:
            value = UNDEFINED
        self.assign(node.location, value, "assign", content_index=node.index)

    def run_if(self, node: m.If, executed: list[int]) -> None:
        for condition, block in node.branches:
            if condition is None or self.test(condition, "if"):
                self.run_nodes(block, executed)
                return

    def run_foreach(self, node: m.Foreach, executed: list[int]) -> None:
        for name in (node.item, node.index_name):
            if name is not None and not _VARIABLE.fullmatch(name):
                raise _Abort(
                    self._failure("foreach", node.where, f"{name!r} cannot name a variable")
                )
        items = self.evaluate(node.array, "foreach")
        if not isinstance(items, list):
            raise _Abort(self._failure("foreach", node.where, "the array is not a list"))
        for name in (node.item, node.index_name):
            if name is not None and name not in self.datamodel:
                self.write_path(
                    (name,),
                    UNDEFINED,
                    name,
                    node.where,
                    "foreach",
                    content_index=node.index,
                    declare=True,
                )
        for position, item in enumerate(list(items)):
            # An iteration counts even with an empty body: its writes are work too.
            left = self.content_left = self.content_left - 1
            if left < 0:
                raise self._budget_spent(node)
            self.write_path(
                (node.item,), item, node.item, node.where, "foreach", content_index=node.index
            )
            if node.index_name is not None:
                self.write_path(
                    (node.index_name,),
                    position,
                    node.index_name,
                    node.where,
                    "foreach",
                    content_index=node.index,
                )
            self.run_nodes(node.body, executed)

    def run_script(self, node: m.Script) -> None:
        program = node.program
        if program is None:
            raise _Abort(
                self._failure("script", node.where, f"<script src={node.src!r}> is never fetched")
            )
        if isinstance(program, ParseError):
            raise _Abort(self._failure("script", node.where, program))
        assert isinstance(program, Program)
        before = self.datamodel
        system = frozenset(name for name in before if name.startswith("_"))
        options = Options(
            on_unbound="error",
            clock=_no_clock,
            functions={**self.machine.functions, **_CHART_FUNCTIONS},
            host=self,
            protected_roots=system,
        )
        execution = program.execute(before, options)
        # A script's loops are bounded per run; charged to the step's budget, many
        # scripts run by a <foreach> cannot multiply them past it.
        self.content_left -= execution.loops
        after = execution.context
        fresh_system = [name for name in after if name.startswith("_") and name not in before]
        for name in fresh_system:
            del after[name]
        self.datamodel = after
        for name, value in after.items():
            prior = before.get(name, UNDEFINED)
            if name not in before or prior is not value:
                self.emit(
                    fx.DatamodelChange,
                    path=(name,),
                    location=name,
                    new_value=value,
                    prior_value=prior,
                    content_index=node.index,
                )
        if execution.error is not None:
            raise _Abort(self._failure("script", node.where, execution.error))
        if fresh_system:
            raise _Abort(
                self._failure("script", node.where, f"{fresh_system[0]} is a system variable")
            )

    def event_data(
        self,
        namelist: tuple[m.LocationExpr, ...],
        params: tuple[m.Param, ...],
        content: m.Content | None,
        what: str,
    ) -> Value:
        if content is not None:
            if content.expr is not None:
                return self.evaluate(content.expr, what)
            return content.value
        if not namelist and not params:
            return UNDEFINED
        data: dict[str, Value] = {}
        for location in namelist:
            data[location.source.strip()] = self.read_location(location, what)
        for param in params:
            data[param.name] = self.param_value(param, what)
        return data

    def param_value(self, param: m.Param, what: str) -> Value:
        if param.expr is not None:
            return self.evaluate(param.expr, what)
        assert param.location is not None
        return self.read_location(param.location, what)

    def run_send(self, node: m.Send) -> None:
        event = node.event
        if node.eventexpr is not None:
            event = _string(self.evaluate(node.eventexpr, "send"), "event", node.where)
        target = node.target
        if node.targetexpr is not None:
            target = _string(self.evaluate(node.targetexpr, "send"), "target", node.where)
        kind = node.type
        if node.typeexpr is not None:
            kind = _string(self.evaluate(node.typeexpr, "send"), "type", node.where)
        delay_ms = 0
        if node.delay is not None:
            delay_ms = _delay(node.delay, node.where)
        elif node.delayexpr is not None:
            delay_ms = _delay(self.evaluate(node.delayexpr, "send"), node.where)
        data = self.event_data(node.namelist, node.params, node.content, "send")
        if node.id is not None:
            send_id, author = node.id, True
        else:
            self.send_counter += 1
            send_id, author = f"send_{self.send_counter}", False
        if node.idlocation is not None:
            self.assign(node.idlocation, send_id, "send", content_index=node.index)
            author = True
        if kind is not None and kind not in SCXML_SEND_TYPES and kind not in self.send_types:
            raise _Abort(
                self._failure("send", node.where, f"unsupported send type {kind!r}"), send_id
            )
        is_scxml = kind is None or kind in SCXML_SEND_TYPES
        if is_scxml and target is not None and not _valid_target(target):
            raise _Abort(self._failure("send", node.where, f"invalid target {target!r}"), send_id)
        name = event if event is not None else ""
        if (
            is_scxml
            and not delay_ms
            and self.routes is not None
            and target not in (None, "#_internal", "_internal", f"#_scxml_{self.session_id}")
            and target not in self.routes
        ):
            raise _Abort(
                self._failure("send", node.where, f"no route to {target!r}"),
                send_id,
                "error.communication",
            )
        if is_scxml and target in ("#_internal", "_internal") and not delay_ms:
            self.internal_queue.append(
                engine_event(name, "internal", data, send_id if author else None)
            )
            return
        common = {
            "event": name,
            "target": target,
            "type": kind,
            "data": data,
            "send_id": send_id,
            "author_id": author,
            "content_index": node.index,
        }
        if delay_ms:
            self.timer_counter += 1
            self.emit(fx.SendDelayed, delay_ms=delay_ms, ordinal=self.timer_counter, **common)
        else:
            self.emit(fx.Send, **common)

    def run_cancel(self, node: m.Cancel) -> None:
        send_id = node.sendid
        if node.sendidexpr is not None:
            send_id = _string(
                self.evaluate(node.sendidexpr, "cancel"), "sendid", node.where, "cancel"
            )
        self.timer_counter += 1
        self.emit(
            fx.Cancel, send_id=send_id or "", content_index=node.index, ordinal=self.timer_counter
        )

    # -- final states and invocations ----------------------------------------------------

    def done_data(self, node: m.StateNode) -> Value:
        """A final state's donedata; a failing param is left out, a failing content
        expression gives no data; each failure raises error.execution."""
        donedata = node.donedata
        if donedata is None:
            return UNDEFINED
        if donedata.content is not None:
            try:
                return self.event_data((), (), donedata.content, "donedata")
            except _Abort as abort:
                self.execution_error(abort.data)
                return UNDEFINED
        data: dict[str, Value] = {}
        for param in donedata.params:
            try:
                data[param.name] = self.param_value(param, "donedata")
            except _Abort as abort:
                self.execution_error(abort.data)
        return data or UNDEFINED

    def start_invoke(self, state: int, invoke: m.Invoke) -> str | None:
        node = self.states[state]
        try:
            kind = invoke.type
            if invoke.typeexpr is not None:
                kind = _string(
                    self.evaluate(invoke.typeexpr, "invoke"), "type", invoke.where, "invoke"
                )
            kind = kind or SCXML_INVOKE_TYPE
            if kind in SCXML_INVOKE_TYPES:
                kind = SCXML_INVOKE_TYPE
            elif self.invoke_types is not None and kind not in self.invoke_types:
                raise _Abort(
                    self._failure("invoke", invoke.where, f"unsupported invoke type {kind!r}")
                )
            src = invoke.src
            if invoke.srcexpr is not None:
                src = _string(
                    self.evaluate(invoke.srcexpr, "invoke"), "src", invoke.where, "invoke"
                )
            data = self.event_data(invoke.namelist, invoke.params, None, "invoke")
            content: Value = UNDEFINED
            if invoke.content is not None:
                content = (
                    self.evaluate(invoke.content.expr, "invoke")
                    if invoke.content.expr is not None
                    else invoke.content.value
                )
            if invoke.id is not None:
                invoke_id = invoke.id
            else:
                self.invoke_counter += 1
                prefix = f"{node.id}." if node.id is not None else ""
                invoke_id = f"{prefix}inv_{self.invoke_counter}"
                if invoke.idlocation is not None:
                    self.assign(invoke.idlocation, invoke_id, "invoke")
        except _Abort as abort:
            self.execution_error(abort.data)
            return None
        self.invocations = {**self.invocations, (state, invoke.index): invoke_id}
        self.emit(
            fx.Invoke,
            invoke_id=invoke_id,
            type=kind,
            src=src,
            data=data,
            content=content,
            autoforward=invoke.autoforward,
            state_index=state,
            invoke_index=invoke.index,
        )
        return invoke_id

    def apply_finalize(self, state: int, invoke: m.Invoke, event: Event) -> None:
        if invoke.finalize:
            self.execute_content(invoke.finalize, f"finalize:{state}:{invoke.index}")
            return
        data = event.data
        if not isinstance(data, dict):
            return
        try:
            for location in invoke.namelist:
                name = location.source.strip()
                if name in data:
                    self.assign(location, data[name], "finalize")
            for param in invoke.params:
                if param.location is not None and param.name in data:
                    self.assign(param.location, data[param.name], "finalize")
        except _Abort as abort:
            self.execution_error(abort.data)


def _read(data: Mapping[str, Value], path: tuple[str | int, ...]) -> Value:
    """The value at ``path``, or undefined where the path leads nowhere."""
    value: Value = data.get(str(path[0]), UNDEFINED)
    for step in path[1:]:
        if isinstance(value, Mapping):
            value = value.get(step, UNDEFINED)
        elif isinstance(value, list) and type(step) is int and 0 <= step < len(value):
            value = value[step]
        else:
            return UNDEFINED
    return value


def _string(value: Value, what: str, where: m.SourceLocation, element: str = "send") -> str:
    if type(value) is not str:
        raise _Abort(
            {
                "element": element,
                "reason": "invalid",
                "message": f"{what} must be a string",
                "line": where.line,
                "column": where.column,
            }
        )
    return value


def _delay(value: Value, where: m.SourceLocation) -> int:
    """A delay in whole milliseconds from a duration or a string such as ``"1.5s"``."""
    duration: Duration | None = None
    if isinstance(value, Duration):
        duration = value
    elif isinstance(value, str):
        text = value.strip()
        if text.startswith("."):
            text = "0" + text
        duration = parse_duration(text)
    if duration is None or duration.total_milliseconds() < 0:
        raise _Abort(
            {
                "element": "send",
                "reason": "invalid",
                "message": f"invalid delay {value!r}",
                "line": where.line,
                "column": where.column,
            }
        )
    return duration.total_milliseconds()


def _valid_target(target: str) -> bool:
    return target in ("#_internal", "_internal", "#_parent", "_parent") or (
        target.startswith("#_") and len(target) > 2
    )
