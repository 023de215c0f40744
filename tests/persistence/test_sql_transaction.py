"""``SqlAdapter.transaction``: a transaction of the adapter's own, the caller's SQL on
its driver connection beside the adapter's calls on ``tx.adapter``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tests.persistence.conftest import SqlStore

from statifier.chart import compile_chart
from statifier.core import Event
from statifier.persistence import Executions, LockTimeout, Storage
from statifier.persistence.sql import SqlAdapter, SqlTransaction

CHART = (
    '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="open">'
    '<state id="open"><transition event="close" target="closed"/></state>'
    '<final id="closed"/></scxml>'
)


async def _count(tx: SqlTransaction, store: SqlStore) -> int:
    """The executions the transaction sees, counted by the caller's own SQL."""
    table = store.tables.executions
    name = f"{table.schema}.{table.name}" if table.schema else table.name
    if store.backend == "sqlite":
        (count,) = tx.driver.execute(f"SELECT count(*) FROM {name}").fetchone()
        return int(count)
    async with tx.driver.cursor() as cursor:
        await cursor.execute(f"SELECT count(*) FROM {name}")
        row: Any = await cursor.fetchone()
        return int(row[0])


@pytest.mark.asyncio
async def test_a_transaction_commits_at_its_end_and_rolls_back_when_it_raises(
    sql_store: SqlStore,
) -> None:
    sql_store.empty()
    machine = compile_chart(CHART)
    async with SqlAdapter(sql_store.url, sql_store.tables) as adapter:

        async def regret() -> None:
            async with adapter.transaction() as tx:
                await Executions(Storage(tx.adapter)).create("kept_not", machine)
                assert await _count(tx, sql_store) == 1  # the caller's SQL sees it
                raise RuntimeError("changed our mind")

        with pytest.raises(RuntimeError):
            await regret()
        assert await adapter.fetch_execution("kept_not") is None
        async with adapter.transaction() as tx:
            executions = Executions(Storage(tx.adapter))
            await executions.create("kept", machine)

            async def undone() -> None:
                async with tx.savepoint():
                    await executions.create("undone", machine)
                    raise ValueError("undone")

            with pytest.raises(ValueError, match="undone"):
                await undone()
            await executions.step("kept", machine, Event("close"))
        kept = await adapter.fetch_execution("kept")
        assert kept is not None
        assert kept.status.value == "completed"
        assert await adapter.fetch_execution("undone") is None


@pytest.mark.asyncio
async def test_on_sqlite_a_transaction_holds_the_single_writer(sql_store: SqlStore) -> None:
    sql_store.empty()
    machine = compile_chart(CHART)
    async with SqlAdapter(sql_store.url, sql_store.tables) as adapter:
        await Executions(Storage(adapter)).create("other", machine)
        entered = asyncio.Event()
        release = asyncio.Event()

        async def hold() -> None:
            async with adapter.transaction():
                entered.set()
                await release.wait()

        holder = asyncio.create_task(hold())
        await entered.wait()
        if sql_store.backend == "sqlite":
            with pytest.raises(LockTimeout):
                async with adapter.exclusive("other", 0.05):
                    pass
            with pytest.raises(LockTimeout):
                async with adapter.transaction(wait=0.05):
                    pass
        else:  # PostgreSQL takes no lock for a transaction
            async with adapter.exclusive("other", 0.05):
                pass
        release.set()
        await holder
        async with adapter.exclusive("other", 0.05):
            pass
