"""Replaying an execution's input log through the pure core, one step per input.

A durable execution stores its latest position and the events it took (its input log),
not the positions in between. :func:`replay` recomputes them: it starts the chart as
``Executions.create`` does and hands each logged event to the same interpreter
functions ``Executions.step`` calls, so the console can show the configuration and the
datamodel after every input.

Each step also says what it handed over: the sends it made (:class:`StepSend`, each
with the idempotency key the router gives it, which names its timer row or outbox row)
and the delayed sends it cancelled.

A create's start data (initial values, a BasicHTTP location) is the log's first entry,
via ``"create"``, and starts the replay. What the log does not hold cannot be
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
from dataclasses import KW_ONLY, dataclass, replace
from datetime import datetime
from typing import Final

from statifier.chart import Machine
from statifier.core import Event, MachineState, StartOptions, handle_event, initialize
from statifier.core import effects as fx
from statifier.core.events import SCXML_PROCESSOR
from statifier.core.interpreter import deliver_internal
from statifier.expr import UNDEFINED, Value
from statifier.persistence import LoggedInput
from statifier.persistence.executions import logged_start
from statifier.persistence.executor import EffectContext, Refused, refusal_event
from statifier.persistence.migration import MIGRATE_VIA
from statifier.router.sending import send_key

__all__ = [
    "MAX_REPLAY_INPUTS",
    "SYSTEM_VARIABLES",
    "UNKNOWN_FUNCTION",
    "Refusals",
    "ReplayStep",
    "StepCancel",
    "StepSend",
    "assume_performed",
    "diverges",
    "replay",
    "shown_datamodel",
    "stored_options",
]

MAX_REPLAY_INPUTS: Final = 2_000
"""The most logged inputs one replay computes; later ones are returned as not replayed
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

Made = Sequence[tuple[fx.Effect, EffectContext]]
"""What a step handed over: each effect with the context the executor got it in."""


@dataclass(frozen=True, slots=True)
class StepSend:
    """A send a replayed step handed over, as the executor saw it.

    Attributes:
        send_id: the send's id (the author's, or one the interpreter generated).
        event: the event's name.
        type: the send's type (``None``: SCXML's own).
        target: the author's target (``None``: the execution itself).
        delay_ms: the delay of a delayed send; ``None`` for a send with none.
        author_id: whether ``send_id`` was written by the author (only then does the
            event it delivers carry it as ``sendid``).
        key: the idempotency key the router composes for it (``str`` of
            :func:`statifier.router.sending.send_key`): a timer row's ``dedup_key``, an
            outbox row's ``key``, a refused send's ledger ``message_id``.
        to_self: whether the router delivers it back to the execution that sent it
            (SCXML's type with no target or the execution's own ``#_scxml_`` target,
            or, delayed, ``#_internal``), always through a timer row.
    """

    send_id: str
    _: KW_ONLY
    event: str
    type: str | None
    target: str | None
    delay_ms: int | None
    author_id: bool
    key: str
    to_self: bool


@dataclass(frozen=True, slots=True)
class StepCancel:
    """A ``<cancel>`` a replayed step ran: the router deletes the execution's pending
    timers of ``send_id``."""

    send_id: str


@dataclass(frozen=True, slots=True)
class ReplayStep:
    """Where an execution was after one input.

    Attributes:
        index: 0 for the start, ``n`` for after the ``n``-th logged input.
        via: ``"create"`` for the start, else the entry's ``via`` (``"step"``, ``"timer"``,
            ``"answer"``...).
        event_name: the input's event name (``None`` for the start and for the marker
            that closed a log at its cap).
        event_data: the input's event data (undefined when it had none).
        configuration: the sorted ids of the active atomic states, as
            ``Durable.describe`` returns them.
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
            step that was, and ``handed`` is empty (unknown).
        event_sendid: the input's ``sendid`` (a fired timer's event carries its
            send's id when the author wrote one).
        handed: the sends (:class:`StepSend`) and cancels (:class:`StepCancel`) the
            step handed over, in the order the executor got them.
    """

    index: int
    via: str
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
    event_sendid: str | None = None
    handed: tuple[StepSend | StepCancel, ...] = ()

    @property
    def sends(self) -> tuple[StepSend, ...]:
        """The sends the step handed over, in order."""
        return tuple(item for item in self.handed if isinstance(item, StepSend))


def assume_performed(effect: fx.Effect, context: EffectContext) -> Refused | None:
    """The refusals of a host whose executor performed every effect: none."""
    return None


def stored_options(state: MachineState) -> StartOptions:
    """The start options an execution's position says it was started with: the send
    and invoke types its host handles and its round budget, which every position keeps
    (a router stamps its send type there). A replay started with them accepts the sends
    the execution's host did."""
    return StartOptions(
        round_budget=state.round_budget,
        send_types=state.send_types,
        invoke_types=state.invoke_types,
    )


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
            opens with the create's start data (via ``"create"``) adds its values to
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
    state, missing, started = _start(machine, start, execution_id, refusals)
    if state is None:
        first = ReplayStep(0, "create", None, UNDEFINED, (), {}, running=False)
        return [replace(first, not_replayed=missing), *_unknown(first, inputs, missing or "")]
    first = _step(0, "create", opening, state, started)
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
        made: Made = ()
        if stopped is None:
            stopped, state, made = _advance(state, entry, number, limit, execution_id, refusals)
        if stopped is not None:
            steps.append(_marked(last, number, entry, stopped))
            stopped = _after(stopped)
            continue
        assert state is not None
        steps.append(_step(number, entry.via, entry, state, made))
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
) -> tuple[MachineState | None, str | None, Made]:
    """The chart started: ``(position, None, handed over)`` or ``(None, why it cannot be
    replayed, ())``."""
    try:
        state, effects = initialize(machine, start)
        state, effects, made = _told(state, effects, execution_id, "create", refusals)
    except Exception as error:  # noqa: BLE001 - a page shows why, nothing after it is known
        return None, f"the start could not be replayed: {_said(error)}", ()
    missing = _missing_function(effects)
    return (state, None, made) if missing is None else (None, missing, ())


def _advance(
    state: MachineState | None,
    entry: LoggedInput,
    number: int,
    limit: int,
    execution_id: str,
    refusals: Refusals,
) -> tuple[str | None, MachineState | None, Made]:
    """One input through the core: ``(None, new position, handed over)`` or ``(why
    not, None, ())``."""
    if number > limit:
        return f"past the replay limit of {limit} inputs", None, ()
    event = entry.event
    if entry.via == MIGRATE_VIA:
        return "the execution moved to another revision of its chart here", None, ()
    if event is None:
        return "the input log was closed here at its cap", None, ()
    if state is None or not state.running:
        return "the chart had stopped before this input", None, ()
    try:
        # A fired timer of a send to #_internal goes on the internal queue, as the
        # timer worker steps it; everything else is an external event.
        if entry.via == "timer" and event.type == "internal":
            state, effects = deliver_internal(state, event)
        else:
            state, effects = handle_event(state, event)
        state, effects, made = _told(state, effects, execution_id, entry.via, refusals)
    except Exception as error:  # noqa: BLE001 - a replay shows what failed, never fails
        return f"the interpreter could not replay this input: {_said(error)}", None, ()
    missing = _missing_function(effects)
    return (None, state, made) if missing is None else (missing, None, ())


def _told(
    state: MachineState,
    effects: list[fx.Effect],
    execution_id: str,
    via: str,
    refusals: Refusals,
) -> tuple[MachineState, list[fx.Effect], Made]:
    """Tell the chart of the refused effects, round after round, as the lifecycle's
    ``_carry_out`` does; returns the position, every effect, and what was handed over
    (each round's effects with their contexts)."""
    made = _handed(effects, execution_id, via)
    refused = _refused(made, refusals)
    rounds = 0
    while refused and state.running:
        rounds += 1
        if rounds > MAX_REFUSAL_ROUNDS:
            raise RuntimeError(f"refusals kept coming for {MAX_REFUSAL_ROUNDS} rounds")
        state, more = deliver_internal(state, *refused)
        effects = [*effects, *more]
        round_made = _handed(more, execution_id, via)
        made = [*made, *round_made]
        refused = _refused(round_made, refusals)
    return state, effects, made


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


def _handed(
    effects: list[fx.Effect], execution_id: str, via: str
) -> list[tuple[fx.Effect, EffectContext]]:
    """One round's effects as the lifecycle hands them over (``perform``): the traces a
    replay asks for left out, as an untraced step never has them, so each ordinal is
    the one the executor saw; ``Done`` is counted but not handed over."""
    seen = [effect for effect in effects if not isinstance(effect, _TRACES)]
    return [
        (effect, EffectContext.of(effect, execution_id, via, ordinal))
        for ordinal, effect in enumerate(seen)
        if not isinstance(effect, fx.Done)
    ]


def _refused(made: Made, refusals: Refusals) -> list[Event]:
    events: list[Event] = []
    for effect, context in made:
        answer = refusals(effect, context)
        if answer is not None:
            events.append(refusal_event(effect, answer))
    return events


def _handed_over(made: Made) -> tuple[StepSend | StepCancel, ...]:
    """The sends and cancels among what a step handed over, in order."""
    found: list[StepSend | StepCancel] = []
    for effect, context in made:
        if isinstance(effect, fx.Cancel):
            found.append(StepCancel(effect.send_id))
        elif isinstance(effect, fx.Send | fx.SendDelayed):
            found.append(
                StepSend(
                    effect.send_id,
                    event=effect.event,
                    type=effect.type,
                    target=effect.target,
                    delay_ms=effect.delay_ms if isinstance(effect, fx.SendDelayed) else None,
                    author_id=effect.author_id,
                    key=str(send_key(effect, context)),
                    to_self=_to_self(effect, context.execution_id),
                )
            )
    return tuple(found)


def _to_self(effect: fx.Send | fx.SendDelayed, execution_id: str) -> bool:
    """Whether the router makes ``effect`` a timer of its own execution (as its send
    handler decides: SCXML's type, no target or the execution's own, or a delayed
    ``#_internal``)."""
    if effect.type not in (None, "scxml", SCXML_PROCESSOR):
        return False
    target = effect.target
    if target is None or target == f"#_scxml_{execution_id}":
        return True
    return target in ("#_internal", "_internal") and isinstance(effect, fx.SendDelayed)


def _step(
    index: int, via: str, entry: LoggedInput | None, state: MachineState, made: Made
) -> ReplayStep:
    event = None if entry is None else entry.event
    final = state.final_state()
    return ReplayStep(
        index,
        via,
        None if event is None else event.name,
        UNDEFINED if event is None else event.data,
        state.leaf_configuration(),
        shown_datamodel(state),
        active=_active(state) if final is None else (final,),
        running=state.running,
        final_state=final,
        seq=None if entry is None else entry.seq,
        recorded_at=None if entry is None else entry.recorded_at,
        event_sendid=None if event is None else event.sendid,
        handed=_handed_over(made),
    )


def _marked(last: ReplayStep, index: int, entry: LoggedInput, reason: str) -> ReplayStep:
    # Built directly, not with dataclasses.replace: a long log past the limit marks
    # thousands of steps.
    event = entry.event
    return ReplayStep(
        index,
        entry.via,
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
        event_sendid=None if event is None else event.sendid,
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


def _said(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"
