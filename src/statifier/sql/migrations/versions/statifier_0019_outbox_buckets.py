"""Each outbox row carries a bucket (decision 0122), filled for the rows already there
in Python: the sending execution's (``statifier.buckets.bucket_of``), or for a row
handed off outside any execution the bucket of its ``(queue, key)``
(``statifier.buckets.outbox_bucket``); and the rows are indexed by bucket and next
attempt: a drain given a range of buckets leases its range's rows alone.

Revision ID: statifier_0019
Revises: statifier_0018
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa

from statifier.buckets import bucket_of, outbox_bucket
from statifier.sql.migrations import add_bucket, drop_bucket

revision = "statifier_0019"
down_revision: str | None = "statifier_0018"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None


def upgrade() -> None:
    add_bucket("outbox", _buckets, ["next_attempt_at"])


def _buckets(bind: sa.Connection, table: str) -> Iterator[tuple[Any, int]]:
    for row, queue, key, execution_id in bind.execute(
        sa.text(f"SELECT id, queue, key, execution_id FROM {table}")
    ):
        yield row, outbox_bucket(queue, key) if execution_id is None else bucket_of(execution_id)


def downgrade() -> None:
    drop_bucket("outbox", ["next_attempt_at"])
