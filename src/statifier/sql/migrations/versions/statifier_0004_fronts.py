"""The stream consumer's tables: inbound events, committed positions, dead letters,
partition leases and consumer group members.

Revision ID: statifier_0004
Revises: statifier_0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from statifier.sql.migrations import create_table, current_options
from statifier.sql.tables import UtcDateTime, json_document

revision = "statifier_0004"
down_revision: str | None = "statifier_0003"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None


def upgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    create_table(
        name("inbound_events"),
        sa.Column("partition", sa.Text(), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column("data", json_document(), nullable=False),
        sa.Column("appended_at", UtcDateTime(), nullable=False),
        sa.UniqueConstraint(
            "partition", "position", name=name("inbound_events_partition_position_key")
        ),
        schema=schema,
    )
    create_table(
        name("consumer_positions"),
        sa.Column("consumer_group", sa.Text(), nullable=False),
        sa.Column("partition", sa.Text(), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.UniqueConstraint(
            "consumer_group", "partition", name=name("consumer_positions_group_partition_key")
        ),
        schema=schema,
    )
    create_table(
        name("consumer_dead_letters"),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("partition", sa.Text(), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("raw", sa.LargeBinary(), nullable=False),
        sa.Column("dead_at", UtcDateTime(), nullable=False),
        schema=schema,
    )
    op.create_index(
        name("consumer_dead_letters_source_dead_at_idx"),
        name("consumer_dead_letters"),
        ["source", "dead_at"],
        schema=schema,
    )
    create_table(
        name("partition_leases"),
        sa.Column("consumer_group", sa.Text(), nullable=False),
        sa.Column("partition", sa.Text(), nullable=False),
        sa.Column("owner", sa.Text(), nullable=True),
        sa.Column("leased_until", UtcDateTime(), nullable=True),
        sa.UniqueConstraint(
            "consumer_group", "partition", name=name("partition_leases_group_partition_key")
        ),
        schema=schema,
    )
    create_table(
        name("consumer_members"),
        sa.Column("consumer_group", sa.Text(), nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("seen_until", UtcDateTime(), nullable=False),
        sa.UniqueConstraint(
            "consumer_group", "owner", name=name("consumer_members_group_owner_key")
        ),
        schema=schema,
    )


def downgrade() -> None:
    options = current_options()
    name, schema = options.name, options.schema
    op.drop_table(name("consumer_members"), schema=schema)
    op.drop_table(name("partition_leases"), schema=schema)
    op.drop_index(
        name("consumer_dead_letters_source_dead_at_idx"),
        table_name=name("consumer_dead_letters"),
        schema=schema,
    )
    op.drop_table(name("consumer_dead_letters"), schema=schema)
    op.drop_table(name("consumer_positions"), schema=schema)
    op.drop_table(name("inbound_events"), schema=schema)
