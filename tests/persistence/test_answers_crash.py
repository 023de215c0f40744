"""Children's answers cannot be lost: a parent with five fan-out children and one
single durable child, driven by processes SIGKILLed at random adapter calls (inside a
transaction, between two, just after a commit), always closes its fan-out exactly once, on
both databases, with no fan-out end row among the executions."""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from statifier.persistence import Status, Storage
from statifier.persistence.driver import Driver
from statifier.persistence.sql import SqlAdapter
from statifier.sql import migrations

from .conftest import SqlStore

RUNNER = Path(__file__).with_name("answering_parent.py")
KILLS = 30
"""At least this many processes are killed per database."""
LAST_CALL = 130
"""Kill points are drawn from 1..LAST_CALL adapter calls (a whole run makes ~95-110)."""


def _run(store: SqlStore, parent: str, kill_at: int) -> subprocess.CompletedProcess[str]:
    schema = store.tables.options.schema or "-"
    prefix = store.tables.options.prefix
    command = [sys.executable, str(RUNNER), store.url, prefix, schema, parent, str(kill_at)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


async def _closed_once(store: SqlStore, parent: str) -> None:
    async with SqlAdapter(store.url, store.tables) as adapter:
        driver = Driver(Storage(adapter))
        record = await driver.storage.fetch_execution(parent)
        assert record.status is Status.COMPLETED
        answers = [
            entry.event.name
            for entry in await driver.executions.inputs(parent)
            if entry.via == "answer" and entry.event is not None
        ]
        assert sorted(answers) == ["done.invoke.each", "done.invoke.solo"], answers
        assert await adapter.fan_out_ended(parent, "each")
        assert not await adapter.take_fan_out_end(parent, "each", datetime.now(UTC))
        owed = [a for a in await adapter.undelivered_answers(100) if a.parent_id == parent]
        assert owed == []
        for child in [f"{parent}/solo", *(f"{parent}/each/{i}" for i in range(5))]:
            answer = await adapter.fetch_answer(child)
            assert answer is not None, child
            assert answer.delivered_at is not None, child


def _execution_ids(store: SqlStore) -> list[str]:
    engine = sa.create_engine(migrations.sync_url(store.url))
    try:
        with engine.connect() as connection:
            table = store.tables.executions
            rows = connection.execute(sa.select(table.c.execution_id)).scalars().all()
            return sorted(rows)
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_killed_drivers_close_the_fan_out_exactly_once(
    backend: str, request: pytest.FixtureRequest
) -> None:
    store: SqlStore = request.getfixturevalue(f"{backend}_store")
    store.empty()
    chance = random.Random()
    kills = 0
    parents: list[str] = []
    while kills < KILLS:
        parent = f"p{len(parents)}"
        parents.append(parent)
        for _attempt in range(40):
            ran = _run(store, parent, chance.randint(1, LAST_CALL))
            if ran.returncode == -signal.SIGKILL:
                kills += 1
                continue
            assert ran.returncode == 0, ran.stderr
            assert ran.stdout.strip() == "done", ran.stdout
            break
        else:
            pytest.fail(f"{parent} never completed")
        asyncio.run(_closed_once(store, parent))
    # Nothing but the parents and their children is an execution: no fan-out end marker.
    expected = sorted(
        child
        for parent in parents
        for child in [parent, f"{parent}/solo", *(f"{parent}/each/{i}" for i in range(5))]
    )
    assert _execution_ids(store) == expected
