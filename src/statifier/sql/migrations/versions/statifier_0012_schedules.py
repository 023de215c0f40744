"""The schedules: each one's definition, whether it is paused, its next fire and what
its last fires did.

Revision ID: statifier_0012
Revises: statifier_0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from statifier.sql.migrations import create_table, current_options
from statifier.sql.tables import UtcDateTime, json_document

revision = "statifier_0012"
down_revision: str | None = "statifier_0011"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None


def upgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    schedules = name("schedules")
    create_table(
        schedules,
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("definition", json_document(), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("next_fire_at", UtcDateTime(), nullable=False),
        sa.Column("due_at", UtcDateTime(), nullable=False),
        sa.Column("last_fire_at", UtcDateTime(), nullable=True),
        sa.Column("last_made_at", UtcDateTime(), nullable=True),
        sa.Column("fired", sa.BigInteger(), nullable=False),
        sa.Column("skipped", sa.BigInteger(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.UniqueConstraint("name", name=name("schedules_name_key")),
        schema=schema,
    )
    op.create_index(name("schedules_due_at_idx"), schedules, ["due_at"], schema=schema)


def downgrade() -> None:
    options = current_options()
    op.drop_table(options.name("schedules"), schema=options.schema)
