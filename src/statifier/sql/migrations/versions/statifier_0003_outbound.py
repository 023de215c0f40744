"""The router's outbound half: timers, the outbox and source-invoke subscriptions.

Revision ID: statifier_0003
Revises: statifier_0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from statifier.sql.migrations import create_table, current_options
from statifier.sql.tables import UtcDateTime, json_document

revision = "statifier_0003"
down_revision: str | None = "statifier_0002"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None


def upgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    create_table(
        name("timers"),
        sa.Column("execution_id", sa.Text(), nullable=False),
        sa.Column("send_id", sa.Text(), nullable=False),
        sa.Column("dedup_key", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("due_at", UtcDateTime(), nullable=False),
        sa.Column("step_position", sa.Integer(), nullable=False),
        sa.Column("payload", json_document(), nullable=False),
        sa.Column("inserted_at", UtcDateTime(), nullable=False),
        sa.UniqueConstraint("dedup_key", name=name("timers_dedup_key_key")),
        schema=schema,
    )
    op.create_index(name("timers_due_at_idx"), name("timers"), ["due_at"], schema=schema)
    op.create_index(
        name("timers_execution_id_send_id_idx"),
        name("timers"),
        ["execution_id", "send_id"],
        schema=schema,
    )
    create_table(
        name("outbox"),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("payload", json_document(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", UtcDateTime(), nullable=False),
        sa.Column("lease", sa.Text(), nullable=True),
        sa.Column("leased_until", UtcDateTime(), nullable=True),
        sa.Column("sent_at", UtcDateTime(), nullable=True),
        sa.Column("dead_at", UtcDateTime(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("inserted_at", UtcDateTime(), nullable=False),
        sa.UniqueConstraint("queue", "key", name=name("outbox_queue_key_key")),
        schema=schema,
    )
    op.create_index(
        name("outbox_next_attempt_at_idx"), name("outbox"), ["next_attempt_at"], schema=schema
    )
    create_table(
        name("subscriptions"),
        sa.Column("binding_id", sa.Text(), nullable=False),
        sa.Column("execution_id", sa.Text(), nullable=False),
        sa.Column("invoke_id", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("inserted_at", UtcDateTime(), nullable=False),
        sa.UniqueConstraint(
            "execution_id", "invoke_id", name=name("subscriptions_execution_id_invoke_id_key")
        ),
        schema=schema,
    )
    op.create_index(
        name("subscriptions_binding_id_scope_key_idx"),
        name("subscriptions"),
        ["binding_id", "scope", "key"],
        schema=schema,
    )


def downgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    op.drop_index(
        name("subscriptions_binding_id_scope_key_idx"),
        table_name=name("subscriptions"),
        schema=schema,
    )
    op.drop_table(name("subscriptions"), schema=schema)
    op.drop_index(name("outbox_next_attempt_at_idx"), table_name=name("outbox"), schema=schema)
    op.drop_table(name("outbox"), schema=schema)
    op.drop_index(name("timers_execution_id_send_id_idx"), table_name=name("timers"), schema=schema)
    op.drop_index(name("timers_due_at_idx"), table_name=name("timers"), schema=schema)
    op.drop_table(name("timers"), schema=schema)
