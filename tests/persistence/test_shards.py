"""A sharded store (:mod:`statifier.persistence.shards`): the storage conformance suite
over three in-memory stores, over three SQLite files and over three PostgreSQL schemas;
the buckets and the map; and durable executions stepped over three stores ending as
over one. (The lifecycle and driver tests run over sharded stores too: the
``adapter`` fixture's ``sharded-*`` backends.)"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.persistence.conftest import SQL_BACKENDS, SqlStore

from statifier.chart import compile_chart
from statifier.core import Event
from statifier.durable import Durable
from statifier.persistence import Executions, MemoryAdapter, Status, Storage
from statifier.persistence.adapter import Adapter
from statifier.persistence.executor import ignore_effects
from statifier.persistence.shards import BUCKETS, ShardedAdapter, ShardMap, bucket_of
from statifier.persistence.sql import SqlAdapter
from statifier.persistence.testing import FullConformance


class TestShardedMemory(FullConformance):
    async def make_adapter(self) -> Adapter:
        return ShardedAdapter([MemoryAdapter(), MemoryAdapter(), MemoryAdapter()])


@pytest.fixture(params=SQL_BACKENDS)
def shards(request: pytest.FixtureRequest) -> list[SqlStore]:
    found: list[SqlStore] = request.getfixturevalue(f"{request.param}_shards")
    return found


class TestShardedSql(FullConformance):
    """Three SQLite files, or three schemas of one PostgreSQL database."""

    exclusive_rolls_back = True

    @pytest.fixture(autouse=True)
    def _on(self, shards: list[SqlStore]) -> None:
        self.shards = shards
        # A SQLite file admits one writer at a time, whatever the execution.
        self.exclusive_locks_whole_store = shards[0].backend == "sqlite"

    async def make_adapter(self) -> Adapter:
        for store in self.shards:
            store.empty()
        return ShardedAdapter([SqlAdapter(store.url, store.tables) for store in self.shards])

    async def close_adapter(self, adapter: Adapter) -> None:
        assert isinstance(adapter, ShardedAdapter)
        for store in adapter.stores:
            assert isinstance(store, SqlAdapter)
            await store.close()


# The buckets and the map.


def test_a_child_falls_in_its_roots_bucket_and_ids_spread_over_every_store() -> None:
    adapter = ShardedAdapter([MemoryAdapter() for _ in range(3)])
    assert bucket_of("order-17/pay") == bucket_of("order-17/pay/2") == bucket_of("order-17")
    stores = Counter(adapter.stores.index(adapter.shard_of(f"ex-{n}")) for n in range(3_000))
    assert sorted(stores) == [0, 1, 2]
    assert min(stores.values()) > 800  # about a third each


def test_the_bucket_of_an_id_never_changes() -> None:
    # The same buckets in every process and every version: a store holds its rows by
    # them. A change of the hash fails here before it moves anyone's executions.
    assert [bucket_of(f"ex-{n}") for n in range(5)] == [117, 730, 337, 697, 1012]


@pytest.mark.parametrize(
    ("ranges", "problem"),
    [
        ((), "at least one range"),
        (((0, 500), (600, BUCKETS)), "must start at 500"),
        (((0, 500), (400, BUCKETS)), "must start at 500"),
        (((0, 0), (0, BUCKETS)), "each non-empty"),
        (((0, 1000),), "end at 1000"),
    ],
)
def test_a_map_that_leaves_a_gap_or_overlaps_is_refused(
    ranges: tuple[tuple[int, int], ...], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        ShardMap(ranges)


def test_an_uneven_map_places_buckets_where_it_says() -> None:
    shard_map = ShardMap(((0, 100), (100, BUCKETS)))
    assert [shard_map.store_of(b) for b in (0, 99, 100, BUCKETS - 1)] == [0, 0, 1, 1]
    with pytest.raises(ValueError, match="not between"):
        shard_map.store_of(BUCKETS)
    with pytest.raises(ValueError, match="2 ranges for 3 stores"):
        ShardedAdapter([MemoryAdapter() for _ in range(3)], shard_map)
    with pytest.raises(ValueError, match="between 1 and"):
        ShardMap.even(0)


# Durable executions over three stores end as over one.

COUNTER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="on">
<datamodel><data id="n" expr="0"/><data id="seen" expr="0"/></datamodel>
<state id="on">
  <transition event="add"><assign location="n" expr="n + _event.data.by"/></transition>
  <transition event="mark"><assign location="seen" expr="_event.data.tag"/></transition>
  <transition event="stop" target="off"/>
</state>
<final id="off"/>
</scxml>"""

EVENTS = st.one_of(
    st.builds(lambda by: ("add", {"by": by}), st.integers(-5, 5)),
    st.builds(lambda tag: ("mark", {"tag": tag}), st.integers(0, 9)),
    st.just(("stop", None)),
)


async def _run(
    adapter: Adapter, script: list[tuple[int, str, dict[str, Any] | None]]
) -> dict[str, Any]:
    machine = compile_chart(COUNTER, name="counter")
    lifecycle = Executions(Storage(adapter), executor=ignore_effects)
    ids = sorted({f"ex-{target}" for target, _, _ in script})
    for execution_id in ids:
        await lifecycle.create(execution_id, machine)
    for target, name, data in script:
        execution_id = f"ex-{target}"
        record = await adapter.fetch_execution(execution_id)
        assert record is not None
        if record.status is Status.ACTIVE:
            await lifecycle.step(execution_id, machine, Event(name, data=data))
    finals = {}
    for execution_id in ids:
        record = await adapter.fetch_execution(execution_id)
        assert record is not None
        state = lifecycle.storage.load(record, machine)
        finals[execution_id] = (record.status, state.datamodel["n"], state.datamodel["seen"])
    return finals


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 11), EVENTS), max_size=60))
def test_random_event_streams_end_the_same_over_one_store_and_three(
    stream: list[tuple[int, tuple[str, dict[str, Any] | None]]],
) -> None:
    script = [(target, name, data) for target, (name, data) in stream]
    one = asyncio.run(_run(ShardedAdapter([MemoryAdapter()]), script))
    three = asyncio.run(_run(ShardedAdapter([MemoryAdapter() for _ in range(3)]), script))
    assert three == one


@pytest.mark.asyncio
async def test_durable_runs_over_a_sharded_store() -> None:
    stores = [MemoryAdapter() for _ in range(3)]
    sharded = ShardedAdapter(stores)
    async with Durable(sharded, charts={"counter": COUNTER}) as durable:
        ids = [(await durable.create("counter")).id for _ in range(12)]
        for execution_id in ids:
            await durable.send(execution_id, "add", {"by": 2})
        described = [await durable.describe(execution_id) for execution_id in ids]
        assert {d.status for d in described} == {Status.ACTIVE}
        assert all(len(d.inputs) == 1 for d in described)
        assert len(await durable.list()) == 12
        with pytest.raises(RuntimeError, match="only a SQL database keeps timers"):
            await durable.fire_due()
    for execution_id in ids:  # each in its bucket's store, and there only
        held = [store for store in stores if execution_id in store.executions]
        assert held == [sharded.shard_of(execution_id)]
