"""The outbox table's statements, on both databases: one text each but for the claim,
and rows that read alike."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from statifier.persistence.sql import SqlAdapter
from statifier.sql.outbox import OutboxTable
from statifier.sql.postgres import POSTGRES
from statifier.sql.sqlite import SQLITE

START = datetime(2026, 12, 2, 12, tzinfo=UTC)
LATER = START + timedelta(seconds=30)


def test_a_key_reads_back_as_it_was_bound() -> None:
    key = uuid.uuid4()
    for dialect in (SQLITE, POSTGRES):
        assert dialect.read_key(dialect.key(key)) == key
        assert dialect.read_key(dialect.key(7)) == 7


async def _insert(
    table: OutboxTable, driver: object, queue: str, key: str, bucket: int = 0
) -> None:
    await table.insert(
        driver,
        queue=queue,
        key=key,
        payload=json.dumps({"event": "{}", "key": key}),
        execution_id="ex_1",
        bucket=bucket,
        now=START,
    )


@pytest.mark.asyncio
async def test_a_claim_leases_the_rows_of_its_range_of_buckets(sql_adapter: SqlAdapter) -> None:
    table = OutboxTable(sql_adapter.tables, sql_adapter.dialect)
    async with sql_adapter.transaction() as tx:
        for key, bucket in (("k1", 3), ("k2", 700), ("k3", 511), ("k4", 512), ("k5", 1023)):
            await _insert(table, tx.driver, "a", key, bucket)

    async def claimed(buckets: tuple[int, int], token: str) -> list[str]:
        async with sql_adapter.transaction() as tx:
            leased = await table.claim(
                tx.driver, ["a"], now=START, until=LATER, token=token, limit=10, buckets=buckets
            )
        return [row.key for row in leased]

    assert await claimed((0, 512), "low") == ["k1", "k3"]
    assert await claimed((600, 1024), "high") == ["k2", "k5"]
    assert await claimed((0, 1024), "rest") == ["k4"]  # the whole range: what is left
    assert await claimed((0, 1024), "none") == []


@pytest.mark.asyncio
async def test_the_outbox_statements_read_alike_on_both_databases(
    sql_adapter: SqlAdapter,
) -> None:
    table = OutboxTable(sql_adapter.tables, sql_adapter.dialect)
    async with sql_adapter.transaction() as tx:
        driver = tx.driver
        for queue, key in (("a", "k1"), ("a", "k2"), ("b", "k1"), ("a", "k1")):
            await _insert(table, driver, queue, key)  # ("a", "k1") twice: one row
        rows = await table.rows(driver)
        assert [(row.queue, row.key) for row in rows] == [("a", "k1"), ("a", "k2"), ("b", "k1")]
        first = rows[0]
        assert (first.attempts, first.lease, first.last_error) == (0, None, None)
        assert first.next_attempt_at == first.inserted_at == START
        assert first.payload in ({"event": "{}", "key": "k1"}, '{"event": "{}", "key": "k1"}')
        assert [row.key for row in await table.rows(driver, queue="b")] == ["k1"]

        early = START - timedelta(seconds=1)
        assert await table.claim(driver, ["a"], now=early, until=LATER, token="t0", limit=10) == []
        leased = await table.claim(driver, ["a"], now=START, until=LATER, token="t1", limit=1)
        assert [(row.queue, row.key, row.attempts, row.reclaimed) for row in leased] == [
            ("a", "k1", 0, False)
        ]
        assert leased[0].id == first.id
        # A held lease is not claimed again until it runs out; then it is reclaimed.
        again = await table.claim(driver, ["a"], now=START, until=LATER, token="t2", limit=10)
        assert [row.key for row in again] == ["k2"]
        lapsed = await table.claim(driver, ["a", "b"], now=LATER, until=LATER, token="t3", limit=10)
        assert [(row.queue, row.key, row.reclaimed) for row in lapsed] == [
            ("a", "k1", True),
            ("a", "k2", True),
            ("b", "k1", False),
        ]
        held = {row.key: row for row in await table.rows(driver, queue="a")}
        assert (held["k1"].lease, held["k1"].leased_until) == ("t3", LATER)

        assert not await table.mark_sent(driver, first.id, "t1", LATER)  # the lease moved on
        assert await table.mark_sent(driver, first.id, "t3", LATER)
        k2, b1 = lapsed[1].id, lapsed[2].id
        assert await table.mark_failed(
            driver, k2, "t3", error="Boom", next_at=LATER + timedelta(seconds=1), dead_at=None
        )
        assert await table.mark_failed(driver, b1, "t3", error="Gone", next_at=LATER, dead_at=LATER)
        assert [row.key for row in await table.rows(driver, state="sent")] == ["k1"]
        pending = await table.rows(driver, state="pending")
        assert [(row.key, row.attempts, row.last_error) for row in pending] == [("k2", 1, "Boom")]
        assert pending[0].next_attempt_at == LATER + timedelta(seconds=1)
        assert (pending[0].lease, pending[0].leased_until) == (None, None)
        dead = await table.rows(driver, state="dead")
        assert [(row.queue, row.dead_at) for row in dead] == [("b", LATER)]

        assert await table.retry_dead_key(driver, "k1", "a", LATER) == 0  # b's, not a's
        assert await table.retry_dead_id(driver, b1, None, LATER) == 1
        assert await table.rows(driver, state="dead") == []
        assert await table.delete_dead(driver, b1) == 0  # due again, not dead
        # Re-armed, the row is no lease's: a late mark changes nothing.
        assert not await table.mark_failed(driver, b1, "t3", error="x", next_at=LATER, dead_at=None)
        leased = await table.claim(driver, ["b"], now=LATER, until=LATER, token="t4", limit=10)
        assert await table.mark_failed(
            driver, leased[0].id, "t4", error="Gone", next_at=LATER, dead_at=LATER
        )
        assert await table.retry_dead_key(driver, "k1", None, LATER) == 1
        await table.mark_failed(driver, b1, "t4", error="x", next_at=LATER, dead_at=LATER)
        assert await table.delete_dead(driver, b1) == 0  # the lease ended: no mark, not dead
        leased = await table.claim(driver, ["b"], now=LATER, until=LATER, token="t5", limit=10)
        await table.mark_failed(driver, b1, "t5", error="x", next_at=LATER, dead_at=LATER)
        assert await table.delete_dead(driver, b1) == 1
        assert [row.key for row in await table.rows(driver)] == ["k1", "k2"]
