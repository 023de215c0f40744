"""The seam between durable executions and a store: what an adapter must do, and
what it may declare it can do.

Adapters store records verbatim and decide nothing: the identity guard, statuses and
the input-log cap's meaning live above them (in :class:`~statifier.persistence.Storage`
and :class:`~statifier.persistence.Executions`). The conformance suite
(``statifier.persistence.testing``) holds an adapter to this contract.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from statifier.persistence.records import (
    AnswerRecord,
    ChartRecord,
    ErrorRecord,
    ExecutionRecord,
    InputRecord,
    PositionRecord,
    Status,
    StepWrite,
)

__all__ = ["Adapter", "Capabilities"]


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What an adapter declares it can do beyond the required operations.

    A facade reads these; it never guesses a capability from a failure.

    Attributes:
        lock: ``exclusive`` serializes calls per execution (across processes for a
            shared store).
        metadata: executions keep their metadata and can be listed by it
            (``list_by_metadata`` and ``statuses_by_metadata``).
        input_log: ``append_input`` and ``inputs`` keep an input log.
        chart_retirement: ``retire_chart`` can tombstone a chart.
        answers: durable children's answers and fan-out ends are kept
            (``insert_answer`` ... ``take_fan_out_end``); durable children need it.
        errors: the error events steps raise are kept (``record_errors``, ``errors``,
            and ``record_step``'s ``errors``). Executions count them either way.
        batched_steps: ``record_steps`` sends many steps' writes together (on
            PostgreSQL one statement), so that a caller stepping many executions in
            one transaction can write their steps at once (:meth:`Storage.deferred_steps
            <statifier.persistence.Storage.deferred_steps>`).
    """

    lock: bool = False
    metadata: bool = False
    input_log: bool = False
    chart_retirement: bool = False
    answers: bool = False
    errors: bool = False
    batched_steps: bool = False


class Adapter(Protocol):
    """A store for charts, executions, saved positions and input logs.

    Every method is a coroutine except :meth:`exclusive`, which returns an async context
    manager. Inside ``async with adapter.exclusive(id)``, the adapter's calls made by the
    same task belong to one unit of work (on SQL, one transaction, committed when the
    block ends normally and rolled back when it raises); outside it, each call stands
    alone. Records go in and come out unchanged (times may lose precision below a
    microsecond).
    """

    @property
    def capabilities(self) -> Capabilities:
        """What this adapter can do beyond the required operations."""
        ...

    # Charts.

    async def save_chart(self, chart: ChartRecord) -> ChartRecord:
        """Store ``chart`` unless its hash is already stored; answer the stored record
        (the first one saved wins, and a retired one comes back retired)."""
        ...

    async def fetch_chart(self, content_hash: str) -> ChartRecord | None:
        """The chart stored under ``content_hash`` (retired or not), or ``None``."""
        ...

    async def retire_chart(
        self, content_hash: str, retired_by: str, retired_at: datetime
    ) -> ChartRecord | None:
        """Tombstone a chart: drop its source, keep the row (capability
        ``chart_retirement``). Returns the tombstone, or ``None`` if there is no such
        chart. Retiring a retired chart returns it unchanged.

        The check that nothing in the store pins the chart (an active or parked
        execution on it, a saved position on it, a linked child: an answer of a child
        on it whose parent is active or parked) is atomic with the tombstone, and
        serialized against ``insert_execution`` on the same chart: a concurrent insert
        either is counted or is refused.

        Raises:
            Pinned: something in the store holds the chart; ``counts`` names what.
        """
        ...

    # Executions.

    async def insert_execution(self, record: ExecutionRecord) -> None:
        """Store a new execution.

        Raises:
            ExecutionExists: one with this id exists.
            ChartRetired: its chart is retired (checked atomically with the insert,
                see ``retire_chart``).
        """
        ...

    async def fetch_execution(self, execution_id: str) -> ExecutionRecord | None:
        """The execution, or ``None``."""
        ...

    async def fetch_executions(self, execution_ids: Sequence[str]) -> list[ExecutionRecord]:
        """The executions among ``execution_ids`` that exist, in one read (ids with no
        execution are left out; the order is unspecified). Where ``fetch_execution``
        locks the row it reads (inside a block on PostgreSQL), this locks every row it
        reads the same way."""
        ...

    async def update_execution(self, record: ExecutionRecord) -> None:
        """Overwrite the status, position, outcome, failure, ``updated_at`` and
        ``ended_at`` of an existing execution (its id, chart, metadata and
        ``created_at`` never change).

        Raises:
            ExecutionNotFound: there is no such execution.
        """
        ...

    async def rechart_execution(self, record: ExecutionRecord, from_hash: str) -> bool:
        """Move an execution onto another chart: overwrite its chart
        (``record.content_hash``), status, position, failure and ``updated_at``, but only
        while it is still on ``from_hash`` (the identity guard of a migration).
        Returns whether it was written: ``False`` when there is no such execution or
        it runs another chart, and then nothing changed."""
        ...

    async def count_executions_on(self, content_hash: str) -> Mapping[Status, int]:
        """How many executions run ``content_hash``, by status (zero counts may be
        left out)."""
        ...

    async def pinning_executions(self, content_hash: str) -> list[str]:
        """Ids of the executions on ``content_hash`` whose status holds the chart in use
        (active or needs_migration), in no promised order."""
        ...

    async def list_by_metadata(self, pairs: Mapping[str, str]) -> list[ExecutionRecord]:
        """Executions whose metadata holds every pair (capability ``metadata``); no
        order is promised."""
        ...

    async def statuses_by_metadata(self, pairs: Mapping[str, str]) -> dict[str, Status]:
        """The status of every execution whose metadata holds every pair, by id
        (capability ``metadata``): the cheap projection closing a fan-out asks for."""
        ...

    async def count_linked_children_on(self, content_hash: str) -> int:
        """How many ended durable children on ``content_hash`` have an answer whose
        parent is active or parked (0 without capability ``answers``)."""
        ...

    # Durable children's answers (capability ``answers``).

    async def insert_answer(self, record: AnswerRecord) -> None:
        """Store a child's answer; a second answer for the same child is ignored (the
        first one stays)."""
        ...

    async def fetch_answer(self, child_id: str) -> AnswerRecord | None:
        """The child's answer, delivered or not, or ``None``."""
        ...

    async def undelivered_answers(self, limit: int) -> list[AnswerRecord]:
        """Up to ``limit`` answers not yet delivered, oldest first, leaving out those
        whose parent (when stored here) waits (:attr:`Status.waits`)."""
        ...

    async def mark_delivered(self, child_ids: Sequence[str], delivered_at: datetime) -> None:
        """Record that the answers of ``child_ids`` were delivered (a delivered one
        keeps its first time; an id with no answer is ignored)."""
        ...

    async def take_fan_out_end(self, parent_id: str, invoke_id: str, ended_at: datetime) -> bool:
        """Record that the fan-out ``invoke_id`` of ``parent_id`` closed: ``True`` for
        the one call that takes it, ``False`` for every later one."""
        ...

    async def fan_out_ended(self, parent_id: str, invoke_id: str) -> bool:
        """Whether the fan-out has closed (its end was taken)."""
        ...

    # Saved positions.

    async def save_position(self, record: PositionRecord) -> None:
        """Store or replace the position saved under ``record.key``."""
        ...

    async def fetch_position(self, key: str) -> PositionRecord | None:
        """The position saved under ``key``, or ``None``."""
        ...

    async def delete_position(self, key: str) -> bool:
        """Forget the position saved under ``key``; returns whether there was one."""
        ...

    async def count_positions_on(self, content_hash: str) -> int:
        """How many saved positions belong to ``content_hash``."""
        ...

    # The input log (capability ``input_log``).

    async def append_input(
        self,
        execution_id: str,
        via: str,
        event: bytes,
        recorded_at: datetime,
        cap: int | None,
    ) -> int | None:
        """Append one entry at the next ``seq`` (dense, from 0) and answer it.

        With a ``cap``, a log holds at most ``cap`` entries: the entry that would take
        the last slot is replaced by a closing marker (``event`` ``None``), and once the
        log is closed nothing more is appended; both answer ``None``.
        """
        ...

    async def inputs(self, execution_id: str) -> list[InputRecord]:
        """The execution's log in ``seq`` order (empty when there is none)."""
        ...

    async def record_step(
        self,
        record: ExecutionRecord,
        via: str,
        event: bytes,
        recorded_at: datetime,
        cap: int | None,
        errors: Sequence[ErrorRecord] = (),
    ) -> int | None:
        """A step's writes as one: ``update_execution(record)``,
        ``append_input(record.id, via, event, recorded_at, cap)`` and, with the
        capability ``errors``, ``record_errors(errors)`` with each error's ``seq`` set
        to what the append returns; all or nothing. Returns what the append returns.
        A database adapter makes it one round trip where it can (a step writes the
        first two every time; errors are rare).

        Raises:
            ExecutionNotFound: there is no such execution (nothing is written).
        """
        ...

    async def record_steps(self, steps: Sequence[StepWrite], cap: int | None) -> None:
        """``record_step`` for each of ``steps`` (none with errors), in order, all or
        nothing; with the capability ``batched_steps``, sent together.

        Raises:
            ExecutionNotFound: one of the executions does not exist.
        """
        ...

    # Errors (capability ``errors``).

    async def record_errors(self, errors: Sequence[ErrorRecord]) -> None:
        """Store ``errors`` as given, in order."""
        ...

    async def errors(self, execution_id: str, limit: int) -> list[ErrorRecord]:
        """The execution's ``limit`` most recent errors, oldest first (empty when
        there are none)."""
        ...

    # Retention.

    async def prune(self, ended_before: datetime, limit: int) -> list[str]:
        """Clear the position, the input log and the errors of up to ``limit``
        executions that ended before ``ended_before`` and still hold a position; keep
        their rows (and their error counts). Returns the ids pruned."""
        ...

    # Serialization (capability ``lock``).

    def exclusive(self, execution_id: str, wait: float | None) -> AbstractAsyncContextManager[None]:
        """Hold the execution's lock for the block: no other ``exclusive`` on the same
        id, from any task or process sharing the store, enters until it ends. Waits at
        most ``wait`` seconds for the lock (``None``: no bound).

        Locks on different ids may block each other (SQLite has a single writer), but a
        task holding one id's lock must be able to take another id's inside it (the
        driver creates a durable child inside its parent's step). A typed refusal
        raised by a call inside the block (``ExecutionExists``, ``ExecutionNotFound``)
        leaves the block usable.

        Raises:
            LockTimeout: the wait exceeded ``wait``.
        """
        ...
