"""The statements of the subscriptions table and of the location table on both
databases, with integer keys and with UUID keys made on the client: one statement text,
bound by name, converted and run alike; the address ids of a reap bound as one list; on
PostgreSQL a resolved location held against a rotation until the commit."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import pytest_asyncio
import sqlalchemy as sa
from tests.persistence.conftest import (  # noqa: F401 - a fixture
    FreshDatabase,
    drop_schema,
    fresh_database,
    unique_name,
)

from statifier.buckets import address_bucket
from statifier.persistence.sql import SqlAdapter
from statifier.sql import TableOptions, migrations
from statifier.sql.locations import LocatedRow, LocationTable, upgrade_locations
from statifier.sql.names import TableNames
from statifier.sql.subscriptions import SubscriptionRow, SubscriptionTable

START = datetime(2026, 12, 2, 12, tzinfo=UTC)
ENDED = datetime(2026, 12, 3, 8, tzinfo=UTC)


@pytest_asyncio.fixture(params=["integer", "uuid"])
async def keyed_adapter(
    request: pytest.FixtureRequest,
    fresh_database: FreshDatabase,  # noqa: F811 - the fixture
) -> AsyncIterator[SqlAdapter]:
    """An adapter over each backend freshly migrated, with integer or UUID keys, the
    (opt-in) location table included."""
    key_type = sa.Uuid if request.param == "uuid" else sa.BigInteger
    options = TableOptions(prefix="k_", schema=fresh_database.schema, key_type=key_type)
    migrations.upgrade(fresh_database.url, options)
    upgrade_locations(fresh_database.url, options)
    async with SqlAdapter(fresh_database.url, options) as adapter:
        yield adapter


async def address(
    adapter: SqlAdapter, driver: Any, execution_id: str, key: str, ended: datetime | None = None
) -> Any:
    """Insert an address row of ``execution_id`` under ``key`` (seen to end at
    ``ended``); its id as the driver reads it back (what the router hands on)."""
    dialect, new_key = adapter.dialect, adapter.tables.options.new_key
    columns = "scope, document, key, execution_id, inserted_at, terminal_seen_at, bucket"
    values: dict[str, Any] = {
        "bucket": address_bucket("s", "doc", key),
        "key": key,
        "execution_id": execution_id,
        "at": dialect.time(START),
        "ended": None if ended is None else dialect.time(ended),
    }
    if new_key:
        columns, values["id"] = f"id, {columns}", dialect.key(new_key())
    marks = (":id, " if new_key else "") + "'s', 'doc', :key, :execution_id, :at, :ended, :bucket"
    sql = dialect.statement(
        f"INSERT INTO {TableNames.of(adapter.tables).addresses} ({columns}) "
        f"VALUES ({marks}) RETURNING id"
    )
    row = await dialect.row(driver, sql, values)
    assert row is not None
    return row[0]


async def subscribe(
    table: SubscriptionTable, driver: Any, execution_id: str, invoke_id: str, at: datetime
) -> None:
    await table.insert(
        driver,
        binding_id="clicks",
        execution_id=execution_id,
        invoke_id=invoke_id,
        scope="s",
        key=f"key-{execution_id}",
        inserted_at=at,
    )


@pytest.mark.asyncio
async def test_the_subscriptions_statements_read_alike_on_both_databases(
    keyed_adapter: SqlAdapter,
) -> None:
    adapter = keyed_adapter
    table = SubscriptionTable(adapter.tables, adapter.dialect)
    async with adapter.transaction() as tx:
        driver = tx.driver
        await subscribe(table, driver, "ex_1", "inv_b", START + timedelta(seconds=1))
        await subscribe(table, driver, "ex_1", "inv_a", START)
        # The invocation again (a redriven step): the row written first stands.
        await subscribe(table, driver, "ex_1", "inv_a", START + timedelta(seconds=9))
        later = START + timedelta(seconds=1)
        assert await table.of_execution(driver, "ex_1") == [
            SubscriptionRow("clicks", "ex_1", "inv_a", "s", "key-ex_1", START),
            SubscriptionRow("clicks", "ex_1", "inv_b", "s", "key-ex_1", later),
        ]
        assert await table.of_execution(driver, "ex_404") == []

        assert await table.exists(driver, "clicks", "ex_1", "s", "key-ex_1")
        assert not await table.exists(driver, "clicks", "ex_1", "s", "key-ex_2")
        assert not await table.exists(driver, "views", "ex_1", "s", "key-ex_1")

        assert await table.delete(driver, "ex_1", "inv_b")
        assert not await table.delete(driver, "ex_1", "inv_b")
        assert [row.invoke_id for row in await table.of_execution(driver, "ex_1")] == ["inv_a"]


@pytest.mark.asyncio
async def test_the_subscriptions_of_reaped_addresses_go_by_their_ids_bound_as_one_list(
    keyed_adapter: SqlAdapter,
) -> None:
    adapter = keyed_adapter
    table = SubscriptionTable(adapter.tables, adapter.dialect)
    async with adapter.transaction() as tx:
        driver = tx.driver
        reaped = [
            await address(adapter, driver, "ex_1", "k1"),
            await address(adapter, driver, "ex_2", "k2"),
        ]
        await address(adapter, driver, "ex_3", "k3")
        for execution_id in ("ex_1", "ex_2", "ex_3"):
            await subscribe(table, driver, execution_id, "inv_a", START)
            await subscribe(table, driver, execution_id, "inv_b", START)

        assert await table.delete_addressed(driver, []) == 0
        assert await table.delete_addressed(driver, reaped) == 4
        assert await table.of_execution(driver, "ex_1") == []
        assert await table.of_execution(driver, "ex_2") == []
        assert len(await table.of_execution(driver, "ex_3")) == 2


async def locate(table: LocationTable, driver: Any, address_id: Any, execution_id: str) -> None:
    await table.insert(
        driver,
        address_id=address_id,
        execution_id=execution_id,
        token_hash=f"hash-{execution_id}",
        inserted_at=START,
    )


@pytest.mark.asyncio
async def test_the_location_statements_read_alike_on_both_databases(
    keyed_adapter: SqlAdapter,
) -> None:
    adapter = keyed_adapter
    table = LocationTable(adapter.tables, adapter.dialect)
    async with adapter.transaction() as tx:
        driver = tx.driver
        live = await address(adapter, driver, "ex_1", "k1")
        ended = await address(adapter, driver, "ex_2", "k2", ended=ENDED)
        reused = await address(adapter, driver, "ex_3", "k3")
        await locate(table, driver, live, "ex_1")
        await locate(table, driver, ended, "ex_2")
        # A location of another execution under the address row's id reaches nothing.
        await locate(table, driver, reused, "ex_gone")

        assert await table.resolve(driver, "hash-ex_1") == LocatedRow(
            live, "s", "doc", "k1", "ex_1", None
        )
        assert await table.resolve(driver, "hash-ex_2") == LocatedRow(
            ended, "s", "doc", "k2", "ex_2", ENDED
        )
        assert await table.resolve(driver, "hash-ex_gone") is None
        assert await table.resolve(driver, "hash-unknown") is None

        assert await table.token_hash(driver, "ex_1") == "hash-ex_1"
        assert await table.token_hash(driver, "ex_404") is None

        assert await table.rotate(driver, "ex_1", "hash-new")
        assert not await table.rotate(driver, "ex_404", "hash-none")
        assert await table.resolve(driver, "hash-ex_1") is None
        found = await table.resolve(driver, "hash-new")
        assert found is not None
        assert found.execution_id == "ex_1"
        assert await table.token_hash(driver, "ex_1") == "hash-new"


@pytest_asyncio.fixture
async def postgres_adapter(database_url: str) -> AsyncIterator[SqlAdapter]:
    """An adapter over a PostgreSQL schema of its own, the location table included."""
    options = TableOptions(prefix="k_", schema=unique_name("statifier_locations_"))
    assert options.schema is not None
    migrations.upgrade(database_url, options)
    upgrade_locations(database_url, options)
    try:
        async with SqlAdapter(database_url, options) as adapter:
            yield adapter
    finally:
        drop_schema(database_url, options.schema)


async def rotate_at_once(adapter: SqlAdapter, table: LocationTable) -> bool:
    """Rotate ``ex_1``'s location in a transaction of its own that waits for no lock."""
    async with adapter.transaction() as tx:
        await adapter.dialect.execute(tx.driver, "SET LOCAL lock_timeout = '100ms'")
        return await table.rotate(tx.driver, "ex_1", "hash-new")


@pytest.mark.asyncio
async def test_a_resolved_location_is_held_against_a_rotation_until_the_commit(
    postgres_adapter: SqlAdapter,
) -> None:
    adapter = postgres_adapter
    table = LocationTable(adapter.tables, adapter.dialect)
    async with adapter.transaction() as tx:
        await locate(table, tx.driver, await address(adapter, tx.driver, "ex_1", "k1"), "ex_1")
    async with adapter.transaction() as reading:
        assert await table.resolve(reading.driver, "hash-ex_1") is not None
        with pytest.raises(psycopg.errors.LockNotAvailable):
            await rotate_at_once(adapter, table)
    assert await rotate_at_once(adapter, table)
