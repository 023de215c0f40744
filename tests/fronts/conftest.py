"""Fixtures for the fronts' tests: the router's databases of both backends (migrated
once for the session, emptied before each test), as the router's tests have them."""

from __future__ import annotations

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
