"""create and step inside a transaction the caller opened join it: a rollback leaves
nothing, a commit keeps everything, and the execution stays locked until the commit."""

from __future__ import annotations

import asyncio

import pytest

from statifier.chart import compile_chart
from statifier.core import Event
from statifier.persistence import (
    ExecutionNotFound,
    Executions,
    LockTimeout,
    Status,
    Stepped,
    Storage,
)
from statifier.persistence.sql import SqlAdapter

from .conftest import CallerTransaction

MACHINE = compile_chart(
    '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="a">'
    '<state id="a"><transition event="go" target="b"/></state>'
    '<state id="b"><transition event="go" target="c"/></state><final id="c"/></scxml>'
)


@pytest.mark.asyncio
async def test_a_rollback_leaves_no_execution_and_no_input(sql_adapter: SqlAdapter) -> None:
    async with CallerTransaction(sql_adapter) as caller:
        inside = Executions(Storage(caller.view))
        await inside.create("x", MACHINE)
        stepped = await inside.step("x", MACHINE, Event("go"))
        assert isinstance(stepped, Stepped)
        await caller.rollback()
    outside = Executions(Storage(sql_adapter))
    with pytest.raises(ExecutionNotFound):
        await outside.storage.fetch_execution("x")
    assert await outside.inputs("x") == []


@pytest.mark.asyncio
async def test_a_commit_keeps_both_and_later_steps_append_after(sql_adapter: SqlAdapter) -> None:
    async with CallerTransaction(sql_adapter) as caller:
        inside = Executions(Storage(caller.view))
        await inside.create("x", MACHINE)
        await inside.step("x", MACHINE, Event("go"))
        await caller.commit()
    outside = Executions(Storage(sql_adapter))
    done = await outside.step("x", MACHINE, Event("go"))
    assert isinstance(done, Stepped)
    assert done.execution.status is Status.COMPLETED
    assert [entry.seq for entry in await outside.inputs("x")] == [0, 1]


@pytest.mark.asyncio
async def test_the_lock_is_held_until_the_caller_commits(sql_adapter: SqlAdapter) -> None:
    await Executions(Storage(sql_adapter)).create("x", MACHINE)
    other = SqlAdapter(sql_adapter.engine.url, sql_adapter.tables)  # another process's pool
    try:
        waiting = Executions(Storage(other), lock_wait=0.2)
        async with CallerTransaction(sql_adapter) as caller:
            await Executions(Storage(caller.view)).step("x", MACHINE, Event("go"))
            with pytest.raises(LockTimeout):
                await waiting.step("x", MACHINE, Event("go"))
            later = asyncio.create_task(Executions(Storage(other)).step("x", MACHINE, Event("go")))
            await asyncio.sleep(0.1)
            assert not later.done()
            await caller.commit()
        result = await asyncio.wait_for(later, timeout=10)
        assert isinstance(result, Stepped)
        assert result.execution.status is Status.COMPLETED  # it stepped from the commit
    finally:
        await other.close()
