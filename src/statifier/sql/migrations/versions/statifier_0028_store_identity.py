"""Each store known by a random name of its own (``store_identity``), and a moving
store's record naming the reshard that moves it (``store_place.reshard``), so that
``statifier reshard`` tells stores apart whatever URLs reach them and refuses to finish
a reshard with other lists of stores than the one that began (decision 0127).

Revision ID: statifier_0028
Revises: statifier_0027
"""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from alembic import op

from statifier.sql.migrations import batch_columns, create_table, current_options

revision = "statifier_0028"
down_revision: str | None = "statifier_0027"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None


def upgrade() -> None:
    options = current_options()
    op.add_column(
        options.name("store_place"),
        sa.Column("reshard", sa.Text(), nullable=True),
        schema=options.schema,
    )
    create_table(
        options.name("store_identity"),
        sa.Column("identity", sa.Text(), nullable=False),
        schema=options.schema,
    )
    # The table as the package defines it, so a key made on the client is made.
    table = options.define().store_identity
    values: dict[str, object] = {"identity": uuid.uuid4().hex}
    if options.new_key is not None:
        values["id"] = options.new_key()
    op.get_bind().execute(table.insert().values(values))


def downgrade() -> None:
    options = current_options()
    op.drop_table(options.name("store_identity"), schema=options.schema)
    table = options.name("store_place")
    kept = batch_columns("store_place")
    with op.batch_alter_table(table, schema=options.schema, reflect_args=kept) as batch:
        batch.drop_column("reshard")
