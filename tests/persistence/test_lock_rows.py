"""What a lock keeps apart, the same for PostgreSQL's advisory locks and for locks as rows
of the ``locks`` table (``TableOptions(locks="rows")``): an exclusive lock excludes
every other taker, shared locks share, a try never waits, a batch's keys are taken in
one order, and the reaper deletes only the rows no one holds and no timer names."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
import pytest
import pytest_asyncio
import sqlalchemy as sa
from tests.persistence.conftest import SqlStore, drop_schema, unique_name

from statifier.buckets import bucket_of
from statifier.sql import TableOptions, migrations
from statifier.sql.dialect import execution_lock_key, lock_key
from statifier.sql.locks import MODE_KEYS, Locks, LocksMismatch, locks_of
from statifier.sql.names import TableNames
from statifier.sql.postgres import POSTGRES, SET_LOCK_TIMEOUT, lock_timeout

pytestmark = pytest.mark.asyncio

T = TypeVar("T")

SHORT = 0.2
"""Seconds a taker that must wait is given before its wait is cut short."""


@pytest.fixture(params=("postgresql", "postgresql_rows"))
def store(request: pytest.FixtureRequest) -> SqlStore:
    found: SqlStore = request.getfixturevalue(f"{request.param}_store")
    found.empty()
    return found


@pytest.fixture
def locks(store: SqlStore) -> Locks:
    made = locks_of(store.tables, POSTGRES)
    assert made is not None
    assert made.rows is (store.tables.options.locks == "rows")
    return made


@pytest_asyncio.fixture
async def connections(store: SqlStore) -> AsyncIterator[list[psycopg.AsyncConnection[Any]]]:
    url = migrations.sync_url(store.url).set(drivername="postgresql").render_as_string(False)
    opened = [await psycopg.AsyncConnection.connect(url) for _ in range(3)]
    try:
        yield opened
    finally:
        for connection in opened:
            await connection.close()


async def bounded(connection: psycopg.AsyncConnection[Any], work: Awaitable[T]) -> T | None:
    """``work`` run in ``connection``'s open transaction with a short lock wait: its
    result, or ``None`` where the wait was cut short (the transaction is rolled back)."""
    await POSTGRES.execute(connection, SET_LOCK_TIMEOUT, {"t": lock_timeout(SHORT)})
    try:
        return await work
    except psycopg.Error as error:
        if not POSTGRES.lock_not_granted(error):
            raise
        await connection.rollback()
        return None


async def take(locks: Locks, connection: psycopg.AsyncConnection[Any], *keys: int) -> bool:
    await POSTGRES.execute(connection, locks.take, locks.values(keys))
    return True


async def share(locks: Locks, connection: psycopg.AsyncConnection[Any], key: int) -> bool:
    await locks.take_shared(POSTGRES, connection, key)
    return True


async def tried(locks: Locks, connection: psycopg.AsyncConnection[Any], key: int) -> bool:
    row = await POSTGRES.row(connection, locks.try_one, {"key": key})
    return row is not None and bool(row[0])


async def test_an_exclusive_lock_excludes_every_other_taker(
    locks: Locks, connections: list[psycopg.AsyncConnection[Any]]
) -> None:
    first, second, _ = connections
    key = lock_key("test", "one")
    assert await take(locks, first, key)  # the first time: its row is made, as rows
    assert await bounded(second, take(locks, second, key)) is None
    assert not await tried(locks, second, key)
    await second.rollback()
    assert await bounded(second, share(locks, second, key)) is None
    await first.commit()
    assert await take(locks, second, key)  # free again, its row there now
    assert await bounded(first, take(locks, first, key)) is None
    await second.rollback()
    assert await tried(locks, first, key)
    await first.rollback()


async def test_shared_locks_share_and_keep_the_exclusive_out(
    locks: Locks, connections: list[psycopg.AsyncConnection[Any]]
) -> None:
    first, second, third = connections
    key = lock_key("test", "shared")
    await take(locks, third, key)  # as rows: the row's first insert is exclusive
    await third.commit()
    await locks.take_shared(POSTGRES, first, key)
    await locks.take_shared(POSTGRES, second, key)
    assert await bounded(third, take(locks, third, key)) is None
    await first.commit()
    assert await bounded(third, take(locks, third, key)) is None
    await second.commit()
    assert await take(locks, third, key)
    await third.commit()


async def test_a_try_never_waits_and_a_take_waits_for_the_holder(
    locks: Locks, connections: list[psycopg.AsyncConnection[Any]]
) -> None:
    first, second, _ = connections
    key = lock_key("test", "wait")
    if locks.rows:
        # No row yet: a try is not granted, and a take makes the row.
        assert not await tried(locks, first, key)
    await take(locks, first, key)
    waiting = asyncio.create_task(take(locks, second, key))
    await asyncio.sleep(SHORT)
    assert not waiting.done()
    await first.commit()
    assert await asyncio.wait_for(waiting, 5)
    await second.commit()
    assert await tried(locks, first, key)
    await first.commit()


async def test_batches_in_opposite_orders_do_not_deadlock(
    locks: Locks, connections: list[psycopg.AsyncConnection[Any]]
) -> None:
    first, second, _ = connections
    keys = [lock_key("test", "batch", str(n)) for n in range(20)]
    for _ in range(5):
        # Taken in one order whatever order they are given in: one transaction takes
        # them all while the other waits at its first key (a deadlock would fail one).
        one = asyncio.create_task(take(locks, first, *keys))
        other = asyncio.create_task(take(locks, second, *reversed(keys)))
        done, waiting = await asyncio.wait({one, other}, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1
        assert done.pop().result()
        await asyncio.sleep(SHORT)
        (late,) = waiting
        assert not late.done()
        await (first if one.done() else second).commit()
        assert await asyncio.wait_for(late, 5)
        await first.commit()
        await second.commit()


async def test_a_claim_tries_each_key_once_and_is_granted_missing_rows(
    store: SqlStore, locks: Locks, connections: list[psycopg.AsyncConnection[Any]]
) -> None:
    first, second, _ = connections
    held, free, fresh = (lock_key("test", "claim", name) for name in ("held", "free", "fresh"))
    await take(locks, first, held, free)
    await first.commit()  # both rows there (as rows), neither held
    await take(locks, second, held)
    query = f"WITH {locks.tried('SELECT unnest(CAST(:keys AS bigint[]))', 'granted')} "
    rows = await POSTGRES.rows(
        first,
        POSTGRES.statement(f"{query}SELECT key FROM granted ORDER BY key"),
        {"keys": [held, free, fresh]},
    )
    assert {row[0] for row in rows} == {free, fresh}
    # What the claim was granted, it holds: the other transaction cannot take it.
    await second.rollback()
    assert await bounded(second, take(locks, second, fresh)) is None
    assert await bounded(second, take(locks, second, free)) is None
    await first.commit()
    assert await take(locks, second, held, free, fresh)
    await second.commit()


async def test_the_reaper_deletes_only_rows_no_one_holds_and_no_timer_names(
    store: SqlStore, locks: Locks, connections: list[psycopg.AsyncConnection[Any]]
) -> None:
    first, second, _ = connections
    keys = [lock_key("test", "reap", str(n)) for n in range(7)]
    timed = execution_lock_key("ex_with_a_timer")
    await take(locks, first, *keys, timed)
    await first.commit()
    names = TableNames.of(store.tables)
    engine = sa.create_engine(migrations.sync_url(store.url))
    try:
        with engine.begin() as connection:
            connection.execute(
                store.tables.timers.insert(),
                {
                    "execution_id": "ex_with_a_timer",
                    "send_id": "s",
                    "dedup_key": "d",
                    "lock_key": timed,
                    "bucket": bucket_of("ex_with_a_timer"),
                    "kind": "event",
                    "due_at": datetime.now(UTC),
                    "step_position": 0,
                    "payload": {},
                    "inserted_at": datetime.now(UTC),
                },
            )
    finally:
        engine.dispose()
    await take(locks, second, keys[3])  # held while the reaper runs
    reaped, after, pages = 0, None, 0
    while True:
        deleted, after = await locks.reap(POSTGRES, first, 3, after)
        reaped, pages = reaped + deleted, pages + 1
        if after is None:
            break
    await first.commit()
    await second.commit()
    left = await POSTGRES.rows(first, POSTGRES.statement(f"SELECT key FROM {names.locks}"))
    await first.commit()
    if not locks.rows:
        assert (reaped, left) == (0, [])
        return
    assert reaped == 6
    assert pages == 3  # 8 rows, 3 a page
    assert sorted(row[0] for row in left) == sorted([keys[3], timed])


async def test_lock_rows_on_tables_whose_keys_the_client_makes(database_url: str) -> None:
    # UUID keys without a default are made by the client on every other insert; a lock
    # row inserted from an array has no parameter for one, and is given one in SQL.
    schema = unique_name("statifier_uuid_locks_")
    options = TableOptions(schema=schema, key_type=sa.Uuid, locks="rows")
    migrations.upgrade(database_url, options)
    try:
        locks = locks_of(options.define(), POSTGRES)
        assert locks is not None
        url = migrations.sync_url(database_url).set(drivername="postgresql")
        async with await psycopg.AsyncConnection.connect(url.render_as_string(False)) as first:
            await take(locks, first, 3, 1, 2)
            await POSTGRES.execute(first, locks.take_one, {"key": 9})
            await share(locks, first, 10)
            query = f"WITH {locks.tried('SELECT unnest(CAST(:keys AS bigint[]))', 'g')} "
            granted = await POSTGRES.rows(
                first, POSTGRES.statement(f"{query}SELECT key FROM g"), {"keys": [1, 11]}
            )
            assert sorted(row[0] for row in granted) == [1, 11]
            await first.commit()
            table = TableNames.of(options.define()).locks
            kept = await POSTGRES.rows(first, POSTGRES.statement(f"SELECT id, key FROM {table}"))
            assert sorted(key for _, key in kept) == [1, 2, 3, 9, 10, 11]
            assert all(isinstance(made, uuid.UUID) for made, _ in kept)
    finally:
        assert options.schema is not None
        drop_schema(database_url, options.schema)


async def test_processes_opening_the_tables_the_other_way_are_refused(database_url: str) -> None:
    # The first process to open the tables says which way they lock; a process of the
    # other way is refused at its start, before it takes a lock that would not exclude.
    schema = unique_name("statifier_lock_mode_")
    rows = TableOptions(schema=schema, locks="rows")
    advisory = TableOptions(schema=schema)
    try:
        migrations.prepare(database_url, rows, migrate=True)
        migrations.prepare(database_url, rows, migrate=False)
        with pytest.raises(LocksMismatch) as refused:
            migrations.prepare(database_url, advisory, migrate=False)
        assert str(refused.value).startswith(
            'the tables\' locks are "rows" (processes opened them so), not "advisory"'
        )
        with pytest.raises(LocksMismatch):
            migrations.prepare(database_url, advisory, migrate=True)
        engine = sa.create_engine(migrations.sync_url(database_url))
        table = f"{schema}.statifier_locks"
        try:
            with engine.begin() as connection:
                connection.execute(sa.text(f"DELETE FROM {table}"))  # stopped, switched
            migrations.prepare(database_url, advisory, migrate=False)
            with pytest.raises(LocksMismatch, match='locks are "advisory"'):
                migrations.prepare(database_url, rows, migrate=False)
        finally:
            engine.dispose()
    finally:
        drop_schema(database_url, schema)


async def test_the_reaper_keeps_the_rows_that_say_how_the_tables_lock(
    database_url: str,
) -> None:
    schema = unique_name("statifier_lock_mode_")
    options = TableOptions(schema=schema, locks="rows")
    migrations.prepare(database_url, options, migrate=True)
    try:
        locks = locks_of(options.define(), POSTGRES)
        assert locks is not None
        url = migrations.sync_url(database_url).set(drivername="postgresql")
        async with await psycopg.AsyncConnection.connect(url.render_as_string(False)) as one:
            await take(locks, one, 5)
            await one.commit()
            assert await locks.reap(POSTGRES, one, 100, None) == (1, None)
            await one.commit()
            left = await POSTGRES.rows(one, f"SELECT key FROM {schema}.statifier_locks")
        assert [row[0] for row in left] == [MODE_KEYS["rows"]]
    finally:
        drop_schema(database_url, schema)
