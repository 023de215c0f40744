"""Eight tasks and two OS processes step one execution at once, on SQLite and on
PostgreSQL: no input is lost or duplicated, the input log is gapless and ordered, and
its order is the order the chart saw."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from statifier.chart import compile_chart
from statifier.core import Event
from statifier.core.positions import load_event
from statifier.persistence import Executions, Storage
from statifier.persistence.sql import SqlAdapter

CHART = b"""<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0"
       datamodel="predicator" initial="counting">
  <datamodel><data id="seen" expr="[]"/></datamodel>
  <state id="counting">
    <transition event="n">
      <assign location="seen" expr="concat(seen, [_event.data.n])"/>
    </transition>
  </state>
</scxml>
"""

TASKS = 8
PER_TASK = 12
PROCESSES = 2
PER_PROCESS = 25
STEPPER = Path(__file__).with_name("sql_stepper.py")


@pytest.mark.asyncio
async def test_tasks_and_processes_lose_and_duplicate_nothing(
    sql_store: Any, sql_adapter: SqlAdapter, tmp_path: Path
) -> None:
    machine = compile_chart(CHART)
    chart = tmp_path / "numbers.scxml"
    chart.write_bytes(CHART)
    executions = Executions(Storage(sql_adapter))
    await executions.create("counter", machine)

    options = sql_store.tables.options
    processes = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            str(STEPPER),
            sql_store.url,
            options.prefix,
            options.schema or "-",
            str(chart),
            "counter",
            str(10_000 * (index + 1)),
            str(PER_PROCESS),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for index in range(PROCESSES)
    ]
    async with asyncio.timeout(60):
        for process in processes:
            assert process.stdout is not None
            assert (await process.stdout.readline()).strip() == b"ready"
    for process in processes:
        assert process.stdin is not None
        process.stdin.write(b"go\n")
        await process.stdin.drain()

    async def task(index: int) -> None:
        for k in range(PER_TASK):
            n = index * 100 + k
            await executions.step("counter", machine, Event("n", data={"n": n}))
            # Events arrive a little apart. Back to back, this process's tasks would
            # keep SQLite's single writer busy and the other processes, which can only
            # poll for it, would step after them: correct, but not at once.
            await asyncio.sleep(0.01)

    async with asyncio.timeout(120):
        await asyncio.gather(*(task(index) for index in range(TASKS)))
        for process in processes:
            out, err = await process.communicate()
            assert process.returncode == 0, err.decode()
            assert out.decode().strip() == "done"

    sent = {index * 100 + k for index in range(TASKS) for k in range(PER_TASK)} | {
        10_000 * (index + 1) + k for index in range(PROCESSES) for k in range(PER_PROCESS)
    }
    log = await sql_adapter.inputs("counter")
    assert [entry.seq for entry in log] == list(range(len(sent)))
    logged = []
    for entry in log:
        assert entry.event is not None
        data = load_event(entry.event).data
        assert isinstance(data, dict)
        logged.append(data["n"])
    assert sorted(logged) == sorted(sent)
    assert len(set(logged)) == len(logged)

    record = await sql_adapter.fetch_execution("counter")
    assert record is not None
    seen = Storage(sql_adapter).load(record, machine).datamodel["seen"]
    assert seen == logged
    # Each process sent its own numbers in order, and they were logged in that order.
    for index in range(PROCESSES):
        mine = [n for n in logged if 10_000 * (index + 1) <= n < 10_000 * (index + 2)]
        assert mine == sorted(mine)
    # They really ran at once: every process stepped before the tasks were done.
    last_task_entry = max(at for at, n in enumerate(logged) if n < 10_000)
    for index in range(PROCESSES):
        assert logged.index(10_000 * (index + 1)) < last_task_entry
