"""scriba 2: the contiguous watermark of each projection.

Revision ID: scriba_0002
Revises: scriba_0001

Frozen history, like version 1; creating a table that is already there is a no-op.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic.operations import Operations

revision = "scriba_0002"
down_revision = "scriba_0001"
branch_labels = None
depends_on = None


def upgrade(*, op: Operations, prefix: str, schema: str | None) -> None:
    """Create the watermarks table, where missing."""
    watermarks = f"{prefix}watermarks"
    if sa.inspect(op.get_bind()).has_table(watermarks, schema=schema):
        return
    op.create_table(
        watermarks,
        sa.Column("projection_name", sa.String(255), nullable=False),
        sa.Column("projection_version", sa.Integer(), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(
            "projection_name", "projection_version", name=f"pk_{prefix}watermarks"
        ),
        schema=schema,
    )


def downgrade(*, op: Operations, prefix: str, schema: str | None) -> None:
    """Drop the watermarks table, where present."""
    watermarks = f"{prefix}watermarks"
    if sa.inspect(op.get_bind()).has_table(watermarks, schema=schema):
        op.drop_table(watermarks, schema=schema)
