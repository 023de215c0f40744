"""What durable executions store: plain, frozen records that adapters read and write."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime

__all__ = [
    "AnswerRecord",
    "ChartRecord",
    "ErrorRecord",
    "ExecutionRecord",
    "InputRecord",
    "PositionRecord",
    "Status",
    "StepWrite",
]


class Status(enum.Enum):
    """Where an execution is in its life.

    ``ACTIVE`` takes events. ``NEEDS_MIGRATION`` is parked on its chart and takes none
    until it is put back. ``PAUSED`` takes none until it is resumed: the router keeps
    what is sent to it meanwhile (``held_events``) and steps it in on resume.
    ``COMPLETED``, ``FAILED`` and ``CANCELLED`` are terminal: a step to them is
    discarded.
    """

    ACTIVE = "active"
    NEEDS_MIGRATION = "needs_migration"
    PAUSED = "paused"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """Whether the execution has ended (completed, failed or cancelled)."""
        return self in _TERMINAL

    @property
    def pins(self) -> bool:
        """Whether an execution in this status holds its chart in use."""
        return self in (Status.ACTIVE, Status.NEEDS_MIGRATION, Status.PAUSED)

    @property
    def waits(self) -> bool:
        """Whether an execution in this status takes no event now but will once it is
        put back (parked on its chart, or paused): what is owed to it stays owed."""
        return self in (Status.NEEDS_MIGRATION, Status.PAUSED)


_TERMINAL = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED})


@dataclass(frozen=True, slots=True)
class ChartRecord:
    """A stored chart: its SCXML source under its content hash.

    ``source`` is ``None`` once the chart is retired (a tombstone keeps the hash, who
    retired it and when).
    """

    content_hash: str
    _: KW_ONLY
    source: bytes | None
    name: str | None
    version: str | None
    saved_at: datetime
    retired_at: datetime | None = None
    retired_by: str | None = None


@dataclass(frozen=True, slots=True)
class ExecutionRecord:
    """One durable execution: one chart for its whole life.

    Attributes:
        id: chosen by the host (a transaction key, say).
        content_hash: the chart it runs.
        status: see :class:`Status`.
        position: the stored position (``statifier.core.positions`` bytes); ``None``
            once pruned.
        metadata: host identities (a tenant id, a parent id), written once at create.
        outcome: the answer of a finished execution as JSON bytes (its donedata, or a
            failure's details), read by a parent; ``None`` while it runs.
        failure: why it failed (``"failed_final"``, ``"round_budget"``, or the reason a
            host gave to ``fail``); ``None`` otherwise.
        created_at, updated_at, ended_at: timezone-aware times; ``ended_at`` is set
            when the execution reaches a terminal status.
        error_count: how many error events (``error.*``) its steps raised, all told.
        last_error_at: when a step last raised one; ``None`` if none ever did.
        final_state: the id of the top-level ``<final>`` it ended in, written by the
            call that finished it; ``None`` while it runs and for an end without one
            (cancelled, failed by the host or by a spent budget).
    """

    id: str
    _: KW_ONLY
    content_hash: str
    status: Status
    position: bytes | None
    metadata: Mapping[str, str] = field(default_factory=dict)
    outcome: bytes | None = None
    failure: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    ended_at: datetime | None = None
    error_count: int = 0
    last_error_at: datetime | None = None
    final_state: str | None = None


@dataclass(frozen=True, slots=True)
class PositionRecord:
    """A position a host saved under a key of its own (a session id, say)."""

    key: str
    _: KW_ONLY
    content_hash: str
    position: bytes
    saved_at: datetime


@dataclass(frozen=True, slots=True)
class InputRecord:
    """One entry of an execution's input log.

    ``seq`` is dense and starts at 0. ``via`` names how the event entered (``"step"``,
    ``"answer"``, ``"cancel"``...). ``event`` holds ``positions.dump_event`` bytes, or
    ``None`` for the marker that closes a log which reached its cap.
    """

    execution_id: str
    _: KW_ONLY
    seq: int
    via: str
    event: bytes | None
    recorded_at: datetime


@dataclass(frozen=True, slots=True)
class StepWrite:
    """One step's writes, as ``record_step`` takes them without errors: the
    execution's new record and the input-log entry of the event it stepped."""

    record: ExecutionRecord
    _: KW_ONLY
    via: str
    event: bytes
    recorded_at: datetime


@dataclass(frozen=True, slots=True)
class ErrorRecord:
    """One error event a step raised, as stored (capability ``errors``).

    Attributes:
        execution_id: the execution whose step raised it.
        seq: the step's entry in the input log, or ``None`` when the step logged none
            (a create without start data, a cancel, a log closed at its cap).
        via: how the step's event entered (``"step"``, ``"timer"``, ``"create"``...).
        name: the error event's name (``error.execution``, ``error.communication``...).
        taken: whether a transition of the chart took it.
        error: what the error event carried, as JSON bytes: its data (``element``,
            ``reason``, ``message``, ``line``, ``column`` for an expression's failure)
            and its ``sendid``; stored through the storage's codec.
        recorded_at: when the step was stored.
    """

    execution_id: str
    _: KW_ONLY
    seq: int | None
    via: str
    name: str
    taken: bool
    error: bytes
    recorded_at: datetime


@dataclass(frozen=True, slots=True)
class AnswerRecord:
    """What an ended durable child owes its parent, written in the child's finishing
    transaction and kept until (and after) it is delivered.

    Attributes:
        child_id: the child execution; at most one answer per child.
        parent_id, invoke_id: whom it answers, and for which ``<invoke>``.
        content_hash: the child's chart (a linkage pin while the parent runs).
        status: how the child ended: completed, failed or cancelled.
        outcome: the child's outcome bytes (donedata, or a failure's details).
        failure: the child's failure string when it failed.
        created_at: when the child ended.
        delivered_at: when the parent took the answer (stepped it in, closed its
            fan-out, or had no use for it); ``None`` while it is owed.
    """

    child_id: str
    _: KW_ONLY
    parent_id: str
    invoke_id: str
    content_hash: str
    status: Status
    outcome: bytes | None
    failure: str | None
    created_at: datetime
    delivered_at: datetime | None = None
