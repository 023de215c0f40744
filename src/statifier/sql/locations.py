"""The opt-in migration of the BasicHTTP location table (``<prefix>locations``, see
:func:`statifier.sql.tables.define_locations`).

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

import sqlalchemy as sa

from statifier.extras import MissingExtra
from statifier.sql.engines import database_url
from statifier.sql.tables import TableOptions, Tables, define_locations

__all__ = ["downgrade_locations", "upgrade_locations"]


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
        engine = sa.create_engine(database_url(target))
    except ModuleNotFoundError as missing:  # psycopg: the postgres extra
        raise MissingExtra.of(missing) from missing
    try:
        with engine.begin() as connection:
            yield connection
    finally:
        engine.dispose()
