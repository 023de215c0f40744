"""What the SQL adapter promises beyond the conformance suite, on SQLite and PostgreSQL:
the lock across connections, the caller's transaction, metadata with awkward keys,
nested blocks, and the table options."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import pytest_asyncio
import sqlalchemy as sa

from statifier.persistence import ExecutionRecord, LockTimeout, Status
from statifier.persistence.records import StepWrite
from statifier.persistence.sql import SqlAdapter
from statifier.sql import TableOptions, migrations

from .conftest import CallerTransaction

_NOW = datetime(2026, 3, 1, 9, 30, 0, 250000, tzinfo=UTC)


def _record(execution_id: str, **metadata: str) -> ExecutionRecord:
    return ExecutionRecord(
        id=execution_id,
        content_hash="c" * 64,
        status=Status.ACTIVE,
        position=b"position",
        metadata=metadata,
        created_at=_NOW,
        updated_at=_NOW,
    )


@pytest_asyncio.fixture
async def second(sql_store: Any) -> AsyncIterator[SqlAdapter]:
    """Another adapter on the same database, with an engine and connections of its own:
    to the database it is another process."""
    adapter = SqlAdapter(sql_store.url, sql_store.tables)
    try:
        yield adapter
    finally:
        await adapter.close()


class _Holder:
    """Holds ``exclusive(execution_id)`` on ``adapter`` until released."""

    def __init__(self, adapter: SqlAdapter, execution_id: str) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.task = asyncio.create_task(self._hold(adapter, execution_id))

    async def _hold(self, adapter: SqlAdapter, execution_id: str) -> None:
        async with adapter.exclusive(execution_id, 5.0):
            self.entered.set()
            await self.release.wait()

    async def __aenter__(self) -> _Holder:
        async with asyncio.timeout(5):
            await self.entered.wait()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self.release.set()
        async with asyncio.timeout(5):
            await self.task


# The lock across connections ("another process").


@pytest.mark.asyncio
async def test_another_connection_waits_for_the_lock_and_times_out(
    sql_adapter: SqlAdapter, second: SqlAdapter
) -> None:
    async with _Holder(sql_adapter, "exec-1"):
        started = asyncio.get_running_loop().time()
        with pytest.raises(LockTimeout) as refused:
            async with second.exclusive("exec-1", 0.2):
                pass
        assert asyncio.get_running_loop().time() - started >= 0.15
        assert refused.value.execution_id == "exec-1"
    async with second.exclusive("exec-1", 2.0):
        pass


@pytest.mark.asyncio
async def test_another_connection_enters_once_the_holder_commits(
    sql_adapter: SqlAdapter, second: SqlAdapter
) -> None:
    await sql_adapter.insert_execution(_record("exec-1"))
    entered, release = asyncio.Event(), asyncio.Event()

    async def holder() -> None:
        async with sql_adapter.exclusive("exec-1", 5.0):
            record = await sql_adapter.fetch_execution("exec-1")
            assert record is not None
            entered.set()
            await release.wait()
            await sql_adapter.update_execution(
                replace(record, status=Status.COMPLETED, ended_at=_NOW)
            )

    async def other() -> Status:
        async with second.exclusive("exec-1", 5.0):
            record = await second.fetch_execution("exec-1")
            assert record is not None
            return record.status

    holding = asyncio.create_task(holder())
    await asyncio.wait_for(entered.wait(), 5)
    waiting = asyncio.create_task(other())
    await asyncio.sleep(0.1)
    assert not waiting.done()
    release.set()
    await asyncio.wait_for(holding, 5)
    assert await asyncio.wait_for(waiting, 5) is Status.COMPLETED


@pytest.mark.asyncio
async def test_postgres_locks_each_execution_apart(
    sql_store: Any, sql_adapter: SqlAdapter, second: SqlAdapter
) -> None:
    if sql_store.backend != "postgresql":
        # SQLite's single writer admits one block at a time (the conformance suite
        # checks that); here only the writer's release is checked.
        async with _Holder(sql_adapter, "exec-1"):
            with pytest.raises(LockTimeout):
                async with second.exclusive("exec-2", 0.1):
                    pass
        return
    async with _Holder(sql_adapter, "exec-1"), second.exclusive("exec-2", 1.0):
        pass


# Nested blocks: a child created inside its parent's step.


@pytest.mark.asyncio
async def test_a_nested_block_joins_the_outer_one(sql_adapter: SqlAdapter) -> None:
    async with sql_adapter.exclusive("parent", 2.0):
        await sql_adapter.insert_execution(_record("parent"))
        async with sql_adapter.exclusive("child", 2.0):
            await sql_adapter.insert_execution(_record("child"))
        with pytest.raises(RuntimeError):
            await _failing_child(sql_adapter)
    assert await sql_adapter.fetch_execution("parent") is not None
    assert await sql_adapter.fetch_execution("child") is not None
    # The failed nested block undid its own writes and nothing else.
    assert await sql_adapter.fetch_execution("other-child") is None


async def _failing_child(adapter: SqlAdapter) -> None:
    async with adapter.exclusive("other-child", 2.0):
        await adapter.insert_execution(_record("other-child"))
        raise RuntimeError("the nested block fails")


# The caller's transaction.


@pytest.mark.asyncio
async def test_the_callers_commit_keeps_what_the_view_wrote(sql_adapter: SqlAdapter) -> None:
    async with CallerTransaction(sql_adapter) as caller:
        async with caller.view.exclusive("exec-1", 2.0):
            await caller.view.insert_execution(_record("exec-1"))
            assert await caller.view.append_input("exec-1", "step", b"[1]", _NOW, None) == 0
        # The view committed nothing: the adapter's own connection sees nothing yet.
        assert await caller.view.fetch_execution("exec-1") is not None
        await caller.commit()
    assert await sql_adapter.fetch_execution("exec-1") is not None
    assert [entry.seq for entry in await sql_adapter.inputs("exec-1")] == [0]


@pytest.mark.asyncio
async def test_the_callers_rollback_leaves_nothing(sql_adapter: SqlAdapter) -> None:
    async with CallerTransaction(sql_adapter) as caller:
        async with caller.view.exclusive("exec-1", 2.0):
            await caller.view.insert_execution(_record("exec-1"))
            await caller.view.append_input("exec-1", "step", b"[1]", _NOW, None)
        await caller.rollback()
    assert await sql_adapter.fetch_execution("exec-1") is None
    assert await sql_adapter.inputs("exec-1") == []


@pytest.mark.asyncio
async def test_the_view_never_commits(sql_adapter: SqlAdapter, second: SqlAdapter) -> None:
    async with CallerTransaction(sql_adapter) as caller:
        async with caller.view.exclusive("exec-1", 2.0):
            await caller.view.insert_execution(_record("exec-1"))
        assert await second.fetch_execution("exec-1") is None
        await caller.rollback()


@pytest.mark.asyncio
async def test_the_lock_is_held_until_the_caller_commits(
    sql_adapter: SqlAdapter, second: SqlAdapter
) -> None:
    async with CallerTransaction(sql_adapter) as caller:
        async with caller.view.exclusive("exec-1", 2.0):
            await caller.view.insert_execution(_record("exec-1"))
        # The block has ended, the caller's transaction has not: others still wait.
        for other in (sql_adapter, second):
            with pytest.raises(LockTimeout):
                async with other.exclusive("exec-1", 0.2):
                    pass
        await caller.commit()
    async with second.exclusive("exec-1", 2.0):
        assert await second.fetch_execution("exec-1") is not None


@pytest.mark.asyncio
async def test_a_lock_timeout_leaves_the_callers_transaction_usable(
    sql_adapter: SqlAdapter, second: SqlAdapter
) -> None:
    async with CallerTransaction(sql_adapter) as caller:
        async with _Holder(second, "exec-1"):
            with pytest.raises(LockTimeout):
                async with caller.view.exclusive("exec-1", 0.2):
                    pass
        await caller.view.insert_execution(_record("exec-2"))
        await caller.commit()
    assert await sql_adapter.fetch_execution("exec-2") is not None


# Metadata with awkward keys and values: bound as parameters, never spliced into SQL.

_AWKWARD = {
    "tenant": "acme",
    "it's": 'say "hi"',
    "a.b.c": "dotted",
    "$[0]": "json path",
    "clé ünïcødé 鍵": "値 ✓",
    "": "empty key",
    "'; DROP TABLE x; --": "--",
}


@pytest.mark.asyncio
async def test_metadata_lists_by_awkward_keys(sql_adapter: SqlAdapter) -> None:
    await sql_adapter.insert_execution(_record("all", **_AWKWARD))
    await sql_adapter.insert_execution(_record("some", tenant="acme", **{"a.b.c": "other"}))
    for key, value in _AWKWARD.items():
        if key == "tenant":
            continue  # both have it
        listed = await sql_adapter.list_by_metadata({key: value})
        assert [record.id for record in listed] == ["all"], key
        assert dict(listed[0].metadata) == _AWKWARD
    assert sorted(r.id for r in await sql_adapter.list_by_metadata({"tenant": "acme"})) == [
        "all",
        "some",
    ]
    assert await sql_adapter.statuses_by_metadata(_AWKWARD) == {"all": Status.ACTIVE}
    # A nested path is a key of its own, not a path into the document.
    assert await sql_adapter.list_by_metadata({"a": "dotted"}) == []
    assert await sql_adapter.list_by_metadata({"tenant": "ACME"}) == []
    assert await sql_adapter.list_by_metadata({"it's": "say"}) == []


# Table options: a UUID key, a leading host column with a default, time zones.


@pytest_asyncio.fixture
async def keyed_adapter(sql_store: Any) -> AsyncIterator[SqlAdapter]:
    """An adapter over tables with a UUID key and a leading column the package never
    names (it has a server default)."""
    options = TableOptions(
        prefix=f"k{uuid.uuid4().hex[:6]}_",
        schema=sql_store.tables.options.schema,
        key_type=sa.Uuid,
        leading_columns=lambda: [
            sa.Column("tenant_id", sa.Text(), nullable=False, server_default="shared")
        ],
    )
    migrations.upgrade(sql_store.url, options)
    adapter = SqlAdapter(sql_store.url, options)
    try:
        yield adapter
    finally:
        await adapter.close()
        migrations.downgrade(sql_store.url, options)


@pytest.mark.asyncio
async def test_a_uuid_key_and_a_leading_column(keyed_adapter: SqlAdapter) -> None:
    adapter = keyed_adapter
    await adapter.insert_execution(_record("exec-1", tenant="t"))
    assert await adapter.append_input("exec-1", "step", b"[0]", _NOW, None) == 0
    assert await adapter.append_input("exec-1", "step", b"[1]", _NOW, None) == 1
    assert [entry.event for entry in await adapter.inputs("exec-1")] == [b"[0]", b"[1]"]
    record = await adapter.fetch_execution("exec-1")
    assert record is not None
    assert record.metadata == {"tenant": "t"}
    # Steps written together where the client makes the entries' keys.
    steps = [
        StepWrite(_record("exec-1", tenant="t"), via="step", event=b"[2]", recorded_at=_NOW),
        StepWrite(_record("exec-1", tenant="t"), via="timer", event=b"[3]", recorded_at=_NOW),
    ]
    await adapter.record_steps(steps, None)
    assert [(e.seq, e.via) for e in await adapter.inputs("exec-1")][2:] == [
        (2, "step"),
        (3, "timer"),
    ]


@pytest.mark.asyncio
async def test_times_come_back_aware_in_utc(sql_adapter: SqlAdapter) -> None:
    india = datetime(2026, 3, 1, 15, 0, 0, 1, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    await sql_adapter.insert_execution(
        replace(_record("exec-1"), created_at=india, updated_at=india)
    )
    stored = await sql_adapter.fetch_execution("exec-1")
    assert stored is not None
    assert stored.created_at == india
    assert stored.created_at is not None
    assert stored.created_at.utcoffset() == timedelta(0)


@pytest.mark.asyncio
async def test_a_naive_time_is_refused_and_nothing_is_written(sql_adapter: SqlAdapter) -> None:
    naive = datetime(2026, 3, 1, 9, 30)  # noqa: DTZ001 - the point of the test
    with pytest.raises(ValueError, match="aware"):
        await sql_adapter.insert_execution(replace(_record("exec-1"), created_at=naive))
    assert await sql_adapter.fetch_execution("exec-1") is None


def test_the_wrong_engine_kind_is_refused(tmp_path: Any) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        with pytest.raises(ValueError, match="schema"):
            SqlAdapter(engine, TableOptions(schema="elsewhere"))
    finally:
        engine.dispose()
    with pytest.raises(ValueError, match="PostgreSQL or SQLite"):
        SqlAdapter("mysql://localhost/db")
