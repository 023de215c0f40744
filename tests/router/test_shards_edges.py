"""Work spread over several stores where the stores disagree or one is away
(statifier.router.shards, statifier.persistence.shards). What holds: what a durable
parent's step needs (its child's chart, answer and siblings) is asked of its own
store alone, so two parents in two stores never wait on each other; a create needs
its own store alone; a chart saved in a block reaches every store before its retire;
an event failing in one store is answered with its own failure, not another store's
block; a shard map's ranges are pairs of whole numbers; a close finishes every
store; a fire is told its entry in every store; a refused hop's ledger row falls in
a bucket of the store that holds it. What does not yet, each a strict expected
failure named by its reason (decision 0116, last section): a cap counting every
store, a step's sends reaching another store in order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import sqlalchemy as sa
from tests.persistence.conftest import (  # noqa: F401 - fixtures
    SqlStore,
    postgresql_shards,
    sqlite_shards,
)
from tests.router.test_shards import SCOPE, _add, _config, _drain, _keys_in, _pass

from statifier.buckets import address_bucket, bucket_of
from statifier.chart import compile_chart
from statifier.console.shards import ShardedQueries
from statifier.core import Event
from statifier.ids import new_execution_id
from statifier.persistence import ExecutionRecord, Executions, Status, Storage
from statifier.persistence.driver import Driver
from statifier.persistence.executor import ignore_effects
from statifier.persistence.records import ChartRecord
from statifier.persistence.shards import ShardedAdapter, ShardMap
from statifier.persistence.sql import SqlAdapter
from statifier.router import (
    Binding,
    BlockedByEarlierFailure,
    Cap,
    CapPer,
    Create,
    Entry,
    Failed,
    InboundEvent,
    MisplacedExecution,
    RouterConfig,
    ShardedRouter,
    StaticResolver,
)
from statifier.router.queries import address, ledger
from statifier.router.reapers import reap_ledger
from statifier.sql import TableOptions, migrations
from statifier.sql.moves import holds_rows

THREE = ShardMap.even(3)

COUNTER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="on">
<datamodel><data id="n" expr="0"/></datamodel>
<state id="on"><transition event="add"><assign location="n" expr="n + 1"/></transition></state>
</scxml>"""

CHILD = (
    '<scxml initial="w"><state id="w"><transition event="ok" target="ok"/></state>'
    '<final id="ok"/></scxml>'
)
PARENT = f"""<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="idle">
<state id="idle"><transition event="go" target="calling"/></state>
<state id="calling">
  <invoke id="kid" type="scxml"><content>{CHILD}</content></invoke>
  <transition event="done.invoke.kid" target="answered"/>
</state>
<final id="answered"/>
</scxml>"""
"""A parent that starts a durable child on ``go`` and completes once it answers."""

AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
"""A fixed time for the rows the tests write by hand."""

BOUND = 10.0
"""Seconds two calls that take milliseconds alone get together before they count as
stuck."""


def _id_in(store: int, stem: str) -> str:
    """An execution id (not minted) whose bucket the ``store``-th of three holds."""
    return next(
        f"{stem}-{n}" for n in range(10_000) if THREE.store_of(bucket_of(f"{stem}-{n}")) == store
    )


@pytest_asyncio.fixture
async def opened(sqlite_shards: list[SqlStore]) -> AsyncIterator[list[SqlAdapter]]:  # noqa: F811
    """Three emptied SQLite files, opened."""
    for shard in sqlite_shards:
        shard.empty()
    adapters = [SqlAdapter(shard.url, shard.tables) for shard in sqlite_shards]
    try:
        yield adapters
    finally:
        for adapter in adapters:
            await adapter.close()


@pytest_asyncio.fixture
async def away(tmp_path: Path) -> AsyncIterator[SqlAdapter]:
    """A store whose database cannot be reached (its folder does not exist)."""
    adapter = SqlAdapter(f"sqlite:///{tmp_path / 'missing' / 'store.db'}")
    try:
        yield adapter
    finally:
        await adapter.close()


async def _within(seconds: float, *calls: Awaitable[Any]) -> list[Any]:
    """The calls' answers, run at once; fails the test if they are not all back
    within ``seconds``."""
    try:
        return await asyncio.wait_for(asyncio.gather(*calls), seconds)
    except TimeoutError:
        pytest.fail(f"the calls were not back within {seconds:g} s: they wait on each other")


# Durable executions over a ShardedAdapter: one execution's work is its store's.


@pytest.mark.asyncio
async def test_parents_in_two_stores_start_their_durable_children_at_once(
    opened: list[SqlAdapter],
) -> None:
    """Two parents of different stores each starting a durable child at the same time
    both go on: a child's start inside its parent's step waits for no other store's
    writer (on SQLite a store's block holds its writer to its end)."""
    driver = Driver(Storage(ShardedAdapter(opened)))
    parent = compile_chart(PARENT)
    first, second = _id_in(0, "parent"), _id_in(1, "parent")
    for execution_id in (first, second):
        await driver.create(execution_id, parent)
    stepped = await _within(
        BOUND, driver.send_event(first, Event("go")), driver.send_event(second, Event("go"))
    )
    assert [result.execution.status for result in stepped] == [Status.ACTIVE] * 2


@pytest.mark.asyncio
async def test_a_chart_saved_in_a_block_reaches_every_store_before_its_retire(
    opened: list[SqlAdapter],
) -> None:
    """A chart saved inside a store's block is saved in that store alone, is found by
    ``fetch_chart`` from outside any block, goes to another store when an execution
    is inserted there, and is in every store (tombstoned) once retired."""
    sharded = ShardedAdapter(opened)
    chart = ChartRecord("sha256:edge", source=b"<scxml/>", name="edge", version="1", saved_at=AT)
    inside = _id_in(1, "holder")
    async with sharded.exclusive(inside, None):
        await sharded.save_chart(chart)
    assert [await store.fetch_chart(chart.content_hash) is not None for store in opened] == [
        False,
        True,
        False,
    ]
    found = await sharded.fetch_chart(chart.content_hash)
    assert found is not None
    assert found.source == chart.source
    elsewhere = _id_in(2, "other")
    await sharded.insert_execution(
        ExecutionRecord(
            elsewhere,
            content_hash=chart.content_hash,
            status=Status.ACTIVE,
            position=b"",
            created_at=AT,
            updated_at=AT,
        )
    )
    assert await opened[2].fetch_chart(chart.content_hash) is not None
    await sharded.update_execution(
        ExecutionRecord(
            elsewhere,
            content_hash=chart.content_hash,
            status=Status.COMPLETED,
            position=b"",
            created_at=AT,
            updated_at=AT,
            ended_at=AT,
        )
    )
    await sharded.retire_chart(chart.content_hash, "test", AT)
    for store in opened:
        kept = await store.fetch_chart(chart.content_hash)
        assert kept is not None
        assert kept.retired_at is not None


@pytest.mark.asyncio
async def test_children_of_two_stores_answer_their_parents_at_once(
    opened: list[SqlAdapter],
) -> None:
    """Two durable children of different stores ending at the same time each answer
    their parent: delivering a child's answer under its parent's lock reads and marks
    the answer in the parent's store, not in every store (on SQLite a read of another
    store waits for that store's writer, which the other delivery holds)."""
    sharded = ShardedAdapter(opened)
    driver = Driver(Storage(sharded))
    parent = compile_chart(PARENT)
    first, second = _id_in(0, "parent"), _id_in(1, "parent")
    for execution_id in (first, second):
        await driver.create(execution_id, parent)
        await driver.send_event(execution_id, Event("go"))  # one at a time: both start
    await _within(
        BOUND,
        driver.send_event(f"{first}/kid", Event("ok")),
        driver.send_event(f"{second}/kid", Event("ok")),
    )
    for execution_id in (first, second):
        record = await sharded.fetch_execution(execution_id)
        assert record is not None
        assert record.status is Status.COMPLETED


@pytest.mark.asyncio
async def test_an_executions_chart_is_read_in_its_own_store_while_the_first_is_away(
    opened: list[SqlAdapter], away: SqlAdapter
) -> None:
    """A step of an execution whose chart this process has not compiled yet reads the
    chart in the execution's own store (every store holds it), so the first store
    being away stops its own executions alone, as the docs promise."""
    counter = compile_chart(COUNTER, name="counter")
    execution_id = _id_in(1, "order")
    await Executions(Storage(ShardedAdapter(opened)), executor=ignore_effects).create(
        execution_id, counter
    )
    broken = ShardedAdapter([away, opened[1], opened[2]])
    fresh = Executions(Storage(broken), executor=ignore_effects)  # nothing compiled yet
    stepped = await fresh.step(execution_id, None, Event("add"))
    assert stepped.execution.status is Status.ACTIVE


@pytest.mark.asyncio
async def test_an_execution_is_created_in_its_store_while_another_store_is_away(
    opened: list[SqlAdapter], away: SqlAdapter
) -> None:
    """Creating an execution whose chart its store holds already needs that store
    alone: another store being away does not stop it."""
    counter = compile_chart(COUNTER, name="counter")
    lifecycle = Executions(Storage(ShardedAdapter(opened)), executor=ignore_effects)
    await lifecycle.create(_id_in(1, "order"), counter)  # the chart is in every store
    broken = ShardedAdapter([opened[0], opened[1], away])
    created = await Executions(Storage(broken), executor=ignore_effects).create(
        _id_in(0, "order"), counter
    )
    assert created.execution.status is Status.ACTIVE


# The router over several stores.


@pytest.mark.asyncio
async def test_a_refused_hops_ledger_row_falls_in_a_bucket_of_the_store_that_holds_it(
    sqlite_shards: list[SqlStore],  # noqa: F811
    opened: list[SqlAdapter],
) -> None:
    """Every ledger row a refused hop writes in the target's store falls in that
    store's buckets: each store's reaper, over its own range, deletes every row past
    the time kept, and a store holds no row of the buckets a reshard from three stores
    to four would move into it (statifier reshard refuses a store that does)."""
    router = ShardedRouter(_config(opened[0]), opened)
    # A sender in store 1 among the buckets that store 2 takes over in four stores.
    sender = next(
        f"k{n}" for n in range(5_000) if 512 <= address_bucket(SCOPE, "counter", f"k{n}") < 682
    )
    [ghost] = _keys_in(2, 1)
    await router.route(_pass("m1", sender, to=ghost))
    assert await _drain(router) == 2  # the hop, then the refusal's report back
    outcomes = [row.outcome for row in await ledger(router.routers[2])]
    assert "send_refused" in outcomes
    engine = sa.create_engine(migrations.sync_url(sqlite_shards[2].url))
    try:
        with engine.connect() as connection:
            assert not holds_rows(connection, TableOptions(prefix="t_"), [(512, 682)])
    finally:
        engine.dispose()
    later = datetime.now(UTC) + timedelta(days=1)
    for number, store in enumerate(router.routers):
        await reap_ledger(store, later, buckets=router.shard_map.ranges[number])
    assert [await ledger(store) for store in router.routers] == [[], [], []]


@pytest.mark.asyncio
@pytest.mark.xfail(strict=True, reason="open: caps count each store alone (decision 0116)")
async def test_a_cap_over_a_document_holds_every_stores_creates_beyond_its_max(
    opened: list[SqlAdapter],
) -> None:
    """A cap of one active execution per document lets one create through over three
    stores as over one database; the others are held."""
    one = Cap(1, per=CapPer.DOCUMENT)
    router = ShardedRouter(_config(opened[0], caps={"counter": one}), opened)
    keys = [key for store in range(3) for key in _keys_in(store, 2)]
    outcomes = [
        (await router.route(_add(f"m{n}", key))).outcomes[0].outcome for n, key in enumerate(keys)
    ]
    assert outcomes.count("created_and_delivered") == 1, outcomes
    assert outcomes.count("buffered") == len(keys) - 1


@pytest.mark.asyncio
async def test_an_event_failing_in_one_store_is_not_answered_blocked_by_another(
    opened: list[SqlAdapter], away: SqlAdapter
) -> None:
    """An event whose part failed in one store on its own while another store's part
    was only blocked behind an earlier failure is answered with its own failure, not
    :class:`BlockedByEarlierFailure`: a consumer counts and logs the attempt (it lets
    a blocked event go uncounted)."""
    [misplaced] = [
        key
        for key in (f"k{n}" for n in range(5_000))
        if THREE.store_of(address_bucket(SCOPE, "counter", key)) == 0
        and THREE.store_of(bucket_of(f"plain-{key}")) != 0
    ][:1]
    [there] = _keys_in(2, 1)

    def mint(scope: str, document: str, key: str) -> str:
        return f"plain-{key}" if key == misplaced else new_execution_id(scope, document, key)

    router = ShardedRouter(_config(opened[0], execution_id=mint), [opened[0], opened[1], away])
    first, second = await router.route_many(
        [_add("m1", misplaced), _add("m2", misplaced, twin=there)]
    )
    assert isinstance(first, Failed)
    assert isinstance(first.error, MisplacedExecution)
    assert isinstance(second, Failed)
    assert not isinstance(second.error, BlockedByEarlierFailure), second.error


SENDER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="live">
<datamodel><data id="heard" expr="''"/></datamodel>
<state id="live">
  <transition event="both">
    <send type="test:sink" target="execution" event="first">
      <param name="document" expr="'pair'"/><param name="key" expr="_event.data.to"/>
    </send>
    <send type="test:sink" target="execution" event="second">
      <param name="document" expr="'pair'"/><param name="key" expr="_event.data.to"/>
    </send>
  </transition>
  <transition event="first"><assign location="heard" expr="heard + '1'"/></transition>
  <transition event="second"><assign location="heard" expr="heard + '2'"/></transition>
  <transition event="hello"/>
</state>
</scxml>"""
"""``both`` sends ``first`` then ``second`` to another execution, which notes what it
heard in order."""

PAIRS = [
    Binding(
        id=kind,
        source="cmd",
        match=f"event.kind == '{kind}'",
        key="event.key",
        document="pair",
        event=kind,
        data=("to",),
        create=Create.IF_ABSENT,
    )
    for kind in ("both", "hello")
]


@pytest_asyncio.fixture
async def served_pg(
    postgresql_shards: list[SqlStore],  # noqa: F811
) -> AsyncIterator[list[SqlAdapter]]:
    """Three emptied PostgreSQL schemas, opened."""
    for shard in postgresql_shards:
        shard.empty()
    adapters = [SqlAdapter(shard.url, shard.tables) for shard in postgresql_shards]
    try:
        yield adapters
    finally:
        for adapter in adapters:
            await adapter.close()


@pytest.mark.asyncio
@pytest.mark.xfail(
    strict=True, reason="open: a step's hops are delivered concurrently (decision 0116)"
)
async def test_a_steps_sends_to_an_execution_of_another_store_arrive_in_send_order(
    served_pg: list[SqlAdapter],
) -> None:
    """Two sends of one step to one execution of another store are heard there in the
    order they were sent, as on one database, where the receiver steps in the
    sender's transaction."""
    config = RouterConfig(
        served_pg[0],
        bindings=PAIRS,
        resolver=StaticResolver({"pair": compile_chart(SENDER)}),
        send_type="test:sink",
        timers_elsewhere=True,
    )
    router = ShardedRouter(config, served_pg)

    def keys_in(store: int) -> list[str]:
        found = (f"p{n}" for n in range(5_000))
        return [k for k in found if THREE.store_of(address_bucket(SCOPE, "pair", k)) == store][:20]

    def event(kind: str, key: str, to: str = "") -> InboundEvent:
        data = {"kind": kind, "key": key, "to": to}
        return InboundEvent(scope=SCOPE, source="cmd", message_id=f"{kind}/{key}", data=data)

    senders, receivers = keys_in(0), keys_in(1)
    for receiver in receivers:
        await router.route(event("hello", receiver))
    for sender, receiver in zip(senders, receivers, strict=True):
        await router.route(event("both", sender, receiver))
    assert await _drain(router) == 2 * len(senders)
    heard = []
    for receiver in receivers:
        found = await address(router.routers[1], SCOPE, "pair", receiver)
        assert found is not None
        async with router.routers[1].transaction() as unit:
            record = await unit.storage.fetch_execution(found.execution_id)
            machine = await unit.storage.machine(record.content_hash)
            heard.append(unit.storage.load(record, machine).datamodel["heard"])
    assert heard == ["12"] * len(receivers)


@pytest.mark.asyncio
async def test_a_fire_routed_in_a_unit_tells_every_stores_part_its_entry(
    opened: list[SqlAdapter],
) -> None:
    """``route_in`` (a schedule's fire) begins the deliveries of every store with the
    entry it was given, as on one database: a host's ``on_begin`` is told
    ``schedule`` whichever store the fire's key falls in."""
    told: list[Entry] = []

    async def on_begin(_tx: Any, _scope: str, entry: Entry) -> None:
        told.append(entry)

    router = ShardedRouter(_config(opened[0], on_begin=on_begin), opened)
    [here] = _keys_in(0, 1)
    [there] = _keys_in(1, 1)
    for number, key in enumerate((here, there)):
        async with router.routers[0].transaction() as unit:
            routed = await router.route_in(unit, _add(f"fire-{number}", key), Entry.SCHEDULE)
        assert routed.outcomes[0].outcome == "created_and_delivered"
    assert told == [Entry.SCHEDULE, Entry.SCHEDULE]


# Maps and closing.


@pytest.mark.parametrize(
    "ranges",
    [
        ((0, 511.5), (511.5, 1024)),
        ((0, 512, 700), (512, 1024)),
    ],
)
def test_a_map_whose_ranges_are_not_pairs_of_whole_numbers_is_refused_naming_the_range(
    ranges: Any,
) -> None:
    """A shard map's ranges are pairs of whole bucket numbers; anything else is a
    ValueError naming the range, not a map that places buckets by float bounds nor an
    unpacking error."""
    with pytest.raises(ValueError, match="range 0"):
        ShardMap(ranges)


class _Queries:
    """A store's console queries whose close is recorded, and raises when told to."""

    def __init__(self, closed: list[int], number: int, fails: bool) -> None:
        self.closed, self.number, self.fails = closed, number, fails

    async def close(self) -> None:
        self.closed.append(self.number)
        if self.fails:
            raise OSError(f"store {self.number} would not close")


@pytest.mark.asyncio
async def test_closing_the_consoles_reads_over_stores_closes_every_store_when_one_fails() -> None:
    """Closing :class:`ShardedQueries` closes every store's queries even when the close
    of one raises (then what it raised comes out after the others closed)."""
    closed: list[int] = []
    stores: list[Any] = [_Queries(closed, number, fails=number == 0) for number in range(3)]
    with pytest.raises(OSError, match="store 0"):
        await ShardedQueries(stores).close()
    assert closed == [0, 1, 2]
