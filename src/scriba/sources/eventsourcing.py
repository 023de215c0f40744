"""A source reading an ``eventsourcing`` application's notification log.

The ``eventsourcing`` library records every event of an application in one sequence,
the notification log, numbered by notification id. This source reads that sequence on
the library's PostgreSQL and SQLite recorders and hands each notification to the
pipeline as a :class:`scriba.Event`:

========== =============================================================
id         ``"<originator id>:<originator version>"`` (unique per event)
stream_id  the originator (aggregate) id, as a string
type       the class named by the event's topic, qualified within its
           module: ``"Order.Created"`` for ``"shop.domain:Order.Created"``
data       the domain event decoded by the application's mapper; without
           a mapper, the stored state bytes as recorded
position   the notification id
occurred_at the domain event's ``timestamp``; without a mapper, the time
           the source read it (so lag then measures only the source)
metadata   ``{"topic": ..., "originator_version": ...}``
========== =============================================================

Reading. Each :meth:`NotificationLogSource.read` runs in a worker thread: the
recorder's calls (psycopg's or sqlite3's) block, and the mapper's decoding is CPU
work. One thread hop per read of up to ``limit`` notifications costs tens of
microseconds against a database round trip and the decoding of a whole batch, so it
is not worth a second, asynchronous implementation of the recorder.

Gaps. Notification ids come from a sequence on PostgreSQL, so they can have gaps
(a rolled-back insert) and, when a writer does not serialize its inserts as the
library's recorder does by default, a lower id can commit after a higher one is
visible. The source never reads past a gap until every transaction that could still
fill it has ended (see :mod:`scriba.sources.gaps`). On SQLite writes are serialized
and gaps are only ever permanent.

One reader per projection: the source holds a lock keyed by the projection's name
and version while it reads (see :mod:`scriba.sources.standby`); another process with
the same projection stands by until it is released.

Resuming. The pipeline subscribes with the projection's stored watermark;
:meth:`~NotificationLogSource.acknowledge` only checks and records the prefix the
pipeline reports (the log has no server-side subscription to advance).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import psycopg
from eventsourcing.application import Application
from eventsourcing.persistence import (
    ApplicationRecorder,
    Mapper,
    Notification,
    PersistenceError,
)
from eventsourcing.postgres import PostgresApplicationRecorder
from eventsourcing.sqlite import SQLiteApplicationRecorder
from psycopg import sql

from scriba.event import Event, ProjectionKey
from scriba.source import SourceError
from scriba.sources.gaps import (
    MAX_READS_PER_CALL,
    PG_RUNNING_SQL,
    PG_WRITERS_SQL,
    GapTracker,
)
from scriba.sources.standby import AdvisoryLock, FileLock, ProjectionLock, lock_key
from scriba.sources.subscription import SubscribedSource

__all__ = ["EventDecodeError", "NotificationLogSource"]


class EventDecodeError(SourceError):
    """A notification could not be decoded by the mapper (its class is gone, say).

    The source stops there rather than skip it: nothing after it is delivered until
    the application can decode it again. ``position`` is its notification id.
    """

    def __init__(self, position: int, message: str):
        super().__init__(message)
        self.position = position


class NotificationLogSource(SubscribedSource):
    """Reads an ``eventsourcing`` notification log (PostgreSQL or SQLite recorder).

    Subscribing, standing by, acknowledging and closing are those of
    :class:`~scriba.sources.subscription.SubscribedSource` (closing leaves the recorder
    to the application); a read also raises :class:`EventDecodeError` at a notification
    the mapper cannot decode.

    Args:
        recorder: the application's recorder (``application.recorder``).
        mapper: the application's mapper, to decode events; without one ``data`` is
            the stored state bytes.
        poll_interval, lock_check_interval, lock_path: as for
            :class:`~scriba.sources.subscription.SubscribedSource`.

    Raises:
        TypeError: the recorder is neither the PostgreSQL nor the SQLite application
            recorder of ``eventsourcing``.
    """

    def __init__(
        self,
        recorder: ApplicationRecorder,
        *,
        mapper: Mapper[Any] | None = None,
        poll_interval: float = 0.1,
        lock_check_interval: float = 1.0,
        lock_path: str | None = None,
    ):
        if not isinstance(recorder, PostgresApplicationRecorder | SQLiteApplicationRecorder):
            raise TypeError(
                "NotificationLogSource reads the PostgreSQL or SQLite application recorder "
                f"of eventsourcing, not {type(recorder).__qualname__}"
            )
        super().__init__(
            "eventsourcing",
            gaps_can_fill=isinstance(recorder, PostgresApplicationRecorder),
            poll_interval=poll_interval,
            lock_check_interval=lock_check_interval,
            lock_path=lock_path,
        )
        self._recorder = recorder
        self._mapper = mapper

    @classmethod
    def for_application(
        cls, application: Application[Any], **options: Any
    ) -> NotificationLogSource:
        """A source on ``application``'s recorder, decoding with its mapper.

        ``options`` are the keyword arguments of the class.
        """
        return cls(application.recorder, mapper=application.mapper, **options)

    # --- internals ----------------------------------------------------------------------

    def _make_lock(self, projection: ProjectionKey) -> ProjectionLock:
        recorder = self._recorder
        if isinstance(recorder, PostgresApplicationRecorder):
            pool = recorder.datastore.pool

            async def connect() -> psycopg.AsyncConnection[Any]:
                # psycopg_pool allows the parameters to be callables, read per connection.
                conninfo = pool.conninfo() if callable(pool.conninfo) else pool.conninfo
                params = pool.kwargs() if callable(pool.kwargs) else pool.kwargs
                kwargs = {k: v for k, v in (params or {}).items() if k != "row_factory"}
                if pool.get_password_func is not None:
                    kwargs["password"] = pool.get_password_func()
                return await psycopg.AsyncConnection.connect(conninfo, autocommit=True, **kwargs)

            return AdvisoryLock(connect, lock_key(projection))
        assert isinstance(recorder, SQLiteApplicationRecorder)
        return FileLock(self._lock_file(recorder.datastore.pool.db_name, projection))

    async def _head(self) -> int | None:
        # The recorder's call blocks, like its reads.
        highest = await asyncio.to_thread(self._recorder.max_notification_id)
        return highest or 0

    async def _read_batch(self, tracker: GapTracker, limit: int) -> list[Event]:
        try:
            return await asyncio.to_thread(self._select_batch, tracker, limit)
        except PersistenceError as exc:
            raise SourceError(f"reading the notification log failed: {exc}") from exc

    def _select_batch(self, tracker: GapTracker, limit: int) -> list[Event]:
        """Runs in a worker thread: select, stop at open gaps, decode."""
        out: list[Event] = []
        for _ in range(MAX_READS_PER_CALL):
            notifications = self._recorder.select_notifications(
                start=tracker.cursor, limit=limit - len(out), inclusive_of_start=False
            )
            accepted = tracker.accept([n.id for n in notifications])
            out.extend(self._to_event(n) for n in notifications[:accepted])
            if not tracker.blocked or len(out) >= limit:
                break
            writers = tracker.fenced_writers
            if writers is None:
                tracker.fence(notifications[-1].id, self._pg_writers())
                writers = tracker.fenced_writers
            if writers and self._pg_running(writers):
                break
            tracker.close_gaps()
        return out

    def _pg_writers(self) -> frozenset[str]:
        recorder = self._recorder
        assert isinstance(recorder, PostgresApplicationRecorder)
        datastore = recorder.datastore
        with datastore.get_connection() as conn, conn.cursor() as cursor:
            table = sql.Identifier(datastore.schema, recorder.events_table_name).as_string(conn)
            cursor.execute(PG_WRITERS_SQL, [table])
            return frozenset(row["virtualtransaction"] for row in cursor.fetchall())

    def _pg_running(self, writers: frozenset[str]) -> bool:
        recorder = self._recorder
        assert isinstance(recorder, PostgresApplicationRecorder)
        with recorder.datastore.get_connection() as conn, conn.cursor() as cursor:
            cursor.execute(PG_RUNNING_SQL, [list(writers)])
            return cursor.fetchone() is not None

    def _to_event(self, notification: Notification) -> Event:
        stream_id = str(notification.originator_id)
        data: Any = notification.state
        occurred_at: datetime | None = None
        if self._mapper is not None:
            try:
                data = self._mapper.to_domain_event(notification)
            except Exception as exc:  # any decoding failure stops here, typed
                raise EventDecodeError(
                    notification.id,
                    f"notification {notification.id} ({notification.topic}) "
                    f"could not be decoded: {exc}",
                ) from exc
            timestamp = getattr(data, "timestamp", None)
            if isinstance(timestamp, datetime):
                occurred_at = timestamp if timestamp.tzinfo else timestamp.replace(tzinfo=UTC)
        return Event(
            id=f"{stream_id}:{notification.originator_version}",
            stream_id=stream_id,
            type=notification.topic.partition(":")[2] or notification.topic,
            data=data,
            position=notification.id,
            occurred_at=occurred_at or datetime.now(UTC),
            metadata={
                "topic": notification.topic,
                "originator_version": notification.originator_version,
            },
        )
