"""The console: its audit table, and the indexes its list pages walk.

Revision ID: statifier_0006
Revises: statifier_0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from statifier.sql.migrations import create_table, current_options
from statifier.sql.tables import UtcDateTime

revision = "statifier_0006"
down_revision: str | None = "statifier_0005"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None

# (index suffix, table suffix, columns): what the pages of the console read by.
INDEXES = (
    ("charts_name_idx", "charts", ["name"]),
    ("executions_created_at_idx", "executions", ["created_at", "execution_id"]),
    ("executions_status_created_at_idx", "executions", ["status", "created_at", "execution_id"]),
    (
        "executions_content_hash_created_at_idx",
        "executions",
        ["content_hash", "created_at", "execution_id"],
    ),
    ("inputs_recorded_at_idx", "inputs", ["recorded_at"]),
    ("addresses_key_idx", "addresses", ["key"]),
    (
        "routing_ledger_inserted_at_idx",
        "routing_ledger",
        ["inserted_at", "id", "binding_id", "outcome"],
    ),
    ("routing_ledger_outcome_inserted_at_idx", "routing_ledger", ["outcome", "inserted_at", "id"]),
    ("outbox_dead_at_idx", "outbox", ["dead_at"]),
    ("consumer_dead_letters_dead_at_idx", "consumer_dead_letters", ["dead_at"]),
)


def upgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    for index, table, columns in INDEXES:
        op.create_index(name(index), name(table), columns, schema=schema)
    create_table(
        name("console_audit"),
        sa.Column("at", UtcDateTime(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        schema=schema,
    )
    op.create_index(
        name("console_audit_at_idx"), name("console_audit"), ["at", "id"], schema=schema
    )
    op.create_index(
        name("console_audit_target_at_idx"),
        name("console_audit"),
        ["target", "at"],
        schema=schema,
    )


def downgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    op.drop_table(name("console_audit"), schema=schema)
    for index, table, _columns in reversed(INDEXES):
        op.drop_index(name(index), table_name=name(table), schema=schema)
