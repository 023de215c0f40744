"""Each timer carries its execution's bucket (decisions 0116 and 0121), filled for the
rows already there by ``statifier.buckets.bucket_of`` in Python, and the timers are
indexed by bucket and due time: a timer worker given a range of buckets claims the due
timers of its range alone.

Revision ID: statifier_0017
Revises: statifier_0016
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from statifier.buckets import bucket_of
from statifier.sql.migrations import batch_columns, current_options

revision = "statifier_0017"
down_revision: str | None = "statifier_0016"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None

_CHUNK = 1_000
"""Rows whose bucket one UPDATE statement batch writes."""


def upgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    timers = name("timers")
    op.add_column(timers, sa.Column("bucket", sa.SmallInteger(), nullable=True), schema=schema)
    table = f"{schema}.{timers}" if schema else timers
    bind = op.get_bind()
    pending = bind.execute(sa.text(f"SELECT id, execution_id FROM {table}")).all()
    update = sa.text(f"UPDATE {table} SET bucket = :bucket WHERE id = :id")
    for start in range(0, len(pending), _CHUNK):
        chunk = pending[start : start + _CHUNK]
        bind.execute(update, [{"id": i, "bucket": bucket_of(e)} for i, e in chunk])
    kept = batch_columns("timers")
    with op.batch_alter_table(timers, schema=schema, reflect_args=kept) as batch:
        batch.alter_column("bucket", existing_type=sa.SmallInteger(), nullable=False)
    op.create_index(name("timers_bucket_due_at_idx"), timers, ["bucket", "due_at"], schema=schema)


def downgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    timers = name("timers")
    op.drop_index(name("timers_bucket_due_at_idx"), table_name=timers, schema=schema)
    kept = batch_columns("timers")
    with op.batch_alter_table(timers, schema=schema, reflect_args=kept) as batch:
        batch.drop_column("bucket")
