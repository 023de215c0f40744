"""A router over three stores (statifier.router.shards): each delivery in its address's
store, hops between stores through the outbox, a store away failing only its events,
and the same final datamodels as over one store for random streams."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.persistence.conftest import (  # noqa: F401 - fixtures
    SqlStore,
    postgresql_shards,
    sqlite_shards,
)

from statifier.buckets import address_bucket, bucket_of
from statifier.chart import compile_chart
from statifier.persistence.shards import ShardMap
from statifier.persistence.sql import SqlAdapter
from statifier.router import (
    Binding,
    Create,
    Failed,
    InboundEvent,
    MisplacedExecution,
    Routed,
    RouterConfig,
    ShardedRouter,
    StaticResolver,
)
from statifier.router.queries import address, ledger
from statifier.router.sending import SHARD_HOP_QUEUE, SHARD_REFUSAL_QUEUE
from statifier.sql import migrations

SCOPE = "shop"
SINK = "test:sink"

COUNTER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="live">
  <datamodel>
    <data id="total" expr="0"/><data id="got" expr="0"/>
    <data id="refused" expr="0"/><data id="why" expr="null"/>
  </datamodel>
  <state id="live">
    <transition event="add"><assign location="total" expr="total + _event.data.n"/></transition>
    <transition event="pass">
      <send type="test:sink" target="execution" id="p" event="poke">
        <param name="document" expr="'counter'"/>
        <param name="key" expr="_event.data.to"/>
        <param name="create" expr="_event.data.create"/>
        <param name="n" expr="_event.data.n"/>
      </send>
    </transition>
    <transition event="poke"><assign location="got" expr="got + _event.data.n"/></transition>
    <transition event="error.communication" cond="_event.sendid == 'p'">
      <assign location="refused" expr="refused + 1"/>
      <assign location="why" expr="_event.data.message"/>
    </transition>
  </state>
</scxml>"""
"""A counter: ``add`` adds to its total, ``pass`` sends ``poke`` to another counter's
address (``got`` adds it up there), a refused pass is counted."""

BINDINGS = [
    Binding(
        id="adds",
        source="cmd",
        match="event.kind == 'add'",
        key="event.key",
        document="counter",
        event="add",
        data=("n",),
        create=Create.IF_ABSENT,
    ),
    Binding(
        id="twins",
        source="cmd",
        match="event.kind == 'add' && event.twinned",
        key="event.twin",
        document="counter",
        event="add",
        data=("n",),
        create=Create.IF_ABSENT,
    ),
    Binding(
        id="passes",
        source="cmd",
        match="event.kind == 'pass'",
        key="event.key",
        document="counter",
        event="pass",
        data=("n", "to", "create"),
        create=Create.IF_ABSENT,
    ),
]


def _config(adapter: SqlAdapter, **options: Any) -> RouterConfig:
    return RouterConfig(
        adapter,
        bindings=BINDINGS,
        resolver=StaticResolver({"counter": compile_chart(COUNTER)}),
        send_type=SINK,
        timers_elsewhere=True,
        **options,
    )


def _add(message_id: str, key: str, n: int = 1, twin: str | None = None) -> InboundEvent:
    data: dict[str, Any] = {"kind": "add", "key": key, "n": n}
    if twin is not None:
        data.update(twin=twin, twinned=True)
    return InboundEvent(scope=SCOPE, source="cmd", message_id=message_id, data=data)


def _pass(message_id: str, key: str, to: str, n: int = 1, create: str = "never") -> InboundEvent:
    data = {"kind": "pass", "key": key, "to": to, "n": n, "create": create}
    return InboundEvent(scope=SCOPE, source="cmd", message_id=message_id, data=data)


def _store(key: str, stores: int = 3) -> int:
    return ShardMap.even(stores).store_of(address_bucket(SCOPE, "counter", key))


def _keys_in(store: int, count: int) -> list[str]:
    """``count`` keys whose addresses the ``store``-th of three stores holds."""
    found = [f"k{number}" for number in range(500) if _store(f"k{number}") == store]
    return found[:count]


async def _datamodel(router: ShardedRouter, key: str) -> Mapping[str, Any] | None:
    found = await address(router.router_of_address(SCOPE, "counter", key), SCOPE, "counter", key)
    if found is None:
        return None
    async with router.router_of_execution(found.execution_id).transaction() as unit:
        record = await unit.storage.fetch_execution(found.execution_id)
        machine = await unit.storage.machine(record.content_hash)
        data = unit.storage.load(record, machine).datamodel
    return {name: value for name, value in data.items() if not name.startswith("_")}


async def _drain(router: ShardedRouter) -> int:
    """Drain every store's hops until none is left; how many were handed over."""
    handed = 0
    drains = router.hop_drains()
    while True:
        claimed = 0
        for drain in drains:
            report = await drain.drain_once()
            assert (report.failed, report.dead) == (0, 0)
            claimed += report.claimed
        if claimed == 0:
            return handed
        handed += claimed


def _count(store: SqlStore, table: str) -> int:
    engine = sa.create_engine(migrations.sync_url(store.url))
    try:
        with engine.connect() as connection:
            counted = sa.select(sa.func.count()).select_from(getattr(store.tables, table))
            return int(connection.execute(counted).scalar_one())
    finally:
        engine.dispose()


@pytest_asyncio.fixture(params=["sqlite", "postgresql"])
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[list[SqlStore]]:
    """Three emptied stores of each backend."""
    shards: list[SqlStore] = request.getfixturevalue(f"{request.param}_shards")
    for shard in shards:
        shard.empty()
    yield shards


@pytest_asyncio.fixture
async def adapters(stores: list[SqlStore]) -> AsyncIterator[list[SqlAdapter]]:
    opened = [SqlAdapter(store.url, store.tables) for store in stores]
    try:
        yield opened
    finally:
        for adapter in opened:
            await adapter.close()


@pytest.mark.asyncio
async def test_each_delivery_is_in_its_addresss_store_and_a_redelivery_is_a_duplicate(
    stores: list[SqlStore], adapters: list[SqlAdapter]
) -> None:
    router = ShardedRouter(_config(adapters[0]), adapters)
    keys = [f"k{number}" for number in range(24)]
    batch = [_add(f"m{number}", key, n=number) for number, key in enumerate(keys)]
    answers = await router.route_many(batch)
    assert [a.outcomes[0].outcome for a in answers if isinstance(a, Routed)] == [
        "created_and_delivered"
    ] * len(keys)
    for number, key in enumerate(keys):
        home = _store(key)
        found = await address(router.routers[home], SCOPE, "counter", key)
        assert found is not None
        assert router.shard_map.store_of(bucket_of(found.execution_id)) == home
        for other in {0, 1, 2} - {home}:
            assert await address(router.routers[other], SCOPE, "counter", key) is None
        assert await _datamodel(router, key) == {
            "total": number,
            "got": 0,
            "refused": 0,
            "why": None,
        }
    per_store = [sum(1 for key in keys if _store(key) == n) for n in range(3)]
    assert [_count(store, "executions") for store in stores] == per_store
    assert all(count > 0 for count in per_store)
    again = await router.route_many(batch)
    assert {a.outcomes[0].outcome for a in again if isinstance(a, Routed)} == {"duplicate"}
    assert [_count(store, "executions") for store in stores] == per_store


@pytest.mark.asyncio
async def test_an_event_keyed_into_two_stores_is_delivered_in_both_in_binding_order(
    adapters: list[SqlAdapter],
) -> None:
    router = ShardedRouter(_config(adapters[0]), adapters)
    [here] = _keys_in(0, 1)
    [there] = _keys_in(2, 1)
    routed = await router.route(_add("m1", here, n=3, twin=there))
    assert [(o.binding_id, o.outcome) for o in routed.outcomes] == [
        ("adds", "created_and_delivered"),
        ("twins", "created_and_delivered"),
        ("passes", "no_match"),
    ]
    assert (await _datamodel(router, here) or {})["total"] == 3
    assert (await _datamodel(router, there) or {})["total"] == 3
    assert [row.outcome for row in await ledger(router.routers[0])] == ["created_and_delivered"]
    assert [row.outcome for row in await ledger(router.routers[2])] == ["created_and_delivered"]
    assert await ledger(router.routers[1]) == []
    again = await router.route(_add("m1", here, n=3, twin=there))
    assert [o.outcome for o in again.outcomes] == ["duplicate", "duplicate", "no_match"]


@pytest.mark.asyncio
async def test_a_send_to_another_stores_execution_hops_through_the_outbox_once(
    adapters: list[SqlAdapter],
) -> None:
    router = ShardedRouter(_config(adapters[0]), adapters)
    [sender] = _keys_in(0, 1)
    [receiver] = _keys_in(1, 1)
    await router.route(_add("m1", receiver))
    await router.route(_pass("m2", sender, to=receiver, n=5))
    assert (await _datamodel(router, receiver) or {})["got"] == 0  # not before the drain
    pending = await router.hop_drains()[0].pending(SHARD_HOP_QUEUE)
    assert len(pending) == 1
    assert await _drain(router) == 1
    assert (await _datamodel(router, receiver) or {})["got"] == 5
    # A second hand-over of the same hop (a worker lost after the delivery) is a duplicate.
    row = pending[0]
    again = await router.routers[1].deliver_send(
        scope=SCOPE,
        document="counter",
        key=receiver,
        create="never",
        event=row.event,
        message_id=row.key,
        sender=row.payload["execution_id"],
    )
    assert again is None
    assert (await _datamodel(router, receiver) or {})["got"] == 5
    rows = [(r.binding_id, r.outcome) for r in await ledger(router.routers[1])]
    assert rows.count(("execution", "delivered")) == 1
    assert rows.count(("execution", "duplicate")) == 1


@pytest.mark.asyncio
async def test_a_refused_hop_is_in_the_targets_ledger_and_reaches_the_sender(
    adapters: list[SqlAdapter],
) -> None:
    router = ShardedRouter(_config(adapters[0]), adapters)
    [sender] = _keys_in(0, 1)
    [ghost] = _keys_in(2, 1)
    await router.route(_pass("m1", sender, to=ghost))
    assert await _drain(router) == 2  # the hop, then the refusal's report back
    [refusal] = [r for r in await ledger(router.routers[2]) if r.outcome == "send_refused"]
    assert (refusal.reason or "").startswith("no_execution")
    seen = await _datamodel(router, sender)
    assert seen is not None
    assert seen["refused"] == 1
    assert "no live execution" in seen["why"]
    assert await _datamodel(router, ghost) is None
    # create="if_absent" makes the target in its own store instead.
    await router.route(_pass("m2", sender, to=ghost, n=4, create="if_absent"))
    await _drain(router)
    assert (await _datamodel(router, ghost) or {})["got"] == 4


@pytest.mark.asyncio
async def test_an_id_minted_outside_its_addresss_store_is_refused(
    adapters: list[SqlAdapter],
) -> None:
    router = ShardedRouter(
        _config(adapters[0], execution_id=lambda scope, document, key: f"plain-{key}"),
        adapters,
    )
    keys = [f"k{number}" for number in range(12)]
    answers = await router.route_many([_add(f"m{n}", key) for n, key in enumerate(keys)])
    for key, answer in zip(keys, answers, strict=True):
        placed = router.shard_map.store_of(bucket_of(f"plain-{key}")) == _store(key)
        if placed:
            assert isinstance(answer, Routed)
        else:
            assert isinstance(answer, Failed)
            assert isinstance(answer.error, MisplacedExecution)
    assert any(isinstance(answer, Failed) for answer in answers)


@pytest.mark.asyncio
async def test_a_store_away_fails_only_its_events_and_a_redelivery_completes_them(
    adapters: list[SqlAdapter], tmp_path: Path
) -> None:
    away = SqlAdapter(f"sqlite:///{tmp_path / 'missing' / 'store.db'}")
    try:
        broken = ShardedRouter(_config(adapters[0]), [adapters[0], adapters[1], away])
        keys = [f"k{number}" for number in range(18)]
        batch = [_add(f"m{n}", key, twin=keys[-1 - n]) for n, key in enumerate(keys)]
        answers = await broken.route_many(batch)
    finally:
        await away.close()
    for event, answer in zip(batch, answers, strict=True):
        touches_away = 2 in {_store(event.data["key"]), _store(event.data["twin"])}
        assert isinstance(answer, Failed) == touches_away
    assert any(isinstance(answer, Routed) for answer in answers)
    # The store is back: the same batch again completes what failed, and what
    # committed is a duplicate.
    router = ShardedRouter(_config(adapters[0]), adapters)
    again = await router.route_many(batch)
    assert all(isinstance(answer, Routed) for answer in again)
    for event, second in zip(batch, again, strict=True):
        assert isinstance(second, Routed)
        stores = [_store(event.data["key"]), _store(event.data["twin"])]
        for store, outcome in zip(stores, second.outcomes[:2], strict=True):
            # Stores 0 and 1 committed their parts the first time, whatever the answer.
            assert (outcome.outcome == "duplicate") == (store != 2)
    for key in keys:
        data = await _datamodel(router, key)
        assert (data or {}).get("total") == 2


# The same final datamodels over one store and three, for random streams.

_KEYS = ["a", "b", "c", "d", "e", "f"]

_commands = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.sampled_from(_KEYS), st.integers(1, 9), st.none()),
        st.tuples(
            st.just("pass"),
            st.sampled_from(_KEYS),
            st.integers(1, 9),
            st.tuples(st.sampled_from([*_KEYS, "ghost"]), st.sampled_from(["never", "if_absent"])),
        ),
    ),
    min_size=1,
    max_size=14,
)


def _events(commands: Sequence[tuple[Any, ...]]) -> list[InboundEvent]:
    events = []
    for number, (kind, key, n, more) in enumerate(commands):
        if kind == "add":
            events.append(_add(f"m{number}", key, n=n))
        else:
            events.append(_pass(f"m{number}", key, to=more[0], n=n, create=more[1]))
    return events


async def _final(stores: Sequence[SqlStore], events: list[InboundEvent], batched: bool) -> Any:
    for store in stores:
        store.empty()
    opened = [SqlAdapter(store.url, store.tables) for store in stores]
    try:
        router = ShardedRouter(_config(opened[0]), opened)
        if batched:
            answers = await router.route_many(events)
            assert all(isinstance(answer, Routed) for answer in answers)
            await _drain(router)
        else:
            for event in events:
                await router.route(event)
                await _drain(router)
        # Execution ids aside: each run mints its own.
        return {
            key: None
            if data is None
            else {**data, "why": re.sub(r"ex_\w+", "ex", str(data["why"]))}
            for key in [*_KEYS, "ghost"]
            for data in [await _datamodel(router, key)]
        }
    finally:
        for adapter in opened:
            await adapter.close()


def _without_ids(data: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """``data`` with the execution ids its refusal message names blotted out."""
    if data is None:
        return None
    return {**data, "why": re.sub(r"ex_\w+", "ex", str(data["why"]))}


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(commands=_commands)
def test_random_streams_end_with_the_same_datamodels_over_one_store_and_three(
    sqlite_store: SqlStore,
    sqlite_shards: list[SqlStore],  # noqa: F811 - the fixture
    commands: list[tuple[Any, ...]],
) -> None:
    events = _events(commands)
    one = asyncio.run(_final([sqlite_store], events, batched=False))
    three = asyncio.run(_final(sqlite_shards, events, batched=False))
    assert three == one
    # A batch over three stores: its passes are handed over after it commits, so a
    # pass may find a target that a later event of the batch created; the same
    # executions exist, with the same totals.
    batched = asyncio.run(_final(sqlite_shards, events, batched=True))
    for key in _KEYS:
        assert (batched[key] is None) == (one[key] is None)
        if one[key] is not None:
            assert batched[key]["total"] == one[key]["total"]


@pytest.mark.asyncio
async def test_a_hop_to_a_store_away_waits_and_is_delivered_once_it_is_back(
    adapters: list[SqlAdapter], tmp_path: Path
) -> None:
    [sender] = _keys_in(0, 1)
    [receiver] = _keys_in(2, 1)
    router = ShardedRouter(_config(adapters[0]), adapters)
    await router.route(_add("m1", receiver))
    await router.route(_pass("m2", sender, to=receiver, n=6))
    away = SqlAdapter(f"sqlite:///{tmp_path / 'missing' / 'store.db'}")
    try:
        broken = ShardedRouter(_config(adapters[0]), [adapters[0], adapters[1], away])
        [drain] = broken.hop_drains()[:1]
        report = await drain.drain_once()
        assert (report.claimed, report.failed, report.dead) == (1, 1, 0)
        [row] = await drain.pending(SHARD_HOP_QUEUE)
        assert row.attempts == 1
        assert row.last_error is not None
    finally:
        await away.close()
    assert (await _datamodel(router, receiver) or {})["got"] == 0
    later = row.next_attempt_at
    report = await router.hop_drains()[0].drain_once(later)
    assert (report.claimed, report.sent) == (1, 1)
    assert (await _datamodel(router, receiver) or {})["got"] == 6


@pytest.mark.asyncio
async def test_a_refusals_report_waits_for_the_senders_store_and_is_heard_once(
    adapters: list[SqlAdapter], tmp_path: Path
) -> None:
    [sender] = _keys_in(0, 1)
    [ghost] = _keys_in(2, 1)
    router = ShardedRouter(_config(adapters[0]), adapters)
    await router.route(_pass("m1", sender, to=ghost))
    hop = await router.hop_drains()[0].drain_once()
    assert (hop.claimed, hop.sent) == (1, 1)
    # The refusal and its report committed together in the target's store.
    [report] = await router.hop_drains()[2].pending(SHARD_REFUSAL_QUEUE)
    assert report.event.name == "error.communication"
    assert report.event.sendid == "p"
    away = SqlAdapter(f"sqlite:///{tmp_path / 'missing' / 'store.db'}")
    try:
        broken = ShardedRouter(_config(adapters[2]), [away, adapters[1], adapters[2]])
        failed = await broken.hop_drains()[2].drain_once()
        assert (failed.claimed, failed.failed, failed.dead) == (1, 1, 0)
    finally:
        await away.close()
    assert (await _datamodel(router, sender) or {})["refused"] == 0
    [waiting] = await router.hop_drains()[2].pending(SHARD_REFUSAL_QUEUE)
    told = await router.hop_drains()[2].drain_once(waiting.next_attempt_at)
    assert (told.claimed, told.sent) == (1, 1)
    assert (await _datamodel(router, sender) or {})["refused"] == 1
    assert await _drain(router) == 0
    assert (await _datamodel(router, sender) or {})["refused"] == 1
