"""PD2 (position consistency) and PD3 (cursor resume), through the whole pipeline, on
PostgreSQL and SQLite.

Each test keeps one engine and one target for all its examples, on one event loop,
and empties the tables between examples: a fresh database per example would cost more
than the property.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from scriba import (
    Error,
    Event,
    Insert,
    MemorySource,
    Meta,
    Multi,
    Projection,
    Result,
    Scriba,
    Skip,
    Update,
)
from scriba.sql.target import SqlTarget
from statifier import telemetry

if TYPE_CHECKING:
    from tests.scriba.conftest import SqlDatabase

T0 = datetime(2024, 5, 1, tzinfo=UTC)
KINDS = ("insert", "multi", "skip", "error")
WAIT = 30.0


@dataclass(frozen=True)
class Case:
    """A generated run: events as (stream, kind), and how the pipeline is shaped."""

    events: list[tuple[int, str]]
    parallelism: int
    batch_size: int

    def source_events(self) -> list[Event]:
        return [
            Event(
                id=f"ev-{position}",
                stream_id=f"stream-{stream}",
                type=kind,
                data={"n": position},
                position=position,
                occurred_at=T0 + timedelta(seconds=position),
            )
            for position, (stream, kind) in enumerate(self.events, start=1)
        ]


cases = st.builds(
    Case,
    events=st.lists(st.tuples(st.integers(0, 5), st.sampled_from(KINDS)), min_size=1, max_size=30),
    parallelism=st.integers(1, 4),
    batch_size=st.integers(1, 8),
)


def read_model(metadata: sa.MetaData) -> sa.Table:
    return sa.Table(
        "pd_rows",
        metadata,
        sa.Column("event_id", sa.Text, primary_key=True),
        sa.Column("stream_id", sa.Text, nullable=False),
        sa.Column("position", sa.BigInteger, nullable=False),
        sa.Column("touched", sa.Integer, nullable=False),
    )


def projection_for(rows: sa.Table, calls: list[int]) -> type[Projection]:
    class Rows(Projection):
        name = "pd"
        retry = None
        lag_interval = 0.0
        batch_timeout = 0.001

        def handle(self, event: Event, meta: Meta) -> Result:
            calls.append(event.position)
            values = {
                "event_id": event.id,
                "stream_id": event.stream_id,
                "position": event.position,
                "touched": 0,
            }
            if event.type == "insert":
                return Insert(rows, values)
            if event.type == "multi":
                return Multi(
                    (
                        Insert(rows, values),
                        Update(rows, where={"event_id": event.id}, values={"touched": 1}),
                    )
                )
            if event.type == "skip":
                return Skip("nothing to write")
            return Error("refused")

    return Rows


class SkipCounter:
    """Counts ``scriba.projection.event.skipped`` by reason while attached."""

    def __init__(self) -> None:
        self.by_reason: dict[str, int] = {}

    def __call__(self, name: str, measurements: Any, metadata: Any) -> None:
        reason = str(metadata["reason"])
        self.by_reason[reason] = self.by_reason.get(reason, 0) + 1


@pytest.fixture
def skips() -> Iterator[SkipCounter]:
    counter = SkipCounter()
    telemetry.attach("test-sql-properties", "scriba.projection.event.skipped", counter)
    try:
        yield counter
    finally:
        telemetry.detach("test-sql-properties")


async def run_to_completion(
    projection: type[Projection], source: MemorySource, target: SqlTarget, **options: Any
) -> None:
    async with Scriba() as scriba:
        await scriba.start(projection, source=source, target=target, **options)
        async with asyncio.timeout(WAIT):
            await scriba.wait_until_caught_up(projection)
        await scriba.stop(projection)


def snapshot(database: SqlDatabase, rows: sa.Table) -> dict[str, Any]:
    """Everything the runs write, ``updated_at`` included, in a comparable form."""
    tables = database.tables
    with database.engine.connect() as connection:
        return {
            table.name: sorted(tuple(row) for row in connection.execute(sa.select(table)))
            for table in (rows, tables.positions, tables.dead_letters)
        }


def test_pd2_every_row_has_a_cursor_at_or_past_its_event(
    sql_database: SqlDatabase, skips: SkipCounter
) -> None:
    rows = read_model(sql_database.metadata)
    rows.create(sql_database.engine)
    calls: list[int] = []
    projection = projection_for(rows, calls)
    with asyncio.Runner() as runner:
        target = sql_database.target()

        @settings(max_examples=200, deadline=None)
        @given(case=cases)
        def pd2(case: Case) -> None:
            sql_database.clear(rows)
            skips.by_reason.clear()
            events = case.source_events()
            runner.run(
                run_to_completion(
                    projection,
                    MemorySource(events, read_wait=0.001),
                    target,
                    parallelism=case.parallelism,
                    batch_size=case.batch_size,
                )
            )
            with sql_database.engine.connect() as connection:
                written = connection.execute(sa.select(rows)).all()
            cursors = target_cursors(sql_database)
            # PD2: the read model never runs ahead of the cursor of its stream.
            for row in written:
                assert cursors[row.stream_id] >= row.position, (row, cursors)
            # Exactly once, and every event accounted for.
            writes = {e.id for e in events if e.type in ("insert", "multi")}
            assert {row.event_id for row in written} == writes
            assert all(row.touched == (row.position in multi(events)) for row in written)
            letters = sql_database.count(sql_database.tables.dead_letters)
            assert letters == sum(e.type == "error" for e in events)
            assert len(events) == len(written) + letters + skips.by_reason.get("handler", 0)
            assert skips.by_reason.get("dedup", 0) == 0

        try:
            pd2()
        finally:
            runner.run(target.close())


def test_pd3_a_second_start_from_the_committed_cursor_changes_nothing(
    sql_database: SqlDatabase,
) -> None:
    rows = read_model(sql_database.metadata)
    rows.create(sql_database.engine)
    calls: list[int] = []
    projection = projection_for(rows, calls)
    with asyncio.Runner() as runner:
        target = sql_database.target()

        @settings(max_examples=100, deadline=None)
        @given(case=cases, naive=st.booleans())
        def pd3(case: Case, naive: bool) -> None:
            sql_database.clear(rows)
            events = case.source_events()
            shape = {"parallelism": case.parallelism, "batch_size": case.batch_size}
            runner.run(
                run_to_completion(
                    projection, MemorySource(events, read_wait=0.001), target, **shape
                )
            )
            before = snapshot(sql_database, rows)
            committed = max(target_cursors(sql_database).values(), default=0)
            calls.clear()
            # A source that resumes after start_from delivers nothing at or below it;
            # a naive one delivers everything again and deduplication must absorb it.
            second = MemorySource(events, read_wait=0.001, replay_from_zero=naive)
            runner.run(run_to_completion(projection, second, target, start_from=committed, **shape))
            assert snapshot(sql_database, rows) == before
            assert [position for position in calls if position <= committed] == []
            if not naive:
                assert second.subscriptions == [committed]

        try:
            pd3()
        finally:
            runner.run(target.close())


def target_cursors(database: SqlDatabase) -> dict[str, int]:
    positions = database.tables.positions
    with database.engine.connect() as connection:
        query = sa.select(positions.c.stream_id, positions.c.position)
        return {row.stream_id: row.position for row in connection.execute(query)}


def multi(events: list[Event]) -> set[int]:
    return {event.position for event in events if event.type == "multi"}
