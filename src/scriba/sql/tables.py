"""The four tables scriba keeps beside a read model, as SQLAlchemy Core metadata.

- ``positions``: one cursor per (projection name, version, stream), the greatest position
  committed for that stream.
- ``watermarks``: one row per projection, the highest position with every event at or
  below it accounted for, and that event's time (the lag is measured from it).
- ``dead_letters``: events given up on, kept as a record of what failed.
- ``projections``: one row per projection, its fencing ``generation``: raised each
  time a reader claims the projection (and by a reset), checked by every commit.

Every name carries a prefix (``scriba_`` unless told otherwise) and the tables can live
in a schema of their own, so several hosts, or several test runs, share a database
without meeting.

>>> tables = define_tables(prefix="shop_")
>>> [table.name for table in tables.metadata.sorted_tables]
['shop_dead_letters', 'shop_positions', 'shop_projections', 'shop_watermarks']
>>> define_tables(prefix="Bad-Prefix")
Traceback (most recent call last):
...
ValueError: a table prefix is lowercase letters, digits and underscores...

The migrations in :mod:`scriba.sql.migrate` build exactly these tables; the metadata is
what the SQL target reads and writes through.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

import sqlalchemy as sa

from statifier.sql.types import UtcDateTime, json_document

__all__ = ["DEFAULT_PREFIX", "MAX_PREFIX_LENGTH", "Tables", "define_tables"]

DEFAULT_PREFIX: Final = "scriba_"
MAX_PREFIX_LENGTH: Final = 32
"""Long enough for any sensible prefix; short enough that every derived name (indexes,
the migration version table) stays inside PostgreSQL's 63-character identifiers."""

NAME_LENGTH: Final = 255
"""Projection names and event types are ``varchar(255)``."""

ERROR_KIND_LENGTH: Final = 64

_PREFIX = re.compile(r"[a-z_][a-z0-9_]*")
_SCHEMA = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def autoincrement_id() -> sa.types.TypeEngine[int]:
    """A 64-bit id on PostgreSQL (``bigserial``); SQLite only autoincrements ``INTEGER
    PRIMARY KEY`` (its rowid), which is 64-bit there anyway."""
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


@dataclass(frozen=True, slots=True)
class Tables:
    """scriba's tables under one prefix and schema.

    Attributes:
        metadata: holds the four tables (and nothing else, unless a ``metadata`` was
            given to :func:`define_tables`).
        positions: per-stream cursors; primary key (projection_name,
            projection_version, stream_id).
        watermarks: one contiguous watermark per projection.
        dead_letters: what failed; ``id`` autoincrements.
        projections: one fencing generation per projection; never deleted, so a
            generation only ever grows.
        prefix: the prefix of every table and index name.
        schema: the schema the tables live in, ``None`` for the default one.
    """

    metadata: sa.MetaData
    positions: sa.Table
    watermarks: sa.Table
    dead_letters: sa.Table
    projections: sa.Table
    prefix: str
    schema: str | None

    @property
    def version_table(self) -> str:
        """The name of the table Alembic records scriba's migration revision in."""
        return version_table_name(self.prefix)


def check_prefix(prefix: str) -> str:
    """Return ``prefix`` if it is a usable table prefix, else raise ``ValueError``.

    An empty prefix is allowed (tables in a schema of their own need none).
    """
    if not isinstance(prefix, str):
        raise TypeError(f"a table prefix is a str, not {prefix!r}")
    if prefix and (len(prefix) > MAX_PREFIX_LENGTH or not _PREFIX.fullmatch(prefix)):
        raise ValueError(
            "a table prefix is lowercase letters, digits and underscores, starting with a "
            f"letter or underscore, at most {MAX_PREFIX_LENGTH} long; got {prefix!r}"
        )
    return prefix


def check_schema(schema: str | None) -> str | None:
    """Return ``schema`` if it is ``None`` or a plain lowercase identifier, else raise
    ``ValueError``."""
    if schema is not None and not _SCHEMA.fullmatch(schema):
        raise ValueError(
            "a schema name is lowercase letters, digits and underscores, starting with a "
            f"letter or underscore, at most 63 long; got {schema!r}"
        )
    return schema


def version_table_name(prefix: str) -> str:
    """The migration version table for ``prefix``, kept apart from a host's own."""
    return f"{check_prefix(prefix)}alembic_version"


def define_tables(
    prefix: str = DEFAULT_PREFIX,
    schema: str | None = None,
    metadata: sa.MetaData | None = None,
) -> Tables:
    """Define scriba's tables with names starting with ``prefix``, in ``schema``.

    Args:
        prefix: prepended to every table and index name (see :func:`check_prefix`).
        schema: the schema to put them in; ``None`` for the connection's default.
        metadata: add the tables to this metadata (a host's own, say) instead of a
            new one.

    Raises:
        ValueError: the prefix or schema is not a plain identifier, or ``metadata``
            already holds tables with these names.
    """
    check_prefix(prefix)
    check_schema(schema)
    metadata = sa.MetaData() if metadata is None else metadata
    positions = sa.Table(
        f"{prefix}positions",
        metadata,
        sa.Column("projection_name", sa.String(NAME_LENGTH), nullable=False),
        sa.Column("projection_version", sa.Integer(), nullable=False),
        sa.Column("stream_id", sa.Text(), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint(
            "projection_name", "projection_version", "stream_id", name=f"pk_{prefix}positions"
        ),
        sa.Index(f"ix_{prefix}positions_projection", "projection_name", "projection_version"),
        schema=schema,
    )
    watermarks = sa.Table(
        f"{prefix}watermarks",
        metadata,
        sa.Column("projection_name", sa.String(NAME_LENGTH), nullable=False),
        sa.Column("projection_version", sa.Integer(), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("occurred_at", UtcDateTime(), nullable=True),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint(
            "projection_name", "projection_version", name=f"pk_{prefix}watermarks"
        ),
        schema=schema,
    )
    dead_letters = sa.Table(
        f"{prefix}dead_letters",
        metadata,
        sa.Column("id", autoincrement_id(), autoincrement=True, nullable=False),
        sa.Column("projection_name", sa.String(NAME_LENGTH), nullable=False),
        sa.Column("projection_version", sa.Integer(), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("stream_id", sa.Text(), nullable=True),
        sa.Column("event_type", sa.String(NAME_LENGTH), nullable=True),
        sa.Column("event_data", json_document(), nullable=False),
        sa.Column("error_kind", sa.String(ERROR_KIND_LENGTH), nullable=False),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("error_stacktrace", sa.Text(), nullable=True),
        sa.Column(
            "occurred_at", UtcDateTime(), nullable=False, server_default=sa.func.current_timestamp()
        ),
        sa.PrimaryKeyConstraint("id", name=f"pk_{prefix}dead_letters"),
        sa.Index(
            f"ix_{prefix}dead_letters_projection", "projection_name", "projection_version", "id"
        ),
        schema=schema,
    )
    projections = sa.Table(
        f"{prefix}projections",
        metadata,
        sa.Column("projection_name", sa.String(NAME_LENGTH), nullable=False),
        sa.Column("projection_version", sa.Integer(), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("claimed_at", UtcDateTime(), nullable=False),
        sa.PrimaryKeyConstraint(
            "projection_name", "projection_version", name=f"pk_{prefix}projections"
        ),
        schema=schema,
    )
    return Tables(metadata, positions, watermarks, dead_letters, projections, prefix, schema)
