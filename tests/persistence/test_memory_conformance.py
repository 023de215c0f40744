"""The in-memory adapter, the reference, passes the storage conformance suite."""

from __future__ import annotations

from statifier.persistence import MemoryAdapter
from statifier.persistence.testing import AdapterConformance


class TestMemoryAdapter(AdapterConformance):
    async def make_adapter(self) -> MemoryAdapter:
        return MemoryAdapter()
