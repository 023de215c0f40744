"""Fixtures for the fronts' tests: the router's databases of both backends (migrated
once for the session, emptied before each test), as the router's tests have them.

``pg_db`` is PostgreSQL with advisory locks alone here: the fronts' crash tests start
worker processes that open the tables with the default options."""

from __future__ import annotations

import pytest
from tests.persistence.conftest import (  # noqa: F401 - fixtures used through router_store
    SqlStore,
    postgresql_store,
    sqlite_store,
)
from tests.router.conftest import (  # noqa: F401 - the fixtures themselves
    RouterDb,
    pg_db,
    router_db,
    router_store,
)


@pytest.fixture
def pg_store(postgresql_store: SqlStore) -> SqlStore:  # noqa: F811
    """The session's PostgreSQL database with advisory locks."""
    return postgresql_store
