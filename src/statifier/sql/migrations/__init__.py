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

One gate (``docs/decisions/0087-one-migration-gate.md``): every migration this package
runs on a URL holds the migration lock, so that processes starting together migrate one
after the other and the later ones find nothing to do. On PostgreSQL it is the
transaction-scoped advisory lock :data:`MIGRATION_LOCK` (one for the whole database), or,
where ``TableOptions.locks`` is ``"rows"`` (decision 0118: a database that does not
honour advisory locks across its nodes), the one row of the table
``<prefix>migration_lock`` (:data:`MIGRATION_LOCK_TABLE`) in the tables' schema, locked
``FOR UPDATE``: the table, its row and the schema are made, if missing, and committed
before the migration's transaction begins, since the lock is taken before any of the
package's tables exist. Processes on the same tables must gate the same way, as they
must lock the same way. On SQLite it is the database's write lock, taken with ``BEGIN
IMMEDIATE`` before the version table is read. ``statifier db upgrade`` runs
:func:`upgrade` through it (``--locks`` chooses the gate); :func:`prepare` ("at head, or
upgraded to head under the lock") is what ``statifier serve``,
:class:`~statifier.durable.Durable` (and so ``statifier executions``) and ``statifier
console`` open a database with, and it raises :class:`NotAtHead` when the tables are
behind and migrating was not asked for. On a connection a caller gives, the caller's
transaction governs and no lock is taken.

>>> import os, tempfile
>>> from statifier.sql import TableOptions
>>> path = os.path.join(tempfile.mkdtemp(), "doc.db")
>>> upgrade(f"sqlite:///{path}", TableOptions(prefix="doc_"))
>>> current(f"sqlite:///{path}", TableOptions(prefix="doc_"))
'statifier_0029'
>>> downgrade(f"sqlite:///{path}", TableOptions(prefix="doc_"))
>>> current(f"sqlite:///{path}", TableOptions(prefix="doc_")) is None
True
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any, Final, Protocol

import sqlalchemy as sa

from statifier.extras import MissingExtra
from statifier.sql.engines import database_url as sync_url
from statifier.sql.engines import new_engine
from statifier.sql.locks import claim_mode
from statifier.sql.places import Place, claim_place
from statifier.sql.sqlite import BEGIN_WRITE
from statifier.sql.tables import SQLITE_COLLATIONS, TableOptions, Tables

try:
    from alembic.config import Config
    from alembic.runtime.environment import EnvironmentContext
    from alembic.runtime.migration import MigrationContext, MigrationStep
    from alembic.script import ScriptDirectory
    from alembic.script.revision import RangeNotAncestorError, ResolutionError, RevisionError
    from alembic.util import CommandError
except ModuleNotFoundError as missing:  # Alembic: the sqlite extra
    raise MissingExtra.of(missing) from missing

__all__ = [
    "MIGRATION_LOCK",
    "MIGRATION_LOCK_TABLE",
    "MIGRATION_WAIT",
    "OPTIONS_ATTRIBUTE",
    "BadRevision",
    "MigrationBusy",
    "NotAtHead",
    "batch_columns",
    "create_table",
    "current",
    "current_options",
    "downgrade",
    "head",
    "missing_file",
    "prepare",
    "revisions",
    "run_environment",
    "stamp",
    "sync_url",
    "upgrade",
]

OPTIONS_ATTRIBUTE: Final = "statifier_table_options"
"""The key of ``alembic.config.Config.attributes`` that carries the :class:`TableOptions`."""

MIGRATION_LOCK: Final = int.from_bytes(
    hashlib.blake2b(b"statifier.migrations", digest_size=8).digest(), "big", signed=True
)
"""The PostgreSQL advisory lock key every migration of these tables holds (one per
database, whatever the prefix or schema) where ``TableOptions.locks`` is
``"advisory"``: a signed 64-bit integer."""

MIGRATION_LOCK_TABLE: Final = "migration_lock"
"""The table (unprefixed) whose one row (``id`` 1) every migration of these tables
locks ``FOR UPDATE`` where ``TableOptions.locks`` is ``"rows"``: ``<prefix>migration_lock``
in the tables' schema, one per set of tables (sets with other prefixes or schemas share
nothing a migration touches, so they migrate side by side). It is outside the revisions:
made by the first migration that needs it, and left by a downgrade to base."""

MIGRATION_WAIT: Final = 300.0
"""Seconds a migration waits for another one holding the lock before it gives up."""

_LOCK_NOT_AVAILABLE: Final = "55P03"  # PostgreSQL's lock_timeout

_MADE_BY_ANOTHER: Final = frozenset({"23505", "42P06", "42P07"})
"""What ``CREATE ... IF NOT EXISTS`` can raise when another transaction makes the same
schema or table at the same time (a unique violation in the catalogs, or the duplicate
schema or table): the object is there once that one commits, so trying again succeeds."""

_LOCK_ROW_ATTEMPTS: Final = 5
"""How many times a migration makes the lock table's row and locks it before it gives
up: each repeat means a racing creation or a row deleted by hand in between."""

_CONNECTION_ATTRIBUTE: Final = "connection"
_HERE = Path(__file__).parent


class BadRevision(ValueError):  # noqa: N818 - names the refusal
    """A revision to migrate to that this history does not have (or cannot reach in
    that direction). A :class:`ValueError`; the message is one line."""

    def __init__(self, revision: str, why: str) -> None:
        known = ", ".join(["head", "base", *revisions()])
        super().__init__(f"revision {revision!r}: {why} (the revisions are {known})")
        self.revision = revision


class NotAtHead(ValueError):  # noqa: N818 - names the finding
    """The tables are not at the head revision, and migrating them was not asked for.

    Attributes:
        revision: the revision they are at (``None``: no tables, or no SQLite file).
        head: the revision this version of statifier needs (:func:`head`).
    """

    def __init__(self, revision: str | None, head: str) -> None:
        found = f"at revision {revision}" if revision else "not there"
        super().__init__(f"the tables are {found}, and this statifier needs revision {head}")
        self.revision = revision
        self.head = head


class MigrationBusy(TimeoutError):  # noqa: N818 - names the refusal
    """Another process held the migration lock for longer than the wait; nothing was
    migrated. The message says how long it waited."""


@cache
def head() -> str:
    """The latest revision of the migrations shipped, e.g. ``'statifier_0007'``."""
    config = Config()
    config.set_main_option("script_location", str(_HERE))
    found = ScriptDirectory.from_config(config).get_current_head()
    assert found is not None  # the history is shipped with the package
    return found


@cache
def revisions() -> tuple[str, ...]:
    """Every revision of the migrations shipped, sorted (oldest first: they are
    numbered), e.g. ``('statifier_0001', ...)``."""
    config = Config()
    config.set_main_option("script_location", str(_HERE))
    script = ScriptDirectory.from_config(config)
    return tuple(sorted(revision.revision for revision in script.walk_revisions()))


def _options(options: TableOptions | Tables | None) -> TableOptions:
    if options is None:
        return TableOptions()
    return options.options if isinstance(options, Tables) else options


@contextmanager
def _gated(
    target: str | sa.URL | sa.Connection, options: TableOptions, wait: float
) -> Iterator[sa.Connection]:
    """A connection in a transaction that holds the migration lock of ``options``'s
    tables (a caller's connection as it is); commits when the block ends, rolls back
    when it raises."""
    if isinstance(target, sa.Connection):
        yield target
        return
    url = sync_url(target)
    sqlite = url.get_backend_name() == "sqlite"
    try:
        engine = new_engine(url, connect_args={"timeout": wait} if sqlite else {})
    except ModuleNotFoundError as missing:  # psycopg: the postgres extra
        raise MissingExtra.of(missing) from missing
    try:
        with engine.connect() as connection:
            try:
                if sqlite:
                    _lock_sqlite(connection, wait)
                elif options.locks == "rows":
                    _lock_row(connection, options, wait)
                else:
                    _lock_postgres(connection, wait)
            except (sa.exc.OperationalError, sqlite3.OperationalError) as busy:
                if not _lock_refused(busy):
                    raise
                raise MigrationBusy(
                    f"another process held the migration lock for {wait:g} s: it may still "
                    "be migrating; nothing was migrated"
                ) from None
            yield connection
            connection.commit()
    finally:
        engine.dispose()


def _lock_postgres(connection: sa.Connection, wait: float) -> None:
    # The transaction-scoped advisory lock ends with the transaction, commit or not;
    # the bounded wait covers taking it alone.
    connection.execute(sa.text(f"SET LOCAL lock_timeout = '{int(wait * 1000)}ms'"))
    connection.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
    connection.execute(sa.text("SET LOCAL lock_timeout = DEFAULT"))


def _lock_row(connection: sa.Connection, options: TableOptions, wait: float) -> None:
    """Lock the row of :data:`MIGRATION_LOCK_TABLE` in a new transaction, making the
    schema, the table and the row first (committed), waiting ``wait`` at most at each
    step; the row lock ends with the transaction, as the advisory lock does."""
    schema = f"{options.schema}." if options.schema else ""
    table = f"{schema}{options.name(MIGRATION_LOCK_TABLE)}"
    bounded = sa.text(f"SET LOCAL lock_timeout = '{int(wait * 1000)}ms'")
    for _ in range(_LOCK_ROW_ATTEMPTS):
        try:
            # Committed on its own: made in the migration's transaction, the table would
            # keep every other process's CREATE waiting for the whole migration, then
            # failing with a unique violation that aborts its transaction.
            with connection.begin():
                connection.execute(bounded)
                if options.schema is not None:
                    connection.execute(sa.schema.CreateSchema(options.schema, if_not_exists=True))
                connection.execute(
                    sa.text(f"CREATE TABLE IF NOT EXISTS {table} (id smallint PRIMARY KEY)")
                )
                connection.execute(
                    sa.text(f"INSERT INTO {table} (id) VALUES (1) ON CONFLICT DO NOTHING")
                )
        except sa.exc.DBAPIError as raced:
            if getattr(raced.orig, "sqlstate", None) not in _MADE_BY_ANOTHER:
                raise
            continue
        connection.execute(bounded)
        held = connection.execute(sa.text(f"SELECT id FROM {table} WHERE id = 1 FOR UPDATE"))
        if held.first() is not None:
            connection.execute(sa.text("SET LOCAL lock_timeout = DEFAULT"))
            return
        connection.rollback()  # deleted since it was made: make it again
    raise MigrationBusy(
        f"the migration lock's row in {table} could not be made and locked in "
        f"{_LOCK_ROW_ATTEMPTS} attempts (made by others, or deleted, each time); nothing "
        "was migrated"
    )


def _lock_sqlite(connection: sa.Connection, wait: float) -> None:
    driver = connection.connection.driver_connection
    assert driver is not None
    driver.isolation_level = None  # transactions begun by hand, below
    # WAL first, as the adapter's connections ask for it: switching needs the database
    # to itself, so it is done here, waiting (the connection's busy timeout is
    # ``wait``), rather than by a process opening while another migrates.
    driver.execute("PRAGMA journal_mode = WAL")
    # The write lock, before the version table is read: a second migration waits here
    # and then finds the tables at the revision the first reached.
    driver.execute(BEGIN_WRITE)
    connection.begin()  # the transaction begun above; pysqlite emits nothing


def _lock_refused(error: Exception) -> bool:
    """Whether ``error`` (SQLAlchemy's, or the SQLite driver's own) is the lock's wait
    running out: PostgreSQL's lock_timeout, or SQLite's busy timeout."""
    cause = getattr(error, "orig", error)
    code = getattr(cause, "sqlstate", None)
    return code == _LOCK_NOT_AVAILABLE or "database is locked" in str(cause)


@contextmanager
def _connected(target: str | sa.URL | sa.Connection) -> Iterator[sa.Connection]:
    if isinstance(target, sa.Connection):
        yield target
        return
    try:
        engine = new_engine(sync_url(target))
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
    *,
    wait: float = MIGRATION_WAIT,
) -> None:
    """Migrate the tables of ``options`` (the defaults if ``None``) up to ``revision``.

    ``target`` is a database URL (a bare ``postgresql://`` uses psycopg 3) or an open
    synchronous connection. On a URL the migration runs in a transaction of its own
    that holds the migration lock (waiting ``wait`` seconds at most for another
    process's), and reads the revision reached under it: two processes upgrading at
    once migrate once. On a connection with a transaction already begun, the migration
    runs inside it and the caller commits; otherwise it runs in a transaction of its
    own; either way the caller's discipline governs and no lock is taken. On PostgreSQL
    the schema is created if it does not exist. It may be called from inside a host's
    own Alembic ``env.py`` (it does not take over Alembic's module-level ``context``).
    From async code: ``await connection.run_sync(upgrade, options)``.

    Raises:
        ValueError: a schema was given for a database other than PostgreSQL.
        BadRevision: ``revision`` is not one of this history (a ``ValueError``).
        MigrationBusy: another process held the lock for longer than ``wait``.
        MissingExtra: a PostgreSQL URL without psycopg (the postgres extra).
    """
    chosen = _options(options)
    with _gated(target, chosen, wait) as connection:
        _migrate(connection, chosen, revision, upward=True)


def downgrade(
    target: str | sa.URL | sa.Connection,
    options: TableOptions | Tables | None = None,
    revision: str = "base",
    *,
    wait: float = MIGRATION_WAIT,
) -> None:
    """Migrate down to ``revision`` (``"base"``: drop every table; the schema, the
    version table and, where ``options.locks`` is ``"rows"``, the migration lock's table
    stay). Takes the same ``target``, ``options`` and ``wait`` as :func:`upgrade`, and
    the same lock.

    The lock's table is not the revisions' to drop: the downgrade holds its row, and
    dropping it would wait for every migration waiting for that row (each holds the
    table open) while they wait for the downgrade, a deadlock.
    """
    chosen = _options(options)
    with _gated(target, chosen, wait) as connection:
        _migrate(connection, chosen, revision, upward=False)


def stamp(
    target: str | sa.URL | sa.Connection,
    options: TableOptions | Tables | None = None,
    revision: str = "head",
    *,
    wait: float = MIGRATION_WAIT,
) -> None:
    """Record in the package's version table (``<prefix>alembic_version``) that the
    tables of ``options`` are at ``revision``, running no revision: for tables built
    some other way that match it exactly (a host's hand-written migration, once the
    catalogs prove them identical; see ``docs/persistence-sql.md``). The next
    :func:`upgrade` goes on from there. Takes the same ``target``, ``options`` and
    ``wait`` as :func:`upgrade`, and the same lock.

    Raises:
        BadRevision: ``revision`` is not one of this history (a ``ValueError``).
        MigrationBusy: another process held the lock for longer than ``wait``.
    """
    chosen = _options(options)
    config = Config()
    config.set_main_option("script_location", str(_HERE))
    script = ScriptDirectory.from_config(config)
    with _gated(target, chosen, wait) as connection:
        context = MigrationContext.configure(
            connection,
            opts={"version_table": chosen.version_table, "version_table_schema": chosen.schema},
        )
        try:
            context.stamp(script, revision)
        except (RevisionError, CommandError) as refused:
            raise BadRevision(revision, " ".join(str(refused).split())) from None


def prepare(
    url: str | sa.URL,
    options: TableOptions | Tables | None = None,
    *,
    migrate: bool,
    then: Callable[[sa.Connection], None] | None = None,
    wait: float = MIGRATION_WAIT,
    place: Place | None = None,
) -> None:
    """At head, or upgraded to head under the lock: how the service,
    :class:`~statifier.durable.Durable` and the console open a database.

    With ``migrate``, upgrade the tables of ``options`` to :func:`head` holding the
    migration lock (another process migrating at the same time is waited for, and then
    there is nothing left to do), then call ``then`` with the same connection, in the
    same transaction, still under the lock (the service creates an opt-in table there).
    Without it, only read the revision; a SQLite file that does not exist is not
    created. Either way, on PostgreSQL, claim the tables' way of locking
    (:func:`statifier.sql.locks.claim_mode`); and given a ``place``, claim it
    (:func:`statifier.sql.places.claim_place`: the service gives each store its place
    in ``[database] shards``, or place 0 of 1).

    Raises:
        NotAtHead: without ``migrate``, the tables are not at :func:`head`.
        LocksMismatch: processes opened the tables with the other way of locking (a
            ``ValueError``).
        PlaceMismatch: the store holds another place, or a reshard is moving its
            buckets or moved them away (a ``ValueError``).
        MigrationBusy: another process held the lock for longer than ``wait``.
        ValueError: a schema for a database other than PostgreSQL; a URL that names
            neither.
        MissingExtra: the database's driver is not installed.
        sqlalchemy.exc.SQLAlchemyError: the database cannot be reached.
    """
    chosen = _options(options)
    if migrate:
        with _gated(url, chosen, wait) as connection:
            _migrate(connection, chosen, "head", upward=True)
            if then is not None:
                then(connection)
            claim_mode(connection, chosen)
            if place is not None:
                claim_place(connection, chosen, place, datetime.now(UTC))
        return
    if missing_file(url):
        raise NotAtHead(None, head())
    reached = current(url, chosen)
    if reached != head():
        raise NotAtHead(reached, head())
    if sync_url(url).get_backend_name() == "postgresql" or place is not None:
        with _connected(url) as connection:
            claim_mode(connection, chosen)
            if place is not None:
                claim_place(connection, chosen, place, datetime.now(UTC))


def missing_file(url: str | sa.URL) -> bool:
    """Whether ``url`` names a SQLite file that does not exist. Connecting to it would
    create an empty one, and a mistyped path would leave a stray database behind: a
    caller that only reads a store asks this first.

    >>> missing_file("sqlite:////no/such/folder/store.db"), missing_file("sqlite://")
    (True, False)
    """
    parsed = sync_url(url)
    database = parsed.database
    in_a_file = parsed.get_backend_name() == "sqlite" and database not in (None, "", ":memory:")
    return in_a_file and not Path(str(database)).exists()


def _migrate(
    connection: sa.Connection, options: TableOptions, destination: str, upward: bool
) -> None:
    if connection.dialect.name != "postgresql" and options.schema is not None:
        raise ValueError(f"a schema ({options.schema!r}) needs PostgreSQL")
    if connection.dialect.name == "sqlite":
        _check_sqlite_collations(options)
    config = Config()
    config.set_main_option("script_location", str(_HERE))
    config.attributes[OPTIONS_ATTRIBUTE] = options
    script = ScriptDirectory.from_config(config)

    def steps(heads: Any, _context: MigrationContext) -> list[Any]:
        # The steps Alembic's upgrade and downgrade commands plan, from the revision map:
        # the revisions between the heads the tables are at and the destination, run
        # oldest first going up and newest first going down.
        revision_map = script.revision_map
        try:
            if upward:
                found = list(script.iterate_revisions(destination, heads, implicit_base=True))
                return [MigrationStep.upgrade_from_script(revision_map, s) for s in found[::-1]]
            found = list(script.iterate_revisions(heads, destination, select_for_downgrade=True))
            return [MigrationStep.downgrade_from_script(revision_map, s) for s in found]
        except RevisionError as refused:
            raise BadRevision(destination, _refusal(refused, upward)) from None

    # Used without ``with``, the environment does not install itself as Alembic's
    # module-level ``context``, so this also runs inside a host's own env.py.
    environment = EnvironmentContext(config, script, fn=steps)
    try:
        _run(environment, connection, options)
    except CommandError as refused:  # Alembic's, should its environment refuse the revision
        raise BadRevision(destination, " ".join(str(refused).split())) from None


def _check_sqlite_collations(options: TableOptions) -> None:
    """Refuse, before any table is touched, a collation SQLite does not know (it
    would refuse the ``CREATE TABLE`` half-way through the walk)."""
    for column, collation in options.column_collations.items():
        if collation.upper() not in SQLITE_COLLATIONS:
            raise ValueError(
                f"column_collations: SQLite knows the collations "
                f"{', '.join(sorted(SQLITE_COLLATIONS))}, not {collation!r} (for {column!r})"
            )


def _refusal(error: RevisionError, upward: bool) -> str:
    """Why Alembic's revision map found no way to ``destination``, in one line."""
    if isinstance(error, ResolutionError):
        return f"there is no revision {error.argument!r}"
    if isinstance(error, RangeNotAncestorError):
        return (
            f"{'an upgrade' if upward else 'a downgrade'} cannot reach it from where the tables are"
        )
    return " ".join(str(error).split())  # a relative step that goes past either end


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


def create_table(name: str, *declared: Any, schema: str | None) -> None:
    """Create the table ``name`` with the package's columns and constraints
    ``declared``, laid out under the running migration's options
    (:meth:`TableOptions.laid_out`: the key, the leading columns, the timestamps'
    position, the collations). For the revision files, in place of
    ``op.create_table``; only callable while Alembic runs them."""
    from alembic import op

    op.create_table(name, *current_options().laid_out(name, *declared), schema=schema)


def batch_columns(table: str, *, named: str | None = None) -> tuple[sa.Column[Any], ...]:
    """The columns to hand ``op.batch_alter_table(..., reflect_args=...)`` for the
    table ``table`` (unprefixed, as the head revision names it; ``named``: the name it
    has in the database now, where a revision renames it): the host's leading
    columns and the package's collated text columns, as the running migration's
    options declare them, among the columns the table has. SQLite alters a table by
    copying it from what it reflects, and its reflection reads no collation: without
    these, the copy would lose them. For the revision files; only callable while
    Alembic runs them."""
    from alembic import op

    options = current_options()
    defined = options.define().metadata.tables[
        f"{options.schema}.{options.name(table)}" if options.schema else options.name(table)
    ]
    present = {
        column["name"]
        for column in sa.inspect(op.get_bind()).get_columns(
            options.name(named or table), schema=options.schema
        )
    }
    kept = [
        *options.leading(),
        *(
            sa.Column(column.name, column.type, nullable=column.nullable)
            for column in defined.columns
            if column.name in options.column_collations
        ),
    ]
    return tuple(column for column in kept if column.name in present)


_BUCKET_CHUNK: Final = 1_000
"""Rows whose bucket one UPDATE statement batch of :func:`add_bucket` writes."""


def add_bucket(
    table: str,
    buckets: Callable[[sa.Connection, str], Iterable[tuple[Any, int]]],
    index: Sequence[str],
) -> None:
    """Give ``table`` (unprefixed) a required ``bucket`` column, filled for the rows
    there, and the index ``<table>_bucket_<index...>_idx`` on ``bucket`` and ``index``:
    the step the bucket revisions (``statifier_0017`` to ``statifier_0025``) share.
    ``buckets(connection, name)`` answers each row's ``(id, bucket)``, computed in
    Python (``name``: the table as SQL writes it, with its schema); they are written in
    UPDATE batches of 1,000. Those revisions call it, so what it does is theirs: a
    revision that needs it to do otherwise gets a function of its own. For the revision
    files; only callable while Alembic runs them."""
    from alembic import op

    options = current_options()
    name, schema = options.name(table), options.schema
    op.add_column(name, sa.Column("bucket", sa.SmallInteger(), nullable=True), schema=schema)
    qualified = f"{schema}.{name}" if schema else name
    bind = op.get_bind()
    pending = list(buckets(bind, qualified))
    update = sa.text(f"UPDATE {qualified} SET bucket = :b WHERE id = :id")
    for start in range(0, len(pending), _BUCKET_CHUNK):
        chunk = pending[start : start + _BUCKET_CHUNK]
        bind.execute(update, [{"id": row, "b": bucket} for row, bucket in chunk])
    with op.batch_alter_table(name, schema=schema, reflect_args=batch_columns(table)) as batch:
        batch.alter_column("bucket", existing_type=sa.SmallInteger(), nullable=False)
    indexed = ["bucket", *index]
    op.create_index(options.name(f"{table}_{'_'.join(indexed)}_idx"), name, indexed, schema=schema)


def drop_bucket(table: str, index: Sequence[str]) -> None:
    """Undo :func:`add_bucket` on ``table`` (its index, then its column). For the
    revision files; only callable while Alembic runs them."""
    from alembic import op

    options = current_options()
    name, schema = options.name(table), options.schema
    indexed = "_".join(["bucket", *index])
    op.drop_index(options.name(f"{table}_{indexed}_idx"), table_name=name, schema=schema)
    with op.batch_alter_table(name, schema=schema, reflect_args=batch_columns(table)) as batch:
        batch.drop_column("bucket")


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
