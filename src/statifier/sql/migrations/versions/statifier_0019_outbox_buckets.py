"""Each outbox row carries a bucket (decision 0122), filled for the rows already there
in Python: the sending execution's (``statifier.buckets.bucket_of``), or for a row
handed off outside any execution the bucket of its ``(queue, key)``
(``statifier.buckets.outbox_bucket``); and the rows are indexed by bucket and next
attempt: a drain given a range of buckets leases its range's rows alone.

Revision ID: statifier_0019
Revises: statifier_0018
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from statifier.buckets import bucket_of, outbox_bucket
from statifier.sql.migrations import batch_columns, current_options

revision = "statifier_0019"
down_revision: str | None = "statifier_0018"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None

_CHUNK = 1_000
"""Rows whose bucket one UPDATE statement batch writes."""


def upgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    outbox = name("outbox")
    op.add_column(outbox, sa.Column("bucket", sa.SmallInteger(), nullable=True), schema=schema)
    table = f"{schema}.{outbox}" if schema else outbox
    bind = op.get_bind()
    pending = bind.execute(sa.text(f"SELECT id, queue, key, execution_id FROM {table}")).all()
    update = sa.text(f"UPDATE {table} SET bucket = :bucket WHERE id = :id")
    for start in range(0, len(pending), _CHUNK):
        chunk = pending[start : start + _CHUNK]
        rows = [
            {"id": i, "bucket": outbox_bucket(q, k) if e is None else bucket_of(e)}
            for i, q, k, e in chunk
        ]
        bind.execute(update, rows)
    kept = batch_columns("outbox")
    with op.batch_alter_table(outbox, schema=schema, reflect_args=kept) as batch:
        batch.alter_column("bucket", existing_type=sa.SmallInteger(), nullable=False)
    op.create_index(
        name("outbox_bucket_next_attempt_at_idx"),
        outbox,
        ["bucket", "next_attempt_at"],
        schema=schema,
    )


def downgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    outbox = name("outbox")
    op.drop_index(name("outbox_bucket_next_attempt_at_idx"), table_name=outbox, schema=schema)
    kept = batch_columns("outbox")
    with op.batch_alter_table(outbox, schema=schema, reflect_args=kept) as batch:
        batch.drop_column("bucket")
