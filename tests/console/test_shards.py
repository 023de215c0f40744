"""The console's reads over three stores (:mod:`statifier.console.shards`), on three
SQLite files and on three PostgreSQL schemas: merged pages walk every store's rows
once, newest first, whatever the page sizes and the ties between stores; one
execution is read in its bucket's store; counts and write times add up; a cursor of
one store, of another list or of another number of stores is refused."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pytest
import pytest_asyncio
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.persistence.conftest import (  # noqa: F401 - fixtures used through SQL_BACKENDS
    SQL_BACKENDS,
    SqlStore,
    postgresql_shards,
    sqlite_shards,
)

from statifier.buckets import address_bucket, bucket_of
from statifier.console.queries import (
    BadCursor,
    ConsoleQueries,
    ExecutionFilter,
    LedgerFilter,
    Page,
    encode_cursor,
)
from statifier.console.shards import ShardedQueries
from statifier.persistence import Status
from statifier.persistence.shards import ShardMap
from statifier.sql import migrations

pytestmark = pytest.mark.asyncio

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
_T = TypeVar("_T")


class Stores:
    """Three emptied stores of one backend, a writer engine on each, and the merged
    queries over them."""

    def __init__(self, stores: list[SqlStore]) -> None:
        self.stores = stores
        self.writers = [sa.create_engine(migrations.sync_url(store.url)) for store in stores]
        self.queries = ShardedQueries(
            [ConsoleQueries.open(store.url, store.tables) for store in stores]
        )

    def empty(self) -> None:
        for store in self.stores:
            store.empty()
            with self.writer(store).begin() as connection:
                connection.execute(
                    store.tables.charts.insert(),
                    [
                        {
                            "content_hash": "h-a",
                            "chart_blob": b"<scxml/>",
                            "name": "order",
                            "version": "1",
                            "saved_at": T0,
                        }
                    ],
                )

    def writer(self, store: SqlStore) -> sa.Engine:
        return self.writers[self.stores.index(store)]

    def insert(self, number: int, table: str, rows: Sequence[dict[str, Any]]) -> None:
        store = self.stores[number]
        if rows:
            with self.writers[number].begin() as connection:
                connection.execute(getattr(store.tables, table).insert(), list(rows))

    async def close(self) -> None:
        await self.queries.close()
        for writer in self.writers:
            writer.dispose()


@pytest_asyncio.fixture(params=SQL_BACKENDS)
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[Stores]:
    found: list[SqlStore] = request.getfixturevalue(f"{request.param}_shards")
    opened = Stores(found)
    opened.empty()
    try:
        yield opened
    finally:
        await opened.close()


def _execution(execution_id: str, created: int, **fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "execution_id": execution_id,
        "content_hash": "h-a",
        "status": "active",
        "position_blob": None,
        "metadata": {},
        "outcome_blob": None,
        "failure": None,
        "created_at": T0 + timedelta(seconds=created),
        "updated_at": T0 + timedelta(seconds=created),
        "ended_at": None,
        "error_count": 0,
        "last_error_at": None,
        "final_state": None,
        "bucket": bucket_of(execution_id),
    }
    row.update(fields)
    return row


async def _walk(
    read: Callable[[str | None, int], Awaitable[Page[_T]]], sizes: Sequence[int]
) -> list[_T]:
    """Every row of a list, page after page, each page's size the next of ``sizes``
    (round and round)."""
    seen: list[_T] = []
    cursor = None
    for turn in range(10_000):
        size = sizes[turn % len(sizes)]
        page = await read(cursor, size)
        assert len(page.rows) <= size
        seen.extend(page.rows)
        if page.next_cursor is None:
            return seen
        assert page.rows, "a page with a next one is never empty"
        cursor = page.next_cursor
    raise AssertionError("the pages never ended")


# Rows placed in stores, with times drawn from a few seconds so that ties within a
# store and between stores are common.
placed = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 5), st.booleans()), min_size=0, max_size=40
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(placed=placed, sizes=st.lists(st.integers(1, 9), min_size=1, max_size=4))
async def test_merged_pages_walk_every_store_once_newest_first(
    stores: Stores, placed: list[tuple[int, int, bool]], sizes: list[int]
) -> None:
    stores.empty()
    expected: list[tuple[datetime, int, str]] = []
    for index, (number, second, fails) in enumerate(placed):
        execution_id = f"ex-{index:03d}"
        status = "failed" if fails else "active"
        stores.insert(number, "executions", [_execution(execution_id, second, status=status)])
        expected.append((T0 + timedelta(seconds=second), number, execution_id))
    # Newest first; the same time by store, then by id descending as a store orders.
    expected.sort(key=lambda item: (-item[0].timestamp(), item[1], _descending(item[2])))
    queries = stores.queries

    def every(cursor: str | None, size: int) -> Awaitable[Page[Any]]:
        return queries.executions(cursor=cursor, size=size)

    walked = [row.id for row in await _walk(every, sizes)]
    assert walked == [execution_id for *_, execution_id in expected]
    failed = [item[2] for item in expected if placed[int(item[2][3:])][2]]

    def only_failed(cursor: str | None, size: int) -> Awaitable[Page[Any]]:
        return queries.failed(cursor=cursor, size=size)

    assert [row.id for row in await _walk(only_failed, sizes)] == failed
    assert await queries.count() == len(placed)
    assert await queries.count(among=[Status.FAILED]) == len(failed)


def _descending(text: str) -> tuple[int, ...]:
    return tuple(-ord(character) for character in text)


async def test_the_errors_list_and_the_failure_lists_merge_newest_first(stores: Stores) -> None:
    for number in range(3):
        rows = [
            _execution(
                f"ex-{number}-{i}",
                i,
                error_count=1,
                last_error_at=T0 + timedelta(minutes=i % 4),
            )
            for i in range(5)
        ]
        stores.insert(number, "executions", rows)
        stores.insert(
            number,
            "step_errors",
            [
                {
                    "execution_id": f"ex-{number}-{i}",
                    "seq": 1,
                    "via": "external",
                    "name": "error.execution",
                    "taken": False,
                    "error_blob": b"{}",
                    "recorded_at": T0 + timedelta(seconds=i * 3 + number),
                }
                for i in range(4)
            ],
        )
        stores.insert(
            number,
            "outbox",
            [
                {
                    "queue": "mail",
                    "key": f"k{number}-{i}",
                    "payload": {"event": "{}"},
                    "execution_id": f"ex-{number}-{i}",
                    "bucket": bucket_of(f"ex-{number}-{i}"),
                    "attempts": 3,
                    "next_attempt_at": T0,
                    "dead_at": T0 + timedelta(seconds=i % 2),
                    "last_error": "refused",
                    "inserted_at": T0,
                }
                for i in range(3)
            ],
        )
        stores.insert(
            number,
            "consumer_dead_letters",
            [
                {
                    "source": "orders",
                    "partition": str(number),
                    "position": i,
                    "message_id": f"m{number}-{i}",
                    "reason": "malformed",
                    "raw": b"x",
                    "dead_at": T0 + timedelta(seconds=i),
                }
                for i in range(2)
            ],
        )
    queries = stores.queries

    def erring(cursor: str | None, size: int) -> Awaitable[Page[Any]]:
        return queries.executions(ExecutionFilter(errors=True), cursor=cursor, size=size)

    walked = await _walk(erring, [2, 3])
    assert len(walked) == 15
    assert len({row.id for row in walked}) == 15
    moments = [row.last_error_at for row in walked]
    assert moments == sorted(moments, reverse=True)

    def errors(cursor: str | None, size: int) -> Awaitable[Page[Any]]:
        return queries.chart_errors(cursor=cursor, size=size)

    recorded = [row.error.recorded_at for row in await _walk(errors, [5])]
    assert recorded == sorted(
        (T0 + timedelta(seconds=i * 3 + n) for i in range(4) for n in range(3)), reverse=True
    )

    def outbox(cursor: str | None, size: int) -> Awaitable[Page[Any]]:
        return queries.outbox_dead_letters(cursor=cursor, size=size)

    keys = [row.key for row in await _walk(outbox, [4])]
    # The newest time first; the same time by store, then newest row first.
    assert keys == ["k0-1", "k1-1", "k2-1", "k0-2", "k0-0", "k1-2", "k1-0", "k2-2", "k2-0"]

    def letters(cursor: str | None, size: int) -> Awaitable[Page[Any]]:
        return queries.consumer_dead_letters(cursor=cursor, size=size)

    partitions = [(row.partition, row.position) for row in await _walk(letters, [1])]
    assert partitions == [("0", 1), ("1", 1), ("2", 1), ("0", 0), ("1", 0), ("2", 0)]
    fingerprint = await queries.fingerprint()
    assert fingerprint.errors == T0 + timedelta(seconds=11)
    assert fingerprint.consumer_dead == T0 + timedelta(seconds=1)


async def test_the_ledger_pages_and_counts_merge_over_the_stores(stores: Stores) -> None:
    expected: list[tuple[datetime, int, int, str]] = []
    for number in range(3):
        rows = []
        for i in range(7):
            at = T0 + timedelta(seconds=i % 3)  # ties within and between stores
            message_id = f"m{number}-{i}"
            rows.append(
                {
                    "binding_id": "b1" if i % 2 else "b2",
                    "message_id": message_id,
                    "scope": "eu",
                    "source": "shop",
                    "outcome": "delivered" if i % 3 else "duplicate",
                    "reason": None,
                    "document": "order",
                    "key": f"k{i}",
                    "execution_id": f"ex-{i}",
                    "inserted_at": at,
                    "bucket": address_bucket("eu", "order", f"k{i}"),
                }
            )
            expected.append((at, number, i, message_id))
        stores.insert(number, "routing_ledger", rows)
    # Newest first; the same time by store, then newest row (the last inserted) first.
    expected.sort(key=lambda item: (-item[0].timestamp(), item[1], -item[2]))
    queries = stores.queries

    def every(cursor: str | None, size: int) -> Awaitable[Page[Any]]:
        return queries.ledger(cursor=cursor, size=size)

    for sizes in ([1], [4], [2, 5, 3], [100]):
        walked = [row.message_id for row in await _walk(every, sizes)]
        assert walked == [message_id for *_, message_id in expected], sizes

    def duplicates(cursor: str | None, size: int) -> Awaitable[Page[Any]]:
        return queries.ledger(LedgerFilter(outcome="duplicate"), cursor=cursor, size=size)

    found = [row.message_id for row in await _walk(duplicates, [2])]
    assert sorted(found) == sorted(f"m{n}-{i}" for n in range(3) for i in (0, 3, 6))
    counts = await queries.ledger_counts(T0, T0 + timedelta(seconds=3), timedelta(seconds=3))
    totals = {(count.binding_id, count.outcome): count.count for count in counts}
    assert totals == {
        ("b1", "delivered"): 6,
        ("b1", "duplicate"): 3,
        ("b2", "delivered"): 6,
        ("b2", "duplicate"): 6,
    }


async def test_one_execution_is_read_in_its_buckets_store(stores: Stores) -> None:
    shard_map = ShardMap.even(3)
    ids: dict[int, str] = {}
    candidate = 0
    while len(ids) < 3:  # an id of each store
        execution_id = f"order-{candidate}"
        ids.setdefault(shard_map.store_of(bucket_of(execution_id)), execution_id)
        candidate += 1
    for number, execution_id in ids.items():
        stores.insert(number, "executions", [_execution(execution_id, number)])
        stores.insert(
            number,
            "addresses",
            [
                {
                    "scope": "shop",
                    "document": f"doc{number}",
                    "key": "k-1",
                    "execution_id": execution_id,
                    "inserted_at": T0 + timedelta(seconds=-number),
                    "bucket": address_bucket("shop", f"doc{number}", "k-1"),
                }
            ],
        )
    queries = stores.queries
    for number, execution_id in ids.items():
        assert queries.store_of(execution_id) is queries.stores[number]
        detail = await queries.execution(execution_id)
        assert detail is not None
        assert detail.record.id == execution_id
        assert await queries.execution_fingerprint(execution_id) is not None
    assert await queries.execution("order-none") is None
    addresses = await queries.addresses("k-1")
    assert [address.document for address in addresses] == ["doc2", "doc1", "doc0"]
    assert [address.execution_id for address in addresses] == [ids[2], ids[1], ids[0]]


async def test_cursors_of_another_list_or_store_count_are_refused(stores: Stores) -> None:
    for number in range(3):
        stores.insert(number, "executions", [_execution(f"ex-{number}-{i}", i) for i in range(3)])
    queries = stores.queries
    page = await queries.executions(size=2)
    assert page.next_cursor is not None
    one_store = encode_cursor("executions", T0, "ex-0-1")
    for cursor in ("", "garbage", one_store, "eyJ4IjoxfQ"):
        with pytest.raises(BadCursor):
            await queries.executions(cursor=cursor)
    with pytest.raises(BadCursor):  # the executions list's cursor on the errors list
        await queries.executions(ExecutionFilter(errors=True), cursor=page.next_cursor)
    two = ShardedQueries(queries.stores[:2])
    with pytest.raises(BadCursor):
        await two.executions(cursor=page.next_cursor)
    with pytest.raises(ValueError, match="1 to"):
        await queries.executions(size=0)
    with pytest.raises(ValueError, match="ranges"):
        ShardedQueries(queries.stores, ShardMap.even(2))
    with pytest.raises(ValueError, match="at least one"):
        ShardedQueries([])
