"""The table options for hosts that wrote the tables by hand: the timestamps' position,
column collations and a text key the database fills in, and the leading-column rule.

Each option goes up to head and down to base on PostgreSQL and SQLite, the migrations
build what :meth:`TableOptions.define` defines (``compare_metadata``), and what the
option changes is read back from the database's own catalog. The catalogs of two
copies built under two prefixes are compared the way docs/persistence-sql.md tells a
host to prove its hand-written tables identical.
"""

from __future__ import annotations

import pickle
import re
import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from tests.persistence.conftest import FreshDatabase, drop_schema, unique_name

from statifier.sql import TableOptions, migrations
from statifier.sql.tables import TIMESTAMPS, autogenerate_filter, define_locations

OPTIONS = ("timestamps", "collations", "text_key", "all")
"""What each migration test sets: one option alone, or all of them together."""

TEXT_KEYS = {
    "postgresql": "gen_random_uuid()::text",
    "sqlite": "(lower(hex(randomblob(16))))",
}
"""A text key each database fills in."""

COLLATIONS = {"postgresql": "C", "sqlite": "NOCASE"}
"""A collation each database knows, other than its default."""

COLLATED = ("execution_id", "status", "via", "parent_id")
"""The columns the collation tests collate: ``via`` was created ``door`` and
``parent_id``'s table ``settlements``, both renamed by ``statifier_0009``."""


def _tenant() -> list[sa.Column[Any]]:
    return [sa.Column("tenant_id", sa.Text(), nullable=True)]


def _leading(name: str) -> Callable[[], list[sa.Column[Any]]]:
    """A leading column ``name``, new on every call."""
    return lambda: [sa.Column(name, sa.Text(), nullable=True)]


def _collation(column: sa.Column[Any]) -> str | None:
    assert isinstance(column.type, sa.String)
    return column.type.collation


def _layout(fresh: FreshDatabase, option: str, prefix: str = "lay_") -> TableOptions:
    """The options of one migration test on ``fresh``'s database."""
    more: dict[str, Any] = {}
    if option in ("timestamps", "all"):
        more.update(leading_columns=_tenant, timestamps_position="leading")
    if option in ("collations", "all"):
        more["column_collations"] = dict.fromkeys(COLLATED, COLLATIONS[fresh.backend])
    if option in ("text_key", "all"):
        more.update(key_type=sa.Text, key_default=sa.text(TEXT_KEYS[fresh.backend]))
    return TableOptions(prefix=prefix, schema=fresh.schema, **more)


def _engine(url: str) -> sa.Engine:
    return sa.create_engine(migrations.sync_url(url))


def _same_key_default(
    context: MigrationContext,
    inspected_column: sa.Column[Any],
    metadata_column: sa.Column[Any],
    inspected_default: str | None,
    metadata_default: Any,
    rendered_metadata_default: str | None,
) -> bool | None:
    """Whether a key default differs, for ``compare_metadata`` on PostgreSQL: Alembic
    compares defaults there by evaluating both, and a volatile one
    (``gen_random_uuid()``) never equals itself, so this compares what PostgreSQL
    made of the metadata's default with what it holds. ``None`` elsewhere: Alembic's
    own comparison."""
    if (
        context.dialect.name != "postgresql"
        or metadata_column.name != "id"
        or metadata_column.server_default is None
    ):
        return None
    connection = context.connection
    assert connection is not None
    kind = metadata_column.type.compile(dialect=context.dialect)
    connection.execute(
        sa.text(f"CREATE TEMPORARY TABLE key_probe (id {kind} DEFAULT {rendered_metadata_default})")
    )
    made = connection.scalar(
        sa.text(
            "SELECT column_default FROM information_schema.columns "
            "WHERE table_name = 'key_probe' AND column_name = 'id'"
        )
    )
    connection.execute(sa.text("DROP TABLE key_probe"))
    return bool(made != inspected_default)


def _differences(url: str, options: TableOptions) -> list[Any]:
    """What ``compare_metadata`` finds between the database and ``define()``."""
    tables = options.define()
    ours = {table.name for table in tables.metadata.tables.values()}

    def include_name(name: str | None, kind: str, parent: Any) -> bool:
        if kind == "schema":
            return name == options.schema
        return name in ours if kind == "table" else True

    engine = _engine(url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection,
                opts={
                    "include_schemas": options.schema is not None,
                    "include_name": include_name,
                    "include_object": autogenerate_filter(connection.dialect.name),
                    "compare_type": True,
                    "compare_server_default": _same_key_default,
                    "version_table": options.version_table,
                    "version_table_schema": options.schema,
                },
            )
            return list(compare_metadata(context, tables.metadata))
    finally:
        engine.dispose()


def _columns(fresh: FreshDatabase, table: str) -> list[dict[str, Any]]:
    """The columns of ``table`` in order, from the database's catalog: name, type,
    default, and (PostgreSQL) collation."""
    engine = _engine(fresh.url)
    try:
        with engine.connect() as connection:
            if fresh.backend == "sqlite":
                rows = connection.exec_driver_sql(f"PRAGMA table_info({table})")
                return [{"name": r[1], "type": r[2], "default": r[4]} for r in rows]
            rows = connection.execute(
                sa.text(
                    "SELECT column_name, data_type, column_default, collation_name "
                    "FROM information_schema.columns WHERE table_schema = :schema "
                    "AND table_name = :table ORDER BY ordinal_position"
                ),
                {"schema": fresh.schema, "table": table},
            )
            return [{"name": r[0], "type": r[1], "default": r[2], "collation": r[3]} for r in rows]
    finally:
        engine.dispose()


def _sqlite_sql(fresh: FreshDatabase, table: str) -> str:
    """The ``CREATE TABLE`` SQLite keeps for ``table`` (with any column added later)."""
    engine = _engine(fresh.url)
    try:
        with engine.connect() as connection:
            found = connection.execute(
                sa.text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = :name"),
                {"name": table},
            ).scalar_one()
            return str(found)
    finally:
        engine.dispose()


def _table_names(fresh: FreshDatabase) -> set[str]:
    engine = _engine(fresh.url)
    try:
        with engine.connect() as connection:
            inspector = sa.inspect(connection)
            if fresh.schema is not None and not inspector.has_schema(fresh.schema):
                return set()
            return set(inspector.get_table_names(schema=fresh.schema))
    finally:
        engine.dispose()


def _check_timestamps(fresh: FreshDatabase, options: TableOptions) -> None:
    tables = options.define()
    for table in tables.metadata.sorted_tables:
        names = [column["name"] for column in _columns(fresh, table.name)]
        assert names == [column.name for column in table.columns], table.name
        stamped = [name for name in names if name in TIMESTAMPS]
        assert names[: 2 + len(stamped)] == ["id", "tenant_id", *stamped], table.name
    # Written out once, so that the definitions are not only compared with themselves.
    assert [c["name"] for c in _columns(fresh, "lay_executions")][:6] == [
        "id",
        "tenant_id",
        "created_at",
        "updated_at",
        "execution_id",
        "content_hash",
    ]
    outbox = [c["name"] for c in _columns(fresh, "lay_outbox")]
    # The columns statifier_0007 and statifier_0019 add land at the end either way.
    assert (outbox[:4], outbox[-2:]) == (
        ["id", "tenant_id", "inserted_at", "queue"],
        ["execution_id", "bucket"],
    )
    assert [c["name"] for c in _columns(fresh, "lay_step_errors")][:3] == [
        "id",
        "tenant_id",
        "execution_id",
    ]


def _check_collations(fresh: FreshDatabase, options: TableOptions) -> None:
    collation = COLLATIONS[fresh.backend]
    seen = 0
    for table in options.define().metadata.sorted_tables:
        if fresh.backend == "postgresql":
            for column in _columns(fresh, table.name):
                expected = collation if column["name"] in COLLATED else None
                assert column["collation"] == expected, (table.name, column["name"])
                seen += column["name"] in COLLATED
            continue
        sql = _sqlite_sql(fresh, table.name)
        for name in COLLATED:
            declared = re.search(rf'\b{name} TEXT( COLLATE "?{collation}"?)?', sql)
            assert (declared is None) == (name not in table.columns), (table.name, name)
            if declared is not None:
                assert declared.group(1), (table.name, name)
                seen += 1
    # Every table that has one of the columns (the outbox's execution_id, added by
    # statifier_0007, and the renamed via and fan_out_ends included).
    assert seen == sum(
        name in table.columns
        for table in options.define().metadata.sorted_tables
        for name in COLLATED
    )


def _check_text_key(fresh: FreshDatabase, options: TableOptions) -> None:
    for table in options.define().metadata.sorted_tables:
        key = _columns(fresh, table.name)[0]
        assert key["name"] == "id"
        if fresh.backend == "postgresql":
            assert key["type"] == "text"
            assert "gen_random_uuid()" in key["default"]
        else:
            assert key["type"] == "TEXT"
            assert "randomblob(16)" in key["default"]
    # The database fills the key in, and an insert reads it back.
    dedupe = options.define().dedupe
    engine = _engine(fresh.url)
    try:
        with engine.begin() as connection:
            made = connection.execute(
                dedupe.insert()
                .values(
                    binding_id="b", message_id="m", expires_at=sa.func.current_timestamp(), bucket=0
                )
                .returning(dedupe.c.id)
            ).scalar_one()
            connection.execute(dedupe.delete())
    finally:
        engine.dispose()
    assert isinstance(made, str)
    if fresh.backend == "postgresql":
        assert str(uuid.UUID(made)) == made
    else:
        assert re.fullmatch(r"[0-9a-f]{32}", made)


@pytest.mark.parametrize("option", OPTIONS)
def test_each_option_goes_up_and_down_and_builds_what_define_defines(
    fresh_database: FreshDatabase, option: str
) -> None:
    options = _layout(fresh_database, option)
    migrations.upgrade(fresh_database.url, options)
    assert migrations.current(fresh_database.url, options) == migrations.head()
    assert _differences(fresh_database.url, options) == []
    if option in ("timestamps", "all"):
        _check_timestamps(fresh_database, options)
    if option in ("collations", "all"):
        _check_collations(fresh_database, options)
    if option in ("text_key", "all"):
        _check_text_key(fresh_database, options)
    migrations.downgrade(fresh_database.url, options)
    assert migrations.current(fresh_database.url, options) is None
    assert _table_names(fresh_database) == {"lay_alembic_version"}
    # Back up again: the downgrades left nothing that the next upgrade meets.
    migrations.upgrade(fresh_database.url, options)
    assert _differences(fresh_database.url, options) == []


def test_a_downgrade_that_copies_a_table_keeps_its_layout(fresh_database: FreshDatabase) -> None:
    # SQLite drops a column by copying the table from what it reflects, which has no
    # collation: the revisions hand the copy the collated columns.
    options = _layout(fresh_database, "all")
    migrations.upgrade(fresh_database.url, options)
    migrations.downgrade(fresh_database.url, options, "statifier_0006")
    migrations.upgrade(fresh_database.url, options)
    assert _differences(fresh_database.url, options) == []
    _check_timestamps(fresh_database, options)
    _check_collations(fresh_database, options)
    _check_text_key(fresh_database, options)


def test_the_comparison_sees_an_option_the_tables_were_not_built_with(
    fresh_database: FreshDatabase,
) -> None:
    migrations.upgrade(fresh_database.url, _layout(fresh_database, "none"))
    assert _differences(fresh_database.url, _layout(fresh_database, "text_key")) != []


def test_left_out_the_options_lay_out_the_tables_as_before(
    fresh_database: FreshDatabase,
) -> None:
    options = _layout(fresh_database, "none")
    migrations.upgrade(fresh_database.url, options)
    executions = _columns(fresh_database, "lay_executions")
    assert [c["name"] for c in executions] == [
        "id",
        "execution_id",
        "content_hash",
        "status",
        "position_blob",
        "metadata",
        "outcome_blob",
        "failure",
        "created_at",
        "updated_at",
        "ended_at",
        "error_count",
        "last_error_at",
        "final_state",
        "bucket",
        "parent",
    ]
    if fresh_database.backend == "postgresql":
        assert {c["collation"] for c in executions} == {None}
        assert executions[0]["type"] == "bigint"
    else:
        assert "COLLATE" not in _sqlite_sql(fresh_database, "lay_executions")
        assert executions[0]["type"] == "INTEGER"


def test_sqlite_refuses_a_collation_it_does_not_know_before_any_table(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    options = TableOptions(column_collations={"execution_id": "C"})
    with pytest.raises(ValueError, match="SQLite knows the collations BINARY, NOCASE, RTRIM"):
        migrations.upgrade(url, options)
    assert migrations.current(url, options) is None
    with sqlite3.connect(tmp_path / "c.db") as connection:
        assert connection.execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,)


# -- proving two copies identical -------------------------------------------------

CATALOG_COLUMNS = """
SELECT table_name, column_name, ordinal_position, data_type, collation_name,
       is_nullable, column_default
FROM information_schema.columns
WHERE table_schema = :schema AND left(table_name, length(:prefix)) = :prefix
ORDER BY table_name, ordinal_position
"""
"""The columns the replace-at-the-same-version procedure compares (as
docs/persistence-sql.md writes it)."""

CATALOG_INDEXES = """
SELECT tablename, indexname, indexdef
FROM pg_indexes
WHERE schemaname = :schema AND left(tablename, length(:prefix)) = :prefix
ORDER BY tablename, indexname
"""
"""The indexes the procedure compares."""


def _catalog(connection: sa.Connection, schema: str, prefix: str) -> list[tuple[Any, ...]]:
    """The columns and indexes of the tables under ``prefix`` in ``schema``, with the
    prefix stripped from the start of every name in them (not from inside a name: a
    column ``last_made_at`` keeps its ``made_`` under the prefix ``made_``)."""
    leading = re.compile(rf"\b{re.escape(prefix)}")

    def stripped(value: Any) -> Any:
        return leading.sub("", value) if isinstance(value, str) else value

    values = {"schema": schema, "prefix": prefix}
    return [
        tuple(stripped(value) for value in row)
        for query in (CATALOG_COLUMNS, CATALOG_INDEXES)
        for row in connection.execute(sa.text(query), values)
    ]


HAND_WRITTEN_DEDUPE = """
CREATE TABLE {schema}.hand_dedupe (
    id text DEFAULT gen_random_uuid()::text NOT NULL PRIMARY KEY,
    tenant_id text,
    binding_id text NOT NULL,
    message_id text COLLATE "C" NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    bucket smallint NOT NULL,
    CONSTRAINT hand_dedupe_binding_id_message_id_key UNIQUE (binding_id, message_id)
);
CREATE INDEX hand_dedupe_expires_at_idx ON {schema}.hand_dedupe (expires_at);
CREATE INDEX hand_dedupe_bucket_expires_at_idx ON {schema}.hand_dedupe (bucket, expires_at);
"""
"""A host's own migration of the dedupe table, as it might have written it."""


def test_the_catalogs_under_two_prefixes_prove_a_layout_identical(database_url: str) -> None:
    schema = unique_name("statifier_catalog_")

    def options(prefix: str, **more: Any) -> TableOptions:
        return TableOptions(
            prefix=prefix,
            schema=schema,
            leading_columns=_tenant,
            key_type=sa.Text,
            key_default=sa.text(TEXT_KEYS["postgresql"]),
            column_collations={"message_id": "C"},
            **more,
        )

    walked = options("walk_", timestamps_position="leading")
    migrations.upgrade(database_url, walked)
    engine = _engine(database_url)
    try:
        with engine.begin() as connection:
            # The same tables built from the definitions, and the same tables built with
            # the timestamps where they were: the catalogs tell the second apart.
            options("made_", timestamps_position="leading").define().metadata.create_all(connection)
            options("late_").define().metadata.create_all(connection)
            for statement in HAND_WRITTEN_DEDUPE.format(schema=schema).split(";")[:3]:
                connection.execute(sa.text(statement))
            walk = _catalog(connection, schema, "walk_")
            assert [row for row in walk if row[0] == "alembic_version"]
            walk = [row for row in walk if row[0] != "alembic_version"]
            assert walk == _catalog(connection, schema, "made_")
            assert walk != _catalog(connection, schema, "late_")
            # The host's hand-written dedupe table matches the one the walk built.
            assert [row for row in walk if row[0] == "dedupe"] == _catalog(
                connection, schema, "hand_"
            )
    finally:
        engine.dispose()
        drop_schema(database_url, schema)


# -- what the options take ----------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "error", "says"),
    [
        ({"timestamps_position": "first"}, ValueError, 'is "trailing" or "leading"'),
        ({"column_collations": {"seq": "C"}}, ValueError, "the text columns are action, "),
        ({"column_collations": {"nowhere": "C"}}, ValueError, "'nowhere' is not a text column"),
        ({"column_collations": {"status": ""}}, ValueError, "a non-empty str"),
        ({"column_collations": {"status": 1}}, ValueError, "a non-empty str"),
        ({"column_collations": [("status", "C")]}, TypeError, "a mapping"),
        ({"key_type": sa.Text}, ValueError, "a text key is made by the database"),
        ({"key_type": sa.Text, "key_default": "uuid()"}, TypeError, "sqlalchemy.text"),
        ({"key_default": sa.text("1")}, ValueError, "an integer key autoincrements"),
        ({"key_type": sa.Boolean}, ValueError, "an integer type, sqlalchemy.Uuid or a text"),
        (
            {"leading_columns": lambda: [sa.Column("expires_at", sa.Text())]},
            ValueError,
            "'expires_at' is declared by statifier_dedupe$",
        ),
        (
            {"leading_columns": lambda: [sa.Column("consumer_group", sa.Text())]},
            ValueError,
            (
                "'consumer_group' is declared by statifier_consumer_members, "
                "statifier_consumer_positions, statifier_partition_leases$"
            ),
        ),
        (
            {"leading_columns": lambda: [sa.Column("door", sa.Text())]},
            ValueError,
            "'door' is declared by statifier_inputs, statifier_step_errors$",
        ),
        (
            {"leading_columns": lambda: [sa.Column("id", sa.Text())]},
            ValueError,
            "'id' is every table's key",
        ),
        (
            {"leading_columns": lambda: [sa.Column("a", sa.Text()), sa.Column("a", sa.Text())]},
            ValueError,
            "'a' twice",
        ),
    ],
)
def test_a_malformed_option_is_refused_when_the_options_are_made(
    given: dict[str, Any], error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says):
        TableOptions(**given)


def test_a_leading_column_only_the_location_table_declares_leads_the_walk() -> None:
    # The location table is outside the walk: its columns are the host's to lead with,
    # and it refuses them itself when it is built under those options.
    for name in ("token_hash", "address_id"):
        options = TableOptions(leading_columns=_leading(name))
        assert options.define().executions.c[name] is not None
        with pytest.raises(ValueError, match=f"{name!r} is declared by statifier_locations"):
            define_locations(options.define())


def test_the_collations_take_every_text_column_of_the_walk_and_no_other() -> None:
    collated = TableOptions(column_collations={"final_state": "C", "kind": "C"})
    tables = collated.define()
    # final_state comes from a revision that adds it to a table that exists.
    assert _collation(tables.executions.c.final_state) == "C"
    assert _collation(tables.timers.c.kind) == "C"
    assert _collation(tables.child_answers.c.kind) == "C"
    assert _collation(tables.executions.c.status) is None
    with pytest.raises(ValueError, match="'token_hash' is not a text column"):
        TableOptions(column_collations={"token_hash": "C"})


def test_the_key_type_says_who_makes_keys_and_how_text_carries_them() -> None:
    integer = TableOptions()
    client = TableOptions(key_type=sa.Uuid)
    database = TableOptions(key_type=sa.Uuid, key_default=sa.text("gen_random_uuid()"))
    text = TableOptions(key_type=sa.Text, key_default=sa.text(TEXT_KEYS["postgresql"]))
    assert (integer.new_key, client.new_key, database.new_key, text.new_key) == (
        None,
        uuid.uuid4,
        None,
        None,
    )
    assert [o.key_kind for o in (integer, client, database, text)] == [
        "integer",
        "uuid",
        "uuid",
        "text",
    ]
    key = uuid.uuid4()
    assert integer.key_from_text("12") == 12
    assert client.key_from_text(str(key)) == key
    assert text.key_from_text("k-1") == "k-1"
    with pytest.raises(ValueError, match="invalid literal for int"):
        integer.key_from_text("k-1")
    assert text.define().inputs.c.id.server_default is not None
    assert integer.define().inputs.c.id.server_default is None


def test_a_column_a_later_revision_renames_takes_the_collation_of_its_new_name() -> None:
    options = TableOptions(column_collations={"execution_id": "C"})
    renamed = options.collated(sa.Column("run_id", sa.Text()), named="execution_id")
    assert _collation(renamed) == "C"
    assert _collation(options.collated(sa.Column("run_id", sa.Text()))) is None


def test_the_collations_are_kept_apart_from_the_callers_mapping() -> None:
    given = {"status": "C"}
    options = TableOptions(column_collations=given)
    given["status"] = "POSIX"
    assert options.column_collations == {"status": "C"}
    assert hash(options) == hash(TableOptions(column_collations={"status": "C"}))


def test_options_pickle_as_the_arguments_that_made_them() -> None:
    options = TableOptions(
        prefix="p_",
        schema="s",
        key_type=sa.Uuid,
        column_collations={"message_id": "C"},
        timestamps_position="leading",
    )
    again = pickle.loads(pickle.dumps(options))
    assert again == options
    assert dict(again.column_collations) == {"message_id": "C"}
    with pytest.raises(TypeError):
        again.column_collations["message_id"] = "POSIX"
    # A clause compares by identity: its SQL is what comes back.
    text_key = TableOptions(key_type=sa.Text, key_default=sa.text("gen_random_uuid()::text"))
    assert str(pickle.loads(pickle.dumps(text_key)).key_default) == "gen_random_uuid()::text"


def test_tables_built_by_hand_and_stamped_are_upgraded_from_there(
    fresh_database: FreshDatabase,
) -> None:
    # The tables as a host's own migration built them (here: from the definitions, at
    # the revision before head), stamped at that revision: the next upgrade runs only
    # what comes after it, and meets no table it would build again.
    options = _layout(fresh_database, "all")
    migrations.upgrade(fresh_database.url, options, "statifier_0008")
    engine = _engine(fresh_database.url)
    try:
        with engine.begin() as connection:
            connection.execute(sa.delete(_version_table(options)))
    finally:
        engine.dispose()
    assert migrations.current(fresh_database.url, options) is None
    migrations.stamp(fresh_database.url, options, "statifier_0008")
    assert migrations.current(fresh_database.url, options) == "statifier_0008"
    migrations.upgrade(fresh_database.url, options)
    assert migrations.current(fresh_database.url, options) == migrations.head()
    assert _differences(fresh_database.url, options) == []
    with pytest.raises(migrations.BadRevision, match="'statifier_9999'"):
        migrations.stamp(fresh_database.url, options, "statifier_9999")


def _version_table(options: TableOptions) -> sa.Table:
    return sa.Table(
        options.version_table,
        sa.MetaData(schema=options.schema),
        sa.Column("version_num", sa.String(32)),
    )
