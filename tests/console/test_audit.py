"""The console's audit trail, on SQLite and PostgreSQL: every recorded action reads
back, newest first, page after page, with who and when; bad entries are refused; a
UUID-keyed database pages the same way; a row written inside a caller's transaction
commits and rolls back with it."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from tests.console.conftest import ConsoleDb
from tests.persistence.conftest import FreshDatabase

from statifier.buckets import bucket_of
from statifier.console.audit import MAX_TEXT, Audit, AuditEntry, AuditRow
from statifier.console.queries import BadCursor, ConsoleQueries, LedgerFilter, encode_cursor
from statifier.persistence.sql import SqlAdapter
from statifier.sql import TableOptions, migrations

pytestmark = pytest.mark.asyncio

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


class Ticks:
    """A clock that moves one second per reading, with every third reading repeated (so
    rows share times and the key breaks the ties)."""

    def __init__(self) -> None:
        self.reads = 0

    def __call__(self) -> datetime:
        self.reads += 1
        return T0 + timedelta(seconds=self.reads // 3)


async def _all(audit: Audit, **filters: Any) -> list[AuditRow]:
    rows: list[AuditRow] = []
    cursor = None
    while True:
        page = await audit.entries(cursor=cursor, size=4, **filters)
        rows.extend(page.rows)
        if page.next_cursor is None:
            return rows
        cursor = page.next_cursor


async def test_recorded_actions_read_back_newest_first(console_db: ConsoleDb) -> None:
    audit = Audit(console_db.queries.engine, console_db.store.tables, clock=Ticks())
    written = []
    for index in range(13):
        entry = AuditEntry(
            f"ops-{index % 2}",
            action="cancel" if index % 3 else "retry_outbox",
            target=f"order-{index % 4}",
            outcome="refused" if index == 5 else "done",
            detail=None if index % 2 else f"<b>{index}</b>",
        )
        written.append(await audit.record(entry))
    assert [row.id for row in written] == sorted(row.id for row in written)
    rows = await _all(audit)
    assert rows == sorted(written, key=lambda r: (r.at, r.id), reverse=True)
    assert [r.target for r in await _all(audit, target="order-1")] == ["order-1"] * 3
    assert rows[-1].detail == "<b>0</b>"
    refused = [r for r in rows if r.outcome == "refused"]
    assert [(r.actor, r.action, r.target) for r in refused] == [("ops-1", "cancel", "order-1")]
    fingerprint = await console_db.queries.fingerprint()
    assert fingerprint.audit == max(r.at for r in written)


async def test_long_texts_are_cut_and_bad_entries_refused(console_db: ConsoleDb) -> None:
    audit = Audit(console_db.queries.engine, console_db.store.tables)
    row = await audit.record(
        AuditEntry("ops", action="rotate", target="x" * 5000, detail="y" * 5000)
    )
    assert len(row.target) == MAX_TEXT
    assert row.detail is not None
    assert len(row.detail) == MAX_TEXT
    (stored,) = (await audit.entries()).rows
    assert stored == row
    with pytest.raises(ValueError, match="unknown action"):
        AuditEntry("ops", action="drop_table", target="x")
    with pytest.raises(ValueError, match="unknown outcome"):
        AuditEntry("ops", action="cancel", target="x", outcome="maybe")
    with pytest.raises(ValueError, match="names its actor"):
        AuditEntry("", action="cancel", target="x")
    with pytest.raises(BadCursor):
        await audit.entries(cursor=encode_cursor("executions", T0, "x"))
    with pytest.raises(ValueError, match="a page holds"):
        await audit.entries(size=0)


async def test_a_uuid_keyed_database_pages_alike(fresh_database: FreshDatabase) -> None:
    options = TableOptions(prefix="u_", schema=fresh_database.schema, key_type=sa.Uuid)
    migrations.upgrade(fresh_database.url, options)
    tables = options.define()
    async with ConsoleQueries.open(fresh_database.url, tables) as queries:
        audit = Audit(queries.engine, tables, clock=lambda: T0)
        for index in range(7):
            await audit.record(AuditEntry("ops", action="cancel", target=f"t{index}"))
        rows = await _all(audit)
        assert len({row.id for row in rows}) == 7
        assert sorted(row.target for row in rows) == [f"t{i}" for i in range(7)]
        writer = sa.create_engine(migrations.sync_url(fresh_database.url))
        with writer.begin() as connection:
            connection.execute(
                tables.routing_ledger.insert(),
                [
                    {
                        "id": uuid.uuid4(),
                        "binding_id": "b",
                        "message_id": f"m{i}",
                        "outcome": "delivered",
                        "inserted_at": T0,
                        "bucket": bucket_of(f"m{i}"),
                    }
                    for i in range(9)
                ],
            )
        writer.dispose()
        seen: list[str | None] = []
        cursor = None
        while True:
            page = await queries.ledger(LedgerFilter(outcome="delivered"), cursor=cursor, size=2)
            seen.extend(row.message_id for row in page.rows)
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert sorted(str(message) for message in seen) == [f"m{i}" for i in range(9)]
        with pytest.raises(BadCursor):
            await queries.ledger(cursor=encode_cursor("ledger", T0, 12))


async def test_a_record_waits_for_another_writer_and_then_lands(console_db: ConsoleDb) -> None:
    # Another connection holds the table (SQLite: the database's write lock, taken by
    # BEGIN IMMEDIATE; PostgreSQL: an EXCLUSIVE table lock) for a moment: the record
    # waits, without blocking the event loop, and is written once the lock is let go.
    table = console_db.store.tables.console_audit
    audit = Audit(console_db.queries.engine, console_db.store.tables)
    holder = console_db.writer.connect()
    try:
        if console_db.backend == "sqlite":
            holder.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            holder.begin()
            holder.execute(sa.text(f"LOCK TABLE {table.schema}.{table.name} IN EXCLUSIVE MODE"))
        record = asyncio.create_task(audit.record(AuditEntry("ops", action="cancel", target="x")))
        ticks = 0
        while ticks < 10:  # the loop keeps running while the record waits
            await asyncio.sleep(0.02)
            ticks += 1
        assert not record.done()
        assert (await audit.entries()).rows == ()  # a reader does not wait for the writer
        holder.rollback()
        row = await asyncio.wait_for(record, 10)
    finally:
        holder.close()
    assert [r.id for r in (await audit.entries()).rows] == [row.id]


class InjectedError(Exception):
    """The failure a test raises inside a transaction, after a row was written."""


async def test_a_row_written_in_a_transaction_commits_and_rolls_back_with_it(
    console_db: ConsoleDb,
) -> None:
    tables = console_db.store.tables
    audit = Audit(console_db.queries.engine, tables, clock=Ticks())
    written: list[AuditRow] = []

    async def write_then_fail(adapter: SqlAdapter) -> None:
        async with adapter.transaction() as tx:
            written.append(
                await audit.record_in(tx, AuditEntry("ops", action="cancel", target="a"))
            )
            raise InjectedError

    async with SqlAdapter(console_db.queries.engine, tables) as adapter:
        with pytest.raises(InjectedError):
            await write_then_fail(adapter)
        assert [row.target for row in written] == ["a"]
        assert (await audit.entries()).rows == ()  # rolled back with its transaction
        async with adapter.transaction() as tx:
            kept = await audit.record_in(
                tx, AuditEntry("ops", action="rotate", target="b" * 5000, detail="<i>d</i>")
            )
            assert (await audit.entries()).rows == ()  # not before the commit
    (stored,) = (await audit.entries()).rows
    assert stored == kept  # the answer is the row as stored, its key and time included
    assert len(stored.target) == MAX_TEXT


async def test_a_row_written_in_a_transaction_of_a_uuid_keyed_database_reads_back(
    fresh_database: FreshDatabase,
) -> None:
    options = TableOptions(prefix="u_", schema=fresh_database.schema, key_type=sa.Uuid)
    migrations.upgrade(fresh_database.url, options)
    tables = options.define()
    async with ConsoleQueries.open(fresh_database.url, tables) as queries:
        audit = Audit(queries.engine, tables, clock=lambda: T0)
        async with SqlAdapter(queries.engine, tables) as adapter:
            written = []
            for index in range(3):
                async with adapter.transaction() as tx:
                    entry = AuditEntry("ops", action="cancel", target=f"t{index}")
                    written.append(await audit.record_in(tx, entry))
        assert all(isinstance(row.id, uuid.UUID) for row in written)
        rows = await _all(audit)
        assert sorted(rows, key=lambda r: r.target) == written
        (one,) = (await audit.entries(target="t1")).rows
        assert one == written[1]


async def test_a_text_key_the_database_fills_in_is_read_back_and_pages(
    fresh_database: FreshDatabase,
) -> None:
    made = {
        "postgresql": "gen_random_uuid()::text",
        "sqlite": "(lower(hex(randomblob(16))))",
    }[fresh_database.backend]
    options = TableOptions(
        prefix="x_", schema=fresh_database.schema, key_type=sa.Text, key_default=sa.text(made)
    )
    migrations.upgrade(fresh_database.url, options)
    tables = options.define()
    async with ConsoleQueries.open(fresh_database.url, tables) as queries:
        audit = Audit(queries.engine, tables, clock=lambda: T0)
        async with SqlAdapter(queries.engine, tables) as adapter:
            written = []
            for index in range(5):
                async with adapter.transaction() as tx:
                    entry = AuditEntry("ops", action="cancel", target=f"t{index}")
                    written.append(await audit.record_in(tx, entry))
        assert all(isinstance(row.id, str) and row.id for row in written)
        # Pages of four: the cursors carry the text keys back.
        rows = await _all(audit)
        assert sorted(rows, key=lambda r: r.target) == written
