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

from typing import Any

import sqlalchemy as sa
from alembic import op

from statifier.buckets import address_bucket, bucket_of
from statifier.sql.migrations import add_bucket, current_options, drop_bucket

revision = "statifier_0021"
down_revision: str | None = "statifier_0020"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None


def upgrade() -> None:
    add_bucket("dedupe", _buckets, ["expires_at"])


def _buckets(bind: sa.Connection, table: str) -> list[tuple[Any, int]]:
    options = current_options()
    name, schema = options.name, options.schema
    # A host's leading columns (a tenant) are part of a claim's identity: the ledger
    # row of another tenant's message of the same id is not its delivery's.
    same = "".join(f" AND l.{column.name} = d.{column.name}" for column in options.leading())
    # The ledger has no index by message: without this one, SQLite reads every ledger
    # row of a claim's binding for each claim (a quadratic join). It goes at the end.
    looked_up = name("routing_ledger_fill_0021_idx")
    routing_ledger = name("routing_ledger")
    ledger = f"{schema}.{routing_ledger}" if schema else routing_ledger
    op.create_index(looked_up, routing_ledger, ["binding_id", "message_id"], schema=schema)
    found = bind.execute(
        sa.text(
            f"SELECT d.id, d.message_id, l.scope, l.document, l.key FROM {table} AS d "
            f"LEFT JOIN {ledger} AS l ON l.binding_id = d.binding_id "
            f"AND l.message_id = d.message_id{same}"
        )
    ).all()
    op.drop_index(looked_up, table_name=routing_ledger, schema=schema)
    buckets: dict[Any, int] = {}
    for row, message_id, scope, document, key in found:
        if scope is not None and document is not None and key is not None:
            buckets[row] = address_bucket(scope, document, key)
        else:
            buckets.setdefault(row, bucket_of(message_id))
    return list(buckets.items())


def downgrade() -> None:
    drop_bucket("dedupe", ["expires_at"])
