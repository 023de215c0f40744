"""Each event a cap holds carries its address's bucket
(``statifier.buckets.address_bucket``), filled for the rows already there in Python,
and the rows are indexed by bucket and seq: a move of a range of buckets reads its
range's held creates by that index, never the whole table (decision 0126).

Revision ID: statifier_0025
Revises: statifier_0024
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa

from statifier.buckets import address_bucket
from statifier.sql.migrations import add_bucket, drop_bucket

revision = "statifier_0025"
down_revision: str | None = "statifier_0024"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None


def upgrade() -> None:
    add_bucket("held_creates", _buckets, ["seq"])


def _buckets(bind: sa.Connection, table: str) -> Iterator[tuple[Any, int]]:
    rows = bind.execute(sa.text(f"SELECT id, scope, document, key FROM {table}"))
    for row, scope, document, key in rows:
        yield row, address_bucket(scope, document, key)


def downgrade() -> None:
    drop_bucket("held_creates", ["seq"])
