"""The migration gate where ``TableOptions.locks`` is ``"rows"`` (decision 0118): the
lock is the one row of ``<prefix>migration_lock`` locked ``FOR UPDATE``, and no
advisory lock is taken. Migrations started together on a fresh schema, or meeting at
the row while a test holds it, all succeed and apply each revision once; a wait that
runs out raises ``MigrationBusy``, as with the advisory lock
(``tests/test_migration_gate.py``)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from tests.test_migration_gate import WAIT, _poll

from statifier.sql import TableOptions, migrations

MIGRATORS = 6
"""How many migrations start at once."""


@pytest.fixture
def schema(database_url: str) -> Iterator[str]:
    """A schema no migration has touched (not created: the gate makes it), dropped after."""
    name = f"lockrows_{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        with psycopg.connect(database_url, autocommit=True) as connection:
            connection.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def _lock_table(options: TableOptions) -> str:
    return f"{options.schema}.{options.name(migrations.MIGRATION_LOCK_TABLE)}"


def _tables(url: str, schema: str) -> set[str]:
    engine = sa.create_engine(migrations.sync_url(url))
    try:
        with engine.connect() as connection:
            return set(sa.inspect(connection).get_table_names(schema=schema))
    finally:
        engine.dispose()


def _advisory_locks(watcher: psycopg.Connection[Any]) -> int:
    """The advisory locks held or awaited in this database, by anyone."""
    row = watcher.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    ).fetchone()
    assert row is not None
    return int(row[0])


def _waiting_for(watcher: psycopg.Connection[Any], table: str) -> int:
    """How many sessions wait for a lock in the statement that locks ``table``'s row
    (the first waits for the holder's transaction, the others for the first)."""
    row = watcher.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
        (f"SELECT id FROM {table} WHERE id = 1 FOR UPDATE%",),
    ).fetchone()
    assert row is not None
    return int(row[0])


def _applied(records: list[logging.LogRecord]) -> list[tuple[str, str]]:
    """``(thread, revision)`` for every revision Alembic logged running upward."""
    return [
        (record.threadName or "", found.group(1))
        for record in records
        if (found := re.search(r"Running upgrade \S* ?-> (\w+)", record.getMessage()))
    ]


def _at_once(work: Callable[[int], None], count: int) -> None:
    """``work(0)`` ... ``work(count - 1)`` in threads released together; re-raises the
    first error."""
    start = threading.Barrier(count)

    def run(index: int) -> None:
        start.wait()
        work(index)

    with ThreadPoolExecutor(count, thread_name_prefix="migrator") as pool:
        for done in [pool.submit(run, index) for index in range(count)]:
            done.result()


def test_the_gate_is_a_row_and_no_advisory_lock(database_url: str, schema: str) -> None:
    options = TableOptions(schema=schema, locks="rows")
    migrations.upgrade(database_url, options)
    table = _lock_table(options)
    with (
        psycopg.connect(database_url) as holder,
        psycopg.connect(database_url, autocommit=True) as watcher,
    ):
        assert holder.execute(f"SELECT id FROM {table}").fetchall() == [(1,)]
        holder.execute(f"SELECT id FROM {table} WHERE id = 1 FOR UPDATE")
        with pytest.raises(migrations.MigrationBusy) as busy:
            migrations.upgrade(database_url, options, wait=0.5)
        assert str(busy.value) == (
            "another process held the migration lock for 0.5 s: it may still be migrating; "
            "nothing was migrated"
        )
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(
                migrations.prepare, database_url, options, migrate=True, wait=WAIT
            )
            _poll(lambda: _waiting_for(watcher, table) == 1, "it waits for the row")
            assert _advisory_locks(watcher) == 0
            holder.rollback()  # lets go
            waiting.result(timeout=2 * WAIT)
    assert migrations.current(database_url, options) == migrations.head()


def test_migrations_at_once_on_a_fresh_schema_migrate_once(
    database_url: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    # They race to make the schema and the lock's table, then meet at its row.
    options = TableOptions(schema=schema, locks="rows")
    caplog.set_level(logging.INFO, logger="alembic.runtime.migration")

    def migrate(index: int) -> None:
        if index % 2:
            migrations.upgrade(database_url, options)
        else:
            migrations.prepare(database_url, options, migrate=True)

    _at_once(migrate, MIGRATORS)
    revisions = sorted(revision for _, revision in _applied(caplog.records))
    assert tuple(revisions) == migrations.revisions()
    assert migrations.current(database_url, options) == migrations.head()


def test_migrations_waiting_at_the_row_migrate_once(
    database_url: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    options = TableOptions(schema=schema, locks="rows")
    first, *rest = migrations.revisions()
    migrations.upgrade(database_url, options, revision=first)  # makes the lock's table
    caplog.set_level(logging.INFO, logger="alembic.runtime.migration")
    # What the suite logged before (the level may already be INFO) is not the waiters'.
    caplog.clear()
    table = _lock_table(options)
    with (
        psycopg.connect(database_url) as holder,
        psycopg.connect(database_url, autocommit=True) as watcher,
    ):
        holder.execute(f"SELECT id FROM {table} WHERE id = 1 FOR UPDATE")
        with ThreadPoolExecutor(MIGRATORS) as pool:
            started = [
                pool.submit(migrations.prepare, database_url, options, migrate=True, wait=WAIT)
                for _ in range(MIGRATORS)
            ]
            _poll(
                lambda: _waiting_for(watcher, table) == MIGRATORS,
                "every migration waits for the row",
            )
            assert _advisory_locks(watcher) == 0
            assert migrations.current(database_url, options) == first  # none went past
            holder.rollback()  # lets go
            for done in started:
                done.result(timeout=2 * WAIT)
    applied = _applied(caplog.records)
    assert sorted(revision for _, revision in applied) == rest
    assert len({thread for thread, _ in applied}) == 1  # whichever took the row first
    assert migrations.current(database_url, options) == migrations.head()


def test_a_downgrade_to_base_leaves_the_lock_table(database_url: str, schema: str) -> None:
    options = TableOptions(schema=schema, prefix="mig_", locks="rows")
    migrations.upgrade(database_url, options)
    migrations.downgrade(database_url, options)
    assert _tables(database_url, schema) == {"mig_alembic_version", "mig_migration_lock"}
    migrations.upgrade(database_url, options)  # and the next migration locks it again
    assert migrations.current(database_url, options) == migrations.head()


def test_advisory_locks_make_no_lock_table(database_url: str, schema: str) -> None:
    options = TableOptions(schema=schema)
    migrations.upgrade(database_url, options)
    assert "statifier_migration_lock" not in _tables(database_url, schema)


def test_db_upgrade_with_locks_rows_gates_at_the_row(database_url: str, schema: str) -> None:
    options = TableOptions(schema=schema, locks="rows")
    first = migrations.revisions()[0]
    migrations.upgrade(database_url, options, revision=first)  # makes the lock's table
    table = _lock_table(options)
    command = [
        sys.executable,
        "-m",
        "statifier.cli",
        "db",
        "upgrade",
        "--url",
        database_url,
        "--schema",
        schema,
        "--locks",
        "rows",
    ]
    environ = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent / "src")}
    with (
        psycopg.connect(database_url) as holder,
        psycopg.connect(database_url, autocommit=True) as watcher,
    ):
        holder.execute(f"SELECT id FROM {table} WHERE id = 1 FOR UPDATE")
        process = subprocess.Popen(
            command, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            _poll(lambda: _waiting_for(watcher, table) == 1, "the command waits for the row")
            assert _advisory_locks(watcher) == 0
            assert migrations.current(database_url, options) == first
            holder.rollback()  # lets go
            out, err = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert process.returncode == 0, err
    assert out == f"statifier_tables at revision {migrations.head()}\n"
