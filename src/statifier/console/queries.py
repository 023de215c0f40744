"""The console's read side: what its pages show, read from the tables of durable
executions, of the router, of the fronts and of scriba.

:class:`ConsoleQueries` runs short read-only statements (SQLAlchemy Core) over an
engine: an :class:`~sqlalchemy.ext.asyncio.AsyncEngine` on PostgreSQL, a synchronous
:class:`~sqlalchemy.Engine` on SQLite (the engine :class:`~statifier.persistence.sql.SqlAdapter`
holds, or one of :meth:`ConsoleQueries.open`). Every answer is a frozen value.

Lists are pages in keyset order, newest first, with an opaque cursor for the next page
(:class:`Page`); a page holds at most :data:`MAX_PAGE` rows. The indexes the pages walk
are built by the migration ``statifier_0006`` (see ``docs/decisions/0083``).

>>> import asyncio, os, tempfile
>>> from statifier.sql import migrations
>>> url = f"sqlite:///{os.path.join(tempfile.mkdtemp(), 'doc.db')}"
>>> migrations.upgrade(url)
>>> async def main() -> int:
...     async with ConsoleQueries.open(url) as queries:
...         page = await queries.executions(ExecutionFilter(status=Status.ACTIVE))
...         return len(page.rows)
>>> asyncio.run(main())
0
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any, Final, Generic, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from scriba.sql.tables import Tables as ScribaTables
from statifier.persistence import LoggedInput
from statifier.persistence.records import ChartRecord, ExecutionRecord, Status
from statifier.router.outbox import OutboxRow
from statifier.router.records import LedgerRow
from statifier.sql.engines import database_url, sqlite_engine
from statifier.sql.tables import Tables

__all__ = [
    "DEFAULT_PAGE",
    "MAX_PAGE",
    "AddressView",
    "BadCursor",
    "BucketCount",
    "ConsoleQueries",
    "ConsumerDeadLetter",
    "ExecutionDetail",
    "ExecutionFilter",
    "ExecutionSummary",
    "Fingerprint",
    "LedgerFilter",
    "Page",
    "ProjectionView",
    "TimerView",
]

_T = TypeVar("_T")
_R = TypeVar("_R")

DEFAULT_PAGE: Final = 50
"""Rows per page when the caller names no size."""

MAX_PAGE: Final = 500
"""The most rows a page holds; a larger size is refused."""

MAX_INPUTS: Final = 10_000
"""The most input-log entries :meth:`ConsoleQueries.execution` reads (the rest is
left off and ``inputs_truncated`` says so)."""

MAX_DETAIL_ROWS: Final = 500
"""The most timers, outbox rows and ledger rows the detail of one execution shows each
(newest first)."""

MAX_BUCKETS: Final = 1_000
"""The most time buckets a count over a window may ask for."""


class BadCursor(ValueError):  # noqa: N818 - names the finding
    """A page cursor that this module did not make (or made for another list)."""


@dataclass(frozen=True, slots=True)
class Page(Generic[_T]):
    """One page of a list, newest first.

    Attributes:
        rows: the page's rows, at most the size asked for.
        next_cursor: pass it back to read the page after this one; ``None`` on the
            last page.
    """

    rows: tuple[_T, ...]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class ExecutionFilter:
    """Which executions a list shows; every field given must hold (``None``: any).

    Attributes:
        status: the execution's status.
        document: the chart's name (as saved with the chart).
        scope: a scope an address of the execution lives in.
        metadata: pairs the execution's metadata must all hold.
        created_from, created_until: ``created_at`` in ``[from, until)``.
        updated_from, updated_until: ``updated_at`` in ``[from, until)``.

    Raises:
        ValueError: a naive time, or a metadata key or value that is not a string.
    """

    status: Status | None = None
    document: str | None = None
    scope: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    created_from: datetime | None = None
    created_until: datetime | None = None
    updated_from: datetime | None = None
    updated_until: datetime | None = None

    def __post_init__(self) -> None:
        for name in ("created_from", "created_until", "updated_from", "updated_until"):
            _aware(name, getattr(self, name))
        pairs = dict(self.metadata)
        for key, value in pairs.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ValueError(f"metadata pairs are strings, not {key!r}: {value!r}")
        object.__setattr__(self, "metadata", pairs)


@dataclass(frozen=True, slots=True)
class ExecutionSummary:
    """One row of the executions list.

    Attributes:
        id: the execution id.
        status: where it is in its life.
        content_hash: its chart's content hash.
        document: its chart's name, ``None`` when the chart was saved without one.
        version: its chart's version, if saved with one.
        failure: why it failed (failed executions only).
        metadata: its metadata, as stored.
        created_at, updated_at: when it was created and last changed.
        ended_at: when it ended, if it has.
    """

    id: str
    _: KW_ONLY
    status: Status
    content_hash: str
    document: str | None
    version: str | None
    failure: str | None
    metadata: Mapping[str, str]
    created_at: datetime
    updated_at: datetime
    ended_at: datetime | None


@dataclass(frozen=True, slots=True)
class TimerView:
    """A pending durable timer (a delayed send) of an execution."""

    send_id: str
    _: KW_ONLY
    kind: str
    due_at: datetime
    payload: Mapping[str, Any]
    inserted_at: datetime


@dataclass(frozen=True, slots=True)
class AddressView:
    """An address row: which execution ``(scope, document, key)`` names.

    ``status`` is the execution's (``None`` when no such execution exists any more).
    """

    scope: str
    document: str
    key: str
    _: KW_ONLY
    execution_id: str
    inserted_at: datetime
    terminal_seen_at: datetime | None
    status: Status | None


@dataclass(frozen=True, slots=True)
class ExecutionDetail:
    """Everything the page of one execution shows.

    Attributes:
        record: the stored execution (position and outcome as stored bytes).
        chart: its chart as saved (the source is ``None`` once retired), ``None`` when
            the chart row is missing.
        timers: its pending timers, soonest first.
        outbox: the outbox rows it sent, newest first.
        ledger: the routing-ledger rows naming it, newest first.
        addresses: the addresses naming it.
        inputs: its input log, oldest first, decoded.
        inputs_truncated: whether the log is longer than :data:`MAX_INPUTS`.
    """

    record: ExecutionRecord
    _: KW_ONLY
    chart: ChartRecord | None
    timers: tuple[TimerView, ...]
    outbox: tuple[OutboxRow, ...]
    ledger: tuple[LedgerRow, ...]
    addresses: tuple[AddressView, ...]
    inputs: tuple[LoggedInput, ...]
    inputs_truncated: bool


@dataclass(frozen=True, slots=True)
class LedgerFilter:
    """Which routing-ledger rows a page shows (``None``: any).

    Attributes:
        outcome: the row's outcome (``delivered``, ``created``, ``unmatched``, ...).
        binding_id: the binding that wrote it.
        since, until: ``inserted_at`` in ``[since, until)``.

    Raises:
        ValueError: a naive time.
    """

    outcome: str | None = None
    binding_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def __post_init__(self) -> None:
        _aware("since", self.since)
        _aware("until", self.until)


@dataclass(frozen=True, slots=True)
class BucketCount:
    """How many ledger rows one binding wrote with one outcome in one time bucket."""

    binding_id: str
    _: KW_ONLY
    bucket: datetime
    outcome: str
    count: int


@dataclass(frozen=True, slots=True)
class ConsumerDeadLetter:
    """A message a stream consumer gave up on (the ``consumer_dead_letters`` row)."""

    id: Any
    _: KW_ONLY
    source: str
    partition: str
    position: int
    message_id: str | None
    reason: str
    raw: bytes
    dead_at: datetime


@dataclass(frozen=True, slots=True)
class ProjectionView:
    """What scriba's tables say of one projection.

    Attributes:
        name, version: the projection.
        generation: its fencing generation (raised by each claim); ``None`` if never
            claimed.
        claimed_at: when a reader last claimed it.
        watermark: the position every event at or below is accounted for.
        watermark_at: the time of the event at the watermark.
        lag: ``now - watermark_at`` when both are known.
        dead_letters: how many dead letters it has.
        status: ``"dead_letters"`` when it has any, ``"unclaimed"`` when no reader
            ever claimed it, else ``"running"`` (what the tables can tell; a reader's
            halted state lives in its process).
    """

    name: str
    version: int
    _: KW_ONLY
    generation: int | None
    claimed_at: datetime | None
    watermark: int | None
    watermark_at: datetime | None
    lag: timedelta | None
    dead_letters: int
    status: str


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """A cheap summary that changes when what the lists show changes: the newest time
    in each table the console lists (``None`` for an empty table). Two equal
    fingerprints mean nothing listed was written in between (deletes aside)."""

    executions: datetime | None
    ledger: datetime | None
    outbox_dead: datetime | None
    consumer_dead: datetime | None
    audit: datetime | None


def _aware(name: str, value: datetime | None) -> None:
    if value is not None and (value.tzinfo is None or value.utcoffset() is None):
        raise ValueError(f"{name} must be a timezone-aware time, not {value!r}")


class ConsoleQueries:
    """The console's reads over one database.

    Args:
        engine: an :class:`~sqlalchemy.ext.asyncio.AsyncEngine` (PostgreSQL) or a
            synchronous :class:`~sqlalchemy.Engine` (SQLite); the caller's to dispose
            unless made by :meth:`open`.
        tables: the tables the migrations built.
        scriba: scriba's tables, when the database holds projections.
        clock: what "now" is (for lag); aware UTC.

    Every method is a short read of its own; none writes. Raises what the driver
    raises (``sqlalchemy.exc.DBAPIError``) when the database fails.
    """

    def __init__(
        self,
        engine: sa.Engine | AsyncEngine,
        tables: Tables,
        *,
        scriba: ScribaTables | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.engine = engine
        self.tables = tables
        self.scriba = scriba
        self._clock = clock
        self._owned = False

    @classmethod
    def open(
        cls, url: str, tables: Tables | None = None, *, scriba: ScribaTables | None = None
    ) -> ConsoleQueries:
        """Queries over a database URL (PostgreSQL or SQLite), on an engine of their
        own, disposed by :meth:`close` (or ``async with``).

        Raises:
            ValueError: a database other than PostgreSQL or SQLite.
        """
        parsed = database_url(url)
        engine: sa.Engine | AsyncEngine
        if parsed.get_backend_name() == "sqlite":
            engine = sqlite_engine(parsed)
        else:
            engine = create_async_engine(parsed, pool_size=5)
        queries = cls(engine, Tables.define() if tables is None else tables, scriba=scriba)
        queries._owned = True
        return queries

    async def close(self) -> None:
        """Dispose the engine when :meth:`open` made it."""
        if not self._owned:
            return
        if isinstance(self.engine, AsyncEngine):
            await self.engine.dispose()
        else:
            self.engine.dispose()

    async def __aenter__(self) -> ConsoleQueries:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.close()

    # -- executions ---------------------------------------------------------------

    async def executions(
        self,
        where: ExecutionFilter = ExecutionFilter(),
        *,
        cursor: str | None = None,
        size: int = DEFAULT_PAGE,
    ) -> Page[ExecutionSummary]:
        """A page of executions, newest created first (ties by id, descending).

        Raises:
            BadCursor: ``cursor`` is not one this list made.
            ValueError: ``size`` outside ``1..MAX_PAGE``.
        """
        raise NotImplementedError

    async def failed(
        self, *, cursor: str | None = None, size: int = DEFAULT_PAGE
    ) -> Page[ExecutionSummary]:
        """Failed executions, newest first, with their reasons (``failure``)."""
        return await self.executions(
            ExecutionFilter(status=Status.FAILED), cursor=cursor, size=size
        )

    async def execution(self, execution_id: str) -> ExecutionDetail | None:
        """One execution with its chart, timers, outbox rows, ledger rows, addresses
        and input log; ``None`` when there is no such execution."""
        raise NotImplementedError

    # -- routing ------------------------------------------------------------------

    async def ledger(
        self,
        where: LedgerFilter = LedgerFilter(),
        *,
        cursor: str | None = None,
        size: int = DEFAULT_PAGE,
    ) -> Page[LedgerRow]:
        """A page of routing-ledger rows, newest first.

        Raises:
            BadCursor: ``cursor`` is not one this list made.
            ValueError: ``size`` outside ``1..MAX_PAGE``.
        """
        raise NotImplementedError

    async def ledger_counts(
        self, since: datetime, until: datetime, bucket: timedelta
    ) -> list[BucketCount]:
        """Ledger rows per binding, outcome and time bucket over ``[since, until)``;
        buckets start at ``since`` and are ``bucket`` long; empty buckets are left out.
        Ordered by binding, bucket, outcome.

        Raises:
            ValueError: naive times, ``until <= since``, a bucket under one second or
                more than :data:`MAX_BUCKETS` buckets.
        """
        raise NotImplementedError

    async def addresses(self, key: str, *, scope: str | None = None) -> list[AddressView]:
        """The addresses of ``key`` in every document (of ``scope``, if given), oldest
        first."""
        raise NotImplementedError

    # -- failures -----------------------------------------------------------------

    async def outbox_dead_letters(
        self, *, cursor: str | None = None, size: int = DEFAULT_PAGE
    ) -> Page[OutboxRow]:
        """Outbox rows the drain gave up on, newest first."""
        raise NotImplementedError

    async def consumer_dead_letters(
        self, *, cursor: str | None = None, size: int = DEFAULT_PAGE
    ) -> Page[ConsumerDeadLetter]:
        """Messages the stream consumers gave up on, newest first."""
        raise NotImplementedError

    async def projections(self) -> list[ProjectionView]:
        """scriba's projections (empty without ``scriba`` tables), by name and
        version."""
        raise NotImplementedError

    # -- live ---------------------------------------------------------------------

    async def fingerprint(self) -> Fingerprint:
        """The newest write time of each listed table, in one cheap statement (each
        a ``max`` an index answers)."""
        raise NotImplementedError

    async def execution_fingerprint(self, execution_id: str) -> tuple[datetime, int] | None:
        """``(updated_at, input count)`` of one execution, ``None`` if there is none: it
        changes with every step, cancel or failure."""
        raise NotImplementedError
