"""The SQL adapter passes the storage conformance suite on PostgreSQL tables laid out
as a host may have written them by hand (``hand_layout``: a leading column,
timestamps leading, collated text columns, a text key the database fills in)."""

from __future__ import annotations

from typing import Any

import pytest

from statifier.persistence.adapter import Adapter
from statifier.persistence.sql import SqlAdapter
from statifier.persistence.testing import FullConformance


class TestSqlAdapterOnAHandLayout(FullConformance):
    exclusive_rolls_back = True

    @pytest.fixture(autouse=True)
    def _on(self, hand_store: Any) -> None:
        self.store = hand_store
        self.exclusive_locks_whole_store = False

    async def make_adapter(self) -> Adapter:
        self.store.empty()
        return SqlAdapter(self.store.url, self.store.tables)

    async def close_adapter(self, adapter: Adapter) -> None:
        assert isinstance(adapter, SqlAdapter)
        await adapter.close()
