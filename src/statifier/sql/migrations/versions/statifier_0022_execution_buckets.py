"""Each execution row carries its bucket (``statifier.buckets.bucket_of``: its root
id's, so a durable child's is its parent's), filled for the rows already there in
Python, and the rows are indexed by bucket and id: the executions of a range of buckets
are one index range (decision 0116's first step of moving a range).

Revision ID: statifier_0022
Revises: statifier_0021
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from statifier.buckets import bucket_of
from statifier.sql.migrations import batch_columns, current_options

revision = "statifier_0022"
down_revision: str | None = "statifier_0021"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None

_CHUNK = 1_000
"""Rows whose bucket one UPDATE statement batch writes."""


def upgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    executions = name("executions")
    op.add_column(executions, sa.Column("bucket", sa.SmallInteger(), nullable=True), schema=schema)
    table = f"{schema}.{executions}" if schema else executions
    bind = op.get_bind()
    pending = bind.execute(sa.text(f"SELECT id, execution_id FROM {table}")).all()
    update = sa.text(f"UPDATE {table} SET bucket = :bucket WHERE id = :id")
    for start in range(0, len(pending), _CHUNK):
        chunk = pending[start : start + _CHUNK]
        bind.execute(update, [{"id": i, "bucket": bucket_of(e)} for i, e in chunk])
    kept = batch_columns("executions")
    with op.batch_alter_table(executions, schema=schema, reflect_args=kept) as batch:
        batch.alter_column("bucket", existing_type=sa.SmallInteger(), nullable=False)
    op.create_index(
        name("executions_bucket_execution_id_idx"),
        executions,
        ["bucket", "execution_id"],
        schema=schema,
    )


def downgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    executions = name("executions")
    op.drop_index(name("executions_bucket_execution_id_idx"), table_name=executions, schema=schema)
    kept = batch_columns("executions")
    with op.batch_alter_table(executions, schema=schema, reflect_args=kept) as batch:
        batch.drop_column("bucket")
