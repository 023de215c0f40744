"""The in-memory adapter, the reference, passes the storage conformance suite; an adapter
that declares no capability passes the required operations, and each capability's
checks refuse it."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime

import pytest

from statifier.persistence import ExecutionRecord, MemoryAdapter, Status
from statifier.persistence.adapter import Capabilities
from statifier.persistence.records import AnswerRecord, ChartRecord, ErrorRecord, InputRecord
from statifier.persistence.testing import (
    AdapterConformance,
    AnswersConformance,
    ChartRetirementConformance,
    ErrorsConformance,
    FullConformance,
    InputLogConformance,
    LockConformance,
    MetadataConformance,
)


class TestMemoryAdapter(FullConformance):
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
        self, execution_id: str, via: str, event: bytes, recorded_at: datetime, cap: int | None
    ) -> int | None:
        raise _UndeclaredError("append_input")

    async def inputs(self, execution_id: str) -> list[InputRecord]:
        raise _UndeclaredError("inputs")

    async def record_step(
        self,
        record: ExecutionRecord,
        via: str,
        event: bytes,
        recorded_at: datetime,
        cap: int | None,
        errors: Sequence[ErrorRecord] = (),
    ) -> int | None:
        raise _UndeclaredError("record_step")

    async def record_errors(self, errors: Sequence[ErrorRecord]) -> None:
        raise _UndeclaredError("record_errors")

    async def errors(self, execution_id: str, limit: int) -> list[ErrorRecord]:
        raise _UndeclaredError("errors")

    async def insert_answer(self, record: AnswerRecord) -> None:
        raise _UndeclaredError("insert_answer")

    async def fetch_answer(self, child_id: str) -> AnswerRecord | None:
        raise _UndeclaredError("fetch_answer")

    async def undelivered_answers(self, limit: int) -> list[AnswerRecord]:
        raise _UndeclaredError("undelivered_answers")

    async def mark_delivered(self, child_ids: Sequence[str], delivered_at: datetime) -> None:
        raise _UndeclaredError("mark_delivered")

    async def take_fan_out_end(self, parent_id: str, invoke_id: str, ended_at: datetime) -> bool:
        raise _UndeclaredError("take_fan_out_end")

    async def fan_out_ended(self, parent_id: str, invoke_id: str) -> bool:
        raise _UndeclaredError("fan_out_ended")

    @asynccontextmanager
    async def exclusive(self, execution_id: str, wait: float | None) -> AsyncIterator[None]:
        _refuse("exclusive")
        yield


class _BareSuite(AdapterConformance):
    async def make_adapter(self) -> _BareAdapter:
        return _BareAdapter()


@pytest.mark.asyncio
async def test_an_adapter_without_capabilities_passes_the_required_operations() -> None:
    suite = _BareSuite()
    checks = [
        (name, check)
        for name, check in inspect.getmembers(suite, inspect.iscoroutinefunction)
        if name.startswith("test_")
    ]
    assert len(checks) >= 20
    for _name, check in checks:
        # Any call of an optional operation fails with _UndeclaredError.
        await check(await suite.make_adapter())


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("suite", "capability"),
    [
        (ChartRetirementConformance, "chart_retirement"),
        (MetadataConformance, "metadata"),
        (InputLogConformance, "input_log"),
        (LockConformance, "lock"),
        (AnswersConformance, "answers"),
        (ErrorsConformance, "errors"),
    ],
)
async def test_a_capability_suite_refuses_an_adapter_that_does_not_declare_it(
    suite: type[object], capability: str
) -> None:
    declared = getattr(suite(), f"test_{capability}_is_declared")
    with pytest.raises(AssertionError, match=f"declaring {capability}"):
        await declared(_BareAdapter())
