"""Fixtures for the console's tests: each backend's database (the persistence
fixtures' session databases, emptied before each test) with the console's read side
over it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
import sqlalchemy as sa
from tests.persistence.conftest import (  # noqa: F401 - fixtures used through SQL_BACKENDS
    SQL_BACKENDS,
    SqlStore,
    fresh_database,
    postgresql_store,
    sqlite_store,
)

from statifier.console.queries import ConsoleQueries
from statifier.sql import migrations


@dataclass
class ConsoleDb:
    """A migrated, emptied database of one backend, the console's queries over it, and
    a synchronous engine the tests write their rows with."""

    backend: str
    store: SqlStore
    queries: ConsoleQueries
    writer: sa.Engine

    def insert(self, table: sa.Table, rows: Sequence[Mapping[str, Any]]) -> None:
        """Write ``rows`` into ``table`` in one transaction."""
        with self.writer.begin() as connection:
            connection.execute(table.insert(), [dict(row) for row in rows])


@pytest.fixture(params=SQL_BACKENDS)
def console_store(request: pytest.FixtureRequest) -> SqlStore:
    """Each backend's session database."""
    store: SqlStore = request.getfixturevalue(f"{request.param}_store")
    return store


@pytest.fixture
def writer(console_store: SqlStore) -> Iterator[sa.Engine]:
    """A synchronous engine on the backend's database."""
    engine = sa.create_engine(migrations.sync_url(console_store.url))
    try:
        yield engine
    finally:
        engine.dispose()


@pytest_asyncio.fixture
async def console_db(console_store: SqlStore, writer: sa.Engine) -> AsyncIterator[ConsoleDb]:
    """Each backend's database, emptied, with the console's queries over it."""
    console_store.empty()
    queries = ConsoleQueries.open(console_store.url, console_store.tables)
    try:
        yield ConsoleDb(console_store.backend, console_store, queries, writer)
    finally:
        await queries.close()
