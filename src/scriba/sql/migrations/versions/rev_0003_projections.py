"""scriba 3: one row per projection, holding its fencing generation.

Revision ID: scriba_0003
Revises: scriba_0002

Frozen history, like the earlier versions; creating a table that is already there is
a no-op.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic.operations import Operations

revision = "scriba_0003"
down_revision = "scriba_0002"
branch_labels = None
depends_on = None


def upgrade(*, op: Operations, prefix: str, schema: str | None) -> None:
    """Create the projections table, where missing."""
    projections = f"{prefix}projections"
    if sa.inspect(op.get_bind()).has_table(projections, schema=schema):
        return
    op.create_table(
        projections,
        sa.Column("projection_name", sa.String(255), nullable=False),
        sa.Column("projection_version", sa.Integer(), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(
            "projection_name", "projection_version", name=f"pk_{prefix}projections"
        ),
        schema=schema,
    )


def downgrade(*, op: Operations, prefix: str, schema: str | None) -> None:
    """Drop the projections table, where present."""
    projections = f"{prefix}projections"
    if sa.inspect(op.get_bind()).has_table(projections, schema=schema):
        op.drop_table(projections, schema=schema)
