"""One migration gate: ``statifier db upgrade``, ``statifier serve`` and
``Durable(migrate=True)``, started at once against a fresh database as three processes,
all wait on the one migration lock, and the tables are migrated once, each revision by
exactly one of them; every process ends without an error, at the head revision.

The test holds the lock itself while the three start, so that they truly meet at it: on
PostgreSQL it waits until the three are seen waiting for the advisory lock in
``pg_locks``; on SQLite (whose waiters cannot be seen) until the three have started,
none of them having migrated anything. Then it lets go.
"""

from __future__ import annotations

import re
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import psycopg
import pytest

from statifier.sql import TableOptions, migrations

HELPER: Final = Path(__file__).parent / "migrating_process.py"
WAYS: Final = ("cli", "serve", "durable")
WAIT: Final = 120.0  # seconds: generous, for a loaded machine


def _poll(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT:g} s: {what}"
        time.sleep(0.05)


@contextmanager
def _held_on_postgresql(url: str) -> Iterator[Callable[[], bool]]:
    """The migration lock, held; answers whether three others wait for it."""
    key = migrations.MIGRATION_LOCK
    with psycopg.connect(url) as holder, psycopg.connect(url, autocommit=True) as watcher:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (key,))

        def three_wait() -> bool:
            row = watcher.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                " AND classid = %s::oid AND objid = %s::oid AND objsubid = 1",
                ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
            ).fetchone()
            return row is not None and row[0] == 3

        yield three_wait
        holder.rollback()  # lets go: the lock is the transaction's


@contextmanager
def _held_on_sqlite(path: Path, directory: Path) -> Iterator[Callable[[], bool]]:
    """SQLite's write lock, held; answers whether the three processes started."""
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("PRAGMA journal_mode = WAL")
        holder.execute("BEGIN IMMEDIATE")
        yield lambda: all((directory / f"{way}.started").exists() for way in WAYS)
        # Nothing was migrated while the lock was held.
        reader = sqlite3.connect(path)
        try:
            assert reader.execute("SELECT name FROM sqlite_master").fetchall() == []
        finally:
            reader.close()
        holder.execute("ROLLBACK")
    finally:
        holder.close()


def _start(way: str, url: str, schema: str | None, directory: Path) -> subprocess.Popen[str]:
    """The process, its output in ``DIR/WAY.out`` and ``DIR/WAY.err``."""
    with (directory / f"{way}.out").open("w") as out, (directory / f"{way}.err").open("w") as err:
        return subprocess.Popen(
            [sys.executable, str(HELPER), way, url, schema or "-", str(directory)],
            stdout=out,
            stderr=err,
            text=True,
        )


def _listening(directory: Path, serve: subprocess.Popen[str]) -> bool:
    if serve.poll() is not None:
        raise AssertionError(f"serve ended early: {(directory / 'serve.err').read_text()}")
    return "listening on http://" in (directory / "serve.out").read_text()


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_database(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, str | None, Path]]:
    """``(url, schema, directory)``: a database no migration has touched."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'gate.db'}", None, tmp_path
        return
    url: str = request.getfixturevalue("database_url")
    schema = f"gate_{uuid.uuid4().hex[:12]}"
    try:
        yield url, schema, tmp_path
    finally:
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_the_command_line_serve_and_durable_at_once_migrate_once(
    fresh_database: tuple[str, str | None, Path],
) -> None:
    url, schema, directory = fresh_database
    if schema is None:
        held = _held_on_sqlite(Path(url.removeprefix("sqlite:///")), directory)
    else:
        held = _held_on_postgresql(url)
    processes: dict[str, subprocess.Popen[str]] = {}
    try:
        with held as all_waiting:
            processes = {way: _start(way, url, schema, directory) for way in WAYS}
            _poll(all_waiting, "the three processes wait for the migration lock")
        assert processes["cli"].wait(timeout=WAIT) == 0, (directory / "cli.err").read_text()
        assert processes["durable"].wait(timeout=WAIT) == 0, (directory / "durable.err").read_text()
        _poll(lambda: _listening(directory, processes["serve"]), "serve listens")
        processes["serve"].send_signal(signal.SIGTERM)
        assert processes["serve"].wait(timeout=WAIT) == 0, (directory / "serve.err").read_text()
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()

    logs = {way: (directory / f"{way}.err").read_text() for way in WAYS}
    for way, log in logs.items():
        assert "Traceback" not in log, (way, log)
        assert " ERROR " not in log, (way, log)
    applied = [
        (way, revision)
        for way, log in logs.items()
        for revision in re.findall(r"Running upgrade \S* ?-> (\w+)", log)
    ]
    revisions = sorted(revision for _, revision in applied)
    # Each revision was applied once, by whichever process took the lock first.
    assert tuple(revisions) == migrations.revisions()
    assert migrations.current(url, TableOptions(schema=schema)) == migrations.head()
    assert (directory / "cli.out").read_text().endswith(f"tables at revision {migrations.head()}\n")
    assert (directory / "durable.out").read_text() == "completed\n"


def test_a_migration_that_waits_too_long_for_the_lock_is_refused(
    fresh_database: tuple[str, str | None, Path],
) -> None:
    url, schema, directory = fresh_database
    options = TableOptions(schema=schema)
    if schema is None:
        held = _held_on_sqlite(Path(url.removeprefix("sqlite:///")), directory)
    else:
        held = _held_on_postgresql(url)
    with held, pytest.raises(migrations.MigrationBusy) as busy:
        migrations.prepare(url, options, migrate=True, wait=0.5)
    assert str(busy.value) == (
        "another process held the migration lock for 0.5 s: it may still be migrating; "
        "nothing was migrated"
    )
    migrations.prepare(url, options, migrate=True)  # the lock let go: it migrates
    migrations.prepare(url, options, migrate=False)  # and finds the head


def test_without_migrating_the_gate_only_reads(tmp_path: Path) -> None:
    missing = tmp_path / "typo.db"
    with pytest.raises(migrations.NotAtHead) as behind:
        migrations.prepare(f"sqlite:///{missing}", migrate=False)
    assert (behind.value.revision, behind.value.head) == (None, migrations.head())
    assert not missing.exists()  # no stray file left behind
    url = f"sqlite:///{tmp_path / 'old.db'}"
    migrations.upgrade(url, revision=migrations.revisions()[0])
    with pytest.raises(migrations.NotAtHead) as behind:
        migrations.prepare(url, migrate=False)
    assert behind.value.revision == migrations.revisions()[0]
    assert str(behind.value) == (
        f"the tables are at revision {migrations.revisions()[0]}, and this statifier "
        f"needs revision {migrations.head()}"
    )
