"""A process killed between a step's effects and its store: the re-drive re-emits the
same effects under the same keys, and the execution moves on exactly once."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from statifier.persistence import Executions, Status, Storage
from statifier.persistence.sql import SqlAdapter

from .conftest import SqlStore

STEPPER = Path(__file__).with_name("crashing_stepper.py")


def _step(store: SqlStore, keys: Path, crash: bool) -> subprocess.CompletedProcess[str]:
    schema = store.tables.options.schema or "-"
    prefix = store.tables.options.prefix
    return subprocess.run(
        [sys.executable, str(STEPPER), store.url, prefix, schema, str(keys), "1" if crash else "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_redrive_after_a_kill_reemits_identical_keys(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    store: SqlStore = request.getfixturevalue(f"{backend}_store")
    store.empty()
    killed = _step(store, tmp_path / "first.keys", crash=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    redriven = _step(store, tmp_path / "second.keys", crash=False)
    assert redriven.returncode == 0, redriven.stderr
    first = (tmp_path / "first.keys").read_text().splitlines()
    second = (tmp_path / "second.keys").read_text().splitlines()
    assert [line.split()[0] for line in first] == ["Log", "Log", "SendDelayed", "Log"]
    assert first == second

    async def stored() -> tuple[Status, list[str]]:
        async with SqlAdapter(store.url, store.tables) as adapter:
            executions = Executions(Storage(adapter))
            record = await executions.storage.fetch_execution("txn")
            machine = await executions.storage.machine(record.content_hash)
            leaves = executions.storage.load(record, machine).leaf_configuration()
            logged = [entry.event.name for entry in await executions.inputs("txn") if entry.event]
            return record.status, [*leaves, *logged]

    status, seen = asyncio.run(stored())
    assert status is Status.ACTIVE
    assert seen == ["capturing", "capture.requested"]  # stepped once, logged once
