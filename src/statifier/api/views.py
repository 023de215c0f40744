"""What the HTTP API answers, as JSON: an execution, a list row, a routing outcome.

An answer shows an execution's status, where it is (its active leaf states, or the
final state it ended in), its failure, the errors of the step the answer is about, its
address, and of its datamodel only the fields declared visible for its document:
nothing else of the datamodel leaves. Values are in the tagged encoding
(:mod:`statifier.expr.tagged`), times in ISO 8601.

>>> outcome_json(Duplicate("orders", key="o-1"), lambda binding, key, step: {})["outcome"]
'duplicate'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from statifier.core import MachineState
from statifier.expr import tagged
from statifier.persistence import ExecutionRecord, StepError, Stepped
from statifier.router import (
    Buffered,
    CreatedAndDelivered,
    Delivered,
    Dropped,
    Duplicate,
    Held,
    KeyRefused,
    NoMatch,
    Outcome,
)

__all__ = ["Address", "Snapshot", "StepJson", "execution_json", "outcome_json", "reached"]


@dataclass(frozen=True, slots=True)
class Address:
    """The ``(scope, document, key)`` an execution is addressed under."""

    scope: str
    document: str
    key: str


@dataclass(frozen=True, slots=True)
class Snapshot:
    """An execution as one read (or one step) left it.

    Attributes:
        record: the stored record.
        state: its position, loaded; ``None`` when it cannot be (pruned, a retired
            chart, unreadable).
        errors: the errors of the step the answer is about (a send's own step), or
            the execution's most recent ones (a read).
        address: its address, if the router made it.
    """

    record: ExecutionRecord
    state: MachineState | None
    errors: tuple[StepError, ...]
    address: Address | None

    @classmethod
    def of_step(cls, step: Stepped, address: Address | None) -> Snapshot:
        """What a delivery's step left: the record and position its transaction
        committed, and the errors that step raised."""
        return cls(step.execution, step.state, step.errors, address)


def reached(snapshot: Snapshot, state: str | None) -> bool:
    """Whether ``snapshot`` has ``state`` active (any state of its configuration, or
    the final state it ended in), or, with ``state`` ``None``, has ended."""
    record = snapshot.record
    if state is None:
        return record.status.terminal
    if record.final_state == state:
        return True
    found = snapshot.state
    if found is None:
        return False
    if not found.running:
        return found.final_state() == state
    states = found.machine.states
    return any(states[index].id == state for index in found.configuration)


def execution_json(snapshot: Snapshot, visible: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """The JSON of one execution: ``visible`` maps a document to the datamodel fields
    an answer may show of its executions (by the address's document)."""
    record, state, address = snapshot.record, snapshot.state, snapshot.address
    running = state is not None and state.running
    final = record.final_state or (None if state is None else state.final_state())
    shown: dict[str, Any] = {}
    if state is not None and address is not None:
        data = state.datamodel
        for name in visible.get(address.document, ()):
            if name in data:
                shown[name] = tagged.encode(data[name])
    return {
        "id": record.id,
        "document": None if address is None else address.document,
        "status": record.status.value,
        "configuration": list(state.leaf_configuration()) if running and state else [],
        "final_state": final,
        "failure": record.failure,
        "errors": [error.as_json() for error in snapshot.errors],
        "error_count": record.error_count,
        "data": shown,
        "addresses": []
        if address is None
        else [{"scope": address.scope, "document": address.document, "key": address.key}],
        "created_at": _iso(record.created_at),
        "updated_at": _iso(record.updated_at),
        "ended_at": _iso(record.ended_at),
    }


StepJson = Callable[[str, str, Stepped], dict[str, Any]]
"""``(binding id, key, step)``: the JSON of the execution as a delivery's step left it."""


def outcome_json(outcome: Outcome, execution: StepJson) -> dict[str, Any]:
    """The JSON of one binding's outcome; ``execution`` gives the JSON of the
    execution as the outcome's own step left it (for an outcome that stepped one:
    delivered, created and delivered, dropped as unmatched)."""
    key: str | None = None
    execution_id: str | None = None
    reason: str | None = None
    step: Stepped | None = None
    kind = outcome.outcome
    match outcome:
        case Delivered() | CreatedAndDelivered():
            key, execution_id, step = outcome.key, outcome.execution_id, outcome.step
        case Held():
            key, execution_id = outcome.key, outcome.execution_id
        case Dropped():
            key, execution_id, reason = outcome.key, outcome.execution_id, outcome.reason.value
            step, kind = outcome.step, "dropped"
        case Duplicate() | Buffered():
            key = outcome.key
        case KeyRefused():
            reason = outcome.reason
        case NoMatch():
            pass
    shown = None if step is None or key is None else execution(outcome.binding_id, key, step)
    return {
        "binding": outcome.binding_id,
        "outcome": kind,
        "key": key,
        "execution_id": execution_id,
        "reason": reason,
        "execution": shown,
    }


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()
