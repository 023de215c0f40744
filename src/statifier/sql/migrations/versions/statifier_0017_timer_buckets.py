"""Each timer carries its execution's bucket (decisions 0116 and 0121), filled for the
rows already there by ``statifier.buckets.bucket_of`` in Python, and the timers are
indexed by bucket and due time: a timer worker given a range of buckets claims the due
timers of its range alone.

Revision ID: statifier_0017
Revises: statifier_0016
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa

from statifier.buckets import bucket_of
from statifier.sql.migrations import add_bucket, drop_bucket

revision = "statifier_0017"
down_revision: str | None = "statifier_0016"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None


def upgrade() -> None:
    add_bucket("timers", _buckets, ["due_at"])


def _buckets(bind: sa.Connection, table: str) -> Iterator[tuple[Any, int]]:
    for row, execution_id in bind.execute(sa.text(f"SELECT id, execution_id FROM {table}")):
        yield row, bucket_of(execution_id)


def downgrade() -> None:
    drop_bucket("timers", ["due_at"])
