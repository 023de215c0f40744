"""Create and upgrade scriba's tables with Alembic, beside a host's own migrations.

The migration scripts ship inside the package. Revision ``scriba_0001`` creates the
positions and dead-letter tables, ``scriba_0002`` the watermarks table, ``scriba_0003``
the projections table (each projection's fencing generation). Each step looks
before it creates, so upgrading a database whose tables already exist (made by
``metadata.create_all``, or by an older copy of the same step) changes nothing and
just records the revision.

scriba records its revision in a version table of its own, ``<prefix>alembic_version``,
so it never meets a host's Alembic history: the host's ``alembic_version`` stays the
host's.

From Python, give a URL, an engine or a connection:

>>> import sqlalchemy as sa
>>> engine = sa.create_engine("sqlite://")
>>> upgrade(engine, prefix="demo_")
>>> current_revision(engine, prefix="demo_") == HEAD
True
>>> sorted(sa.inspect(engine).get_table_names())  # doctest: +NORMALIZE_WHITESPACE
['demo_alembic_version', 'demo_dead_letters', 'demo_positions', 'demo_projections',
 'demo_watermarks']
>>> upgrade(engine, prefix="demo_")  # idempotent
>>> downgrade(engine, prefix="demo_")
>>> sorted(sa.inspect(engine).get_table_names())
['demo_alembic_version']
>>> engine.dispose()

Given a connection inside a transaction, the work joins that transaction and the
caller commits it; that is how a host runs it from its own Alembic environment, in one
of two ways (both run in the host's transaction):

.. code-block:: text

    # in one of the host's revision files
    from alembic import op
    import scriba.sql

    def upgrade() -> None:
        scriba.sql.upgrade(op.get_bind())

    # or at the end of the host's env.py, after its own migrations
    with context.begin_transaction():
        context.run_migrations()
        scriba.sql.upgrade(connection)

Autogenerate in the host compares the database with the host's metadata; so that it
does not offer to drop scriba's tables, add them to that metadata with
``define_tables(metadata=target_metadata)`` and leave the version table out with an
``include_name`` hook that skips names starting with the prefix.

The revision scripts never touch Alembic's module-level ``op`` and ``context``
proxies: they receive their ``Operations`` as an argument, which is what lets them
run from inside a host's migration without disturbing the host's proxies.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

import sqlalchemy as sa
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext, MigrationStep
from alembic.script import ScriptDirectory

from scriba.sql.tables import DEFAULT_PREFIX, check_prefix, check_schema, version_table_name
from statifier.sql.engines import database_url, new_engine

__all__ = ["HEAD", "current_revision", "downgrade", "upgrade"]

HEAD: Final = "scriba_0003"
"""The latest revision of scriba's tables."""

MIGRATIONS: Final = Path(__file__).parent / "migrations"

Bind = str | sa.URL | sa.Engine | sa.Connection


def upgrade(
    bind: Bind,
    *,
    prefix: str = DEFAULT_PREFIX,
    schema: str | None = None,
    revision: str = "head",
) -> None:
    """Bring scriba's tables up to ``revision`` (the latest unless told).

    Args:
        bind: a database URL (``postgresql+psycopg://...``, ``sqlite:///...``), an
            engine, or a connection. A connection already in a transaction is used
            inside it and left for the caller to commit.
        prefix: the table prefix (see :func:`scriba.sql.tables.define_tables`).
        schema: the schema to create the tables in; on PostgreSQL it is created if
            missing.
        revision: a revision id, or ``"head"``.

    Raises:
        ValueError: the prefix or schema is not a plain identifier.
        alembic.util.CommandError: ``revision`` is unknown.
        sqlalchemy.exc.DBAPIError: the database refused (permissions, say).
    """
    check_prefix(prefix)
    check_schema(schema)
    _run(bind, functools.partial(_upgrade_steps, revision), prefix, schema)


def downgrade(
    bind: Bind,
    *,
    prefix: str = DEFAULT_PREFIX,
    schema: str | None = None,
    revision: str = "base",
) -> None:
    """Take scriba's tables down to ``revision`` (dropping them all unless told).

    The version table stays (empty at ``"base"``), as Alembic leaves its own. The
    arguments and errors are those of :func:`upgrade`.
    """
    check_prefix(prefix)
    check_schema(schema)
    _run(bind, functools.partial(_downgrade_steps, revision), prefix, schema)


def current_revision(
    bind: Bind, *, prefix: str = DEFAULT_PREFIX, schema: str | None = None
) -> str | None:
    """The revision the database is at, or ``None`` before the first upgrade."""
    check_prefix(prefix)
    check_schema(schema)
    with _connection(bind) as connection:
        context = _context(connection, prefix, schema, steps=None)
        return context.get_current_revision()


@functools.cache
def _scripts() -> ScriptDirectory:
    # Loading the revision files once per process is enough: they are frozen.
    return ScriptDirectory(str(MIGRATIONS))


def _upgrade_steps(revision: str, heads: Sequence[str], _: MigrationContext) -> list[Any]:
    scripts = _scripts()
    revisions = list(scripts.iterate_revisions(revision, tuple(heads), implicit_base=True))
    return [
        MigrationStep.upgrade_from_script(scripts.revision_map, script)
        for script in reversed(revisions)
    ]


def _downgrade_steps(revision: str, heads: Sequence[str], _: MigrationContext) -> list[Any]:
    scripts = _scripts()
    revisions = scripts.iterate_revisions(tuple(heads), revision, select_for_downgrade=True)
    return [
        MigrationStep.downgrade_from_script(scripts.revision_map, script) for script in revisions
    ]


def _context(
    connection: sa.Connection, prefix: str, schema: str | None, steps: Any
) -> MigrationContext:
    options: dict[str, Any] = {
        "version_table": version_table_name(prefix),
        "version_table_schema": schema,
    }
    if steps is not None:
        options["fn"] = steps
    return MigrationContext.configure(connection, opts=options)


def _run(bind: Bind, steps: Any, prefix: str, schema: str | None) -> None:
    with _connection(bind) as connection:
        if schema is not None and connection.dialect.name == "postgresql":
            connection.execute(sa.schema.CreateSchema(schema, if_not_exists=True))
        context = _context(connection, prefix, schema, steps)
        context.run_migrations(op=Operations(context), prefix=prefix, schema=schema)


@contextlib.contextmanager
def _connection(bind: Bind) -> Iterator[sa.Connection]:
    """A connection in a transaction: the caller's own, or one begun (and committed)
    here on the engine given or made from a URL."""
    if isinstance(bind, sa.Connection):
        if bind.in_transaction():
            yield bind
        else:
            with bind.begin():
                yield bind
        return
    engine = new_engine(database_url(bind)) if isinstance(bind, str | sa.URL) else bind
    if not isinstance(engine, sa.Engine):
        raise TypeError(f"scriba migrates through a URL, an Engine or a Connection, not {bind!r}")
    try:
        with engine.begin() as connection:
            yield connection
    finally:
        if engine is not bind:
            engine.dispose()
