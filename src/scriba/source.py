"""The seam events come in through."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from scriba.event import Event, ProjectionKey

__all__ = ["Source", "SourceError"]


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
    - A source raises ``SourceError`` (or a subclass) for failures it cannot recover
      from; anything else it raises is treated the same way.
    """

    async def subscribe(self, projection: ProjectionKey, after: int) -> None:
        """Start reading just after position ``after`` (0: from the beginning)."""
        ...

    async def read(self, limit: int) -> Sequence[Event]:
        """At most ``limit`` next events, possibly none."""
        ...

    async def acknowledge(self, position: int) -> None:
        """Every event at or below ``position`` is accounted for."""
        ...

    async def close(self) -> None:
        """Release what the subscription holds (connections, locks). Idempotent."""
        ...


class SourceError(Exception):
    """A source failed in a way reading again will not fix."""
