"""Sources scriba reads events from, beyond the in-memory one for tests.

- :class:`NotificationLogSource`: an ``eventsourcing`` application's notification log
  (PostgreSQL and SQLite recorders).
- :class:`SqlTableSource`: an event table of the application's own
  (:func:`event_table`, written with :func:`append`), on PostgreSQL and SQLite.

Each holds its projection with a lock while it reads, so only one process runs a
projection at a time; another stands by until the holder lets go
(:mod:`scriba.sources.standby`), and neither ever reads past a position that a
transaction still in flight could fill (:mod:`scriba.sources.gaps`). That shared part
is :class:`~scriba.sources.subscription.SubscribedSource`; each source adds only how it
reads and decodes.
"""

from statifier.extras import MissingExtra

try:
    from scriba.sources.eventsourcing import EventDecodeError, NotificationLogSource
    from scriba.sources.sql_table import NewEvent, SqlTableSource, append, append_async, event_table
    from scriba.sources.standby import LostLockError
except ModuleNotFoundError as missing:  # eventsourcing and psycopg: the scriba extra
    raise MissingExtra.of(missing, extra="scriba", what="scriba.sources") from missing

__all__ = [
    "EventDecodeError",
    "LostLockError",
    "NewEvent",
    "NotificationLogSource",
    "SqlTableSource",
    "append",
    "append_async",
    "event_table",
]
