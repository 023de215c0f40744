"""``Storage.read_ahead``: a batch of executions read in one adapter call, each
answered once from memory, and dropped by a write, so a step never steps from a row
older than what this storage wrote."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from statifier.chart import Machine, compile_chart
from statifier.core import Event
from statifier.persistence import Executions, MemoryAdapter, Storage
from statifier.persistence.codec import PLAIN
from statifier.persistence.fernet import FernetCodec
from statifier.persistence.records import ExecutionRecord

COUNTER = compile_chart(
    """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="s">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="s"><transition event="tick"><assign location="n" expr="n + 1"/></transition></state>
</scxml>"""
)


class CountingAdapter(MemoryAdapter):
    """The memory adapter, counting its reads of executions."""

    def __init__(self) -> None:
        super().__init__()
        self.single_reads: list[str] = []
        self.batch_reads: list[list[str]] = []

    async def fetch_execution(self, execution_id: str) -> ExecutionRecord | None:
        self.single_reads.append(execution_id)
        return await super().fetch_execution(execution_id)

    async def fetch_executions(self, execution_ids: Sequence[str]) -> list[ExecutionRecord]:
        self.batch_reads.append(list(execution_ids))
        return await super().fetch_executions(execution_ids)


async def _counted(storage: Storage, machine: Machine, execution_id: str) -> object:
    record = await storage.fetch_execution(execution_id)
    return storage.load(record, machine).datamodel["n"]


@pytest.mark.asyncio
@pytest.mark.parametrize("sealed", [False, True])
async def test_held_executions_are_read_at_once_and_answered_once(sealed: bool) -> None:
    adapter = CountingAdapter()
    codec = FernetCodec([FernetCodec.generate_key()]) if sealed else PLAIN
    storage = Storage(adapter, codec=codec)
    executions = Executions(storage)
    for execution_id in ("a", "b", "c"):
        await executions.create(execution_id, COUNTER)
    adapter.single_reads.clear()

    await storage.read_ahead(["a", "b", "missing"])
    assert adapter.batch_reads == [["a", "b", "missing"]]
    await executions.step("a", COUNTER, Event("tick"))
    await executions.step("b", COUNTER, Event("tick"))
    assert adapter.single_reads == []  # both answered from what was held
    # Held once: a second step of "a" reads the row its first step wrote.
    await executions.step("a", COUNTER, Event("tick"))
    await executions.step("c", COUNTER, Event("tick"))
    assert adapter.single_reads == ["a", "c"]
    assert [await _counted(storage, COUNTER, x) for x in ("a", "b", "c")] == [2, 1, 1]


@pytest.mark.asyncio
async def test_a_write_drops_what_is_held_for_that_execution() -> None:
    adapter = CountingAdapter()
    storage = Storage(adapter)
    executions = Executions(storage)
    await executions.create("a", COUNTER)
    await storage.read_ahead(["a"])
    # A write through the storage (here a step's, which reads "a" itself first) ...
    stepped = await executions.step("a", COUNTER, Event("tick"))
    await storage.read_ahead(["a"])
    await storage.update_execution(stepped.execution)
    # ... leaves nothing held: the next read is the adapter's.
    adapter.single_reads.clear()
    assert await _counted(storage, COUNTER, "a") == 1
    assert adapter.single_reads == ["a"]


@pytest.mark.asyncio
async def test_holding_nothing_reads_nothing() -> None:
    adapter = CountingAdapter()
    await Storage(adapter).read_ahead([])
    assert adapter.batch_reads == []
