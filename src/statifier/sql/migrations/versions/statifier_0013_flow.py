"""What debounce, batch and throttle bindings hold: a row an address (how many events,
when due, the throttle's window) and the events themselves, in order.

Revision ID: statifier_0013
Revises: statifier_0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from statifier.sql.migrations import create_table, current_options
from statifier.sql.tables import UtcDateTime

revision = "statifier_0013"
down_revision: str | None = "statifier_0012"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None


def upgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    groups = name("flow_groups")
    create_table(
        groups,
        sa.Column("binding_id", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column("held", sa.Integer(), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column("first_at", UtcDateTime(), nullable=True),
        sa.Column("window_start", UtcDateTime(), nullable=True),
        sa.Column("window_count", sa.Integer(), nullable=False),
        sa.Column("due_at", UtcDateTime(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.UniqueConstraint(
            "binding_id", "scope", "key", name=name("flow_groups_binding_id_scope_key_key")
        ),
        schema=schema,
    )
    op.create_index(name("flow_groups_due_at_idx"), groups, ["due_at"], schema=schema)
    create_table(
        name("flow_events"),
        sa.Column("binding_id", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=True),
        sa.Column("data_blob", sa.LargeBinary(), nullable=False),
        sa.Column("arrived_at", UtcDateTime(), nullable=False),
        sa.UniqueConstraint(
            "binding_id",
            "scope",
            "key",
            "seq",
            name=name("flow_events_binding_id_scope_key_seq_key"),
        ),
        schema=schema,
    )


def downgrade() -> None:
    options = current_options()
    op.drop_table(options.name("flow_events"), schema=options.schema)
    op.drop_table(options.name("flow_groups"), schema=options.schema)
