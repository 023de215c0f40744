"""Executions spread over three PostgreSQL servers of the test's own
(:class:`~statifier.persistence.shards.ShardedAdapter`): one server stopped while the
executions of every store are being stepped. The other stores' executions keep
stepping, unhindered; the stopped server's refuse with ``DatabaseUnavailable`` and step
again once it is back; every step taken is in its execution's log exactly once."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest
from tests.service.own_postgres import servers

from statifier.chart import compile_chart
from statifier.core import Event
from statifier.persistence import Executions, Storage
from statifier.persistence.executor import ignore_effects
from statifier.persistence.shards import ShardedAdapter, bucket_of
from statifier.persistence.sql import SqlAdapter
from statifier.persistence.sql.postgres import DatabaseUnavailable
from statifier.sql import migrations

COUNTER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="on">
<datamodel><data id="n" expr="0"/></datamodel>
<state id="on">
  <transition event="add"><assign location="n" expr="n + 1"/></transition>
</state>
</scxml>"""

PER_STORE = 4


@pytest.mark.asyncio
async def test_a_stopped_server_stops_its_own_executions_alone() -> None:
    with servers(3) as three:
        for server in three:
            await asyncio.to_thread(migrations.upgrade, server.url)
        adapters = [SqlAdapter(server.url) for server in three]
        try:
            sharded = ShardedAdapter(adapters)
            lifecycle = Executions(Storage(sharded), executor=ignore_effects)
            machine = compile_chart(COUNTER, name="counter")
            placed: dict[int, list[str]] = {0: [], 1: [], 2: []}
            number = 0
            while any(len(ids) < PER_STORE for ids in placed.values()):
                execution_id = f"ex-{number}"
                number += 1
                store = placed[sharded.shard_map.store_of(bucket_of(execution_id))]
                if len(store) < PER_STORE:
                    store.append(execution_id)
            for ids in placed.values():
                for execution_id in ids:
                    await lifecycle.create(execution_id, machine)
            taken: Counter[str] = Counter()

            async def step(execution_id: str) -> None:
                await lifecycle.step(execution_id, machine, Event("add"))
                taken[execution_id] += 1

            async def rounds(stores: tuple[int, ...], count: int) -> float:
                for _ in range(count):
                    for store in stores:
                        for execution_id in placed[store]:
                            await step(execution_id)
                return time.monotonic()

            await rounds((0, 1, 2), 2)
            await asyncio.to_thread(three[1].stop)

            async def refused() -> float:
                with pytest.raises(DatabaseUnavailable):
                    await step(placed[1][0])
                return time.monotonic()

            # The stopped server's execution waits for a connection, then is refused;
            # meanwhile the others step, without waiting for it.
            others_done, refused_at = await asyncio.gather(rounds((0, 2), 3), refused())
            assert others_done < refused_at
            assert all(taken[i] == 5 for store in (0, 2) for i in placed[store])
            assert all(taken[i] == 2 for i in placed[1])

            await asyncio.to_thread(three[1].start)
            await rounds((1,), 1)  # back: the pool connects again within its wait
            await rounds((0, 1, 2), 1)

            for ids in placed.values():
                for execution_id in ids:
                    record = await sharded.fetch_execution(execution_id)
                    assert record is not None
                    logged = await sharded.inputs(execution_id)
                    count = lifecycle.storage.load(record, machine).datamodel["n"]
                    assert (len(logged), count) == (taken[execution_id], taken[execution_id])
            assert all(taken[i] == 6 for store in (0, 2) for i in placed[store])
            assert all(taken[i] == 4 for i in placed[1])
        finally:
            for adapter in adapters:
                await adapter.close()
