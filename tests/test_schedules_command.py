"""``statifier schedules``: list, show, pause, resume and remove on both databases,
the stored rows changed as said; refusals in one line with exit status 2."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from tests.persistence.conftest import drop_schema, unique_name

from statifier.cli import main
from statifier.durable import Durable
from statifier.router import Schedule, Scheduler, ScheduleState
from statifier.sql import TableOptions, migrations

NOW = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)


class Place:
    def __init__(self, url: str, tables: TableOptions) -> None:
        self.url, self.tables = url, tables

    @property
    def options(self) -> list[str]:
        given = ["--database", self.url, "--prefix", self.tables.prefix]
        if self.tables.schema is not None:
            given += ["--schema", self.tables.schema]
        return given


@pytest.fixture(params=("sqlite", "postgresql"))
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    if request.param == "sqlite":
        yield Place(f"sqlite:///{tmp_path / 'cli.db'}", TableOptions(prefix="s_"))
        return
    url = request.getfixturevalue("database_url")
    schema = unique_name("statifier_schedules_cli_")
    try:
        yield Place(url, TableOptions(prefix="s_", schema=schema))
    finally:
        drop_schema(url, schema)


def _put(place: Place) -> None:
    async def put() -> None:
        async with Durable(place.url, tables=place.tables) as durable:
            assert durable.router is not None
            scheduler = Scheduler(durable.router)
            entries: dict[str, dict[str, Any]] = {
                "nightly": {"cron": "0 2 * * *", "timezone": "Europe/Paris", "scope": "ops"},
                "beat": {"every": "PT30S", "scope": "ops", "data": {"team": "night"}},
            }
            for name, entry in entries.items():
                schedule = Schedule.from_mapping(name, {**entry, "source": "clock"})
                await scheduler.put(schedule, now=NOW)

    migrations.upgrade(place.url, place.tables)
    asyncio.run(put())


def _state(place: Place, name: str) -> ScheduleState | None:
    async def get() -> ScheduleState | None:
        async with Durable(place.url, tables=place.tables) as durable:
            assert durable.router is not None
            return await Scheduler(durable.router).get(name)

    return asyncio.run(get())


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    out = io.StringIO()
    status = main(["schedules", *argv], out)
    return status, out.getvalue(), capsys.readouterr().err


def test_list_and_show_say_what_is_stored(place: Place, capsys: pytest.CaptureFixture[str]) -> None:
    _put(place)
    status, out, err = cli(capsys, "list", *place.options)
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == ["beat", "nightly"]
    assert lines[0].startswith("beat running every P0DT30S source=clock scope=ops")
    assert "next=2026-12-03T09:00:30Z last=none fired=0 skipped=0" in lines[0]
    assert lines[1].startswith("nightly running cron '0 2 * * *' Europe/Paris")
    # 02:00 in Paris in winter is 01:00 UTC, the next day.
    assert "next=2026-12-04T01:00:00Z" in lines[1]

    status, out, _ = cli(capsys, "list", "--json", *place.options)
    listed = json.loads(out)
    assert status == 0
    assert [entry["name"] for entry in listed] == ["beat", "nightly"]
    assert listed[0]["data"] == {"team": "night"}
    assert listed[0]["paused"] is False
    assert listed[1]["next_fire_at"] == "2026-12-04T01:00:00Z"

    status, out, _ = cli(capsys, "show", "nightly", "--json", *place.options)
    shown = json.loads(out)
    assert status == 0
    assert shown["cron"] == "0 2 * * *"
    assert shown["timezone"] == "Europe/Paris"
    assert shown["last_fire_at"] is None
    status, out, _ = cli(capsys, "show", "beat", *place.options)
    assert status == 0
    assert 'name: "beat"' in out.splitlines()
    assert 'every: "P0DT30S"' in out.splitlines()


def test_list_says_a_schedule_no_worker_takes_is_late(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    _put(place)  # due at NOW (a past day): no worker has run since
    status, out, _ = cli(capsys, "list", *place.options)
    assert status == 0
    assert "LATE: due at 2026-12-03T09:00:30Z, no worker has taken it" in out.splitlines()[0]
    status, out, _ = cli(capsys, "list", "--json", *place.options)
    assert [entry["late"] for entry in json.loads(out)] == [True, True]


def _spoil(place: Place, name: str) -> None:
    """Store a definition no version of the scheduler reads for schedule ``name``."""
    import sqlalchemy as sa

    table = place.tables.define().schedules
    engine = sa.create_engine(migrations.sync_url(place.url))
    try:
        with engine.begin() as connection:
            connection.execute(
                table.update().where(table.c.name == name).values(definition={"every": 7})
            )
    finally:
        engine.dispose()


def test_a_list_that_meets_an_unreadable_schedule_lists_the_rest_and_says_so(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    _put(place)
    _spoil(place, "beat")
    status, out, err = cli(capsys, "list", *place.options)
    assert status == 1
    assert [line.split()[0] for line in out.splitlines()] == ["nightly"]
    assert "1 stored schedule(s) cannot be read, not listed: beat" in err
    _spoil(place, "nightly")
    status, out, err = cli(capsys, "list", *place.options)
    assert (status, out) == (1, "")  # not "no schedules"
    assert "2 stored schedule(s) cannot be read, not listed: beat, nightly" in err


def test_pause_resume_and_remove_change_the_rows(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    _put(place)
    assert cli(capsys, "pause", "beat", *place.options) == (0, "beat: paused\n", "")
    state = _state(place, "beat")
    assert state is not None
    assert state.paused
    status, out, _ = cli(capsys, "pause", "beat", *place.options)
    assert (status, out) == (1, "beat: paused already, nothing changed\n")
    status, out, _ = cli(capsys, "list", *place.options)
    assert out.splitlines()[0].startswith("beat paused ")

    status, out, _ = cli(capsys, "resume", "beat", *place.options)
    assert status == 0
    assert out.startswith("beat: resumed, next fire ")
    state = _state(place, "beat")
    assert state is not None
    assert not state.paused
    assert state.next_fire_at > datetime.now(UTC)  # the first fire after now
    status, out, _ = cli(capsys, "resume", "beat", *place.options)
    assert (status, out) == (1, "beat: running already, nothing changed\n")

    assert cli(capsys, "remove", "nightly", *place.options) == (0, "nightly: removed\n", "")
    assert _state(place, "nightly") is None
    status, out, _ = cli(capsys, "list", *place.options)
    assert [line.split()[0] for line in out.splitlines()] == ["beat"]


@pytest.mark.parametrize("action", ["show", "pause", "resume", "remove"])
def test_an_unknown_name_is_refused_in_one_line(
    place: Place, capsys: pytest.CaptureFixture[str], action: str
) -> None:
    _put(place)
    status, out, err = cli(capsys, action, "nope", *place.options)
    assert (status, out) == (2, "")
    assert err == f"statifier schedules {action}: there is no schedule 'nope'\n"


def test_a_database_without_the_tables_says_to_upgrade(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = cli(capsys, "list", *place.options)
    assert (status, out) == (2, "")
    assert err.startswith("statifier schedules list: ")
    assert "statifier db upgrade" in err
    assert len(err.splitlines()) == 1


def test_an_empty_list_says_so(place: Place, capsys: pytest.CaptureFixture[str]) -> None:
    migrations.upgrade(place.url, place.tables)
    assert cli(capsys, "list", *place.options) == (0, "no schedules\n", "")
    assert cli(capsys, "list", "--json", *place.options) == (0, "[]\n", "")
