"""The seam read models are written through; it is the transaction boundary."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from scriba.event import Event, ProjectionKey
from scriba.operations import Operation

__all__ = [
    "ApplyFailed",
    "DeadLetter",
    "DeadLetterStats",
    "FailureKind",
    "ResetCounts",
    "StoredDeadLetter",
    "Target",
    "Watermark",
]


class FailureKind(enum.Enum):
    """How a failed commit is handled (see the projection guide).

    ``TRANSIENT``: replay the whole batch after a backoff. ``INTEGRITY``: specific to one
    event; retry the batch event by event and dead-letter the offenders.
    ``STRUCTURAL``: the schema or permissions do not match the code; halt.
    ``FENCED``: another reader claimed the projection since this one did (this one was
    deposed: its lock was lost); nothing was applied, and the pipeline ends, so that a
    new one stands by or claims the projection again.
    """

    TRANSIENT = "transient"
    INTEGRITY = "integrity"
    STRUCTURAL = "structural"
    FENCED = "fenced"


class ApplyFailed(Exception):  # noqa: N818 - names the outcome, like the others here
    """A batch did not commit; nothing of it was applied.

    Attributes:
        kind: how the engine must answer it.
        cause: the underlying error (a driver exception, say), if any.
    """

    def __init__(self, kind: FailureKind, message: str, cause: BaseException | None = None):
        super().__init__(message)
        self.kind = kind
        self.cause = cause


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An event given up on, written in the same transaction as the batch around it.

    ``error_kind`` names the failure (``"error"`` for an ``Error`` return,
    ``"exception"`` for a raised one, ``"integrity"`` for a write the database refused,
    ``"rejected"`` for a result the target does not accept).
    """

    event: Event
    error_kind: str
    error_message: str
    error_stacktrace: str | None = None


@dataclass(frozen=True, slots=True)
class StoredDeadLetter:
    """A dead letter as read back: what failed, never a value to re-dispatch."""

    id: int
    projection: ProjectionKey
    position: int
    stream_id: str | None
    event_type: str | None
    event_data: Any
    error_kind: str
    error_message: str | None
    error_stacktrace: str | None
    occurred_at: datetime


@dataclass(frozen=True, slots=True)
class DeadLetterStats:
    """How many dead letters a projection has, in all and by ``error_kind``."""

    total: int
    by_kind: Mapping[str, int]
    first_position: int | None
    last_position: int | None


@dataclass(frozen=True, slots=True)
class Watermark:
    """Every event at or below ``position`` is accounted for; ``occurred_at`` is that
    event's time (so now minus it is the projection's lag)."""

    position: int
    occurred_at: datetime | None
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class ResetCounts:
    """What a reset removed."""

    positions: int
    watermarks: int
    dead_letters: int


class Target(Protocol):
    """Where a projection's results are committed, with its cursors, atomically.

    Invariants every target keeps:

    - ``apply_batch`` is all or nothing: the operations, the cursor advances and the dead
      letters commit together or not at all (then it raises :class:`ApplyFailed`).
    - A cursor never moves backwards: an advance below the stored position leaves it.
    - Fencing: ``claim`` raises the projection's generation and returns it; a batch or
      a watermark given a ``fence`` below the stored generation fails ``FENCED`` and
      applies nothing, the check made in the same transaction as the write. So of two
      readers that both believe they hold the projection, only the later claimer
      commits. ``reset`` raises the generation too. ``fence=None`` is not checked.
    """

    async def open(self, projection: ProjectionKey) -> None:
        """Get ready to serve ``projection`` (connections; never schema changes)."""
        ...

    def accepts(self, operation: Operation) -> bool:
        """Whether this target can apply ``operation``; others are dead-lettered."""
        ...

    async def load_positions(self, projection: ProjectionKey, limit: int) -> dict[str, int]:
        """Up to ``limit`` stream cursors of ``projection`` (the cache preload)."""
        ...

    async def stream_position(self, projection: ProjectionKey, stream_id: str) -> int | None:
        """The committed cursor of one stream, or ``None`` if it has none."""
        ...

    async def claim(self, projection: ProjectionKey) -> int:
        """Take ``projection`` for the calling reader: raise its generation by one and
        return it (the fence to give every later write)."""
        ...

    async def apply_batch(
        self,
        projection: ProjectionKey,
        applied: Sequence[tuple[Event, Operation]],
        advances: Mapping[str, int],
        dead_letters: Sequence[DeadLetter],
        *,
        fence: int | None = None,
    ) -> None:
        """Commit one batch: ``applied`` in order, each stream's cursor raised to
        ``advances[stream_id]`` (keeping the greater), and ``dead_letters``; only if
        ``fence`` is still the projection's generation (when given).

        Raises:
            ApplyFailed: nothing was committed; ``kind`` says how to answer
                (``FENCED``: another reader claimed the projection).
        """
        ...

    async def save_watermark(
        self,
        projection: ProjectionKey,
        position: int,
        occurred_at: datetime | None,
        *,
        fence: int | None = None,
    ) -> None:
        """Store the watermark (outside any batch); it never moves backwards.

        Raises:
            ApplyFailed: of kind ``FENCED``, when ``fence`` is given and is no longer
                the projection's generation (nothing is stored).
        """
        ...

    async def watermark(self, projection: ProjectionKey) -> Watermark | None:
        """The stored watermark, or ``None`` before the first one."""
        ...

    async def dead_letters(self, projection: ProjectionKey, limit: int) -> list[StoredDeadLetter]:
        """The newest ``limit`` dead letters, newest first."""
        ...

    async def dead_letter_stats(self, projection: ProjectionKey) -> DeadLetterStats:
        """Counts of the projection's dead letters."""
        ...

    async def reset(self, projection: ProjectionKey, *, dead_letters: bool) -> ResetCounts:
        """Remove the projection's cursors and watermark (and dead letters if asked)
        and raise its generation (fencing out any reader still about); never the read
        model."""
        ...

    async def close(self) -> None:
        """Release connections. Idempotent."""
        ...
