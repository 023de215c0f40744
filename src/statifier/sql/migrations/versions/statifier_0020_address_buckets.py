"""Each address row carries its address's bucket (decision 0122), filled for the rows
already there by ``statifier.buckets.address_bucket`` in Python, and the rows are
indexed by bucket and key: the address reaper given a range of buckets pages through
its range alone.

Revision ID: statifier_0020
Revises: statifier_0019
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from statifier.buckets import address_bucket
from statifier.sql.migrations import batch_columns, current_options

revision = "statifier_0020"
down_revision: str | None = "statifier_0019"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None

_CHUNK = 1_000
"""Rows whose bucket one UPDATE statement batch writes."""


def upgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    addresses = name("addresses")
    op.add_column(addresses, sa.Column("bucket", sa.SmallInteger(), nullable=True), schema=schema)
    table = f"{schema}.{addresses}" if schema else addresses
    bind = op.get_bind()
    pending = bind.execute(sa.text(f"SELECT id, scope, document, key FROM {table}")).all()
    update = sa.text(f"UPDATE {table} SET bucket = :bucket WHERE id = :id")
    for start in range(0, len(pending), _CHUNK):
        chunk = pending[start : start + _CHUNK]
        rows = [{"id": i, "bucket": address_bucket(s, d, k)} for i, s, d, k in chunk]
        bind.execute(update, rows)
    kept = batch_columns("addresses")
    with op.batch_alter_table(addresses, schema=schema, reflect_args=kept) as batch:
        batch.alter_column("bucket", existing_type=sa.SmallInteger(), nullable=False)
    op.create_index(name("addresses_bucket_id_idx"), addresses, ["bucket", "id"], schema=schema)


def downgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    addresses = name("addresses")
    op.drop_index(name("addresses_bucket_id_idx"), table_name=addresses, schema=schema)
    kept = batch_columns("addresses")
    with op.batch_alter_table(addresses, schema=schema, reflect_args=kept) as batch:
        batch.drop_column("bucket")
