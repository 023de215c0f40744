"""Opening the database: checking the tables' revision, or migrating them under a lock
(in a thread: the migrations are synchronous)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Final

from statifier.durable.errors import DurableError

__all__ = ["NotMigrated"]

if TYPE_CHECKING:
    from statifier.sql import TableOptions

_MIGRATIONS: Final = "statifier.sql:migrations"
_MIGRATION_LOCK: Final = "statifier.migrations"
_MIGRATION_WAIT: Final = 60.0  # seconds a migrating process waits for another one


class NotMigrated(DurableError):  # noqa: N818
    """The database has no tables for durable executions, or not at the revision this
    version of statifier needs; the message says what to run.

    Attributes:
        revision: the revision the tables are at (``None``: no tables).
        head: the revision this version needs.
        finding: what is wrong, in one clause (``the database ... has no tables ...``).
        upgrade: the command that fixes it (``statifier db upgrade --url ...``).
    """

    def __init__(self, where: str, how: str, revision: str | None, head: str) -> None:
        if revision is None:
            state = "has no tables for durable executions"
        elif revision in _revisions():
            state = f"has its tables at revision {revision}, this statifier needs {head}"
        else:
            state = (
                f"has its tables at revision {revision}, which this statifier does not "
                f"know (it needs {head}; a newer statifier migrated them?)"
            )
        self.finding = f"the database {where} {state}"
        self.upgrade = f"statifier db upgrade {how}"
        super().__init__(f"{self.finding}: run `{self.upgrade}`, or pass migrate=True")
        self.revision = revision
        self.head = head


@cache
def _revisions() -> tuple[str, ...]:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", _MIGRATIONS)
    script = ScriptDirectory.from_config(config)
    return tuple(revision.revision for revision in script.walk_revisions())


@cache
def _head() -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", _MIGRATIONS)
    head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None
    return head


def _options(tables: TableOptions | None) -> TableOptions:
    from statifier.sql import TableOptions

    if tables is None:
        return TableOptions()
    if not isinstance(tables, TableOptions):
        raise TypeError(f"tables is a statifier.sql.TableOptions, not {tables!r}")
    return tables


def _redacted(url: str) -> str:
    """The URL with its password hidden (``postgresql://user:***@host/db``)."""
    return re.sub(r"^([a-z][a-z0-9+.-]*://[^:/@]*):[^@]*@", r"\1:***@", url)


def _upgrade_command(url: str, options: TableOptions) -> str:
    from statifier.sql import DEFAULT_PREFIX

    parts = [f"--url {_redacted(url)}"]
    if options.prefix != DEFAULT_PREFIX:
        parts.append(f"--prefix {options.prefix}")
    if options.schema is not None:
        parts.append(f"--schema {options.schema}")
    return " ".join(parts)


def _prepare(url: str, options: TableOptions, migrate: bool) -> None:
    """Check the tables of ``options`` are at the head revision, or migrate them."""
    from statifier.sql import migrations
    from statifier.sql.engines import database_url

    try:
        parsed = database_url(url)
    except ValueError:
        raise ValueError(f"durable executions run on PostgreSQL or SQLite, not {url!r}") from None
    sqlite = parsed.get_backend_name() == "sqlite"
    if sqlite and parsed.database in (None, "", ":memory:"):
        raise ValueError(
            "an in-memory SQLite database lasts one connection: give a file, "
            "sqlite:///app.db (or a MemoryAdapter)"
        )
    head = _head()
    if migrate:
        (_migrate_sqlite if sqlite else _migrate_postgres)(url, options)
        return
    if sqlite and not Path(str(parsed.database)).exists():
        # Connecting would create an empty file: a mistyped path would look migrated-less
        # and leave a stray database behind.
        raise NotMigrated(_redacted(url), _upgrade_command(url, options), None, head)
    revision = migrations.current(url, options)
    if revision != head:
        raise NotMigrated(_redacted(url), _upgrade_command(url, options), revision, head)


def _migrate_sqlite(url: str, options: TableOptions) -> None:
    """Migrate inside ``BEGIN IMMEDIATE`` on a database in WAL mode: one process
    migrates, the others wait for it and then find nothing to do."""
    import sqlalchemy as sa

    from statifier.sql import migrations
    from statifier.sql.engines import database_url

    engine = sa.create_engine(database_url(url), connect_args={"timeout": _MIGRATION_WAIT})
    try:
        with engine.connect() as connection:
            driver = connection.connection.driver_connection
            assert driver is not None
            driver.isolation_level = None
            # WAL first, as the adapter's connections ask for it: switching needs the
            # database to itself, so it is done here, waiting, rather than by a process
            # opening while another migrates (whose switch would answer busy at once).
            driver.execute("PRAGMA journal_mode = WAL")
            driver.execute("BEGIN IMMEDIATE")
            connection.begin()  # the transaction begun above; pysqlite emits nothing
            migrations.upgrade(connection, options)
            connection.commit()
    finally:
        engine.dispose()


def _migrate_postgres(url: str, options: TableOptions) -> None:
    """Migrate holding a transaction-scoped advisory lock: one process migrates, the
    others wait for its commit and then find nothing to do."""
    import sqlalchemy as sa

    from statifier.sql import migrations
    from statifier.sql.engines import database_url

    engine = sa.create_engine(database_url(url))
    try:
        with engine.begin() as connection:
            connection.execute(
                sa.text("SELECT pg_advisory_xact_lock(hashtextextended(:name, 0))"),
                {"name": _MIGRATION_LOCK},
            )
            migrations.upgrade(connection, options)
    finally:
        engine.dispose()
