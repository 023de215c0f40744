"""Alembic migrations that build the tables of :mod:`statifier.sql.tables`.

The revisions live beside this module (``versions/``) with a version table of their
own, ``<prefix>alembic_version``, so a host's own Alembic history never meets them.
Every revision is parametrized by the same :class:`~statifier.sql.TableOptions` the
adapter is built with (handed to Alembic through ``Config.attributes``).

Three ways to run them:

- from Python: ``upgrade(url_or_connection, options)`` and ``downgrade(...)``;
- from a host's own Alembic ``env.py``: call ``upgrade(connection, options)`` with the
  connection the host's migrations run on (``docs/persistence-sql.md`` shows the
  recipe);
- from the shell: ``statifier db upgrade [--url URL] [--prefix P] [--schema S]``.

>>> import os, tempfile
>>> from statifier.sql import TableOptions
>>> path = os.path.join(tempfile.mkdtemp(), "doc.db")
>>> upgrade(f"sqlite:///{path}", TableOptions(prefix="doc_"))
>>> current(f"sqlite:///{path}", TableOptions(prefix="doc_"))
'statifier_0008'
>>> downgrade(f"sqlite:///{path}", TableOptions(prefix="doc_"))
>>> current(f"sqlite:///{path}", TableOptions(prefix="doc_")) is None
True
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Final, Protocol

import sqlalchemy as sa

from statifier.extras import MissingExtra
from statifier.sql.engines import database_url as sync_url
from statifier.sql.tables import TableOptions, Tables

try:
    from alembic.config import Config
    from alembic.runtime.environment import EnvironmentContext
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError
except ModuleNotFoundError as missing:  # Alembic: the sqlite extra
    raise MissingExtra.of(missing) from missing

__all__ = [
    "OPTIONS_ATTRIBUTE",
    "BadRevision",
    "current",
    "current_options",
    "downgrade",
    "run_environment",
    "sync_url",
    "upgrade",
]

OPTIONS_ATTRIBUTE: Final = "statifier_table_options"
"""The key of ``alembic.config.Config.attributes`` that carries the :class:`TableOptions`."""

_CONNECTION_ATTRIBUTE: Final = "connection"
_HERE = Path(__file__).parent


class BadRevision(ValueError):  # noqa: N818 - names the refusal
    """A revision to migrate to that this history does not have (or cannot reach in
    that direction). A :class:`ValueError`; the message is one line."""

    def __init__(self, revision: str, why: str) -> None:
        known = ", ".join(["head", "base", *_revisions()])
        super().__init__(f"revision {revision!r}: {why} (the revisions are {known})")
        self.revision = revision


def _revisions() -> list[str]:
    config = Config()
    config.set_main_option("script_location", str(_HERE))
    script = ScriptDirectory.from_config(config)
    return sorted(revision.revision for revision in script.walk_revisions())


def _options(options: TableOptions | Tables | None) -> TableOptions:
    if options is None:
        return TableOptions()
    return options.options if isinstance(options, Tables) else options


@contextmanager
def _connected(target: str | sa.URL | sa.Connection) -> Iterator[sa.Connection]:
    if isinstance(target, sa.Connection):
        yield target
        return
    try:
        engine = sa.create_engine(sync_url(target))
    except ModuleNotFoundError as missing:  # psycopg: the postgres extra
        raise MissingExtra.of(missing) from missing
    try:
        with engine.begin() as connection:
            yield connection
    finally:
        engine.dispose()


def upgrade(
    target: str | sa.URL | sa.Connection,
    options: TableOptions | Tables | None = None,
    revision: str = "head",
) -> None:
    """Migrate the tables of ``options`` (the defaults if ``None``) up to ``revision``.

    ``target`` is a database URL (a bare ``postgresql://`` uses psycopg 3) or an open
    synchronous connection. On a connection with a transaction already begun, the
    migration runs inside it and the caller commits; otherwise it runs in a transaction
    of its own. On PostgreSQL the schema is created if it does not exist. It may be
    called from inside a host's own Alembic ``env.py`` (it does not take over Alembic's
    module-level ``context``). From async code:
    ``await connection.run_sync(upgrade, options)``.

    Raises:
        ValueError: a schema was given for a database other than PostgreSQL.
        BadRevision: ``revision`` is not one of this history (a ``ValueError``).
        MissingExtra: a PostgreSQL URL without psycopg (the postgres extra).
    """
    with _connected(target) as connection:
        _migrate(connection, _options(options), revision, upward=True)


def downgrade(
    target: str | sa.URL | sa.Connection,
    options: TableOptions | Tables | None = None,
    revision: str = "base",
) -> None:
    """Migrate down to ``revision`` (``"base"``: drop every table; the schema and the
    version table stay). Takes the same ``target`` and ``options`` as :func:`upgrade`.
    """
    with _connected(target) as connection:
        _migrate(connection, _options(options), revision, upward=False)


def _migrate(
    connection: sa.Connection, options: TableOptions, destination: str, upward: bool
) -> None:
    if connection.dialect.name != "postgresql" and options.schema is not None:
        raise ValueError(f"a schema ({options.schema!r}) needs PostgreSQL")
    config = Config()
    config.set_main_option("script_location", str(_HERE))
    config.attributes[OPTIONS_ATTRIBUTE] = options
    script = ScriptDirectory.from_config(config)

    def steps(revision: Any, _context: MigrationContext) -> Any:
        if upward:
            return script._upgrade_revs(destination, revision)
        return script._downgrade_revs(destination, revision)

    # Used without ``with``, the environment does not install itself as Alembic's
    # module-level ``context``, so this also runs inside a host's own env.py.
    environment = EnvironmentContext(config, script, fn=steps)
    try:
        _run(environment, connection, options)
    except CommandError as refused:  # Alembic's: an unknown or unreachable revision
        raise BadRevision(destination, " ".join(str(refused).split())) from None


def current(
    target: str | sa.URL | sa.Connection, options: TableOptions | Tables | None = None
) -> str | None:
    """The revision the tables of ``options`` are at, or ``None`` when none was applied."""
    chosen = _options(options)
    with _connected(target) as connection:
        context = MigrationContext.configure(
            connection,
            opts={"version_table": chosen.version_table, "version_table_schema": chosen.schema},
        )
        return context.get_current_revision()


def current_options() -> TableOptions:
    """The options of the running migration: what :func:`upgrade` handed over, or the
    defaults when the revisions run from a host's environment that gave none. For the
    revision files; only callable while Alembic runs them."""
    from alembic import op

    context = op.get_context()
    given = context.opts.get(OPTIONS_ATTRIBUTE)
    if given is None and context.config is not None:
        given = context.config.attributes.get(OPTIONS_ATTRIBUTE)
    return _options(given)


def run_environment(config: Config) -> None:
    """The body of this package's ``env.py``, for the ``alembic`` command with
    ``script_location = statifier.sql:migrations``: run the revisions on the connection
    in ``config.attributes["connection"]`` or on ``sqlalchemy.url``, with the options in
    ``config.attributes`` (the defaults if none)."""
    from alembic import context

    options = _options(config.attributes.get(OPTIONS_ATTRIBUTE))
    connection = config.attributes.get(_CONNECTION_ATTRIBUTE)
    if connection is not None:
        _run(context, connection, options)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise ValueError("no connection in Config.attributes and no sqlalchemy.url")
    with _connected(url) as opened:
        _run(context, opened, options)


class _Environment(Protocol):
    """Alembic's environment: an :class:`EnvironmentContext`, or the ``context`` module
    that stands for the one Alembic runs."""

    def configure(self, *args: Any, **kwargs: Any) -> None: ...

    def begin_transaction(self) -> AbstractContextManager[Any]: ...

    def run_migrations(self, **kw: Any) -> None: ...


def _run(environment: _Environment, connection: sa.Connection, options: TableOptions) -> None:
    if options.schema is not None and connection.dialect.name == "postgresql":
        connection.execute(sa.schema.CreateSchema(options.schema, if_not_exists=True))
    environment.configure(
        connection=connection,
        target_metadata=options.define().metadata,
        version_table=options.version_table,
        version_table_schema=options.schema,
        **{OPTIONS_ATTRIBUTE: options},
    )
    with environment.begin_transaction():
        environment.run_migrations()
