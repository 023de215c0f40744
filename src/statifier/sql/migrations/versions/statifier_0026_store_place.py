"""The ``store_place`` table: which place of how many stores a database holds, and
whether a reshard is moving its buckets, so that a process started with another list
of stores than the one the data was laid out for is refused (decision 0127).

Revision ID: statifier_0026
Revises: statifier_0025
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from statifier.sql.migrations import create_table, current_options
from statifier.sql.types import UtcDateTime

revision = "statifier_0026"
down_revision: str | None = "statifier_0025"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None


def upgrade() -> None:
    options = current_options()
    create_table(
        options.name("store_place"),
        sa.Column("place", sa.SmallInteger(), nullable=True),
        sa.Column("stores", sa.SmallInteger(), nullable=True),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("changed_at", UtcDateTime(), nullable=False),
        schema=options.schema,
    )


def downgrade() -> None:
    options = current_options()
    op.drop_table(options.name("store_place"), schema=options.schema)
