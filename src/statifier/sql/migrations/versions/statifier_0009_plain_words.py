"""Plainer stored words: the input log's and the step errors' ``door`` column is ``via``
(which call of ``Executions`` logged the entry), and the fan-outs' ``settlements``
table is ``fan_out_ends``, its ``settled_at`` column ``ended_at``.

Every rename keeps the rows. SQLite renames a column or a table in place but not a
constraint, so the unique constraint of ``fan_out_ends`` is dropped and made again
under its new name (a batch that copies the table there); PostgreSQL renames the
constraint, and the primary key and the key's sequence with it, so a database
migrated here matches one built at this revision.

Revision ID: statifier_0009
Revises: statifier_0008
"""

from __future__ import annotations

from alembic import op

from statifier.sql.migrations import batch_columns, current_options

revision = "statifier_0009"
down_revision: str | None = "statifier_0008"
branch_labels: tuple[str, ...] | None = None
depends_on: str | None = None

_LOGGING_TABLES = ("inputs", "step_errors")
"""The tables whose ``door`` column becomes ``via``."""


def upgrade() -> None:
    _rename_columns("door", "via")
    _rename_fan_out_table(("settlements", "settled_at"), ("fan_out_ends", "ended_at"))


def downgrade() -> None:
    _rename_fan_out_table(("fan_out_ends", "ended_at"), ("settlements", "settled_at"))
    _rename_columns("via", "door")


def _rename_columns(old: str, new: str) -> None:
    options = current_options()
    for table in _LOGGING_TABLES:
        op.alter_column(options.name(table), old, new_column_name=new, schema=options.schema)


def _rename_fan_out_table(old: tuple[str, str], new: tuple[str, str]) -> None:
    """Rename the fan-outs' table ``old[0]`` to ``new[0]`` and its time column
    ``old[1]`` to ``new[1]``, with the names derived from the table's."""
    options = current_options()
    name, schema = options.name, options.schema
    (old_table, old_column), (new_table, new_column) = old, new
    op.rename_table(name(old_table), name(new_table), schema=schema)
    op.alter_column(name(new_table), old_column, new_column_name=new_column, schema=schema)
    unique = "{}_parent_id_invoke_id_key"
    if op.get_context().dialect.name == "postgresql":
        # Names need no quoting: TableOptions admits plain lowercase identifiers only.
        table = f"{schema}.{name(new_table)}" if schema else name(new_table)
        for constraint in (unique, "{}_pkey"):
            op.execute(
                f"ALTER TABLE {table} RENAME CONSTRAINT "
                f"{name(constraint.format(old_table))} TO {name(constraint.format(new_table))}"
            )
        # An integer key's sequence; a UUID key has none.
        sequence = f"{schema}.{name(old_table)}_id_seq" if schema else f"{name(old_table)}_id_seq"
        op.execute(f"ALTER SEQUENCE IF EXISTS {sequence} RENAME TO {name(new_table)}_id_seq")
        return
    # SQLite renames a constraint by copying the table, from what it reflects, which
    # holds no collation: the leading and collated columns are handed over as declared.
    kept = batch_columns("fan_out_ends", named=new_table)
    with op.batch_alter_table(name(new_table), schema=schema, reflect_args=kept) as batch:
        batch.drop_constraint(name(unique.format(old_table)), type_="unique")
        batch.create_unique_constraint(name(unique.format(new_table)), ["parent_id", "invoke_id"])
