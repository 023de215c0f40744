"""The SQL target keeps the Target contract on PostgreSQL and on SQLite."""

from __future__ import annotations

import contextlib
import math
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa

from scriba import Delete, Event, Execute, Insert, Multi, Operation, ProjectionKey, Update
from scriba.sql.target import SchemaNotReadyError, SqlTarget
from scriba.target import ApplyFailed, DeadLetter, FailureKind, ResetCounts

if TYPE_CHECKING:
    from tests.scriba.conftest import SqlDatabase

SHOP = ProjectionKey("shop")
SHOP_V2 = ProjectionKey("shop", 2)
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def event(position: int, stream: str = "order-1", data: Any = None) -> Event:
    return Event(
        id=f"e{position}",
        stream_id=stream,
        type="OrderPlaced",
        data={"n": position} if data is None else data,
        position=position,
        occurred_at=T0 + timedelta(seconds=position),
    )


def orders_table(database: SqlDatabase) -> sa.Table:
    orders = sa.Table(
        "orders",
        database.metadata,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("amount", sa.Integer, sa.CheckConstraint("amount >= 0"), nullable=False),
    )
    orders.create(database.engine)
    return orders


def rows(database: SqlDatabase, table: sa.Table) -> list[tuple[Any, ...]]:
    with database.engine.connect() as connection:
        return [tuple(row) for row in connection.execute(sa.select(table).order_by(table.c[0]))]


def cursors(database: SqlDatabase, projection: ProjectionKey = SHOP) -> dict[str, int]:
    positions = database.tables.positions
    query = sa.select(positions.c.stream_id, positions.c.position).where(
        positions.c.projection_name == projection.name,
        positions.c.projection_version == projection.version,
    )
    with database.engine.connect() as connection:
        return {row.stream_id: row.position for row in connection.execute(query)}


def letter(position: int, kind: str = "error", data: Any = None, stream: str = "s") -> DeadLetter:
    return DeadLetter(event(position, stream, data), kind, f"failed at {position}", "trace")


@pytest.mark.asyncio
async def test_operations_apply_in_order_with_the_cursors(
    sql_database: SqlDatabase, sql_target: SqlTarget
) -> None:
    orders = orders_table(sql_database)
    await sql_target.open(SHOP)
    batch: list[tuple[Event, Operation]] = [
        (event(1), Insert(orders, {"id": 1, "status": "new", "amount": 5})),
        (event(2), Insert(orders, {"id": 2, "status": "new", "amount": 7})),
        (event(3), Update(orders, where={"id": 1}, values={"status": "paid"})),
        (event(4, "order-2"), Insert(orders, {"id": 3, "status": "new", "amount": 1})),
        (event(5, "order-2"), Delete(orders, where={"id": 2})),
        (
            event(6, "order-3"),
            Multi(
                (
                    Insert(orders, {"id": 4, "status": "new", "amount": 0}),
                    Execute(sa.update(orders).where(orders.c.id == 4).values(amount=9)),
                )
            ),
        ),
    ]
    await sql_target.apply_batch(SHOP, batch, {"order-1": 3, "order-2": 5, "order-3": 6}, [])
    assert rows(sql_database, orders) == [(1, "paid", 5), (3, "new", 1), (4, "new", 9)]
    assert cursors(sql_database) == {"order-1": 3, "order-2": 5, "order-3": 6}
    assert await sql_target.stream_position(SHOP, "order-2") == 5
    assert await sql_target.stream_position(SHOP, "nobody") is None
    assert await sql_target.stream_position(SHOP_V2, "order-2") is None


@pytest.mark.asyncio
async def test_the_greatest_position_wins(sql_database: SqlDatabase, sql_target: SqlTarget) -> None:
    await sql_target.apply_batch(SHOP, [], {"a": 10, "b": 3}, [])
    await sql_target.apply_batch(SHOP, [], {"a": 4, "b": 8}, [])
    await sql_target.apply_batch(SHOP, [], {"a": 10}, [])
    assert cursors(sql_database) == {"a": 10, "b": 8}


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("failing", "kind"),
    [
        ({"id": 1, "status": "dup", "amount": 1}, FailureKind.INTEGRITY),  # primary key
        ({"id": 9, "status": "neg", "amount": -1}, FailureKind.INTEGRITY),  # check
        ({"id": 9, "status": None, "amount": 1}, FailureKind.INTEGRITY),  # not null
    ],
)
async def test_a_failing_operation_rolls_back_everything(
    sql_database: SqlDatabase,
    sql_target: SqlTarget,
    failing: dict[str, Any],
    kind: FailureKind,
) -> None:
    orders = orders_table(sql_database)
    await sql_target.apply_batch(
        SHOP, [(event(1), Insert(orders, {"id": 1, "status": "new", "amount": 1}))], {"s": 1}, []
    )
    batch: list[tuple[Event, Operation]] = [
        (event(2), Insert(orders, {"id": 2, "status": "new", "amount": 1})),
        (event(3), Update(orders, where={"id": 1}, values={"status": "changed"})),
        (event(4), Insert(orders, failing)),
    ]
    with pytest.raises(ApplyFailed) as failed:
        await sql_target.apply_batch(SHOP, batch, {"s": 4, "t": 4}, [letter(3)])
    assert failed.value.kind is kind
    assert failed.value.cause is not None
    assert rows(sql_database, orders) == [(1, "new", 1)]
    assert cursors(sql_database) == {"s": 1}
    assert sql_database.count(sql_database.tables.dead_letters) == 0
    # The target is still usable after the rollback.
    await sql_target.apply_batch(SHOP, batch[:2], {"s": 3}, [])
    assert cursors(sql_database) == {"s": 3}


@pytest.mark.asyncio
async def test_a_missing_column_or_table_is_structural(
    sql_database: SqlDatabase, sql_target: SqlTarget
) -> None:
    orders_table(sql_database)
    # The code's idea of the table has a column the database lacks.
    newer = sa.Table(
        "orders",
        sa.MetaData(schema=sql_database.schema),
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("status", sa.Text),
        sa.Column("amount", sa.Integer),
        sa.Column("coupon", sa.Text),
    )
    missing = sa.Table(
        "nowhere", sa.MetaData(schema=sql_database.schema), sa.Column("id", sa.Integer)
    )
    for operation in (
        Insert(newer, {"id": 1, "status": "x", "amount": 1, "coupon": "c"}),
        Update(newer, where={"coupon": "c"}, values={"status": "y"}),
        Insert(missing, {"id": 1}),
        Insert(newer, {"id": 1, "status": "x", "amount": 1, "misspelt": 2}),
        Update(newer, where={"no_such": 1}, values={"status": "y"}),
    ):
        with pytest.raises(ApplyFailed) as failed:
            await sql_target.apply_batch(SHOP, [(event(1), operation)], {"s": 1}, [letter(1)])
        assert failed.value.kind is FailureKind.STRUCTURAL, operation
    assert cursors(sql_database) == {}
    assert sql_database.count(sql_database.tables.dead_letters) == 0


@pytest.mark.asyncio
async def test_a_value_the_column_cannot_take_is_integrity(
    sql_database: SqlDatabase, sql_target: SqlTarget
) -> None:
    # SQLAlchemy refuses it for SQLite, PostgreSQL refuses it itself (SQLSTATE 22007):
    # either way it is this event's data.
    days = sa.Table(
        "days",
        sql_database.metadata,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("day", sa.Date, nullable=False),
    )
    days.create(sql_database.engine)
    with pytest.raises(ApplyFailed) as failed:
        await sql_target.apply_batch(
            SHOP, [(event(1), Insert(days, {"id": 1, "day": "not a date"}))], {"s": 1}, []
        )
    assert failed.value.kind is FailureKind.INTEGRITY


@contextlib.contextmanager
def holding_the_positions_lock(database: SqlDatabase) -> Iterator[None]:
    """Another connection holds a lock every batch needs, until the block ends."""
    if database.dialect == "sqlite":
        holder = sqlite3.connect(database.url.removeprefix("sqlite:///"))
        holder.execute("begin immediate")
        try:
            yield
        finally:
            holder.rollback()
            holder.close()
        return
    engine = sa.create_engine(database.url)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql(
                f"lock table {database.schema}.scriba_positions in exclusive mode"
            )
            yield
    finally:
        engine.dispose()


@pytest.mark.asyncio
async def test_a_busy_database_is_transient(sql_database: SqlDatabase) -> None:
    if sql_database.dialect == "sqlite":
        target = SqlTarget(sql_database.url, engine_options={"connect_args": {"timeout": 0.05}})
        batch: list[tuple[Event, Operation]] = []
    else:
        target = sql_database.target()
        batch = [(event(1), Execute(sa.text("set local lock_timeout = '50ms'")))]
    try:
        with holding_the_positions_lock(sql_database), pytest.raises(ApplyFailed) as failed:
            await target.apply_batch(SHOP, batch, {"s": 1}, [])
        assert failed.value.kind is FailureKind.TRANSIENT
        await target.apply_batch(SHOP, batch, {"s": 1}, [])
        assert cursors(sql_database) == {"s": 1}
    finally:
        await target.close()


@pytest.mark.asyncio
async def test_a_lost_connection_is_transient_and_the_next_batch_reconnects(
    database_url: str,
) -> None:
    # PostgreSQL only: SQLite has no connection to lose.
    url = str(sa.make_url(database_url).set(drivername="postgresql+psycopg"))
    schema = "scriba_test_lost"
    admin = sa.create_engine(url)
    from scriba.sql import upgrade

    with admin.begin() as connection:
        connection.execute(sa.schema.DropSchema(schema, cascade=True, if_exists=True))
    upgrade(admin, schema=schema)
    name = f"scriba-lost-{id(admin)}"
    target = SqlTarget(
        url, schema=schema, engine_options={"connect_args": {"application_name": name}}
    )
    try:
        await target.apply_batch(SHOP, [], {"s": 1}, [])
        with admin.begin() as connection:
            killed = connection.execute(
                sa.text(
                    "select count(pg_terminate_backend(pid)) from pg_stat_activity "
                    "where application_name = :name"
                ),
                {"name": name},
            ).scalar_one()
        assert killed >= 1
        with pytest.raises(ApplyFailed) as failed:
            await target.apply_batch(SHOP, [], {"s": 2}, [])
        assert failed.value.kind is FailureKind.TRANSIENT
        await target.apply_batch(SHOP, [], {"s": 3}, [])
        assert await target.stream_position(SHOP, "s") == 3
    finally:
        await target.close()
        with admin.begin() as connection:
            connection.execute(sa.schema.DropSchema(schema, cascade=True, if_exists=True))
        admin.dispose()


@pytest.mark.asyncio
async def test_many_events_of_one_batch_on_the_same_keys(
    sql_database: SqlDatabase, sql_target: SqlTarget
) -> None:
    # The original's multi-key collision: a batch of many events writing the same
    # table and keys in one transaction must behave as the events did one by one.
    orders = orders_table(sql_database)
    batch: list[tuple[Event, Any]] = []
    position = 0
    for round_ in range(3):
        for key in (1, 2):
            stream = f"order-{key}"
            for operation in (
                Insert(orders, {"id": key, "status": "new", "amount": round_}),
                Update(orders, where={"id": key}, values={"status": f"r{round_}"}),
                Update(orders, where={"id": key, "status": f"r{round_}"}, values={"amount": 10}),
                Multi(
                    (
                        Delete(orders, where={"id": key}),
                        Insert(orders, {"id": key, "status": "again", "amount": round_}),
                    )
                ),
                Delete(orders, where={"id": key}),
            ):
                position += 1
                batch.append((event(position, stream), operation))
    batch.append(
        (event(position + 1, "order-1"), Insert(orders, {"id": 1, "status": "last", "amount": 1}))
    )
    # Inserts with different column sets back to back must not be merged wrongly.
    batch.append(
        (event(position + 2, "order-2"), Insert(orders, {"id": 2, "status": "x", "amount": 2}))
    )
    batch.append(
        (event(position + 3, "order-2"), Insert(orders, {"id": 3, "amount": 3, "status": "y"}))
    )
    advances = {"order-1": position + 1, "order-2": position + 3}
    await sql_target.apply_batch(SHOP, batch, advances, [])
    assert rows(sql_database, orders) == [(1, "last", 1), (2, "x", 2), (3, "y", 3)]
    assert cursors(sql_database) == advances


@pytest.mark.asyncio
async def test_dead_letters_commit_with_the_batch_and_read_back(
    sql_database: SqlDatabase, sql_target: SqlTarget
) -> None:
    class Opaque:
        def __repr__(self) -> str:
            return "<opaque>"

    letters = [
        letter(3, "error", {"id": 3, "items": (1, 2)}),
        letter(5, "exception", Opaque()),
        letter(7, "error", math.nan),
        letter(8, "integrity", {"text": "nul\x00inside", "bad": "\ud800"}),
    ]
    await sql_target.apply_batch(SHOP, [], {"s": 8}, letters)
    await sql_target.apply_batch(SHOP_V2, [], {}, [letter(1, "rejected")])
    stored = await sql_target.dead_letters(SHOP, 10)
    assert [letter.position for letter in stored] == [8, 7, 5, 3]
    assert [letter.event_data for letter in stored[1:]] == [
        "nan",
        "<opaque>",
        {"id": 3, "items": [1, 2]},
    ]
    assert isinstance(stored[0].event_data, str)  # stored as its repr
    newest = stored[0]
    assert newest.projection == SHOP
    assert newest.stream_id == "s"
    assert newest.event_type == "OrderPlaced"
    assert newest.error_kind == "integrity"
    assert newest.error_message == "failed at 8"
    assert newest.error_stacktrace == "trace"
    assert newest.occurred_at.tzinfo is UTC
    assert [letter.position for letter in await sql_target.dead_letters(SHOP, 2)] == [8, 7]
    assert await sql_target.dead_letters(ProjectionKey("other"), 10) == []

    stats = await sql_target.dead_letter_stats(SHOP)
    assert stats.total == 4
    assert stats.by_kind == {"error": 2, "exception": 1, "integrity": 1}
    assert (stats.first_position, stats.last_position) == (3, 8)
    empty = await sql_target.dead_letter_stats(ProjectionKey("other"))
    assert (empty.total, dict(empty.by_kind), empty.first_position) == (0, {}, None)
    with pytest.raises(ValueError, match="limit"):
        await sql_target.dead_letters(SHOP, -1)


@pytest.mark.asyncio
async def test_dead_letter_texts_are_bounded_and_storable(sql_target: SqlTarget) -> None:
    huge = "x" * 200_000
    bad = DeadLetter(
        Event("e", "s" * 300, "T" * 400, {"k": huge}, 1, T0),
        "k" * 100,
        "message with \x00 and \udcff",
        "frame\n" * 50_000 + "the failing frame",
    )
    await sql_target.apply_batch(SHOP, [], {}, [bad])
    [stored] = await sql_target.dead_letters(SHOP, 1)
    assert stored.event_data == {"k": huge}
    assert stored.stream_id == "s" * 300
    assert stored.event_type is not None
    assert len(stored.event_type) == 255
    assert len(stored.error_kind) == 64
    assert stored.error_message is not None
    assert "\x00" not in stored.error_message
    assert stored.error_stacktrace is not None
    assert stored.error_stacktrace.endswith("the failing frame")
    assert len(stored.error_stacktrace) <= 65_536


@pytest.mark.asyncio
async def test_the_watermark_never_moves_backwards(sql_target: SqlTarget) -> None:
    assert await sql_target.watermark(SHOP) is None
    await sql_target.save_watermark(SHOP, 10, T0)
    await sql_target.save_watermark(SHOP, 4, T0 - timedelta(days=1))
    mark = await sql_target.watermark(SHOP)
    assert mark is not None
    assert (mark.position, mark.occurred_at) == (10, T0)
    assert mark.updated_at.tzinfo is UTC
    await sql_target.save_watermark(SHOP, 12, None)
    mark = await sql_target.watermark(SHOP)
    assert mark is not None
    assert (mark.position, mark.occurred_at) == (12, None)
    assert await sql_target.watermark(SHOP_V2) is None
    with pytest.raises(ValueError, match="timezone-aware"):
        await sql_target.save_watermark(SHOP, 13, datetime(2024, 1, 1))  # noqa: DTZ001


@pytest.mark.asyncio
async def test_times_come_back_in_utc(sql_database: SqlDatabase) -> None:
    at = datetime(2024, 5, 1, 14, 30, 15, 123456, tzinfo=UTC)
    target = sql_database.target(clock=lambda: at)
    try:
        offset = datetime(2024, 5, 1, 16, 30, tzinfo=UTC).astimezone(timezone(timedelta(hours=2)))
        await target.save_watermark(SHOP, 1, offset)
        mark = await target.watermark(SHOP)
        assert mark is not None
        assert mark.occurred_at == datetime(2024, 5, 1, 16, 30, tzinfo=UTC)
        assert mark.occurred_at.tzinfo is UTC
        assert mark.updated_at == at
    finally:
        await target.close()


@pytest.mark.asyncio
async def test_reset_removes_one_projections_state_and_counts_it(
    sql_database: SqlDatabase, sql_target: SqlTarget
) -> None:
    for projection in (SHOP, SHOP_V2):
        await sql_target.apply_batch(
            projection, [], {"a": 1, "b": 2, "c": 3}, [letter(2), letter(3)]
        )
        await sql_target.save_watermark(projection, 3, T0)
    counts = await sql_target.reset(SHOP, dead_letters=False)
    assert counts == ResetCounts(positions=3, watermarks=1, dead_letters=0)
    assert cursors(sql_database) == {}
    assert await sql_target.watermark(SHOP) is None
    assert (await sql_target.dead_letter_stats(SHOP)).total == 2
    counts = await sql_target.reset(SHOP, dead_letters=True)
    assert counts == ResetCounts(positions=0, watermarks=0, dead_letters=2)
    # The other version is untouched.
    assert cursors(sql_database, SHOP_V2) == {"a": 1, "b": 2, "c": 3}
    assert (await sql_target.dead_letter_stats(SHOP_V2)).total == 2
    assert await sql_target.watermark(SHOP_V2) is not None


@pytest.mark.asyncio
async def test_load_positions_most_advanced_first_up_to_a_limit(sql_target: SqlTarget) -> None:
    await sql_target.apply_batch(SHOP, [], {f"s{n}": n for n in range(1, 21)}, [])
    await sql_target.apply_batch(SHOP_V2, [], {"other": 99}, [])
    assert await sql_target.load_positions(SHOP, 3) == {"s20": 20, "s19": 19, "s18": 18}
    assert len(await sql_target.load_positions(SHOP, 1000)) == 20
    assert await sql_target.load_positions(SHOP, 0) == {}


def test_accepts(sql_database: SqlDatabase) -> None:
    target = sql_database.target()
    table = sa.Table("t", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True))
    assert target.accepts(Insert(table, {"id": 1}))
    assert target.accepts(Update(table, where={"id": 1}, values={"id": 2}))
    assert target.accepts(Delete(table, where={"id": 1}))
    assert target.accepts(Execute(sa.delete(table)))
    assert target.accepts(Multi((Insert(table, {"id": 1}), Delete(table, where={"id": 1}))))
    assert not target.accepts(Update(table, where={}, values={"id": 2}))
    assert not target.accepts(Update(table, where={"id": 1}, values={}))
    assert not target.accepts(Delete(table, where={}))
    assert not target.accepts(Multi((Insert(table, {"id": 1}), Delete(table, where={}))))


@pytest.mark.asyncio
async def test_open_refuses_a_database_without_the_tables(sql_database: SqlDatabase) -> None:
    target = SqlTarget(
        sql_database.engine if sql_database.dialect == "sqlite" else sql_database.url,
        prefix="unmigrated_",
        schema=sql_database.schema,
    )
    try:
        with pytest.raises(SchemaNotReadyError, match=r"scriba\.sql\.upgrade"):
            await target.open(SHOP)
        with pytest.raises(ValueError, match="255"):
            await target.open(ProjectionKey("n" * 256))
    finally:
        await target.close()


def test_construction_errors(database_url: str) -> None:
    with pytest.raises(ValueError, match="PostgreSQL"):
        SqlTarget("mysql://localhost/app")
    with pytest.raises(ValueError, match="PostgreSQL"):
        SqlTarget("sqlite+aiosqlite:///x.db")
    engine = sa.create_engine(sa.make_url(database_url).set(drivername="postgresql+psycopg"))
    with pytest.raises(TypeError, match="AsyncEngine"):
        SqlTarget(engine)
    engine.dispose()
    with pytest.raises(ValueError, match="table prefix"):
        SqlTarget("sqlite://", prefix="x-y")


@pytest.mark.asyncio
async def test_close_is_idempotent_and_leaves_a_given_engine_open(
    sql_database: SqlDatabase,
) -> None:
    target = sql_database.target()
    await target.apply_batch(SHOP, [], {"s": 1}, [])
    await target.close()
    await target.close()
    with sql_database.engine.connect() as connection:
        assert connection.execute(sa.select(1)).scalar_one() == 1
