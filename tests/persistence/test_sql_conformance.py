"""The SQL adapter passes the storage conformance suite on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

from statifier.persistence.adapter import Adapter
from statifier.persistence.sql import SqlAdapter
from statifier.persistence.testing import FullConformance


class TestSqlAdapter(FullConformance):
    exclusive_rolls_back = True

    @pytest.fixture(autouse=True)
    def _on(self, sql_store: Any) -> None:
        self.store = sql_store
        # SQLite's single writer admits one block at a time, whatever the execution.
        self.exclusive_locks_whole_store = sql_store.backend == "sqlite"

    async def make_adapter(self) -> Adapter:
        self.store.empty()
        return SqlAdapter(self.store.url, self.store.tables)

    async def close_adapter(self, adapter: Adapter) -> None:
        assert isinstance(adapter, SqlAdapter)
        await adapter.close()
