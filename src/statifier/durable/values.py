"""The plain values ``Durable`` returns, and reading them off a stored position."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal, TypeAlias

from statifier.core import MachineState
from statifier.expr import UNDEFINED, Value, tagged
from statifier.persistence import (
    ExecutionRecord,
    LoggedInput,
    Status,
    StepError,
)
from statifier.persistence.executions import storable_text

__all__ = [
    "CHART_KEY",
    "Cancelled",
    "Description",
    "ExecutionSummary",
    "Moved",
    "PendingTimer",
    "Position",
    "Send",
    "Sent",
    "status_named",
]

CHART_KEY: Final = "statifier.chart"
"""The metadata key under which :meth:`Durable.create` files the name of the chart an
execution runs (as the driver files a child's parent under ``statifier.parent``)."""

Position: TypeAlias = Literal["kept", "pruned", "chart_gone"]
"""Whether an execution's stored position could be read: ``"kept"``; ``"pruned"``
(:func:`statifier.persistence.prune` cleared it); ``"chart_gone"`` (its chart was
retired, or its stored source no longer compiles)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingTimer:
    """A delayed send (or a send to the execution itself) waiting for its due time in
    the database, until a timer worker fires it.

    Attributes:
        send_id: the send's id (generated when the chart wrote none).
        event: the event it delivers; ``None`` when the row cannot be read here (its
            payload is sealed under a key this process lacks).
        kind: ``external`` (steps the execution), ``internal`` (its internal queue) or
            ``route`` (handed to a route).
        due_at: when it is due (timezone-aware UTC).
        route: the route of a ``route`` timer.
        attempts: how often a ``route`` timer's route refused it already.
    """

    send_id: str
    event: str | None
    kind: str
    due_at: datetime
    route: str | None = None
    attempts: int = 0

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "send_id": self.send_id,
            "event": self.event,
            "kind": self.kind,
            "due_at": self.due_at.isoformat(),
            "route": self.route,
            "attempts": self.attempts,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Description:
    """One execution as stored, in the user's words.

    Attributes:
        id: the execution id.
        chart: the name it was created under (``None`` for an execution created
            elsewhere, whose chart is none of those given).
        content_hash: the chart it runs for its whole life.
        status: a :class:`~statifier.persistence.Status`.
        configuration: the sorted ids of its active leaf states: where it is, or where
            it stopped when it failed without reaching a final state; ``()`` once it
            reached a final state or was cancelled.
        final_state: the id of the top-level ``<final>`` it ended in, else ``None``.
        outcome: its donedata, or ``{"reason": ...}`` for a failure; undefined while it
            runs and after a cancel.
        failure: ``"failed_final"``, ``"round_budget"`` or the host's reason; ``None``
            unless it failed.
        metadata: the host's identities given at create (without :data:`CHART_KEY`).
        inputs: the input log, decoded: every event it took, in order.
        timers: its pending timers, in firing order (on a SQL database; ``()`` on an
            adapter that keeps none). Those of an execution that has ended are
            discarded when due.
        error_count: how many error events its steps raised, all told.
        errors: the most recent of them (at most 20), oldest first, each with its
            step (see :class:`~statifier.persistence.StepError`).
        position: whether the stored position could be read (see :data:`Position`);
            when not, ``configuration`` is ``()`` and ``final_state`` ``None``.
        created_at, updated_at, ended_at: timezone-aware UTC times; ``ended_at`` is
            ``None`` until it ends.
    """

    id: str
    chart: str | None
    content_hash: str
    status: Status
    configuration: tuple[str, ...]
    final_state: str | None
    outcome: Value
    failure: str | None
    metadata: Mapping[str, str]
    inputs: tuple[LoggedInput, ...]
    timers: tuple[PendingTimer, ...]
    position: Position
    created_at: datetime | None
    updated_at: datetime | None
    ended_at: datetime | None
    error_count: int = 0
    errors: tuple[StepError, ...] = ()

    @property
    def finished(self) -> bool:
        """Whether it has ended (completed, failed or cancelled)."""
        return self.status.terminal

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict: values in the tagged encoding
        (:mod:`statifier.expr.tagged`, undefined as ``{"$type": "undefined"}``), times in
        ISO 8601."""
        return {
            "id": self.id,
            "chart": self.chart,
            "content_hash": self.content_hash,
            "status": self.status.value,
            "configuration": list(self.configuration),
            "final_state": self.final_state,
            "outcome": tagged.encode(self.outcome),
            "failure": self.failure,
            "metadata": dict(self.metadata),
            "inputs": [_input_json(entry) for entry in self.inputs],
            "timers": [timer.as_json() for timer in self.timers],
            "error_count": self.error_count,
            "errors": [error.as_json() for error in self.errors],
            "position": self.position,
            "created_at": _iso(self.created_at),
            "updated_at": _iso(self.updated_at),
            "ended_at": _iso(self.ended_at),
        }


@dataclass(frozen=True, slots=True)
class Send:
    """One event for :meth:`Durable.send_many <statifier.durable.Durable.send_many>`:
    the arguments :meth:`Durable.send <statifier.durable.Durable.send>` takes.

    Attributes:
        execution_id: the execution to step.
        event: the event's name.
        data: the event's data (``_event.data``); undefined by default, while ``None``
            sends null.
    """

    execution_id: str
    event: str
    data: Value = UNDEFINED


@dataclass(frozen=True, slots=True, kw_only=True)
class Sent:
    """What one :meth:`Durable.send` did (or one send of :meth:`Durable.send_many`).

    Attributes:
        execution_id: the execution.
        event: the event's name.
        delivered: whether the chart ran the event; ``False`` when the execution does
            not take events (it has ended, is parked, or is paused): then nothing ran
            and nothing was recorded in its log, and ``status`` says why.
        held: whether the event was kept for the paused execution, to be stepped in
            when it resumes (on a SQL database).
        matched: whether a transition took the event (``False`` when it was discarded,
            or ran and no transition took it: it is in the input log, unused).
        finished: whether this send ended the execution.
        status: the status after the call.
        configuration, final_state, outcome, failure: as in :class:`Description`,
            after the call.
        errors: the error events this send raised, in order: an element that failed
            (``error.execution``), a send that could not go (``error.communication``).
        timers: the execution's pending timers after the call.
        notices: what the caller should know that is not an error: timers or sends
            waiting for a worker that does not run in this process.
    """

    execution_id: str
    event: str
    delivered: bool
    matched: bool
    finished: bool
    status: Status
    configuration: tuple[str, ...]
    final_state: str | None
    outcome: Value = UNDEFINED
    failure: str | None = None
    errors: tuple[StepError, ...] = ()
    timers: tuple[PendingTimer, ...] = ()
    notices: tuple[str, ...] = ()
    held: bool = False

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict (values in the tagged encoding)."""
        return {
            "execution_id": self.execution_id,
            "event": self.event,
            "delivered": self.delivered,
            "held": self.held,
            "matched": self.matched,
            "finished": self.finished,
            "status": self.status.value,
            "configuration": list(self.configuration),
            "final_state": self.final_state,
            "outcome": tagged.encode(self.outcome),
            "failure": self.failure,
            "errors": [error.as_json() for error in self.errors],
            "timers": [timer.as_json() for timer in self.timers],
            "notices": list(self.notices),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Cancelled:
    """What one :meth:`Durable.cancel` did: ``cancelled`` is ``False`` when the
    execution had already ended (nothing changed); ``status`` is its status after."""

    execution_id: str
    cancelled: bool
    status: Status


@dataclass(frozen=True, slots=True, kw_only=True)
class Moved:
    """What one :meth:`Durable.migrate` did.

    Attributes:
        execution_id: the execution.
        migrated: whether it moved onto the chart now given under its name.
        status: its status after the call: ``active`` when it moved,
            ``needs_migration`` when it was parked, else what it was.
        content_hash: the chart it runs after the call.
        configuration: its active leaf states after the call, by id (on the new chart
            when it moved); ``()`` when its position cannot be read.
        reason: why it did not move (parked: what the plan could not carry; or it had
            ended, or was already on the new chart); ``None`` when it moved.
    """

    execution_id: str
    migrated: bool
    status: Status
    content_hash: str
    configuration: tuple[str, ...]
    reason: str | None = None

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "execution_id": self.execution_id,
            "migrated": self.migrated,
            "status": self.status.value,
            "content_hash": self.content_hash,
            "configuration": list(self.configuration),
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionSummary:
    """One row of :meth:`Durable.list`: what the record says, without loading the
    position or the input log: its status and, once it ended in one, the id of its
    top-level ``<final>``; its failure; how many error events its steps raised and
    when the last one was."""

    id: str
    chart: str | None
    status: Status
    failure: str | None
    metadata: Mapping[str, str] = field(default_factory=dict)
    created_at: datetime | None = None
    updated_at: datetime | None = None
    ended_at: datetime | None = None
    final_state: str | None = None
    error_count: int = 0
    last_error_at: datetime | None = None

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "id": self.id,
            "chart": self.chart,
            "status": self.status.value,
            "failure": self.failure,
            "metadata": dict(self.metadata),
            "created_at": _iso(self.created_at),
            "updated_at": _iso(self.updated_at),
            "ended_at": _iso(self.ended_at),
            "final_state": self.final_state,
            "error_count": self.error_count,
            "last_error_at": _iso(self.last_error_at),
        }


def _configuration(state: MachineState | None) -> tuple[str, ...]:
    return () if state is None else state.leaf_configuration()


def _final_state(state: MachineState | None) -> str | None:
    """The top-level ``<final>`` a finished chart ended in, read off the position."""
    return None if state is None else state.final_state()


MAX_ID_LENGTH: Final = 1_024
"""Characters at most of an execution id (the router's bound on the ids it takes)."""


def _text(value: object, what: str) -> str:
    """``value`` if it is a non-blank str (untyped callers pass anything)."""
    if not isinstance(value, str) or not value.strip():
        shown = repr(value)
        raise TypeError(f"{what} is a non-empty str, not {shown[:80]}")
    return value


def _execution_id(value: object) -> str:
    """``value`` if every database can store it as an execution id: a non-blank str
    of at most :data:`MAX_ID_LENGTH` characters, without a NUL or a lone surrogate.

    Raises:
        TypeError: not a non-blank str.
        ValueError: too long, or holding what a database cannot store.
    """
    text = _text(value, "an execution id")
    if len(text) > MAX_ID_LENGTH:
        raise ValueError(f"an execution id is at most {MAX_ID_LENGTH} characters, not {len(text)}")
    storable_text(text, "an execution id")
    return text


def _datamodel(data: object) -> dict[str, Value]:
    if not isinstance(data, Mapping) or not all(isinstance(key, str) for key in data):
        raise TypeError(f"data maps variable names to values, not {data!r}")
    for value in data.values():
        _in_language(value, "the data")
    return dict(data)


_NOT_VALUES: Final = (tuple, set, frozenset, bytes, bytearray)


def _in_language(data: object, what: str = "the event's data") -> object:
    """``data``, if the step sees what its input log will hold: no tuple, set or bytes
    (a tuple would be logged as a list), and no map keyed by anything but strings
    (an integer key would be logged as a string). What else a value may not be, the
    storage refuses (``Unstorable``).

    Raises:
        TypeError: naming ``what`` and the value.
    """
    stack = [data]
    seen: set[int] = set()
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            if id(value) in seen:
                continue
            seen.add(id(value))
            for key, item in value.items():
                if not isinstance(key, str):
                    raise TypeError(f"{what} maps strings to values, not the key {key!r:.80}")
                stack.append(item)
        elif isinstance(value, list):
            if id(value) in seen:
                continue
            seen.add(id(value))
            stack.extend(value)
        elif isinstance(value, _NOT_VALUES):
            raise TypeError(
                f"{what} holds a {type(value).__name__}, which is no value of the "
                "expression language (a list, a map keyed by strings, a string...)"
            )
    return data


def _host_metadata(record: ExecutionRecord) -> dict[str, str]:
    return {key: value for key, value in record.metadata.items() if key != CHART_KEY}


def status_named(status: Status | str) -> Status:
    """``status``, or the :class:`~statifier.persistence.Status` its value names.

    Raises:
        ValueError: no status has that value (the message lists them).
    """
    if isinstance(status, Status):
        return status
    try:
        return Status(status)
    except ValueError:
        known = ", ".join(s.value for s in Status)
        raise ValueError(f"unknown status {status!r}; the statuses are {known}") from None


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _input_json(entry: LoggedInput) -> dict[str, Any]:
    event, migration = entry.event, entry.migration
    answer: dict[str, Any] = {
        "seq": entry.seq,
        "via": entry.via,
        "event": None if event is None else event.name,
        "data": None if event is None else tagged.encode(event.data),
        "recorded_at": _iso(entry.recorded_at),
    }
    if migration is not None:
        answer["migration"] = {
            "from": migration.source_hash,
            "to": migration.target_hash,
            "parked": migration.reason,
            "renamed": dict(migration.renamed),
        }
    return answer
