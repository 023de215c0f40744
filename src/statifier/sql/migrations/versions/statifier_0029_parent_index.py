"""Each execution's parent (what its metadata names under ``statifier.parent``) in a
column of its own, ``executions.parent``, indexed: cancelling an execution finds its
durable children without reading every execution's metadata (decision 0132). The
existing rows are filled in from their metadata.

Revision ID: statifier_0029
Revises: statifier_0028
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from statifier.sql.migrations import batch_columns, current_options
from statifier.sql.postgres import POSTGRES
from statifier.sql.sqlite import SQLITE
from statifier.sql.tables import PARENT_METADATA_KEY

revision = "statifier_0029"
down_revision: str | None = "statifier_0028"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None


def upgrade() -> None:
    options = current_options()
    table = options.name("executions")
    op.add_column(table, sa.Column("parent", sa.Text(), nullable=True), schema=options.schema)
    dialect = SQLITE if op.get_bind().dialect.name == "sqlite" else POSTGRES
    named = f"{options.schema}.{table}" if options.schema else table
    parent = dialect.json_text_sql("metadata", PARENT_METADATA_KEY)
    op.execute(f"UPDATE {named} SET parent = {parent} WHERE {parent} IS NOT NULL")
    op.create_index(options.name("executions_parent_idx"), table, ["parent"], schema=options.schema)


def downgrade() -> None:
    options = current_options()
    table = options.name("executions")
    op.drop_index(options.name("executions_parent_idx"), table, schema=options.schema)
    kept = batch_columns("executions")
    with op.batch_alter_table(table, schema=options.schema, reflect_args=kept) as batch:
        batch.drop_column("parent")
