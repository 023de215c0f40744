"""The ``locks`` table, where a transaction holds a lock key as a row
(``TableOptions(locks="rows")``, decision 0118), and an index of the timers by their
execution's lock key, which the reaper of lock rows reads.

Revision ID: statifier_0016
Revises: statifier_0015
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from statifier.sql.migrations import create_table, current_options

revision = "statifier_0016"
down_revision: str | None = "statifier_0015"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None


def upgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    create_table(
        name("locks"),
        sa.Column("key", sa.BigInteger(), nullable=False),
        sa.UniqueConstraint("key", name=name("locks_key_key")),
        schema=schema,
    )
    op.create_index(name("timers_lock_key_idx"), name("timers"), ["lock_key"], schema=schema)


def downgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    op.drop_index(name("timers_lock_key_idx"), table_name=name("timers"), schema=schema)
    op.drop_table(name("locks"), schema=schema)
