"""Replaying an execution's input log through the pure core, one step per input.

A durable execution stores its latest position and the events it took (its input log),
not the positions in between. :func:`replay` recomputes them: it starts the chart as
``Executions.create`` does and hands each logged event to the same interpreter
functions ``Executions.step`` calls, so the console can show the configuration and the
datamodel after every input.

A create's start data (initial values, a BasicHTTP location) is the log's first entry,
at door ``"create"``, and starts the replay. What the log does not hold cannot be
replayed exactly: other start options a host passed, which sends and invocations the
host's executor refused, and host expression functions the machine given lacks.
:func:`replay` takes the first two as arguments and marks a step that called a missing
function, and
:func:`diverges` tells whether a replay ended where the execution's stored position is,
so a page can say when the replay is not to be trusted.

>>> from datetime import UTC, datetime
>>> from statifier.chart import compile_chart
>>> from statifier.core import Event
>>> from statifier.persistence import LoggedInput
>>> machine = compile_chart(
...     '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="open">'
...     '<datamodel><data id="knocks" expr="0"/></datamodel>'
...     '<state id="open"><transition event="knock">'
...     '<assign location="knocks" expr="knocks + 1"/></transition>'
...     '<transition event="close" target="closed"/></state>'
...     '<final id="closed"/></scxml>'
... )
>>> at = datetime(2026, 1, 1, tzinfo=UTC)
>>> log = [LoggedInput(0, "step", Event("knock"), at), LoggedInput(1, "step", Event("close"), at)]
>>> for step in replay(machine, log):
...     print(step.index, step.event_name, step.configuration, dict(step.datamodel))
0 None ('open',) {'knocks': 0}
1 knock ('open',) {'knocks': 1}
2 close () {'knocks': 1}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Final

from statifier.chart import Machine
from statifier.core import (
    Event,
    MachineState,
    StartOptions,
    deliver_internal,
    handle_event,
    initialize,
)
from statifier.core import effects as fx
from statifier.expr import UNDEFINED, Value
from statifier.persistence import LoggedInput, logged_start
from statifier.persistence.executor import EffectContext, Refused, refusal_event
from statifier.persistence.migration import MIGRATE_DOOR

__all__ = [
    "MAX_REPLAY_INPUTS",
    "SYSTEM_VARIABLES",
    "UNKNOWN_FUNCTION",
    "Refusals",
    "ReplayStep",
    "assume_performed",
    "diverges",
    "replay",
    "shown_datamodel",
]

MAX_REPLAY_INPUTS: Final = 2_000
"""The most logged inputs one replay computes; later ones are answered as not replayed
(a page shows a bounded timeline, and each step runs the interpreter)."""

MAX_REFUSAL_ROUNDS: Final = 32
"""As in the lifecycle: how many rounds of refusals one step tells the chart of."""

UNKNOWN_FUNCTION: Final = "Unknown function: "
"""How the expression language spells the ``reason`` of a call to a function it does
not have (the conformance corpus's spelling), in the ``error.execution`` it raises."""

_TRACES: Final = (
    fx.TraceEventDequeued,
    fx.TraceTransitionsSelected,
    fx.TraceExitSet,
    fx.TraceEntrySet,
    fx.TraceContentExecuted,
    fx.TraceMacrostepStable,
    fx.TraceDone,
    fx.TraceInvokePass,
    fx.TraceFinalizeAutoforward,
)

SYSTEM_VARIABLES: Final = frozenset({"_event", "_sessionid", "_name", "_ioprocessors", "_x"})
"""Datamodel names a replay step leaves out: the interpreter's own variables. The
``_ioprocessors`` of an execution with a BasicHTTP location holds a bearer token, which
a page must never show."""

Refusals = Callable[[fx.Effect, EffectContext], Refused | None]
"""Which of a step's effects the host refused, as a synchronous executor answers them
(see :data:`statifier.persistence.Executor`): ``None`` for performed, :class:`Refused`
for a send or an invocation that was not. :func:`assume_performed` refuses nothing;
``statifier.persistence.executor.refuse_unperformed`` is what ``Executions`` and
``Durable`` use when given no executor."""


@dataclass(frozen=True, slots=True)
class ReplayStep:
    """Where an execution was after one input.

    Attributes:
        index: 0 for the start, ``n`` for after the ``n``-th logged input.
        door: ``"create"`` for the start, else the log's door (``"step"``, ``"timer"``,
            ``"answer"``...).
        event_name: the input's event name (``None`` for the start and for the marker
            that closed a log at its cap).
        event_data: the input's event data (undefined when it had none).
        configuration: the sorted ids of the active atomic states, as
            ``Durable.describe`` answers them.
        datamodel: the data after the input, without :data:`SYSTEM_VARIABLES`.
        active: what :func:`statifier.console.diagram.render_chart_svg` should light:
            every active named state (ancestors included) in document order, or, once
            the chart ended in a top-level final, that final alone.
        running: whether the chart was still running after the input.
        final_state: the top-level ``<final>`` it ended in, once it did (a finished
            chart has no active state: ``configuration`` is then empty).
        seq: the log entry's sequence number (``None`` for the start).
        recorded_at: when the input was logged (``None`` for the start).
        not_replayed: ``None`` when this step was computed; otherwise why not, and then
            ``configuration``, ``datamodel``, ``active`` and ``running`` repeat the last
            step that was.
    """

    index: int
    door: str
    event_name: str | None
    event_data: Value
    configuration: tuple[str, ...]
    datamodel: Mapping[str, Value]
    active: tuple[str, ...] = ()
    running: bool = True
    final_state: str | None = None
    seq: int | None = None
    recorded_at: datetime | None = None
    not_replayed: str | None = None


def assume_performed(effect: fx.Effect, context: EffectContext) -> Refused | None:
    """The refusals of a host whose executor performed every effect: none."""
    return None


def shown_datamodel(state: MachineState) -> dict[str, Value]:
    """A position's datamodel without :data:`SYSTEM_VARIABLES`, in name order."""
    data = state.datamodel
    return {name: data[name] for name in sorted(data) if name not in SYSTEM_VARIABLES}


def replay(
    machine: Machine,
    inputs: Sequence[LoggedInput],
    *,
    execution_id: str = "session",
    options: StartOptions | None = None,
    refusals: Refusals = assume_performed,
    limit: int = MAX_REPLAY_INPUTS,
) -> list[ReplayStep]:
    """Recompute an execution's position after its start and after each logged input.

    Args:
        machine: the chart the execution runs, compiled with the host's expression
            functions if it calls any.
        inputs: its input log (``Executions.inputs``), in order.
        execution_id: its id (the lifecycle starts a chart with ``_sessionid`` set to
            it, which a chart may read).
        options: the start options its create was given, if known (the session id is
            replaced by ``execution_id``, as ``Executions.create`` does). A log that
            opens with the create's start data (door ``"create"``) adds its values to
            ``options.datamodel``, and that entry is step 0.
        refusals: which sends and invocations the host refused; each refusal is told to
            the chart in the same step, as the lifecycle does.
        limit: the most inputs computed; those past it are marked not replayed.

    Returns:
        ``len(inputs) + 1`` steps: step 0 after the start, step ``n`` after input ``n``
        (``len(inputs)`` when the log opens with the start data: that entry is step 0).
        An input that cannot be replayed (the log's cap marker, an input after the
        chart stopped, an interpreter error, a step that called a function ``machine``
        lacks: a host function the replay was not given) is marked in
        ``not_replayed``, and so is every input after it, since the position it leads
        to is unknown. Never raises for what the log holds.

    Raises:
        ValueError: ``limit`` is negative.
    """
    if limit < 0:
        raise ValueError(f"limit is a count of inputs, not {limit!r}")
    # Traced, to see the error.execution events that name a missing host function.
    start = replace(options or StartOptions(), session_id=execution_id, trace=True)
    start, rest = logged_start(inputs, start)
    opening = inputs[0] if len(rest) < len(inputs) else None
    inputs = rest
    state, missing = _start(machine, start, execution_id, refusals)
    if state is None:
        first = ReplayStep(0, "create", None, UNDEFINED, (), {}, running=False)
        return [replace(first, not_replayed=missing), *_unknown(first, inputs, missing or "")]
    first = _step(0, "create", opening, state)
    if opening is not None and opening.event is not None:
        # A BasicHTTP location in the start data's _ioprocessors is a credential.
        data = opening.event.data
        assert isinstance(data, dict)  # logged_start took it
        shown = {name: value for name, value in data.items() if name not in SYSTEM_VARIABLES}
        first = replace(first, event_data=shown)
    steps = [first]
    stopped: str | None = None
    for number, entry in enumerate(inputs, start=1):
        last = steps[-1]
        if stopped is None:
            stopped, state = _advance(state, entry, number, limit, execution_id, refusals)
        if stopped is not None:
            steps.append(_marked(last, number, entry, stopped))
            stopped = _after(stopped)
            continue
        assert state is not None
        steps.append(_step(number, entry.door, entry, state))
    return steps


def diverges(step: ReplayStep, stored: MachineState) -> bool:
    """Whether a replay's last ``step`` differs from the execution's ``stored``
    position (its configuration or its datamodel): then the log did not say everything
    the execution saw (start options, refusals or host functions differed)."""
    return step.not_replayed is not None or (
        step.configuration != stored.leaf_configuration()
        or dict(step.datamodel) != shown_datamodel(stored)
    )


def _start(
    machine: Machine, start: StartOptions, execution_id: str, refusals: Refusals
) -> tuple[MachineState | None, str | None]:
    """The chart started: ``(position, None)`` or ``(None, why it cannot be replayed)``."""
    try:
        state, effects = initialize(machine, start)
        state, effects = _told(state, effects, execution_id, "create", refusals)
    except Exception as error:  # noqa: BLE001 - a page shows why, nothing after it is known
        return None, f"the start could not be replayed: {_said(error)}"
    missing = _missing_function(effects)
    return (state, None) if missing is None else (None, missing)


def _advance(
    state: MachineState | None,
    entry: LoggedInput,
    number: int,
    limit: int,
    execution_id: str,
    refusals: Refusals,
) -> tuple[str | None, MachineState | None]:
    """One input through the core: ``(None, new position)`` or ``(why not, None)``."""
    if number > limit:
        return f"past the replay limit of {limit} inputs", None
    event = entry.event
    if entry.door == MIGRATE_DOOR:
        return "the execution moved to another revision of its chart here", None
    if event is None:
        return "the input log was closed here at its cap", None
    if state is None or not state.running:
        return "the chart had stopped before this input", None
    try:
        # A fired timer of a send to #_internal goes on the internal queue, as the
        # timer worker steps it; everything else is an external event.
        if entry.door == "timer" and event.type == "internal":
            state, effects = deliver_internal(state, event)
        else:
            state, effects = handle_event(state, event)
        state, effects = _told(state, effects, execution_id, entry.door, refusals)
    except Exception as error:  # noqa: BLE001 - a replay shows what failed, never fails
        return f"the interpreter could not replay this input: {_said(error)}", None
    missing = _missing_function(effects)
    return (None, state) if missing is None else (missing, None)


def _told(
    state: MachineState,
    effects: list[fx.Effect],
    execution_id: str,
    door: str,
    refusals: Refusals,
) -> tuple[MachineState, list[fx.Effect]]:
    """Tell the chart of the refused effects, round after round, as the lifecycle's
    ``_carry_out`` does; answers the position and every effect."""
    refused = _refused(effects, execution_id, door, refusals)
    rounds = 0
    while refused and state.running:
        rounds += 1
        if rounds > MAX_REFUSAL_ROUNDS:
            raise RuntimeError(f"refusals kept coming for {MAX_REFUSAL_ROUNDS} rounds")
        state, more = deliver_internal(state, *refused)
        effects = [*effects, *more]
        refused = _refused(more, execution_id, door, refusals)
    return state, effects


def _missing_function(effects: list[fx.Effect]) -> str | None:
    """Why a step cannot be trusted when the chart called a function the machine does
    not have: the host that ran it may have had that function."""
    for effect in effects:
        if isinstance(effect, fx.TraceEventDequeued) and effect.event.name == "error.execution":
            data = effect.event.data
            reason = data.get("reason") if isinstance(data, dict) else None
            if isinstance(reason, str) and reason.startswith(UNKNOWN_FUNCTION):
                name = reason.removeprefix(UNKNOWN_FUNCTION)
                return f"the chart called {name}(), a host function the replay was not given"
    return None


def _refused(
    effects: list[fx.Effect], execution_id: str, door: str, refusals: Refusals
) -> list[Event]:
    events: list[Event] = []
    seen = [effect for effect in effects if not isinstance(effect, _TRACES)]
    for ordinal, effect in enumerate(seen):
        if isinstance(effect, fx.Done):
            continue
        context = EffectContext(
            execution_id,
            door=door,
            ordinal=ordinal,
            macrostep=effect.macrostep,
            microstep=effect.microstep,
            round=effect.round,
        )
        answer = refusals(effect, context)
        if answer is not None:
            events.append(refusal_event(effect, answer))
    return events


def _step(index: int, door: str, entry: LoggedInput | None, state: MachineState) -> ReplayStep:
    event = None if entry is None else entry.event
    final = _final_state(state)
    return ReplayStep(
        index,
        door,
        None if event is None else event.name,
        UNDEFINED if event is None else event.data,
        state.leaf_configuration(),
        shown_datamodel(state),
        active=_active(state) if final is None else (final,),
        running=state.running,
        final_state=final,
        seq=None if entry is None else entry.seq,
        recorded_at=None if entry is None else entry.recorded_at,
    )


def _marked(last: ReplayStep, index: int, entry: LoggedInput, reason: str) -> ReplayStep:
    # Built directly, not with dataclasses.replace: a long log past the limit marks
    # thousands of steps.
    event = entry.event
    return ReplayStep(
        index,
        entry.door,
        None if event is None else event.name,
        UNDEFINED if event is None else event.data,
        last.configuration,
        last.datamodel,
        active=last.active,
        running=last.running,
        final_state=last.final_state,
        seq=entry.seq,
        recorded_at=entry.recorded_at,
        not_replayed=reason,
    )


def _unknown(first: ReplayStep, inputs: Sequence[LoggedInput], reason: str) -> list[ReplayStep]:
    after = _after(reason)
    return [_marked(first, n, entry, after) for n, entry in enumerate(inputs, start=1)]


def _after(reason: str) -> str:
    """What inputs after an unreplayable one are marked with."""
    prefix = "an earlier input could not be replayed"
    return reason if reason.startswith(("past the replay limit", prefix)) else prefix


def _active(state: MachineState) -> tuple[str, ...]:
    states = state.machine.states
    return tuple(node_id for index in sorted(state.configuration) if (node_id := states[index].id))


def _final_state(state: MachineState) -> str | None:
    # A chart stops the moment it enters a top-level final, so the one final child of
    # the root it ever entered is where it ended (a cancelled chart entered none).
    if state.running:
        return None
    states = state.machine.states
    for index in sorted(state.entered):
        node = states[index]
        if node.kind == "final" and node.parent == 0 and index != 0:
            return node.id
    return None


def _said(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"
