"""The bulk actions operators start, with their progress, so that any process shows
them and one cut short can be run again from its row; and the error policy a held
event is stepped with on resume (its binding's).

Revision ID: statifier_0011
Revises: statifier_0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from statifier.sql.migrations import create_table, current_options
from statifier.sql.tables import UtcDateTime, json_document

revision = "statifier_0011"
down_revision: str | None = "statifier_0010"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None


def upgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    runs = name("bulk_runs")
    create_table(
        runs,
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("revision", sa.Text(), nullable=True),
        sa.Column("plan", json_document(), nullable=True),
        sa.Column("selection", json_document(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("selected", sa.Integer(), nullable=False),
        sa.Column("done", sa.Integer(), nullable=False),
        sa.Column("skipped", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.Column("parked", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("started_at", UtcDateTime(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.Column("finished_at", UtcDateTime(), nullable=True),
        sa.UniqueConstraint("run_id", name=name("bulk_runs_run_id_key")),
        schema=schema,
    )
    op.create_index(name("bulk_runs_started_at_idx"), runs, ["started_at", "id"], schema=schema)
    op.add_column(
        name("held_events"), sa.Column("on_error", sa.Text(), nullable=True), schema=schema
    )


def downgrade() -> None:
    options = current_options()
    with op.batch_alter_table(options.name("held_events"), schema=options.schema) as held:
        held.drop_column("on_error")
    op.drop_table(options.name("bulk_runs"), schema=options.schema)
