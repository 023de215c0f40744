"""What the two SQL sources share: one subscription's lifecycle, around their reads.

:class:`SubscribedSource` is the :class:`~scriba.source.Source` side of a source that
reads a position-numbered log. It takes the projection's lock on ``subscribe`` and
stands by while another process holds it (:mod:`scriba.sources.standby`), keeps the
:class:`~scriba.sources.gaps.GapTracker` of what was read, refuses an acknowledgement
beyond it, and releases the lock on ``close``. A subclass says only how it locks and
how it reads one batch (``_make_lock`` and ``_read_batch``) and how it reads the
log's head (``_head``, for the lag in events).

A source over positions 1 to 5, resumed after 1:

>>> import asyncio, tempfile
>>> from datetime import UTC, datetime
>>> from pathlib import Path
>>> from scriba import Event, ProjectionKey
>>> from scriba.sources.standby import FileLock
>>> class Numbers(SubscribedSource):
...     def __init__(self, lock_path: str):
...         super().__init__("numbers", gaps_can_fill=False, lock_path=lock_path)
...     def _make_lock(self, projection):
...         return FileLock(self._lock_file("", projection))
...     async def _read_batch(self, tracker, limit):
...         positions = list(range(tracker.cursor + 1, 6))[:limit]
...         accepted = tracker.accept(positions)
...         at = datetime(2024, 1, 1, tzinfo=UTC)
...         return [Event(f"n{p}", "s", "Counted", p, p, at) for p in positions[:accepted]]
...     async def _head(self):
...         return 5
>>> async def demo(directory: str):
...     source = Numbers(str(Path(directory) / "numbers.lock"))
...     await source.subscribe(ProjectionKey("numbers"), after=1)
...     first = [e.position for e in await source.read(3)]
...     await source.acknowledge(4)
...     rest = [e.position for e in await source.read(3)]
...     head = await source.head()
...     await source.close()
...     return first, rest, source.acknowledged, head
>>> with tempfile.TemporaryDirectory() as directory:
...     asyncio.run(demo(directory))
([2, 3, 4], [5], 4, 5)
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path

from scriba.event import Event, ProjectionKey
from scriba.source import SourceError
from scriba.sources.gaps import GapTracker
from scriba.sources.standby import ProjectionLock, Standby, lock_path_beside
from statifier.repeats import Repeats

__all__ = ["GAP_PATIENCE", "SubscribedSource"]

_log = logging.getLogger(__name__)

GAP_PATIENCE = 30.0
"""Seconds a source waits at one gap before it warns (then once per 30 s while it
waits): a writer that long uncommitted holds the projection back."""


class SubscribedSource(ABC):
    """A source that reads only while it holds its projection, never past an open gap.

    Args:
        telemetry_name: what ``scriba.source.standby`` and ``scriba.source.subscribed``
            report as the ``source``.
        gaps_can_fill: whether a missing position may still appear later (PostgreSQL
            sequences), so reading waits at it (see :class:`~scriba.sources.gaps.GapTracker`).
        poll_interval: seconds a read waits before returning nothing, when there is
            nothing new (or while standing by).
        lock_check_interval: at most this many seconds pass between checks that the
            projection lock is still held.
        lock_path: the lock file on SQLite (default: beside the database file).
        clock: monotonic seconds (``time.monotonic``), for tests.

    Reads are not to be made concurrently; the pipeline makes one at a time. A read
    that has waited :data:`GAP_PATIENCE` seconds at one gap logs a warning naming the
    position and the writers it waits on.
    """

    def __init__(
        self,
        telemetry_name: str,
        *,
        gaps_can_fill: bool,
        poll_interval: float = 0.1,
        lock_check_interval: float = 1.0,
        lock_path: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._telemetry_name = telemetry_name
        self._gaps_can_fill = gaps_can_fill
        self._poll_interval = poll_interval
        self._lock_check_interval = lock_check_interval
        self._lock_path = lock_path
        self._tracker: GapTracker | None = None
        self._standby: Standby | None = None
        self._lock: ProjectionLock | None = None
        self._acknowledged = 0
        self._repeats = Repeats()
        self._clock = clock
        self._blocked_since: float | None = None

    @property
    def holding(self) -> bool:
        """Whether this source holds its projection (false while standing by)."""
        return self._standby is not None and self._standby.held

    @property
    def standing_by(self) -> bool:
        """Whether this source is subscribed but waits for another process to release
        the projection."""
        return self._standby is not None and not self._standby.held

    @property
    def blocked(self) -> bool:
        """Whether the last read stopped at a gap a writer may still fill."""
        return self._tracker is not None and self._tracker.blocked

    @property
    def acknowledged(self) -> int:
        """The highest position the pipeline reported accounted for."""
        return self._acknowledged

    @property
    def lock(self) -> ProjectionLock | None:
        """The projection lock, once subscribed."""
        return self._lock

    async def subscribe(self, projection: ProjectionKey, after: int) -> None:
        """Read from just after position ``after``, once this process holds
        ``projection`` (until then reads return nothing).

        Raises:
            SourceError: already subscribed.
        """
        if self._tracker is not None:
            raise SourceError("this source is already subscribed; make one source per subscription")
        self._tracker = GapTracker(after, gaps_can_fill=self._gaps_can_fill)
        self._acknowledged = after
        self._lock = self._make_lock(projection)
        self._standby = Standby(
            self._lock,
            projection,
            self._telemetry_name,
            after=after,
            check_interval=self._lock_check_interval,
        )
        await self._standby.ensure()

    async def read(self, limit: int) -> Sequence[Event]:
        """At most ``limit`` next events in position order, possibly none.

        Raises:
            ValueError: ``limit`` is below 1.
            SourceError: not subscribed; the lock was lost
                (:class:`~scriba.sources.LostLockError`); reading failed (each source
                names its own subclasses).
        """
        if limit < 1:
            raise ValueError(f"a read limit is 1 or more, not {limit}")
        if self._tracker is None or self._standby is None:
            raise SourceError("read before subscribe (or after close)")
        if not await self._standby.ensure():
            await asyncio.sleep(self._poll_interval)
            return []
        # The batch is read on a copy, kept only once its events are handed over: a
        # read cancelled mid-way must not move the cursor past events nobody got.
        tracker = copy.copy(self._tracker)
        events = await self._read_batch(tracker, limit)
        self._tracker = tracker
        self._say_if_held(tracker)
        if not events:
            await asyncio.sleep(self._poll_interval)
        return events

    def _say_if_held(self, tracker: GapTracker) -> None:
        """Warn while a gap has held reading back for :data:`GAP_PATIENCE` seconds."""
        if not tracker.blocked:
            self._blocked_since = None
            return
        now = self._clock()
        if self._blocked_since is None:
            self._blocked_since = now
        waited = now - self._blocked_since
        if waited >= GAP_PATIENCE:
            writers = tracker.fenced_writers
            self._repeats.log(
                _log,
                logging.WARNING,
                "gap",
                "%s: reading waits at position %d for %.0f s: a writer that has not "
                "committed took it (%s); later events are held back until it ends",
                self._telemetry_name,
                tracker.cursor + 1,
                waited,
                "transactions " + ", ".join(sorted(writers)) if writers else "not yet known",
            )

    async def acknowledge(self, position: int) -> None:
        """Record that every event at or below ``position`` is accounted for.

        Raises:
            ValueError: ``position`` is beyond what was read (acknowledging it would
                checkpoint past an event nobody has handled).
        """
        read_up_to = self._tracker.cursor if self._tracker is not None else 0
        if position > read_up_to:
            raise ValueError(
                f"cannot acknowledge {position}: only events up to {read_up_to} were read"
            )
        self._acknowledged = max(self._acknowledged, position)

    async def confirm_held(self) -> None:
        """Check the projection lock now.

        Raises:
            LostLockError: it is not held (lost since the last check, or never taken).
        """
        if self._standby is None:
            raise SourceError("confirm_held before subscribe (or after close)")
        await self._standby.confirm()

    async def head(self) -> int | None:
        """The highest position in the log now, or ``None`` when it cannot be read (the
        lag in events is then unknown; reading it never fails the pipeline, and the
        failure is logged, once per kind and interval)."""
        try:
            return await self._head()
        except Exception as error:  # noqa: BLE001 - a measurement, not the pipeline's work
            self._repeats.log(
                _log,
                logging.WARNING,
                type(error).__name__,
                "%s: the log's head cannot be read (the lag in events is unknown): %s: %s",
                self._telemetry_name,
                type(error).__name__,
                error,
            )
            return None

    def projection_lock(self, projection: ProjectionKey) -> ProjectionLock:
        """A new, untaken lock of ``projection``, as :meth:`subscribe` takes it."""
        return self._make_lock(projection)

    async def close(self) -> None:
        """Release the projection lock. Idempotent."""
        standby, self._standby = self._standby, None
        self._tracker = None
        if standby is not None:
            await standby.release()

    # --- what a subclass supplies -------------------------------------------------------

    @abstractmethod
    def _make_lock(self, projection: ProjectionKey) -> ProjectionLock:
        """The lock that keeps other processes off ``projection`` (not yet taken)."""

    @abstractmethod
    async def _read_batch(self, tracker: GapTracker, limit: int) -> list[Event]:
        """At most ``limit`` events after ``tracker.cursor``, only those ``tracker``
        accepts, in position order (``tracker`` is this read's own copy).

        Raises:
            SourceError: the read failed.
        """

    @abstractmethod
    async def _head(self) -> int | None:
        """The highest position in the log (0 when empty), or ``None`` if unknown."""

    def _lock_file(self, database: str, projection: ProjectionKey) -> Path:
        """The lock file of a SQLite ``database``: ``lock_path`` if given."""
        if self._lock_path is not None:
            return Path(self._lock_path)
        return lock_path_beside(database, projection)
