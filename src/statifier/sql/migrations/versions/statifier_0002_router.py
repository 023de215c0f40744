"""The event router: addresses, dedupe claims and the routing ledger.

Revision ID: statifier_0002
Revises: statifier_0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from statifier.sql.migrations import create_table, current_options
from statifier.sql.tables import UtcDateTime

revision = "statifier_0002"
down_revision: str | None = "statifier_0001"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None


def upgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    create_table(
        name("addresses"),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("execution_id", sa.Text(), nullable=False),
        sa.Column("inserted_at", UtcDateTime(), nullable=False),
        sa.Column("terminal_seen_at", UtcDateTime(), nullable=True),
        sa.UniqueConstraint(
            "scope", "document", "key", name=name("addresses_scope_document_key_key")
        ),
        schema=schema,
    )
    op.create_index(
        name("addresses_execution_id_idx"), name("addresses"), ["execution_id"], schema=schema
    )
    create_table(
        name("dedupe"),
        sa.Column("binding_id", sa.Text(), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=False),
        sa.UniqueConstraint(
            "binding_id", "message_id", name=name("dedupe_binding_id_message_id_key")
        ),
        schema=schema,
    )
    op.create_index(name("dedupe_expires_at_idx"), name("dedupe"), ["expires_at"], schema=schema)
    create_table(
        name("routing_ledger"),
        sa.Column("binding_id", sa.Text(), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=True),
        sa.Column("scope", sa.Text(), nullable=True),
        sa.Column("source", sa.Text(), nullable=True),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("document", sa.Text(), nullable=True),
        sa.Column("key", sa.Text(), nullable=True),
        sa.Column("execution_id", sa.Text(), nullable=True),
        sa.Column("inserted_at", UtcDateTime(), nullable=False),
        schema=schema,
    )
    op.create_index(
        name("routing_ledger_execution_id_idx"),
        name("routing_ledger"),
        ["execution_id"],
        schema=schema,
    )
    op.create_index(
        name("routing_ledger_binding_id_inserted_at_idx"),
        name("routing_ledger"),
        ["binding_id", "inserted_at"],
        schema=schema,
    )


def downgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    op.drop_index(
        name("routing_ledger_binding_id_inserted_at_idx"),
        table_name=name("routing_ledger"),
        schema=schema,
    )
    op.drop_index(
        name("routing_ledger_execution_id_idx"), table_name=name("routing_ledger"), schema=schema
    )
    op.drop_table(name("routing_ledger"), schema=schema)
    op.drop_index(name("dedupe_expires_at_idx"), table_name=name("dedupe"), schema=schema)
    op.drop_table(name("dedupe"), schema=schema)
    op.drop_index(name("addresses_execution_id_idx"), table_name=name("addresses"), schema=schema)
    op.drop_table(name("addresses"), schema=schema)
