"""The storage layer's statements of the lease, member, inbound-events and position
tables, on both databases: one statement text, bound by name, converted and run
alike; the dialect's lists of texts and advisory locks; and lock keys that stay what
they were."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from tests.router.conftest import RouterDb

from statifier.sql.dialect import lock_key
from statifier.sql.inbound import InboundTable, NewEvent
from statifier.sql.leases import LeaseRow, LeaseTable

START = datetime(2026, 12, 2, 12, tzinfo=UTC)


def test_lock_keys_are_the_ones_every_version_took() -> None:
    # A process of an older version takes these keys: a new one must take the same.
    assert lock_key("dedupe", "b1", "m1") == 664004188600131406
    assert lock_key("partition_leases", "t_partition_leases", "g") == 8856196390814842919


@pytest.mark.asyncio
async def test_the_lease_statements_read_alike_on_both_databases(router_db: RouterDb) -> None:
    adapter = router_db.adapter
    table = LeaseTable(adapter.tables, adapter.dialect)
    later = START + timedelta(seconds=10)
    async with adapter.transaction() as tx:
        driver = tx.driver
        await table.serialize(driver, "g")
        assert await table.alive(driver, "g", "a", START, later) == 1
        assert await table.alive(driver, "g", "b", START, START + timedelta(seconds=1)) == 2
        assert await table.alive(driver, "h", "c", START, later) == 1  # groups apart
        # b was seen until START + 1 s: gone once that has passed; a's mark moves on.
        assert await table.alive(driver, "g", "a", later, later + timedelta(seconds=10)) == 1

        odd = ["0", "it's", "a,b", '"q"']
        rows = await table.holdings(driver, "g", odd)
        assert sorted(rows, key=lambda r: r.partition) == sorted(
            (LeaseRow(p, None, None) for p in odd), key=lambda r: r.partition
        )
        await table.hold(driver, "g", "a", ["0", "it's"], later)
        await table.hold(driver, "g", "b", ['"q"'], later)
        held = {row.partition: row for row in await table.holdings(driver, "g", odd)}
        assert held["it's"] == LeaseRow("it's", "a", later)
        assert held["it's"].leased_until is not None
        assert held["it's"].leased_until.tzinfo is not None
        assert held["a,b"].owner is None

        await table.free(driver, "g", "a", ["it's", '"q"'])  # '"q"' is b's: left alone
        held = {row.partition: row for row in await table.holdings(driver, "g", odd)}
        assert (held["0"].owner, held["it's"].owner, held['"q"'].owner) == ("a", None, "b")
        assert await table.holdings(driver, "g", []) == []

        await table.forget(driver, "g", "a")
        assert await table.alive(driver, "g", "c", later, later) == 1


@pytest.mark.asyncio
async def test_the_inbound_statements_read_alike_on_both_databases(router_db: RouterDb) -> None:
    adapter = router_db.adapter
    table = InboundTable(adapter.tables, adapter.dialect)
    leases = LeaseTable(adapter.tables, adapter.dialect)
    events = [
        NewEvent("a", "s", "x", "m1", '{"n": 1}'),
        NewEvent("b", "s", "x", "m2", '{"n": 2}'),
        NewEvent("a", "s", "x", "m3", '{"n": 3}'),
    ]
    async with adapter.transaction() as tx:
        driver = tx.driver
        assert await table.append(driver, events, START) == [("a", 1), ("b", 1), ("a", 2)]
        assert await table.append(driver, events[:1], START) == [("a", 3)]
        rows = await table.read(driver, "a", 1, 10)
        assert [(row.position, row.message_id) for row in rows] == [(2, "m3"), (3, "m1")]
        assert rows[0].data in ('{"n": 3}', {"n": 3})
        assert [row.position for row in await table.read(driver, "a", 0, 1)] == [1]

        # No lease: nothing stored; under the lease, only ever forward.
        assert await table.commit(driver, "g", "o", {"a": 2, "b": 1}, START) == set()
        await leases.holdings(driver, "g", ["a", "b"])
        await leases.hold(driver, "g", "o", ["a"], START + timedelta(seconds=10))
        assert await table.commit(driver, "g", "o", {"a": 2, "b": 1}, START) == {"a"}
        assert await table.commit(driver, "g", "o", {"a": 1}, START) == {"a"}
        assert await table.positions(driver, "g", ["a", "b"]) == {"a": 2}
        assert await table.commit(driver, "g", "o", {"a": 3}, START) == {"a"}
        assert await table.positions(driver, "g", ["a", "b"]) == {"a": 3}
        assert await table.positions(driver, "h", ["a", "b"]) == {}
        assert await table.positions(driver, "g", []) == {}


@pytest.mark.asyncio
async def test_a_commit_waits_for_a_claim_of_its_group_to_end(router_db: RouterDb) -> None:
    # PostgreSQL: the claim's exclusive group lock against the commit's shared one;
    # SQLite: the single writer.
    adapter = router_db.adapter
    table = InboundTable(adapter.tables, adapter.dialect)
    leases = LeaseTable(adapter.tables, adapter.dialect)
    committed = asyncio.Event()

    async def commit() -> set[str]:
        async with adapter.transaction() as tx:
            stored = await table.commit(tx.driver, "g", "o", {"0": 1}, START)
        committed.set()
        return stored

    async with adapter.transaction() as tx:
        await leases.serialize(tx.driver, "g")
        await leases.holdings(tx.driver, "g", ["0"])
        waiting = asyncio.create_task(commit())
        await asyncio.sleep(0.2)
        assert not committed.is_set()
        await leases.hold(tx.driver, "g", "o", ["0"], START + timedelta(seconds=10))
    # The commit saw the lease the claim gave.
    assert await asyncio.wait_for(waiting, 5) == {"0"}
