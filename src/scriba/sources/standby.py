"""One reader per projection: the others stand by until the holder lets go.

Two processes running the same projection (same name and version) against the same
events would race each other's commits. So a source first takes a lock keyed by the
projection; while another process holds it, the source *stands by*: its reads return
nothing and it tries again on the next one. The lock is one the operating system or
the database server releases by itself when its holder dies, so a crashed holder
never strands the projection.

- :class:`AdvisoryLock`: a PostgreSQL session-level advisory lock on a connection of
  its own (the server drops it when that connection ends).
- :class:`FileLock`: ``flock`` on a file beside a SQLite database (the kernel drops it
  when the process ends).

:class:`Standby` wraps either with the bookkeeping every source needs: the telemetry
(``scriba.source.standby`` once per standby period, ``scriba.source.subscribed`` on
acquiring) and a periodic check that a held lock is still held.

>>> lock_key(ProjectionKey("orders")) == lock_key(ProjectionKey("orders", 1))
True
>>> lock_key(ProjectionKey("orders")) == lock_key(ProjectionKey("orders", 2))
False
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg

from scriba.event import ProjectionKey
from scriba.source import ProjectionLock, SourceError
from statifier import telemetry

__all__ = [
    "AdvisoryLock",
    "FileLock",
    "LostLockError",
    "ProjectionLock",
    "Standby",
    "lock_key",
    "lock_path_beside",
]


class LostLockError(SourceError):
    """The projection lock this source held is gone (its connection died); another
    process may be running the projection now, so this one must stop reading."""


def lock_key(projection: ProjectionKey) -> int:
    """A signed 64-bit key for ``projection``, the same in every process and release
    (a hash of its name and version; Python's ``hash()`` is salted per process)."""
    text = f"scriba\x00{projection.name}\x00{projection.version}".encode()
    digest = hashlib.blake2b(text, digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def lock_path_beside(database: str, projection: ProjectionKey) -> Path:
    """The lock file for ``projection`` next to the SQLite file ``database``.

    An in-memory database is private to its process, so its lock file lives in the
    temporary directory under a name that includes the process id.
    """
    suffix = f"scriba-{lock_key(projection) & 0xFFFFFFFFFFFFFFFF:016x}.lock"
    if not database or ":memory:" in database or "mode=memory" in database:
        return Path(tempfile.gettempdir()) / f"{os.getpid()}-{suffix}"
    path = database.removeprefix("file:").split("?", 1)[0]
    return Path(f"{path}.{suffix}")


class AdvisoryLock:
    """A PostgreSQL session-level advisory lock on a dedicated connection.

    ``connect`` opens that connection (in autocommit mode); it is opened on the first
    attempt and kept while standing by, so retries cost one round trip each.
    """

    def __init__(self, connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]], key: int):
        self._connect = connect
        self._key = key
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._held = False

    @property
    def backend_pid(self) -> int | None:
        """The server process id of the lock's connection (tests end it to simulate a
        holder dying), or ``None`` before it is opened."""
        return None if self._conn is None else self._conn.info.backend_pid

    async def try_acquire(self) -> bool:
        if self._held:
            return True
        if self._conn is None or self._conn.closed:
            self._conn = await self._connect()
        cursor = await self._conn.execute("SELECT pg_try_advisory_lock(%s)", [self._key])
        row = await cursor.fetchone()
        self._held = bool(row and row[0])
        return self._held

    async def still_held(self) -> bool:
        if not self._held or self._conn is None:
            return False
        try:
            await self._conn.execute("SELECT 1")
        except psycopg.Error:
            self._held = False
            return False
        return True

    async def release(self) -> None:
        conn, self._conn = self._conn, None
        held, self._held = self._held, False
        if conn is None:
            return
        try:
            if held and not conn.closed:
                await conn.execute("SELECT pg_advisory_unlock(%s)", [self._key])
        except psycopg.Error:
            pass  # the connection is gone, and the server released the lock with it
        finally:
            await conn.close()


class FileLock:
    """An exclusive ``flock`` on ``path`` (created if missing; never deleted, since
    deleting a lock file another process has open would let a third one in)."""

    def __init__(self, path: Path):
        self._path = path
        self._fd: int | None = None

    @property
    def path(self) -> Path:
        """The lock file."""
        return self._path

    async def try_acquire(self) -> bool:
        if self._fd is not None:
            return True
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return True

    async def still_held(self) -> bool:
        # A flock lives as long as its open file description: nothing else ends it.
        return self._fd is not None

    async def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor releases the flock


class Standby:
    """Whether this source holds its projection, with the telemetry that says so.

    ``ensure()`` is called before every read: it returns whether the source may read.
    While it stands by it retries the lock on every call and reports
    ``scriba.source.standby`` once per period; on acquiring it reports
    ``scriba.source.subscribed`` (with ``after``, where delivery starts: nothing is
    read while standing by). A held lock is re-checked at most every
    ``check_interval`` seconds; if it was lost, :class:`LostLockError` is raised.
    """

    def __init__(
        self,
        lock: ProjectionLock,
        projection: ProjectionKey,
        source: str,
        *,
        after: int,
        check_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._lock = lock
        self._projection = projection
        self._source = source
        self._after = after
        self._check_interval = check_interval
        self._clock = clock
        self._held = False
        self._announced_standby = False
        self._checked_at = 0.0

    @property
    def held(self) -> bool:
        """Whether this source holds the projection (as of the last ``ensure``)."""
        return self._held

    async def ensure(self) -> bool:
        """Whether this source holds the projection now.

        Raises:
            LostLockError: it held the lock and no longer does.
        """
        if self._held:
            now = self._clock()
            if now - self._checked_at >= self._check_interval:
                if not await self._lock.still_held():
                    self._held = False
                    raise LostLockError(
                        f"projection {self._projection.name} v{self._projection.version} "
                        "lost its lock; another process may hold it now"
                    )
                self._checked_at = now
            return True
        if await self._lock.try_acquire():
            self._held = True
            self._announced_standby = False
            self._checked_at = self._clock()
            self._report("scriba.source.subscribed", after=self._after)
            return True
        if not self._announced_standby:
            self._announced_standby = True
            self._report("scriba.source.standby")
        return False

    async def confirm(self) -> None:
        """Check the held lock now, whatever the check interval.

        Raises:
            LostLockError: it is not held (never taken, or lost).
        """
        if not self._held or not await self._lock.still_held():
            self._held = False
            raise LostLockError(
                f"projection {self._projection.name} v{self._projection.version} "
                "is not held by this source; another process may hold it now"
            )
        self._checked_at = self._clock()

    async def release(self) -> None:
        """Let go of the projection. Idempotent."""
        self._held = False
        await self._lock.release()

    def _report(self, event_name: str, **extra: Any) -> None:
        metadata = {
            "name": self._projection.name,
            "version": self._projection.version,
            "source": self._source,
            **extra,
        }
        telemetry.report(event_name, {}, metadata)
