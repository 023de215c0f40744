"""The durable executions' statements (``statifier.sql.executions``) on both databases:
every statement runs through the dialect on the transaction's driver connection and
answers alike, whichever form the dialect's capabilities chose."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from statifier.buckets import address_bucket, bucket_of
from statifier.chart import compile_chart
from statifier.ids import new_execution_id
from statifier.persistence import Executions, Storage
from statifier.persistence.executions import INVOKE_KEY, PARENT_KEY
from statifier.persistence.sql import SqlAdapter
from statifier.persistence.sql.schema import PINNING
from statifier.sql import TableOptions, migrations
from statifier.sql.dialect import Dialect
from statifier.sql.executions import ExecutionStatements
from statifier.sql.postgres import POSTGRES
from statifier.sql.sqlite import SQLITE
from statifier.sql.tables import PARENT_METADATA_KEY

START = datetime(2026, 12, 2, 12, tzinfo=UTC)


def test_the_capabilities_choose_the_forms_that_differ() -> None:
    tables = TableOptions().define()
    postgres = ExecutionStatements(tables, POSTGRES, PINNING)
    sqlite = ExecutionStatements(tables, SQLITE, PINNING)
    assert postgres.fetch_execution_locked == f"{postgres.fetch_execution} FOR UPDATE"
    assert postgres.guard_chart.endswith("FOR KEY SHARE")
    assert postgres.record_step is not None
    assert postgres.record_step.startswith("WITH")
    # A single writer needs no row lock, and without writes in WITH a step is two
    # statements.
    assert sqlite.fetch_execution_locked == sqlite.fetch_execution
    assert sqlite.fetch_executions_locked == sqlite.fetch_executions
    assert "FOR" not in sqlite.guard_chart
    assert sqlite.record_step is None
    # The metadata query is the dialect's: containment where the column answers it.
    assert "@>" in postgres.by_metadata
    assert "json_each" in sqlite.statuses_by_metadata


def test_a_parents_children_are_asked_for_by_the_key_the_driver_files_them_under() -> None:
    assert PARENT_METADATA_KEY == PARENT_KEY
    s = ExecutionStatements(TableOptions().define(), SQLITE, PINNING)
    asked = {PARENT_KEY: "p", INVOKE_KEY: "i"}
    assert s.metadata_query(asked, statuses=True) == s.statuses_by_parent_metadata
    assert s.metadata_query(asked, statuses=False) == s.by_parent_metadata
    assert s.metadata_query({INVOKE_KEY: "i"}, statuses=True) == s.statuses_by_metadata
    assert "statifier_executions.parent = :parent AND" in s.statuses_by_parent_metadata
    for dialect in (SQLITE, POSTGRES):
        with pytest.raises(ValueError, match="not a metadata key"):
            dialect.json_text_sql("metadata", "it's")


def test_on_sqlite_a_parents_children_are_found_by_the_index(tmp_path: Path) -> None:
    # Without the index, cancelling one execution read every execution's metadata.
    url = f"sqlite:///{tmp_path / 'plan.db'}"
    migrations.upgrade(url, TableOptions())
    s = ExecutionStatements(TableOptions().define(), SQLITE, PINNING)
    with closing(sqlite3.connect(tmp_path / "plan.db")) as connection:
        for statuses in (True, False):
            sql = s.metadata_query({PARENT_KEY: "p"}, statuses=statuses)
            plan = connection.execute(
                f"EXPLAIN QUERY PLAN {sql}", {"metadata": "{}", "parent": "p"}
            )
            steps = [step[3] for step in plan.fetchall()]
            assert steps[0] == (
                "SEARCH statifier_executions USING INDEX statifier_executions_parent_idx (parent=?)"
            ), steps


def _execution(dialect: Dialect, execution_id: str, status: str) -> dict[str, Any]:
    return {
        "execution_id": execution_id,
        "content_hash": "h1",
        "status": status,
        "position_blob": b"p",
        "metadata": json.dumps({"tenant": "a", "kind": execution_id}),
        "outcome_blob": None,
        "failure": None,
        "created_at": dialect.time(START),
        "updated_at": dialect.time(START),
        "ended_at": None,
        "error_count": 0,
        "last_error_at": None,
        "final_state": None,
        "bucket": bucket_of(execution_id),
    }


def _step(dialect: Dialect, execution_id: str, ended: bool) -> dict[str, Any]:
    return {
        "execution_id": execution_id,
        "status": "completed" if ended else "active",
        "position_blob": b"p2",
        "outcome_blob": b"o" if ended else None,
        "failure": None,
        "updated_at": dialect.time(START + timedelta(seconds=1)),
        "ended_at": dialect.time(START + timedelta(seconds=1)) if ended else None,
        "error_count": 0,
        "last_error_at": None,
        "final_state": "done" if ended else None,
    }


def _append(dialect: Dialect, execution_id: str, blob: bytes, cap: int | None) -> dict[str, Any]:
    return {
        "execution_id": execution_id,
        "via": "go",
        "cap": cap,
        "input_blob": blob,
        "recorded_at": dialect.time(START),
    }


@pytest.mark.asyncio
async def test_an_execution_row_carries_its_roots_bucket(sql_adapter: SqlAdapter) -> None:
    # Written at the insert: a plain id's hash, a child's root's, a minted id's own.
    machine = compile_chart(
        '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="a"><state id="a"/></scxml>'
    )
    minted = new_execution_id("web", "order", "o-17")
    ids = ["order-17", "order-17/payment", "order-17/payment/3", minted]
    executions = Executions(Storage(sql_adapter))
    for execution_id in ids:
        await executions.create(execution_id, machine)
    table = sql_adapter.tables.executions
    name = f"{table.schema}.{table.name}" if table.schema else table.name
    async with sql_adapter.transaction() as tx:
        rows = await sql_adapter.dialect.rows(
            tx.driver, f"SELECT execution_id, bucket FROM {name}", {}
        )
    assert dict(rows) == {execution_id: bucket_of(execution_id) for execution_id in ids}
    assert len({bucket_of(execution_id) for execution_id in ids[:3]}) == 1
    assert bucket_of(minted) == address_bucket("web", "order", "o-17")


@pytest.mark.asyncio
async def test_the_execution_statements_read_alike_on_both_databases(
    sql_adapter: SqlAdapter,
) -> None:
    dialect = sql_adapter.dialect
    s = ExecutionStatements(sql_adapter.tables, dialect, PINNING)
    run, rows, row = dialect.execute, dialect.rows, dialect.row
    async with sql_adapter.transaction() as tx:
        d = tx.driver
        chart = {
            "content_hash": "h1",
            "chart_blob": b"c",
            "name": "n",
            "version": "1",
            "saved_at": dialect.time(START),
            "retired_at": None,
            "retired_by": None,
        }
        await run(d, s.insert_chart, s.keyed(dict(chart)))
        await run(d, s.insert_chart, s.keyed(dict(chart)))  # stored once
        (found,) = await rows(d, s.fetch_chart, {"h": "h1"})
        assert found[0] == "h1"
        assert bytes(found[1]) == b"c"
        assert dialect.read_time(found[4]) == START
        assert await row(d, s.guard_chart, {"h": "h1"}) == (None, None)
        assert await row(d, s.lock_chart, {"h": "h1"}) == (None,)

        for execution_id, status in (("e1", "active"), ("e2", "active"), ("e3", "needs_migration")):
            values = s.keyed(_execution(dialect, execution_id, status))
            assert await row(d, s.insert_execution, values) is not None
        again = s.keyed(_execution(dialect, "e1", "active"))
        assert await row(d, s.insert_execution, again) is None  # already there
        for sql in (s.fetch_execution, s.fetch_execution_locked):
            (fetched,) = await rows(d, sql, {"id": "e1"})
            assert fetched[:3] == ("e1", "h1", "active")
            assert dialect.read_time(fetched[7]) == START
        ids = dialect.listed(["e3", "nope", "e1"])
        for sql in (s.fetch_executions, s.fetch_executions_locked):
            assert [r[0] for r in await rows(d, sql, {"ids": ids})] == ["e1", "e3"]

        assert await row(d, s.append_input, s.keyed(_append(dialect, "e1", b"i0", None))) == (0,)
        if s.record_step is not None:
            values = {**_step(dialect, "e1", ended=False), **_append(dialect, "e1", b"i1", 3)}
            assert await row(d, s.record_step, s.keyed(values)) == (1, 1)
            missing = {**_step(dialect, "nope", ended=False), **_append(dialect, "nope", b"x", 3)}
            assert await row(d, s.record_step, s.keyed(missing)) == (0, None)
        else:
            assert await run(d, s.update_execution, _step(dialect, "e1", ended=False)) == 1
            assert await row(d, s.append_input, s.keyed(_append(dialect, "e1", b"i1", 3))) == (1,)
        # The entry that takes the cap's last slot is the marker; the log is then closed.
        assert await row(d, s.append_input, s.keyed(_append(dialect, "e1", b"i2", 3))) == (2,)
        assert await row(d, s.append_input, s.keyed(_append(dialect, "e1", b"i3", 3))) is None
        logged = await rows(d, s.inputs, {"id": "e1"})
        assert [(r[1], None if r[3] is None else bytes(r[3])) for r in logged] == [
            (0, b"i0"),
            (1, b"i1"),
            (2, None),
        ]
        assert await run(d, s.update_execution, _step(dialect, "e1", ended=True)) == 1
        assert await run(d, s.update_execution, _step(dialect, "nope", ended=True)) == 0

        for seq in (0, 1, 2):
            error = {
                "execution_id": "e1",
                "seq": seq,
                "via": "go",
                "name": "Boom",
                "taken": seq == 2,
                "error_blob": b"e",
                "recorded_at": dialect.time(START),
            }
            await run(d, s.insert_error, s.keyed(error))
        newest = await rows(d, s.errors, {"id": "e1", "limit": 2})
        assert [(r[1], bool(r[4])) for r in newest] == [(1, False), (2, True)]

        counts = dict(await rows(d, s.count_executions, {"h": "h1"}))
        assert counts == {"completed": 1, "active": 1, "needs_migration": 1}
        pinning = {r[0] for r in await rows(d, s.pinning, {"h": "h1"})}
        assert pinning == {"e2", "e3"}  # e1 completed

        answer = {
            "child_id": "c1",
            "parent_id": "e2",
            "invoke_id": "i",
            "content_hash": "h1",
            "kind": "completed",
            "answer_blob": b"a",
            "failure": None,
            "created_at": dialect.time(START),
            "delivered_at": None,
        }
        await run(d, s.insert_answer, s.keyed(dict(answer)))
        await run(d, s.insert_answer, s.keyed({**answer, "child_id": "c2"}))
        await run(d, s.insert_answer, s.keyed(dict(answer)))  # stored once
        assert await row(d, s.linked, {"h": "h1"}) == (2,)
        assert [r[0] for r in await rows(d, s.fetch_answer, {"id": "c1"})] == ["c1"]
        assert [r[0] for r in await rows(d, s.undelivered, {"limit": 10})] == ["c1", "c2"]
        delivered = {"ids": dialect.listed(["c1", "c2"]), "at": dialect.time(START)}
        assert await run(d, s.mark_delivered, delivered) == 2
        assert await run(d, s.mark_delivered, delivered) == 0  # already delivered
        assert await rows(d, s.undelivered, {"limit": 10}) == []

        ending = {"parent": "e2", "invoke": "i", "at": dialect.time(START)}
        assert await row(d, s.take_fan_out_end, s.keyed(dict(ending))) is not None
        assert await row(d, s.take_fan_out_end, s.keyed(dict(ending))) is None
        assert await row(d, s.fan_out_ended, {"parent": "e2", "invoke": "i"}) is not None
        assert await row(d, s.fan_out_ended, {"parent": "e2", "invoke": "j"}) is None

        for blob in (b"s1", b"s2"):  # the second replaces the first
            position = {
                "key": "k",
                "content_hash": "h1",
                "position_blob": blob,
                "saved_at": dialect.time(START),
                "bucket": bucket_of("k"),
            }
            await run(d, s.save_position, s.keyed(position))
        saved = await row(d, s.fetch_position, {"key": "k"})
        assert saved is not None
        assert bytes(saved[2]) == b"s2"
        assert await row(d, s.count_positions, {"h": "h1"}) == (1,)
        assert await run(d, s.delete_position, {"key": "k"}) == 1
        assert await row(d, s.fetch_position, {"key": "k"}) is None

        for pairs, whole, expected in (
            ({"tenant": "a"}, False, {"e1", "e2", "e3"}),
            ({"tenant": "a", "kind": "e2"}, True, {"e2"}),
            ({}, False, {"e1", "e2", "e3"}),
            ({"tenant": "b"}, True, set()),
        ):
            sql = s.by_metadata if whole else s.statuses_by_metadata
            found_rows = await rows(d, sql, {"metadata": json.dumps(pairs)})
            assert {r[0] for r in found_rows} == expected
            assert all(len(r) == (13 if whole else 2) for r in found_rows)

        recharted = {
            "id": "e3",
            "from": "h1",
            "to": "h2",
            "status": "needs_migration",
            "position_blob": b"p3",
            "failure": None,
            "updated_at": dialect.time(START),
        }
        assert await run(d, s.rechart_execution, recharted) == 1
        assert await run(d, s.rechart_execution, recharted) == 0  # no longer on h1

        retire = {"h": "h1", "at": dialect.time(START), "by": "ops"}
        assert await run(d, s.retire_chart, retire) == 1
        assert await run(d, s.retire_chart, retire) == 0
        retired = await row(d, s.guard_chart, {"h": "h1"})
        assert retired is not None
        assert retired[1] == "ops"
        assert dialect.read_time(retired[0]) == START

        before = dialect.time(START + timedelta(seconds=2))
        assert await rows(d, s.prune, {"before": before, "limit": 10}) == [("e1",)]
        assert await rows(d, s.prune, {"before": before, "limit": 10}) == []
        pruned = {"ids": dialect.listed(["e1"])}
        assert await run(d, s.drop_logs, pruned) == 3
        assert await run(d, s.drop_errors, pruned) == 3
        assert await rows(d, s.inputs, {"id": "e1"}) == []
