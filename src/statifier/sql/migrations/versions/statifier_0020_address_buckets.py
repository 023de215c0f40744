"""Each address row carries its address's bucket (decision 0122), filled for the rows
already there by ``statifier.buckets.address_bucket`` in Python, and the rows are
indexed by bucket and key: the address reaper given a range of buckets pages through
its range alone.

Revision ID: statifier_0020
Revises: statifier_0019
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa

from statifier.buckets import address_bucket
from statifier.sql.migrations import add_bucket, drop_bucket

revision = "statifier_0020"
down_revision: str | None = "statifier_0019"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None


def upgrade() -> None:
    add_bucket("addresses", _buckets, ["id"])


def _buckets(bind: sa.Connection, table: str) -> Iterator[tuple[Any, int]]:
    for row, scope, document, key in bind.execute(
        sa.text(f"SELECT id, scope, document, key FROM {table}")
    ):
        yield row, address_bucket(scope, document, key)


def downgrade() -> None:
    drop_bucket("addresses", ["id"])
