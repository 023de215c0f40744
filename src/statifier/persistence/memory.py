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
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import datetime

from statifier.persistence.adapter import Capabilities
from statifier.persistence.errors import ExecutionExists, ExecutionNotFound, LockTimeout
from statifier.persistence.records import (
    ChartRecord,
    ExecutionRecord,
    InputRecord,
    PositionRecord,
    Status,
)

__all__ = ["MemoryAdapter"]

_EVERYTHING = Capabilities(lock=True, metadata=True, input_log=True, chart_retirement=True)


class MemoryAdapter:
    """An :class:`~statifier.persistence.adapter.Adapter` over dictionaries."""

    def __init__(self) -> None:
        self.charts: dict[str, ChartRecord] = {}
        self.executions: dict[str, ExecutionRecord] = {}
        self.positions: dict[str, PositionRecord] = {}
        self.logs: dict[str, list[InputRecord]] = {}
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
        chart = self.charts.get(content_hash)
        if chart is None or chart.retired_at is not None:
            return chart
        tombstone = replace(chart, source=None, retired_at=retired_at, retired_by=retired_by)
        self.charts[content_hash] = tombstone
        return tombstone

    async def insert_execution(self, record: ExecutionRecord) -> None:
        if record.id in self.executions:
            raise ExecutionExists(record.id)
        self.executions[record.id] = replace(record, metadata=dict(record.metadata))

    async def fetch_execution(self, execution_id: str) -> ExecutionRecord | None:
        return self.executions.get(execution_id)

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
        door: str,
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
                InputRecord(execution_id, seq=seq, door=door, event=None, recorded_at=recorded_at)
            )
            return None
        log.append(
            InputRecord(execution_id, seq=seq, door=door, event=event, recorded_at=recorded_at)
        )
        return seq

    async def inputs(self, execution_id: str) -> list[InputRecord]:
        return list(self.logs.get(execution_id, ()))

    async def prune(self, ended_before: datetime, limit: int) -> list[str]:
        pruned: list[str] = []
        for record in list(self.executions.values()):
            if len(pruned) >= limit:
                break
            ended = record.ended_at
            if ended is not None and ended < ended_before and record.position is not None:
                self.executions[record.id] = replace(record, position=None)
                self.logs.pop(record.id, None)
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
