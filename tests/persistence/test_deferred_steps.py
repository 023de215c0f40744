"""``Storage.deferred_steps``: steps' writes queued and sent together in one adapter
call where the adapter declares ``batched_steps``, a queued write answered by the next
read of its execution, sent before any other adapter call, and dropped when the block
raises. (The router's batches run it on PostgreSQL: ``tests/router/test_batch.py``.)"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

import pytest

from statifier.chart import compile_chart
from statifier.core import Event
from statifier.persistence import Executions, MemoryAdapter, Storage
from statifier.persistence.adapter import Capabilities
from statifier.persistence.codec import PLAIN
from statifier.persistence.fernet import FernetCodec
from statifier.persistence.records import ErrorRecord, ExecutionRecord, InputRecord, StepWrite

COUNTER = compile_chart(
    """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="s">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="s"><transition event="tick"><assign location="n" expr="n + 1"/></transition></state>
</scxml>"""
)


class BatchingAdapter(MemoryAdapter):
    """The memory adapter, declaring ``batched_steps`` (or not) and noting its calls
    in order."""

    def __init__(self, *, batched: bool = True) -> None:
        super().__init__()
        self.batched = batched
        self.calls: list[str] = []

    @property
    def capabilities(self) -> Capabilities:
        return replace(super().capabilities, batched_steps=self.batched)

    async def record_step(
        self,
        record: ExecutionRecord,
        via: str,
        event: bytes,
        recorded_at: datetime,
        cap: int | None,
        errors: Sequence[ErrorRecord] = (),
    ) -> int | None:
        self.calls.append(f"record_step {record.id}")
        return await super().record_step(record, via, event, recorded_at, cap, errors)

    async def record_steps(self, steps: Sequence[StepWrite], cap: int | None) -> None:
        self.calls.append("record_steps " + " ".join(step.record.id for step in steps))
        for step in steps:
            await super().record_step(step.record, step.via, step.event, step.recorded_at, cap)

    async def inputs(self, execution_id: str) -> list[InputRecord]:
        self.calls.append(f"inputs {execution_id}")
        return await super().inputs(execution_id)


async def _count(storage: Storage, execution_id: str) -> object:
    record = await storage.fetch_execution(execution_id)
    return storage.load(record, COUNTER).datamodel["n"]


async def _made(storage: Storage, *execution_ids: str) -> Executions:
    executions = Executions(storage)
    for execution_id in execution_ids:
        await executions.create(execution_id, COUNTER)
    return executions


@pytest.mark.asyncio
@pytest.mark.parametrize("sealed", [False, True])
async def test_queued_steps_are_read_back_and_sent_together(sealed: bool) -> None:
    adapter = BatchingAdapter()
    codec = FernetCodec([FernetCodec.generate_key()]) if sealed else PLAIN
    storage = Storage(adapter, codec=codec)
    executions = await _made(storage, "a", "b")
    async with storage.deferred_steps():
        await executions.step("a", COUNTER, Event("tick"))
        await executions.step("b", COUNTER, Event("tick"))
        await executions.step("a", COUNTER, Event("tick"))  # reads its first step's write
        assert await _count(storage, "a") == 2
        assert adapter.calls == []
    assert adapter.calls == ["record_steps a b a"]
    assert [await _count(storage, x) for x in ("a", "b")] == [2, 1]
    assert [entry.seq for entry in await storage.inputs("a")] == [0, 1]


@pytest.mark.asyncio
async def test_any_other_adapter_call_sends_the_queued_steps_first() -> None:
    adapter = BatchingAdapter()
    storage = Storage(adapter)
    executions = await _made(storage, "a")
    async with storage.deferred_steps():
        await executions.step("a", COUNTER, Event("tick"))
        logged = await storage.inputs("a")
        assert adapter.calls == ["record_steps a", "inputs a"]
        assert [entry.seq for entry in logged] == [0]
        await executions.step("a", COUNTER, Event("tick"))
    assert adapter.calls == ["record_steps a", "inputs a", "record_steps a"]
    assert await _count(storage, "a") == 2


@pytest.mark.asyncio
async def test_a_block_that_raises_sends_nothing() -> None:
    adapter = BatchingAdapter()
    storage = Storage(adapter)
    executions = await _made(storage, "a")

    async def undone() -> None:
        async with storage.deferred_steps():
            await executions.step("a", COUNTER, Event("tick"))
            raise RuntimeError("undone")

    with pytest.raises(RuntimeError, match="undone"):
        await undone()
    assert adapter.calls == []
    assert await _count(storage, "a") == 0  # nothing queued is answered any more


@pytest.mark.asyncio
async def test_without_the_capability_each_step_is_written_when_it_happens() -> None:
    adapter = BatchingAdapter(batched=False)
    storage = Storage(adapter)
    executions = await _made(storage, "a")
    async with storage.deferred_steps():
        await executions.step("a", COUNTER, Event("tick"))
        assert adapter.calls == ["record_step a"]
    assert adapter.calls == ["record_step a"]


@pytest.mark.asyncio
async def test_an_execution_created_in_the_block_is_stepped_without_reading_its_row() -> None:
    adapter = BatchingAdapter()
    storage = Storage(adapter)
    executions = Executions(storage)
    reads: list[str] = []
    fetch = adapter.fetch_execution

    async def counted(execution_id: str) -> ExecutionRecord | None:
        reads.append(execution_id)
        return await fetch(execution_id)

    adapter.fetch_execution = counted  # type: ignore[method-assign]
    async with storage.deferred_steps():
        await executions.create("a", COUNTER)
        await executions.step("a", COUNTER, Event("tick"))
    assert reads == ["a"]  # the create's check that the id is free, and no more
    assert adapter.calls == ["record_steps a"]
    assert await _count(storage, "a") == 1
