"""The in-memory adapter: the reference every other adapter is held to.

It keeps everything in dictionaries of one process and declares every capability. Its
lock is an :class:`asyncio.Lock` per execution, so it serializes tasks of one event
loop; it has no transactions, so a block under ``exclusive`` that raises keeps what it
wrote before raising (callers write last, after everything that can fail).

>>> import asyncio
>>> from statifier.persistence import MemoryAdapter
>>> adapter = MemoryAdapter()
>>> adapter.capabilities.lock, adapter.capabilities.metadata
(True, True)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import datetime

from statifier.persistence.adapter import Capabilities
from statifier.persistence.errors import (
    ChartRetired,
    ExecutionExists,
    ExecutionNotFound,
    LockTimeout,
    Pinned,
)
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

__all__ = ["MemoryAdapter"]

_EVERYTHING = Capabilities(
    lock=True, metadata=True, input_log=True, chart_retirement=True, answers=True, errors=True
)


class MemoryAdapter:
    """An :class:`~statifier.persistence.adapter.Adapter` over dictionaries."""

    def __init__(self) -> None:
        self.charts: dict[str, ChartRecord] = {}
        self.executions: dict[str, ExecutionRecord] = {}
        self.positions: dict[str, PositionRecord] = {}
        self.logs: dict[str, list[InputRecord]] = {}
        self.step_errors: dict[str, list[ErrorRecord]] = {}
        self.answers: dict[str, AnswerRecord] = {}
        self.fan_out_ends: dict[tuple[str, str], datetime] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    @property
    def capabilities(self) -> Capabilities:
        return _EVERYTHING

    async def save_chart(self, chart: ChartRecord) -> ChartRecord:
        return self.charts.setdefault(chart.content_hash, chart)

    async def fetch_chart(self, content_hash: str) -> ChartRecord | None:
        return self.charts.get(content_hash)

    async def retire_chart(
        self, content_hash: str, retired_by: str, retired_at: datetime
    ) -> ChartRecord | None:
        # No await between the count and the tombstone: atomic on one event loop.
        chart = self.charts.get(content_hash)
        if chart is None or chart.retired_at is not None:
            return chart
        pins = self._pins(content_hash)
        if pins:
            raise Pinned(content_hash, pins)
        tombstone = replace(chart, source=None, retired_at=retired_at, retired_by=retired_by)
        self.charts[content_hash] = tombstone
        return tombstone

    def _pins(self, content_hash: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        for record in self.executions.values():
            if record.content_hash == content_hash and record.status.pins:
                name = f"executions_{record.status.value}"
                counts[name] = counts.get(name, 0) + 1
        positions = sum(1 for p in self.positions.values() if p.content_hash == content_hash)
        linked = self._linked(content_hash)
        named = {"positions": positions, "children_linked": linked}
        counts.update({name: n for name, n in named.items() if n})
        return counts

    def _waits(self, execution_id: str) -> bool:
        record = self.executions.get(execution_id)
        return record is not None and record.status.waits

    def _linked(self, content_hash: str) -> int:
        def parent_pins(answer: AnswerRecord) -> bool:
            parent = self.executions.get(answer.parent_id)
            return parent is not None and parent.status.pins

        return sum(
            1
            for answer in self.answers.values()
            if answer.content_hash == content_hash and parent_pins(answer)
        )

    async def insert_execution(self, record: ExecutionRecord) -> None:
        if record.id in self.executions:
            raise ExecutionExists(record.id)
        chart = self.charts.get(record.content_hash)
        if chart is not None and chart.retired_at is not None:
            raise ChartRetired(chart.content_hash, chart.retired_by)
        self.executions[record.id] = replace(record, metadata=dict(record.metadata))

    async def fetch_execution(self, execution_id: str) -> ExecutionRecord | None:
        return self.executions.get(execution_id)

    async def fetch_executions(self, execution_ids: Sequence[str]) -> list[ExecutionRecord]:
        found = (self.executions.get(execution_id) for execution_id in execution_ids)
        return [record for record in found if record is not None]

    async def update_execution(self, record: ExecutionRecord) -> None:
        stored = self.executions.get(record.id)
        if stored is None:
            raise ExecutionNotFound(record.id)
        self.executions[record.id] = replace(
            stored,
            status=record.status,
            position=record.position,
            outcome=record.outcome,
            failure=record.failure,
            updated_at=record.updated_at,
            ended_at=record.ended_at,
            error_count=record.error_count,
            last_error_at=record.last_error_at,
            final_state=record.final_state,
        )

    async def rechart_execution(self, record: ExecutionRecord, from_hash: str) -> bool:
        stored = self.executions.get(record.id)
        if stored is None or stored.content_hash != from_hash:
            return False
        self.executions[record.id] = replace(
            stored,
            content_hash=record.content_hash,
            status=record.status,
            position=record.position,
            failure=record.failure,
            updated_at=record.updated_at,
        )
        return True

    async def count_executions_on(self, content_hash: str) -> Mapping[Status, int]:
        counts: dict[Status, int] = {}
        for record in self.executions.values():
            if record.content_hash == content_hash:
                counts[record.status] = counts.get(record.status, 0) + 1
        return counts

    async def pinning_executions(self, content_hash: str) -> list[str]:
        return [
            record.id
            for record in self.executions.values()
            if record.content_hash == content_hash and record.status.pins
        ]

    async def list_by_metadata(self, pairs: Mapping[str, str]) -> list[ExecutionRecord]:
        wanted = pairs.items()
        return [r for r in self.executions.values() if wanted <= r.metadata.items()]

    async def statuses_by_metadata(self, pairs: Mapping[str, str]) -> dict[str, Status]:
        return {record.id: record.status for record in await self.list_by_metadata(pairs)}

    async def count_linked_children_on(self, content_hash: str) -> int:
        return self._linked(content_hash)

    async def insert_answer(self, record: AnswerRecord) -> None:
        self.answers.setdefault(record.child_id, record)

    async def fetch_answer(self, child_id: str) -> AnswerRecord | None:
        return self.answers.get(child_id)

    async def undelivered_answers(self, limit: int) -> list[AnswerRecord]:
        owed = [
            answer
            for answer in self.answers.values()
            if answer.delivered_at is None and not self._waits(answer.parent_id)
        ]
        owed.sort(key=lambda answer: (answer.created_at, answer.child_id))
        return owed[: max(limit, 0)]

    async def mark_delivered(self, child_ids: Sequence[str], delivered_at: datetime) -> None:
        for child_id in child_ids:
            answer = self.answers.get(child_id)
            if answer is not None and answer.delivered_at is None:
                self.answers[child_id] = replace(answer, delivered_at=delivered_at)

    async def take_fan_out_end(self, parent_id: str, invoke_id: str, ended_at: datetime) -> bool:
        key = (parent_id, invoke_id)
        if key in self.fan_out_ends:
            return False
        self.fan_out_ends[key] = ended_at
        return True

    async def fan_out_ended(self, parent_id: str, invoke_id: str) -> bool:
        return (parent_id, invoke_id) in self.fan_out_ends

    async def save_position(self, record: PositionRecord) -> None:
        self.positions[record.key] = record

    async def fetch_position(self, key: str) -> PositionRecord | None:
        return self.positions.get(key)

    async def delete_position(self, key: str) -> bool:
        return self.positions.pop(key, None) is not None

    async def count_positions_on(self, content_hash: str) -> int:
        return sum(1 for p in self.positions.values() if p.content_hash == content_hash)

    async def append_input(
        self,
        execution_id: str,
        via: str,
        event: bytes,
        recorded_at: datetime,
        cap: int | None,
    ) -> int | None:
        log = self.logs.setdefault(execution_id, [])
        seq = len(log)
        if log and log[-1].event is None:
            return None  # closed by its marker
        if cap is not None and seq >= cap - 1:
            log.append(
                InputRecord(execution_id, seq=seq, via=via, event=None, recorded_at=recorded_at)
            )
            return None
        log.append(
            InputRecord(execution_id, seq=seq, via=via, event=event, recorded_at=recorded_at)
        )
        return seq

    async def record_step(
        self,
        record: ExecutionRecord,
        via: str,
        event: bytes,
        recorded_at: datetime,
        cap: int | None,
        errors: Sequence[ErrorRecord] = (),
    ) -> int | None:
        await self.update_execution(record)
        seq = await self.append_input(record.id, via, event, recorded_at, cap)
        await self.record_errors([replace(error, seq=seq) for error in errors])
        return seq

    async def record_steps(self, steps: Sequence[StepWrite], cap: int | None) -> None:
        for step in steps:  # all or nothing: refused before anything is written
            if step.record.id not in self.executions:
                raise ExecutionNotFound(step.record.id)
        for step in steps:
            await self.record_step(step.record, step.via, step.event, step.recorded_at, cap)

    async def inputs(self, execution_id: str) -> list[InputRecord]:
        return list(self.logs.get(execution_id, ()))

    async def record_errors(self, errors: Sequence[ErrorRecord]) -> None:
        for error in errors:
            self.step_errors.setdefault(error.execution_id, []).append(error)

    async def errors(self, execution_id: str, limit: int) -> list[ErrorRecord]:
        kept = self.step_errors.get(execution_id, [])
        return kept[-limit:] if limit > 0 else []

    async def prune(self, ended_before: datetime, limit: int) -> list[str]:
        pruned: list[str] = []
        for record in list(self.executions.values()):
            if len(pruned) >= limit:
                break
            ended = record.ended_at
            if ended is not None and ended < ended_before and record.position is not None:
                self.executions[record.id] = replace(record, position=None)
                self.logs.pop(record.id, None)
                self.step_errors.pop(record.id, None)
                pruned.append(record.id)
        return pruned

    @asynccontextmanager
    async def exclusive(self, execution_id: str, wait: float | None) -> AsyncIterator[None]:
        # Locks are kept once made: dropping one while a waiter is being woken would
        # let a newcomer take a fresh lock beside it.
        lock = self._locks.setdefault(execution_id, asyncio.Lock())
        started = time.monotonic()
        try:
            async with asyncio.timeout(wait):
                await lock.acquire()
        except TimeoutError:
            raise LockTimeout(execution_id, time.monotonic() - started) from None
        try:
            yield
        finally:
            lock.release()
