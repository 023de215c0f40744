"""The test environment is the one the project needs: real PostgreSQL, recent SQLite."""

import sqlite3

import psycopg


def test_postgresql_answers(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
        assert conn.info.server_version >= 140000, "PostgreSQL >= 14 is needed"


def test_sqlite_supports_returning() -> None:
    # RETURNING, used by the SQLite store, arrived in SQLite 3.35.
    assert sqlite3.sqlite_version_info >= (3, 35)
