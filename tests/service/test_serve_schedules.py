"""Schedules in a serve file: ``[schedules.NAME]`` put on the database when the
service starts and fired by its scheduler, each second's fire routed once through the
bindings, on both databases and by two ``statifier serve`` processes on one
PostgreSQL; ``[scheduler]`` bounds; stored schedules the file leaves out are named in a
warning; the refusals of a schedule's fields."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import signal
import sqlite3
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from tests.persistence.conftest import FreshDatabase, fresh_database  # noqa: F401 - a fixture
from tests.service.helpers import HITS, database_table, running, start_serve, write_config
from tests.service.test_serve import EXIT_SLACK, SHUTDOWN_TIMEOUT, router_on

from statifier.persistence import Executions
from statifier.router import Router, address, ledger
from statifier.router.scheduler import Scheduler
from statifier.service import load
from statifier.service.settings import ServiceConfigError

CLOCK_BINDING = """
[[bindings]]
id = "beats"
source = "clock"
match = "true"
key = "event.schedule"
document = "hits"
event = "hit"
data = ["fire_time", "team"]
"""
"""Each fire of a schedule to the counter named by the schedule, with its time and the
schedule's own data."""

BEAT = """
[schedules.beat]
every = "PT1S"
source = "clock"
scope = "ops"
data = { team = "night" }
"""


async def _ready(base: str, said: str | None, seconds: float = 20) -> None:
    """Wait until ``/readyz`` answers 200 (``said`` is ``None``), or 503 with the
    reason ``said``."""
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient() as client:
        while True:
            answer = await client.get(f"{base}/readyz")
            reasons = answer.json().get("reasons", [])
            if (answer.status_code, reasons) == ((200, []) if said is None else (503, [said])):
                return
            assert time.monotonic() < deadline, (answer.status_code, reasons, said)
            await asyncio.sleep(0.1)


def _config(directory: Path, database: FreshDatabase, more: str = BEAT) -> Path:
    body = f"""
migrate = true
shutdown_timeout = {SHUTDOWN_TIMEOUT}
charts = "charts"
{CLOCK_BINDING}
{database_table(database)}
[http]
port = 0
{more}
"""
    return write_config(directory, body, {"hits": HITS})


async def _fire_times(router: Router, name: str) -> list[datetime]:
    """The fire times the counter of schedule ``name`` received, in its input order."""
    found = await address(router, "ops", "hits", name)
    if found is None:
        return []
    times = []
    for entry in await Executions(router.storage).inputs(found.execution_id):
        assert entry.event is not None
        data = entry.event.data
        assert isinstance(data, dict)
        assert data["team"] == "night"
        times.append(datetime.fromisoformat(str(data["fire_time"]).replace("Z", "+00:00")))
    return times


def _each_second_once(times: list[datetime]) -> None:
    assert times == sorted(times)
    steps = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(times)]
    assert steps, times
    assert all(step == 1.0 for step in steps), times


@pytest.mark.asyncio
async def test_a_service_puts_the_files_schedules_and_fires_each_once(
    fresh_database: FreshDatabase,  # noqa: F811 - the fixture
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    extra = BEAT + '\n[schedules.spare]\nevery = "P1D"\nsource = "clock"\nscope = "ops"\n'
    config = _config(tmp_path, fresh_database, extra)
    async with running(config), router_on(config, fresh_database) as router:
        deadline = time.monotonic() + 20
        while len(await _fire_times(router, "beat")) < 3:
            assert time.monotonic() < deadline, "the scheduler made no fires"
            await asyncio.sleep(0.1)
    async with router_on(config, fresh_database) as router:
        times = await _fire_times(router, "beat")
        _each_second_once(times)
        ids = [str(row.message_id) for row in await ledger(router)]
        assert ids == [f"beat/{t.isoformat().replace('+00:00', 'Z')}" for t in times]
        state = await Scheduler(router).get("spare")
        assert state is not None
        assert state.fired == 0
    # The file without `spare`: the service says the stored one still fires.
    config = _config(tmp_path, fresh_database)
    with caplog.at_level(logging.WARNING, logger="statifier.service"):
        async with running(config):
            pass
    warned = [r.getMessage() for r in caplog.records if r.name == "statifier.service"]
    assert any("not in" in line and "spare" in line for line in warned), warned


@pytest.mark.asyncio
async def test_a_service_with_the_scheduler_off_puts_its_schedules_and_fires_none(
    fresh_database: FreshDatabase,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, fresh_database, BEAT + "\n[scheduler]\nenabled = false\n")
    async with running(config):
        await asyncio.sleep(2.5)
    async with router_on(config, fresh_database) as router:
        assert await _fire_times(router, "beat") == []
        state = await Scheduler(router).get("beat")
        assert state is not None
        assert state.fired == 0
        assert not state.paused


@pytest.fixture
def postgresql_database(database_url: str) -> Iterator[FreshDatabase]:
    from tests.persistence.conftest import drop_schema, unique_name

    schema = unique_name("statifier_serve_")
    try:
        yield FreshDatabase("postgresql", database_url, schema)
    finally:
        drop_schema(database_url, schema)


@pytest.mark.asyncio
async def test_two_serve_processes_make_each_fire_once(
    postgresql_database: FreshDatabase, tmp_path: Path
) -> None:
    config = _config(tmp_path, postgresql_database)
    first = await start_serve(config, tmp_path / "first.log")
    second = await start_serve(config, tmp_path / "second.log")
    try:
        async with router_on(config, postgresql_database) as router:
            deadline = time.monotonic() + 30
            while len(await _fire_times(router, "beat")) < 6:
                assert time.monotonic() < deadline, first.stderr() + second.stderr()
                await asyncio.sleep(0.1)
        for served in (first, second):
            served.signal(signal.SIGTERM)
        for served in (first, second):
            assert await served.wait(SHUTDOWN_TIMEOUT + EXIT_SLACK) == 0, served.stderr()
    finally:
        for served in (first, second):
            if served.process.returncode is None:
                served.process.kill()
                await served.process.wait()
    async with router_on(config, postgresql_database) as router:
        times = await _fire_times(router, "beat")
        _each_second_once(times)
        assert len(await ledger(router)) == len(times)
        state = await Scheduler(router).get("beat")
        assert state is not None
        assert state.fired == len(times)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            '[schedules.beat]\nevery = "PT1S"\nsource = "nowhere"\nscope = "ops"\n',
            r"\[schedules.beat\] source: no enabled binding reads source \"nowhere\"",
        ),
        (
            '[schedules.beat]\nevery = "P1M"\nsource = "clock"\nscope = "ops"\n',
            r"\[schedules.beat\].*every: 'P1M' is not a duration",
        ),
        (
            '[schedules.beat]\ncron = "0 2 * *"\nsource = "clock"\nscope = "ops"\n',
            r"\[schedules.beat\].*cron: ",
        ),
        (
            '[schedules.beat]\nevery = "PT1S"\nsource = "clock"\nscope = "ops"\nzone = "UTC"\n',
            r"\[schedules.beat\].*unknown field 'zone'",
        ),
        (
            '[schedules.beat]\nevery = "PT1S"\nsource = "clock"\n',
            r"\[schedules.beat\].*scope is required",
        ),
        (
            '[schedules."a/b"]\nevery = "PT1S"\nsource = "clock"\nscope = "ops"\n',
            r"a schedule's name is letters",
        ),
        ("[scheduler]\nretry = 10\nmax_retry = 5\n", r"\[scheduler\] max_retry: must be at least"),
        ("[scheduler]\npoll = 0\n", r"\[scheduler\] poll: "),
    ],
    ids=["source", "every", "cron", "unknown", "scope", "name", "max_retry", "poll"],
)
def test_a_schedule_the_file_gets_wrong_is_refused_naming_it(
    tmp_path: Path, table: str, message: str
) -> None:
    database = FreshDatabase("sqlite", f"sqlite:///{tmp_path / 'x.db'}", None)
    with pytest.raises(ServiceConfigError, match=message):
        load(_config(tmp_path, database, table))


def test_a_toml_offset_time_is_a_start(tmp_path: Path) -> None:
    database = FreshDatabase("sqlite", f"sqlite:///{tmp_path / 'x.db'}", None)
    table = (
        '[schedules.beat]\nevery = "PT1H"\nsource = "clock"\nscope = "ops"\n'
        "start = 2026-01-01T00:30:00+01:00\n"
    )
    (schedule,) = load(_config(tmp_path, database, table)).schedules
    assert schedule.start.isoformat() == "2025-12-31T23:30:00+00:00"


@pytest.mark.asyncio
async def test_readiness_names_the_schedules_whose_fires_fail_until_they_are_made(
    tmp_path: Path,
) -> None:
    """Four schedules' stored definitions become unreadable (a bad hand edit): every
    step fails, each is logged and recorded on its row, the worker never raises, and
    ``/readyz`` says so, naming three and counting the others; restored, it is green."""
    database = FreshDatabase("sqlite", f"sqlite:///{tmp_path / 's.db'}", None)
    beats = "".join(
        f'[schedules.{name}]\nevery = "PT1S"\nsource = "clock"\nscope = "ops"\n'
        f'data = {{ team = "night" }}\n'
        for name in ("a", "b", "c", "d")
    )
    more = beats + "[scheduler]\nretry = 0.2\nmax_retry = 0.2\n"
    config = _config(tmp_path, database, more)
    async with running(config) as (_service, base):
        await _ready(base, None)
        with sqlite3.connect(tmp_path / "s.db") as connection:
            stored = connection.execute("SELECT name, definition FROM t_schedules").fetchall()
            assert sorted(name for name, _ in stored) == ["a", "b", "c", "d"]
            broken = json.dumps({"source": "clock", "scope": "ops", "cron": "not a cron"})
            connection.execute("UPDATE t_schedules SET definition = ?", (broken,))
        connection.close()
        await _ready(base, "scheduler: schedules failing: a, b, c and 1 more")
        with sqlite3.connect(tmp_path / "s.db") as connection:
            failures = connection.execute("SELECT min(failures) FROM t_schedules").fetchone()
            assert failures[0] >= 1
            connection.executemany(
                "UPDATE t_schedules SET definition = ? WHERE name = ?",
                [(definition, name) for name, definition in stored],
            )
        connection.close()
        await _ready(base, None)
