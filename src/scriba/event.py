"""What a projection reads: events in one global order, and who is reading them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

__all__ = ["Event", "Meta", "ProjectionKey"]


@dataclass(frozen=True, slots=True, order=True)
class ProjectionKey:
    """The identity of a projection: its name and version.

    Everything scriba stores (cursors, watermark, dead letters) is keyed by both, so a
    new version runs beside the old one with its own state.

    >>> ProjectionKey("orders")
    ProjectionKey(name='orders', version=1)
    """

    name: str
    version: int = 1

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a projection needs a non-empty name")
        if isinstance(self.version, bool) or not isinstance(self.version, int):
            raise TypeError(f"a projection version is an int, not {self.version!r}")
        if self.version < 1:
            raise ValueError(f"a projection version is 1 or more, not {self.version}")


@dataclass(frozen=True, slots=True)
class Event:
    """One event of a source.

    Attributes:
        id: globally unique; the same event redelivered keeps its id (idempotency).
        stream_id: the stream it belongs to; per-stream order is preserved and
            partitions are chosen by it.
        type: the event type name, e.g. ``"OrderPlaced"``.
        data: the decoded event, as the source gives it.
        position: global and monotonic in the source: it orders events across streams,
            and every cursor, the watermark and deduplication rest on it.
        occurred_at: when the event was recorded (timezone-aware).
        metadata: whatever else the source carries.
    """

    id: str
    stream_id: str
    type: str
    data: Any
    position: int
    occurred_at: datetime
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Meta:
    """The second argument of ``handle``: where the event sits and who handles it.

    Attributes:
        projection: the projection handling the event.
        partition: the partition (worker) it was routed to.
        attempt: 1 on the first call, then 2, 3... when the handler is retried.
    """

    projection: ProjectionKey
    partition: int
    attempt: int
