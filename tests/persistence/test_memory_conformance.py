"""The in-memory adapter, the reference, passes the storage conformance suite; and the
suite holds an adapter that declares no capability to the required operations only."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import datetime

import pytest

from statifier.persistence import (
    Capabilities,
    ChartRecord,
    ExecutionRecord,
    InputRecord,
    MemoryAdapter,
    Status,
)
from statifier.persistence.testing import AdapterConformance


class TestMemoryAdapter(AdapterConformance):
    async def make_adapter(self) -> MemoryAdapter:
        return MemoryAdapter()


class _UndeclaredError(AssertionError):
    """An optional operation was called on an adapter that does not declare it."""


def _refuse(operation: str) -> None:
    raise _UndeclaredError(operation)


class _BareAdapter(MemoryAdapter):
    """The reference adapter declaring no capability, whose optional operations fail
    the test if the suite calls them, and which can hold no metadata."""

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities()

    async def insert_execution(self, record: ExecutionRecord) -> None:
        if record.metadata:
            raise _UndeclaredError("metadata given to an adapter that keeps none")
        await super().insert_execution(record)

    async def retire_chart(
        self, content_hash: str, retired_by: str, retired_at: datetime
    ) -> ChartRecord | None:
        raise _UndeclaredError("retire_chart")

    async def list_by_metadata(self, pairs: Mapping[str, str]) -> list[ExecutionRecord]:
        raise _UndeclaredError("list_by_metadata")

    async def statuses_by_metadata(self, pairs: Mapping[str, str]) -> dict[str, Status]:
        raise _UndeclaredError("statuses_by_metadata")

    async def append_input(
        self, execution_id: str, door: str, event: bytes, recorded_at: datetime, cap: int | None
    ) -> int | None:
        raise _UndeclaredError("append_input")

    async def inputs(self, execution_id: str) -> list[InputRecord]:
        raise _UndeclaredError("inputs")

    @asynccontextmanager
    async def exclusive(self, execution_id: str, wait: float | None) -> AsyncIterator[None]:
        _refuse("exclusive")
        yield


class _BareSuite(AdapterConformance):
    async def make_adapter(self) -> _BareAdapter:
        return _BareAdapter()


@pytest.mark.asyncio
async def test_an_adapter_without_capabilities_is_held_to_the_required_operations() -> None:
    suite = _BareSuite()
    skipped: dict[str, str] = {}
    for name, check in inspect.getmembers(suite, inspect.iscoroutinefunction):
        if not name.startswith("test_"):
            continue
        try:
            await check(await suite.make_adapter())
        except pytest.skip.Exception as skip:
            skipped[name] = skip.msg or ""
    gated = {name.split("_")[1] for name in skipped}
    assert gated == {"chart", "metadata", "input", "exclusive"}, sorted(skipped)
    assert all("does not declare the" in reason for reason in skipped.values())
    # Required operations are checked whatever is declared.
    assert "test_chart_first_save_wins" not in skipped
    assert "test_execution_round_trips_every_field" not in skipped
    assert "test_prune_clears_only_what_ended_before_the_cutoff" not in skipped
