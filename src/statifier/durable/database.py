"""Opening the database: checking the tables' revision, or migrating them under the
migration lock, through :func:`statifier.sql.migrations.prepare` (in a thread: the
migrations are synchronous)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

from statifier.durable.errors import DurableError

__all__ = ["NotMigrated"]

if TYPE_CHECKING:
    from statifier.sql import TableOptions

_MIGRATIONS: Final = "statifier.sql:migrations"


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
        from statifier.sql import migrations

        if revision is None:
            state = "has no tables for durable executions"
        elif revision in migrations.revisions():
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


def _options(tables: TableOptions | None) -> TableOptions:
    from statifier.sql import TableOptions

    if tables is None:
        return TableOptions()
    if not isinstance(tables, TableOptions):
        raise TypeError(f"tables is a statifier.sql.TableOptions, not {tables!r}")
    return tables


_PASSWORD: Final = re.compile(r"(?i)^([a-z][a-z0-9+.-]*://[^:/@]*):[^@]*@")
_SECRET_PARAMETER: Final = re.compile(
    r"(?i)([?&;][^=&#]*(?:password|secret|token|key)[^=&#]*=)[^&;#]*"
)


def _redacted(url: str) -> str:
    """The URL with its password hidden, in its user part whatever the scheme's case
    (``postgresql://user:***@host/db``) and in a query parameter named for a secret
    (``?password=***``)."""
    return _SECRET_PARAMETER.sub(r"\1***", _PASSWORD.sub(r"\1:***@", url))


def _upgrade_command(url: str, options: TableOptions) -> str:
    from statifier.sql.tables import DEFAULT_PREFIX

    parts = [f"--url {_redacted(url)}"]
    if options.prefix != DEFAULT_PREFIX:
        parts.append(f"--prefix {options.prefix}")
    if options.schema is not None:
        parts.append(f"--schema {options.schema}")
    return " ".join(parts)


def _prepare(url: str, options: TableOptions, migrate: bool) -> None:
    """Check the tables of ``options`` are at the head revision, or migrate them: under
    the migration lock every other way of migrating holds too (``statifier db
    upgrade``, ``statifier serve``), so processes opening together migrate once."""
    from sqlalchemy.exc import ArgumentError

    from statifier.sql import migrations
    from statifier.sql.engines import lasts_one_connection

    try:
        in_memory = lasts_one_connection(url)
    except ArgumentError:
        raise ValueError(
            f"{_redacted(url)!r} is not a database URL: a SQLite file is "
            "sqlite:///app.db, PostgreSQL postgresql://user@host/db"
        ) from None
    except ValueError:
        raise ValueError(
            f"durable executions run on PostgreSQL or SQLite, not {_redacted(url)!r}"
        ) from None
    if in_memory:
        raise ValueError(
            "an in-memory SQLite database lasts one connection: give a file, "
            "sqlite:///app.db (or a MemoryAdapter)"
        )
    try:
        migrations.prepare(url, options, migrate=migrate)
    except migrations.NotAtHead as behind:
        raise NotMigrated(
            _redacted(url), _upgrade_command(url, options), behind.revision, behind.head
        ) from None
