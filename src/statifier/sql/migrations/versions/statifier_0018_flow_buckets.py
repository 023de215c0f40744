"""Each flow group (what a debounce, batch or throttle binding holds for an address)
carries its address's bucket (decision 0121), filled for the rows already there by
``statifier.buckets.address_bucket`` in Python, and the groups are indexed by bucket
and due time: a flow worker given a range of buckets flushes its range's groups alone.

Revision ID: statifier_0018
Revises: statifier_0017
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa

from statifier.buckets import address_bucket
from statifier.sql.migrations import add_bucket, drop_bucket

revision = "statifier_0018"
down_revision: str | None = "statifier_0017"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None


def upgrade() -> None:
    add_bucket("flow_groups", _buckets, ["due_at"])


def _buckets(bind: sa.Connection, table: str) -> Iterator[tuple[Any, int]]:
    for row, scope, document, key in bind.execute(
        sa.text(f"SELECT id, scope, document, key FROM {table}")
    ):
        yield row, address_bucket(scope, document, key)


def downgrade() -> None:
    drop_bucket("flow_groups", ["due_at"])
