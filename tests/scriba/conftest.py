"""Fixtures for scriba's SQL tests: the same test on PostgreSQL and on SQLite.

``sql_database`` gives a fresh database with scriba's tables migrated: on PostgreSQL a
schema of its own (dropped afterwards, so runs beside other tests never meet), on
SQLite a file under ``tmp_path``. ``sql_target`` gives a :class:`SqlTarget` on it.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import sqlalchemy as sa

from scriba.sql import Tables, define_tables, upgrade
from scriba.sql.target import SqlTarget

PREFIX = "scriba_"


@dataclass
class SqlDatabase:
    """One test's database.

    Attributes:
        dialect: ``"postgresql"`` or ``"sqlite"``.
        url: a synchronous URL for it (psycopg 3 or sqlite3).
        schema: the test's own schema on PostgreSQL, ``None`` on SQLite.
        engine: a synchronous engine, for setting up read models and for looking at
            what was committed.
        tables: scriba's tables as the target sees them.
        metadata: where a test defines its read-model tables (in the test's schema).
    """

    dialect: str
    url: str
    schema: str | None
    engine: sa.Engine
    tables: Tables
    metadata: sa.MetaData

    def target(self, **options: Any) -> SqlTarget:
        """A target on this database: on SQLite over the shared engine, on PostgreSQL
        over an async engine of its own (close it)."""
        database: str | sa.Engine = self.engine if self.dialect == "sqlite" else self.url
        return SqlTarget(database, prefix=PREFIX, schema=self.schema, **options)

    def count(self, table: sa.Table) -> int:
        with self.engine.connect() as connection:
            return int(
                connection.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()
            )

    def clear(self, *tables: sa.Table) -> None:
        """Empty ``tables`` and scriba's own (cheaper than a new database per example)."""
        with self.engine.begin() as connection:
            for table in (*tables, *self.tables.metadata.sorted_tables):
                connection.execute(sa.delete(table))


def _postgresql_url(database_url: str) -> str:
    return str(sa.make_url(database_url).set(drivername="postgresql+psycopg"))


@pytest.fixture(params=["postgresql", "sqlite"])
def sql_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlDatabase]:
    """A migrated scriba database, on each of the two databases in turn."""
    if request.param == "postgresql":
        url = _postgresql_url(request.getfixturevalue("database_url"))
        schema: str | None = f"scriba_test_{secrets.token_hex(6)}"
    else:
        url = f"sqlite:///{tmp_path / 'scriba.db'}"
        schema = None
    engine = sa.create_engine(url)
    try:
        upgrade(engine, prefix=PREFIX, schema=schema)
        yield SqlDatabase(
            dialect=request.param,
            url=url,
            schema=schema,
            engine=engine,
            tables=define_tables(PREFIX, schema),
            metadata=sa.MetaData(schema=schema),
        )
    finally:
        if schema is not None:
            with engine.begin() as connection:
                connection.execute(sa.schema.DropSchema(schema, cascade=True, if_exists=True))
        engine.dispose()


@pytest_asyncio.fixture
async def sql_target(sql_database: SqlDatabase) -> AsyncIterator[SqlTarget]:
    """A :class:`SqlTarget` on ``sql_database``, closed afterwards."""
    target = sql_database.target()
    try:
        yield target
    finally:
        await target.close()
