"""Each dedupe claim carries the bucket of the address it was made for (decision
0122), and the claims are indexed by bucket and expiry: the dedupe reaper given a
range of buckets deletes its range's expired claims alone.

A claim row names its binding and message, not its address: the rows already there
take the address of the routing-ledger row their delivery wrote in the same
transaction (``statifier.buckets.address_bucket``, in Python), and a claim whose
ledger rows are gone, or named no key, the bucket of its message id
(``statifier.buckets.bucket_of``, where a sharded router writes a keyless refusal).

Revision ID: statifier_0021
Revises: statifier_0020
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from statifier.buckets import address_bucket, bucket_of
from statifier.sql.migrations import batch_columns, current_options

revision = "statifier_0021"
down_revision: str | None = "statifier_0020"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None

_CHUNK = 1_000
"""Rows whose bucket one UPDATE statement batch writes."""


def upgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    dedupe = name("dedupe")
    op.add_column(dedupe, sa.Column("bucket", sa.SmallInteger(), nullable=True), schema=schema)
    table = f"{schema}.{dedupe}" if schema else dedupe
    # A host's leading columns (a tenant) are part of a claim's identity: the ledger
    # row of another tenant's message of the same id is not its delivery's.
    same = "".join(f" AND l.{column.name} = d.{column.name}" for column in options.leading())
    # The ledger has no index by message: without this one, SQLite reads every ledger
    # row of a claim's binding for each claim (a quadratic join). It goes at the end.
    looked_up = name("routing_ledger_fill_0021_idx")
    routing_ledger = name("routing_ledger")
    ledger = f"{schema}.{routing_ledger}" if schema else routing_ledger
    op.create_index(looked_up, routing_ledger, ["binding_id", "message_id"], schema=schema)
    bind = op.get_bind()
    found = bind.execute(
        sa.text(
            f"SELECT d.id, d.message_id, l.scope, l.document, l.key FROM {table} AS d "
            f"LEFT JOIN {ledger} AS l ON l.binding_id = d.binding_id "
            f"AND l.message_id = d.message_id{same}"
        )
    ).all()
    op.drop_index(looked_up, table_name=routing_ledger, schema=schema)
    buckets: dict[object, int] = {}
    for row_id, message_id, scope, document, key in found:
        if scope is not None and document is not None and key is not None:
            buckets[row_id] = address_bucket(scope, document, key)
        else:
            buckets.setdefault(row_id, bucket_of(message_id))
    pending = list(buckets.items())
    update = sa.text(f"UPDATE {table} SET bucket = :bucket WHERE id = :id")
    for start in range(0, len(pending), _CHUNK):
        chunk = pending[start : start + _CHUNK]
        bind.execute(update, [{"id": row_id, "bucket": bucket} for row_id, bucket in chunk])
    kept = batch_columns("dedupe")
    with op.batch_alter_table(dedupe, schema=schema, reflect_args=kept) as batch:
        batch.alter_column("bucket", existing_type=sa.SmallInteger(), nullable=False)
    op.create_index(
        name("dedupe_bucket_expires_at_idx"), dedupe, ["bucket", "expires_at"], schema=schema
    )


def downgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    dedupe = name("dedupe")
    op.drop_index(name("dedupe_bucket_expires_at_idx"), table_name=dedupe, schema=schema)
    kept = batch_columns("dedupe")
    with op.batch_alter_table(dedupe, schema=schema, reflect_args=kept) as batch:
        batch.drop_column("bucket")
