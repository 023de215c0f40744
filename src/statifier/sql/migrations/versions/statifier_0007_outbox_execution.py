"""The outbox's sending execution as a column of its own, indexed: the console finds an
execution's outbox rows by it (the payload keeps its copy).

Revision ID: statifier_0007
Revises: statifier_0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from statifier.sql.migrations import batch_columns, current_options

revision = "statifier_0007"
down_revision: str | None = "statifier_0006"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None


def upgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    outbox = name("outbox")
    execution_id = options.collated(sa.Column("execution_id", sa.Text(), nullable=True))
    op.add_column(outbox, execution_id, schema=schema)
    table = f"{schema}.{outbox}" if schema else outbox
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"UPDATE {table} SET execution_id = payload->>'execution_id'")
    else:
        op.execute(f"UPDATE {table} SET execution_id = json_extract(payload, '$.execution_id')")
    op.create_index(
        name("outbox_execution_id_inserted_at_idx"),
        outbox,
        ["execution_id", "inserted_at", "id"],
        schema=schema,
    )


def downgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    outbox = name("outbox")
    op.drop_index(name("outbox_execution_id_inserted_at_idx"), table_name=outbox, schema=schema)
    kept = batch_columns("outbox")
    with op.batch_alter_table(outbox, schema=schema, reflect_args=kept) as batch:
        batch.drop_column("execution_id")
