"""What caps on active executions keep: the executions counted against a document's
cap, and the creates a cap holds until a slot frees.

Revision ID: statifier_0014
Revises: statifier_0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from statifier.sql.migrations import create_table, current_options
from statifier.sql.tables import UtcDateTime

revision = "statifier_0014"
down_revision: str | None = "statifier_0013"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None


def upgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    slots = name("active_slots")
    create_table(
        slots,
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("execution_id", sa.Text(), nullable=False),
        sa.Column("inserted_at", UtcDateTime(), nullable=False),
        sa.UniqueConstraint("execution_id", name=name("active_slots_execution_id_key")),
        schema=schema,
    )
    op.create_index(
        name("active_slots_document_scope_idx"), slots, ["document", "scope"], schema=schema
    )
    held = name("held_creates")
    create_table(
        held,
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("binding_id", sa.Text(), nullable=False),
        sa.Column("create_mode", sa.Text(), nullable=False),
        sa.Column("on_error", sa.Text(), nullable=True),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=True),
        sa.Column("event_blob", sa.LargeBinary(), nullable=False),
        sa.Column("arrived_at", UtcDateTime(), nullable=False),
        sa.UniqueConstraint(
            "document", "scope", "key", "seq", name=name("held_creates_document_scope_key_seq_key")
        ),
        schema=schema,
    )
    op.create_index(
        name("held_creates_document_arrived_at_idx"),
        held,
        ["document", "arrived_at"],
        schema=schema,
    )


def downgrade() -> None:
    options = current_options()
    op.drop_table(options.name("held_creates"), schema=options.schema)
    op.drop_table(options.name("active_slots"), schema=options.schema)
