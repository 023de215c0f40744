"""The whole path on real databases: handler, pipeline, SQL target, and back.

Fault injection (a constraint violation ends as a dead letter, a missing column as a
halt, a batch whose every write fails as a halt), the conservation identity
delivered == rows + dead letters + skipped, many events of one batch on the same keys,
the watermark and lag, reset, and dead-letter queries; on PostgreSQL and SQLite.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa

from scriba import (
    Error,
    Event,
    Insert,
    InvalidState,
    MemorySource,
    Meta,
    Projection,
    Result,
    Scriba,
    Skip,
    Status,
    Update,
)
from scriba.sql.target import SqlTarget
from statifier import telemetry

if TYPE_CHECKING:
    from tests.scriba.conftest import SqlDatabase

WAIT = 20.0
FAST = {"batch_timeout": 0.001, "lag_interval": 0.0, "retry": None}


class Recorder:
    """Telemetry events of some names, as (name, measurements, metadata), in order."""

    def __init__(self, *names: str) -> None:
        self.names = names
        self.seen: list[tuple[str, dict[str, Any], dict[str, Any]]] = []

    def __call__(self, name: str, measurements: Any, metadata: Any) -> None:
        self.seen.append((name, dict(measurements), dict(metadata)))

    def of(self, name: str, **match: Any) -> list[dict[str, Any]]:
        return [
            {**measurements, **metadata}
            for seen, measurements, metadata in self.seen
            if seen == name and all(metadata.get(k) == v for k, v in match.items())
        ]


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    recorder = Recorder()
    names = [
        "scriba.projection.event.skipped",
        "scriba.projection.halted",
        "scriba.projection.lag",
        "scriba.projection.dead_letter",
    ]
    for name in names:
        telemetry.attach(f"test-sql-pipeline-{name}", name, recorder)
    try:
        yield recorder
    finally:
        for name in names:
            telemetry.detach(f"test-sql-pipeline-{name}")


def accounts_table(database: SqlDatabase, *, with_refund: bool = True) -> sa.Table:
    columns: list[sa.schema.SchemaItem] = [
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("stream_id", sa.Text, nullable=False),
        sa.Column("position", sa.BigInteger, nullable=False),
        sa.Column("amount", sa.Integer, sa.CheckConstraint("amount >= 0"), nullable=False),
    ]
    if with_refund:
        columns.append(sa.Column("refund", sa.Integer, nullable=True))
    return sa.Table("accounts", sa.MetaData(schema=database.schema), *columns)


def source_of(*kinds: tuple[str, str, dict[str, Any]], hours_ago: float = 0) -> MemorySource:
    """Events (stream, type, data) at positions 1, 2, ...; ``hours_ago`` dates them."""
    start = datetime.now(UTC) - timedelta(hours=hours_ago)
    source = MemorySource(read_wait=0.001)
    for offset, (stream, type_, data) in enumerate(kinds):
        source.record(stream, type_, data, occurred_at=start + timedelta(milliseconds=offset))
    return source


def projection(
    accounts: sa.Table, hold: tuple[int, asyncio.Event] | None = None
) -> type[Projection]:
    """Opened inserts an account, Refunded updates it, Refused is an error, anything
    else is skipped; ``hold`` makes the handler wait at one position for an event."""

    class Accounts(Projection):
        name = "accounts"

        async def handle(self, event: Event, meta: Meta) -> Result:
            if hold is not None and event.position == hold[0]:
                await hold[1].wait()
            data = event.data
            if event.type == "Opened":
                values = {
                    "id": data["id"],
                    "stream_id": event.stream_id,
                    "position": event.position,
                    "amount": data["amount"],
                }
                return Insert(accounts, values)
            if event.type == "Refunded":
                return Update(accounts, where={"id": data["id"]}, values={"refund": data["refund"]})
            if event.type == "Refused":
                return Error("the handler refuses")
            return Skip()

    return Accounts


def count(database: SqlDatabase, table: sa.Table) -> int:
    return database.count(table)


def conservation(
    database: SqlDatabase, accounts: sa.Table, recorder: Recorder, delivered: int, writes: int
) -> None:
    """delivered == rows written + dead letters + skipped (by the handler)."""
    letters = count(database, database.tables.dead_letters)
    skipped = len(recorder.of("scriba.projection.event.skipped", reason="handler"))
    rows = count(database, accounts)
    updates = writes - rows  # events that wrote by update rather than insert
    assert delivered == rows + updates + letters + skipped


@pytest.mark.asyncio
async def test_a_constraint_violation_ends_as_a_dead_letter(
    sql_database: SqlDatabase, sql_target: SqlTarget, recorder: Recorder
) -> None:
    accounts = accounts_table(sql_database)
    accounts.create(sql_database.engine)
    events = []
    for n in range(1, 61):
        amount = -1 if n % 7 == 0 else n  # every seventh breaks the check constraint
        events.append((f"acct-{n % 5}", "Opened", {"id": n, "amount": amount}))
        if n % 11 == 0:
            events.append((f"acct-{n % 5}", "Noted", {}))
    events.append(("acct-1", "Opened", {"id": 1, "amount": 3}))  # a duplicate key
    source = source_of(*events)
    accounts_projection = projection(accounts)
    async with Scriba() as scriba:
        await scriba.start(
            accounts_projection, source=source, target=sql_target, batch_size=10, **FAST
        )
        async with asyncio.timeout(WAIT):
            await scriba.wait_until_caught_up(accounts_projection)
        info = await scriba.info(accounts_projection)
        assert info.status is Status.RUNNING
        stats = await scriba.dead_letter_stats(accounts_projection)
    assert stats.total == 60 // 7 + 1
    assert stats.by_kind == {"integrity": 60 // 7 + 1}
    letters = await sql_target.dead_letters(accounts_projection.key(), 100)
    assert {letter.event_data["id"] for letter in letters} == {*range(7, 61, 7), 1}
    assert all(letter.error_kind == "integrity" for letter in letters)
    with sql_database.engine.connect() as connection:
        ids = set(connection.execute(sa.select(accounts.c.id)).scalars())
    assert ids == {n for n in range(1, 61) if n % 7}
    conservation(sql_database, accounts, recorder, len(source.events), writes=len(ids))
    assert len(recorder.of("scriba.projection.dead_letter")) == stats.total


@pytest.mark.asyncio
async def test_a_missing_column_halts_and_a_fixed_schema_resumes(
    sql_database: SqlDatabase, sql_target: SqlTarget, recorder: Recorder
) -> None:
    # The database's table lacks the column the code writes for "Refunded".
    accounts_table(sql_database, with_refund=False).create(sql_database.engine)
    accounts = accounts_table(sql_database)
    events = [(f"acct-{n}", "Opened", {"id": n, "amount": n}) for n in range(1, 11)]
    events += [("acct-3", "Refunded", {"id": 3, "refund": 2})]
    events += [(f"acct-{n}", "Opened", {"id": n, "amount": n}) for n in range(11, 16)]
    source = source_of(*events)
    accounts_projection = projection(accounts)
    async with Scriba() as scriba:
        await scriba.start(
            accounts_projection, source=source, target=sql_target, batch_size=4, **FAST
        )
        async with asyncio.timeout(WAIT):
            await until(halt_reported(recorder))
        info = await scriba.info(accounts_projection)
        assert info.status is Status.HALTED
        assert info.halt_reason is not None
        assert "structural" in info.halt_reason
        [halted] = recorder.of("scriba.projection.halted")
        assert halted["kind"] == "structural"
        # Nothing is dead-lettered for a structural failure, and the read model never
        # runs ahead of the cursors.
        assert count(sql_database, sql_database.tables.dead_letters) == 0
        with sql_database.engine.connect() as connection:
            written = connection.execute(sa.select(accounts.c.id, accounts.c.position)).all()
        assert all(position < 11 for _, position in written)
        cursors = await sql_target.load_positions(accounts_projection.key(), 100)
        assert all(cursors[f"acct-{id_}"] >= position for id_, position in written)
        assert "acct-3" not in cursors or cursors["acct-3"] < 11
        await scriba.stop(accounts_projection)

        with sql_database.engine.begin() as connection:
            table = qualified(sql_database, "accounts")
            connection.execute(sa.text(f"alter table {table} add column refund integer"))
        await scriba.start(
            accounts_projection, source=source_of(*events), target=sql_target, **FAST
        )
        async with asyncio.timeout(WAIT):
            await scriba.wait_until_caught_up(accounts_projection)
    with sql_database.engine.connect() as connection:
        assert (
            connection.execute(sa.select(accounts.c.refund).where(accounts.c.id == 3)).scalar_one()
            == 2
        )
        assert count(sql_database, accounts) == 15
    assert count(sql_database, sql_database.tables.dead_letters) == 0


@pytest.mark.asyncio
async def test_a_batch_whose_every_write_fails_halts_instead_of_draining(
    sql_database: SqlDatabase, sql_target: SqlTarget, recorder: Recorder
) -> None:
    # Every write breaks the check: a handler that no longer matches the schema must
    # not pour the stream into the dead-letter table.
    accounts = accounts_table(sql_database)
    accounts.create(sql_database.engine)
    source = source_of(*[(f"acct-{n}", "Opened", {"id": n, "amount": -n}) for n in range(1, 41)])
    accounts_projection = projection(accounts)
    async with Scriba() as scriba:
        await scriba.start(
            accounts_projection, source=source, target=sql_target, batch_size=8, **FAST
        )
        async with asyncio.timeout(WAIT):
            await until(halt_reported(recorder))
        # The halt came in the first batch, while start was still returning.
        assert (await scriba.info(accounts_projection)).status is Status.HALTED
    [halted] = recorder.of("scriba.projection.halted")
    assert halted["kind"] == "integrity"
    assert count(sql_database, accounts) == 0
    assert count(sql_database, sql_database.tables.dead_letters) == 0
    assert await sql_target.load_positions(accounts_projection.key(), 100) == {}


@pytest.mark.asyncio
@pytest.mark.parametrize("parallelism", [1, 4])
async def test_many_events_of_a_batch_on_the_same_keys(
    sql_database: SqlDatabase, sql_target: SqlTarget, parallelism: int
) -> None:
    counters = sa.Table(
        "counters",
        sa.MetaData(schema=sql_database.schema),
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("value", sa.Integer, nullable=False),
        sa.Column("seen", sa.Integer, nullable=False),
    )
    counters.create(sql_database.engine)

    class Counters(Projection):
        name = "counters"

        def handle(self, event: Event, meta: Meta) -> Result:
            key, step = event.data["key"], event.data["step"]
            if step == 0:
                return Insert(counters, {"key": key, "value": 0, "seen": 1})
            return Update(counters, where={"key": key}, values={"value": step, "seen": step + 1})

    events = [
        (f"stream-{key}", "Counted", {"key": key, "step": step})
        for step in range(50)
        for key in ("a", "b", "c", "d")
    ]
    async with Scriba() as scriba:
        await scriba.start(
            Counters,
            source=source_of(*events),
            target=sql_target,
            batch_size=100,
            parallelism=parallelism,
            **FAST,
        )
        async with asyncio.timeout(WAIT):
            await scriba.wait_until_caught_up(Counters)
    with sql_database.engine.connect() as connection:
        final = sorted(tuple(row) for row in connection.execute(sa.select(counters)))
    assert final == [(key, 49, 50) for key in ("a", "b", "c", "d")]
    cursors = await sql_target.load_positions(Counters.key(), 10)
    assert cursors == {f"stream-{key}": 196 + n for n, key in enumerate("abcd", start=1)}


@pytest.mark.asyncio
async def test_watermark_and_lag(
    sql_database: SqlDatabase, sql_target: SqlTarget, recorder: Recorder
) -> None:
    accounts = accounts_table(sql_database)
    accounts.create(sql_database.engine)
    release = asyncio.Event()
    events = [(f"acct-{n}", "Opened", {"id": n, "amount": n}) for n in range(1, 7)]
    source = source_of(*events, hours_ago=1)
    held = projection(accounts, hold=(4, release))

    def lags_at(position: int) -> list[dict[str, Any]]:
        return [lag for lag in recorder.of("scriba.projection.lag") if lag["watermark"] == position]

    async def reported_at(position: int) -> bool:
        return bool(lags_at(position))

    async def watermark_is(position: int) -> bool:
        mark = await sql_target.watermark(held.key())
        return mark is not None and mark.position == position

    async with Scriba() as scriba:
        await scriba.start(
            held,
            source=source,
            target=sql_target,
            batch_size=1,
            batch_timeout=0.001,
            lag_interval=0.02,
        )
        # Event 4 is held: the safe position stops below it however far the rest go,
        # and the stored watermark never runs ahead of it.
        async with asyncio.timeout(WAIT):
            await until(lambda: reported_at(3))
        mark = await sql_target.watermark(held.key())
        assert mark is not None
        assert mark.position <= 3
        assert mark.occurred_at == source.events[mark.position - 1].occurred_at
        assert 3_500_000 < lags_at(3)[-1]["lag_ms"] < 3_700_000
        info = await scriba.info(held)
        assert info.safe_position == 3
        assert info.watermark is not None
        assert info.watermark <= 3
        assert info.lag is not None
        assert 3_500 < info.lag < 3_700
        release.set()
        async with asyncio.timeout(WAIT):
            await scriba.wait_until_caught_up(held)
            await until(lambda: watermark_is(6))
        mark = await sql_target.watermark(held.key())
        assert mark is not None
        assert mark.occurred_at == source.events[-1].occurred_at
        assert (await scriba.info(held)).lag == 0
    # The watermark reported on the lag timer never went backwards.
    reported = [lag["watermark"] for lag in recorder.of("scriba.projection.lag")]
    assert reported == sorted(reported)


@pytest.mark.asyncio
async def test_reset_refuses_while_running_then_a_new_start_rebuilds(
    sql_database: SqlDatabase, sql_target: SqlTarget
) -> None:
    accounts = accounts_table(sql_database)
    accounts.create(sql_database.engine)
    events = [(f"acct-{n % 4}", "Opened", {"id": n, "amount": n}) for n in range(1, 21)]
    events.append(("acct-9", "Refused", {}))
    accounts_projection = projection(accounts)
    async with Scriba() as scriba:
        await scriba.start(
            accounts_projection, source=source_of(*events), target=sql_target, **FAST
        )
        async with asyncio.timeout(WAIT):
            await scriba.wait_until_caught_up(accounts_projection)
        with pytest.raises(InvalidState):
            await scriba.reset(accounts_projection)
        await scriba.stop(accounts_projection)
        counts = await scriba.reset(accounts_projection)
        assert (counts.positions, counts.watermarks, counts.dead_letters) == (5, 1, 0)
        counts = await scriba.reset(accounts_projection, dead_letters=True)
        assert (counts.positions, counts.watermarks, counts.dead_letters) == (0, 0, 1)
        with sql_database.engine.begin() as connection:
            before = sorted(tuple(row) for row in connection.execute(sa.select(accounts)))
            connection.execute(sa.delete(accounts))  # the application clears its read model
        await scriba.start(
            accounts_projection, source=source_of(*events), target=sql_target, **FAST
        )
        async with asyncio.timeout(WAIT):
            await scriba.wait_until_caught_up(accounts_projection)
    with sql_database.engine.connect() as connection:
        assert sorted(tuple(row) for row in connection.execute(sa.select(accounts))) == before
    assert (await sql_target.dead_letter_stats(accounts_projection.key())).total == 1


@pytest.mark.asyncio
async def test_dead_letters_are_read_after_the_projection_stopped(
    sql_database: SqlDatabase, sql_target: SqlTarget
) -> None:
    accounts = accounts_table(sql_database)
    accounts.create(sql_database.engine)
    events = [("acct-1", "Refused", {"n": n}) for n in range(5)]
    events += [("acct-2", "Opened", {"id": 1, "amount": 1})]

    class Accounts(projection(accounts)):  # type: ignore[misc]
        source = MemorySource()
        target = sql_target

    async with Scriba() as scriba:
        await scriba.start(Accounts, source=source_of(*events), target=sql_target, **FAST)
        async with asyncio.timeout(WAIT):
            await scriba.wait_until_caught_up(Accounts)
        await scriba.stop(Accounts)
        newest = await scriba.dead_letters(Accounts, limit=2)
        assert [letter.position for letter in newest] == [5, 4]
        assert newest[0].event_data == {"n": 4}
        assert newest[0].error_kind == "error"
        assert "the handler refuses" in (newest[0].error_message or "")
    # A runtime that never started it answers through the class's own target, by name too.
    async with Scriba() as other:
        stats = await other.dead_letter_stats(Accounts)
        assert (stats.total, dict(stats.by_kind)) == (5, {"error": 5})
        assert (stats.first_position, stats.last_position) == (1, 5)
        assert len(await other.dead_letters(Accounts, limit=10)) == 5


async def until(check: Callable[[], Awaitable[bool]]) -> None:
    """Poll ``check`` until it holds (bound it with ``asyncio.timeout``)."""
    while True:
        if await check():
            return
        await asyncio.sleep(0.01)


def halt_reported(recorder: Recorder) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return bool(recorder.of("scriba.projection.halted"))

    return check


def qualified(database: SqlDatabase, name: str) -> str:
    return f"{database.schema}.{name}" if database.schema else name
