"""The console's read side: what its pages show, read from the tables of durable
executions, of the router, of the fronts and of scriba.

:class:`ConsoleQueries` runs short read-only statements (SQLAlchemy Core) over an
engine: an :class:`~sqlalchemy.ext.asyncio.AsyncEngine` on PostgreSQL, a synchronous
:class:`~sqlalchemy.Engine` on SQLite (the engine :class:`~statifier.persistence.sql.SqlAdapter`
holds, or one of :meth:`ConsoleQueries.open`). Every answer is a frozen value.

Lists are pages in keyset order, newest first, with an opaque cursor for the next page
(:class:`Page`); a page holds at most :data:`MAX_PAGE` rows. The indexes the pages walk
are built by the migrations ``statifier_0006``, ``statifier_0007`` and
``statifier_0008`` (see ``docs/decisions/0083`` and ``0093``).

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

import base64
import binascii
import json
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any, Final, Generic, TypeVar

from scriba.sql.tables import Tables as ScribaTables
from statifier.core.positions import NotAPosition, load_event
from statifier.extras import MissingExtra
from statifier.persistence import PLAIN, BlobCodec, LoggedInput, StepError, UndecodableBlob
from statifier.persistence.codec import PlainBlobs, opened_json, opened_text
from statifier.persistence.executions import logged_input
from statifier.persistence.records import ChartRecord, ErrorRecord, ExecutionRecord, Status
from statifier.persistence.step_errors import decode_error
from statifier.router import LedgerRow, OutboxRow
from statifier.sql.engines import dialect_of, dispose, open_engine, run_on
from statifier.sql.tables import Tables, UtcDateTime

try:
    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import AsyncEngine
except ModuleNotFoundError as missing:  # SQLAlchemy: the sqlite extra
    raise MissingExtra.of(missing) from missing

__all__ = [
    "DEFAULT_PAGE",
    "MAX_BUCKETS",
    "MAX_DETAIL_ROWS",
    "MAX_INPUTS",
    "MAX_PAGE",
    "MAX_SEARCH",
    "MAX_STEP_KEYS",
    "QUERY_FIELDS",
    "AddressView",
    "BadCursor",
    "BadFilter",
    "BucketCount",
    "ConsoleQueries",
    "ConsumerDeadLetter",
    "ErrorView",
    "ExecutionDetail",
    "ExecutionFilter",
    "ExecutionSummary",
    "Fingerprint",
    "HeldView",
    "LedgerFilter",
    "Page",
    "ProjectionView",
    "RevisionView",
    "StepRows",
    "TimerView",
    "decode_cursor",
    "encode_cursor",
    "filter_from_query",
    "filter_query",
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
"""The most timers, outbox rows, ledger rows and errors the detail of one execution
shows each (newest first)."""

MAX_STEP_KEYS: Final = 1_000
"""The most send keys :meth:`ConsoleQueries.step_rows` looks up at once."""

MAX_SEARCH: Final = 500
"""The most characters of a document, scope, address key, final state or error name
an :class:`ExecutionFilter` searches for."""

_log = logging.getLogger("statifier.console")

MAX_BUCKETS: Final = 1_000
"""The most time buckets a count over a window may ask for."""


class BadCursor(ValueError):  # noqa: N818 - names the finding
    """A page cursor that this module did not make (or made for another list)."""


class BadFilter(ValueError):  # noqa: N818 - names the finding
    """A search text an :class:`ExecutionFilter` refuses: empty, longer than
    :data:`MAX_SEARCH` characters, or holding a NUL character."""


QUERY_FIELDS: Final = (
    "status",
    "document",
    "scope",
    "meta",
    "created_from",
    "created_until",
    "updated_from",
    "updated_until",
    "errors",
    "key",
    "final",
    "error",
)
"""The executions list's query fields, as :func:`filter_from_query` reads them."""


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
        errors: only executions whose steps raised error events; the list is then
            ordered by the newest error (``last_error_at``), not by creation.
        key: an address key: only executions one of whose addresses has this key
            (exactly), in ``scope`` when that is given too (the same address).
            ``document`` stays the chart's name, which need not be the address's.
        final_state: only executions that ended in the top-level ``<final>`` of this
            id (exactly), as their records file it (an execution that ended before
            records kept a final state is not found by it).
        error: an error event's name (exactly, e.g. ``error.execution``): only
            executions one of whose stored step errors has it. The messages are not
            searched: they are stored through the storage's codec, which may encrypt
            them.

    Raises:
        ValueError: a naive time, or a metadata key or value that is not a string.
        BadFilter: (a ``ValueError``) a document, scope, key, final state or error
            that is empty, longer than :data:`MAX_SEARCH` characters or holds a NUL
            character.

    >>> ExecutionFilter(key="order-7", final_state="shipped").key
    'order-7'
    >>> ExecutionFilter(error="x" * (MAX_SEARCH + 1))
    Traceback (most recent call last):
    ...
    statifier.console.queries.BadFilter: error: at most 500 characters, not 501
    """

    status: Status | None = None
    document: str | None = None
    scope: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    created_from: datetime | None = None
    created_until: datetime | None = None
    updated_from: datetime | None = None
    updated_until: datetime | None = None
    errors: bool = False
    key: str | None = None
    final_state: str | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        for name in ("created_from", "created_until", "updated_from", "updated_until"):
            _aware(name, getattr(self, name))
        for name in ("document", "scope", "key", "final_state", "error"):
            _searchable(name, getattr(self, name))
        pairs: list[tuple[object, object]] = list(self.metadata.items())
        for key, value in pairs:
            if not isinstance(key, str) or not isinstance(value, str):
                raise ValueError(f"metadata pairs are strings, not {key!r}: {value!r}")
        object.__setattr__(self, "metadata", dict(self.metadata))


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
        error_count: how many error events its steps raised, all told.
        last_error_at: when a step last raised one (``None``: never).
        final_state: the top-level ``<final>`` a completed execution ended in, as its
            record files it.
        final_position: the stored position (decoded) of a completed execution whose
            record files no final state (it ended before records kept one), to read it
            from; ``None`` otherwise, and once pruned.
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
    error_count: int = 0
    last_error_at: datetime | None = None
    final_state: str | None = None
    final_position: bytes | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class TimerView:
    """A pending durable timer (a delayed send) of an execution.

    ``key`` is the send's idempotency key (the row's ``dedup_key``), which names the
    step that made it; ``event`` the name of the event it delivers (``None`` when the
    payload does not say)."""

    send_id: str
    _: KW_ONLY
    kind: str
    due_at: datetime
    payload: Mapping[str, Any]
    inserted_at: datetime
    key: str = ""
    event: str | None = None


@dataclass(frozen=True, slots=True)
class HeldView:
    """An event held for a paused execution (a ``held_events`` row), stepped in on
    resume in the order they came.

    ``event`` is the event's name (``None`` when its blob cannot be read here: sealed
    under a key this process lacks, say); ``via`` how it came (``step``, ``timer``);
    ``message_id`` the message it came as (``None`` for a timer's)."""

    id: Any
    _: KW_ONLY
    via: str
    event: str | None
    message_id: str | None
    held_at: datetime


@dataclass(frozen=True, slots=True)
class ErrorView:
    """An error event a step raised, as stored (a ``step_errors`` row).

    Attributes:
        execution_id: the execution whose step raised it.
        id: the row's key.
        error: what it said, with the step it belongs to (``via``, ``seq``,
            ``recorded_at``).
        unreadable: why what it said could not be decoded (its detail is then empty),
            ``None`` when it could.
    """

    execution_id: str
    _: KW_ONLY
    id: Any
    error: StepError
    unreadable: str | None = None


@dataclass(frozen=True, slots=True)
class StepRows:
    """The rows the sends of some steps made, by send key (see
    :meth:`ConsoleQueries.step_rows`).

    Attributes:
        timers: pending timer rows, by their ``dedup_key``.
        outbox: outbox rows of the execution, by their ``key``.
        refused: the execution's ``send_refused`` ledger rows, by their ``message_id``.
    """

    timers: Mapping[str, TimerView]
    outbox: Mapping[str, OutboxRow]
    refused: Mapping[str, LedgerRow]


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
class RevisionView:
    """A chart the store holds: ``content_hash`` is the revision's identity."""

    content_hash: str
    name: str | None
    version: str | None
    saved_at: datetime


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
        errors: the error events its steps raised, newest first (at most
            :data:`MAX_DETAIL_ROWS`; ``record.error_count`` counts them all, including
            those a step raised beyond the most it stores).
        held: the events held for it while paused, oldest first (at most
            :data:`MAX_DETAIL_ROWS`).
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
    errors: tuple[ErrorView, ...] = ()
    held: tuple[HeldView, ...] = ()

    def step_rows(self, keys: Iterable[str]) -> StepRows | None:
        """The rows of the sends with these ``keys`` among the rows this detail holds,
        or ``None`` when it may not hold them all (a list of it is at
        :data:`MAX_DETAIL_ROWS`): then :meth:`ConsoleQueries.step_rows` looks them up."""
        if max(len(self.timers), len(self.outbox), len(self.ledger)) >= MAX_DETAIL_ROWS:
            return None
        wanted = set(keys)
        return StepRows(
            timers={t.key: t for t in self.timers if t.key in wanted},
            outbox={row.key: row for row in self.outbox if row.key in wanted},
            refused={
                row.message_id: row
                for row in self.ledger
                if row.outcome == "send_refused" and row.message_id in wanted
            },
        )


@dataclass(frozen=True, slots=True)
class LedgerFilter:
    """Which routing-ledger rows a page shows (``None``: any).

    Attributes:
        outcome: the row's outcome (``delivered``, ``created_and_delivered``,
            ``dropped``, ...).
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
            ever claimed it, else ``"claimed"``: what the tables can tell (a claim is
            never given back, so it does not say the reader still runs; the lag does;
            a reader's halted state lives in its process).
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
    fingerprints mean nothing listed was written in between, but for deletes and for
    an execution parked or put back on its chart (``needs_migration``), which writes
    no time these read.

    Attributes:
        executions: the newest time an execution was created, took an input or ended.
        ledger: the newest routing-ledger row.
        outbox_dead, consumer_dead: the newest dead letter of each kind.
        audit: the newest recorded action.
        errors: the newest error event a step raised.
    """

    executions: datetime | None
    ledger: datetime | None
    outbox_dead: datetime | None
    consumer_dead: datetime | None
    audit: datetime | None
    errors: datetime | None = None


def _aware(name: str, value: datetime | None) -> None:
    if value is not None and (value.tzinfo is None or value.utcoffset() is None):
        raise ValueError(f"{name} must be a timezone-aware time, not {value!r}")


def _searchable(name: str, text: str | None) -> None:
    """Refuse a search text no stored value can be (and PostgreSQL would refuse)."""
    if text is None:
        return
    if not text:
        raise BadFilter(f"{name}: a non-empty text, or None for any")
    if len(text) > MAX_SEARCH:
        raise BadFilter(f"{name}: at most {MAX_SEARCH} characters, not {len(text)}")
    if "\x00" in text:
        raise BadFilter(f"{name}: a NUL character is never stored")


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
        codec: BlobCodec = PLAIN,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.engine = engine
        self.tables = tables
        self.scriba = scriba
        self.codec = codec
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
        engine = open_engine(url, pool_size=5)
        queries = cls(engine, Tables.define() if tables is None else tables, scriba=scriba)
        queries._owned = True
        return queries

    async def close(self) -> None:
        """Dispose the engine when :meth:`open` made it."""
        if not self._owned:
            return
        await dispose(self.engine)

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
        among: Collection[Status] = (),
        off_revision: str | None = None,
        dead_letters: bool = False,
    ) -> Page[ExecutionSummary]:
        """A page of executions, newest created first (ties by id, descending); with
        ``where.errors``, those whose steps raised errors, newest error first.
        ``among``, ``off_revision`` and ``dead_letters`` narrow it as :meth:`count`'s
        do, so that a bulk run walks what its preview counted.

        Raises:
            BadCursor: ``cursor`` is not one this list made.
            ValueError: ``size`` outside ``1..MAX_PAGE``.
        """
        _check_size(size)
        e, charts = self.tables.executions, self.tables.charts
        # The errors filter walks executions_last_error_at_idx, the others
        # (created_at, execution_id): a cursor is one list's or the other's.
        kind = "errors" if where.errors else "executions"
        moment = e.c.last_error_at if where.errors else e.c.created_at
        after = None if cursor is None else decode_cursor(cursor, kind)
        completed = e.c.status == Status.COMPLETED.value
        statement = (
            sa.select(
                e.c.execution_id,
                e.c.status,
                e.c.content_hash,
                charts.c.name,
                charts.c.version,
                e.c.failure,
                e.c.metadata,
                e.c.created_at,
                e.c.updated_at,
                e.c.ended_at,
                e.c.error_count,
                e.c.last_error_at,
                e.c.final_state,
                # The position only of a completed execution whose record files no final
                # state (one that ended before records kept it): it is read off there.
                sa.case(
                    (sa.and_(completed, e.c.final_state.is_(None)), e.c.position_blob),
                    else_=sa.null(),
                ).label("final_position"),
            )
            .select_from(e.outerjoin(charts, charts.c.content_hash == e.c.content_hash))
            .where(*self._selection(where, among, off_revision, dead_letters))
            .order_by(moment.desc(), e.c.execution_id.desc())
            .limit(size + 1)
        )
        if after is not None:
            at, last_id = after
            bound, key = sa.literal(at, UtcDateTime()), sa.literal(last_id, sa.Text())
            if where.errors:
                # The same order as the row comparison, spelled so that PostgreSQL walks
                # the index of last_error_at alone backwards from the bound and stops
                # after a page (a row comparison there makes it read every older row).
                after_it = sa.and_(moment <= bound, sa.or_(moment < bound, e.c.execution_id < key))
            else:
                after_it = sa.tuple_(moment, e.c.execution_id) < sa.tuple_(bound, key)
            statement = statement.where(after_it)
        codec = self.codec

        def read(connection: sa.Connection) -> list[sa.Row[Any]]:
            return list(connection.execute(statement))

        rows = await run_on(self.engine, read)
        summaries = tuple(_summary(row, codec) for row in rows[:size])
        next_cursor = None
        if len(rows) > size:
            last = summaries[-1]
            newest = last.last_error_at if where.errors else last.created_at
            assert newest is not None  # the errors filter lists only executions with one
            next_cursor = encode_cursor(kind, newest, last.id)
        return Page(summaries, next_cursor)

    async def count(
        self,
        where: ExecutionFilter = ExecutionFilter(),
        *,
        among: Collection[Status] = (),
        off_revision: str | None = None,
        dead_letters: bool = False,
    ) -> int:
        """How many executions ``where`` selects (the list's filter) and, given
        ``among``, whose status is one of those; given ``off_revision`` (a content
        hash), that run another chart; with ``dead_letters``, that sent an outbox row
        now dead.

        Raises:
            sqlalchemy.exc.DBAPIError: the database failed.
        """
        statement = sa.select(sa.func.count()).select_from(self.tables.executions)
        statement = statement.where(*self._selection(where, among, off_revision, dead_letters))

        def read(connection: sa.Connection) -> int:
            return int(connection.execute(statement).scalar_one())

        return await run_on(self.engine, read)

    def _selection(
        self,
        where: ExecutionFilter,
        among: Collection[Status],
        off_revision: str | None,
        dead_letters: bool,
    ) -> list[sa.ColumnElement[bool]]:
        e = self.tables.executions
        conditions = self._execution_conditions(where)
        if among:
            conditions.append(e.c.status.in_([status.value for status in among]))
        if off_revision is not None:
            conditions.append(e.c.content_hash != off_revision)
        if dead_letters:
            outbox = self.tables.outbox
            dead = sa.select(outbox.c.execution_id).where(outbox.c.dead_at.is_not(None))
            conditions.append(e.c.execution_id.in_(dead))
        return conditions

    async def revisions(self, document: str | None = None) -> list[RevisionView]:
        """The charts the store holds and has not retired, newest saved first (at most
        :data:`MAX_PAGE`), those named ``document`` when it is given: the revisions an
        execution can be migrated to.

        Raises:
            sqlalchemy.exc.DBAPIError: the database failed.
        """
        charts = self.tables.charts
        statement = (
            sa.select(charts.c.content_hash, charts.c.name, charts.c.version, charts.c.saved_at)
            .where(charts.c.retired_at.is_(None))
            .order_by(charts.c.saved_at.desc(), charts.c.content_hash)
            .limit(MAX_PAGE)
        )
        if document is not None:
            statement = statement.where(charts.c.name == document)

        def read(connection: sa.Connection) -> list[RevisionView]:
            return [
                RevisionView(row.content_hash, row.name, row.version, row.saved_at)
                for row in connection.execute(statement)
            ]

        return await run_on(self.engine, read)

    def _execution_conditions(self, where: ExecutionFilter) -> list[sa.ColumnElement[bool]]:
        e = self.tables.executions
        conditions: list[sa.ColumnElement[bool]] = []
        if where.status is not None:
            conditions.append(e.c.status == where.status.value)
        if where.document is not None:
            named = self.tables.charts.alias("named")
            conditions.append(
                e.c.content_hash.in_(
                    sa.select(named.c.content_hash).where(named.c.name == where.document)
                )
            )
        conditions.extend(self._address_conditions(where))
        if where.final_state is not None:
            conditions.append(e.c.final_state == where.final_state)
        if where.error is not None:
            errors = self.tables.step_errors
            raised = sa.select(errors.c.execution_id).where(errors.c.name == where.error)
            conditions.append(e.c.execution_id.in_(raised))
        if where.metadata:
            conditions.extend(self._metadata_conditions(where.metadata))
        bounds = (
            (e.c.created_at, where.created_from, where.created_until),
            (e.c.updated_at, where.updated_from, where.updated_until),
        )
        for column, low, high in bounds:
            if low is not None:
                conditions.append(column >= low)
            if high is not None:
                conditions.append(column < high)
        if where.errors:
            conditions.append(e.c.last_error_at.is_not(None))
        return conditions

    def _address_conditions(self, where: ExecutionFilter) -> list[sa.ColumnElement[bool]]:
        """The scope and key of one address of the execution (``addresses_key_idx``
        finds a key's few rows; a scope alone is read through the unique
        ``(scope, document, key)`` index)."""
        a = self.tables.addresses
        matches: list[sa.ColumnElement[bool]] = []
        if where.key is not None:
            matches.append(a.c.key == where.key)
        if where.scope is not None:
            matches.append(a.c.scope == where.scope)
        if not matches:
            return []
        e = self.tables.executions
        return [e.c.execution_id.in_(sa.select(a.c.execution_id).where(*matches))]

    def _metadata_conditions(self, pairs: Mapping[str, str]) -> list[sa.ColumnElement[bool]]:
        e = self.tables.executions
        return dialect_of(self.engine).json_has(e.c.metadata, pairs)

    async def failed(
        self, *, cursor: str | None = None, size: int = DEFAULT_PAGE
    ) -> Page[ExecutionSummary]:
        """Failed executions, newest first, with their reasons (``failure``).

        Raises:
            BadCursor: ``cursor`` is not one this list made.
            ValueError: ``size`` outside ``1..MAX_PAGE``.
        """
        failed = ExecutionFilter(status=Status.FAILED)
        return await self.executions(failed, cursor=cursor, size=size)

    async def execution(self, execution_id: str) -> ExecutionDetail | None:
        """One execution with its chart, timers, outbox rows, ledger rows, addresses,
        input log and errors (all read in one transaction); ``None`` when there is no
        such execution. An error whose detail cannot be decoded is shown as unreadable
        (and logged), not refused.

        Raises:
            statifier.core.NotAPosition: an input log entry that is not a stored event.
            UndecodableBlob: a blob the queries' codec cannot decode.
        """
        t, codec = self.tables, self.codec

        def read(connection: sa.Connection) -> ExecutionDetail | None:
            row = connection.execute(
                sa.select(t.executions).where(t.executions.c.execution_id == execution_id)
            ).first()
            if row is None:
                return None
            record = _record(row, codec)
            chart_row = connection.execute(
                sa.select(t.charts).where(t.charts.c.content_hash == record.content_hash)
            ).first()
            timers = connection.execute(
                sa.select(t.timers)
                .where(t.timers.c.execution_id == execution_id)
                .order_by(t.timers.c.due_at, t.timers.c.id)
                .limit(MAX_DETAIL_ROWS)
            )
            outbox = connection.execute(
                sa.select(t.outbox)
                .where(t.outbox.c.execution_id == execution_id)
                .order_by(t.outbox.c.inserted_at.desc(), t.outbox.c.id.desc())
                .limit(MAX_DETAIL_ROWS)
            )
            ledger = connection.execute(
                sa.select(t.routing_ledger)
                .where(t.routing_ledger.c.execution_id == execution_id)
                .order_by(t.routing_ledger.c.inserted_at.desc(), t.routing_ledger.c.id.desc())
                .limit(MAX_DETAIL_ROWS)
            )
            inputs = list(
                connection.execute(
                    sa.select(t.inputs)
                    .where(t.inputs.c.execution_id == execution_id)
                    .order_by(t.inputs.c.seq)
                    .limit(MAX_INPUTS + 1)
                )
            )
            errors = connection.execute(
                sa.select(t.step_errors)
                .where(t.step_errors.c.execution_id == execution_id)
                .order_by(t.step_errors.c.id.desc())
                .limit(MAX_DETAIL_ROWS)
            )
            held = connection.execute(
                sa.select(t.held_events)
                .where(t.held_events.c.execution_id == execution_id)
                .order_by(t.held_events.c.seq)
                .limit(MAX_DETAIL_ROWS)
            )
            return ExecutionDetail(
                record,
                chart=None if chart_row is None else _chart(chart_row, codec),
                timers=tuple(_timer(r, codec) for r in timers),
                outbox=tuple(_outbox(r, codec) for r in outbox),
                ledger=tuple(_ledger(r) for r in ledger),
                addresses=tuple(
                    _address(r)
                    for r in connection.execute(
                        self._addresses().where(t.addresses.c.execution_id == execution_id)
                    )
                ),
                inputs=tuple(_input(r, codec) for r in inputs[:MAX_INPUTS]),
                inputs_truncated=len(inputs) > MAX_INPUTS,
                errors=tuple(_error(r, codec) for r in errors),
                held=tuple(_held(r, codec) for r in held),
            )

        return await run_on(self.engine, read)

    async def step_rows(self, execution_id: str, keys: Sequence[str]) -> StepRows:
        """The rows the sends with these idempotency ``keys`` made (the keys a replay
        computes, :attr:`statifier.console.replay.StepSend.key`): pending timer rows
        (by the unique ``dedup_key``), the execution's outbox rows and its refused
        sends' ledger rows (by its ``execution_id`` index), in one transaction.

        Raises:
            ValueError: more than :data:`MAX_STEP_KEYS` keys.
            UndecodableBlob: a timer payload or outbox event the codec cannot decode.
        """
        wanted = sorted(set(keys))
        if len(wanted) > MAX_STEP_KEYS:
            raise ValueError(f"at most {MAX_STEP_KEYS} send keys at once, not {len(wanted)}")
        if not wanted:
            return StepRows({}, {}, {})
        t, codec = self.tables, self.codec
        timers = sa.select(t.timers).where(
            t.timers.c.dedup_key.in_(sa.bindparam("keys", expanding=True))
        )
        outbox = sa.select(t.outbox).where(
            t.outbox.c.execution_id == execution_id,
            t.outbox.c.key.in_(sa.bindparam("keys", expanding=True)),
        )
        ledger = t.routing_ledger
        refused = sa.select(ledger).where(
            ledger.c.execution_id == execution_id,
            ledger.c.outcome == "send_refused",
            ledger.c.message_id.in_(sa.bindparam("keys", expanding=True)),
        )

        def read(connection: sa.Connection) -> StepRows:
            bound = {"keys": wanted}
            return StepRows(
                timers={
                    row.dedup_key: _timer(row, codec)
                    for row in connection.execute(timers, bound)
                    if row.execution_id == execution_id
                },
                outbox={row.key: _outbox(row, codec) for row in connection.execute(outbox, bound)},
                refused={
                    row.message_id: _ledger(row) for row in connection.execute(refused, bound)
                },
            )

        return await run_on(self.engine, read)

    # -- routing ------------------------------------------------------------------

    async def ledger(
        self,
        where: LedgerFilter = LedgerFilter(),
        *,
        cursor: str | None = None,
        size: int = DEFAULT_PAGE,
    ) -> Page[LedgerRow]:
        """A page of routing-ledger rows, newest first (ties by key, descending).

        Raises:
            BadCursor: ``cursor`` is not one this list made.
            ValueError: ``size`` outside ``1..MAX_PAGE``.
        """
        _check_size(size)
        ledger = self.tables.routing_ledger
        conditions: list[sa.ColumnElement[bool]] = []
        if where.outcome is not None:
            conditions.append(ledger.c.outcome == where.outcome)
        if where.binding_id is not None:
            conditions.append(ledger.c.binding_id == where.binding_id)
        if where.since is not None:
            conditions.append(ledger.c.inserted_at >= where.since)
        if where.until is not None:
            conditions.append(ledger.c.inserted_at < where.until)
        rows = await self._keyset(ledger, ledger.c.inserted_at, "ledger", conditions, cursor, size)
        return _paged(rows, size, "ledger", "inserted_at", _ledger)

    async def ledger_counts(
        self, since: datetime, until: datetime, bucket: timedelta
    ) -> list[BucketCount]:
        """Ledger rows per binding, outcome and time bucket over ``[since, until)``;
        empty buckets are left out. Buckets are ``bucket`` long (whole seconds) and
        start at ``since`` truncated to the second; a row falls in the bucket of its
        time truncated to the second. Ordered by binding, bucket, outcome.

        Raises:
            ValueError: naive times, ``until <= since``, a bucket that is not a whole
                number of seconds (at least one), or more than :data:`MAX_BUCKETS`
                buckets.
        """
        _aware("since", since)
        _aware("until", until)
        seconds = bucket.total_seconds()
        if seconds < 1 or seconds != int(seconds):
            raise ValueError(f"a bucket is a whole number of seconds, not {bucket!r}")
        if until <= since:
            raise ValueError(f"until ({until}) must come after since ({since})")
        if (until - since) / bucket > MAX_BUCKETS:
            raise ValueError(f"at most {MAX_BUCKETS} buckets; {until - since} / {bucket} is more")
        width = int(seconds)
        start = int(since.timestamp() // 1)
        ledger = self.tables.routing_ledger
        index = dialect_of(self.engine).bucket(ledger.c.inserted_at, start, width)
        number = index.label("bucket")
        statement = (
            sa.select(ledger.c.binding_id, number, ledger.c.outcome, sa.func.count())
            .where(ledger.c.inserted_at >= since, ledger.c.inserted_at < until)
            .group_by(ledger.c.binding_id, number, ledger.c.outcome)
        )  # ordered here, not by the database: so it may group by hashing, not sorting

        def read(connection: sa.Connection) -> list[tuple[Any, ...]]:
            return [tuple(row) for row in connection.execute(statement)]

        origin = datetime.fromtimestamp(start, UTC)
        return [
            BucketCount(
                str(row[0]),
                bucket=origin + timedelta(seconds=int(row[1]) * width),
                outcome=str(row[2]),
                count=int(row[3]),
            )
            for row in sorted(await run_on(self.engine, read), key=lambda r: (r[0], r[1], r[2]))
        ]

    def _addresses(self) -> sa.Select[Any]:
        a, e = self.tables.addresses, self.tables.executions
        return (
            sa.select(
                a.c.scope,
                a.c.document,
                a.c.key,
                a.c.execution_id,
                a.c.inserted_at,
                a.c.terminal_seen_at,
                e.c.status,
            )
            .select_from(a.outerjoin(e, e.c.execution_id == a.c.execution_id))
            .order_by(a.c.inserted_at, a.c.id)
        )

    async def addresses(self, key: str, *, scope: str | None = None) -> list[AddressView]:
        """The addresses of ``key`` in every document (of ``scope``, if given), oldest
        first, each with its execution's status."""
        a = self.tables.addresses
        statement = self._addresses().where(a.c.key == key)
        if scope is not None:
            statement = statement.where(a.c.scope == scope)

        def read(connection: sa.Connection) -> list[AddressView]:
            return [_address(row) for row in connection.execute(statement)]

        return await run_on(self.engine, read)

    # -- failures -----------------------------------------------------------------

    async def outbox_dead_letters(
        self, *, cursor: str | None = None, size: int = DEFAULT_PAGE
    ) -> Page[OutboxRow]:
        """Outbox rows the drain gave up on, newest first.

        Raises:
            BadCursor: ``cursor`` is not one this list made.
            ValueError: ``size`` outside ``1..MAX_PAGE``.
        """
        _check_size(size)
        outbox, codec = self.tables.outbox, self.codec
        dead = [outbox.c.dead_at.is_not(None)]
        rows = await self._keyset(outbox, outbox.c.dead_at, "outbox", dead, cursor, size)
        return _paged(rows, size, "outbox", "dead_at", lambda row: _outbox(row, codec))

    async def chart_errors(
        self, *, cursor: str | None = None, size: int = DEFAULT_PAGE
    ) -> Page[ErrorView]:
        """The error events steps raised, across executions, newest first (by
        ``(recorded_at, id)``). An error whose detail cannot be decoded is listed as
        unreadable (and logged), not refused.

        Raises:
            BadCursor: ``cursor`` is not one this list made.
            ValueError: ``size`` outside ``1..MAX_PAGE``.
        """
        _check_size(size)
        errors, codec = self.tables.step_errors, self.codec
        rows = await self._keyset(errors, errors.c.recorded_at, "errors", [], cursor, size)
        return _paged(rows, size, "errors", "recorded_at", lambda row: _error(row, codec))

    async def consumer_dead_letters(
        self, *, cursor: str | None = None, size: int = DEFAULT_PAGE
    ) -> Page[ConsumerDeadLetter]:
        """Messages the stream consumers gave up on, newest first.

        Raises:
            BadCursor: ``cursor`` is not one this list made.
            ValueError: ``size`` outside ``1..MAX_PAGE``.
        """
        _check_size(size)
        letters, codec = self.tables.consumer_dead_letters, self.codec
        rows = await self._keyset(letters, letters.c.dead_at, "consumer", [], cursor, size)
        return _paged(rows, size, "consumer", "dead_at", lambda row: _consumer_letter(row, codec))

    async def projections(self) -> list[ProjectionView]:
        """scriba's projections (empty without ``scriba`` tables), by name and
        version: every projection any of its tables names."""
        scriba = self.scriba
        if scriba is None:
            return []
        now = self._clock()

        def read(connection: sa.Connection) -> list[ProjectionView]:
            p, w, d = scriba.projections, scriba.watermarks, scriba.dead_letters
            claims = {
                (r.projection_name, r.projection_version): r
                for r in connection.execute(sa.select(p))
            }
            marks = {
                (r.projection_name, r.projection_version): r
                for r in connection.execute(sa.select(w))
            }
            dead = {
                (r[0], r[1]): int(r[2])
                for r in connection.execute(
                    sa.select(
                        d.c.projection_name, d.c.projection_version, sa.func.count()
                    ).group_by(d.c.projection_name, d.c.projection_version)
                )
            }
            views = []
            for key in sorted({*claims, *marks, *dead}):
                claim, mark, letters = claims.get(key), marks.get(key), dead.get(key, 0)
                at = None if mark is None else mark.occurred_at
                status = "dead_letters" if letters else "unclaimed" if claim is None else "claimed"
                views.append(
                    ProjectionView(
                        str(key[0]),
                        int(key[1]),
                        generation=None if claim is None else int(claim.generation),
                        claimed_at=None if claim is None else claim.claimed_at,
                        watermark=None if mark is None else int(mark.position),
                        watermark_at=at,
                        lag=None if at is None else now - at,
                        dead_letters=letters,
                        status=status,
                    )
                )
            return views

        return await run_on(self.engine, read)

    # -- live ---------------------------------------------------------------------

    async def fingerprint(self) -> Fingerprint:
        """The newest write time of each listed table, in one cheap statement (each
        a ``max`` an index serves): executions, inputs, ledger rows, dead letters,
        audit rows and step errors."""
        t = self.tables
        # Not executions.updated_at: an index on it would change with every step's
        # update and make each one a full (not heap-only) update of the row. A step
        # logs an input, a create writes created_at, an end writes ended_at.
        newest = (
            t.executions.c.created_at,
            t.executions.c.ended_at,
            t.inputs.c.recorded_at,
            t.routing_ledger.c.inserted_at,
            t.outbox.c.dead_at,
            t.consumer_dead_letters.c.dead_at,
            t.console_audit.c.at,
            # A step that logs no input (its log closed at the cap) may still raise.
            t.step_errors.c.recorded_at,
        )
        statement = sa.select(*(sa.select(sa.func.max(c)).scalar_subquery() for c in newest))

        def read(connection: sa.Connection) -> Fingerprint:
            row = [None if v is None else _utc(v) for v in connection.execute(statement).one()]
            moved = [v for v in row[:3] if v is not None]
            return Fingerprint(
                executions=max(moved, default=None),
                ledger=row[3],
                outbox_dead=row[4],
                consumer_dead=row[5],
                audit=row[6],
                errors=row[7],
            )

        return await run_on(self.engine, read)

    async def execution_fingerprint(self, execution_id: str) -> tuple[datetime, int] | None:
        """``(updated_at, input count)`` of one execution, ``None`` if there is none: it
        changes with every step, cancel or failure."""
        e, inputs = self.tables.executions, self.tables.inputs
        count = (
            sa.select(sa.func.count())
            .select_from(inputs)
            .where(inputs.c.execution_id == execution_id)
            .scalar_subquery()
        )
        statement = sa.select(e.c.updated_at, count).where(e.c.execution_id == execution_id)

        def read(connection: sa.Connection) -> tuple[datetime, int] | None:
            row = connection.execute(statement).first()
            return None if row is None else (row[0], int(row[1]))

        return await run_on(self.engine, read)

    # -- pages by time and key ----------------------------------------------------

    async def _keyset(
        self,
        table: sa.Table,
        moment: sa.Column[Any],
        kind: str,
        conditions: Sequence[sa.ColumnElement[bool]],
        cursor: str | None,
        size: int,
    ) -> list[sa.Row[Any]]:
        """Rows of ``table`` newest first by ``(moment, id)``, after ``cursor``."""
        statement = (
            sa.select(table)
            .where(*conditions)
            .order_by(moment.desc(), table.c.id.desc())
            .limit(size + 1)
        )
        if cursor is not None:
            at, key = decode_cursor(cursor, kind)
            statement = statement.where(
                sa.tuple_(moment, table.c.id)
                < sa.tuple_(
                    sa.literal(at, UtcDateTime()), sa.literal(self._key(key), table.c.id.type)
                )
            )

        def read(connection: sa.Connection) -> list[sa.Row[Any]]:
            return list(connection.execute(statement))

        return await run_on(self.engine, read)

    def _key(self, text: str) -> Any:
        """A key as the cursor carried it, back in the key type."""
        try:
            return self.tables.options.key_from_text(text)
        except ValueError:
            raise BadCursor(f"not a cursor of this list: a bad key {text!r}") from None


# -- running reads ----------------------------------------------------------------


# -- cursors ----------------------------------------------------------------------


def encode_cursor(kind: str, moment: datetime, key: Any) -> str:
    """An opaque cursor for the list ``kind``: the last row's time and key.

    >>> cursor = encode_cursor("ledger", datetime(2026, 1, 1, tzinfo=UTC), 42)
    >>> decode_cursor(cursor, "ledger")
    (datetime.datetime(2026, 1, 1, 0, 0, tzinfo=datetime.timezone.utc), '42')
    >>> decode_cursor(cursor, "executions")
    Traceback (most recent call last):
    ...
    statifier.console.queries.BadCursor: not a cursor of this list
    """
    text = json.dumps([kind, _utc(moment).isoformat(), str(key)], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def filter_from_query(fields: Mapping[str, str]) -> ExecutionFilter:
    """The filter the executions list's query ``fields`` (:data:`QUERY_FIELDS`, each
    as the console's form sends it; empty or missing: any) select: ``status``, a
    :class:`~statifier.persistence.Status` value; ``meta``, ``key=value`` pairs one a
    line; the times ISO 8601 (UTC without an offset); ``errors``, ``1`` or nothing;
    ``final`` the final state. :func:`filter_query` writes them back.

    Raises:
        BadFilter: a field that does not parse, or a search out of bounds.

    >>> where = filter_from_query({"status": "paused", "meta": "tenant=acme"})
    >>> (where.status.value, dict(where.metadata))
    ('paused', {'tenant': 'acme'})
    >>> filter_query(where)
    {'status': 'paused', 'meta': 'tenant=acme'}
    >>> filter_from_query({"status": "asleep"})
    Traceback (most recent call last):
    ...
    statifier.console.queries.BadFilter: status: not a status: 'asleep'
    """
    given = {name: fields.get(name, "") for name in QUERY_FIELDS}
    if given["errors"] not in ("", "1"):
        raise BadFilter("errors: 1 (executions whose steps raised errors), or nothing")
    status = None
    if given["status"]:
        try:
            status = Status(given["status"])
        except ValueError:
            raise BadFilter(f"status: not a status: {given['status'][:40]!r}") from None
    metadata: dict[str, str] = {}
    for line in given["meta"].splitlines():
        key, equals, value = line.partition("=")
        if not equals or not key:
            raise BadFilter("metadata: give key=value")
        metadata[key] = value
    return ExecutionFilter(
        status=status,
        document=given["document"] or None,
        scope=given["scope"] or None,
        metadata=metadata,
        created_from=_moment(given["created_from"], "created from"),
        created_until=_moment(given["created_until"], "created until"),
        updated_from=_moment(given["updated_from"], "updated from"),
        updated_until=_moment(given["updated_until"], "updated until"),
        errors=given["errors"] == "1",
        key=given["key"] or None,
        final_state=given["final"] or None,
        error=given["error"] or None,
    )


def filter_query(where: ExecutionFilter) -> dict[str, str]:
    """The query fields that select what ``where`` selects (those given only), as
    :func:`filter_from_query` reads them."""
    texts = {
        "status": None if where.status is None else where.status.value,
        "document": where.document,
        "scope": where.scope,
        "meta": "\n".join(f"{key}={value}" for key, value in where.metadata.items()) or None,
        "created_from": _iso(where.created_from),
        "created_until": _iso(where.created_until),
        "updated_from": _iso(where.updated_from),
        "updated_until": _iso(where.updated_until),
        "errors": "1" if where.errors else None,
        "key": where.key,
        "final": where.final_state,
        "error": where.error,
    }
    return {name: text for name, text in texts.items() if text is not None}


def _moment(value: str, name: str) -> datetime | None:
    """A filter's time: ISO 8601; without an offset it is UTC."""
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise BadFilter(f"{name}: not an ISO 8601 time: {value[:40]!r}") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def decode_cursor(cursor: str, kind: str) -> tuple[datetime, str]:
    """The time and key :func:`encode_cursor` put in ``cursor`` for the list ``kind``.

    Raises:
        BadCursor: anything else.
    """
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        found = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
        made_for, moment, key = found
        at = datetime.fromisoformat(moment)
    except (ValueError, TypeError, UnicodeError, binascii.Error):
        raise BadCursor("not a cursor of this list") from None
    if made_for != kind or not isinstance(key, str) or at.tzinfo is None:
        raise BadCursor("not a cursor of this list")
    return at, key


# -- rows to values ---------------------------------------------------------------


def _check_size(size: int) -> None:
    given: object = size
    if isinstance(given, bool) or not isinstance(given, int) or not 1 <= given <= MAX_PAGE:
        raise ValueError(f"a page holds 1 to {MAX_PAGE} rows, not {size!r}")


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _paged(
    rows: Sequence[sa.Row[Any]], size: int, kind: str, moment: str, make: Callable[[Any], _T]
) -> Page[_T]:
    chosen = rows[:size]
    next_cursor = None
    if len(rows) > size:
        last = chosen[-1]
        next_cursor = encode_cursor(kind, getattr(last, moment), last.id)
    return Page(tuple(make(row) for row in chosen), next_cursor)


def _metadata(value: Any) -> Mapping[str, str]:
    found = json.loads(value) if isinstance(value, str | bytes) else value
    return dict(found) if isinstance(found, dict) else {}


def _summary(row: sa.Row[Any], codec: BlobCodec) -> ExecutionSummary:
    # Unreadable, the row is still worth listing: its final state then reads as unknown.
    what = f"the position of execution {row.execution_id!r}"
    position = _readable(codec, row.final_position, what, row.execution_id)
    return ExecutionSummary(
        row.execution_id,
        status=Status(row.status),
        content_hash=row.content_hash,
        document=row.name,
        version=row.version,
        failure=row.failure,
        metadata=_metadata(row.metadata),
        created_at=row.created_at,
        updated_at=row.updated_at,
        ended_at=row.ended_at,
        error_count=int(row.error_count),
        last_error_at=row.last_error_at,
        final_state=row.final_state,
        final_position=position,
    )


def _decoded(codec: BlobCodec, blob: Any, what: str) -> bytes | None:
    """A blob column's bytes decoded (``None`` stays ``None``).

    Raises:
        UndecodableBlob: the codec cannot decode them.
    """
    if blob is None:
        return None
    if isinstance(codec, PlainBlobs):
        return bytes(blob)
    try:
        return codec.decode(bytes(blob))
    except UndecodableBlob as failure:
        raise UndecodableBlob(f"{what} could not be decoded: {failure}") from None


def _record(row: sa.Row[Any], codec: BlobCodec) -> ExecutionRecord:
    """An ``executions`` row; a position or outcome the codec cannot decode is logged
    and shown as absent (the page then says the position cannot be read)."""
    name = f"execution {row.execution_id!r}"
    return ExecutionRecord(
        row.execution_id,
        content_hash=row.content_hash,
        status=Status(row.status),
        position=_readable(codec, row.position_blob, f"the position of {name}", row.execution_id),
        metadata=_metadata(row.metadata),
        outcome=_readable(codec, row.outcome_blob, f"the outcome of {name}", row.execution_id),
        failure=row.failure,
        created_at=row.created_at,
        updated_at=row.updated_at,
        ended_at=row.ended_at,
        error_count=int(row.error_count),
        last_error_at=row.last_error_at,
    )


def _chart(row: sa.Row[Any], codec: BlobCodec) -> ChartRecord:
    return ChartRecord(
        row.content_hash,
        source=_decoded(codec, row.chart_blob, f"the source of chart {row.content_hash}"),
        name=row.name,
        version=row.version,
        saved_at=row.saved_at,
        retired_at=row.retired_at,
        retired_by=row.retired_by,
    )


def _timer(row: sa.Row[Any], codec: BlobCodec) -> TimerView:
    """A ``timers`` row; a payload the codec cannot decode is logged and shown empty,
    with no event (the timer worker puts such a timer off, warning too)."""
    what = f"the payload of timer {row.send_id!r}"
    try:
        payload = _metadata(opened_json(codec, row.payload, what))
    except UndecodableBlob as failure:
        _log.warning("console: %s", failure, extra={"execution_id": row.execution_id})
        payload = {}
    return TimerView(
        row.send_id,
        kind=row.kind,
        due_at=row.due_at,
        payload=payload,
        inserted_at=row.inserted_at,
        key=row.dedup_key,
        event=_event_name(payload.get("event")),
    )


def _held(row: sa.Row[Any], codec: BlobCodec) -> HeldView:
    """A ``held_events`` row; an event the codec cannot decode shows without its name."""
    what = f"a held event of execution {row.execution_id!r}"
    try:
        event: str | None = load_event(_decoded(codec, row.event_blob, what) or b"").name
    except (UndecodableBlob, NotAPosition):
        _log.warning("console: a held event of execution %s cannot be read", row.execution_id)
        event = None
    return HeldView(
        row.id, via=row.via, event=event, message_id=row.message_id, held_at=row.held_at
    )


def _readable(codec: BlobCodec, blob: Any, what: str, execution_id: str) -> bytes | None:
    """:func:`_decoded`, with ``None`` (and a warning) for what the codec cannot decode:
    one unreadable column does not make its page unreadable."""
    try:
        return _decoded(codec, blob, what)
    except UndecodableBlob as failure:
        _log.warning("console: %s", failure, extra={"execution_id": execution_id})
        return None


def _event_name(stored: Any) -> str | None:
    """The name of an event a timer payload holds (as ``dump_event`` wrote it)."""
    try:
        return load_event(json.dumps(stored).encode()).name
    except (NotAPosition, TypeError, ValueError):
        return None


def _error(row: sa.Row[Any], codec: BlobCodec) -> ErrorView:
    """A ``step_errors`` row; a detail the codec cannot decode is logged and left out."""
    unreadable = None
    what = f"an error of execution {row.execution_id!r}"
    try:
        detail = _decoded(codec, row.error_blob, what) or b"{}"
    except UndecodableBlob as failure:
        unreadable = str(failure)
        detail = b"{}"
        _log.warning(
            "console: %s",
            failure,
            extra={"execution_id": row.execution_id, "blob": "error"},
        )
    record = ErrorRecord(
        row.execution_id,
        seq=row.seq,
        via=row.via,
        name=row.name,
        taken=bool(row.taken),
        error=detail,
        recorded_at=row.recorded_at,
    )
    return ErrorView(row.execution_id, id=row.id, error=decode_error(record), unreadable=unreadable)


def _outbox(row: sa.Row[Any], codec: BlobCodec) -> OutboxRow:
    """An outbox row; an event the codec cannot decode is logged and shown as ``None``
    (the drain dead-letters such a row: the failures page lists it)."""
    payload: dict[str, Any] = dict(_metadata(row.payload))
    if isinstance(payload.get("event"), str):  # the event alone is sealed under a codec
        try:
            payload["event"] = opened_text(codec, payload["event"], f"outbox row {row.key!r}")
        except UndecodableBlob as failure:
            payload["event"] = None
            _log.warning("console: %s", failure, extra={"blob": "outbox", "queue": row.queue})
    return OutboxRow(
        row.id,
        queue=row.queue,
        key=row.key,
        payload=payload,
        attempts=int(row.attempts),
        next_attempt_at=row.next_attempt_at,
        lease=row.lease,
        leased_until=row.leased_until,
        sent_at=row.sent_at,
        dead_at=row.dead_at,
        last_error=row.last_error,
        inserted_at=row.inserted_at,
    )


def _ledger(row: sa.Row[Any]) -> LedgerRow:
    return LedgerRow.of(row._asdict())


def _address(row: sa.Row[Any]) -> AddressView:
    return AddressView(
        row.scope,
        row.document,
        row.key,
        execution_id=row.execution_id,
        inserted_at=row.inserted_at,
        terminal_seen_at=row.terminal_seen_at,
        status=None if row.status is None else Status(row.status),
    )


def _consumer_letter(row: sa.Row[Any], codec: BlobCodec) -> ConsumerDeadLetter:
    return ConsumerDeadLetter(
        row.id,
        source=row.source,
        partition=row.partition,
        position=int(row.position),
        message_id=row.message_id,
        reason=row.reason,
        raw=_decoded(codec, row.raw, f"consumer dead letter {row.id}") or b"",
        dead_at=row.dead_at,
    )


def _input(row: sa.Row[Any], codec: BlobCodec) -> LoggedInput:
    what = f"input {row.seq} of execution {row.execution_id!r}"
    return logged_input(row.seq, row.via, _decoded(codec, row.input_blob, what), row.recorded_at)
