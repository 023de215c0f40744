"""Each execution row carries its bucket (``statifier.buckets.bucket_of``: its root
id's, so a durable child's is its parent's), filled for the rows already there in
Python, and the rows are indexed by bucket and id: the executions of a range of buckets
are one index range (decision 0116's first step of moving a range).

Revision ID: statifier_0022
Revises: statifier_0021
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa

from statifier.buckets import bucket_of
from statifier.sql.migrations import add_bucket, drop_bucket

revision = "statifier_0022"
down_revision: str | None = "statifier_0021"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None


def upgrade() -> None:
    add_bucket("executions", _buckets, ["execution_id"])


def _buckets(bind: sa.Connection, table: str) -> Iterator[tuple[Any, int]]:
    for row, execution_id in bind.execute(sa.text(f"SELECT id, execution_id FROM {table}")):
        yield row, bucket_of(execution_id)


def downgrade() -> None:
    drop_bucket("executions", ["execution_id"])
