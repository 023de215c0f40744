"""The BasicHTTP location table (``<prefix>locations``, see
:func:`statifier.sql.tables.define_locations`): its opt-in migration, and its statements.

:class:`LocationTable` inserts an execution's row (the hash of its token), finds the
address row a token's hash reaches, reads an execution's hash and replaces it. What a
location means (its token, its URL, the chart's copy of it) is the router's
(:mod:`statifier.router.locations`).

The table is outside the version walk of :mod:`statifier.sql.migrations`: ``upgrade``
and ``downgrade`` there never create, drop or require it, and no revision records it.
A host whose router configuration sets ``basichttp`` calls :func:`upgrade_locations`
once, after :func:`~statifier.sql.migrations.upgrade` (the table references the
address table), with the same options; from its own Alembic history, with the
connection its migration runs on (``upgrade_locations(op.get_bind(), options)``).
:func:`downgrade_locations` undoes it, and goes before the address table does.

>>> import os, tempfile
>>> import sqlalchemy as sa
>>> from statifier.sql import TableOptions, migrations
>>> url = f"sqlite:///{os.path.join(tempfile.mkdtemp(), 'doc.db')}"
>>> migrations.upgrade(url, TableOptions(prefix="doc_"))
>>> upgrade_locations(url, TableOptions(prefix="doc_"))
>>> upgrade_locations(url, TableOptions(prefix="doc_"))  # creates only what is missing
>>> "doc_locations" in sa.inspect(sa.create_engine(url)).get_table_names()
True
>>> downgrade_locations(url, TableOptions(prefix="doc_"))
>>> "doc_locations" in sa.inspect(sa.create_engine(url)).get_table_names()
False
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from statifier.extras import MissingExtra
from statifier.sql.dialect import Dialect
from statifier.sql.engines import database_url, new_engine
from statifier.sql.keys import RowKeys
from statifier.sql.names import TableNames
from statifier.sql.tables import TableOptions, Tables, define_locations

__all__ = ["LocatedRow", "LocationTable", "downgrade_locations", "upgrade_locations"]


def upgrade_locations(
    target: str | sa.URL | sa.Connection, options: TableOptions | Tables | None = None
) -> None:
    """Create the location table of ``options`` (the defaults if ``None``) and its
    index, unless they exist.

    ``target`` is a database URL or an open synchronous connection (in a transaction
    the caller began, the caller commits). From async code:
    ``await connection.run_sync(upgrade_locations, options)``.

    Raises:
        ValueError: a schema was given for a database other than PostgreSQL.
        MissingExtra: a PostgreSQL URL without psycopg (the postgres extra).
        sqlalchemy.exc.DBAPIError: the address table is missing (run the version walk
            first), or the database refused the statement.
    """
    with _connected(target) as connection:
        table = _table(connection, options)
        table.create(connection, checkfirst=True)


def downgrade_locations(
    target: str | sa.URL | sa.Connection, options: TableOptions | Tables | None = None
) -> None:
    """Drop the location table of ``options``, if it is there. Takes what
    :func:`upgrade_locations` takes; every live location is gone with it."""
    with _connected(target) as connection:
        table = _table(connection, options)
        table.drop(connection, checkfirst=True)


def _table(connection: sa.Connection, options: TableOptions | Tables | None) -> sa.Table:
    tables = options if isinstance(options, Tables) else (options or TableOptions()).define()
    if connection.dialect.name != "postgresql" and tables.options.schema is not None:
        raise ValueError(f"a schema ({tables.options.schema!r}) needs PostgreSQL")
    return define_locations(tables)


@contextmanager
def _connected(target: str | sa.URL | sa.Connection) -> Iterator[sa.Connection]:
    if isinstance(target, sa.Connection):
        yield target
        return
    try:
        engine = new_engine(database_url(target))
    except ModuleNotFoundError as missing:  # psycopg: the postgres extra
        raise MissingExtra.of(missing) from missing
    try:
        with engine.begin() as connection:
            yield connection
    finally:
        engine.dispose()


# The statements.


@dataclass(frozen=True, slots=True)
class LocatedRow:
    """The address row a live token's hash reaches, as read (``terminal_seen_at`` aware,
    UTC, or ``None`` while the execution has not been seen to end)."""

    address_id: Any
    scope: str
    document: str
    key: str
    execution_id: str
    terminal_seen_at: datetime | None


class LocationTable:
    """The statements of one location table on one database, made once.

    Args:
        tables: the tables the migrations built (the location table is named under
            their options, beside their address table).
        dialect: the database's dialect (``SqlAdapter.dialect``).

    Every method takes the driver's connection of the caller's transaction
    (``tx.driver``) and runs one statement in it.
    """

    def __init__(self, tables: Tables, dialect: Dialect) -> None:
        self.dialect = dialect
        self.keys = RowKeys.of(tables, dialect)
        options = tables.options
        schema = f"{options.schema}." if options.schema else ""
        locations = f"{schema}{options.name('locations')}"
        columns = ("address_id", "execution_id", "token_hash", "inserted_at")
        sql = dialect.statement
        self._insert = sql(self.keys.insert(locations, columns))
        # Where rows are locked, the location row is held against a rotation until the
        # transaction ends; SQLite's single writer excludes a rotation already.
        held = " FOR SHARE OF l" if dialect.row_locks else ""
        # The execution id must match too: where the reference is not enforced
        # (SQLite), a reaped address's id may come back naming another execution.
        self._resolve = sql(
            "SELECT a.id, a.scope, a.document, a.key, a.execution_id, a.terminal_seen_at "
            f"FROM {locations} AS l JOIN {TableNames.of(tables).addresses} AS a "
            "ON a.id = l.address_id AND a.execution_id = l.execution_id "
            f"WHERE l.token_hash = :token_hash{held}"
        )
        self._token_hash = sql(
            f"SELECT token_hash FROM {locations} WHERE execution_id = :execution_id"
        )
        self._rotate = sql(
            f"UPDATE {locations} SET token_hash = :token_hash WHERE execution_id = :execution_id"
        )

    async def insert(
        self,
        driver: Any,
        *,
        address_id: Any,
        execution_id: str,
        token_hash: str,
        inserted_at: datetime,
    ) -> None:
        """Insert the location row of ``execution_id``, whose address row is
        ``address_id`` (as read from the address table)."""
        dialect = self.dialect
        values: dict[str, Any] = {
            "address_id": address_id,
            "execution_id": execution_id,
            "token_hash": token_hash,
            "inserted_at": dialect.time(inserted_at),
        }
        await dialect.execute(driver, self._insert, self.keys.keyed(values))

    async def resolve(self, driver: Any, token_hash: str) -> LocatedRow | None:
        """The address row the location of ``token_hash`` reaches (of the same
        execution), or ``None``. Where rows are locked, the location row is held until
        the transaction ends, so a rotation waits for it."""
        dialect = self.dialect
        row = await dialect.row(driver, self._resolve, {"token_hash": token_hash})
        if row is None:
            return None
        address_id, scope, document, key, execution_id, seen = row
        return LocatedRow(address_id, scope, document, key, execution_id, dialect.read_time(seen))

    async def token_hash(self, driver: Any, execution_id: str) -> str | None:
        """The token hash of ``execution_id``'s location, or ``None`` if it has none."""
        values = {"execution_id": execution_id}
        row = await self.dialect.row(driver, self._token_hash, values)
        return None if row is None else str(row[0])

    async def rotate(self, driver: Any, execution_id: str, token_hash: str) -> bool:
        """Replace the token hash of ``execution_id``'s location; answer whether it had
        one."""
        values = {"execution_id": execution_id, "token_hash": token_hash}
        return await self.dialect.execute(driver, self._rotate, values) > 0
