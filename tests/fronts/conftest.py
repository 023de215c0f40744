"""Fixtures for the fronts' tests: the router's databases of both backends (migrated
once for the session, emptied before each test), as the router's tests have them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from tests.persistence.conftest import (  # noqa: F401 - fixtures used through router_store
    SqlStore,
    postgresql_store,
    sqlite_store,
)
from tests.router.conftest import (  # noqa: F401 - the fixtures themselves
    Clock,
    RouterDb,
    router_db,
    router_store,
)

from statifier.persistence.sql import SqlAdapter


@pytest_asyncio.fixture
async def pg_db(postgresql_store: SqlStore) -> AsyncIterator[RouterDb]:  # noqa: F811
    """The session's PostgreSQL database alone, emptied, with an adapter (for the
    tests of several processes, which SQLite's single writer would only serialize)."""
    postgresql_store.empty()
    adapter = SqlAdapter(postgresql_store.url, postgresql_store.tables)
    try:
        yield RouterDb("postgresql", postgresql_store, adapter, Clock())
    finally:
        await adapter.close()
