"""Each saved position carries its key's bucket (``statifier.buckets.bucket_of``),
filled for the rows already there in Python, and the rows are indexed by bucket and
key: a move of a range of buckets reads its range's positions by that index, never
the whole table (decision 0126).

Revision ID: statifier_0024
Revises: statifier_0023
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa

from statifier.buckets import bucket_of
from statifier.sql.migrations import add_bucket, drop_bucket

revision = "statifier_0024"
down_revision: str | None = "statifier_0023"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None


def upgrade() -> None:
    add_bucket("positions", _buckets, ["key"])


def _buckets(bind: sa.Connection, table: str) -> Iterator[tuple[Any, int]]:
    for row, key in bind.execute(sa.text(f"SELECT id, key FROM {table}")):
        yield row, bucket_of(key)


def downgrade() -> None:
    drop_bucket("positions", ["key"])
