"""Each flow group (what a debounce, batch or throttle binding holds for an address)
carries its address's bucket (decision 0121), filled for the rows already there by
``statifier.buckets.address_bucket`` in Python, and the groups are indexed by bucket
and due time: a flow worker given a range of buckets flushes its range's groups alone.

Revision ID: statifier_0018
Revises: statifier_0017
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from statifier.buckets import address_bucket
from statifier.sql.migrations import batch_columns, current_options

revision = "statifier_0018"
down_revision: str | None = "statifier_0017"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None

_CHUNK = 1_000
"""Rows whose bucket one UPDATE statement batch writes."""


def upgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    groups = name("flow_groups")
    op.add_column(groups, sa.Column("bucket", sa.SmallInteger(), nullable=True), schema=schema)
    table = f"{schema}.{groups}" if schema else groups
    bind = op.get_bind()
    pending = bind.execute(sa.text(f"SELECT id, scope, document, key FROM {table}")).all()
    update = sa.text(f"UPDATE {table} SET bucket = :bucket WHERE id = :id")
    for start in range(0, len(pending), _CHUNK):
        chunk = pending[start : start + _CHUNK]
        rows = [{"id": i, "bucket": address_bucket(s, d, k)} for i, s, d, k in chunk]
        bind.execute(update, rows)
    kept = batch_columns("flow_groups")
    with op.batch_alter_table(groups, schema=schema, reflect_args=kept) as batch:
        batch.alter_column("bucket", existing_type=sa.SmallInteger(), nullable=False)
    op.create_index(
        name("flow_groups_bucket_due_at_idx"), groups, ["bucket", "due_at"], schema=schema
    )


def downgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    groups = name("flow_groups")
    op.drop_index(name("flow_groups_bucket_due_at_idx"), table_name=groups, schema=schema)
    kept = batch_columns("flow_groups")
    with op.batch_alter_table(groups, schema=schema, reflect_args=kept) as batch:
        batch.drop_column("bucket")
