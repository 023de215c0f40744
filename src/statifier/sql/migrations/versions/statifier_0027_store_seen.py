"""When a running service last said it serves the store (``store_place.seen_at``),
so that ``statifier reshard`` refuses stores a service runs on (decision 0127).

Revision ID: statifier_0027
Revises: statifier_0026
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from statifier.sql.migrations import batch_columns, current_options
from statifier.sql.types import UtcDateTime

revision = "statifier_0027"
down_revision: str | None = "statifier_0026"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None


def upgrade() -> None:
    options = current_options()
    op.add_column(
        options.name("store_place"),
        sa.Column("seen_at", UtcDateTime(), nullable=True),
        schema=options.schema,
    )


def downgrade() -> None:
    options = current_options()
    table = options.name("store_place")
    kept = batch_columns("store_place")
    with op.batch_alter_table(table, schema=options.schema, reflect_args=kept) as batch:
        batch.drop_column("seen_at")
