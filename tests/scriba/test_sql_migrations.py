"""The migrations build exactly the tables the target uses, and can run again safely."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from scriba.sql import HEAD, current_revision, define_tables, downgrade, upgrade
from scriba.sql.migrate import MIGRATIONS

if TYPE_CHECKING:
    from tests.scriba.conftest import SqlDatabase

OTHER = "other_"


def _shape(engine: sa.Engine, prefix: str, schema: str | None) -> dict[str, Any]:
    """Everything a table's definition decides, as the database reports it, with the
    prefix taken out of every name."""
    inspector = sa.inspect(engine)
    shape: dict[str, Any] = {}
    names = sorted(
        name
        for name in inspector.get_table_names(schema=schema)
        if name.startswith(prefix) and not name.endswith("alembic_version")
    )
    for name in names:
        columns = [
            (
                column["name"],
                str(column["type"].compile(dialect=engine.dialect)),
                column["nullable"],
                column.get("autoincrement"),
                column["default"] is not None,
            )
            for column in inspector.get_columns(name, schema=schema)
        ]
        primary_key = inspector.get_pk_constraint(name, schema=schema)
        indexes = sorted(
            (
                str(index["name"]).removeprefix(f"ix_{prefix}"),
                tuple(index["column_names"]),
                index["unique"],
            )
            for index in inspector.get_indexes(name, schema=schema)
        )
        shape[name.removeprefix(prefix)] = {
            "columns": columns,
            "primary key": tuple(primary_key["constrained_columns"]),
            "indexes": indexes,
        }
    return shape


def test_migrations_build_what_tables_define(sql_database: SqlDatabase) -> None:
    # sql_database was built by the migrations under PREFIX; build the same tables from
    # the metadata under another prefix in the same place, and compare.
    engine, schema = sql_database.engine, sql_database.schema
    define_tables(OTHER, schema).metadata.create_all(engine)
    migrated = _shape(engine, "scriba_", schema)
    defined = _shape(engine, OTHER, schema)
    assert set(migrated) == {"positions", "watermarks", "dead_letters", "projections"}
    assert migrated == defined
    assert migrated["positions"]["primary key"] == (
        "projection_name",
        "projection_version",
        "stream_id",
    )
    assert ("positions_projection", ("projection_name", "projection_version"), False) in (
        migrated["positions"]["indexes"]
    )


def test_event_data_is_jsonb_on_postgresql(sql_database: SqlDatabase) -> None:
    columns = sa.inspect(sql_database.engine).get_columns(
        "scriba_dead_letters", schema=sql_database.schema
    )
    event_data = next(column for column in columns if column["name"] == "event_data")
    expected = "JSONB" if sql_database.dialect == "postgresql" else "JSON"
    assert str(event_data["type"].compile(dialect=sql_database.engine.dialect)) == expected


def test_upgrade_is_recorded_in_a_version_table_of_its_own(sql_database: SqlDatabase) -> None:
    engine, schema = sql_database.engine, sql_database.schema
    assert current_revision(engine, prefix="scriba_", schema=schema) == HEAD
    names = sa.inspect(engine).get_table_names(schema=schema)
    assert "scriba_alembic_version" in names
    assert "alembic_version" not in names


def test_upgrade_again_changes_nothing(sql_database: SqlDatabase) -> None:
    engine, schema = sql_database.engine, sql_database.schema
    before = _shape(engine, "scriba_", schema)
    upgrade(engine, prefix="scriba_", schema=schema)
    assert _shape(engine, "scriba_", schema) == before
    assert current_revision(engine, prefix="scriba_", schema=schema) == HEAD


def test_upgrade_over_tables_made_without_migrations(sql_database: SqlDatabase) -> None:
    # A host that built the tables from the metadata (or a lost version table) must
    # still be able to run the migrations: every step looks before it creates.
    engine, schema = sql_database.engine, sql_database.schema
    define_tables(OTHER, schema).metadata.create_all(engine)
    upgrade(engine, prefix=OTHER, schema=schema)
    assert current_revision(engine, prefix=OTHER, schema=schema) == HEAD


def test_version_by_version(sql_database: SqlDatabase) -> None:
    engine, schema = sql_database.engine, sql_database.schema
    upgrade(engine, prefix=OTHER, schema=schema, revision="scriba_0001")
    assert current_revision(engine, prefix=OTHER, schema=schema) == "scriba_0001"
    assert set(_shape(engine, OTHER, schema)) == {"positions", "dead_letters"}
    upgrade(engine, prefix=OTHER, schema=schema, revision="scriba_0002")
    assert set(_shape(engine, OTHER, schema)) == {"positions", "dead_letters", "watermarks"}
    upgrade(engine, prefix=OTHER, schema=schema)
    assert set(_shape(engine, OTHER, schema)) == {
        "positions",
        "dead_letters",
        "watermarks",
        "projections",
    }
    downgrade(engine, prefix=OTHER, schema=schema, revision="scriba_0002")
    assert set(_shape(engine, OTHER, schema)) == {"positions", "dead_letters", "watermarks"}
    downgrade(engine, prefix=OTHER, schema=schema, revision="scriba_0001")
    assert set(_shape(engine, OTHER, schema)) == {"positions", "dead_letters"}
    downgrade(engine, prefix=OTHER, schema=schema)
    assert _shape(engine, OTHER, schema) == {}
    assert current_revision(engine, prefix=OTHER, schema=schema) is None


def test_upgrade_from_a_url(sql_database: SqlDatabase) -> None:
    upgrade(sql_database.url, prefix=OTHER, schema=sql_database.schema)
    assert current_revision(sql_database.url, prefix=OTHER, schema=sql_database.schema) == HEAD


def test_upgrade_joins_the_callers_transaction(sql_database: SqlDatabase) -> None:
    engine, schema = sql_database.engine, sql_database.schema
    with engine.connect() as connection:
        connection.begin()
        upgrade(connection, prefix=OTHER, schema=schema)
        assert current_revision(connection, prefix=OTHER, schema=schema) == HEAD
        connection.rollback()
    if sql_database.dialect == "postgresql":
        # PostgreSQL's DDL is transactional: the rollback took it all back.
        assert current_revision(engine, prefix=OTHER, schema=schema) is None
        assert _shape(engine, OTHER, schema) == {}


def test_from_inside_a_hosts_alembic_migration(sql_database: SqlDatabase) -> None:
    # A host's revision calls scriba.sql.upgrade(op.get_bind()); afterwards the host's
    # own `op` proxy must still work for the host's next step.
    from alembic import op
    from alembic.operations import Operations

    engine, schema = sql_database.engine, sql_database.schema
    with engine.begin() as connection:
        context = MigrationContext.configure(connection)
        with Operations.context(context):
            upgrade(op.get_bind(), prefix=OTHER, schema=schema)
            op.create_table("host_table", sa.Column("id", sa.Integer), schema=schema)
    names = sa.inspect(engine).get_table_names(schema=schema)
    assert {"host_table", f"{OTHER}positions", f"{OTHER}alembic_version"} <= set(names)
    assert "alembic_version" not in names


def test_bad_names_are_refused_before_anything_runs() -> None:
    with pytest.raises(ValueError, match="table prefix"):
        upgrade("sqlite://", prefix="drop table;")
    with pytest.raises(ValueError, match="schema name"):
        upgrade("sqlite://", schema="Public")
    with pytest.raises(ValueError, match="PostgreSQL"):
        upgrade("mysql://localhost/app")


def test_revisions_form_one_line_to_head() -> None:
    scripts = ScriptDirectory(str(MIGRATIONS))
    assert scripts.get_heads() == [HEAD]
    chain = [script.revision for script in scripts.walk_revisions()]
    assert chain == ["scriba_0003", "scriba_0002", "scriba_0001"]
    for script in scripts.walk_revisions():
        assert callable(script.module.upgrade)
        assert callable(script.module.downgrade)
