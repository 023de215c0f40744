"""A process migrating many executions is killed (SIGKILL) at random moments, again
and again, and then run to the end: every execution is moved exactly once (one
``migrate`` entry in its log, its position carried), on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from statifier.core import Event
from statifier.persistence import Executions, Status, Storage
from statifier.persistence.sql import SqlAdapter

from .conftest import SqlStore
from .migrating_worker import NEW, OLD, PLAN

WORKER = Path(__file__).with_name("migrating_worker.py")
EXECUTIONS = 240
KILLS = 8


def _start(store: SqlStore) -> subprocess.Popen[str]:
    options = store.tables.options
    return subprocess.Popen(
        [sys.executable, str(WORKER), store.url, options.prefix, options.schema or "-"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def _create(store: SqlStore) -> None:
    async with SqlAdapter(store.url, store.tables) as adapter:
        executions = Executions(Storage(adapter))
        for i in range(EXECUTIONS):
            await executions.create(f"o-{i:03}", OLD)
            if i % 2:
                await executions.step(f"o-{i:03}", None, Event("pay"))


async def _moved(store: SqlStore) -> int:
    async with SqlAdapter(store.url, store.tables) as adapter:
        counts = await Executions(Storage(adapter)).executions_on(PLAN.target_hash)
        return counts.get("executions_active", 0)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_migration_killed_at_random_moves_each_execution_exactly_once(
    backend: str, request: pytest.FixtureRequest
) -> None:
    store: SqlStore = request.getfixturevalue(f"{backend}_store")
    store.empty()
    asyncio.run(_create(store))
    rng = random.Random(14)
    progress = []
    for _ in range(KILLS):
        worker = _start(store)
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "migrating", worker.stderr
        time.sleep(rng.uniform(0.0, 0.15))
        worker.send_signal(signal.SIGKILL)
        worker.communicate(timeout=30)
        progress.append(asyncio.run(_moved(store)))
    # The kills landed part-way: some moved, not all, and progress never went back.
    assert progress == sorted(progress)
    assert any(0 < moved < EXECUTIONS for moved in progress), progress
    finisher = _start(store)
    out, err = finisher.communicate(timeout=120)
    assert finisher.returncode == 0, err
    assert out.split()[-1] == str(EXECUTIONS - progress[-1])

    async def check() -> None:
        async with SqlAdapter(store.url, store.tables) as adapter:
            executions = Executions(Storage(adapter))
            for i in range(EXECUTIONS):
                execution_id = f"o-{i:03}"
                record = await executions.storage.fetch_execution(execution_id)
                assert (record.status, record.content_hash) == (Status.ACTIVE, PLAN.target_hash)
                state = executions.storage.load(record, NEW)
                assert state.leaf_configuration() == (("charged",) if i % 2 else ("placed",))
                assert state.datamodel["n"] == i % 2
                vias = [entry.via for entry in await executions.inputs(execution_id)]
                assert vias == ["step"] * (i % 2) + ["migrate"]  # moved once, logged once

    asyncio.run(check())
