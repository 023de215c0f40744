"""Durable children's answers and fan-out settlements.

Revision ID: statifier_0005
Revises: statifier_0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from statifier.sql.migrations import create_table, current_options
from statifier.sql.tables import UtcDateTime

revision = "statifier_0005"
down_revision: str | None = "statifier_0004"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None


def upgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    create_table(
        name("child_answers"),
        sa.Column("child_id", sa.Text(), nullable=False),
        sa.Column("parent_id", sa.Text(), nullable=False),
        sa.Column("invoke_id", sa.Text(), nullable=False),
        sa.Column("content_hash", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("failure", sa.Text(), nullable=True),
        sa.Column("answer_blob", sa.LargeBinary(), nullable=True),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("delivered_at", UtcDateTime(), nullable=True),
        sa.UniqueConstraint("child_id", name=name("child_answers_child_id_key")),
        schema=schema,
    )
    op.create_index(
        name("child_answers_delivered_at_created_at_idx"),
        name("child_answers"),
        ["delivered_at", "created_at"],
        schema=schema,
    )
    op.create_index(
        name("child_answers_content_hash_idx"),
        name("child_answers"),
        ["content_hash"],
        schema=schema,
    )
    create_table(
        name("settlements"),
        sa.Column("parent_id", sa.Text(), nullable=False),
        sa.Column("invoke_id", sa.Text(), nullable=False),
        sa.Column("settled_at", UtcDateTime(), nullable=False),
        sa.UniqueConstraint(
            "parent_id", "invoke_id", name=name("settlements_parent_id_invoke_id_key")
        ),
        schema=schema,
    )


def downgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    op.drop_table(name("settlements"), schema=schema)
    op.drop_index(
        name("child_answers_content_hash_idx"), table_name=name("child_answers"), schema=schema
    )
    op.drop_index(
        name("child_answers_delivered_at_created_at_idx"),
        table_name=name("child_answers"),
        schema=schema,
    )
    op.drop_table(name("child_answers"), schema=schema)
