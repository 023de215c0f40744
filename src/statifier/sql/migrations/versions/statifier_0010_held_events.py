"""The events a paused execution is sent, kept in order until it resumes.

Revision ID: statifier_0010
Revises: statifier_0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from statifier.sql.migrations import create_table, current_options
from statifier.sql.tables import UtcDateTime

revision = "statifier_0010"
down_revision: str | None = "statifier_0009"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None


def upgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    held = name("held_events")
    create_table(
        held,
        sa.Column("execution_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("via", sa.Text(), nullable=False),
        sa.Column("internal", sa.Boolean(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=True),
        sa.Column("message_id", sa.Text(), nullable=True),
        sa.Column("event_blob", sa.LargeBinary(), nullable=False),
        sa.Column("held_at", UtcDateTime(), nullable=False),
        sa.UniqueConstraint("execution_id", "seq", name=name("held_events_execution_id_seq_key")),
        schema=schema,
    )


def downgrade() -> None:
    options = current_options()
    op.drop_table(options.name("held_events"), schema=options.schema)
