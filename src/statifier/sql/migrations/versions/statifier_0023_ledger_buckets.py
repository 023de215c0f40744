"""Each routing-ledger row carries its bucket (``statifier.buckets.ledger_bucket``: its
address's, else its execution's, else its message id's), filled for the rows already
there in Python, and the rows are indexed by bucket and insert time: a ledger reaper
given a range of buckets deletes its range's old rows by that index (decision 0125).

Revision ID: statifier_0023
Revises: statifier_0022
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa

from statifier.buckets import ledger_bucket
from statifier.sql.migrations import add_bucket, drop_bucket

revision = "statifier_0023"
down_revision: str | None = "statifier_0022"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None


def upgrade() -> None:
    add_bucket("routing_ledger", _buckets, ["inserted_at"])


def _buckets(bind: sa.Connection, table: str) -> Iterator[tuple[Any, int]]:
    rows = bind.execute(
        sa.text(
            f"SELECT id, binding_id, scope, document, key, execution_id, message_id FROM {table}"
        )
    )
    for row, binding_id, scope, document, key, execution_id, message_id in rows:
        yield (
            row,
            ledger_bucket(
                binding_id,
                scope=scope,
                document=document,
                key=key,
                execution_id=execution_id,
                message_id=message_id,
            ),
        )


def downgrade() -> None:
    drop_bucket("routing_ledger", ["inserted_at"])
