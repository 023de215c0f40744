"""``scriba.testing.project`` commits through the SQL target, on PostgreSQL and SQLite."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa

from scriba import Error, Event, Insert, Meta, Projection, Result, Skip, Update
from scriba.sql.target import SqlTarget
from scriba.target import FailureKind
from scriba.testing import project

if TYPE_CHECKING:
    from tests.scriba.conftest import SqlDatabase

T0 = datetime(2024, 5, 1, tzinfo=UTC)


def orders_projection(database: SqlDatabase) -> tuple[type[Projection], sa.Table]:
    orders = sa.Table(
        "orders",
        database.metadata,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("status", sa.Text, nullable=False),
    )
    orders.create(database.engine)

    class Orders(Projection):
        name = "orders"

        def handle(self, event: Event, meta: Meta) -> Result:
            if event.type == "Placed":
                return Insert(orders, {"id": event.data["id"], "status": "placed"})
            if event.type == "Shipped":
                return Update(orders, where={"id": event.data["id"]}, values={"status": "shipped"})
            if event.type == "Broken":
                return Error("cannot handle it")
            return Skip()

    return Orders, orders


def event(position: int, stream: str, type_: str, **data: Any) -> Event:
    return Event(f"e{position}", stream, type_, data, position, T0)


def table_rows(database: SqlDatabase, table: sa.Table) -> list[tuple[Any, ...]]:
    with database.engine.connect() as connection:
        return [tuple(row) for row in connection.execute(sa.select(table).order_by(table.c.id))]


@pytest.mark.asyncio
async def test_project_commits_through_the_sql_target(
    sql_database: SqlDatabase, sql_target: SqlTarget
) -> None:
    orders_class, orders = orders_projection(sql_database)
    events = [
        event(1, "order-1", "Placed", id=1),
        event(2, "order-2", "Placed", id=2),
        event(3, "order-1", "Shipped", id=1),
        event(4, "order-2", "Broken"),
        event(5, "order-3", "Noted"),
    ]
    report = await project(orders_class, events, target=sql_target)
    assert report.committed
    assert report.failure is None
    assert [handled.failed for handled in report.handled] == [False, False, False, True, False]
    assert table_rows(sql_database, orders) == [(1, "shipped"), (2, "placed")]
    # A failed event moves no cursor; a skipped one does.
    cursors = await sql_target.load_positions(orders_class.key(), 10)
    assert cursors == {"order-1": 3, "order-2": 2, "order-3": 5}
    assert (await sql_target.dead_letter_stats(orders_class.key())).total == 0


@pytest.mark.asyncio
async def test_a_refused_commit_is_reported_and_leaves_nothing(
    sql_database: SqlDatabase, sql_target: SqlTarget
) -> None:
    orders_class, orders = orders_projection(sql_database)
    events = [event(1, "order-1", "Placed", id=1), event(2, "order-9", "Placed", id=1)]
    report = await project(orders_class, events, target=sql_target)
    assert not report.committed
    assert report.failure is not None
    assert report.failure.kind is FailureKind.INTEGRITY
    assert table_rows(sql_database, orders) == []
    assert await sql_target.load_positions(orders_class.key(), 10) == {}


@pytest.mark.asyncio
async def test_without_commit_the_database_is_untouched(
    sql_database: SqlDatabase, sql_target: SqlTarget
) -> None:
    orders_class, orders = orders_projection(sql_database)
    report = await project(
        orders_class, [event(1, "o", "Placed", id=1)], target=sql_target, commit=False
    )
    assert not report.committed
    assert report.operations == [Insert(orders, {"id": 1, "status": "placed"})]
    assert table_rows(sql_database, orders) == []


@pytest.mark.asyncio
async def test_the_projections_own_target_factory_is_made_and_closed(
    sql_database: SqlDatabase,
) -> None:
    base, orders = orders_projection(sql_database)
    made: list[SqlTarget] = []

    def make_target() -> SqlTarget:
        made.append(sql_database.target())
        return made[-1]

    class Orders(base):  # type: ignore[valid-type, misc]
        target = make_target

    report = await project(Orders, [event(1, "o", "Placed", id=7)])
    assert report.committed
    assert len(made) == 1
    assert table_rows(sql_database, orders) == [(7, "placed")]
