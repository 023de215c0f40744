"""The inbound-events table and its partition leases, on both databases: dense
positions per partition that commit in order, a source that resumes after its
committed position, leases split fairly among live members and taken over when one
dies, commits fenced by the lease, and a consumer routing the table end to end."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from datetime import timedelta

import pytest
import sqlalchemy as sa
from tests.fronts.test_consumer import Flaky, hit, router_of, until
from tests.router.conftest import Clock, RouterDb
from tests.router.test_table_options import uuid_database  # noqa: F401 - a fixture

from statifier.fronts.consumer import StreamConsumer
from statifier.fronts.leases import PartitionLeases
from statifier.fronts.source import Malformed
from statifier.fronts.table_source import ByKey, TableSource, append_events
from statifier.persistence.sql import SqlAdapter
from statifier.router import ConfigError, ledger
from statifier.sql import TableOptions, migrations

PARTITIONS = ["0", "1", "2", "3"]


class Recorder:
    """A rebalance listener that records what it hears."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, list[str]]] = []

    async def assigned(self, partitions: Collection[str]) -> None:
        self.heard.append(("assigned", sorted(partitions)))

    async def revoked(self, partitions: Collection[str]) -> None:
        self.heard.append(("revoked", sorted(partitions)))


def leases_of(router_db: RouterDb, owner: str, ttl: float = 10.0) -> PartitionLeases:
    return PartitionLeases(
        router_db.adapter,
        group="g",
        partitions=PARTITIONS,
        owner=owner,
        ttl=ttl,
        clock=router_db.clock,
    )


@pytest.mark.asyncio
async def test_appends_take_dense_positions_per_partition_in_order(router_db: RouterDb) -> None:
    events = [hit(f"m{n}", f"k{n}") for n in range(5)]
    placed = await append_events(
        router_db.adapter,
        events,
        partition=lambda e: "odd" if e.message_id in {"m1", "m3"} else "even",
    )
    assert placed == [("even", 1), ("odd", 1), ("even", 2), ("odd", 2), ("even", 3)]
    more = await append_events(router_db.adapter, [hit("m5", "k5")], partition="odd")
    assert more == [("odd", 3)]


@pytest.mark.asyncio
async def test_concurrent_appends_never_share_or_skip_a_position(router_db: RouterDb) -> None:
    async def one(n: int) -> list[tuple[str, int]]:
        return await append_events(router_db.adapter, [hit(f"m{n}", "k")], partition="p")

    placed = await asyncio.gather(*(one(n) for n in range(12)))
    assert sorted(position for [(_, position)] in placed) == list(range(1, 13))


@pytest.mark.asyncio
async def test_an_append_on_a_callers_transaction_rolls_back_with_it(
    router_db: RouterDb,
) -> None:
    async def failing() -> None:
        async with router_db.adapter.transaction() as tx:
            await append_events(router_db.adapter, [hit("m1", "k")], partition="p", tx=tx)
            raise RuntimeError("the caller's work failed")

    with pytest.raises(RuntimeError, match="the caller's work failed"):
        await failing()
    async with router_db.adapter.transaction() as tx:
        assert await append_events(router_db.adapter, [hit("m2", "k")], partition="p", tx=tx) == [
            ("p", 1)
        ]


@pytest.mark.asyncio
async def test_data_that_is_not_json_and_blank_partitions_are_refused(
    router_db: RouterDb,
) -> None:
    event = hit("m1", "k")
    odd = type(event)(scope="s", source="x", message_id="m1", data={"when": object()})
    with pytest.raises(ValueError, match="not JSON"):
        await append_events(router_db.adapter, [odd], partition="p")
    with pytest.raises(ValueError, match="non-empty"):
        await append_events(router_db.adapter, [event], partition=lambda e: "")


@pytest.mark.asyncio
async def test_by_key_keeps_one_keys_events_in_one_partition(router_db: RouterDb) -> None:
    router = router_of(router_db)
    choose = ByKey(router, PARTITIONS)
    chosen = {key: {await choose(hit(f"{key}/{n}", key)) for n in range(5)} for key in "abcdefgh"}
    assert all(len(partitions) == 1 for partitions in chosen.values())
    assert len(set().union(*chosen.values())) > 1  # the keys spread over the partitions
    with pytest.raises(ConfigError):
        ByKey(router, [])


@pytest.mark.asyncio
async def test_a_source_hands_rows_over_and_resumes_after_its_commit(
    router_db: RouterDb,
) -> None:
    adapter = router_db.adapter
    await append_events(adapter, [hit(f"m{n}", "k") for n in range(1, 6)], partition="0")
    first = TableSource(adapter, group="g", partitions=["0"], owner="a")
    heard = Recorder()
    await first.start(heard)
    assert heard.heard == [("assigned", ["0"])]
    messages = await first.fetch(3, wait=0.1)
    assert [(m.partition, m.position) for m in messages] == [("0", 1), ("0", 2), ("0", 3)]
    assert [m.event.message_id for m in messages if not isinstance(m.event, Malformed)] == [
        "m1",
        "m2",
        "m3",
    ]
    assert b'"message_id": "m1"' in messages[0].raw
    await first.commit({"0": 2})
    await first.commit({"0": 1})  # a position never moves back
    assert await first.committed() == {"0": 2}
    await first.close()

    again = TableSource(adapter, group="g", partitions=["0"], owner="b")
    await again.start(Recorder())
    assert [m.position for m in await again.fetch(10, wait=0.1)] == [3, 4, 5]
    assert await again.fetch(10, wait=0.05) == []
    other_group = TableSource(adapter, group="h", partitions=["0"], owner="c")
    await other_group.start(Recorder())
    assert len(await other_group.fetch(10, wait=0.1)) == 5  # positions are per group
    await again.close()
    await other_group.close()


@pytest.mark.asyncio
async def test_a_row_that_is_no_event_is_handed_over_malformed(router_db: RouterDb) -> None:
    table = router_db.store.tables.inbound_events
    engine = sa.create_engine(migrations.sync_url(router_db.store.url))
    try:
        with engine.begin() as connection:
            connection.execute(
                table.insert().values(
                    partition="0",
                    position=1,
                    scope="",
                    source="x",
                    message_id="m1",
                    data={},
                    appended_at=router_db.clock(),
                )
            )
    finally:
        engine.dispose()
    source = TableSource(router_db.adapter, group="g", partitions=["0"])
    await source.start(Recorder())
    [message] = await source.fetch(10, wait=0.1)
    assert isinstance(message.event, Malformed)
    assert "scope" in message.event.reason
    await source.close()


@pytest.mark.asyncio
async def test_leases_are_split_fairly_among_live_members(router_db: RouterDb) -> None:
    a, b, c = (leases_of(router_db, owner) for owner in "abc")
    assert (await a.claim()).gained == ("0", "1", "2", "3")
    joined = await b.claim()
    assert joined.gained == ()  # nothing is free: b waits for a to give some up
    shrunk = await a.claim()
    assert shrunk.surplus == ("2", "3")
    await a.release(shrunk.surplus)
    assert a.held == {"0", "1"}
    assert (await b.claim()).gained == ("2", "3")
    await c.claim()  # three members: a share is two, nobody holds more
    assert ((await a.claim()).surplus, (await b.claim()).surplus) == ((), ())
    assert (await c.claim()).held == ()
    await b.leave()  # b's partitions are free at once
    assert (await c.claim()).gained == ("2", "3")
    assert (await a.claim()).held == ("0", "1")


@pytest.mark.asyncio
async def test_a_dead_members_leases_are_taken_once_they_expire(router_db: RouterDb) -> None:
    clock: Clock = router_db.clock
    a, b = leases_of(router_db, "a", ttl=10), leases_of(router_db, "b", ttl=10)
    await a.claim()
    clock.advance(timedelta(seconds=5))
    assert (await b.claim()).gained == ()  # a is alive, and holds all four
    clock.advance(timedelta(seconds=6))  # a stopped claiming 11 s ago
    assert (await b.claim()).gained == ("0", "1", "2", "3")
    back = await a.claim()
    assert back.lost == ("0", "1", "2", "3")
    assert back.held == ()


@pytest.mark.asyncio
async def test_an_expired_lease_nobody_took_is_still_its_holders(router_db: RouterDb) -> None:
    a = leases_of(router_db, "a", ttl=10)
    await a.claim()
    router_db.clock.advance(timedelta(seconds=60))
    change = await a.claim()
    assert (change.gained, change.lost, change.held) == ((), (), ("0", "1", "2", "3"))


@pytest.mark.asyncio
async def test_a_commit_after_the_lease_passed_on_stores_nothing(router_db: RouterDb) -> None:
    clock: Clock = router_db.clock
    adapter = router_db.adapter
    await append_events(adapter, [hit("m1", "k")], partition="0")
    slow = TableSource(adapter, group="g", partitions=["0"], owner="slow", ttl=10, clock=clock)
    await slow.start(Recorder())
    assert len(await slow.fetch(10, wait=0.1)) == 1
    clock.advance(timedelta(seconds=11))
    fast = leases_of(router_db, "fast")
    fast.partitions = ("0",)
    assert (await fast.claim()).gained == ("0",)
    await slow.commit({"0": 1})
    assert await slow.committed() == {}
    await slow.close()


def test_leases_refuse_bad_bounds(router_db: RouterDb) -> None:
    with pytest.raises(ConfigError):
        PartitionLeases(router_db.adapter, group="", partitions=["0"], owner="a")
    with pytest.raises(ConfigError):
        PartitionLeases(router_db.adapter, group="g", partitions=[], owner="a")
    with pytest.raises(ConfigError):
        PartitionLeases(router_db.adapter, group="g", partitions=["0"], owner="a", ttl=0)


@pytest.mark.asyncio
async def test_two_sources_of_a_group_share_the_partitions_as_they_come_and_go(
    router_db: RouterDb,
) -> None:
    adapter = router_db.adapter
    a = TableSource(adapter, group="g", partitions=PARTITIONS, owner="a", ttl=0.3)
    b = TableSource(adapter, group="g", partitions=PARTITIONS, owner="b", ttl=0.3)
    heard_a, heard_b = Recorder(), Recorder()
    await a.start(heard_a)
    await b.start(heard_b)
    assert heard_a.heard == [("assigned", PARTITIONS)]

    async def fetching() -> None:
        while True:
            await a.fetch(10, wait=0.02)
            await b.fetch(10, wait=0.02)

    task = asyncio.create_task(fetching())
    try:
        await until(lambda: ("assigned", ["2", "3"]) in heard_b.heard)
        assert ("revoked", ["2", "3"]) in heard_a.heard
        assert (a.leases.held, b.leases.held) == (frozenset({"0", "1"}), frozenset({"2", "3"}))
        await b.close()
        await until(lambda: len(a.leases.held) == 4)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await a.close()


@pytest.mark.asyncio
async def test_a_consumer_routes_the_table_and_commits_it(router_db: RouterDb) -> None:
    router = router_of(router_db, Flaky())
    adapter = router_db.adapter
    events = [hit(f"k{key}/{turn}", f"k{key}") for turn in range(5) for key in range(6)]
    await append_events(adapter, events, partition=ByKey(router, PARTITIONS))
    source = TableSource(adapter, group="routing", partitions=PARTITIONS)
    consumer = StreamConsumer(router, source, lanes=4, commit_interval=0.02, poll=0.05)
    running = asyncio.create_task(consumer.run())
    await until(lambda: consumer.counts.committed == len(events))
    await consumer.stop()
    await running
    assert consumer.counts.routed == 30
    assert len(await ledger(router)) == 30
    check = TableSource(adapter, group="routing", partitions=PARTITIONS)
    committed = await check.committed()
    assert sum(committed.values()) == 30


@pytest.mark.asyncio
async def test_the_table_source_runs_on_uuid_keys_in_a_prefixed_schema(
    uuid_database: tuple[str, TableOptions],  # noqa: F811
) -> None:
    url, options = uuid_database
    async with SqlAdapter(url, options) as adapter:
        await append_events(adapter, [hit("m1", "k"), hit("m2", "k")], partition="0")
        source = TableSource(adapter, group="g", partitions=["0"])
        await source.start(Recorder())
        assert [m.position for m in await source.fetch(10, wait=0.1)] == [1, 2]
        await source.commit({"0": 2})
        assert await source.committed() == {"0": 2}
        await source.close()


@pytest.mark.asyncio
async def test_a_claim_names_the_partitions_no_live_member_reads(router_db: RouterDb) -> None:
    clock: Clock = router_db.clock
    a, b = leases_of(router_db, "a", ttl=9), leases_of(router_db, "b", ttl=9)
    first = await a.claim()
    assert first.waiting == ()  # a reads all four
    clock.advance(timedelta(seconds=2))
    assert (await b.claim()).waiting == ()  # a's leases were renewed within a third
    clock.advance(timedelta(seconds=5))  # a missed two renewals: 2 s of 9 are left
    joined = await b.claim()
    assert (joined.held, joined.waiting) == ((), ("0", "1", "2", "3"))
    clock.advance(timedelta(seconds=3))  # expired, and a with them: b takes all four
    taken = await b.claim()
    assert (taken.gained, taken.waiting) == (("0", "1", "2", "3"), ())


@pytest.mark.asyncio
async def test_a_member_holding_nothing_while_partitions_wait_says_so(
    router_db: RouterDb,
) -> None:
    clock: Clock = router_db.clock
    adapter = router_db.adapter
    # A ttl of 0.9 s on the test's clock, renewed every 0.3 s of real time.
    gone = PartitionLeases(
        adapter, group="g", partitions=PARTITIONS, owner="gone", ttl=0.9, clock=clock
    )
    await gone.claim()  # then never renews: its process died
    late = TableSource(
        adapter, group="g", partitions=PARTITIONS, owner="late", ttl=0.9, clock=clock
    )
    await late.start(Recorder())
    try:
        assert late.leases.held == frozenset()
        assert late.trouble() is None  # gone's leases are fresh: it may well be alive
        clock.advance(timedelta(seconds=0.7))  # gone missed a renewal: 0.2 s are left
        await until(lambda: late.trouble() is not None)
        assert late.trouble() == "no partition while 4 wait"
        clock.advance(timedelta(seconds=0.3))  # expired: late takes them at its renewal
        await until(lambda: late.trouble() is None)
        await late.fetch(1, wait=0.01)  # the change is applied by a fetch
        assert late.leases.held == set(PARTITIONS)
    finally:
        await late.close()


@pytest.mark.asyncio
async def test_a_member_started_again_under_its_owner_takes_its_leases_back_at_once(
    router_db: RouterDb,
) -> None:
    adapter, clock = router_db.adapter, router_db.clock

    def source(owner: str) -> TableSource:
        return TableSource(
            adapter, group="g", partitions=PARTITIONS, owner=owner, ttl=30, clock=clock
        )

    crashed = source("host-1-a1b2")
    await crashed.start(Recorder())
    # The consumer failed and its source could not leave the group (the database was
    # away): its leases stay, with 30 s to run.
    assert crashed._renewer is not None  # stopped as a crash stops it
    crashed._renewer.cancel()
    again, stranger = source("host-1-a1b2"), source("host-2-c3d4")
    heard = Recorder()
    await again.start(heard)
    await stranger.start(Recorder())
    try:
        assert heard.heard == [("assigned", PARTITIONS)]
        assert again.leases.held == set(PARTITIONS)
        assert stranger.leases.held == frozenset()
    finally:
        await again.close()
        await stranger.close()
