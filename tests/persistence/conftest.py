"""Fixtures for the SQL adapter's tests: one database per backend for the session
(PostgreSQL: a schema of its own, dropped at the end; SQLite: a file), emptied
before each test that takes an adapter."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

import pytest
import pytest_asyncio
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from statifier.persistence import MemoryAdapter
from statifier.persistence.adapter import Adapter
from statifier.persistence.shards import ShardedAdapter
from statifier.persistence.sql import SqlAdapter
from statifier.sql import TableOptions, Tables, migrations

_T = TypeVar("_T")

SQL_BACKENDS = ("sqlite", "postgresql")


@dataclass(frozen=True)
class SqlStore:
    """A migrated database: its URL (a synchronous one) and its tables."""

    backend: str
    url: str
    tables: Tables

    def run(self, work: Callable[[sa.Connection], _T]) -> _T:
        """``work`` in one transaction on this database."""
        engine = sa.create_engine(migrations.sync_url(self.url))
        try:
            with engine.begin() as connection:
                return work(connection)
        finally:
            engine.dispose()

    def empty(self) -> None:
        def delete_all(connection: sa.Connection) -> None:
            for table in reversed(self.tables.metadata.sorted_tables):
                connection.execute(table.delete())

        self.run(delete_all)


def unique_name(stem: str) -> str:
    """A name no other test run uses: ``stem`` and 8 random hex digits."""
    return f"{stem}{uuid.uuid4().hex[:8]}"


def drop_schema(url: str, schema: str) -> None:
    engine = sa.create_engine(migrations.sync_url(url))
    try:
        with engine.begin() as connection:
            connection.execute(sa.schema.DropSchema(schema, cascade=True, if_exists=True))
    finally:
        engine.dispose()


def _migrate(request: pytest.FixtureRequest, backend: str, path: Path) -> Iterator[SqlStore]:
    """A database of ``backend`` migrated under prefix ``t_`` (PostgreSQL: in a schema
    of its own, dropped afterwards; ``postgresql_rows``: PostgreSQL whose locks are
    rows, ``TableOptions(locks="rows")``)."""
    if backend == "sqlite":
        options = TableOptions(prefix="t_")
        url = f"sqlite:///{path / 'store.db'}"
        migrations.upgrade(url, options)
        yield SqlStore("sqlite", url, options.define())
        return
    url = request.getfixturevalue("database_url")
    locks: Literal["advisory", "rows"] = "rows" if backend == "postgresql_rows" else "advisory"
    options = TableOptions(prefix="t_", schema=unique_name("statifier_test_"), locks=locks)
    migrations.upgrade(url, options)
    try:
        yield SqlStore("postgresql", url, options.define())
    finally:
        assert options.schema is not None
        drop_schema(url, options.schema)


def hand_layout(schema: str, **more: object) -> TableOptions:
    """PostgreSQL tables in ``schema`` laid out the way a host may have written them by
    hand: a leading ``tenant_id``, the timestamps right after it, ``execution_id`` and
    ``status`` in the ``"C"`` collation, and a text key the database fills in from the
    sequence ``<schema>.hand_ids``, which the caller creates (zero-padded, so that the
    keys sort in the order the rows were written, as the package's reads by ``id``
    expect)."""
    return TableOptions(
        schema=schema,
        leading_columns=lambda: [sa.Column("tenant_id", sa.Text(), nullable=True)],
        timestamps_position="leading",
        column_collations={"execution_id": "C", "status": "C"},
        key_type=sa.Text,
        key_default=sa.text(f"lpad(nextval('{schema}.hand_ids')::text, 19, '0')"),
        **more,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="session")
def hand_store(database_url: str) -> Iterator[SqlStore]:
    """The session's PostgreSQL schema under :func:`hand_layout`, prefix ``h_``."""
    schema = unique_name("statifier_hand_")
    engine = sa.create_engine(migrations.sync_url(database_url))
    try:
        with engine.begin() as connection:
            connection.execute(sa.schema.CreateSchema(schema))
            connection.execute(sa.text(f"CREATE SEQUENCE {schema}.hand_ids"))
    finally:
        engine.dispose()
    options = hand_layout(schema, prefix="h_")
    try:
        migrations.upgrade(database_url, options)
        yield SqlStore("postgresql", database_url, options.define())
    finally:
        drop_schema(database_url, schema)


@pytest.fixture(scope="session")
def sqlite_store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SqlStore]:
    """The session's SQLite database."""
    yield from _migrate(request, "sqlite", tmp_path_factory.mktemp("sql"))


@pytest.fixture(scope="session")
def postgresql_store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SqlStore]:
    """The session's PostgreSQL schema."""
    yield from _migrate(request, "postgresql", tmp_path_factory.mktemp("sql"))


@pytest.fixture(scope="session")
def postgresql_rows_store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SqlStore]:
    """The session's PostgreSQL schema whose locks are rows of its ``locks`` table."""
    yield from _migrate(request, "postgresql_rows", tmp_path_factory.mktemp("sql"))


LOCKING_BACKENDS = (*SQL_BACKENDS, "postgresql_rows")
"""The SQL backends and PostgreSQL with locks as rows: for the tests of what locks keep
apart."""


@pytest.fixture(params=SQL_BACKENDS)
def sql_store(request: pytest.FixtureRequest) -> SqlStore:
    """Each backend's database, migrated once for the session."""
    store: SqlStore = request.getfixturevalue(f"{request.param}_store")
    return store


@pytest_asyncio.fixture
async def sql_adapter(sql_store: SqlStore) -> AsyncIterator[SqlAdapter]:
    """A fresh adapter over the backend's emptied tables."""
    sql_store.empty()
    adapter = SqlAdapter(sql_store.url, sql_store.tables)
    try:
        yield adapter
    finally:
        await adapter.close()


@dataclass(frozen=True)
class FreshDatabase:
    """An empty place to migrate into: a SQLite file, or a PostgreSQL schema of its own
    (dropped after the test). ``schema`` is ``None`` on SQLite."""

    backend: str
    url: str
    schema: str | None


@pytest.fixture(params=SQL_BACKENDS)
def fresh_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FreshDatabase]:
    """Each backend, empty."""
    if request.param == "sqlite":
        yield FreshDatabase("sqlite", f"sqlite:///{tmp_path / 'fresh.db'}", None)
        return
    url = request.getfixturevalue("database_url")
    schema = unique_name("statifier_fresh_")
    try:
        yield FreshDatabase("postgresql", url, schema)
    finally:
        drop_schema(url, schema)


def _three(
    request: pytest.FixtureRequest, backend: str, factory: pytest.TempPathFactory
) -> Iterator[list[SqlStore]]:
    with ExitStack() as stack:
        migrated = contextmanager(_migrate)
        yield [
            stack.enter_context(migrated(request, backend, factory.mktemp("shard")))
            for _ in range(3)
        ]


@pytest.fixture(scope="session")
def sqlite_shards(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[SqlStore]]:
    """Three SQLite files, migrated once for the session: a sharded store's."""
    yield from _three(request, "sqlite", tmp_path_factory)


@pytest.fixture(scope="session")
def postgresql_shards(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[SqlStore]]:
    """Three schemas of the suite's PostgreSQL database, migrated once for the session."""
    yield from _three(request, "postgresql", tmp_path_factory)


# Every backend, the reference included: the lifecycle and driver tests run on each,
# and on executions spread over three stores (statifier.persistence.shards).

BACKENDS = ("memory", *LOCKING_BACKENDS, "sharded-memory", "sharded-sqlite")


@pytest_asyncio.fixture(params=BACKENDS)
async def adapter(request: pytest.FixtureRequest) -> AsyncIterator[Adapter]:
    """A fresh, empty store of each backend: the in-memory reference, SQLite,
    PostgreSQL (with advisory locks, and with locks as rows), and three in-memory
    stores or three SQLite files behind a
    :class:`~statifier.persistence.shards.ShardedAdapter`."""
    if request.param == "memory":
        yield MemoryAdapter()
        return
    if request.param == "sharded-memory":
        yield ShardedAdapter([MemoryAdapter() for _ in range(3)])
        return
    if request.param == "sharded-sqlite":
        shards: list[SqlStore] = request.getfixturevalue("sqlite_shards")
        for shard in shards:
            shard.empty()
        opened = [SqlAdapter(shard.url, shard.tables) for shard in shards]
        try:
            yield ShardedAdapter(opened)
        finally:
            for each in opened:
                await each.close()
        return
    store: SqlStore = request.getfixturevalue(f"{request.param}_store")
    store.empty()
    sql = SqlAdapter(store.url, store.tables)
    try:
        yield sql
    finally:
        await sql.close()


class CallerTransaction:
    """A transaction the caller opened on the adapter's engine (async on PostgreSQL,
    sync on SQLite), and the adapter joined to it."""

    def __init__(self, adapter: SqlAdapter) -> None:
        self.adapter = adapter
        self._async: AsyncConnection | None = None
        self._sync: sa.Connection | None = None
        self.view: SqlAdapter

    async def __aenter__(self) -> CallerTransaction:
        engine = self.adapter.engine
        if isinstance(engine, sa.Engine):
            self._sync = engine.connect()
            self._sync.begin()
            self.view = self.adapter.joined(self._sync)
        else:
            self._async = await engine.connect()
            await self._async.begin()
            self.view = self.adapter.joined(self._async)
        return self

    async def commit(self) -> None:
        if self._sync is not None:
            self._sync.commit()
        else:
            assert self._async is not None
            await self._async.commit()

    async def rollback(self) -> None:
        if self._sync is not None:
            self._sync.rollback()
        else:
            assert self._async is not None
            await self._async.rollback()

    async def __aexit__(self, *_exc: object) -> None:
        await self.view.close()
        if self._sync is not None:
            self._sync.close()
        if self._async is not None:
            await self._async.close()
