"""Schedules fired by two processes SIGKILLed at random points, many times, on each
database: every fire is made once, in its schedule's order, and the rows agree."""

from __future__ import annotations

import asyncio
import random
import signal
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from tests.child_processes import signal_child
from tests.persistence.conftest import (  # noqa: F401 - fixtures used by name
    postgresql_store,
    sqlite_store,
)
from tests.router.conftest import (  # noqa: F401 - fixtures used by name
    RouterDb,
    router_db,
    router_store,
)
from tests.router.scheduling_router import SCOPE, SOURCE, router_of
from tests.router.test_races import COUNTER

from statifier.persistence import Executions
from statifier.router import Router, Schedule, Scheduler, address, ledger
from statifier.sql import TableOptions

HERE = Path(__file__).parent
FIRER = HERE / "scheduling_router.py"

SCHEDULES = 40
FIRES = {"sqlite": 300, "postgresql": 80}
"""Each schedule's fires due when the passes run, by database: enough that two
processes are killed many times before they are all made (SQLite makes them faster)."""
KILLS = 30
SPARES = 3
"""Processes started ahead, ready to go."""
START = datetime(2026, 9, 19, 8, 0, tzinfo=UTC)


async def _fire_times(router: Router, name: str) -> list[str]:
    found = await address(router, SCOPE, "count", name)
    if found is None:
        return []
    times = []
    for entry in await Executions(router.storage).inputs(found.execution_id):
        assert entry.event is not None
        data = entry.event.data
        assert isinstance(data, dict)
        times.append(data["fire_time"])
    return times


async def _work_left(scheduler: Scheduler, now: datetime) -> bool:
    due = await scheduler.next_due()
    return due is not None and due <= now


async def _start(
    store_url: str, options: TableOptions, chart: Path, now: datetime
) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(FIRER),
        store_url,
        options.prefix,
        options.schema or "-",
        str(chart),
        now.isoformat(),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    assert await asyncio.wait_for(process.stdout.readline(), 60) == b"ready\n"
    return process


def _go(process: asyncio.subprocess.Process) -> asyncio.subprocess.Process:
    assert process.stdin is not None
    process.stdin.write(b"go\n")
    return process


@pytest.mark.asyncio
async def test_two_processes_killed_anywhere_make_every_fire_once_in_order(
    router_db: RouterDb,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    fires = FIRES[router_db.backend]
    chart = tmp_path / "counter.scxml"
    chart.write_bytes(COUNTER)
    router = router_of(router_db.adapter, COUNTER)
    scheduler = Scheduler(router)
    for n in range(SCHEDULES):
        entry = {"every": "PT1M", "source": SOURCE, "scope": SCOPE, "catch_up": "all"}
        await scheduler.put(
            Schedule.from_mapping(f"s{n:02}", {**entry, "catch_up_window": "P1D"}), now=START
        )
    # Every schedule has `fires` fires due (08:01 ...) when the passes run.
    now = START + timedelta(minutes=fires, seconds=30)
    options = router_db.store.tables.options
    rng = random.Random(26)
    kills = finished = 0
    # Processes are started ahead and kept ready: a pass is killed every few tenths of
    # a second, far sooner than an interpreter starts.
    spares = [
        asyncio.ensure_future(_start(router_db.store.url, options, chart, now))
        for _ in range(SPARES)
    ]
    running: list[asyncio.subprocess.Process] = []
    try:
        while await _work_left(scheduler, now):
            while len(running) < 2:
                spares.append(
                    asyncio.ensure_future(_start(router_db.store.url, options, chart, now))
                )
                running.append(_go(await spares.pop(0)))
            await asyncio.sleep(rng.uniform(0.05, 0.25))
            victim = running.pop(rng.randrange(2))
            if victim.returncode is None:
                signal_child(victim, signal.SIGKILL)
            code = await victim.wait()
            if code == -signal.SIGKILL:
                kills += 1
            else:
                assert code == 0, (await victim.stderr.read()).decode()  # type: ignore[union-attr]
                finished += 1
        for process in running:  # what is left of the last passes runs through
            code = await asyncio.wait_for(process.wait(), 300)
            assert code == 0, (await process.stderr.read()).decode()  # type: ignore[union-attr]
    finally:
        for spare in spares:
            signal_child(await spare)
    print(f"{kills} passes killed mid-work, {finished} ran through")
    assert kills >= KILLS, (kills, finished)
    expected = [
        (START + timedelta(minutes=m)).isoformat().replace("+00:00", "Z")
        for m in range(1, fires + 1)
    ]
    for n in range(SCHEDULES):
        name = f"s{n:02}"
        assert await _fire_times(router, name) == expected, name
        state = await scheduler.get(name)
        assert state is not None
        assert (state.fired, state.skipped, state.failures) == (fires, 0, 0)
        assert state.next_fire_at == START + timedelta(minutes=fires + 1)
        found = await address(router, SCOPE, "count", name)
        assert found is not None
        rows = await ledger(router, found.execution_id)
        assert sorted(str(row.message_id) for row in rows) == sorted(
            f"{name}/{time}" for time in expected
        )
