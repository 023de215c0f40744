"""The router's statements in the storage layer (:mod:`statifier.sql.routing`) on both
databases: one statement text each, bound by name, converted and run alike; and, on
PostgreSQL, the locks a delivery takes with a bounded wait."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from tests.persistence.conftest import SqlStore

from statifier.buckets import address_bucket, bucket_of
from statifier.persistence.sql import SqlAdapter
from statifier.sql.names import TableNames
from statifier.sql.routing import (
    AddressRow,
    LedgerRow,
    ReapRow,
    RoutingSession,
    RoutingStatements,
)

START = datetime(2026, 12, 2, 12, tzinfo=UTC)
HOUR = timedelta(hours=1)


def _ledger_row(message_id: str, execution_id: str | None, at: datetime) -> LedgerRow:
    return LedgerRow(
        "clicks",
        message_id=message_id,
        scope="s",
        source="ad_events",
        outcome="delivered",
        reason=None,
        document="doc",
        key="k",
        execution_id=execution_id,
        inserted_at=at,
    )


@pytest.mark.asyncio
async def test_the_dedupe_claims_read_alike_on_both_databases(sql_adapter: SqlAdapter) -> None:
    statements = RoutingStatements(sql_adapter.tables, sql_adapter.dialect)
    async with sql_adapter.transaction() as tx:
        sql = RoutingSession(statements, tx.driver)
        assert await sql.claim("clicks", "m1", START, START + HOUR, 7)
        assert not await sql.claim("clicks", "m1", START, START + HOUR, 7)  # a live claim
        assert await sql.claim("views", "m1", START, START + HOUR, 7)  # another binding's
        # An expired claim is taken over, until the new expiry, in the new bucket.
        assert await sql.claim("clicks", "m1", START + HOUR, START + 3 * HOUR, 900)
        assert not await sql.claim("clicks", "m1", START + 2 * HOUR, START + 4 * HOUR, 7)

        assert await sql.reap_dedupe(START + HOUR) == 0  # expired before now only
        assert await sql.reap_dedupe(START + HOUR + timedelta(microseconds=1)) == 1
        assert await sql.claim("views", "m1", START + 2 * HOUR, START + 3 * HOUR, 7)

        # A range deletes the expired claims of its buckets alone.
        later = START + 5 * HOUR
        assert await sql.reap_dedupe(later, (0, 900)) == 1  # views/m1, in bucket 7
        assert await sql.reap_dedupe(later, (901, 1024)) == 0
        assert await sql.reap_dedupe(later, (900, 901)) == 1  # clicks/m1, taken over

        # A batch's claims, each in its own bucket, in one statement.
        asked = [("clicks", "m2", later + HOUR, 3), ("clicks", "m3", later + HOUR, 500)]
        assert await sql.claim_many(asked, later) == {("clicks", "m2"), ("clicks", "m3")}
        assert await sql.claim_many(asked, later) == set()  # live claims: duplicates
        after = later + 2 * HOUR
        assert await sql.reap_dedupe(after, (400, 1024)) == 1
        assert await sql.reap_dedupe(after, (0, 400)) == 1

        # A page deletes at most its limit, of every bucket or of a range.
        asked = [("clicks", f"p{n}", after + HOUR, n) for n in range(5)]
        assert len(await sql.claim_many(asked, after)) == 5
        gone = after + 2 * HOUR
        assert await sql.reap_dedupe(gone, (0, 2), limit=5) == 2  # buckets 0 and 1
        assert await sql.reap_dedupe(gone, limit=2) == 2
        assert await sql.reap_dedupe(gone, (0, 1024), limit=2) == 1
        assert await sql.reap_dedupe(gone) == 0


@pytest.mark.asyncio
async def test_the_address_statements_read_alike_on_both_databases(
    sql_adapter: SqlAdapter,
) -> None:
    statements = RoutingStatements(sql_adapter.tables, sql_adapter.dialect)
    address = ("s", "doc", "k")
    async with sql_adapter.transaction() as tx:
        sql = RoutingSession(statements, tx.driver)
        assert await sql.claim_and_find("clicks", "m1", START, START + HOUR, None, 1) == (
            True,
            None,
        )
        assert await sql.claim_and_find("clicks", "m2", START, START + HOUR, address, 1) == (
            True,
            None,
        )
        first = await sql.insert_address(*address, "x1", START)
        assert first is not None
        assert await sql.insert_address(*address, "x2", START) is None  # the key has one
        unstamped = AddressRow(first, execution_id="x1", terminal_seen_at=None)
        assert await sql.claim_and_find("clicks", "m3", START, START + HOUR, address, 1) == (
            True,
            unstamped,
        )
        fresh, _ = await sql.claim_and_find("clicks", "m3", START, START + HOUR, address, 1)
        assert not fresh  # a duplicate; its address may go unread
        assert await sql.find_address(*address) == unstamped
        assert await sql.find_address("s", "doc", "other") is None

        seen = START + timedelta(minutes=1)
        await sql.stamp([first], seen)
        await sql.stamp([first], seen + HOUR)  # the first sighting stays
        stamped = await sql.find_address(*address)
        assert stamped == AddressRow(first, execution_id="x1", terminal_seen_at=seen)
        assert stamped.terminal_seen_at is not None
        assert stamped.terminal_seen_at.utcoffset() == timedelta(0)

        second = await sql.insert_address("s", "doc", "k2", "x2", START + timedelta(seconds=1))
        assert await sql.named_by("s", "doc") == "x2"  # the newest
        assert await sql.named_by("s", "nothing") is None
        assert await sql.address_of("x1") == address
        assert await sql.address_of("x9") is None
        assert await sql.count_addresses(["x1", "x2", "x9"]) == 2

        # No execution row: the reaper reads no status.
        b1, b2 = address_bucket(*address), address_bucket("s", "doc", "k2")
        assert await sql.reap_page(None, 1) == [
            ReapRow(first, document="doc", terminal_seen_at=seen, status=None, bucket=b1)
        ]
        assert await sql.reap_page(first, 10) == [
            ReapRow(second, document="doc", terminal_seen_at=None, status=None, bucket=b2)
        ]
        assert await sql.reap_page(second, 10) == []
        # A range pages by (bucket, id): each address in its own bucket's range alone.
        assert [r.id for r in await sql.reap_page(None, 10, (b1, b1 + 1))] == [first]
        assert [r.id for r in await sql.reap_page(None, 10, (b2, b2 + 1))] == [second]
        low, high = sorted([(b1, first), (b2, second)])
        both = (low[0], high[0] + 1)
        assert [r.id for r in await sql.reap_page(None, 1, both)] == [low[1]]
        assert [r.id for r in await sql.reap_page(low, 10, both)] == [high[1]]
        assert await sql.reap_page(high, 10, both) == []
        await sql.delete_addresses([first, second])
        assert await sql.count_addresses(["x1", "x2"]) == 0


@pytest.mark.asyncio
async def test_the_ledger_statements_read_alike_on_both_databases(
    sql_adapter: SqlAdapter,
) -> None:
    statements = RoutingStatements(sql_adapter.tables, sql_adapter.dialect)
    rows = [
        _ledger_row("m1", "x1", START),
        _ledger_row("m2", None, START + timedelta(seconds=1)),
        _ledger_row("m3", "x1", START + timedelta(seconds=2)),
    ]
    async with sql_adapter.transaction() as tx:
        sql = RoutingSession(statements, tx.driver)
        await sql.record(rows[0])
        await sql.record_many([])
        await sql.record_many(rows[1:])
        assert await sql.ledger(None) == rows
        assert await sql.ledger("x1") == [rows[0], rows[2]]
        assert await sql.ledger("x9") == []
        assert all(row.inserted_at.utcoffset() == timedelta(0) for row in rows)


@pytest.mark.asyncio
async def test_ledger_rows_carry_their_bucket_and_are_reaped_by_range_and_page(
    sql_adapter: SqlAdapter,
) -> None:
    statements = RoutingStatements(sql_adapter.tables, sql_adapter.dialect)
    dialect = sql_adapter.dialect
    ledger = TableNames.of(sql_adapter.tables).routing_ledger
    delivered = _ledger_row("m1", "x1", START)
    refused_send = replace(
        _ledger_row("m2", "order-17", START + HOUR),
        document=None,
        key="mailer",
        outcome="send_refused",
    )
    key_refused = replace(
        _ledger_row("m3", None, START + 2 * HOUR), key=None, outcome="key_refused"
    )
    expected = {
        "m1": address_bucket("s", "doc", "k"),
        "m2": bucket_of("order-17"),
        "m3": bucket_of("m3"),
    }
    assert len(set(expected.values())) == 3  # each rule gives a bucket of its own here
    read = dialect.statement(f"SELECT message_id, bucket FROM {ledger}")
    async with sql_adapter.transaction() as tx:
        sql = RoutingSession(statements, tx.driver)
        await sql.record(delivered)
        await sql.record_many([refused_send, key_refused])
        found = {m: int(b) for m, b in await dialect.rows(tx.driver, read, {})}
        assert found == expected
        # Before a time: the rows written earlier alone, of a range or of every bucket.
        low, high = sorted(expected.values())[:2]
        lowest = min(expected, key=expected.__getitem__)
        assert await sql.reap_ledger(START + 3 * HOUR, (high, 1024), limit=5) == 2
        assert await sql.ledger(None) == [
            row for row in (delivered, refused_send, key_refused) if row.message_id == lowest
        ]
        assert await sql.reap_ledger(START, (low, low + 1)) == 0  # none written before START
        assert await sql.reap_ledger(START + 3 * HOUR, (low + 1, 1024)) == 0
        assert await sql.reap_ledger(START + 3 * HOUR) == 1
        # A page deletes at most its limit, of every bucket or of a range.
        await sql.record_many([_ledger_row(f"p{i}", None, START) for i in range(5)])
        assert await sql.reap_ledger(START + HOUR, limit=2) == 2
        assert await sql.reap_ledger(START + HOUR, (0, 1024), limit=2) == 2
        assert await sql.reap_ledger(START + HOUR, limit=2) == 1
        assert await sql.ledger(None) == []


@pytest.mark.asyncio
async def test_locks_are_granted_at_once_where_the_writer_is_single_or_free(
    sql_adapter: SqlAdapter,
) -> None:
    statements = RoutingStatements(sql_adapter.tables, sql_adapter.dialect)
    async with sql_adapter.transaction() as tx:
        sql = RoutingSession(statements, tx.driver)
        assert await sql.lock([], 0.1)
        assert await sql.lock([-3, 7], None)
        assert await sql.lock([-3, 7], 0.1)  # held by this transaction already


class RolledBackError(Exception):
    """Ends a transaction that must not commit; its argument is what the lock said."""


async def _try_locks(adapter: SqlAdapter, statements: RoutingStatements, keys: list[int]) -> None:
    """Try ``keys`` for at most 50 ms in a transaction rolled back after: a lock not
    granted leaves the transaction aborted."""
    async with adapter.transaction() as tx:
        granted = await RoutingSession(statements, tx.driver).lock(keys, 0.05)
        raise RolledBackError(granted)


@pytest.mark.asyncio
async def test_a_lock_held_elsewhere_past_the_wait_is_not_granted(
    postgresql_store: SqlStore,
) -> None:
    postgresql_store.empty()
    adapter = SqlAdapter(postgresql_store.url, postgresql_store.tables)
    statements = RoutingStatements(adapter.tables, adapter.dialect)
    held, release = asyncio.Event(), asyncio.Event()

    async def holder() -> None:
        async with adapter.transaction() as tx:
            assert await RoutingSession(statements, tx.driver).lock([7], None)
            held.set()
            await release.wait()

    task = asyncio.create_task(holder())
    try:
        await held.wait()
        async with adapter.transaction() as tx:
            sql = RoutingSession(statements, tx.driver)
            assert await sql.lock([5], 0.05)  # a free key, and the setting put back
            setting = await adapter.dialect.row(tx.driver, "SELECT current_setting('lock_timeout')")
            assert setting == ("0",)
        started = time.monotonic()
        with pytest.raises(RolledBackError) as ended:
            await _try_locks(adapter, statements, [5, 7])
        assert ended.value.args == (False,)
        assert time.monotonic() - started < 5
        release.set()
        await task
        async with adapter.transaction() as tx:  # released with the holder's commit
            assert await RoutingSession(statements, tx.driver).lock([5, 7], 0.05)
    finally:
        release.set()
        await asyncio.gather(task, return_exceptions=True)
        await adapter.close()


@pytest.mark.asyncio
async def test_a_reaper_page_spares_a_claim_taken_over_while_it_waited(
    postgresql_store: SqlStore,
) -> None:
    # The page picks an expired claim by the snapshot of its subquery, then waits for
    # the row, which a redelivery is taking over (a live claim once it commits): the
    # delete must check the expiry again on the row it finally sees.
    postgresql_store.empty()
    adapter = SqlAdapter(postgresql_store.url, postgresql_store.tables)
    statements = RoutingStatements(adapter.tables, adapter.dialect)
    try:
        async with adapter.transaction() as tx:
            assert await RoutingSession(statements, tx.driver).claim("b", "m", START, START, 3)
        later = START + HOUR
        taken, release = asyncio.Event(), asyncio.Event()

        async def redelivery() -> None:
            async with adapter.transaction() as tx:
                sql = RoutingSession(statements, tx.driver)
                assert await sql.claim("b", "m", later, later + HOUR, 3)  # taken over
                taken.set()
                await release.wait()

        async def reaper(limit: int | None) -> int:
            async with adapter.transaction() as tx:
                return await RoutingSession(statements, tx.driver).reap_dedupe(later, limit=limit)

        for limit in (None, 10):
            taken.clear()
            release.clear()
            claimant = asyncio.create_task(redelivery())
            await taken.wait()
            reaping = asyncio.create_task(reaper(limit))
            await asyncio.sleep(0.2)  # the reaper waits for the row
            assert not reaping.done()
            release.set()
            await claimant
            assert await reaping == 0, limit
            later += 2 * HOUR  # the claim expires again for the next turn
    finally:
        await adapter.close()
