"""Each timer carries its execution's lock key, hashed in Python: the timer claim tries
the execution's lock by that column instead of hashing the id in SQL with
PostgreSQL's ``hashtextextended``, which a database without PostgreSQL's own hash
functions does not have (decision 0115).

The key changes with this revision: every process of an older version must be stopped
before it runs, or an older and a newer process would not exclude each other.

Revision ID: statifier_0015
Revises: statifier_0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from statifier.sql.dialect import execution_lock_key
from statifier.sql.migrations import batch_columns, current_options

revision = "statifier_0015"
down_revision: str | None = "statifier_0014"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None

_CHUNK = 1_000
"""Rows whose key one UPDATE statement batch writes."""


def upgrade() -> None:
    options = current_options()
    timers, schema = options.name("timers"), options.schema
    op.add_column(timers, sa.Column("lock_key", sa.BigInteger(), nullable=True), schema=schema)
    table = f"{schema}.{timers}" if schema else timers
    bind = op.get_bind()
    pending = bind.execute(sa.text(f"SELECT id, execution_id FROM {table}")).all()
    update = sa.text(f"UPDATE {table} SET lock_key = :key WHERE id = :id")
    for start in range(0, len(pending), _CHUNK):
        chunk = pending[start : start + _CHUNK]
        bind.execute(update, [{"id": i, "key": execution_lock_key(e)} for i, e in chunk])
    kept = batch_columns("timers")
    with op.batch_alter_table(timers, schema=schema, reflect_args=kept) as batch:
        batch.alter_column("lock_key", existing_type=sa.BigInteger(), nullable=False)


def downgrade() -> None:
    options = current_options()
    timers, schema = options.name("timers"), options.schema
    kept = batch_columns("timers")
    with op.batch_alter_table(timers, schema=schema, reflect_args=kept) as batch:
        batch.drop_column("lock_key")
