"""How the steps of one execution are kept apart: a replaceable strategy.

The fetch-to-persist tail of every create, step, fail and cancel runs inside
``strategy.exclusive(execution_id)``. The default, :class:`AdapterLock`, is the
adapter's own lock (PostgreSQL: a transaction-scoped lock of the execution's key plus a row lock;
SQLite: a single-writer transaction; in memory: an asyncio lock). A host with an
exclusion of its own (a job queue keyed by execution id, a single consumer) passes a
strategy built on it, or :class:`Unserialized` when its deployment is single-writer by
construction.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Final, Protocol

from statifier.persistence.adapter import Adapter
from statifier.persistence.errors import SerializationUnsupported

__all__ = ["DEFAULT_LOCK_WAIT", "AdapterLock", "Serialization", "Unserialized"]

DEFAULT_LOCK_WAIT: Final = 30.0
"""The most seconds a call waits for an execution's lock unless told otherwise: far
longer than any step holds it, short enough that a call stuck behind one that never
lets go fails with ``LockTimeout`` instead of waiting for ever."""


class Serialization(Protocol):
    """Runs blocks for one execution one at a time."""

    def exclusive(self, execution_id: str) -> AbstractAsyncContextManager[None]:
        """Enter only when no other block for ``execution_id`` runs."""
        ...


class AdapterLock:
    """The adapter's own per-execution lock, waiting at most ``wait`` seconds
    (:data:`DEFAULT_LOCK_WAIT` unless given; ``None`` waits without bound).

    Raises:
        SerializationUnsupported: (at construction) the adapter declares no lock.
    """

    def __init__(self, adapter: Adapter, wait: float | None = DEFAULT_LOCK_WAIT) -> None:
        if not adapter.capabilities.lock:
            raise SerializationUnsupported(
                f"{type(adapter).__name__} has no per-execution lock; pass a serialization "
                "strategy of your own (or Unserialized() for a single writer)"
            )
        if wait is not None and wait <= 0:
            raise ValueError(f"a lock wait must be positive, not {wait}")
        self.adapter = adapter
        self.wait = wait

    def exclusive(self, execution_id: str) -> AbstractAsyncContextManager[None]:
        return self.adapter.exclusive(execution_id, self.wait)


class Unserialized:
    """No exclusion at all: for a deployment with one writer per execution by
    construction. Concurrent steps of one execution would then lose inputs."""

    @asynccontextmanager
    async def exclusive(self, execution_id: str) -> AsyncIterator[None]:
        yield
