"""The SQL adapter: durable executions on PostgreSQL or SQLite, through SQLAlchemy Core.

On PostgreSQL it runs on an :class:`~sqlalchemy.ext.asyncio.AsyncEngine` over psycopg 3;
``exclusive`` is a transaction holding ``pg_advisory_xact_lock`` on a 64-bit key of the
execution id (``lock_timeout`` bounds the wait), and ``fetch_execution`` inside it reads
with ``SELECT ... FOR UPDATE``. On SQLite it runs on the standard ``sqlite3`` module
through a synchronous engine, inline on the event loop; ``exclusive`` is the single
writer: an asyncio lock per adapter, then ``BEGIN IMMEDIATE`` retried without blocking
the loop until the wait runs out, which keeps other processes out too. Both declare
every capability; SQLite lists by metadata through its JSON functions, PostgreSQL
through ``jsonb`` containment and a GIN index.

Inside ``async with adapter.exclusive(id)``, every call the task makes runs in the
block's transaction, committed when it ends and rolled back if it raises. Outside, each
call is a short transaction of its own. :meth:`SqlAdapter.joined` binds the adapter to a
transaction the caller opened: every call runs in it and nothing is committed or rolled
back there (the advisory lock is then held until the caller commits).

The tables must exist: build them with :mod:`statifier.sql.migrations`.

>>> import asyncio, os, tempfile
>>> from datetime import UTC, datetime
>>> from statifier.persistence import ChartRecord
>>> from statifier.sql import migrations
>>> url = f"sqlite:///{os.path.join(tempfile.mkdtemp(), 'doc.db')}"
>>> migrations.upgrade(url)
>>> async def main() -> str | None:
...     async with SqlAdapter(url) as adapter:
...         now = datetime(2026, 1, 1, tzinfo=UTC)
...         await adapter.save_chart(ChartRecord("h1", b"<scxml/>", "demo", "1", now))
...         chart = await adapter.fetch_chart("h1")
...         return chart.name if chart else None
>>> asyncio.run(main())
'demo'
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from types import TracebackType
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from statifier.persistence._sqlrun import (
    PostgresRunner,
    PostgresSession,
    Prepared,
    Runner,
    Session,
    SqliteRunner,
    SqliteSession,
    SqliteWriter,
    configure_sqlite,
)
from statifier.persistence.adapter import Capabilities
from statifier.persistence.errors import ExecutionExists, ExecutionNotFound
from statifier.persistence.records import (
    ChartRecord,
    ExecutionRecord,
    InputRecord,
    PositionRecord,
    Status,
)
from statifier.sql.tables import TableOptions, Tables
from statifier.sql.urls import psycopg_url

__all__ = ["SqlAdapter"]

# The bind parameters of update_execution and append_input, in their compiled order.
_UPDATE_ORDER = (
    "status",
    "position_blob",
    "outcome_blob",
    "failure",
    "updated_at",
    "ended_at",
    "execution_id",
)
_APPEND_ORDER = (
    "execution_id",
    "door",
    "cap",
    "cap",
    "input_blob",
    "recorded_at",
    "execution_id",
    "execution_id",
)
_EVERYTHING = Capabilities(lock=True, metadata=True, input_log=True, chart_retirement=True)
_STATUSES = {status.value: status for status in Status}
_PINNING = tuple(status.value for status in Status if status.pins)
# Connections a PostgreSQL engine made from a URL keeps open. SQLAlchemy's default of 5
# closes the connection of every sixth concurrent block when it ends, and a new one
# costs milliseconds; past this many, blocks still get connections, just not kept.
_POOL_SIZE = 20


def _sqlite_engine(url: sa.URL) -> sa.Engine:
    """A synchronous SQLite engine whose connections leave transactions to the adapter
    (and whose ``begin()`` really begins one), never busy-wait, and use WAL on a file
    (readers never wait for the writer)."""
    engine = sa.create_engine(url)
    in_memory = url.database in (None, "", ":memory:")

    @sa.event.listens_for(engine, "connect")
    def _connect(driver: Any, _record: Any) -> None:
        configure_sqlite(driver)
        if not in_memory:
            driver.execute("PRAGMA journal_mode = WAL")

    @sa.event.listens_for(engine, "begin")
    def _begin(connection: sa.Connection) -> None:
        connection.exec_driver_sql("BEGIN")

    return engine


class _Statements:
    """Every statement the adapter runs, built once and compiled for one dialect."""

    def __init__(self, tables: Tables, dialect: sa.Dialect) -> None:
        self.tables = tables
        self.dialect = dialect
        self.postgres = dialect.name == "postgresql"
        insert = postgresql.insert if self.postgres else sqlite.insert
        charts, positions = tables.charts, tables.positions
        executions, inputs = tables.executions, tables.inputs
        new_key = tables.options.key_default
        self.new_key = new_key

        def p(statement: sa.Executable) -> Prepared:
            return Prepared(statement, dialect)

        def keyed(table: sa.Table, *names: str) -> dict[str, Any]:
            values: dict[str, Any] = {name: sa.bindparam(name) for name in names}
            if new_key is not None:
                values["id"] = sa.bindparam("id", type_=table.c.id.type)
            return values

        def by(column: sa.Column[Any], name: str) -> sa.ColumnElement[bool]:
            return column == sa.bindparam(name, type_=column.type)

        chart_columns = (
            charts.c.content_hash,
            charts.c.chart_blob,
            charts.c.name,
            charts.c.version,
            charts.c.saved_at,
            charts.c.retired_at,
            charts.c.retired_by,
        )
        self.insert_chart = p(
            insert(charts)
            .values(
                keyed(
                    charts,
                    "content_hash",
                    "chart_blob",
                    "name",
                    "version",
                    "saved_at",
                    "retired_at",
                    "retired_by",
                )
            )
            .on_conflict_do_nothing(index_elements=["content_hash"])
        )
        self.fetch_chart = p(sa.select(*chart_columns).where(by(charts.c.content_hash, "h")))
        self.retire_chart = p(
            charts.update()
            .where(by(charts.c.content_hash, "h"), charts.c.retired_at.is_(None))
            .values(chart_blob=None, retired_at=sa.bindparam("at"), retired_by=sa.bindparam("by"))
        )

        self.execution_columns = (
            executions.c.execution_id,
            executions.c.content_hash,
            executions.c.status,
            executions.c.position_blob,
            executions.c["metadata"],
            executions.c.outcome_blob,
            executions.c.failure,
            executions.c.created_at,
            executions.c.updated_at,
            executions.c.ended_at,
        )
        self.insert_execution = p(
            insert(executions)
            .values(
                keyed(
                    executions,
                    "execution_id",
                    "content_hash",
                    "status",
                    "position_blob",
                    "metadata",
                    "outcome_blob",
                    "failure",
                    "created_at",
                    "updated_at",
                    "ended_at",
                )
            )
            .on_conflict_do_nothing(index_elements=["execution_id"])
            .returning(executions.c.id)
        )
        fetch = sa.select(*self.execution_columns).where(by(executions.c.execution_id, "id"))
        self.fetch_execution = p(fetch)
        self.fetch_execution_locked = p(fetch.with_for_update()) if self.postgres else None
        self.update_execution = p(
            executions.update()
            .where(by(executions.c.execution_id, "execution_id"))
            .values(
                {
                    name: sa.bindparam(name)
                    for name in (
                        "status",
                        "position_blob",
                        "outcome_blob",
                        "failure",
                        "updated_at",
                        "ended_at",
                    )
                }
            )
        )
        self.count_executions = p(
            sa.select(executions.c.status, sa.func.count())
            .where(by(executions.c.content_hash, "h"))
            .group_by(executions.c.status)
        )
        self.pinning = p(
            sa.select(executions.c.execution_id).where(
                by(executions.c.content_hash, "h"),
                sa.or_(*(executions.c.status == sa.literal(status) for status in _PINNING)),
            )
        )
        self._by_metadata: dict[tuple[bool, int], Prepared] = {}

        self.save_position = p(
            insert(positions)
            .values(keyed(positions, "key", "content_hash", "position_blob", "saved_at"))
            .on_conflict_do_update(
                index_elements=["key"],
                set_={
                    "content_hash": sa.bindparam("content_hash"),
                    "position_blob": sa.bindparam("position_blob"),
                    "saved_at": sa.bindparam("saved_at"),
                },
            )
        )
        self.fetch_position = p(
            sa.select(
                positions.c.key,
                positions.c.content_hash,
                positions.c.position_blob,
                positions.c.saved_at,
            ).where(by(positions.c.key, "key"))
        )
        self.delete_position = p(positions.delete().where(by(positions.c.key, "key")))
        self.count_positions = p(
            sa.select(sa.func.count())
            .select_from(positions)
            .where(by(positions.c.content_hash, "h"))
        )

        self.append_input = p(self._append(inputs, insert, new_key is not None))
        self.inputs = p(
            sa.select(
                inputs.c.execution_id,
                inputs.c.seq,
                inputs.c.door,
                inputs.c.input_blob,
                inputs.c.recorded_at,
            )
            .where(by(inputs.c.execution_id, "id"))
            .order_by(inputs.c.seq)
        )
        ended = executions.c.ended_at < sa.bindparam("before", type_=executions.c.ended_at.type)
        doomed = (
            sa.select(executions.c.id)
            .where(ended, executions.c.position_blob.is_not(None))
            .order_by(executions.c.ended_at, executions.c.id)
            .limit(sa.bindparam("limit", type_=sa.Integer()))
        )
        self.prune = p(
            executions.update()
            .where(executions.c.id.in_(doomed.scalar_subquery()))
            .values(position_blob=None)
            .returning(executions.c.execution_id)
        )
        self.drop_log = p(inputs.delete().where(by(inputs.c.execution_id, "id")))
        # A step's statements can be bound from tuples in their compiled order (see
        # SqlAdapter.fetch_execution): only if that order is the one the tuples follow.
        self.in_order = (
            dialect.paramstyle not in ("named", "pyformat")
            and self.fetch_execution.names == ("id",)
            and self.update_execution.names == _UPDATE_ORDER
            and self.append_input.names == ("id",) * (new_key is not None) + _APPEND_ORDER
        )

    @staticmethod
    def _append(inputs: sa.Table, insert: Any, with_key: bool) -> Any:
        """One statement appends at the next ``seq``: nothing when the log is closed,
        the closing marker when the entry would take the cap's last slot."""
        execution_id = sa.bindparam("execution_id", type_=sa.Text())
        cap = sa.bindparam("cap", type_=sa.Integer())
        # The constants are written into the SQL, not bound: fewer parameters to bind.
        one = sa.literal_column("1", sa.Integer())
        following = (
            sa.select(
                (sa.func.coalesce(sa.func.max(inputs.c.seq), sa.literal_column("-1")) + one).label(
                    "seq"
                )
            )
            .where(inputs.c.execution_id == execution_id)
            .subquery("following")
        )
        last = inputs.alias("last")
        closed = (
            sa.select(one)
            .where(
                last.c.execution_id == execution_id,
                last.c.seq == following.c.seq - one,
                last.c.input_blob.is_(None),
            )
            .exists()
        )
        blob = sa.case(
            (sa.and_(cap.is_not(None), following.c.seq >= cap - one), sa.null()),
            else_=sa.bindparam("input_blob", type_=sa.LargeBinary()),
        )
        selected: list[Any] = [
            execution_id,
            following.c.seq,
            sa.bindparam("door", type_=sa.Text()),
            blob,
            sa.bindparam("recorded_at", type_=inputs.c.recorded_at.type),
        ]
        names = ["execution_id", "seq", "door", "input_blob", "recorded_at"]
        if with_key:
            selected.insert(0, sa.bindparam("id", type_=inputs.c.id.type))
            names.insert(0, "id")
        source = sa.select(*selected).select_from(following).where(~closed)
        return insert(inputs).from_select(names, source).returning(inputs.c.seq)

    def with_key(self, values: dict[str, Any]) -> dict[str, Any]:
        """``values`` for an insert, with the row's key when the client makes keys."""
        if self.new_key is not None:
            values["id"] = self.new_key()
        return values

    def by_metadata(self, pairs: int, whole: bool) -> Prepared:
        """Executions (whole records, or id and status) whose metadata holds ``pairs``
        given pairs, bound as ``metadata`` (PostgreSQL) or ``k0``, ``v0``... (SQLite)."""
        found = self._by_metadata.get((whole, pairs))
        if found is not None:
            return found
        executions = self.tables.executions
        columns = (
            self.execution_columns if whole else (executions.c.execution_id, executions.c.status)
        )
        metadata = executions.c["metadata"]
        conditions: list[sa.ColumnElement[bool]] = []
        if self.postgres and pairs:
            wanted = sa.bindparam("metadata", type_=postgresql.JSONB())
            conditions.append(metadata.op("@>")(wanted))
        elif pairs:
            for index in range(pairs):
                entry = sa.func.json_each(metadata).table_valued("key", "value").alias(f"m{index}")
                conditions.append(
                    sa.select(sa.literal(1))
                    .select_from(entry)
                    .where(
                        entry.c.key == sa.bindparam(f"k{index}", type_=sa.Text()),
                        entry.c.value == sa.bindparam(f"v{index}", type_=sa.Text()),
                    )
                    .exists()
                )
        prepared = Prepared(sa.select(*columns).where(*conditions), self.dialect)
        self._by_metadata[(whole, pairs)] = prepared
        return prepared


def _execution(row: Sequence[Any]) -> ExecutionRecord:
    (
        execution_id,
        content_hash,
        status,
        position,
        metadata,
        outcome,
        failure,
        created_at,
        updated_at,
        ended_at,
    ) = row
    if isinstance(metadata, str):  # a driver that hands JSON back as text
        metadata = json.loads(metadata)
    return ExecutionRecord(
        execution_id,
        content_hash,
        _STATUSES.get(status) or Status(status),
        position,
        metadata,
        outcome,
        failure,
        created_at,
        updated_at,
        ended_at,
    )


def _update_values(record: ExecutionRecord) -> dict[str, Any]:
    return {
        "execution_id": record.id,
        "status": record.status.value,
        "position_blob": record.position,
        "outcome_blob": record.outcome,
        "failure": record.failure,
        "updated_at": record.updated_at,
        "ended_at": record.ended_at,
    }


def _appended(rows: Sequence[Sequence[Any]], cap: int | None) -> int | None:
    """The ``seq`` an append answers: ``None`` when the log was closed (no row) or the
    entry became the closing marker."""
    if not rows:
        return None  # the log is closed
    seq = int(rows[0][0])
    return None if cap is not None and seq >= cap - 1 else seq  # the marker


def _chart(row: Sequence[Any]) -> ChartRecord:
    content_hash, source, name, version, saved_at, retired_at, retired_by = row
    return ChartRecord(content_hash, source, name, version, saved_at, retired_at, retired_by)


class _Shared:
    """What an adapter and the views :meth:`SqlAdapter.joined` makes of it share."""

    def __init__(self, tables: Tables, engine: sa.Engine | AsyncEngine, owned: bool) -> None:
        self.tables = tables
        self.engine = engine
        self.owned = owned
        self.writer = SqliteWriter()  # SQLite's single writer, within this process
        self.statements: _Statements | None = None


class SqlAdapter:
    """An :class:`~statifier.persistence.Adapter` on PostgreSQL or SQLite.

    Args:
        target: a database URL (``postgresql://`` or ``postgresql+psycopg://`` runs on
            psycopg 3 async; ``sqlite:///path`` on ``sqlite3``), an
            :class:`~sqlalchemy.ext.asyncio.AsyncEngine` for PostgreSQL, or an
            :class:`~sqlalchemy.Engine` for SQLite. An engine given is the caller's to
            dispose; one made from a URL is disposed by :meth:`close`.
        tables: the tables (or their options) the migrations built; the defaults if
            ``None``.

    Raises:
        ValueError: a database other than PostgreSQL or SQLite, an async engine for
            SQLite, or a schema on SQLite.

    The adapter keeps connections between calls (on SQLite one, on PostgreSQL up to
    20 idle ones, checked out of the engine's pool), so :meth:`close` it, or use it as
    ``async with``. On SQLite an engine made from a URL switches a file database to WAL;
    calls from tasks other than the one inside an ``exclusive`` block wait for the block
    to end, so a block must not await another task that calls the adapter.
    """

    def __init__(
        self,
        target: str | sa.URL | sa.Engine | AsyncEngine,
        tables: Tables | TableOptions | None = None,
    ) -> None:
        chosen = (
            TableOptions().define()
            if tables is None
            else tables.define()
            if isinstance(tables, TableOptions)
            else tables
        )
        owned = isinstance(target, (str, sa.URL))
        engine: sa.Engine | AsyncEngine
        if isinstance(target, (str, sa.URL)):
            url = sa.make_url(target)
            if url.get_backend_name() == "sqlite":
                engine = _sqlite_engine(url)
            elif url.get_backend_name() == "postgresql":
                engine = create_async_engine(psycopg_url(url), pool_size=_POOL_SIZE)
            else:
                raise ValueError(f"durable executions run on PostgreSQL or SQLite, not {url!r}")
        else:
            engine = target
        name = engine.dialect.name
        if isinstance(engine, AsyncEngine) and name != "postgresql":
            raise ValueError("an AsyncEngine is for PostgreSQL; give SQLite a sync Engine")
        if not isinstance(engine, AsyncEngine) and name != "sqlite":
            raise ValueError("a sync Engine is for SQLite; give PostgreSQL an AsyncEngine")
        if name == "sqlite" and chosen.options.schema is not None:
            raise ValueError("a schema needs PostgreSQL")
        self._shared = _Shared(chosen, engine, owned)
        self._runner = self._make_runner(None)
        self._is_view = False

    def _make_runner(self, joined: sa.Connection | AsyncConnection | None) -> Runner:
        shared = self._shared
        if isinstance(shared.engine, AsyncEngine):
            assert joined is None or isinstance(joined, AsyncConnection)
            return PostgresRunner(shared.engine, shared, joined, keep=_POOL_SIZE)
        assert joined is None or isinstance(joined, sa.Connection)
        # A write that touches no row: it makes a caller's open transaction the single
        # writer.
        claim = str(
            shared.tables.executions.update()
            .where(sa.false())
            .values(status=shared.tables.executions.c.status)
            .compile(dialect=shared.engine.dialect)
        )
        return SqliteRunner(shared.engine, shared.writer, claim, joined)

    @property
    def capabilities(self) -> Capabilities:
        return _EVERYTHING

    @property
    def tables(self) -> Tables:
        """The tables this adapter reads and writes."""
        return self._shared.tables

    @property
    def engine(self) -> sa.Engine | AsyncEngine:
        """The engine: an :class:`AsyncEngine` on PostgreSQL, a sync :class:`Engine` on
        SQLite. Open a transaction for :meth:`joined` on it (on SQLite its ``begin()``
        begins a real transaction)."""
        return self._shared.engine

    def joined(self, connection: sa.Connection | AsyncConnection) -> SqlAdapter:
        """A view of this adapter bound to ``connection``, on which the caller has begun
        a transaction (an :class:`AsyncConnection` on PostgreSQL, a
        :class:`~sqlalchemy.Connection` on SQLite).

        Every call of the view, ``exclusive`` included, runs in that transaction and
        never commits or rolls it back: what the calls wrote commits with the caller's
        commit and vanishes with its rollback, and the execution's lock (PostgreSQL's
        transaction-scoped advisory lock, SQLite's write lock) is held until then. A
        lock wait that times out leaves the caller's transaction usable. The view
        shares the adapter's engine and in-process lock; closing it closes nothing.
        """
        view = SqlAdapter.__new__(SqlAdapter)
        view._shared = self._shared
        view._runner = view._make_runner(connection)
        view._is_view = True
        return view

    async def close(self) -> None:
        """Give back the adapter's connection, and dispose of the engine if the adapter
        made it from a URL."""
        await self._runner.close()
        shared = self._shared
        if shared.owned and not self._is_view:
            engine = shared.engine
            if isinstance(engine, AsyncEngine):
                await engine.dispose()
            else:
                engine.dispose()

    async def __aenter__(self) -> SqlAdapter:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    def _statements(self) -> _Statements:
        shared = self._shared
        if shared.statements is None:
            shared.statements = _Statements(shared.tables, self._runner.dialect)
        return shared.statements

    # Every operation is a coroutine over a session; the runner decides which.

    async def save_chart(self, chart: ChartRecord) -> ChartRecord:
        return await self._runner.run(self._save_chart, True, chart)

    async def _save_chart(self, session: Session, chart: ChartRecord) -> ChartRecord:
        s = self._statements()
        values = {
            "content_hash": chart.content_hash,
            "chart_blob": chart.source,
            "name": chart.name,
            "version": chart.version,
            "saved_at": chart.saved_at,
            "retired_at": chart.retired_at,
            "retired_by": chart.retired_by,
        }
        await session.run(s.insert_chart, s.with_key(values))
        rows = await session.rows(s.fetch_chart, {"h": chart.content_hash})
        return _chart(rows[0])

    async def fetch_chart(self, content_hash: str) -> ChartRecord | None:
        return await self._runner.run(self._fetch_chart, False, content_hash)

    async def _fetch_chart(self, session: Session, content_hash: str) -> ChartRecord | None:
        rows = await session.rows(self._statements().fetch_chart, {"h": content_hash})
        return _chart(rows[0]) if rows else None

    async def retire_chart(
        self, content_hash: str, retired_by: str, retired_at: datetime
    ) -> ChartRecord | None:
        return await self._runner.run(
            self._retire_chart, True, content_hash, retired_by, retired_at
        )

    async def _retire_chart(
        self, session: Session, content_hash: str, retired_by: str, retired_at: datetime
    ) -> ChartRecord | None:
        s = self._statements()
        await session.run(s.retire_chart, {"h": content_hash, "by": retired_by, "at": retired_at})
        rows = await session.rows(s.fetch_chart, {"h": content_hash})
        return _chart(rows[0]) if rows else None

    async def insert_execution(self, record: ExecutionRecord) -> None:
        await self._runner.run(self._insert_execution, True, record)

    async def _insert_execution(self, session: Session, record: ExecutionRecord) -> None:
        if record.created_at is None or record.updated_at is None:
            raise ValueError(f"execution {record.id!r} needs created_at and updated_at")
        s = self._statements()
        values = {
            "execution_id": record.id,
            "content_hash": record.content_hash,
            "status": record.status.value,
            "position_blob": record.position,
            "metadata": dict(record.metadata),
            "outcome_blob": record.outcome,
            "failure": record.failure,
            "created_at": record.created_at,
            "updated_at": record.updated_at,
            "ended_at": record.ended_at,
        }
        if not await session.rows(s.insert_execution, s.with_key(values)):
            raise ExecutionExists(record.id)

    # The three calls of a durable step, inside a block, skip the runner: on SQLite they
    # run inline on the block's session, on PostgreSQL straight on it, bound from
    # tuples in the statements' compiled order.

    def _in_block(self) -> tuple[SqliteSession | None, PostgresSession | None]:
        """The session of the block (or caller's transaction, on SQLite) a call of the
        current task runs in, SQLite's or PostgreSQL's, if the fast path applies."""
        runner = self._runner
        if not self._statements().in_order:
            return None, None
        if isinstance(runner, PostgresRunner):
            return None, runner.held()
        return runner.inline(), None

    async def fetch_execution(self, execution_id: str) -> ExecutionRecord | None:
        inline, held = self._in_block()
        if inline is None and held is None:
            return await self._runner.run(self._fetch_execution, False, execution_id)
        s = self._statements()
        if held is not None:
            # Inside a block on PostgreSQL: the row lock too (see _fetch_execution).
            prepared = s.fetch_execution_locked or s.fetch_execution
            rows = await held.rows_in_order(prepared, (execution_id,))
        else:
            assert inline is not None
            prepared = s.fetch_execution
            rows = inline.rows_in_order(prepared, (execution_id,))
        return _execution(prepared.row(rows[0])) if rows else None

    async def _fetch_execution(self, session: Session, execution_id: str) -> ExecutionRecord | None:
        s = self._statements()
        # Inside a block on PostgreSQL, the row lock keeps out writers that bypass the
        # advisory lock; elsewhere it would cost a lock for nothing.
        locked = s.fetch_execution_locked
        statement = locked if locked is not None and self._runner.holding() else s.fetch_execution
        rows = await session.rows(statement, {"id": execution_id})
        return _execution(rows[0]) if rows else None

    async def update_execution(self, record: ExecutionRecord) -> None:
        inline, held = self._in_block()
        if inline is None and held is None:
            await self._runner.run(self._update_execution, True, record)
            return
        s = self._statements()
        values = (
            record.status._value_,  # the plain attribute behind .value
            record.position,
            record.outcome,
            record.failure,
            record.updated_at,
            record.ended_at,
            record.id,
        )
        if held is not None:
            updated = await held.run_in_order(s.update_execution, values)
        else:
            assert inline is not None
            updated = inline.run_in_order(s.update_execution, values)
        if not updated:
            raise ExecutionNotFound(record.id)

    async def _update_execution(self, session: Session, record: ExecutionRecord) -> None:
        if not await session.run(self._statements().update_execution, _update_values(record)):
            raise ExecutionNotFound(record.id)

    async def count_executions_on(self, content_hash: str) -> Mapping[Status, int]:
        return await self._runner.run(self._count_executions_on, False, content_hash)

    async def _count_executions_on(self, session: Session, content_hash: str) -> dict[Status, int]:
        rows = await session.rows(self._statements().count_executions, {"h": content_hash})
        return {Status(status): int(count) for status, count in rows}

    async def pinning_executions(self, content_hash: str) -> list[str]:
        return await self._runner.run(self._pinning_executions, False, content_hash)

    async def _pinning_executions(self, session: Session, content_hash: str) -> list[str]:
        rows = await session.rows(self._statements().pinning, {"h": content_hash})
        return [execution_id for (execution_id,) in rows]

    async def list_by_metadata(self, pairs: Mapping[str, str]) -> list[ExecutionRecord]:
        rows = await self._runner.run(self._by_metadata, False, dict(pairs), True)
        return [_execution(row) for row in rows]

    async def statuses_by_metadata(self, pairs: Mapping[str, str]) -> dict[str, Status]:
        rows = await self._runner.run(self._by_metadata, False, dict(pairs), False)
        return {execution_id: Status(status) for execution_id, status in rows}

    async def _by_metadata(
        self, session: Session, pairs: dict[str, str], whole: bool
    ) -> list[list[Any]]:
        s = self._statements()
        values: dict[str, Any]
        if s.postgres:
            values = {"metadata": pairs}
        else:
            values = {}
            for index, (key, value) in enumerate(pairs.items()):
                values[f"k{index}"], values[f"v{index}"] = key, value
        return await session.rows(s.by_metadata(len(pairs), whole), values)

    async def save_position(self, record: PositionRecord) -> None:
        await self._runner.run(self._save_position, True, record)

    async def _save_position(self, session: Session, record: PositionRecord) -> None:
        s = self._statements()
        values = {
            "key": record.key,
            "content_hash": record.content_hash,
            "position_blob": record.position,
            "saved_at": record.saved_at,
        }
        await session.run(s.save_position, s.with_key(values))

    async def fetch_position(self, key: str) -> PositionRecord | None:
        return await self._runner.run(self._fetch_position, False, key)

    async def _fetch_position(self, session: Session, key: str) -> PositionRecord | None:
        rows = await session.rows(self._statements().fetch_position, {"key": key})
        return PositionRecord(*rows[0]) if rows else None

    async def delete_position(self, key: str) -> bool:
        return await self._runner.run(self._delete_position, True, key)

    async def _delete_position(self, session: Session, key: str) -> bool:
        return await session.run(self._statements().delete_position, {"key": key}) > 0

    async def count_positions_on(self, content_hash: str) -> int:
        return await self._runner.run(self._count_positions_on, False, content_hash)

    async def _count_positions_on(self, session: Session, content_hash: str) -> int:
        rows = await session.rows(self._statements().count_positions, {"h": content_hash})
        return int(rows[0][0])

    async def append_input(
        self,
        execution_id: str,
        door: str,
        event: bytes,
        recorded_at: datetime,
        cap: int | None,
    ) -> int | None:
        inline, held = self._in_block()
        if inline is not None or held is not None:
            s = self._statements()
            ordered: tuple[Any, ...] = (
                execution_id,
                door,
                cap,
                cap,
                event,
                recorded_at,
                execution_id,
                execution_id,
            )
            if s.new_key is not None:
                ordered = (s.new_key(), *ordered)
            if held is not None:
                return _appended(await held.rows_in_order(s.append_input, ordered), cap)
            assert inline is not None
            return _appended(inline.rows_in_order(s.append_input, ordered), cap)
        values = {
            "execution_id": execution_id,
            "door": door,
            "input_blob": event,
            "recorded_at": recorded_at,
            "cap": cap,
        }
        return await self._runner.run(self._append_input, True, values)

    async def _append_input(self, session: Session, values: dict[str, Any]) -> int | None:
        s = self._statements()
        rows = await session.rows(s.append_input, s.with_key(values))
        return _appended(rows, values["cap"])

    async def inputs(self, execution_id: str) -> list[InputRecord]:
        return await self._runner.run(self._inputs, False, execution_id)

    async def _inputs(self, session: Session, execution_id: str) -> list[InputRecord]:
        rows = await session.rows(self._statements().inputs, {"id": execution_id})
        return [InputRecord(*row) for row in rows]

    async def prune(self, ended_before: datetime, limit: int) -> list[str]:
        if limit <= 0:
            return []
        return await self._runner.run(self._prune, True, ended_before, limit)

    async def _prune(self, session: Session, ended_before: datetime, limit: int) -> list[str]:
        s = self._statements()
        rows = await session.rows(s.prune, {"before": ended_before, "limit": limit})
        pruned = [execution_id for (execution_id,) in rows]
        if pruned:
            await session.run_many(s.drop_log, [{"id": execution_id} for execution_id in pruned])
        return pruned

    def exclusive(self, execution_id: str, wait: float | None) -> AbstractAsyncContextManager[None]:
        return self._runner.exclusive(execution_id, wait)
