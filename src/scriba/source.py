"""The seam events come in through."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from scriba.event import Event, ProjectionKey

__all__ = ["ProjectionLock", "Source", "SourceError"]


class ProjectionLock(Protocol):
    """A lock one process at a time holds for a projection."""

    async def try_acquire(self) -> bool:
        """Take the lock if it is free; never waits for it."""
        ...

    async def still_held(self) -> bool:
        """Whether the lock taken is still held (false once its connection died)."""
        ...

    async def release(self) -> None:
        """Let go of the lock, if held, and of what carries it. Idempotent."""
        ...


class Source(Protocol):
    """Where a projection reads its events from.

    The pipeline calls ``subscribe`` once, then ``read`` in a loop and ``acknowledge``
    as events are accounted for, then ``close``. Deduplication against the committed
    cursors happens in the pipeline, so a source that redelivers is safe, only slower.

    Contract:

    - ``read`` returns events in increasing ``position`` order, never an event at or
      below the ``after`` given to ``subscribe``, and never the same position twice in
      one subscription. It waits a short, bounded while for new events and returns an
      empty sequence when there are none (or while the source stands by because
      another process holds the projection).
    - ``acknowledge(position)`` is only ever called with the end of a gapless prefix of
      what ``read`` returned: every event at or below ``position`` has been committed,
      skipped or dead-lettered. A source that keeps its own resume point stores it.
    - ``standing_by`` is true exactly while ``read`` returns nothing because another
      process holds the projection's lock.
    - ``blocked`` is true while ``read`` holds back events it has seen because a
      position below them may still appear (a writer has not committed yet): the
      projection is then not caught up, however empty its reads.
    - ``confirm_held`` is called once the first events were delivered and the target
      claimed the projection for this reader; it checks the lock now (not on the next
      periodic check), so a lock lost before the claim is never mistaken for a held one.
    - A source raises ``SourceError`` (or a subclass) for failures it cannot recover
      from; anything else it raises is treated the same way.
    """

    @property
    def standing_by(self) -> bool:
        """Whether the source waits for another process to release the projection."""
        ...

    @property
    def blocked(self) -> bool:
        """Whether the last read held back events behind a position that may still
        appear."""
        ...

    async def subscribe(self, projection: ProjectionKey, after: int) -> None:
        """Start reading just after position ``after`` (0: from the beginning)."""
        ...

    async def read(self, limit: int) -> Sequence[Event]:
        """At most ``limit`` next events, possibly none."""
        ...

    async def acknowledge(self, position: int) -> None:
        """Every event at or below ``position`` is accounted for."""
        ...

    async def confirm_held(self) -> None:
        """Check now that this source still holds its projection (a no-op for a source
        without a lock).

        Raises:
            SourceError: the lock is gone (:class:`~scriba.sources.LostLockError`).
        """
        ...

    async def head(self) -> int | None:
        """The highest position the source holds now (0 when empty), or ``None`` when
        it cannot tell; the lag in events is measured against it."""
        ...

    def projection_lock(self, projection: ProjectionKey) -> ProjectionLock | None:
        """A new, untaken lock of ``projection`` as this source would take it, or
        ``None`` for a source that takes none (``reset`` holds it while it clears)."""
        ...

    async def close(self) -> None:
        """Release what the subscription holds (connections, locks). Idempotent."""
        ...


class SourceError(Exception):
    """A source failed in a way reading again will not fix."""
