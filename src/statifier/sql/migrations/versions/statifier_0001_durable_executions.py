"""Durable executions: charts, positions, executions and the input log.

Revision ID: statifier_0001
Revises: (none)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from statifier.sql.migrations import create_table, current_options
from statifier.sql.tables import UtcDateTime, json_document

revision = "statifier_0001"
down_revision: str | None = None
branch_labels = ("statifier",)
depends_on: str | None = None


def upgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    create_table(
        name("charts"),
        sa.Column("content_hash", sa.Text(), nullable=False),
        sa.Column("chart_blob", sa.LargeBinary(), nullable=True),
        sa.Column("name", sa.Text(), nullable=True),
        sa.Column("version", sa.Text(), nullable=True),
        sa.Column("saved_at", UtcDateTime(), nullable=False),
        sa.Column("retired_at", UtcDateTime(), nullable=True),
        sa.Column("retired_by", sa.Text(), nullable=True),
        sa.UniqueConstraint("content_hash", name=name("charts_content_hash_key")),
        schema=schema,
    )
    create_table(
        name("positions"),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("content_hash", sa.Text(), nullable=False),
        sa.Column("position_blob", sa.LargeBinary(), nullable=False),
        sa.Column("saved_at", UtcDateTime(), nullable=False),
        sa.UniqueConstraint("key", name=name("positions_key_key")),
        schema=schema,
    )
    op.create_index(
        name("positions_content_hash_idx"), name("positions"), ["content_hash"], schema=schema
    )
    create_table(
        name("executions"),
        sa.Column("execution_id", sa.Text(), nullable=False),
        sa.Column("content_hash", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("position_blob", sa.LargeBinary(), nullable=True),
        sa.Column("metadata", json_document(), nullable=False),
        sa.Column("outcome_blob", sa.LargeBinary(), nullable=True),
        sa.Column("failure", sa.Text(), nullable=True),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.Column("ended_at", UtcDateTime(), nullable=True),
        sa.UniqueConstraint("execution_id", name=name("executions_execution_id_key")),
        schema=schema,
    )
    op.create_index(
        name("executions_content_hash_status_idx"),
        name("executions"),
        ["content_hash", "status"],
        schema=schema,
    )
    op.create_index(
        name("executions_ended_at_idx"), name("executions"), ["ended_at"], schema=schema
    )
    if op.get_bind().dialect.name == "postgresql":
        op.create_index(
            name("executions_metadata_idx"),
            name("executions"),
            ["metadata"],
            schema=schema,
            postgresql_using="gin",
            postgresql_ops={"metadata": "jsonb_path_ops"},
        )
    create_table(
        name("inputs"),
        sa.Column("execution_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        # The column is `via` from statifier_0009 on: collated as the options say of it.
        options.collated(sa.Column("door", sa.Text(), nullable=False), named="via"),
        sa.Column("input_blob", sa.LargeBinary(), nullable=True),
        sa.Column("recorded_at", UtcDateTime(), nullable=False),
        sa.UniqueConstraint("execution_id", "seq", name=name("inputs_execution_id_seq_key")),
        schema=schema,
    )


def downgrade() -> None:
    options = current_options()
    for table in ("inputs", "executions", "positions", "charts"):
        op.drop_table(options.name(table), schema=options.schema)
