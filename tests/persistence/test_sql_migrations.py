"""The migrations build exactly the tables of ``statifier.sql.tables``, on PostgreSQL and
SQLite, and run from Python, from a host's own Alembic environment and from the CLI."""

from __future__ import annotations

import asyncio
import io
import json
import textwrap
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext

from statifier.buckets import address_bucket, bucket_of, outbox_bucket, tagged
from statifier.cli import main
from statifier.ids import new_execution_id
from statifier.persistence.records import InputRecord
from statifier.persistence.sql import SqlAdapter
from statifier.sql import TableOptions, migrations
from statifier.sql.dialect import execution_lock_key
from statifier.sql.tables import UtcDateTime, autogenerate_filter

HEAD = "statifier_0029"
"""The newest revision."""

DURABLE_TABLES = ("mig_charts", "mig_positions", "mig_executions", "mig_inputs")
"""What ``statifier_0001`` builds under the prefix ``mig_``."""

ROUTER_TABLES = ("mig_addresses", "mig_dedupe", "mig_routing_ledger")
"""What ``statifier_0002`` adds."""

OUTBOUND_TABLES = ("mig_timers", "mig_outbox", "mig_subscriptions")
"""What ``statifier_0003`` adds."""

FRONTS_TABLES = (
    "mig_inbound_events",
    "mig_consumer_positions",
    "mig_consumer_dead_letters",
    "mig_partition_leases",
    "mig_consumer_members",
)
"""What ``statifier_0004`` adds."""

CHILDREN_TABLES = ("mig_child_answers", "mig_fan_out_ends")
"""What ``statifier_0005`` adds (the second named ``mig_settlements`` until
``statifier_0009``)."""
CONSOLE_TABLES = ("mig_console_audit",)
"""What ``statifier_0006`` adds (with the indexes of the console's pages)."""
ERRORS_TABLES = ("mig_step_errors",)
"""What ``statifier_0008`` adds (with each execution's error count)."""
HELD_TABLES = ("mig_held_events",)
"""What ``statifier_0010`` adds."""
BULK_TABLES = ("mig_bulk_runs",)
"""What ``statifier_0011`` adds."""
SCHEDULE_TABLES = ("mig_schedules",)
"""What ``statifier_0012`` adds."""
FLOW_TABLES = ("mig_flow_groups", "mig_flow_events")
"""What ``statifier_0013`` adds."""
CAP_TABLES = ("mig_active_slots", "mig_held_creates")
"""What ``statifier_0014`` adds."""
LOCK_TABLES = ("mig_locks",)
"""What ``statifier_0016`` adds."""
PLACE_TABLES = ("mig_store_place",)
"""What ``statifier_0026`` adds."""
IDENTITY_TABLES = ("mig_store_identity",)
"""What ``statifier_0028`` adds."""


def _tenant() -> list[sa.Column[Any]]:
    """A leading column for the host, new on every call as ``leading_columns`` asks."""
    return [sa.Column("tenant_id", sa.Text(), nullable=True)]


def _options(fresh: Any, **more: Any) -> TableOptions:
    return TableOptions(prefix="mig_", schema=fresh.schema, **more)


def _table_names(url: str, schema: str | None) -> set[str]:
    engine = sa.create_engine(migrations.sync_url(url))
    try:
        with engine.connect() as connection:
            if schema is not None and not sa.inspect(connection).has_schema(schema):
                return set()
            return set(sa.inspect(connection).get_table_names(schema=schema))
    finally:
        engine.dispose()


def _differences(url: str, options: TableOptions) -> list[Any]:
    tables = options.define()
    ours = {table.name for table in tables.metadata.tables.values()}

    def include_name(name: str | None, kind: str, parent: Any) -> bool:
        if kind == "schema":
            return name == options.schema
        if kind == "table":
            return name in ours
        return True

    engine = sa.create_engine(migrations.sync_url(url))
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection,
                opts={
                    "include_schemas": options.schema is not None,
                    "include_name": include_name,
                    "include_object": autogenerate_filter(connection.dialect.name),
                    "compare_type": True,
                    "compare_server_default": True,
                    "version_table": options.version_table,
                    "version_table_schema": options.schema,
                },
            )
            return list(compare_metadata(context, tables.metadata))
    finally:
        engine.dispose()


def test_leading_columns_come_from_a_function_making_new_ones() -> None:
    with pytest.raises(TypeError, match="a function that makes new columns"):
        TableOptions(leading_columns=[sa.Column("tenant_id", sa.Text())])  # type: ignore[arg-type]
    shared = [sa.Column("tenant_id", sa.Text())]
    with pytest.raises(ValueError, match="new columns on every call"):
        TableOptions(leading_columns=lambda: shared)
    with pytest.raises(ValueError, match="a name of its own"):
        TableOptions(leading_columns=lambda: [sa.Column("status", sa.Text())])
    tables = TableOptions(leading_columns=_tenant).define()
    assert [column.name for column in tables.executions.columns][:2] == ["id", "tenant_id"]
    assert tables.executions.c.tenant_id is not tables.inputs.c.tenant_id


def test_migrations_build_exactly_the_tables(fresh_database: Any) -> None:
    options = _options(
        fresh_database,
        leading_columns=_tenant,
        key_type=sa.Uuid,
    )
    migrations.upgrade(fresh_database.url, options)
    assert _differences(fresh_database.url, options) == []
    names = _table_names(fresh_database.url, fresh_database.schema)
    assert names == {
        "mig_alembic_version",
        *DURABLE_TABLES,
        *ROUTER_TABLES,
        *OUTBOUND_TABLES,
        *FRONTS_TABLES,
        *CHILDREN_TABLES,
        *CONSOLE_TABLES,
        *ERRORS_TABLES,
        *HELD_TABLES,
        *BULK_TABLES,
        *SCHEDULE_TABLES,
        *FLOW_TABLES,
        *CAP_TABLES,
        *LOCK_TABLES,
        *PLACE_TABLES,
        *IDENTITY_TABLES,
    }


def test_migrations_match_the_default_options(fresh_database: Any) -> None:
    options = _options(fresh_database)
    migrations.upgrade(fresh_database.url, options)
    assert _differences(fresh_database.url, options) == []


def test_a_difference_is_seen(fresh_database: Any) -> None:
    # The comparison is not vacuous: tables defined with a leading column the
    # migrations did not build differ.
    migrations.upgrade(fresh_database.url, _options(fresh_database))
    wider = _options(fresh_database, leading_columns=lambda: [sa.Column("tenant_id", sa.Text())])
    assert _differences(fresh_database.url, wider) != []


def test_leading_columns_come_right_after_the_key(fresh_database: Any) -> None:
    options = _options(fresh_database, leading_columns=_tenant)
    migrations.upgrade(fresh_database.url, options)
    engine = sa.create_engine(migrations.sync_url(fresh_database.url))
    try:
        with engine.connect() as connection:
            inspector = sa.inspect(connection)
            for table in (
                *DURABLE_TABLES,
                *ROUTER_TABLES,
                *OUTBOUND_TABLES,
                *FRONTS_TABLES,
                *CHILDREN_TABLES,
                *CONSOLE_TABLES,
            ):
                columns = inspector.get_columns(table, schema=fresh_database.schema)
                assert [c["name"] for c in columns][:2] == ["id", "tenant_id"]
    finally:
        engine.dispose()


def test_downgrade_drops_every_table_and_upgrade_rebuilds(fresh_database: Any) -> None:
    options = _options(fresh_database)
    migrations.upgrade(fresh_database.url, options)
    assert migrations.current(fresh_database.url, options) == HEAD
    migrations.downgrade(fresh_database.url, options)
    assert migrations.current(fresh_database.url, options) is None
    assert _table_names(fresh_database.url, fresh_database.schema) == {"mig_alembic_version"}
    migrations.upgrade(fresh_database.url, options)
    assert _differences(fresh_database.url, options) == []


def test_the_router_revision_goes_up_and_down_on_its_own(fresh_database: Any) -> None:
    # statifier_0002 adds the router's tables to a database at statifier_0001 and takes
    # away exactly those, leaving the durable executions' tables as they were.
    options = _options(
        fresh_database,
        leading_columns=_tenant,
        key_type=sa.Uuid,
    )
    migrations.upgrade(fresh_database.url, options, "statifier_0001")
    assert migrations.current(fresh_database.url, options) == "statifier_0001"
    assert _table_names(fresh_database.url, fresh_database.schema) == {
        "mig_alembic_version",
        *DURABLE_TABLES,
    }
    migrations.upgrade(fresh_database.url, options)
    assert migrations.current(fresh_database.url, options) == HEAD
    assert _differences(fresh_database.url, options) == []
    migrations.downgrade(fresh_database.url, options, "statifier_0001")
    assert migrations.current(fresh_database.url, options) == "statifier_0001"
    assert _table_names(fresh_database.url, fresh_database.schema) == {
        "mig_alembic_version",
        *DURABLE_TABLES,
    }
    migrations.upgrade(fresh_database.url, options)
    assert _differences(fresh_database.url, options) == []


def test_two_prefixes_share_a_database(fresh_database: Any) -> None:
    first = TableOptions(prefix="one_", schema=fresh_database.schema)
    second = TableOptions(prefix="two_", schema=fresh_database.schema)
    migrations.upgrade(fresh_database.url, first)
    migrations.upgrade(fresh_database.url, second)
    migrations.downgrade(fresh_database.url, first)
    assert migrations.current(fresh_database.url, second) == HEAD
    assert _differences(fresh_database.url, second) == []


def test_upgrade_joins_a_connections_transaction(fresh_database: Any) -> None:
    options = _options(fresh_database)
    engine = sa.create_engine(migrations.sync_url(fresh_database.url))
    try:
        with engine.connect() as connection:
            connection.begin()
            migrations.upgrade(connection, options)
            connection.rollback()
    finally:
        engine.dispose()
    assert migrations.current(fresh_database.url, options) is None


def test_a_schema_on_sqlite_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="schema"):
        migrations.upgrade(f"sqlite:///{tmp_path / 'x.db'}", TableOptions(schema="elsewhere"))


_HOST_ENV = """
from alembic import context
import sqlalchemy as sa

from statifier.sql import TableOptions, migrations
from statifier.sql.tables import autogenerate_filter

config = context.config
options = TableOptions(prefix="mig_", schema=config.attributes.get("schema"))
engine = sa.create_engine(migrations.sync_url(config.get_main_option("sqlalchemy.url")))
with engine.connect() as connection:
    context.configure(
        connection=connection, target_metadata=None, version_table_schema=options.schema
    )
    with context.begin_transaction():
        context.run_migrations()
        migrations.upgrade(connection, options)
engine.dispose()
"""

_HOST_REVISION = """
import sqlalchemy as sa
from alembic import op

revision = "host_0001"
down_revision = None


def upgrade():
    schema = op.get_context().config.attributes.get("schema")
    op.create_table("host_orders", sa.Column("id", sa.Integer, primary_key=True), schema=schema)


def downgrade():
    op.drop_table("host_orders", schema=op.get_context().config.attributes.get("schema"))
"""


def test_a_hosts_alembic_environment_runs_the_migrations(
    fresh_database: Any, tmp_path: Path
) -> None:
    # The recipe of docs/persistence-sql.md: the host's env.py calls upgrade() on its
    # own connection, inside its own transaction; the two histories never meet.
    scripts = tmp_path / "host_migrations"
    (scripts / "versions").mkdir(parents=True)
    (scripts / "env.py").write_text(textwrap.dedent(_HOST_ENV))
    (scripts / "versions" / "host_0001.py").write_text(textwrap.dedent(_HOST_REVISION))
    config = Config()
    config.set_main_option("script_location", str(scripts))
    config.set_main_option("sqlalchemy.url", fresh_database.url)
    config.attributes["schema"] = fresh_database.schema
    if fresh_database.schema is not None:
        engine = sa.create_engine(migrations.sync_url(fresh_database.url))
        with engine.begin() as connection:
            connection.execute(sa.schema.CreateSchema(fresh_database.schema))
        engine.dispose()
    options = _options(fresh_database)
    command.upgrade(config, "head")
    assert migrations.current(fresh_database.url, options) == HEAD
    assert _differences(fresh_database.url, options) == []
    assert "host_orders" in _table_names(fresh_database.url, fresh_database.schema)
    migrations.downgrade(fresh_database.url, options)
    assert migrations.current(fresh_database.url, options) is None


def test_the_cli_upgrades_and_downgrades(fresh_database: Any) -> None:
    flags = ["--url", fresh_database.url, "--prefix", "mig_"]
    if fresh_database.schema is not None:
        flags += ["--schema", fresh_database.schema]
    out = io.StringIO()
    assert main(["db", "upgrade", *flags], out) == 0
    assert HEAD in out.getvalue()
    options = _options(fresh_database)
    assert _differences(fresh_database.url, options) == []
    out = io.StringIO()
    assert main(["db", "downgrade", *flags], out) == 0
    assert migrations.current(fresh_database.url, options) is None


def test_the_cli_defaults_to_a_local_sqlite_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    assert main(["db", "upgrade"], out) == 0
    assert out.getvalue() == f"statifier_tables at revision {HEAD}\n"
    assert (tmp_path / "statifier.db").exists()
    assert migrations.current("sqlite:///statifier.db") == HEAD


def test_the_cli_refuses_a_bad_prefix(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["db", "upgrade", "--url", f"sqlite:///{tmp_path}/x.db", "--prefix", "Bad-"]) == 2
    assert "table prefix" in capsys.readouterr().err


def test_the_console_revision_goes_up_and_down_on_its_own(fresh_database: Any) -> None:
    # statifier_0006 adds the audit table and the console's indexes to a database at
    # statifier_0004, and takes away exactly those.
    options = _options(fresh_database)
    migrations.upgrade(fresh_database.url, options, "statifier_0004")
    before = _index_names(fresh_database.url, options)
    migrations.upgrade(fresh_database.url, options)
    assert migrations.current(fresh_database.url, options) == HEAD
    assert _differences(fresh_database.url, options) == []
    added = _index_names(fresh_database.url, options) - before
    assert "mig_executions_created_at_idx" in added
    assert "mig_routing_ledger_outcome_inserted_at_idx" in added
    migrations.downgrade(fresh_database.url, options, "statifier_0004")
    assert _index_names(fresh_database.url, options) == before
    assert "mig_console_audit" not in _table_names(fresh_database.url, fresh_database.schema)


def _index_names(url: str, options: TableOptions) -> set[str]:
    engine = sa.create_engine(migrations.sync_url(url))
    try:
        with engine.connect() as connection:
            inspector = sa.inspect(connection)
            return {
                str(index["name"])
                for table in inspector.get_table_names(schema=options.schema)
                for index in inspector.get_indexes(table, schema=options.schema)
            }
    finally:
        engine.dispose()


def test_the_outbox_execution_revision_fills_its_column_and_goes_back(
    fresh_database: Any,
) -> None:
    # statifier_0007 gives the outbox its sending execution as an indexed column,
    # filled from the payload of the rows already there; going back drops exactly that.
    options = _options(fresh_database)
    migrations.upgrade(fresh_database.url, options, "statifier_0006")
    table = f"{options.schema}.mig_outbox" if options.schema else "mig_outbox"
    engine = sa.create_engine(migrations.sync_url(fresh_database.url))
    try:
        with engine.begin() as connection:
            for key, payload in (("k1", '{"execution_id": "ex_9"}'), ("k2", "{}")):
                connection.execute(
                    sa.text(
                        f"INSERT INTO {table} (queue, key, payload, attempts, "
                        "next_attempt_at, inserted_at) VALUES ('q', :key, :payload, 0, "
                        "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                    ),
                    {"key": key, "payload": payload},
                )
        before = _index_names(fresh_database.url, options)
        migrations.upgrade(fresh_database.url, options, "statifier_0007")
        assert migrations.current(fresh_database.url, options) == "statifier_0007"
        assert _index_names(fresh_database.url, options) - before == {
            "mig_outbox_execution_id_inserted_at_idx"
        }
        with engine.connect() as connection:
            rows = connection.execute(sa.text(f"SELECT key, execution_id FROM {table}"))
            assert sorted(rows) == [("k1", "ex_9"), ("k2", None)]
        migrations.downgrade(fresh_database.url, options, "statifier_0006")
        assert _index_names(fresh_database.url, options) == before
        with engine.connect() as connection:
            columns = sa.inspect(connection).get_columns("mig_outbox", schema=options.schema)
        assert "execution_id" not in {column["name"] for column in columns}
    finally:
        engine.dispose()


def test_the_step_errors_revision_counts_from_zero_and_goes_back(fresh_database: Any) -> None:
    # statifier_0008 adds the step_errors table and each execution's error count (0 for
    # the executions already there) and time of its last error; going back drops them.
    options = _options(fresh_database)
    migrations.upgrade(fresh_database.url, options, "statifier_0007")
    table = f"{options.schema}.mig_executions" if options.schema else "mig_executions"
    engine = sa.create_engine(migrations.sync_url(fresh_database.url))
    try:
        with engine.begin() as connection:
            connection.execute(
                sa.text(
                    f"INSERT INTO {table} (execution_id, content_hash, status, metadata, "
                    "created_at, updated_at) VALUES ('ex_1', 'h', 'active', '{}', "
                    "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                )
            )
        before = _index_names(fresh_database.url, options)
        migrations.upgrade(fresh_database.url, options, "statifier_0008")
        assert migrations.current(fresh_database.url, options) == "statifier_0008"
        assert _index_names(fresh_database.url, options) - before == {
            "mig_executions_last_error_at_idx",
            "mig_step_errors_execution_id_idx",
            "mig_step_errors_recorded_at_idx",
        }
        with engine.connect() as connection:
            rows = connection.execute(
                sa.text(
                    f"SELECT execution_id, error_count, last_error_at, final_state FROM {table}"
                )
            )
            assert list(rows) == [("ex_1", 0, None, None)]
        migrations.downgrade(fresh_database.url, options, "statifier_0007")
        assert _index_names(fresh_database.url, options) == before
        assert "mig_step_errors" not in _table_names(fresh_database.url, fresh_database.schema)
        with engine.connect() as connection:
            columns = sa.inspect(connection).get_columns("mig_executions", schema=options.schema)
        added = {"error_count", "last_error_at", "final_state"}
        assert not added & {column["name"] for column in columns}
    finally:
        engine.dispose()


_AT = datetime(2026, 5, 4, 9, 30, tzinfo=UTC)


def _old_words(options: TableOptions) -> tuple[sa.Table, sa.Table, sa.Table]:
    """The input log, the step errors and the fan-outs' table as ``statifier_0008``
    left them: the ``door`` columns and the ``settlements`` table."""
    metadata = sa.MetaData(schema=options.schema)
    inputs = sa.Table(
        options.name("inputs"),
        metadata,
        sa.Column("execution_id", sa.Text()),
        sa.Column("seq", sa.Integer()),
        sa.Column("door", sa.Text()),
        sa.Column("input_blob", sa.LargeBinary()),
        sa.Column("recorded_at", UtcDateTime()),
    )
    errors = sa.Table(
        options.name("step_errors"),
        metadata,
        sa.Column("execution_id", sa.Text()),
        sa.Column("seq", sa.Integer()),
        sa.Column("door", sa.Text()),
        sa.Column("name", sa.Text()),
        sa.Column("taken", sa.Boolean()),
        sa.Column("error_blob", sa.LargeBinary()),
        sa.Column("recorded_at", UtcDateTime()),
    )
    settlements = sa.Table(
        options.name("settlements"),
        metadata,
        sa.Column("parent_id", sa.Text()),
        sa.Column("invoke_id", sa.Text()),
        sa.Column("settled_at", UtcDateTime()),
    )
    return inputs, errors, settlements


async def _read_through_the_library(url: str, options: TableOptions) -> tuple[Any, ...]:
    async with SqlAdapter(url, options) as adapter:
        return (
            await adapter.inputs("ex_1"),
            [(e.via, e.seq, e.name, e.error) for e in await adapter.errors("ex_1", 10)],
            await adapter.fan_out_ended("p", "each"),
            await adapter.fan_out_ended("p", "other"),
            await adapter.take_fan_out_end("p", "each", _AT),
        )


def test_the_plain_words_revision_renames_in_place_and_goes_back(fresh_database: Any) -> None:
    # statifier_0009 renames the door columns via and the settlements table fan_out_ends
    # (its time column and its unique constraint too), keeping the rows, which the
    # library then reads under the new names; going back restores the old names.
    options = _options(fresh_database)
    migrations.upgrade(fresh_database.url, options, "statifier_0008")
    inputs, errors, settlements = _old_words(options)
    logged = (("create", b"[0]"), ("timer", b"[1]"))
    engine = sa.create_engine(migrations.sync_url(fresh_database.url))
    try:
        with engine.begin() as connection:
            connection.execute(
                inputs.insert(),
                [
                    {"execution_id": "ex_1", "seq": seq, "door": door, "input_blob": blob}
                    | {"recorded_at": _AT}
                    for seq, (door, blob) in enumerate(logged)
                ],
            )
            connection.execute(
                errors.insert(),
                {"execution_id": "ex_1", "seq": 1, "door": "timer", "name": "error.execution"}
                | {"taken": False, "error_blob": b"{}", "recorded_at": _AT},
            )
            connection.execute(
                settlements.insert(), {"parent_id": "p", "invoke_id": "each", "settled_at": _AT}
            )
        migrations.upgrade(fresh_database.url, options)
        assert migrations.current(fresh_database.url, options) == HEAD
        assert _differences(fresh_database.url, options) == []
        read, stored_errors, each, other, taken = asyncio.run(
            _read_through_the_library(fresh_database.url, options)
        )
        assert read == [
            InputRecord("ex_1", seq=seq, via=via, event=blob, recorded_at=_AT)
            for seq, (via, blob) in enumerate(logged)
        ]
        assert stored_errors == [("timer", 1, "error.execution", b"{}")]
        # The fan-out closed before the migration stays closed, taken once only.
        assert (each, other, taken) == (True, False, False)
        migrations.downgrade(fresh_database.url, options, "statifier_0008")
        assert migrations.current(fresh_database.url, options) == "statifier_0008"
        assert "mig_settlements" in _table_names(fresh_database.url, fresh_database.schema)
        with engine.connect() as connection:
            assert list(connection.execute(sa.select(inputs.c.seq, inputs.c.door))) == [
                (0, "create"),
                (1, "timer"),
            ]
            assert list(connection.execute(sa.select(errors.c.door))) == [("timer",)]
            assert list(
                connection.execute(sa.select(settlements.c.parent_id, settlements.c.settled_at))
            ) == [("p", _AT)]
            uniques = sa.inspect(connection).get_unique_constraints(
                "mig_settlements", schema=options.schema
            )
        assert [u["name"] for u in uniques] == ["mig_settlements_parent_id_invoke_id_key"]
    finally:
        engine.dispose()


def test_the_timer_lock_key_revision_fills_its_column_and_goes_back(fresh_database: Any) -> None:
    # statifier_0015 gives each timer its execution's lock key, hashed in Python for the
    # rows already there, and makes it required; going back drops exactly that.
    options = _options(fresh_database)
    migrations.upgrade(fresh_database.url, options, "statifier_0014")
    table = f"{options.schema}.mig_timers" if options.schema else "mig_timers"
    engine = sa.create_engine(migrations.sync_url(fresh_database.url))
    try:
        with engine.begin() as connection:
            for dedup_key, execution_id in (("d1", "ex_1"), ("d2", "ex_1"), ("d3", "ex/2")):
                connection.execute(
                    sa.text(
                        f"INSERT INTO {table} (execution_id, send_id, dedup_key, kind, due_at, "
                        "step_position, payload, inserted_at) VALUES (:execution_id, 's', "
                        ":dedup_key, 'send', CURRENT_TIMESTAMP, 0, '{}', CURRENT_TIMESTAMP)"
                    ),
                    {"execution_id": execution_id, "dedup_key": dedup_key},
                )
        before = _index_names(fresh_database.url, options)
        migrations.upgrade(fresh_database.url, options, "statifier_0015")
        assert _index_names(fresh_database.url, options) == before
        with engine.connect() as connection:
            rows = connection.execute(
                sa.text(f"SELECT dedup_key, execution_id, lock_key FROM {table}")
            )
            assert sorted(rows) == [
                ("d1", "ex_1", execution_lock_key("ex_1")),
                ("d2", "ex_1", execution_lock_key("ex_1")),
                ("d3", "ex/2", execution_lock_key("ex/2")),
            ]
            columns = sa.inspect(connection).get_columns("mig_timers", schema=options.schema)
        assert {column["name"]: column["nullable"] for column in columns}["lock_key"] is False
        migrations.downgrade(fresh_database.url, options, "statifier_0014")
        assert _index_names(fresh_database.url, options) == before
        with engine.connect() as connection:
            columns = sa.inspect(connection).get_columns("mig_timers", schema=options.schema)
            kept = connection.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar()
        assert "lock_key" not in {column["name"] for column in columns}
        assert kept == 3
    finally:
        engine.dispose()


def _bucket_revision(
    fresh_database: Any,
    *,
    table: str,
    revision: str,
    index: str,
    insert: str,
    rows: Sequence[Mapping[str, Any]],
    read: str,
    beside: Sequence[tuple[str, str, Mapping[str, Any]]] = (),
) -> dict[Any, int]:
    """Run the revision before ``revision``, insert ``rows`` into ``table`` (``insert``
    with the table's name at ``{table}``) and the rows ``beside`` (each ``(table,
    insert, values)``) into other tables, run ``revision`` and check that it added the
    index ``index`` alone and a required ``bucket`` column; go back and check that
    both went and every row stayed. Answer the buckets filled in, as ``read`` (its last
    column the bucket) found them: the other columns, as a tuple, to the bucket."""
    options = _options(fresh_database)
    previous = f"statifier_{int(revision.rsplit('_', 1)[1]) - 1:04d}"
    migrations.upgrade(fresh_database.url, options, previous)
    named = f"mig_{table}"

    def qualify(table: str) -> str:
        return f"{options.schema}.mig_{table}" if options.schema else f"mig_{table}"

    qualified = qualify(table)
    engine = sa.create_engine(migrations.sync_url(fresh_database.url))
    try:
        with engine.begin() as connection:
            for values in rows:
                connection.execute(sa.text(insert.format(table=qualified)), dict(values))
            for other, statement, values in beside:
                connection.execute(sa.text(statement.format(table=qualify(other))), dict(values))
        before = _index_names(fresh_database.url, options)
        migrations.upgrade(fresh_database.url, options, revision)
        assert _index_names(fresh_database.url, options) == before | {f"mig_{index}"}
        with engine.connect() as connection:
            found = connection.execute(sa.text(read.format(table=qualified)))
            buckets = {tuple(row[:-1]): int(row[-1]) for row in found}
            columns = sa.inspect(connection).get_columns(named, schema=options.schema)
        assert {column["name"]: column["nullable"] for column in columns}["bucket"] is False
        migrations.downgrade(fresh_database.url, options, previous)
        assert _index_names(fresh_database.url, options) == before
        with engine.connect() as connection:
            columns = sa.inspect(connection).get_columns(named, schema=options.schema)
            kept = connection.execute(sa.text(f"SELECT count(*) FROM {qualified}")).scalar()
        assert "bucket" not in {column["name"] for column in columns}
        assert kept == len(rows)
        return buckets
    finally:
        engine.dispose()


def test_the_timer_bucket_revision_fills_its_column_and_goes_back(fresh_database: Any) -> None:
    # statifier_0017 gives each timer its execution's bucket, computed in Python for
    # the rows already there, makes it required and indexes it with the due time;
    # going back drops exactly that.
    ids = {"d1": "ex_1", "d2": "ex_1", "d3": "ex/2", "d4": new_execution_id("s", "d", "k")}
    buckets = _bucket_revision(
        fresh_database,
        table="timers",
        revision="statifier_0017",
        index="timers_bucket_due_at_idx",
        insert=(
            "INSERT INTO {table} (execution_id, send_id, dedup_key, kind, due_at, "
            "step_position, payload, inserted_at, lock_key) VALUES (:execution_id, "
            "'s', :dedup_key, 'send', CURRENT_TIMESTAMP, 0, '{{}}', CURRENT_TIMESTAMP, "
            ":lock_key)"
        ),
        rows=[
            {"execution_id": ex, "dedup_key": key, "lock_key": execution_lock_key(ex)}
            for key, ex in ids.items()
        ],
        read="SELECT dedup_key, bucket FROM {table}",
    )
    assert buckets == {(key,): bucket_of(ex) for key, ex in ids.items()}
    assert bucket_of(ids["d4"]) == address_bucket("s", "d", "k")  # the minted id's own


ADDRESSES = [("web", "doc", "k1"), ("web", "doc", "k2"), ("ops", "other", "k1")]


def test_the_flow_bucket_revision_fills_its_column_and_goes_back(fresh_database: Any) -> None:
    # statifier_0018 gives each flow group its address's bucket, computed in Python for
    # the rows already there, makes it required and indexes it with the due time.
    buckets = _bucket_revision(
        fresh_database,
        table="flow_groups",
        revision="statifier_0018",
        index="flow_groups_bucket_due_at_idx",
        insert=(
            "INSERT INTO {table} (binding_id, scope, key, document, held, last_seq, "
            "window_count, due_at, failures, updated_at) VALUES ('b', :scope, :key, "
            ":document, 1, 1, 0, CURRENT_TIMESTAMP, 0, CURRENT_TIMESTAMP)"
        ),
        rows=[{"scope": s, "document": d, "key": k} for s, d, k in ADDRESSES],
        read="SELECT scope, document, key, bucket FROM {table}",
    )
    assert buckets == {where: address_bucket(*where) for where in ADDRESSES}


def test_the_outbox_bucket_revision_fills_its_column_and_goes_back(fresh_database: Any) -> None:
    # statifier_0019 gives each outbox row a bucket: its sending execution's, or for a
    # row handed off outside any execution its (queue, key)'s; then makes it required
    # and indexes it with the next attempt's time.
    minted = "ex_01KBCDEFGHJKMNPQRSTVWXYZ01" + tagged(address_bucket("s", "d", "k"))
    rows = {"k1": "order-17", "k2": "order-17/payment", "k3": minted, "k4": None}
    buckets = _bucket_revision(
        fresh_database,
        table="outbox",
        revision="statifier_0019",
        index="outbox_bucket_next_attempt_at_idx",
        insert=(
            "INSERT INTO {table} (queue, key, payload, attempts, next_attempt_at, "
            "inserted_at, execution_id) VALUES ('q', :key, '{{}}', 0, CURRENT_TIMESTAMP, "
            "CURRENT_TIMESTAMP, :ex)"
        ),
        rows=[{"key": key, "ex": ex} for key, ex in rows.items()],
        read="SELECT key, bucket FROM {table}",
    )
    assert buckets == {
        ("k1",): bucket_of("order-17"),
        ("k2",): bucket_of("order-17"),
        ("k3",): address_bucket("s", "d", "k"),
        ("k4",): outbox_bucket("q", "k4"),
    }


def test_the_address_bucket_revision_fills_its_column_and_goes_back(fresh_database: Any) -> None:
    # statifier_0020 gives each address row its address's bucket, computed in Python for
    # the rows already there, makes it required and indexes it with the row's key.
    buckets = _bucket_revision(
        fresh_database,
        table="addresses",
        revision="statifier_0020",
        index="addresses_bucket_id_idx",
        insert=(
            "INSERT INTO {table} (scope, document, key, execution_id, inserted_at) "
            "VALUES (:scope, :document, :key, 'x', CURRENT_TIMESTAMP)"
        ),
        rows=[{"scope": s, "document": d, "key": k} for s, d, k in ADDRESSES],
        read="SELECT scope, document, key, bucket FROM {table}",
    )
    assert buckets == {where: address_bucket(*where) for where in ADDRESSES}


def test_the_dedupe_bucket_revision_fills_its_column_and_goes_back(fresh_database: Any) -> None:
    # statifier_0021 gives each dedupe claim the bucket of the address its delivery's
    # ledger row names (the same binding's, the same message's), or its message id's
    # where no ledger row names a key; then makes it required and indexes it with the
    # expiry.
    ledger = (
        "INSERT INTO {table} (binding_id, message_id, scope, outcome, document, key, "
        "inserted_at) VALUES (:binding, :message, :scope, 'delivered', :document, :key, "
        "CURRENT_TIMESTAMP)"
    )
    keyed = [("b", "m1", *ADDRESSES[0]), ("b", "m2", *ADDRESSES[1]), ("b", "m2", *ADDRESSES[1])]
    keyless = [("b", "m3", "web", None, None)]
    buckets = _bucket_revision(
        fresh_database,
        table="dedupe",
        revision="statifier_0021",
        index="dedupe_bucket_expires_at_idx",
        insert=(
            "INSERT INTO {table} (binding_id, message_id, expires_at) "
            "VALUES (:binding, :message, CURRENT_TIMESTAMP)"
        ),
        rows=[
            {"binding": binding, "message": message}
            for binding, message in (
                ("b", "m1"),
                ("b", "m2"),
                ("b", "m3"),
                ("b", "m4"),
                ("c", "m1"),
            )
        ],
        read="SELECT binding_id, message_id, bucket FROM {table}",
        beside=[
            (
                "routing_ledger",
                ledger,
                {"binding": b, "message": m, "scope": s, "document": d, "key": k},
            )
            for b, m, s, d, k in (*keyed, *keyless)
        ],
    )
    assert buckets == {
        ("b", "m1"): address_bucket(*ADDRESSES[0]),
        ("b", "m2"): address_bucket(*ADDRESSES[1]),
        ("b", "m3"): bucket_of("m3"),  # its ledger row names no key
        ("b", "m4"): bucket_of("m4"),  # no ledger row
        ("c", "m1"): bucket_of("m1"),  # the ledger row of m1 is another binding's
    }


def test_the_execution_bucket_revision_fills_its_column_and_goes_back(
    fresh_database: Any,
) -> None:
    # statifier_0022 gives each execution its root's bucket, computed in Python for the
    # rows already there, makes it required and indexes it with the execution's id.
    minted = new_execution_id("s", "d", "k")
    ids = ["order-17", "order-17/payment", "order-17/payment/3", minted]
    buckets = _bucket_revision(
        fresh_database,
        table="executions",
        revision="statifier_0022",
        index="executions_bucket_execution_id_idx",
        insert=(
            "INSERT INTO {table} (execution_id, content_hash, status, metadata, created_at, "
            "updated_at) VALUES (:execution_id, 'h', 'active', '{{}}', CURRENT_TIMESTAMP, "
            "CURRENT_TIMESTAMP)"
        ),
        rows=[{"execution_id": execution_id} for execution_id in ids],
        read="SELECT execution_id, bucket FROM {table}",
    )
    assert buckets == {(execution_id,): bucket_of(execution_id) for execution_id in ids}
    assert buckets[(minted,)] == address_bucket("s", "d", "k")


def test_the_ledger_bucket_revision_fills_its_column_and_goes_back(fresh_database: Any) -> None:
    # statifier_0023 gives each ledger row its address's bucket, else its execution's,
    # else its message id's, else its binding's (ledger_bucket), makes it required and
    # indexes it with the insert time.
    rows = [
        ("b", "m1", "web", "order", "o-1", None),  # a delivery: its address
        ("b", "m2", "web", "order", "o-2", "order-17"),  # its address, not its execution
        ("route", "m3", "web", None, "mailer", "order-17"),  # a refused send: its execution
        ("b", "m4", "web", "order", None, None),  # a key refused: its message
        ("b", None, None, None, None, None),  # nothing else: its binding
    ]
    buckets = _bucket_revision(
        fresh_database,
        table="routing_ledger",
        revision="statifier_0023",
        index="routing_ledger_bucket_inserted_at_idx",
        insert=(
            "INSERT INTO {table} (binding_id, message_id, scope, outcome, document, key, "
            "execution_id, inserted_at) VALUES (:binding, :message, :scope, 'delivered', "
            ":document, :key, :execution, CURRENT_TIMESTAMP)"
        ),
        rows=[
            {"binding": b, "message": m, "scope": s, "document": d, "key": k, "execution": e}
            for b, m, s, d, k, e in rows
        ],
        read="SELECT binding_id, message_id, bucket FROM {table}",
    )
    assert buckets == {
        ("b", "m1"): address_bucket("web", "order", "o-1"),
        ("b", "m2"): address_bucket("web", "order", "o-2"),
        ("route", "m3"): bucket_of("order-17"),
        ("b", "m4"): bucket_of("m4"),
        ("b", None): bucket_of("b"),
    }


def test_the_position_bucket_revision_fills_its_column_and_goes_back(fresh_database: Any) -> None:
    # statifier_0024 gives each saved position its key's bucket, makes it required and
    # indexes it with the key.
    keys = ["order-17", "order-17/payment", new_execution_id("s", "d", "k")]
    buckets = _bucket_revision(
        fresh_database,
        table="positions",
        revision="statifier_0024",
        index="positions_bucket_key_idx",
        insert=(
            "INSERT INTO {table} (key, content_hash, position_blob, saved_at) "
            "VALUES (:key, 'h', :blob, CURRENT_TIMESTAMP)"
        ),
        rows=[{"key": key, "blob": b"p"} for key in keys],
        read="SELECT key, bucket FROM {table}",
    )
    assert buckets == {(key,): bucket_of(key) for key in keys}


def test_the_held_create_bucket_revision_fills_its_column_and_goes_back(
    fresh_database: Any,
) -> None:
    # statifier_0025 gives each event a cap holds its address's bucket, makes it
    # required and indexes it with the seq.
    buckets = _bucket_revision(
        fresh_database,
        table="held_creates",
        revision="statifier_0025",
        index="held_creates_bucket_seq_idx",
        insert=(
            "INSERT INTO {table} (document, scope, key, seq, binding_id, create_mode, "
            "message_id, event_blob, arrived_at) VALUES (:document, :scope, :key, 1, 'b', "
            "'always', 'm', :blob, CURRENT_TIMESTAMP)"
        ),
        rows=[{"scope": s, "document": d, "key": k, "blob": b"e"} for s, d, k in ADDRESSES],
        read="SELECT scope, document, key, bucket FROM {table}",
    )
    assert buckets == {where: address_bucket(*where) for where in ADDRESSES}


def test_the_parent_revision_fills_its_column_and_goes_back(fresh_database: Any) -> None:
    # statifier_0029 copies the parent each execution's metadata names into a column
    # of its own and indexes it; new rows get it from their insert.
    options = _options(fresh_database)
    migrations.upgrade(fresh_database.url, options, "statifier_0028")
    table = f"{options.schema}.mig_executions" if options.schema else "mig_executions"
    insert = sa.text(
        f"INSERT INTO {table} (execution_id, content_hash, status, metadata, created_at, "
        "updated_at, bucket) VALUES (:id, 'h', 'active', :metadata, CURRENT_TIMESTAMP, "
        "CURRENT_TIMESTAMP, 0)"
    )
    metadata = {
        "p/a": {"statifier.parent": "p", "statifier.invoke": "a"},
        "q/a": {"statifier.parent": "q", "statifier.invoke": "a", "tenant": "t"},
        "named": {"parent": "p"},
        "bare": {},
    }
    engine = sa.create_engine(migrations.sync_url(fresh_database.url))
    try:
        with engine.begin() as connection:
            for execution_id, pairs in metadata.items():
                connection.execute(insert, {"id": execution_id, "metadata": json.dumps(pairs)})
        before = _index_names(fresh_database.url, options)
        migrations.upgrade(fresh_database.url, options, "statifier_0029")
        assert _index_names(fresh_database.url, options) == before | {"mig_executions_parent_idx"}
        with engine.connect() as connection:
            read = connection.execute(sa.text(f"SELECT execution_id, parent FROM {table}"))
            assert dict(read.fetchall()) == {"p/a": "p", "q/a": "q", "named": None, "bare": None}
        migrations.downgrade(fresh_database.url, options, "statifier_0028")
        assert _index_names(fresh_database.url, options) == before
        with engine.connect() as connection:
            columns = sa.inspect(connection).get_columns("mig_executions", schema=options.schema)
            kept = connection.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar()
        assert "parent" not in {column["name"] for column in columns}
        assert kept == len(metadata)
    finally:
        engine.dispose()
