"""scriba 1: per-stream cursors and dead letters.

Revision ID: scriba_0001
Revises: (none)

Frozen history: this file states the tables as version 1 created them and never
imports the current table definitions. Each step first looks at what exists, so
running it over tables that are already there changes nothing.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic.operations import Operations
from sqlalchemy.dialects import postgresql

revision = "scriba_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade(*, op: Operations, prefix: str, schema: str | None) -> None:
    """Create the positions and dead-letter tables and their indexes, where missing."""
    inspector = sa.inspect(op.get_bind())
    positions = f"{prefix}positions"
    if not inspector.has_table(positions, schema=schema):
        op.create_table(
            positions,
            sa.Column("projection_name", sa.String(255), nullable=False),
            sa.Column("projection_version", sa.Integer(), nullable=False),
            sa.Column("stream_id", sa.Text(), nullable=False),
            sa.Column("position", sa.BigInteger(), nullable=False),
            sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
            sa.PrimaryKeyConstraint(
                "projection_name",
                "projection_version",
                "stream_id",
                name=f"pk_{prefix}positions",
            ),
            schema=schema,
        )
    _create_index_if_missing(
        op,
        inspector,
        f"ix_{prefix}positions_projection",
        positions,
        ["projection_name", "projection_version"],
        schema,
    )
    dead_letters = f"{prefix}dead_letters"
    if not inspector.has_table(dead_letters, schema=schema):
        op.create_table(
            dead_letters,
            sa.Column(
                "id",
                sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                autoincrement=True,
                nullable=False,
            ),
            sa.Column("projection_name", sa.String(255), nullable=False),
            sa.Column("projection_version", sa.Integer(), nullable=False),
            sa.Column("position", sa.BigInteger(), nullable=False),
            sa.Column("stream_id", sa.Text(), nullable=True),
            sa.Column("event_type", sa.String(255), nullable=True),
            sa.Column(
                "event_data",
                sa.JSON().with_variant(postgresql.JSONB(), "postgresql"),
                nullable=False,
            ),
            sa.Column("error_kind", sa.String(64), nullable=False),
            sa.Column("error_message", sa.Text(), nullable=True),
            sa.Column("error_stacktrace", sa.Text(), nullable=True),
            sa.Column(
                "occurred_at",
                sa.DateTime(timezone=True),
                nullable=False,
                server_default=sa.func.current_timestamp(),
            ),
            sa.PrimaryKeyConstraint("id", name=f"pk_{prefix}dead_letters"),
            schema=schema,
        )
    _create_index_if_missing(
        op,
        inspector,
        f"ix_{prefix}dead_letters_projection",
        dead_letters,
        ["projection_name", "projection_version", "id"],
        schema,
    )


def downgrade(*, op: Operations, prefix: str, schema: str | None) -> None:
    """Drop the dead-letter and positions tables, where present."""
    inspector = sa.inspect(op.get_bind())
    for table in (f"{prefix}dead_letters", f"{prefix}positions"):
        if inspector.has_table(table, schema=schema):
            op.drop_table(table, schema=schema)


def _create_index_if_missing(
    op: Operations,
    inspector: sa.Inspector,
    name: str,
    table: str,
    columns: list[str],
    schema: str | None,
) -> None:
    existing = {index["name"] for index in inspector.get_indexes(table, schema=schema)}
    if name not in existing:
        op.create_index(name, table, columns, schema=schema)
