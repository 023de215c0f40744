"""Effects: everything observable the interpreter asks its host to do or know.

The core never performs I/O, reads a clock or draws randomness; it returns these
values instead. Each carries the ``macrostep``, ``microstep`` and ``round`` it was
produced in, so an effect stream can be ordered and replayed. Trace effects (the
``Trace*`` classes) are produced only when tracing is on.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeAlias

from statifier.core.events import Event
from statifier.expr import Value
from statifier.expr.tagged import encode

__all__ = [
    "Autoforward",
    "BudgetExhausted",
    "Cancel",
    "CancelInvoke",
    "ChartError",
    "DatamodelChange",
    "DatamodelInit",
    "Done",
    "Effect",
    "Invoke",
    "Log",
    "Send",
    "SendDelayed",
    "TraceContentExecuted",
    "TraceDone",
    "TraceEntrySet",
    "TraceEventDequeued",
    "TraceExitSet",
    "TraceFinalizeAutoforward",
    "TraceInvokePass",
    "TraceMacrostepStable",
    "TraceTransitionsSelected",
    "Unmatched",
    "as_json",
    "kind",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Stamped:
    macrostep: int
    microstep: int
    round: int


@dataclass(frozen=True, slots=True, kw_only=True)
class _Outgoing(_Stamped):
    """What every send carries. ``target`` is the author's target (``None``: this
    session's external queue); ``author_id`` says whether ``send_id`` was written by the
    author."""

    event: str
    target: str | None
    type: str | None
    data: Value
    send_id: str
    author_id: bool
    content_index: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Send(_Outgoing):
    """Deliver ``event`` now."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SendDelayed(_Outgoing):
    """Deliver ``event`` after ``delay_ms`` milliseconds unless cancelled first.
    ``ordinal`` orders timers of one session: it never repeats and never resets."""

    delay_ms: int
    ordinal: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Cancel(_Stamped):
    """Cancel the pending delayed send ``send_id`` (no effect if it already fired)."""

    send_id: str
    content_index: int
    ordinal: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Invoke(_Stamped):
    """Start an invoked service. ``src`` is never fetched by the core."""

    invoke_id: str
    type: str
    src: str | None
    data: Value
    content: Value
    autoforward: bool
    state_index: int
    invoke_index: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelInvoke(_Stamped):
    """Stop the invoked service ``invoke_id``: its state was exited."""

    invoke_id: str
    state_index: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Autoforward(_Stamped):
    """Forward ``event`` unchanged to the invoked service ``invoke_id``."""

    invoke_id: str
    state_index: int
    event: Event


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetExhausted(_Stamped):
    """The macrostep spent its round budget before settling; the position is left as
    it was (still running) and the next event gets a fresh budget."""

    configuration: tuple[str, ...]
    budget: int
    pending_internal_events: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Done(_Stamped):
    """The chart reached a top-level final state (or was cancelled).
    ``configuration`` is the leaf configuration it held when it finished."""

    donedata: Value
    configuration: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ChartError(_Stamped):
    """An error event the chart raised (``error.execution``, ``error.communication``,
    ...), reported when the interpreter takes it off the internal queue: ``taken`` says
    whether a transition took it. An error event still queued when the chart finishes
    (an ``onexit`` that failed, say) is reported at the finish, not taken.

    ``event`` is the error event as the chart sees it: its ``data`` carries what the
    failing element reported (``element``, ``reason``, ``message``, ``line``,
    ``column``), its ``sendid`` the send it is about, if any."""

    event: Event
    taken: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Unmatched(_Stamped):
    """The external event ``event`` enabled no transition: the chart discarded it,
    as SCXML does (only an external event is reported so)."""

    event: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Log(_Stamped):
    """``<log label expr>``."""

    label: str | None
    value: Value
    content_index: int


@dataclass(frozen=True, slots=True, kw_only=True)
class DatamodelChange(_Stamped):
    """A write to the datamodel, by ``<assign>``, ``<script>`` (global scripts too),
    ``<foreach>``, an ``idlocation``, a finalize or a ``<data>`` binding. Exactly one of
    ``content_index`` and ``data_index`` is set."""

    path: tuple[str | int, ...]
    location: str
    new_value: Value
    prior_value: Value
    content_index: int | None = None
    data_index: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DatamodelInit(_Stamped):
    """The datamodel before any ``<data>`` element is evaluated."""

    datamodel: Mapping[str, Value]


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceEventDequeued(_Stamped):
    event: Event
    queue: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceTransitionsSelected(_Stamped):
    transitions: tuple[int, ...]
    event: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceExitSet(_Stamped):
    states: tuple[int, ...]
    configuration: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceEntrySet(_Stamped):
    states: tuple[int, ...]
    configuration: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceContentExecuted(_Stamped):
    owner: str
    content: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceMacrostepStable(_Stamped):
    configuration: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceDone(_Stamped):
    donedata: Value
    configuration: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceInvokePass(_Stamped):
    states: tuple[int, ...]
    invoke_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceFinalizeAutoforward(_Stamped):
    event: str
    finalized: tuple[str, ...]
    forwarded: tuple[str, ...]


Effect: TypeAlias = (
    Send
    | SendDelayed
    | Cancel
    | Invoke
    | CancelInvoke
    | Autoforward
    | BudgetExhausted
    | Done
    | ChartError
    | Unmatched
    | Log
    | DatamodelChange
    | DatamodelInit
    | TraceEventDequeued
    | TraceTransitionsSelected
    | TraceExitSet
    | TraceEntrySet
    | TraceContentExecuted
    | TraceMacrostepStable
    | TraceDone
    | TraceInvokePass
    | TraceFinalizeAutoforward
)


_COUNTERS = frozenset({"macrostep", "microstep", "round"})


def kind(effect: Effect) -> str:
    """The effect's name in snake case: ``send``, ``send_delayed``, ``trace_exit_set``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(effect).__name__).lower()


def as_json(effect: Effect) -> dict[str, Any]:
    """A JSON-ready form: ``{"effect": kind(effect), ...fields}``, values in the tagged
    encoding (``{"$type": "undefined"}`` and so on), events as maps.

    >>> as_json(Log(label="x", value=None, content_index=0, macrostep=1, microstep=1, round=0))
    {'effect': 'log', 'label': 'x', 'value': None, 'content_index': 0, 'macrostep': 1, \
'microstep': 1, 'round': 0}
    """
    result: dict[str, Any] = {"effect": kind(effect)}
    ordered = sorted(fields(effect), key=lambda field: field.name in _COUNTERS)
    for field in ordered:
        value = getattr(effect, field.name)
        if isinstance(value, Event):
            value = {key: encode(item) for key, item in value.as_value().items()}
        elif isinstance(value, tuple):
            value = [encode(item) for item in value]
        else:
            value = encode(value)
        result[field.name] = value
    return result
