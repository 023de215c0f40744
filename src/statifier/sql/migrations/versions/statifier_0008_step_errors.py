"""The error events steps raise: a table of them, and each execution's count and time
of the last one; and the final state a finished execution ended in.

Revision ID: statifier_0008
Revises: statifier_0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from statifier.sql.migrations import batch_columns, create_table, current_options
from statifier.sql.tables import UtcDateTime

revision = "statifier_0008"
down_revision: str | None = "statifier_0007"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None


def upgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    executions = name("executions")
    op.add_column(
        executions,
        sa.Column("error_count", sa.Integer(), nullable=False, server_default="0"),
        schema=schema,
    )
    op.add_column(
        executions, sa.Column("last_error_at", UtcDateTime(), nullable=True), schema=schema
    )
    final_state = options.collated(sa.Column("final_state", sa.Text(), nullable=True))
    op.add_column(executions, final_state, schema=schema)
    op.create_index(
        name("executions_last_error_at_idx"),
        executions,
        ["last_error_at", "execution_id"],
        schema=schema,
    )
    errors = name("step_errors")
    create_table(
        errors,
        sa.Column("execution_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=True),
        # The column is `via` from statifier_0009 on: collated as the options say of it.
        options.collated(sa.Column("door", sa.Text(), nullable=False), named="via"),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("taken", sa.Boolean(), nullable=False),
        sa.Column("error_blob", sa.LargeBinary(), nullable=False),
        sa.Column("recorded_at", UtcDateTime(), nullable=False),
        schema=schema,
    )
    op.create_index(
        name("step_errors_execution_id_idx"), errors, ["execution_id", "id"], schema=schema
    )
    op.create_index(
        name("step_errors_recorded_at_idx"), errors, ["recorded_at", "id"], schema=schema
    )


def downgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    op.drop_table(name("step_errors"), schema=schema)
    executions = name("executions")
    op.drop_index(name("executions_last_error_at_idx"), table_name=executions, schema=schema)
    kept = batch_columns("executions")
    with op.batch_alter_table(executions, schema=schema, reflect_args=kept) as batch:
        batch.drop_column("final_state")
        batch.drop_column("last_error_at")
        batch.drop_column("error_count")
